// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_free - what freeing gpusim memory does to the pins on it: the
 * free callback of every non-persistent pin runs exactly once, before the
 * free returns (free ioctl, close, process exit); persistent pins keep the
 * memory; munmap/mremap leave pins alone; put racing with free resolves to
 * exactly one of "put succeeded" or "callback ran".
 */
#include "gpusim_test.h"
#include <pthread.h>

static int status(int tc, uint32_t id, struct gpusim_tc_req *q)
{
	memset(q, 0, sizeof(*q));
	q->id = id;
	return tc_cmd(tc, GPUSIM_TC_STATUS, q);
}

static int tc_read(int tc, uint32_t id, uint64_t off, void *buf, uint64_t len)
{
	struct gpusim_tc_req q;

	memset(&q, 0, sizeof(q));
	q.id = id;
	q.off = off;
	q.len = len;
	q.buf = (uintptr_t)buf;
	return tc_cmd(tc, GPUSIM_TC_READ, &q);
}

/*
 * stale: the stale_errno to run with (0: the 550 driver's answer, the
 * default; 22: the refusing variant).
 */
static void test_free_while_pinned(int fd, int tc, int stale, int rm_lock)
{
	struct gpusim_tc_req a, b, s;
	uint64_t h;
	char *p = gs_alloc(fd, 4 * GPU_PAGE, &h);
	long long fired = dbg_get("free_callbacks");
	long long rec = dbg_get("rm_lock_recursions");
	int ret, cb_want;

	dbg_set("stale_errno", stale);
	dbg_set("rm_lock", rm_lock);
	diag("free while pinned, stale_errno=%d, rm_lock=%d", stale, gs_rm_lock());
	ok(tc_get(tc, p, 4 * GPU_PAGE, 0, &a) == 0, "pin the whole allocation");
	ok(tc_get(tc, p + GPU_PAGE, GPU_PAGE, GPUSIM_TC_CB_PUT, &b) == 0,
	   "pin a sub-range (its callback tries put_pages)");
	ret = gs_free(fd, h);
	ok(ret == 0, "free the allocation while pinned");
	ok(status(tc, a.id, &s) == 0 && s.callbacks == 1 && !s.pinned,
	   "first pin: free callback ran once, before the free returned");
	ok(status(tc, b.id, &s) == 0 && s.callbacks == 1,
	   "second pin: free callback ran once");
	/*
	 * With the RM lock the callback runs holding it, and the 550 driver
	 * refuses the put's recursive acquisition (NV_ERR_INVALID_LOCK_STATE,
	 * -EIO); without it gpusim treats the put as stale.
	 */
	cb_want = gs_rm_lock() ? -EIO : -stale;
	ok(s.cb_ret == cb_want, "put_pages from inside the free callback: %d (want %d), no deadlock",
	   s.cb_ret, cb_want);
	ok(dbg_get("rm_lock_recursions") - rec == (gs_rm_lock() ? 1 : 0),
	   "rm_lock_recursions counted it only with the RM lock (+%lld)",
	   dbg_get("rm_lock_recursions") - rec);
	ok(dbg_get("free_callbacks") - fired == 2, "free_callbacks went up by exactly 2");
	ok(dbg_get("live_pins") == 0, "gpusim freed both page tables");
	ret = tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	ok(ret == -stale, "put_pages after the callback ran: %d (stale_errno=%d)", ret, stale);
	ok(status(tc, a.id, &s) == 0 && s.callbacks == 1, "still exactly one callback");
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	tc_id(tc, GPUSIM_TC_FORGET, b.id, 0, &s);
	munmap(p, 4 * GPU_PAGE);
	dbg_set("stale_errno", 0);
	gs_reset_knobs();	/* rm_lock back to this run's setting */
}

static void test_callback_waited_for(int fd, int tc)
{
	struct gpusim_tc_req q, s;
	uint64_t h;
	char *p = gs_alloc(fd, GPU_PAGE, &h);
	double t0, ms;

	memset(&q, 0, sizeof(q));
	q.va = (uintptr_t)p;
	q.len = GPU_PAGE;
	q.cb_delay_ms = 300;
	ok(tc_cmd(tc, GPUSIM_TC_GET, &q) == 0 && q.ret == 0, "pin with a callback that sleeps 300 ms");
	t0 = now_ms();
	gs_free(fd, h);
	ms = now_ms() - t0;
	ok(ms >= 290, "the free waited for the callback (%.0f ms)", ms);
	ok(status(tc, q.id, &s) == 0 && s.callbacks == 1, "callback done when the free returned");
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
	munmap(p, GPU_PAGE);
}

static void test_dma_in_callback(int fd, int tc)
{
	struct gpusim_tc_req a, b, s;
	long long reaped = dbg_get("dma_reaped");
	uint64_t h;
	char *p = gs_alloc(fd, 2 * GPU_PAGE, &h);
	int ret;

	tc_get(tc, p, GPU_PAGE, GPUSIM_TC_CB_UNMAP, &a);
	tc_get(tc, p + GPU_PAGE, GPU_PAGE, 0, &b);
	memset(&s, 0, sizeof(s));
	s.id = a.id;
	ret = tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s);
	if (ret == -ENODEV) {
		skip("DMA in the free callback: no PCI device in the guest");
		tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
		tc_id(tc, GPUSIM_TC_FORGET, b.id, 0, &s);
		munmap(p, 2 * GPU_PAGE);
		gs_free(fd, h);
		return;
	}
	ok(ret == 0 && s.ret == 0, "DMA-map pin A");
	memset(&s, 0, sizeof(s));
	s.id = b.id;
	ok(tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s) == 0 && s.ret == 0, "DMA-map pin B");
	ok(dbg_get("live_dma_mappings") == 2, "two live DMA mappings");
	gs_free(fd, h);
	ok(status(tc, a.id, &s) == 0 && s.callbacks == 1 && s.cb_ret == 0,
	   "A's callback unmapped its DMA mapping itself (dma_unmap_pages + free_dma_mapping: %d)",
	   s.cb_ret);
	ok(dbg_get("dma_reaped") - reaped == 1,
	   "B's callback did not: gpusim unmapped that one after the callback");
	ok(dbg_get("live_dma_mappings") == 0, "no DMA mapping left");
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	tc_id(tc, GPUSIM_TC_FORGET, b.id, 0, &s);
	munmap(p, 2 * GPU_PAGE);
}

static void test_close_and_exit(int tc)
{
	struct gpusim_tc_req q, s;
	int fd2 = gs_open(), pfd[2], st;
	uint32_t id = 0;
	uint64_t h;
	char *p = gs_alloc(fd2, GPU_PAGE, &h);
	pid_t pid;

	tc_get(tc, p, GPU_PAGE, 0, &q);
	munmap(p, GPU_PAGE);
	ok(status(tc, q.id, &s) == 0 && s.callbacks == 0 && s.pinned,
	   "munmap alone does not call the free callback");
	close(fd2);
	ok(status(tc, q.id, &s) == 0 && s.callbacks == 1 && !s.pinned,
	   "closing the file frees the allocation: callback ran once");
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);

	if (pipe(pfd))
		bail("pipe");
	pid = fork();
	if (pid == 0) {
		int cfd = gs_open();
		char *cp = gs_alloc(cfd, 2 * GPU_PAGE, NULL);
		struct gpusim_tc_req cq;

		if (tc_get(tc, cp, 2 * GPU_PAGE, 0, &cq))
			_exit(1);
		if (write(pfd[1], &cq.id, sizeof(cq.id)) != sizeof(cq.id))
			_exit(2);
		_exit(0);	/* still pinned, still mapped */
	}
	ok(read(pfd[0], &id, sizeof(id)) == sizeof(id) && id, "child pinned its memory (registration %u)", id);
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited while pinned");
	ok(status(tc, id, &s) == 0 && s.callbacks == 1 && !s.pinned,
	   "process exit freed the memory: callback ran once");
	ok(dbg_get("live_allocs") == 0 && dbg_get("live_pins") == 0, "nothing left of the child");
	tc_id(tc, GPUSIM_TC_FORGET, id, 0, &s);
	close(pfd[0]);
	close(pfd[1]);
}

static void test_persistent(int fd, int tc)
{
	struct gpusim_tc_req pp, np, s;
	char *buf = malloc(2 * GPU_PAGE);
	uint64_t h;
	char *p = gs_alloc(fd, 2 * GPU_PAGE, &h);
	long long stale0;
	int ret;

	fill_pattern(p, 2 * GPU_PAGE, 31);
	ok(tc_get(tc, p, 2 * GPU_PAGE, GPUSIM_TC_PERSISTENT, &pp) == 0, "persistent pin");
	ok(tc_get(tc, p, GPU_PAGE, 0, &np) == 0, "and a non-persistent one on the same memory");
	ok(dbg_get("live_persistent_pins") == 1, "live_persistent_pins is 1");
	munmap(p, 2 * GPU_PAGE);
	gs_free(fd, h);
	ok(status(tc, np.id, &s) == 0 && s.callbacks == 1, "free: the non-persistent pin got its callback");
	ok(status(tc, pp.id, &s) == 0 && s.callbacks == 0 && s.pinned,
	   "the persistent pin got none and is still pinned");
	ok(dbg_get("live_allocs") == 0 && dbg_get("live_mem_bytes") == 2 * GPU_PAGE,
	   "allocation gone, memory kept for the persistent pin");
	ok(tc_read(tc, pp.id, 0, buf, 2 * GPU_PAGE) == 0 && check_pattern(buf, 2 * GPU_PAGE, 31),
	   "the data is still there, through the page table");
	ret = tc_id(tc, GPUSIM_TC_PUT, pp.id, 0, &s);
	ok(ret == 0 && !s.pinned, "put_pages_persistent (%d)", ret);
	ok(dbg_get("live_mem_bytes") == 0, "memory returned at the last put");
	stale0 = dbg_get("stale_calls");
	ret = tc_id(tc, GPUSIM_TC_PUT, pp.id, 0, &s);
	ok(ret == 0 && dbg_get("stale_calls") == stale0 + 1,
	   "double put_pages_persistent: 0 (stale_errno=0), counted in stale_calls (%d)", ret);
	tc_id(tc, GPUSIM_TC_FORGET, pp.id, 0, &s);
	tc_id(tc, GPUSIM_TC_FORGET, np.id, 0, &s);
	free(buf);
}

static void test_mapping_changes(int fd, int tc)
{
	struct gpusim_tc_req a, s;
	char *buf = malloc(2 * GPU_PAGE);
	void *hole, *q;
	uint64_t h;
	char *p = gs_alloc(fd, 2 * GPU_PAGE, &h);

	fill_pattern(p, 2 * GPU_PAGE, 8);
	tc_get(tc, p, 2 * GPU_PAGE, 0, &a);
	hole = mmap(NULL, 4 * GPU_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	q = (void *)(((uintptr_t)hole + GPU_PAGE - 1) & ~(GPU_PAGE - 1));
	ok(mremap(p, 2 * GPU_PAGE, 2 * GPU_PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, q) == q,
	   "mremap a pinned allocation");
	ok(status(tc, a.id, &s) == 0 && s.pinned && s.callbacks == 0, "the pin survives, no callback");
	ok(tc_read(tc, a.id, 0, buf, 2 * GPU_PAGE) == 0 && check_pattern(buf, 2 * GPU_PAGE, 8),
	   "and still reaches the same memory");
	ok(tc_get(tc, p, GPU_PAGE, 0, &s) == -EINVAL, "get_pages at the old address: -EINVAL");
	ok(tc_get(tc, q, GPU_PAGE, 0, &s) == 0, "get_pages at the new address works");
	tc_id(tc, GPUSIM_TC_FORGET, s.id, 0, &s);
	munmap(q, 2 * GPU_PAGE);
	ok(status(tc, a.id, &s) == 0 && s.pinned && s.callbacks == 0, "munmap: the pin survives, no callback");
	ok(tc_get(tc, q, GPU_PAGE, 0, &s) == -EINVAL, "get_pages on the unmapped address: -EINVAL");
	gs_free(fd, h);
	ok(status(tc, a.id, &s) == 0 && s.callbacks == 1, "the free after munmap calls the callback");
	ok(dbg_get("live_mem_bytes") == 0, "and the memory is gone");
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	munmap(hole, 4 * GPU_PAGE);
	free(buf);
}

static void test_many(int fd, int tc)
{
	enum { N = 16 };
	struct gpusim_tc_req q[N], s;
	long long fired = dbg_get("free_callbacks");
	int i, once = 1;
	uint64_t h;
	char *p = gs_alloc(fd, N * GPU_PAGE, &h);

	for (i = 0; i < N; i++)
		tc_get(tc, p + (i % 8) * GPU_PAGE, (1 + i % 3) * GPU_PAGE, 0, &q[i]);
	gs_free(fd, h);
	for (i = 0; i < N; i++)
		if (status(tc, q[i].id, &s) || s.callbacks != 1)
			once = 0;
	ok(once, "16 pins on one allocation: each callback ran exactly once");
	ok(dbg_get("free_callbacks") - fired == N, "free_callbacks went up by exactly 16");
	for (i = 0; i < N; i++)
		tc_id(tc, GPUSIM_TC_FORGET, q[i].id, 0, &s);
	munmap(p, N * GPU_PAGE);
}

struct race {
	int fd, tc;
	uint64_t h;
	uint32_t id;
	int put_ret, free_ret;
	pthread_barrier_t bar;
};

static void *race_put(void *arg)
{
	struct race *r = arg;
	struct gpusim_tc_req q;

	pthread_barrier_wait(&r->bar);
	memset(&q, 0, sizeof(q));
	q.id = r->id;
	tc_cmd(r->tc, GPUSIM_TC_PUT, &q);
	r->put_ret = q.ret;
	return NULL;
}

/* Put racing free, with stale_errno @stale: exactly one of the two wins. */
static void test_race(int fd, int tc, int stale)
{
	int i, bad = 0, puts = 0, cbs = 0;

	dbg_set("stale_errno", stale);
	dbg_set("delay_us", 2000);	/* widen the window between the two */
	for (i = 0; i < 20; i++) {
		struct race r = { .fd = fd, .tc = tc };
		struct gpusim_tc_req q, s;
		pthread_t t;
		char *p = gs_alloc(fd, GPU_PAGE, &r.h);
		long long stale0 = dbg_get("stale_calls");

		tc_get(tc, p, GPU_PAGE, 0, &q);
		r.id = q.id;
		pthread_barrier_init(&r.bar, NULL, 2);
		pthread_create(&t, NULL, race_put, &r);
		pthread_barrier_wait(&r.bar);
		if (i & 1)
			usleep(1000);
		r.free_ret = gs_free(fd, r.h);
		pthread_join(t, NULL);
		pthread_barrier_destroy(&r.bar);
		status(tc, q.id, &s);
		/* The put lost iff it was answered as stale (counted). */
		if (r.put_ret == 0 && s.callbacks == 0 && dbg_get("stale_calls") == stale0)
			puts++;
		else if (r.put_ret == -stale && s.callbacks == 1 &&
			 dbg_get("stale_calls") == stale0 + 1)
			cbs++;
		else
			bad++;
		tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
		munmap(p, GPU_PAGE);
	}
	dbg_set("delay_us", 0);
	dbg_set("stale_errno", 0);
	ok(bad == 0,
	   "put racing free, 20 rounds, stale_errno=%d: %d put first, %d callback first, %d inconsistent",
	   stale, puts, cbs, bad);
}

int main(void)
{
	int fd, tc;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	/* stale_errno 0 (the 550 driver's answer, default) and 22 (refusing),
	 * each with and without the RM lock. */
	test_free_while_pinned(fd, tc, 0, 1);
	test_free_while_pinned(fd, tc, 22, 1);
	test_free_while_pinned(fd, tc, 0, 0);
	test_free_while_pinned(fd, tc, 22, 0);
	test_callback_waited_for(fd, tc);
	test_dma_in_callback(fd, tc);
	test_close_and_exit(tc);
	test_persistent(fd, tc);
	test_mapping_changes(fd, tc);
	test_many(fd, tc);
	test_race(fd, tc, 0);
	test_race(fd, tc, 22);
	close(tc);
	close(fd);
	return gs_finish();
}
