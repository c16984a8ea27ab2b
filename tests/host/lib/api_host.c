// SPDX-License-Identifier: GPL-2.0
/*
 * libpeermem's API edges on the host, no /dev/peermem needed (run.sh
 * builds it against the installed library and runs it; TAP):
 *
 *  - no channel: a missing node (ENOENT), a node that cannot be mapped
 *    (/dev/null: ENODEV), a file that is not a version-1 page (EPROTO),
 *    open() refused by the fd limit (EMFILE, what the kernel's per-user
 *    limit of /dev/peermem files also says): PEERMEM_NO_CHANNEL, the
 *    reason, no handle, no descriptor left open;
 *  - bad arguments: -EINVAL / -ENAMETOOLONG, nothing touched;
 *  - the drain logic against a stand-in channel: a regular file whose
 *    first page is a generation page (the test moves the generation with
 *    pwrite, MAP_SHARED shows it) and whose records follow at offset 4096
 *    (the test positions the library's descriptor there): records in
 *    order with range, cause and client, an overflow record turned into
 *    one flush that also stands for the records read with it, cursors,
 *    max_records, a handler calling drain (EDEADLK), counters;
 *  - the descriptor closed and its number reused behind the library: drain
 *    says EBADF, never reads the other file, close leaves it open;
 *  - fork: the child's handle reports the channel lost (generation
 *    PEERMEM_GENERATION_LOST, drain EPERM), also when another thread of
 *    the parent was inside a drain at the fork; the parent goes on.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <peermem/libpeermem.h>
#include "../../guest/tap.h"

static char dir[256];

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;	/* the directory's own */
}

/* ---- a stand-in channel: page + records in a file ---- */

static char fake[300];
static int fake_fd;	/* the test's own descriptor of the file */

static void fake_page(uint64_t gen, uint32_t version, uint32_t event_size, uint32_t qlen)
{
	struct peermem_gen_page pg = { .generation = gen, .version = version,
				       .event_size = event_size, .queue_len = qlen };
	char zero[4096] = { 0 };

	if (pwrite(fake_fd, zero, sizeof(zero), 0) != sizeof(zero) ||
	    pwrite(fake_fd, &pg, sizeof(pg), 0) != sizeof(pg))
		bail("write %s: %s", fake, strerror(errno));
}

static void fake_gen(uint64_t gen)
{
	if (pwrite(fake_fd, &gen, sizeof(gen), 0) != sizeof(gen))
		bail("pwrite: %s", strerror(errno));
}

/* Write n records at offset 4096 + i * 96. */
static void fake_records(const struct peermem_event *ev, int n)
{
	if (ftruncate(fake_fd, 4096) ||
	    pwrite(fake_fd, ev, n * sizeof(*ev), 4096) != (ssize_t)(n * sizeof(*ev)))
		bail("write records: %s", strerror(errno));
}

static struct peermem_event rec(uint64_t gen, uint64_t start, uint64_t len, uint32_t cause,
				const char *client)
{
	struct peermem_event e;

	memset(&e, 0, sizeof(e));
	e.generation = gen;
	e.start = start;
	e.length = len;
	e.cause = cause;
	if (client)
		memset(e.client, 'x', sizeof(e.client));	/* no NUL: the library ends it */
	if (client)
		memcpy(e.client, client, strlen(client) + 1);
	return e;
}

static const struct peermem_handlers H;

/* What the handlers saw. */
struct seen {
	int revoked, flushes;
	uint64_t start[16], len[16], gen[16];
	uint32_t cause[16];
	char client[16][80];
	int order_ok;		/* flushes and records came in generation order */
	struct peermem_channel *ch;
	int nested;		/* what a drain from inside a handler returned */
};

static void on_revoked(void *arg, uint64_t start, uint64_t length, uint32_t cause,
		       const char *client, uint64_t generation)
{
	struct seen *s = arg;
	int i = s->revoked++;

	if (i < 16) {
		s->start[i] = start;
		s->len[i] = length;
		s->cause[i] = cause;
		s->gen[i] = generation;
		snprintf(s->client[i], sizeof(s->client[i]), "%s", client);
		if (i && s->gen[i - 1] >= generation)
			s->order_ok = 0;
	}
	if (s->ch)
		s->nested = peermem_drain(s->ch, &H, s, 0, NULL);
}

static void on_flush(void *arg)
{
	struct seen *s = arg;

	s->flushes++;
}

static const struct peermem_handlers H = { on_revoked, on_flush };

static struct peermem_channel *fake_open(void)
{
	struct peermem_channel *ch;
	int why, r = peermem_open(&ch, fake, 0, &why);

	if (r)
		bail("peermem_open(%s): %d (%s)", fake, r, strerror(-why));
	if (lseek(peermem_fd(ch), 4096, SEEK_SET) != 4096)
		bail("lseek: %s", strerror(errno));
	return ch;
}

static void test_no_channel(void)
{
	struct peermem_channel *ch = (void *)1;
	int fds = open_fds(), why = 0, r, lowest;
	struct rlimit rl, low;

	r = peermem_open(&ch, "/nonexistent/peermem", 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -ENOENT && ch == NULL,
	   "a missing node: PEERMEM_NO_CHANNEL, reason ENOENT, no handle (%d, %s)", r, strerror(-why));
	r = peermem_open(&ch, "/dev/null", 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -ENODEV && ch == NULL,
	   "a node that cannot be mapped (/dev/null): PEERMEM_NO_CHANNEL, reason ENODEV (%d, %s)", r, strerror(-why));
	fake_page(0, 0, 96, 4);
	r = peermem_open(&ch, fake, 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -EPROTO, "a page of version 0: PEERMEM_NO_CHANNEL, reason EPROTO (%s)", strerror(-why));
	fake_page(0, 1, 104, 4);
	r = peermem_open(&ch, fake, 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -EPROTO, "records of another size (104): EPROTO (%s)", strerror(-why));
	fake_page(0, 1, 96, 0);
	r = peermem_open(&ch, fake, 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -EPROTO, "a queue length of 0: EPROTO (%s)", strerror(-why));

	/* open() refused: the fd limit reached (EMFILE). */
	getrlimit(RLIMIT_NOFILE, &rl);
	low = rl;
	lowest = open("/dev/null", O_RDONLY);	/* the lowest free number */
	close(lowest);
	low.rlim_cur = (rlim_t)lowest;	/* so open() has no free number below the limit */
	fake_page(0, 1, 96, 4);
	if (setrlimit(RLIMIT_NOFILE, &low))
		bail("setrlimit: %s", strerror(errno));
	r = peermem_open(&ch, fake, 0, &why);
	setrlimit(RLIMIT_NOFILE, &rl);
	ok(r == PEERMEM_NO_CHANNEL && why == -EMFILE && ch == NULL,
	   "open() refused with EMFILE: PEERMEM_NO_CHANNEL, reason EMFILE (%d, %s)", r, strerror(-why));
	r = peermem_open(&ch, fake, 0, NULL);
	ok(r == 0 && ch, "with a free slot again the stand-in opens (reason may be NULL) (%d)", r);
	peermem_close(ch);
	ok(open_fds() == fds, "no descriptor left open by the refused and the closed opens (%d, was %d)",
	   open_fds(), fds);
}

static void test_bad_args(void)
{
	char longpath[PEERMEM_PATH_MAX + 8];
	struct peermem_channel *ch = (void *)1;
	struct peermem_info info;
	int why = 1;

	ok(peermem_open(NULL, NULL, 0, &why) == -EINVAL && why == 0, "open(NULL handle pointer): -EINVAL");
	ok(peermem_open(&ch, NULL, 1, &why) == -EINVAL && ch == NULL, "open(flags 1): -EINVAL, *chp NULL");
	ok(peermem_open(&ch, "", 0, NULL) == -EINVAL, "open(\"\"): -EINVAL");
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = 0;
	ok(peermem_open(&ch, longpath, 0, NULL) == -ENAMETOOLONG, "open(a path of %zu bytes): -ENAMETOOLONG",
	   sizeof(longpath) - 1);
	ok(peermem_drain(NULL, &H, NULL, 0, NULL) == -EINVAL, "drain(NULL): -EINVAL");
	ok(peermem_fd(NULL) == -EINVAL && peermem_wait(NULL, 0) == -EINVAL &&
	   peermem_info(NULL, &info, sizeof(info)) == -EINVAL,
	   "fd/wait/info(NULL): -EINVAL");
	ok(peermem_generation(NULL) == PEERMEM_GENERATION_LOST && peermem_changed(NULL, 0) == 1,
	   "generation(NULL) is PEERMEM_GENERATION_LOST, changed(NULL) 1");
	ok(peermem_close(NULL) == 0, "close(NULL): 0");
	ok(peermem_version() == LIBPEERMEM_VERSION_MAJOR * 1000 + LIBPEERMEM_VERSION_MINOR,
	   "peermem_version() %d matches the header", peermem_version());

	fake_page(0, 1, 96, 4);
	ch = fake_open();
	{
		struct peermem_handlers h1 = { on_revoked, NULL }, h2 = { NULL, on_flush };

		ok(peermem_drain(ch, NULL, NULL, 0, NULL) == -EINVAL &&
		   peermem_drain(ch, &h1, NULL, 0, NULL) == -EINVAL &&
		   peermem_drain(ch, &h2, NULL, 0, NULL) == -EINVAL,
		   "drain without handlers or with one missing: -EINVAL");
	}
	ok(peermem_drain(ch, &H, NULL, PEERMEM_DRAIN_MAX + 1, NULL) == -EINVAL,
	   "drain(max_records PEERMEM_DRAIN_MAX + 1): -EINVAL");
	ok(peermem_wait(ch, -2) == -EINVAL && peermem_wait(ch, PEERMEM_WAIT_MAX_MS + 1) == -EINVAL,
	   "wait(-2), wait(PEERMEM_WAIT_MAX_MS + 1): -EINVAL");
	ok(peermem_info(ch, &info, 7) == -EINVAL && peermem_info(ch, &info, 4097) == -EINVAL &&
	   peermem_info(ch, NULL, sizeof(info)) == -EINVAL,
	   "info(size 7, size 4097, NULL): -EINVAL");
	{
		unsigned char big[200];

		memset(big, 0xee, sizeof(big));
		ok(peermem_info(ch, (struct peermem_info *)big, sizeof(big)) == 0 &&
		   ((struct peermem_info *)big)->version == 1 && big[sizeof(big) - 1] == 0 &&
		   big[sizeof(struct peermem_info)] == 0,
		   "info with a larger struct: known fields filled, the rest zeroed");
	}
	{
		struct seen s;

		memset(&s, 0, sizeof(s));
		ok(peermem_drain(ch, &H, &s, 0, NULL) == 0 && s.revoked == 0,
		   "after the bad calls a drain of nothing works: 0 records");
	}
	peermem_close(ch);
}

static void test_records(void)
{
	struct peermem_event ev[8];
	struct peermem_channel *ch;
	struct peermem_info info;
	uint64_t cur = 99;
	struct seen s;
	int r;

	fake_page(5, 1, 96, 4);
	ch = fake_open();
	ok(peermem_generation(ch) == 5 && !peermem_changed(ch, 5) && peermem_changed(ch, 4),
	   "the generation is the page's (5); changed() compares it with a cursor");
	memset(&s, 0, sizeof(s));
	s.order_ok = 1;
	r = peermem_drain(ch, &H, &s, 0, &cur);
	ok(r == 0 && s.revoked == 0 && cur == 5, "nothing new since open: drain hands nothing over, cursor 5 (%d, %llu)",
	   r, (unsigned long long)cur);

	ev[0] = rec(6, 0x10000, 0x4000, PEERMEM_CAUSE_GPU_FREE, "nv_mem");
	ev[1] = rec(7, 0x20000, 0x1000, PEERMEM_CAUSE_MOVE, "nv_mem");
	ev[2] = rec(8, 0x30000, 0x2000, 77, "a-client-whose-name-is-long");
	fake_records(ev, 3);
	fake_gen(8);
	ok(peermem_changed(ch, cur), "the generation moved to 8: changed(5) is 1");
	r = peermem_drain(ch, &H, &s, 3, &cur);
	ok(r == 3 && s.revoked == 3 && s.flushes == 0 && s.order_ok,
	   "three records handed over in generation order (%d, %d revoked)", r, s.revoked);
	ok(s.start[0] == 0x10000 && s.len[0] == 0x4000 && s.cause[0] == PEERMEM_CAUSE_GPU_FREE &&
	   !strcmp(s.client[0], "nv_mem") && s.gen[0] == 6 && s.cause[1] == PEERMEM_CAUSE_MOVE &&
	   s.cause[2] == 77 && !strcmp(s.client[2], "a-client-whose-name-is-long"),
	   "range, cause (also one this header does not name), client and generation as queued");
	ok(cur == 8 && !peermem_changed(ch, cur), "cursor 8 after the drain (%llu)", (unsigned long long)cur);

	/* Two records, an overflow, one record: a flush for the first three. */
	ev[0] = rec(9, 0x40000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	ev[1] = rec(10, 0x50000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	ev[2] = rec(14, 0, 0, PEERMEM_CAUSE_OVERFLOW, NULL);
	ev[3] = rec(15, 0x60000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	lseek(peermem_fd(ch), 4096, SEEK_SET);
	fake_records(ev, 4);
	fake_gen(15);
	memset(&s, 0, sizeof(s));
	s.order_ok = 1;
	r = peermem_drain(ch, &H, &s, 4, &cur);	/* reads the four */
	ok(r == 2 && s.flushes == 1 && s.revoked == 1 && s.start[0] == 0x60000 && cur == 15,
	   "overflow: one flush stands for it and the two records read with it, then the record after it (%d returned, %d flushes, %d revoked, cursor %llu)",
	   r, s.flushes, s.revoked, (unsigned long long)cur);
	peermem_info(ch, &info, sizeof(info));
	ok(info.records == 4 && info.overflows == 1 && info.flushes == 1 && info.skipped == 2 &&
	   info.seen == 15 && info.generation == 15 && info.queue_len == 4 && info.lost == 0,
	   "counters: 4 records handed over, 1 overflow, 1 flush, 2 skipped, seen 15 (%llu %llu %llu %llu %llu)",
	   (unsigned long long)info.records, (unsigned long long)info.overflows,
	   (unsigned long long)info.flushes, (unsigned long long)info.skipped,
	   (unsigned long long)info.seen);

	/* max_records: one at a time; the cursor follows the records. */
	ev[0] = rec(16, 0x1000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	ev[1] = rec(17, 0x2000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	lseek(peermem_fd(ch), 4096, SEEK_SET);
	fake_records(ev, 2);
	fake_gen(17);
	memset(&s, 0, sizeof(s));
	r = peermem_drain(ch, &H, &s, 1, &cur);
	ok(r == 1 && s.revoked == 1 && cur == 16 && peermem_changed(ch, cur),
	   "max_records 1: one record, cursor 16, still changed (%d, %llu)", r, (unsigned long long)cur);
	r = peermem_drain(ch, &H, &s, 1, &cur);
	ok(r == 1 && s.revoked == 2 && cur == 17 && !peermem_changed(ch, cur),
	   "the next drain of 1 takes the second: cursor 17 (%d, %llu)", r, (unsigned long long)cur);

	/* A handler that drains again on the same channel: EDEADLK. */
	ev[0] = rec(18, 0x3000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	lseek(peermem_fd(ch), 4096, SEEK_SET);
	fake_records(ev, 1);
	fake_gen(18);
	memset(&s, 0, sizeof(s));
	s.ch = ch;
	s.nested = 1;
	r = peermem_drain(ch, &H, &s, 1, &cur);
	ok(r == 1 && s.nested == -EDEADLK, "a drain from inside a handler: -EDEADLK (%d)", s.nested);

	/* A short record from the kernel: EPROTO, and the channel is lost. */
	lseek(peermem_fd(ch), 4096, SEEK_SET);
	fake_records(ev, 1);
	if (ftruncate(fake_fd, 4096 + 50))
		bail("ftruncate");
	fake_gen(19);
	memset(&s, 0, sizeof(s));
	r = peermem_drain(ch, &H, &s, 1, &cur);
	ok(r == -EPROTO && s.revoked == 0, "a read of 50 bytes: -EPROTO, nothing handed over (%d)", r);
	r = peermem_drain(ch, &H, &s, 1, &cur);
	peermem_info(ch, &info, sizeof(info));
	ok(r == -EPROTO && info.lost == -EPROTO, "and every later drain says so too (%d, lost %d)", r, info.lost);
	ok(peermem_wait(ch, 1000) == 1, "wait on a lost channel returns 1 at once (drain to learn why)");
	peermem_close(ch);
}

static void test_closed_fd(void)
{
	struct peermem_channel *ch;
	struct seen s;
	int fd, other, r;

	fake_page(0, 1, 96, 4);
	ch = fake_open();
	fd = peermem_fd(ch);
	close(fd);	/* behind the library's back */
	fake_gen(1);
	memset(&s, 0, sizeof(s));
	r = peermem_drain(ch, &H, &s, 0, NULL);
	ok(r == -EBADF && peermem_generation(ch) == 1,
	   "descriptor closed behind the library: drain -EBADF (%d); the page stays readable", r);
	peermem_close(ch);

	ch = fake_open();
	fd = peermem_fd(ch);
	close(fd);
	other = open("/dev/zero", O_RDONLY);	/* takes the same number */
	if (other != fd)
		bail("the descriptor number was not reused (%d, %d)", other, fd);
	fake_gen(2);
	r = peermem_drain(ch, &H, &s, 0, NULL);
	ok(r == -EBADF && s.revoked == 0 && s.flushes == 0,
	   "its number reused by another file: drain -EBADF, nothing read from that file (%d)", r);
	ok(peermem_fd(ch) == -EBADF, "peermem_fd then says -EBADF");
	peermem_close(ch);
	ok(fcntl(other, F_GETFD) >= 0, "close of the channel leaves the other file open");
	close(other);
}

/* ---- fork ---- */

static volatile int in_handler, release_handler;

static void slow_revoked(void *arg, uint64_t start, uint64_t length, uint32_t cause,
			 const char *client, uint64_t generation)
{
	(void)arg; (void)start; (void)length; (void)cause; (void)client; (void)generation;
	__atomic_store_n(&in_handler, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&release_handler, __ATOMIC_SEQ_CST))
		usleep(1000);
}

static void *drainer(void *arg)
{
	static const struct peermem_handlers h = { slow_revoked, on_flush };

	return (void *)(intptr_t)peermem_drain(arg, &h, NULL, 1, NULL);
}

static void test_fork(void)
{
	struct peermem_event ev[1];
	struct peermem_channel *ch;
	pthread_t t;
	void *ret;
	pid_t pid;
	int st = -1;

	fake_page(0, 1, 96, 4);
	ch = fake_open();
	ok(fcntl(peermem_fd(ch), F_GETFD) & FD_CLOEXEC, "the descriptor is close-on-exec (an exec'd program has no channel)");
	ev[0] = rec(1, 0x1000, 0x1000, PEERMEM_CAUSE_UNMAP, "nv_mem");
	fake_records(ev, 1);
	fake_gen(1);
	/* A thread of the parent is inside the drain (mutex held) at the fork. */
	pthread_create(&t, NULL, drainer, ch);
	while (!__atomic_load_n(&in_handler, __ATOMIC_SEQ_CST))
		usleep(1000);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct seen s;
		struct peermem_info info;
		int e = 0;

		alarm(20);	/* a deadlock on the inherited mutex fails the test */
		memset(&s, 0, sizeof(s));
		if (peermem_generation(ch) != PEERMEM_GENERATION_LOST)
			e |= 1;
		if (!peermem_changed(ch, 1))
			e |= 2;
		if (peermem_drain(ch, &H, &s, 0, NULL) != -EPERM || s.revoked || s.flushes)
			e |= 4;
		if (peermem_info(ch, &info, sizeof(info)) || info.lost != -EPERM)
			e |= 8;
		if (peermem_wait(ch, 0) != 1)
			e |= 16;
		if (peermem_close(ch) != 0)
			e |= 32;
		_exit(e);
	}
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "fork while another thread drains: the child's handle is lost (generation LOST, changed, drain -EPERM without handlers, info.lost EPERM, wait 1, close 0) and nothing deadlocks (status %#x)",
	   st);
	__atomic_store_n(&release_handler, 1, __ATOMIC_SEQ_CST);
	pthread_join(t, &ret);
	ok((intptr_t)ret == 1 && peermem_generation(ch) == 1,
	   "the parent's drain finished (%d) and its channel works on", (int)(intptr_t)ret);
	peermem_close(ch);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "%s", getenv("TMPDIR") ?: "/tmp");
	snprintf(fake, sizeof(fake), "%s/peermem-fake.XXXXXX", dir);
	fake_fd = mkstemp(fake);
	if (fake_fd < 0)
		bail("mkstemp: %s", strerror(errno));
	test_no_channel();
	test_bad_args();
	test_records();
	test_closed_fd();
	test_fork();
	close(fake_fd);
	unlink(fake);
	return finish();
}
