// SPDX-License-Identifier: GPL-2.0
/*
 * A failed load of peermem must leave no file of it open (issue 21,
 * finding 1): neither /dev/peermem nor its debugfs files, whose file
 * operations are the module's too. While the module's init runs, the module is COMING: an open
 * of /dev/peermem gets its module reference (try_module_get succeeds) and
 * its file operations, yet when init then fails the loader frees the
 * module anyway; a later read, poll or close of that file would run freed
 * code. So /dev/peermem must appear only once nothing of init can fail
 * any more.
 *
 * How: a second thread opens /dev/peermem (and a debugfs counter) in a
 * loop while this thread loads peermem.ko. A first load without a fault
 * finds where the device appears: the opener reads this thread's fail-nth
 * when its first open succeeds. Then loads with fail-nth failing the
 * allocations in turn from 100 before that point to 32 after it (the
 * opener sees the device some allocations late; every 8th first, then
 * the ones between while LOADFAIL_SECONDS last): the
 * device's own registration (which must fail cleanly, "cannot create
 * /dev/peermem") and whatever init does after it. A file the opener got
 * during a failed load is the bug: the test says so, then reads, polls
 * and closes it (which, with the bug, the kernel reports: an Oops or
 * KASAN). The last few hundred allocations of a load are KUnit's (the
 * module's suites run when it goes live), which is why the scan does not
 * simply start from the end.
 */
#include "peermem_test.h"
#include "../../../include/uapi/peermem.h"
#include <poll.h>
#include <pthread.h>
#include <sys/syscall.h>

#define BIG 1000000
#define BEFORE 100
#define AFTER 32
#define STRIDE 8
#define MARK "cannot create /dev/peermem"

static int op_run, op_quit, op_idle;
/* The files the opener opens (and keeps the first of each, in op_fd). */
static const char *const op_path[2] = { PEERMEM_DEVICE_PATH, PMDBG "registrations_acquired" };
static int op_fd[2] = { -1, -1 };
static long op_opens[2];
/* What the loading thread's fail-nth was when the device first opened. */
static long op_left_at_open = -1;

/*
 * Opens /dev/peermem and a debugfs counter of peermem while op_run; keeps
 * the first file of each, closes the others.
 */
static void *opener(void *arg)
{
	int i = 0;

	(void)arg;
	while (!__atomic_load_n(&op_quit, __ATOMIC_ACQUIRE)) {
		int f;

		if (!__atomic_load_n(&op_run, __ATOMIC_ACQUIRE)) {
			__atomic_store_n(&op_idle, 1, __ATOMIC_RELEASE);
			usleep(1000);
			continue;
		}
		__atomic_store_n(&op_idle, 0, __ATOMIC_RELEASE);
		i = !i;
		f = open(op_path[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		if (f < 0)
			continue;
		op_opens[i]++;
		if (i == 0 && op_left_at_open < 0) {
			char b[16] = "";

			if (pread(fnth, b, sizeof(b) - 1, 0) > 0)
				op_left_at_open = atol(b);
		}
		if (op_fd[i] < 0)
			op_fd[i] = f;
		else
			close(f);
	}
	return NULL;
}

static void op_close(void)
{
	for (int i = 0; i < 2; i++) {
		if (op_fd[i] >= 0)
			close(op_fd[i]);
		op_fd[i] = -1;
	}
}

static void opener_stop(void)
{
	__atomic_store_n(&op_run, 0, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&op_idle, __ATOMIC_ACQUIRE))
		usleep(1000);
}

/* How many times dmesg has the line of a failed misc registration. */
static int marks(void)
{
	FILE *p = popen("dmesg | grep -c '" MARK "'", "r");
	int n = -1;

	if (!p || fscanf(p, "%d", &n) != 1)
		n = -1;
	if (p)
		pclose(p);
	return n;
}

/* One load with fail-nth n (0: none); 0 if it loaded, else the errno. */
static int load(const char *ko, int n, int *left)
{
	int kfd = open(ko, O_RDONLY | O_CLOEXEC), e = 0;
	long rc;

	if (kfd < 0)
		bail("%s: %s", ko, strerror(errno));
	/* Set again only by the opener once it saw op_run 0 (opener_stop). */
	__atomic_store_n(&op_idle, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&op_run, 1, __ATOMIC_RELEASE);
	if (n)
		fnth_set(n);
	rc = syscall(SYS_finit_module, kfd, "", 0);
	if (rc)
		e = errno;
	*left = n ? fnth_take() : 0;
	opener_stop();
	close(kfd);
	return e;
}

/*
 * One load with its n-th allocation failing; returns 1 if it failed yet
 * left a file of it open (the bug: then read, polled and closed, for the
 * kernel to report).
 */
static int load_step(const char *ko, int n, int *failed, int *found, int *m0)
{
	int left, e = load(ko, n, &left);

	if (!e) {
		op_close();
		if (syscall(SYS_delete_module, "peermem", O_NONBLOCK))
			bail("load with fail-nth %d: cannot unload peermem: %s", n, strerror(errno));
		return 0;
	}
	(*failed)++;
	if (op_fd[0] >= 0 || op_fd[1] >= 0) {
		for (int i = 0; i < 2; i++) {
			struct pollfd pfd = { .fd = op_fd[i], .events = POLLIN };
			char b[32];

			if (op_fd[i] < 0)
				continue;
			ok(0, "the load with its %d-th allocation failing (%s) failed, yet an open of %s during it got a file (%ld opens); now reading, polling and closing it",
			   n, strerror(e), op_path[i], op_opens[i]);
			fflush(stdout);
			if (read(op_fd[i], b, i ? sizeof(b) : 0) < 0)
				diag("read: %s", strerror(errno));
			poll(&pfd, 1, 0);
		}
		op_close();
		return 1;
	}
	if (marks() > *m0)
		(*found)++;
	*m0 = marks();
	return 0;
}

int main(void)
{
	char ko[512];
	int total, left, n, e, loads = 0, failed = 0, m0, found = 0, bad = 0, dev;
	int lo, hi, stride, first, finest = 0;
	int budget = getenv("LOADFAIL_SECONDS") ? atoi(getenv("LOADFAIL_SECONDS")) : 30;
	double t0;
	pthread_t t;

	load_modules(NULL);
	if (getenv("PEERMEM_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("PEERMEM_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	if (pm_rmmod())
		bail("cannot unload peermem");
	fnth_setup();
	if (pthread_create(&t, NULL, opener, NULL))
		bail("pthread_create");

	/*
	 * How many allocations a whole load makes (none fails), and how many
	 * were made when /dev/peermem could first be opened (the opener reads
	 * this thread's fail-nth then): the device's registration is about
	 * there.
	 */
	/*
	 * The opener must catch the device while the load is still under
	 * way (in the window between its creation and the end of
	 * finit_module, KUnit's suites); on a loaded machine it can miss it
	 * (it then reads fail-nth after the load: 0), so up to 5 tries.
	 */
	for (int try = 0; try < 5; try++) {
		op_left_at_open = -1;
		e = load(ko, BIG, &left);
		if (e)
			bail("peermem does not load without a fault: %s", strerror(e));
		total = BIG - left;
		dev = op_left_at_open <= 0 ? -1 : BIG - (int)op_left_at_open;
		op_close();
		if (pm_rmmod())
			bail("cannot unload peermem");
		diag("a load of peermem makes %d allocations fail-nth can fail; /dev/peermem opened first after the %d-th%s",
		     total, dev, dev < 0 ? " (not during the load: again)" : "");
		if (dev > 0 && dev <= total)
			break;
		dev = -1;
	}
	if (dev < 0)
		bail("/dev/peermem never opened during a load (5 loads)");
	m0 = marks();

	/*
	 * Fail the allocations from BEFORE before that point to AFTER after it
	 * in turn: the device's own registration, and what init does after
	 * it. To a time budget (LOADFAIL_SECONDS, default 30): first every
	 * STRIDE-th from the top of the window down (the minimum, done
	 * whatever the time; the device's registration makes more than STRIDE
	 * allocations in a row, so this pass fails it at least once), then
	 * the ones between at half the stride, while the budget lasts.
	 */
	lo = dev - BEFORE > 1 ? dev - BEFORE : 1;
	hi = dev + AFTER < total ? dev + AFTER : total;
	t0 = now_s();
	for (stride = STRIDE, first = 1; stride >= 1 && !bad; stride /= 2, first = 0) {
		for (n = hi; n >= lo && !bad; n -= stride) {
			/* Past the first pass, only the ones it has not done. */
			if (!first && (hi - n) % (2 * stride) == 0)
				continue;
			if (!first && now_s() - t0 > budget)
				break;
			loads++;
			bad = load_step(ko, n, &failed, &found, &m0);
		}
		if (n >= lo && !bad)
			break;
		finest = stride;
	}
	__atomic_store_n(&op_quit, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	diag("%d loads in %.0f s (budget %d s): every %d-th allocation from the %d-th to the %d-th failed in turn, %d loads failed, %d in the device's registration; opens in all: %ld of %s, %ld of %s",
	     loads, now_s() - t0, budget, finest, lo, hi, failed, found, op_opens[0], op_path[0],
	     op_opens[1], op_path[1]);
	ok(!bad, "no failed load of peermem left a file of it open (/dev/peermem, debugfs)");
	ok(bad || found,
	   "the scan failed the device's own registration (\"" MARK "\") and every allocation after it in init");
	load_modules(NULL);
	ok(access(PEERMEM_DEVICE_PATH, F_OK) == 0, "peermem loads again afterwards, /dev/peermem exists");
	ok(pm_rmmod() == 0, "rmmod peermem");
	return finish();
}
