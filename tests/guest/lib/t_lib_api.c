// SPDX-License-Identifier: GPL-2.0
/*
 * libpeermem against the real /dev/peermem (tests/host/lib runs the edges
 * that need no device):
 *
 *  - open: version 1, the module's queue length, generation 0;
 *  - exact records: a GPU free and a munmap of two registered allocations
 *    reach the revoked handler with the registered range, the cause and
 *    the client (peer_name), the cursor follows the generation;
 *  - poll: peermem_wait and an epoll set on peermem_fd wake for a record
 *    and are quiet when the queue is empty;
 *  - many threads: DRAINERS threads check and drain with cursors of their
 *    own while the main thread revokes REVOKES registrations: every
 *    generation is handed over exactly once, and every cursor ends at the
 *    last generation;
 *  - fork: the child's handle says lost (generation LOST, drain -EPERM,
 *    the kernel also refuses the inherited descriptor with EPERM), the
 *    child opens a channel of its own; the parent's channel works on;
 *  - the descriptor closed behind the library: drain -EBADF;
 *  - open() refused with EMFILE (the fd limit, as the per-user limit of
 *    /dev/peermem files also says): PEERMEM_NO_CHANNEL, reason EMFILE;
 *  - overflow (event_queue_len=4): one flush handler call for the four
 *    records and the overflow, the next record handed over normally;
 *  - no device (events=0): PEERMEM_NO_CHANNEL, reason ENOENT.
 */
#define _GNU_SOURCE
#include <sys/epoll.h>
#include <peermem/libpeermem.h>
#include "../peermem/peermem_test.h"

#define LEN (128 * 1024UL)
#define DRAINERS 4
#define REVOKES 64

static struct conn c;
static int gfd;

struct got {
	int revoked, flushes;
	uint64_t start[8], len[8], gen[8];
	uint32_t cause[8];
	char client[8][PEERMEM_CLIENT_NAME_LEN];
};

static void on_revoked(void *arg, uint64_t start, uint64_t length, uint32_t cause,
		       const char *client, uint64_t generation)
{
	struct got *g = arg;
	int i = g->revoked++;

	if (i < 8) {
		g->start[i] = start;
		g->len[i] = length;
		g->cause[i] = cause;
		g->gen[i] = generation;
		snprintf(g->client[i], sizeof(g->client[i]), "%s", client);
	}
}

static void on_flush(void *arg)
{
	((struct got *)arg)->flushes++;
}

static const struct peermem_handlers H = { on_revoked, on_flush };

static void alloc_reg(struct gmem *g, struct ibv_mr **mr)
{
	int r = gmem_alloc(gfd, LEN, g);

	if (r)
		bail("GPUSIM_IOC_ALLOC: %s", strerror(-r));
	*mr = ibv_reg_mr(c.pd, g->p, LEN, MR_ACCESS);
	if (!*mr)
		bail("ibv_reg_mr of GPU memory: %s", strerror(errno));
}

static struct peermem_channel *open_ok(const char *what)
{
	struct peermem_channel *ch;
	int why, r = peermem_open(&ch, NULL, 0, &why);

	if (r)
		bail("%s: peermem_open: %d (%s)", what, r, strerror(-why));
	return ch;
}

static void test_records(struct peermem_channel *ch)
{
	struct ibv_mr *mr[2];
	struct gmem g[2];
	struct peermem_info info;
	uint64_t cur = peermem_generation(ch);
	struct got got;
	int r;

	peermem_info(ch, &info, sizeof(info));
	ok(info.version == PEERMEM_EVENTS_VERSION && info.queue_len == 256 && info.generation == 0 &&
	   cur == 0 && info.lost == 0,
	   "open: version %u, queue length %u (the default), generation %llu", info.version,
	   info.queue_len, (unsigned long long)info.generation);
	alloc_reg(&g[0], &mr[0]);
	alloc_reg(&g[1], &mr[1]);
	ok(!peermem_changed(ch, cur) && peermem_wait(ch, 0) == 0,
	   "two registrations, nothing revoked: not changed, wait(0) says 0");
	gmem_free(gfd, &g[0]);
	if (munmap(g[1].p, LEN))
		bail("munmap");
	ok(peermem_generation(ch) == 2 && peermem_changed(ch, cur) && peermem_wait(ch, 0) == 1,
	   "a GPU free and a munmap: generation 2, changed, wait(0) says 1 (%llu)",
	   (unsigned long long)peermem_generation(ch));
	memset(&got, 0, sizeof(got));
	r = peermem_drain(ch, &H, &got, 0, &cur);
	ok(r == 2 && got.revoked == 2 && got.flushes == 0 && cur == 2 && !peermem_changed(ch, cur),
	   "drain hands two records over, cursor 2 (%d, %d, %llu)", r, got.revoked, (unsigned long long)cur);
	ok(got.start[0] == (uintptr_t)g[0].p && got.len[0] == LEN && got.cause[0] == PEERMEM_CAUSE_GPU_FREE &&
	   got.gen[0] == 1 && !strcmp(got.client[0], pm_name) &&
	   got.start[1] == (uintptr_t)g[1].p && got.len[1] == LEN && got.cause[1] == PEERMEM_CAUSE_UNMAP &&
	   got.gen[1] == 2 && !strcmp(got.client[1], pm_name),
	   "the records: the registered ranges, gpu_free then unmap, generations 1 and 2, client %s ('%s', '%s')",
	   pm_name, got.client[0], got.client[1]);
	ok(peermem_wait(ch, 0) == 0 && peermem_drain(ch, &H, &got, 0, &cur) == 0 && got.revoked == 2,
	   "drained: wait(0) 0, another drain hands nothing over");
	ibv_dereg_mr(mr[0]);
	ibv_dereg_mr(mr[1]);
	gmem_drop(&g[0]);
	gmem_free(gfd, &g[1]);
}

static void test_epoll(struct peermem_channel *ch)
{
	struct epoll_event e = { .events = EPOLLIN }, out;
	struct ibv_mr *mr;
	struct gmem g;
	struct got got;
	int ep = epoll_create1(EPOLL_CLOEXEC), n0, n1, w;
	double t0;

	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, peermem_fd(ch), &e))
		bail("epoll on peermem_fd: %s", strerror(errno));
	alloc_reg(&g, &mr);
	n0 = epoll_wait(ep, &out, 1, 0);
	gmem_free(gfd, &g);
	n1 = epoll_wait(ep, &out, 1, 5000);
	ok(n0 == 0 && n1 == 1 && (out.events & EPOLLIN), "epoll on peermem_fd: quiet, then EPOLLIN for a record (%d, %d)", n0, n1);
	memset(&got, 0, sizeof(got));
	peermem_drain(ch, &H, &got, 0, NULL);
	t0 = now_s();
	w = peermem_wait(ch, 300);
	ok(got.revoked == 1 && epoll_wait(ep, &out, 1, 0) == 0 && w == 0 && now_s() - t0 >= 0.25,
	   "after the drain: epoll quiet, peermem_wait(300) times out with 0 (%d)", w);
	close(ep);
	ibv_dereg_mr(mr);
	gmem_drop(&g);
}

/* ---- many threads draining one channel ---- */

static struct peermem_channel *mch;
static int hits[REVOKES + 1];
static int stop_drainers;
static uint64_t cursors[DRAINERS];
static int drain_errors;

static void mt_revoked(void *arg, uint64_t start, uint64_t length, uint32_t cause,
		       const char *client, uint64_t generation)
{
	uint64_t base = *(uint64_t *)arg;

	(void)start; (void)length; (void)cause; (void)client;
	if (generation > base && generation - base <= REVOKES)
		__atomic_fetch_add(&hits[generation - base], 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&hits[0], 1, __ATOMIC_RELAXED);
}

static void mt_flush(void *arg)
{
	(void)arg;
	__atomic_fetch_add(&drain_errors, 1000, __ATOMIC_RELAXED);
}

static uint64_t mt_base;

static void *drainer(void *arg)
{
	static const struct peermem_handlers h = { mt_revoked, mt_flush };
	uint64_t *cur = arg;

	while (!__atomic_load_n(&stop_drainers, __ATOMIC_ACQUIRE) || peermem_changed(mch, *cur)) {
		if (peermem_changed(mch, *cur)) {
			if (peermem_drain(mch, &h, &mt_base, 1 + (unsigned)(cur - cursors), cur) < 0)
				__atomic_fetch_add(&drain_errors, 1, __ATOMIC_RELAXED);
		} else {
			/* Not a spin: the guest may have fewer CPUs than threads. */
			peermem_wait(mch, 20);
		}
	}
	return NULL;
}

static void test_threads(struct peermem_channel *ch)
{
	struct ibv_mr *mr[8];
	struct gmem g[8];
	pthread_t t[DRAINERS];
	int once = 1, missing = 0, dup = 0, cur_ok = 1;
	uint64_t last;

	mch = ch;
	mt_base = peermem_generation(ch);
	{
		/* Whatever is queued before the base is drained first. */
		struct got got;

		peermem_drain(ch, &H, &got, 0, NULL);
	}
	for (int i = 0; i < DRAINERS; i++) {
		cursors[i] = mt_base;
		pthread_create(&t[i], NULL, drainer, &cursors[i]);
	}
	for (int k = 0; k < REVOKES; k += 8) {
		for (int i = 0; i < 8; i++)
			alloc_reg(&g[i], &mr[i]);
		for (int i = 0; i < 8; i++)
			gmem_free(gfd, &g[i]);	/* one record each */
		for (int i = 0; i < 8; i++) {
			ibv_dereg_mr(mr[i]);
			gmem_drop(&g[i]);
		}
	}
	last = peermem_generation(ch);
	__atomic_store_n(&stop_drainers, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < DRAINERS; i++)
		pthread_join(t[i], NULL);
	for (int gen = 1; gen <= REVOKES; gen++) {
		missing += hits[gen] == 0;
		dup += hits[gen] > 1;
	}
	once = !missing && !dup && hits[0] == 0;
	for (int i = 0; i < DRAINERS; i++)
		cur_ok &= cursors[i] == last;
	ok(last - mt_base == REVOKES, "threads: %d revocations moved the generation by %llu", REVOKES,
	   (unsigned long long)(last - mt_base));
	ok(once && drain_errors == 0,
	   "threads: %d threads checking and draining at once handed every generation over exactly once (%d missing, %d twice, %d stray, %d errors)",
	   DRAINERS, missing, dup, hits[0], drain_errors);
	ok(cur_ok, "threads: every thread's cursor ends at the last generation %llu (%llu %llu %llu %llu)",
	   (unsigned long long)last, (unsigned long long)cursors[0], (unsigned long long)cursors[1],
	   (unsigned long long)cursors[2], (unsigned long long)cursors[3]);
}

static void test_fork(struct peermem_channel *ch)
{
	struct ibv_mr *mr;
	struct gmem g;
	struct got got;
	pid_t pid;
	int st = -1, r;
	uint64_t cur = peermem_generation(ch);

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct peermem_event ev;
		struct peermem_channel *own;
		int e = 0, why;

		alarm(30);
		memset(&got, 0, sizeof(got));
		if (peermem_generation(ch) != PEERMEM_GENERATION_LOST || !peermem_changed(ch, cur))
			e |= 1;
		if (peermem_drain(ch, &H, &got, 0, NULL) != -EPERM || got.revoked || got.flushes)
			e |= 2;
		if (read(peermem_fd(ch), &ev, sizeof(ev)) != -1 || errno != EPERM)
			e |= 4;	/* the kernel agrees: not this address space's file */
		if (peermem_close(ch))
			e |= 8;
		if (peermem_open(&own, NULL, 0, &why) != 0 || peermem_generation(own) != 0)
			e |= 16;
		peermem_close(own);
		_exit(e);
	}
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "fork: the child's handle is lost (generation LOST, drain -EPERM; the kernel refuses its read with EPERM too), close works, and the child opens a channel of its own (status %#x: 1 gen, 2 drain, 4 read, 8 close, 16 own)",
	   st);
	alloc_reg(&g, &mr);
	gmem_free(gfd, &g);
	memset(&got, 0, sizeof(got));
	r = peermem_drain(ch, &H, &got, 0, &cur);
	ok(r == 1 && got.revoked == 1 && got.start[0] == (uintptr_t)g.p && !peermem_changed(ch, cur),
	   "fork: the parent's channel works on (%d)", r);
	ibv_dereg_mr(mr);
	gmem_drop(&g);
}

static void test_closed(void)
{
	struct peermem_channel *ch = open_ok("closed");
	struct peermem_info info;
	struct ibv_mr *mr;
	struct gmem g;
	struct got got;
	int r;

	close(peermem_fd(ch));	/* behind the library */
	alloc_reg(&g, &mr);
	gmem_free(gfd, &g);
	memset(&got, 0, sizeof(got));
	r = peermem_drain(ch, &H, &got, 0, NULL);
	peermem_info(ch, &info, sizeof(info));
	ok(r == -EBADF && info.lost == -EBADF && peermem_generation(ch) == 1,
	   "descriptor closed behind the library: drain -EBADF, the channel lost; the page (which holds the file) still counts (%d, generation %llu)",
	   r, (unsigned long long)peermem_generation(ch));
	ok(peermem_close(ch) == 0, "and peermem_close of it returns 0");
	ibv_dereg_mr(mr);
	gmem_drop(&g);
}

static void test_emfile(void)
{
	struct peermem_channel *ch = NULL;
	struct rlimit rl, low;
	int lowest, r, why;

	getrlimit(RLIMIT_NOFILE, &rl);
	lowest = open("/dev/null", O_RDONLY);
	close(lowest);
	low = rl;
	low.rlim_cur = (rlim_t)lowest;
	if (setrlimit(RLIMIT_NOFILE, &low))
		bail("setrlimit: %s", strerror(errno));
	r = peermem_open(&ch, NULL, 0, &why);
	setrlimit(RLIMIT_NOFILE, &rl);
	ok(r == PEERMEM_NO_CHANNEL && why == -EMFILE && !ch,
	   "open() of /dev/peermem refused with EMFILE: PEERMEM_NO_CHANNEL, reason EMFILE (%d, %s)", r, strerror(-why));
}

static void test_overflow(void)
{
	struct peermem_channel *ch = open_ok("overflow");
	struct peermem_info info;
	struct ibv_mr *mr[7];
	struct gmem g[7];
	struct got got;
	uint64_t cur;
	int r;

	peermem_info(ch, &info, sizeof(info));
	ok(info.queue_len == 4, "overflow: peermem loaded with event_queue_len=4 (%u)", info.queue_len);
	for (int i = 0; i < 7; i++)
		alloc_reg(&g[i], &mr[i]);
	for (int i = 0; i < 6; i++)
		gmem_free(gfd, &g[i]);
	memset(&got, 0, sizeof(got));
	r = peermem_drain(ch, &H, &got, 0, &cur);
	peermem_info(ch, &info, sizeof(info));
	ok(r == 1 && got.flushes == 1 && got.revoked == 0 && cur == 6 && info.overflows == 1 &&
	   info.skipped == 4,
	   "overflow: six revocations, four queued: one flush, no record, cursor 6, 4 records read with it skipped (%d, %d flushes, %d revoked, %llu, %llu skipped)",
	   r, got.flushes, got.revoked, (unsigned long long)cur, (unsigned long long)info.skipped);
	gmem_free(gfd, &g[6]);
	r = peermem_drain(ch, &H, &got, 0, &cur);
	ok(r == 1 && got.revoked == 1 && got.start[0] == (uintptr_t)g[6].p && got.gen[0] == 7 && cur == 7,
	   "overflow: the next revocation is handed over as a record (generation 7)");
	for (int i = 0; i < 7; i++) {
		ibv_dereg_mr(mr[i]);
		gmem_drop(&g[i]);
	}
	peermem_close(ch);
}

int main(void)
{
	struct peermem_channel *ch, *none = (void *)1;
	int r, why;

	rxe_up();
	load_modules(NULL);
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0 || conn_open(&c))
		bail("cannot open /dev/gpusim or set up an RC loopback on " RXE_DEV);
	ch = open_ok("first");
	test_records(ch);
	test_epoll(ch);
	test_threads(ch);
	test_fork(ch);
	ok(peermem_close(ch) == 0, "close");
	test_closed();
	test_emfile();

	conn_close(&c);
	load_modules("event_queue_len=4");
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	test_overflow();
	conn_close(&c);

	load_modules("events=0");
	r = peermem_open(&none, NULL, 0, &why);
	ok(r == PEERMEM_NO_CHANNEL && why == -ENOENT && none == NULL,
	   "events=0 (no /dev/peermem): PEERMEM_NO_CHANNEL, reason ENOENT (%d, %s)", r, strerror(-why));
	close(gfd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	return finish();
}
