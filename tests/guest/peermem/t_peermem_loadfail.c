// SPDX-License-Identifier: GPL-2.0
/*
 * A failed load of peermem must leave no file of it open (issue 21,
 * finding 1). While the module's init runs, the module is COMING: an open
 * of /dev/peermem gets its module reference (try_module_get succeeds) and
 * its file operations, yet when init then fails the loader frees the
 * module anyway; a later read, poll or close of that file would run freed
 * code. So /dev/peermem must appear only once nothing of init can fail
 * any more.
 *
 * How: a second thread opens /dev/peermem in a loop while this thread
 * loads peermem.ko with fail-nth failing its n-th allocation (the last
 * allocations of the load first, n going down), until the load fails in
 * the misc device's own registration ("cannot create /dev/peermem"):
 * from there on down the device never existed during a failed load. A
 * file the opener got during a failed load is the bug: the test says so,
 * then polls and closes it (which, with the bug, the kernel reports).
 */
#include "peermem_test.h"
#include "../../../include/uapi/peermem.h"
#include <poll.h>
#include <pthread.h>
#include <sys/syscall.h>

#define MAX_LOADS 300
#define COARSE 16
#define MARK "cannot create /dev/peermem"

static int fnth;
static int op_run, op_quit, op_idle, op_fd = -1;
static long op_opens;

static void fnth_set(int n)
{
	char b[16];
	int l = snprintf(b, sizeof(b), "%d", n);

	if (pwrite(fnth, b, l, 0) != l)
		bail("cannot write fail-nth: %s", strerror(errno));
}

/* Reset fail-nth; returns what was left (0: the fault was injected). */
static int fnth_take(void)
{
	char b[16] = "";
	int left;

	if (pread(fnth, b, sizeof(b) - 1, 0) <= 0)
		bail("cannot read fail-nth: %s", strerror(errno));
	left = atoi(b);
	fnth_set(0);
	return left;
}

/* Opens /dev/peermem while op_run; keeps the first file, closes the others. */
static void *opener(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&op_quit, __ATOMIC_ACQUIRE)) {
		int f;

		if (!__atomic_load_n(&op_run, __ATOMIC_ACQUIRE)) {
			__atomic_store_n(&op_idle, 1, __ATOMIC_RELEASE);
			usleep(1000);
			continue;
		}
		__atomic_store_n(&op_idle, 0, __ATOMIC_RELEASE);
		f = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		if (f < 0)
			continue;
		op_opens++;
		if (op_fd < 0)
			op_fd = f;
		else
			close(f);
	}
	return NULL;
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

int main(void)
{
	char ko[512], p[64];
	int total, left, n, e, loads = 0, failed = 0, m0, found = 0, bad = 0, step, first = 0;
	pthread_t t;

	load_modules(NULL);
	if (getenv("PEERMEM_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("PEERMEM_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	if (run("rmmod peermem"))
		bail("cannot unload peermem");
	run("echo N > /sys/kernel/debug/failslab/ignore-gfp-wait");
	run("echo 0 > /sys/kernel/debug/failslab/verbose");
	run("echo N > /sys/kernel/debug/fail_page_alloc/ignore-gfp-wait");
	run("echo 0 > /sys/kernel/debug/fail_page_alloc/min-order");
	run("echo 0 > /sys/kernel/debug/fail_page_alloc/verbose");
	snprintf(p, sizeof(p), "/proc/self/task/%ld/fail-nth", (long)syscall(SYS_gettid));
	fnth = open(p, O_RDWR);
	if (fnth < 0)
		bail("%s: %s (needs CONFIG_FAULT_INJECTION, the debug rig kernel)", p, strerror(errno));
	if (pthread_create(&t, NULL, opener, NULL))
		bail("pthread_create");

	/* How many allocations a whole load makes (none fails). */
	e = load(ko, 1000000, &left);
	if (e)
		bail("peermem does not load without a fault: %s", strerror(e));
	total = 1000000 - left;
	if (op_fd >= 0)
		close(op_fd);
	op_fd = -1;
	if (run("rmmod peermem"))
		bail("cannot unload peermem");
	diag("a load of peermem makes %d allocations fail-nth can fail", total);
	m0 = marks();

	/*
	 * The last allocations of a load are the loader's after init (KUnit
	 * runs the module's suites then, hundreds of allocations), and their
	 * failures do not fail the load: skip them COARSE at a time down to
	 * the first load that fails, then step one at a time from COARSE - 1
	 * above it.
	 */
	for (n = total + 1, step = COARSE; n > 0 && loads < MAX_LOADS; n -= step, loads++) {
		e = load(ko, n, &left);
		if (!e) {
			if (op_fd >= 0)
				close(op_fd);
			op_fd = -1;
			if (syscall(SYS_delete_module, "peermem", O_NONBLOCK))
				bail("load with fail-nth %d: cannot unload peermem: %s", n, strerror(errno));
			continue;
		}
		failed++;
		if (op_fd >= 0) {
			struct pollfd pfd = { .fd = op_fd, .events = POLLIN };

			bad++;
			ok(0, "the load with its %d-th allocation failing (%s) failed, yet an open of /dev/peermem during it got a file (%ld opens); now polling and closing it",
			   n, strerror(e), op_opens);
			fflush(stdout);
			poll(&pfd, 1, 0);
			close(op_fd);
			op_fd = -1;
			break;
		}
		if (step > 1) {
			/* In init: back up, and from there one at a time. */
			step = 1;
			first = n;
			n += COARSE;
			m0 = marks();
			continue;
		}
		if (marks() > m0) {
			found = 1;
			break;
		}
	}
	__atomic_store_n(&op_quit, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	diag("%d loads (fail-nth from %d down to %d; the first failed load at %d), %d failed, %ld opens of /dev/peermem in all",
	     loads, total + 1, n, first, failed, op_opens);
	ok(!bad, "no failed load of peermem left a file of /dev/peermem open");
	ok(bad || found,
	   "every allocation after /dev/peermem's registration was failed in turn (down to the registration's own, which failed with \"" MARK "\")");
	load_modules(NULL);
	ok(access(PEERMEM_DEVICE_PATH, F_OK) == 0, "peermem loads again afterwards, /dev/peermem exists");
	ok(run("rmmod peermem") == 0, "rmmod peermem");
	return finish();
}
