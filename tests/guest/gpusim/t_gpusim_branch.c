// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_branch - gpusim's module parameter branch= (550, 570, 580, 595):
 * for each branch, reloaded with branch=N, the page table's version and
 * allocation size (a version-1.2 table has no room for flags), CPU_CACHEABLE
 * following the cpu_cacheable knob (580/595 only), 64 KiB alignment,
 * get_pages_persistent's flags (550: only 0; 570+: a u8 of which only
 * FORCE_BAR1 counts, -ENOTSUPP on a discrete GPU, and on a coherent one a
 * pin that dma_map_pages refuses), put_pages_persistent's flags (-EINVAL in
 * every branch), the rsync calls; then invalid values refused and the
 * default (595). docs/gpusim.md, "Driver branches", has the NVIDIA source of
 * each. Skipped when another module (peermem) uses gpusim.
 */
#include "gpusim_test.h"

/* The kernel-internal ENOTSUPP (not EOPNOTSUPP, 95) the driver returns. */
#define ENOTSUPP_K 524
#define PT_V1 0x00010002u
#define PT_V2 0x00020000u

static void unload_all(void)
{
	if (module_loaded("gpusim_testclient") &&
	    syscall(SYS_delete_module, "gpusim_testclient", O_NONBLOCK))
		bail("rmmod gpusim_testclient: %s", strerror(errno));
	if (module_loaded("gpusim") && syscall(SYS_delete_module, "gpusim", O_NONBLOCK))
		bail("rmmod gpusim: %s", strerror(errno));
}

/* Reload gpusim with $GPUSIM_ARGS plus @extra (which wins: the last value
 * of a parameter counts); returns the load's -errno or 0. */
static int reload(const char *extra)
{
	char args[512];

	unload_all();
	snprintf(args, sizeof(args), "%s %s", gpusim_args(), extra);
	return load_module_args("tests/gpusim/gpusim.ko", args);
}

/* Pin through the test client with persistent flags @pflags. */
static int get_p(int tc, const void *va, uint64_t len, uint32_t pflags, struct gpusim_tc_req *q)
{
	memset(q, 0, sizeof(*q));
	q->va = (uintptr_t)va;
	q->len = len;
	q->flags = GPUSIM_TC_PERSISTENT | GPUSIM_TC_PFLAGS;
	q->p_flags = pflags;
	if (tc_cmd(tc, GPUSIM_TC_GET, q))
		bail("GPUSIM_TC_GET ioctl: %s", strerror(errno));
	return q->ret;
}

static int put_p(int tc, uint32_t id, uint32_t pflags, struct gpusim_tc_req *q)
{
	memset(q, 0, sizeof(*q));
	q->id = id;
	q->flags = GPUSIM_TC_PFLAGS;
	q->p_flags = pflags;
	if (tc_cmd(tc, GPUSIM_TC_PUT, q))
		bail("GPUSIM_TC_PUT ioctl: %s", strerror(errno));
	return q->ret;
}

static void forget(int tc, uint32_t id)
{
	struct gpusim_tc_req q;

	if (id)
		tc_id(tc, GPUSIM_TC_FORGET, id, GPUSIM_TC_UNMAP, &q);
}

/* The version, size and flags of a page table handed out on branch @b. */
static void check_table(int b, const struct gpusim_tc_req *q, unsigned int flags,
			const char *what)
{
	int v2 = b >= 580;

	ok(q->pt_version == (v2 ? PT_V2 : PT_V1) && q->version_ok,
	   "%d: %s: page table version %#x", b, what, q->pt_version);
	if (v2)
		ok(q->pt_bytes >= 40, "%d: %s: the table's allocation holds flags (%u bytes)",
		   b, what, q->pt_bytes);
	else
		ok(q->pt_bytes == 32,
		   "%d: %s: the table's allocation is 32 bytes, no room for flags (%u)",
		   b, what, q->pt_bytes);
	ok(q->pt_flags == flags, "%d: %s: flags %#x (want %#x)", b, what, q->pt_flags, flags);
}

static void test_branch(int b)
{
	struct gpusim_tc_req q, s;
	char extra[32];
	int fd, tc, ret, v2 = b >= 580;
	uint64_t h;
	char *p;

	snprintf(extra, sizeof(extra), "branch=%d", b);
	ret = reload(extra);
	ok(ret == 0, "load gpusim %s (%s)", extra, strerror(-ret));
	if (ret)
		return;
	ok(gs_branch() == b, "/sys/module/gpusim/parameters/branch reads %d", gs_branch());
	ret = load_module("tests/gpusim/testclient/gpusim_testclient.ko");
	if (ret)
		bail("load gpusim_testclient: %s", strerror(-ret));
	gs_reset_knobs();
	fd = gs_open();
	tc = tc_open();
	p = gs_alloc(fd, 4 * GPU_PAGE, &h);

	/* Discrete GPU (cpu_cacheable 0): no CPU_CACHEABLE. */
	ret = tc_get(tc, p, 2 * GPU_PAGE, 0, &q);
	ok(ret == 0, "%d: get_pages (%d)", b, ret);
	if (!ret)
		check_table(b, &q, 0, "get_pages, discrete GPU");
	forget(tc, q.id);
	ret = get_p(tc, p, 2 * GPU_PAGE, 0, &q);
	ok(ret == 0, "%d: get_pages_persistent (%d)", b, ret);
	if (!ret)
		check_table(b, &q, 0, "get_pages_persistent, discrete GPU");
	forget(tc, q.id);

	/* Coherent GPU: CPU_CACHEABLE on 580/595 tables; 550/570 have none. */
	dbg_set("cpu_cacheable", 1);
	ok(dbg_get("cpu_cacheable") == 1, "%d: knob cpu_cacheable set to 1", b);
	ret = tc_get(tc, p, GPU_PAGE, 0, &q);
	ok(ret == 0, "%d: get_pages on a coherent GPU (%d)", b, ret);
	if (!ret)
		check_table(b, &q, v2 ? 1 : 0, "get_pages, coherent GPU");
	forget(tc, q.id);
	ret = get_p(tc, p, GPU_PAGE, 0, &q);
	ok(ret == 0, "%d: get_pages_persistent on a coherent GPU (%d)", b, ret);
	if (!ret)
		check_table(b, &q, v2 ? 1 : 0, "get_pages_persistent, coherent GPU");
	forget(tc, q.id);
	dbg_set("cpu_cacheable", 0);

	/* 64 KiB alignment: the drivers from 555 on refuse it; gpusim refuses
	 * it on 550 too (stricter than that driver, docs/gpusim.md). */
	ok(tc_get(tc, p + 4096, GPU_PAGE, 0, &q) == -EINVAL, "%d: get_pages, misaligned address: -EINVAL", b);
	ok(tc_get(tc, p, GPU_PAGE + 4096, 0, &q) == -EINVAL, "%d: get_pages, misaligned length: -EINVAL", b);
	ok(get_p(tc, p + 4096, GPU_PAGE, 0, &q) == -EINVAL,
	   "%d: get_pages_persistent, misaligned address: -EINVAL", b);
	ok(get_p(tc, p, 4096, 0, &q) == -EINVAL,
	   "%d: get_pages_persistent, misaligned length: -EINVAL", b);

	/* get_pages_persistent's flags. */
	if (b == 550) {
		static const uint32_t bad[] = { 1, 2, 0x80, 0x100, 0x80000000u };
		unsigned int i;

		for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			ret = get_p(tc, p, GPU_PAGE, bad[i], &q);
			ok(ret == -EINVAL, "550: get_pages_persistent flags %#x: -EINVAL (%d)", bad[i], ret);
			forget(tc, q.id);
		}
	} else {
		static const uint32_t ignored[] = { 2, 0x80, 0x100, 0xfffffe00u };
		unsigned int i;

		for (i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
			ret = get_p(tc, p, GPU_PAGE, ignored[i], &q);
			ok(ret == 0, "%d: get_pages_persistent flags %#x: unknown bits ignored, pinned (%d)",
			   b, ignored[i], ret);
			forget(tc, q.id);
		}
		ret = get_p(tc, p, GPU_PAGE, 1, &q);
		ok(ret == -ENOTSUPP_K, "%d: FORCE_BAR1 on a discrete GPU: -ENOTSUPP (524) (%d)", b, ret);
		forget(tc, q.id);
		ret = get_p(tc, p, GPU_PAGE, 0x101, &q);
		ok(ret == -ENOTSUPP_K, "%d: flags 0x101 is FORCE_BAR1 after the u8 truncation: -ENOTSUPP (%d)",
		   b, ret);
		forget(tc, q.id);
		ret = get_p(tc, p + 4096, GPU_PAGE, 1, &q);
		ok(ret == -EINVAL, "%d: FORCE_BAR1 with a misaligned address: -EINVAL first (%d)", b, ret);
		ok(dbg_get("live_pins") == 0, "%d: nothing pinned by the refused calls", b);

		dbg_set("cpu_cacheable", 1);
		ret = get_p(tc, p, 2 * GPU_PAGE, 1, &q);
		ok(ret == 0, "%d: FORCE_BAR1 on a coherent GPU: pinned (%d)", b, ret);
		if (!ret) {
			check_table(b, &q, 0, "FORCE_BAR1 pin (BAR1: not CPU-cacheable)");
			memset(&s, 0, sizeof(s));
			s.id = q.id;
			if (tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s) == -ENODEV) {
				skip("%d: dma_map_pages of a FORCE_BAR1 pin: no DMA peer in this VM", b);
			} else {
				ok(s.ret == -ENOTSUPP_K,
				   "%d: dma_map_pages of a FORCE_BAR1 pin: -ENOTSUPP (%d)", b, s.ret);
				ok(dbg_get("live_dma_mappings") == 0, "%d: and nothing mapped", b);
			}
			ret = put_p(tc, q.id, 1, &s);
			ok(ret == -EINVAL && s.pinned,
			   "%d: put_pages_persistent of the FORCE_BAR1 pin with flags 1: -EINVAL, still pinned (%d)",
			   b, ret);
			ret = put_p(tc, q.id, 0, &s);
			ok(ret == 0 && !s.pinned, "%d: and with flags 0 it is released (%d)", b, ret);
		}
		forget(tc, q.id);
		dbg_set("cpu_cacheable", 0);
	}

	/* put_pages_persistent: flags other than 0 are -EINVAL, every branch. */
	ret = get_p(tc, p, GPU_PAGE, 0, &q);
	if (ret == 0) {
		ret = put_p(tc, q.id, 1, &s);
		ok(ret == -EINVAL && s.pinned, "%d: put_pages_persistent flags 1: -EINVAL, still pinned (%d)",
		   b, ret);
		ret = put_p(tc, q.id, 0x100, &s);
		ok(ret == -EINVAL && s.pinned,
		   "%d: put_pages_persistent flags 0x100: -EINVAL (all 32 bits count) (%d)", b, ret);
		memset(&s, 0, sizeof(s));
		s.id = q.id;
		if (tc_cmd(tc, GPUSIM_TC_DMA_MAP, &s) != -ENODEV)
			ok(s.ret == 0, "%d: an ordinary persistent pin maps for DMA (%d)", b, s.ret);
		ret = put_p(tc, q.id, 0, &s);
		ok(ret == 0 && !s.pinned, "%d: put_pages_persistent flags 0 (%d)", b, ret);
	} else {
		ok(0, "%d: get_pages_persistent for the put checks (%d)", b, ret);
	}
	forget(tc, q.id);

	/* rsync: no IBM NPU, -ENODEV; NULL is -EINVAL first only up to 570. */
	memset(&q, 0, sizeof(q));
	ret = tc_cmd(tc, GPUSIM_TC_RSYNC, &q);
	ok(ret == 0 && q.ret == -ENODEV, "%d: get_rsync_registers: -ENODEV (%d)", b, q.ret);
	ok(q.ret2 == (b <= 570 ? -EINVAL : -ENODEV), "%d: get_rsync_registers(NULL): %s (%d)", b,
	   b <= 570 ? "-EINVAL" : "-ENODEV, unconditionally", q.ret2);
	ok(q.ret3 == 0, "%d: register_rsync_driver of a valid driver: 0, never -ENODEV (%d)", b, q.ret3);

	close(tc);
	munmap(p, 4 * GPU_PAGE);
	gs_free(fd, h);
	close(fd);
	gs_check_zero(extra);
}

int main(void)
{
	static const int branches[] = { 550, 570, 580, 595 };
	static const char *const invalid[] = { "branch=560", "branch=0", "branch=575",
					       "branch=5950", "branch=abc", "branch=-1" };
	unsigned int i;
	int ret;

	gs_setup();
	if (other_holders()) {
		skip("reload gpusim with each branch: another module uses it");
		return finish();
	}
	for (i = 0; i < sizeof(branches) / sizeof(branches[0]); i++)
		test_branch(branches[i]);

	for (i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
		ret = reload(invalid[i]);
		ok(ret == -EINVAL && !module_loaded("gpusim"), "gpusim %s is refused: -EINVAL (%s)",
		   invalid[i], strerror(-ret));
	}
	unload_all();
	ret = load_module_args("tests/gpusim/gpusim.ko", "");
	ok(ret == 0 && gs_branch() == 595, "gpusim without arguments emulates branch 595 (%s)",
	   strerror(-ret));

	/* Leave gpusim as the other tests expect it: $GPUSIM_ARGS. */
	unload_all();
	gs_setup();
	return gs_finish();
}
