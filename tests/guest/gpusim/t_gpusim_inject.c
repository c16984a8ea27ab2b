// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_inject - the debugfs knobs: fail the N-th call of an entry
 * point (with fail_errno), per-call latency, call counters, and that bad
 * knob values are refused.
 */
#include "gpusim_test.h"

static void test_fail_get(int tc, char *p)
{
	struct gpusim_tc_req a, b, c, s;
	long long calls = dbg_get("calls/get_pages");
	int r1, r2, r3;

	ok(dbg_set("fail/get_pages", 2) == 0, "arm fail/get_pages = 2");
	r1 = tc_get(tc, p, GPU_PAGE, 0, &a);
	r2 = tc_get(tc, p, GPU_PAGE, 0, &b);
	r3 = tc_get(tc, p, GPU_PAGE, 0, &c);
	ok(r1 == 0 && r2 == -ENOMEM && r3 == 0,
	   "calls 1, 2, 3: %d, %d, %d (only the 2nd fails, with fail_errno ENOMEM)", r1, r2, r3);
	ok(dbg_get("fail/get_pages") == 0, "the knob disarmed itself");
	ok(dbg_get("injected_failures") == 1, "injected_failures is 1");
	ok(dbg_get("calls/get_pages") - calls == 3, "calls/get_pages counted 3 calls");
	ok(dbg_get("live_pins") == 2, "the failed call pinned nothing");
	if (!r1)
		tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	if (!r3)
		tc_id(tc, GPUSIM_TC_FORGET, c.id, 0, &s);

	dbg_set("fail_errno", EIO);
	dbg_set("fail/get_pages_persistent", 1);
	r1 = tc_get(tc, p, GPU_PAGE, GPUSIM_TC_PERSISTENT, &a);
	ok(r1 == -EIO, "fail/get_pages_persistent with fail_errno=EIO: %d", r1);
	dbg_set("fail_errno", ENOMEM);
}

static void test_fail_put(int tc, char *p)
{
	struct gpusim_tc_req a, s;
	int ret;

	tc_get(tc, p, GPU_PAGE, 0, &a);
	dbg_set("fail/put_pages", 1);
	ret = tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	ok(ret == -ENOMEM && s.pinned && dbg_get("live_pins") == 1,
	   "injected put_pages failure: %d, pages stay pinned", ret);
	ret = tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	ok(ret == 0 && dbg_get("live_pins") == 0, "the next put_pages works");
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);

	tc_get(tc, p, GPU_PAGE, GPUSIM_TC_PERSISTENT, &a);
	dbg_set("fail/put_pages_persistent", 1);
	ret = tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	ok(ret == -ENOMEM && dbg_get("live_persistent_pins") == 1,
	   "injected put_pages_persistent failure: %d", ret);
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	ok(dbg_get("live_persistent_pins") == 0, "forgetting it puts it");
}

static void test_fail_dma(int tc, char *p)
{
	struct gpusim_tc_req a, s;
	int ret;

	tc_get(tc, p, GPU_PAGE, 0, &a);
	dbg_set("fail/dma_map_pages", 1);
	memset(&s, 0, sizeof(s));
	s.id = a.id;
	ret = tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s);
	if (ret == -ENODEV) {
		skip("fail/dma_map_pages: no PCI device in the guest");
		dbg_set("fail/dma_map_pages", 0);
	} else {
		ok(s.ret == -ENOMEM && dbg_get("live_dma_mappings") == 0,
		   "injected dma_map_pages failure: %d", s.ret);
		memset(&s, 0, sizeof(s));
		s.id = a.id;
		tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s);
		dbg_set("fail/dma_unmap_pages", 1);
		ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, a.id, 0, &s);
		ok(ret == -ENOMEM && dbg_get("live_dma_mappings") == 1,
		   "injected dma_unmap_pages failure: %d, mapping kept", ret);
		ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, a.id, 0, &s);
		ok(ret == 0 && dbg_get("live_dma_mappings") == 0, "the next unmap works");
	}
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
}

static void test_fail_alloc(int fd)
{
	struct gpusim_alloc a;
	int r1, r2;

	dbg_set("fail/alloc", 1);
	r1 = gs_alloc_at(fd, GPU_PAGE, 0, &a);
	r2 = gs_alloc_at(fd, GPU_PAGE, 0, &a);
	ok(r1 == -ENOMEM && r2 == 0, "fail/alloc: the ioctl fails once (%d), then works (%d)", r1, r2);
	if (!r2) {
		munmap((void *)(uintptr_t)a.addr, GPU_PAGE);
		gs_free(fd, a.handle);
	}
}

static void test_delay(int tc, char *p)
{
	struct gpusim_tc_req a, s;
	double t0, ms;

	dbg_set("delay_us", 100000);
	t0 = now_ms();
	tc_get(tc, p, GPU_PAGE, 0, &a);
	ms = now_ms() - t0;
	dbg_set("delay_us", 0);
	ok(ms >= 95, "delay_us=100000: get_pages took %.0f ms", ms);
	t0 = now_ms();
	tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	ms = now_ms() - t0;
	ok(ms < 95, "delay_us=0: put_pages took %.0f ms", ms);
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
}

/*
 * The pin-cost model (docs/gpusim.md, "Pin cost"): off by default; each
 * successful pin of either kind takes pin_call_us plus pin_page_ns per
 * 64 KiB page; a put costs nothing; out-of-range values are refused.
 */
static double timed_pin(int tc, char *p, uint64_t len, uint32_t flags)
{
	struct gpusim_tc_req a, s;
	double t0 = now_ms(), ms;

	tc_get(tc, p, len, flags, &a);
	ms = now_ms() - t0;
	tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	return ms;
}

static void test_pin_cost(int tc, char *p)
{
	struct gpusim_tc_req a, s;
	double ms;

	ok(dbg_get("pin_call_us") == 0 && dbg_get("pin_page_ns") == 0,
	   "pin cost off by default (pin_call_us %lld, pin_page_ns %lld)",
	   dbg_get("pin_call_us"), dbg_get("pin_page_ns"));
	ok(dbg_set("pin_call_us", 100000) == 0, "pin_call_us=100000 accepted");
	ms = timed_pin(tc, p, GPU_PAGE, 0);
	ok(ms >= 95, "pin_call_us=100000: nvidia_p2p_get_pages took %.0f ms", ms);
	ms = timed_pin(tc, p, GPU_PAGE, GPUSIM_TC_PERSISTENT);
	ok(ms >= 95, "pin_call_us=100000: nvidia_p2p_get_pages_persistent took %.0f ms", ms);
	/* A put is not charged. */
	tc_get(tc, p, GPU_PAGE, 0, &a);
	{
		double t0 = now_ms();

		tc_id(tc, GPUSIM_TC_PUT, a.id, 0, &s);
		ms = now_ms() - t0;
	}
	tc_id(tc, GPUSIM_TC_FORGET, a.id, 0, &s);
	ok(ms < 95, "pin_call_us=100000: put_pages took %.0f ms (not charged)", ms);
	/* Per page: 4 pages at 30 ms each, no per-call cost. */
	dbg_set("pin_call_us", 0);
	ok(dbg_set("pin_page_ns", 30000000) == -EINVAL, "pin_page_ns=30000000 refused (at most 1000000)");
	ok(dbg_set("pin_page_ns", 1000000) == 0, "pin_page_ns=1000000 accepted");
	ms = timed_pin(tc, p, 4 * GPU_PAGE, 0);
	ok(ms >= 3.8, "pin_page_ns=1000000: a 4-page pin took %.1f ms (4 ms charged)", ms);
	ok(dbg_set("pin_call_us", 1000001) == -EINVAL, "pin_call_us=1000001 refused (at most 1000000)");
	dbg_set("pin_page_ns", 0);
	ms = timed_pin(tc, p, GPU_PAGE, 0);
	ok(ms < 95 && dbg_get("pin_call_us") == 0, "back to 0: a pin took %.1f ms", ms);
}

static void test_bad_knobs(void)
{
	int fd;

	ok(dbg_set("fail_errno", 5000) == -EINVAL, "fail_errno=5000 refused");
	ok(dbg_set("stale_errno", 4096) == -EINVAL, "stale_errno=4096 refused");
	ok(dbg_set("rm_lock", 2) == -EINVAL, "rm_lock=2 refused (0 or 1)");
	ok(dbg_set("fail/get_pages", -1) == -EINVAL, "fail/get_pages=-1 refused");
	fd = open(DBG "delay_us", O_WRONLY);
	ok(fd >= 0 && write(fd, "abc", 3) < 0 && errno == EINVAL, "delay_us=abc refused");
	if (fd >= 0)
		close(fd);
	fd = open(DBG "live_pins", O_WRONLY);
	ok(fd < 0 || write(fd, "5", 1) < 0, "counters cannot be written");
	if (fd >= 0)
		close(fd);
}

int main(void)
{
	int fd, tc;
	uint64_t h;
	char *p;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	p = gs_alloc(fd, 4 * GPU_PAGE, &h);

	test_fail_get(tc, p);
	test_fail_put(tc, p);
	test_fail_dma(tc, p);
	test_fail_alloc(fd);
	test_delay(tc, p);
	test_pin_cost(tc, p);
	test_bad_knobs();

	close(tc);
	munmap(p, 4 * GPU_PAGE);
	gs_free(fd, h);
	close(fd);
	return gs_finish();
}
