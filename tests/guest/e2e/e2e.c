// SPDX-License-Identifier: GPL-2.0
/*
 * e2e.c - end-to-end: ibv_reg_mr() on (emulated) GPU memory through a
 * peer-memory client, RDMA over rxe, and what happens when the GPU memory
 * goes away under a live MR. The same checks for every client in the
 * adapter table (common.c); t_e2e_<client> runs them for one client.
 *
 * The test loads gpusim and the client, brings up rxe0 on a veth pair,
 * connects two RC QPs on it (loopback) and checks, each as one TAP line:
 *  - host memory MRs take the normal pinning path (the client is never
 *    asked: core counters and gpusim's get_pages calls unchanged);
 *  - a GPU MR registers (core counters, the client's own, gpusim's pins);
 *  - RDMA WRITE into it and READ from it, and with it as the local SGE,
 *    move the right bytes, seen through gpusim's CPU mapping;
 *  - an unaligned sub-range MR of the same memory works at both ends;
 *  - ibv_dereg_mr balances every counter;
 *  - GPUSIM_IOC_FREE with MRs live invalidates them: the next RDMA WRITE,
 *    READ and local use complete in error, the memory is not touched, and
 *    ibv_dereg_mr still succeeds; for a persistent client (no invalidation,
 *    e2e.h) it invalidates nothing instead: the pins keep the memory, RDMA
 *    through the MRs keeps reaching it, and ibv_dereg_mr releases it;
 *  - a process that exits holding a GPU MR (either teardown order) leaves
 *    nothing behind;
 *  - at the end gpusim is idle, the core's alloc/dealloc counts match,
 *    no call reached gpusim on a stale page table, and both modules unload.
 */
#include <limits.h>
#include <sys/ioctl.h>

#include "../core/core_test.h"
#include "e2e.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
	     IBV_ACCESS_REMOTE_READ)
#define GPU_LEN (256 * 1024UL)		/* 4 GPU pages */
#define HOST_LEN (1024 * 1024UL)
#define SUB_OFF 70000UL			/* an unaligned sub-range of it */
#define SUB_LEN 100000UL

/*
 * Poll @cond until it holds or @secs pass (teardown can be asynchronous);
 * @secs on a machine as fast as the reference, scaled by the guest's
 * measured slowdown.
 */
#define WAIT_UNTIL(cond, secs) ({					\
	double end_ = now_s() + slow_s(secs);				\
	int ok_;							\
	while (!(ok_ = !!(cond)) && now_s() < end_)			\
		usleep(50000);						\
	ok_;								\
})

static const struct e2e_client *C;
static const char *root;

/* ---- gpusim's counters */

struct gs {
	long long allocs, pins, ppins, vmas, dmas, mem, stale, get_pages, gpp, fcb;
};

static void gs_read(struct gs *g)
{
	g->allocs = read_ll(GSDBG "live_allocs");
	g->pins = read_ll(GSDBG "live_pins");
	g->ppins = read_ll(GSDBG "live_persistent_pins");
	g->vmas = read_ll(GSDBG "live_vmas");
	g->dmas = read_ll(GSDBG "live_dma_mappings");
	g->mem = read_ll(GSDBG "live_mem_bytes");
	g->stale = read_ll(GSDBG "stale_calls");
	g->get_pages = read_ll(GSDBG "calls/get_pages");
	g->gpp = read_ll(GSDBG "calls/get_pages_persistent");
	g->fcb = read_ll(GSDBG "free_callbacks");
}

static int gs_idle(void)
{
	struct gs g;

	gs_read(&g);
	return !g.allocs && !g.pins && !g.vmas && !g.dmas && !g.mem;
}

static void gs_diag(void)
{
	struct gs g;

	gs_read(&g);
	diag("gpusim: live_allocs %lld live_pins %lld live_vmas %lld live_dma_mappings %lld live_mem_bytes %lld stale_calls %lld",
	     g.allocs, g.pins, g.vmas, g.dmas, g.mem, g.stale);
}

/* ---- the client's own counters (the adapter's e2e_live table) */

/* @name: absolute, or a file of the client's debugfs directory. */
static long long live_file(const char *name)
{
	if (name[0] == '/')
		return read_ll("%s", name);
	return C->dbg ? read_ll("%s/%s", C->dbg, name) : -1;
}

static const char *live_path(const char *name)
{
	static char p[2][400];
	static int i;

	i ^= 1;
	snprintf(p[i], sizeof(p[i]), "%s%s%s",
		 name[0] == '/' ? "" : C->dbg ? C->dbg : "(no debugfs directory)",
		 name[0] == '/' ? "" : "/", name);
	return p[i];
}

static long long live_val(const struct e2e_live *l)
{
	long long a = live_file(l->a), b = 0;

	if (l->b)
		b = live_file(l->b);
	return a < 0 || b < 0 ? LLONG_MIN : a - b;
}

/* The client says @mrs MRs over @pages GPU pages are live (@why: diag). */
/*
 * Before a "nothing held" check: peermem's watch-pin cache keeps the pin
 * with the free callback of a deregistered range for its next
 * registration (docs/module.md); dropped here (a client without the
 * file: nothing).
 */
static void client_flush(void)
{
	char flush[256];

	if (!C->dbg)
		return;
	snprintf(flush, sizeof(flush), "%s/watch_cache_flush", C->dbg);
	if (access(flush, W_OK) == 0)
		write_str(flush, "1");
}

static int client_live_is(long long mrs, long long pages, int why)
{
	const struct e2e_live *l;
	int good = 1;

	if (mrs == 0)
		client_flush();

	for (l = C->live; l && l->a; l++) {
		long long want = mrs * l->per_mr + pages * l->per_gpu_page;
		long long got = live_val(l);

		if (got == want)
			continue;
		good = 0;
		if (!why)
			continue;
		if (got == LLONG_MIN)
			diag("%s: cannot read %s%s%s", C->label, live_path(l->a),
			     l->b ? " or " : "", l->b ? live_path(l->b) : "");
		else
			diag("%s: %s%s%s is %lld, expected %lld", C->label, l->a,
			     l->b ? " - " : "", l->b ? l->b : "", got, want);
	}
	return good;
}

static int cstats(struct peer_stats *s)
{
	return peer_stats(C->core_name, s);
}

/*
 * OFED's /sys/kernel/mm/memory_peers/<name>/ exists only where the kernel
 * exports mm_kobj, which no current kernel does; the rig emulates one that
 * does only with its knob ib_core.peer_mem_sysfs=1 set before the client
 * registers. Read at the start: 1 if set.
 */
static int sysfs_on;

static void sysfs_knob(void)
{
	char v[8];

	if (read_line(v, sizeof(v), "/sys/module/ib_core/parameters/peer_mem_sysfs") < 0)
		diag("no rig knob ib_core.peer_mem_sysfs: expecting no memory_peers, as OFED on a current kernel");
	sysfs_on = v[0] == 'Y' || v[0] == '1';
}

/* memory_peers says @alloc_mrs, or (knob off) has no entry for the client. */
static int sysfs_agrees(long long alloc_mrs)
{
	char d[300];

	if (sysfs_on)
		return read_ll(OFED_SYSFS "%s/num_alloc_mrs", C->core_name) == alloc_mrs;
	snprintf(d, sizeof(d), OFED_SYSFS "%s", C->core_name);
	return access(d, F_OK) != 0;
}

static const char *sysfs_what(void)
{
	return sysfs_on ? "memory_peers agrees (rig knob ib_core.peer_mem_sysfs=1)" :
			  "no memory_peers entry, as OFED on a kernel without mm_kobj";
}

/* num_reg_pages grew by @added sg entries for @gpages GPU pages. */
static int sg_added_ok(long long added, long long gpages)
{
	if (C->sg_per_gpu_page)
		return added == gpages * C->sg_per_gpu_page;
	return added >= 1 && added <= gpages;
}

static const char *sg_want(long long gpages)
{
	static char b[80];

	if (C->sg_per_gpu_page)
		snprintf(b, sizeof(b), "%lld: one per GPU page", gpages * C->sg_per_gpu_page);
	else
		snprintf(b, sizeof(b), "1 to %lld: contiguous GPU pages may share one", gpages);
	return b;
}


/*
 * Bytes the core counted twice in the process-exit tests. OFED counts an
 * invalidated mapping's bytes at its release, so an invalidation that
 * lands after the core stopped the umem's notifier (the exit's
 * deregistration under way when the GPU free's revocation comes; with
 * nv_mem's keeper the revocation runs in a work item after the free,
 * so the order happens) counts the MR's bytes twice (the rig's core
 * follows OFED: tests/rig/patches, peer_count_state()). Allowed here only
 * as whole exit MRs, at most one per exit test, and said.
 */
static long long exit_double_bytes;

static int released_but_double(long long *extra)
{
	struct peer_stats s;
	long long d;

	if (cstats(&s) || s.alloc_mrs != s.dealloc_mrs || s.dereg_pages != 0 || !gs_idle() ||
	    !client_live_is(0, 0, 0))
		return 0;
	d = s.dereg_bytes - s.reg_bytes;
	if (d < 0 || d % (long long)GPU_LEN || d > 2 * (long long)GPU_LEN)
		return 0;
	*extra = d;
	return 1;
}

/* Everything is released: core balanced, client and gpusim hold nothing. */
static int all_released(void)
{
	long long extra;

	return released_but_double(&extra) && extra == 0;
}

static void state_diag(void)
{
	peer_stats_diag(C->core_name);
	client_live_is(0, 0, 1);
	gs_diag();
}

static void klog_diag(void)
{
	char pat[100];
	size_t i;

	/* nvidia_peermem logs as nvidia-peermem: match either spelling. */
	for (i = 0; C->module[i] && i < sizeof(pat) - 5; i++)
		pat[i] = C->module[i] == '_' ? '.' : C->module[i];
	pat[i] = 0;
	run("dmesg | grep -iE '%s|gpusim|peer_mem' | tail -n 8 | sed 's/^/# dmesg: /'",
	    pat);
}

/* Lines of the kernel log matching the extended regex @re (-1: no dmesg). */
static long long dmesg_count(const char *re)
{
	char cmd[300], line[64] = "";
	FILE *f;

	snprintf(cmd, sizeof(cmd), "dmesg | grep -cE '%s'", re);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	pclose(f);
	return line[0] ? atoll(line) : -1;
}

/* ---- modules */

/*
 * gpusim's RM lock for this run: $GPUSIM_RM_LOCK (0 or 1). Unset: on, as
 * NVIDIA's driver holds RM's locks (docs/gpusim.md, "The resource
 * manager's lock"), except for the clients whose free callback is in a
 * cycle with it, each with its cause: nvidia-peermem's invalidating
 * client calls the core's invalidate (which takes the umem's mapping
 * lock, held across dma_map and so across nvidia_p2p_dma_map_pages) from
 * its free callback under RM; the reference client holds its context
 * lock across get_pages and takes it in its callback. Lockdep reports
 * those cycles, which would fail every run of theirs for a defect that
 * is theirs (docs/testing.md). peermem's clients are in no cycle
 * (docs/architecture.md, "Locking").
 */
static const char *rm_lock_default(void)
{
	if (!strcmp(C->label, "refclient")) {
		diag("gpusim rm_lock=0 for the reference client: its context lock, held across get_pages and taken in its free callback, is in a cycle with RM's lock");
		return "0";
	}
	if (!strncmp(C->label, "nvpeermem", 9) && !C->persistent) {
		diag("gpusim rm_lock=0 for nvidia-peermem's invalidating client: its free callback calls the core's invalidate under RM's lock, a cycle with the core's umem mapping lock held across nvidia_p2p_dma_map_pages (docs/module.md, Locking)");
		return "0";
	}
	return "1";
}

static void gs_set_rm_lock(void)
{
	const char *v = getenv("GPUSIM_RM_LOCK") ?: rm_lock_default();
	FILE *f = fopen(GSDBG "rm_lock", "w");

	if (!f || fputs(v, f) < 0 || fclose(f))
		bail("cannot set gpusim's rm_lock to %s", v);
	diag("gpusim rm_lock=%s", v);
}

/* 1 if this loaded gpusim, 0 if it was loaded, -1 on failure. */
static int gpusim_load(void)
{
	char ko[600];

	if (access("/sys/module/gpusim", F_OK) == 0)
		return 0;
	if (getenv("GPUSIM_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("GPUSIM_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root);
	if (access(ko, R_OK)) {
		diag("%s is missing: build it with make -C tests/gpusim", ko);
		return -1;
	}
	/* GPUSIM_ARGS: gpusim's module arguments (e.g. rm_lock=0). */
	return run("insmod %s %s", ko, getenv("GPUSIM_ARGS") ?: "") ? -1 : 1;
}

static const char *args;

/* This process's cached watch pins given back before peermem is unloaded (its unload waits for them). */
static void flush_own_pins(const char *module)
{
	FILE *f;

	if (strcmp(module, "peermem"))
		return;
	f = fopen("/sys/kernel/debug/peermem/watch_cache_flush", "w");
	if (f) {
		fputs("1", f);
		fclose(f);
	}
}

static int client_load(void)
{
	char ko[600];

	snprintf(ko, sizeof(ko), "%s/%s", root, C->ko);
	if (access(ko, R_OK)) {
		diag("%s is missing: build it first (see docs/testing.md)", ko);
		return -1;
	}
	if (access("/sys/module/", F_OK) == 0) {
		char m[300];

		snprintf(m, sizeof(m), "/sys/module/%s", C->module);
		if (access(m, F_OK) == 0) {
			diag("%s was loaded already: reloading it", C->module);
			flush_own_pins(C->module);
			run("rmmod %s", C->module);
		}
	}
	return run("insmod %s %s", ko, args);
}

static int core_has_client(void)
{
	char d[300];

	snprintf(d, sizeof(d), CORE_DBG "%s", C->core_name);
	return access(d, F_OK) == 0;
}

/* ---- steps */

/* Fresh QPs: an error completion moves a QP to the error state. */
static void requeue(struct conn *c)
{
	if (conn_qps(c))
		bail("cannot recreate the QPs on " RXE_DEV);
}

/*
 * The child of the exit test: registers GPU memory, moves data, and exits
 * with the MR registered and the memory allocated and mapped. Whether the
 * exit frees the memory first (the MR is invalidated) or closes the verbs
 * context first (the MR is deregistered) depends on the order the files are
 * released in, which the kernel does not promise: the test opens them in
 * both orders, and either way everything must be released.
 */
static int exit_child(int gpusim_first)
{
	struct ibv_mr *mr, *hm;
	struct gpu_buf g;
	struct conn c;
	uint8_t *h;
	int fd = -1, rc;

	if (gpusim_first)
		fd = open("/dev/gpusim", O_RDWR);
	if (conn_open(&c))
		return 20;
	if (!gpusim_first)
		fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0 || gpu_alloc(&g, fd, GPU_LEN))
		return 21;
	h = aligned_alloc(4096, 65536);
	if (!h)
		return 22;
	fill(h, 65536, 0xe417);
	hm = ibv_reg_mr(c.pd, h, 65536, ACC);
	mr = ibv_reg_mr(c.pd, g.p, GPU_LEN, ACC);
	if (!hm || !mr)
		return 23;
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hm, h, 65536,
		     (uintptr_t)g.p + 65536, mr->rkey);
	if (rc || memcmp(g.p + 65536, h, 65536))
		return 24;
	return 0;
}

static void exit_test(int gpusim_first)
{
	const char *how = gpusim_first ? "/dev/gpusim opened before the verbs device" :
					 "/dev/gpusim opened after the verbs device";
	struct peer_stats s0, s1;
	int st = -1, done;
	long long extra = 0;
	pid_t pid;

	cstats(&s0);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(exit_child(gpusim_first));
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "a child registers GPU memory, RDMA-writes into it and exits without cleaning up (%s; exit status %d)",
	   how, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	done = WAIT_UNTIL(!cstats(&s1) && s1.alloc_mrs == s0.alloc_mrs + 1 &&
			  released_but_double(&extra), 30);
	ok(done, "process exit released the MR, the pin and the GPU memory (%lld invalidation(s))",
	   s1.invalidated_mrs - s0.invalidated_mrs);
	if (done && extra != exit_double_bytes)
		diag("the core counted the exit MR's %lld bytes twice (OFED's count of an invalidation after the notifier's stop: the GPU free's revocation came during the exit's deregistration)",
		     extra - exit_double_bytes);
	if (done)
		exit_double_bytes = extra;
	if (!done)
		state_diag();
}

/*
 * A persistent client (e2e.h): GPUSIM_IOC_FREE with @mr (the whole
 * allocation) and @smr (a sub-range) registered. The pins are persistent,
 * so nobody is called back and nothing is invalidated; as NVIDIA's driver
 * dups the RM memory object for a persistent pin (the memory is freed at
 * the last put_pages_persistent), gpusim's pin holds a reference on the
 * allocation: the memory stays, and RDMA through the MRs keeps reaching it,
 * until ibv_dereg_mr. The CPU mapping (also a reference) is dropped on the
 * way to show that the pins alone keep it. Ends with both MRs deregistered
 * and @g unmapped.
 */
static void free_persistent(struct conn *c, struct ibv_mr *hmr, struct ibv_mr *mr,
			    struct ibv_mr *smr, struct gpu_buf *g, uint8_t *hbuf,
			    uint8_t *expect)
{
	uintptr_t va = (uintptr_t)g->p;
	struct peer_stats s0, s1;
	struct gs g0, g1;
	size_t off, n;
	int rc, done;

	cstats(&s0);
	gs_read(&g0);
	rc = gpu_free(g);
	ok(rc == 0, "GPUSIM_IOC_FREE with both MRs still registered (what cudaFree does): %s",
	   rc ? strerror(-rc) : "0");
	usleep(500000);	/* anything asynchronous would show by now */
	cstats(&s1);
	gs_read(&g1);
	ok(s1.free_callbacks == s0.free_callbacks && s1.invalidated_mrs == s0.invalidated_mrs &&
	   s1.dealloc_mrs == s0.dealloc_mrs && g1.fcb == g0.fcb,
	   "the free invalidated nothing (persistent pins have no free callback): gpusim free_callbacks +%lld, core num_free_callbacks +%lld, num_invalidated_mrs +%lld, num_dealloc_mrs +%lld",
	   g1.fcb - g0.fcb, s1.free_callbacks - s0.free_callbacks,
	   s1.invalidated_mrs - s0.invalidated_mrs, s1.dealloc_mrs - s0.dealloc_mrs);
	ok(g1.allocs == g0.allocs - 1 && g1.ppins == 2 && g1.pins == g0.pins &&
	   g1.dmas == g0.dmas && g1.mem == g0.mem && g1.mem > 0 &&
	   client_live_is(2, gpu_pages(va, GPU_LEN) + gpu_pages(va + SUB_OFF, SUB_LEN), 1),
	   "the allocation is gone (live_allocs %lld -> %lld) but both page tables stay pinned and DMA-mapped (live_persistent_pins %lld, live_dma_mappings %lld), the memory stays (live_mem_bytes %lld) and %s still holds both registrations",
	   g0.allocs, g1.allocs, g1.ppins, g1.dmas, g1.mem, C->label);
	if (g1.ppins != 2)
		state_diag();

	/* RDMA through the MRs: it still reaches the (old, pinned) memory. */
	off = 4096 + 3, n = 8192;
	memcpy(expect, g->p, GPU_LEN);
	fill(hbuf, n, 0x7e2e0017);
	memcpy(expect + off, hbuf, n);
	rc = rdma_op(c, IBV_WR_RDMA_WRITE, hmr, hbuf, n, va + off, mr->rkey);
	ok(rc == 0 && !memcmp(g->p, expect, GPU_LEN),
	   "RDMA WRITE through the MR after the free completes (%s) and lands in the freed but still pinned memory (seen through the CPU mapping, which maps the same pages)",
	   wc_str(rc));
	if (rc)
		requeue(c);
	memset(hbuf, 0x5a, 8192);
	rc = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, 8192, va + SUB_OFF, smr->rkey);
	ok(rc == 0 && !memcmp(hbuf, g->p + SUB_OFF, 8192),
	   "RDMA READ from the freed memory through the sub-range MR completes (%s) with its contents",
	   wc_str(rc));
	if (rc)
		requeue(c);
	memset(hbuf + 16384, 0, 4096);
	rc = rdma_op(c, IBV_WR_RDMA_WRITE, mr, g->p, 4096, (uintptr_t)hbuf + 16384,
		     hmr->rkey);
	ok(rc == 0 && !memcmp(hbuf + 16384, g->p, 4096),
	   "the freed GPU MR as local source still works (%s): the host gets the memory's bytes",
	   wc_str(rc));
	if (rc)
		requeue(c);

	/* Without the CPU mapping only the pins hold the memory. */
	memcpy(expect, g->p, GPU_LEN);
	gpu_unmap(g);
	gs_read(&g1);
	memset(hbuf, 0, GPU_LEN);
	rc = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, GPU_LEN, va, mr->rkey);
	ok(g1.vmas == 0 && g1.allocs == 0 && g1.ppins == 2 && g1.mem == g0.mem &&
	   rc == 0 && !memcmp(hbuf, expect, GPU_LEN),
	   "after munmap too (live_vmas %lld) the two pins alone keep the memory (live_mem_bytes %lld): an RDMA READ of all %lu bytes through the MR returns its last contents (%s)",
	   g1.vmas, g1.mem, GPU_LEN, wc_str(rc));
	if (rc)
		requeue(c);

	rc = ibv_dereg_mr(smr) | ibv_dereg_mr(mr);
	ok(rc == 0, "ibv_dereg_mr of both MRs on the freed memory succeeds");
	done = WAIT_UNTIL(all_released(), 20);
	gs_read(&g1);
	ok(done, "ibv_dereg_mr put the persistent pins and only then the memory went (live_mem_bytes %lld): core counters balanced, %s holds nothing, gpusim has no allocation, pin, mapping or memory",
	   g1.mem, C->label);
	if (!done)
		state_diag();
}

int e2e_run(const struct e2e_client *cl)
{
	e2e_check(cl);
	return finish();
}

int e2e_finish(void)
{
	return finish();
}

int e2e_check(const struct e2e_client *cl)
{
	struct ibv_mr *hmr = NULL, *mr = NULL, *smr = NULL;
	struct peer_stats s0, s1;
	struct gpu_buf gb = { .fd = -1 };
	struct gs g0, g1, gstart;
	uint8_t *hbuf, *saved, *expect;
	int gs_loaded, gfd = -1, rc, done;
	struct conn c = { 0 };
	long pin0;
	char flags[128] = "";
	size_t off, n;

	long long reclaims0;

	if (!cl)
		bail("no such client in the adapter table (common.c)");
	C = cl;
	/*
	 * E2E_ARGS: other insmod arguments, e.g. to watch a configuration
	 * fail (for every run of a program that runs several).
	 */
	args = getenv("E2E_ARGS") ? getenv("E2E_ARGS") : C->args;
	root = e2e_root();
	if (C->absent_why) {
		char ko[600];

		snprintf(ko, sizeof(ko), "%s/%s", root, C->ko);
		if (access(ko, R_OK)) {
			skip("%s", C->absent_why);
			return tap_fail;
		}
	}
	sysfs_knob();
	diag("end-to-end test with the %s client (%s%s%s, core name %s), repository %s",
	     C->label, C->ko, *args ? " " : "", args, C->core_name, root);
	hbuf = aligned_alloc(4096, HOST_LEN);
	saved = malloc(GPU_LEN);
	expect = malloc(GPU_LEN);
	if (!hbuf || !saved || !expect)
		bail("out of memory");
	memset(hbuf, 0, HOST_LEN);

	rxe_up();
	reclaims0 = dmesg_count("gpusim: unloading with");
	gs_loaded = gpusim_load();
	ok(gs_loaded >= 0, "gpusim (the emulated GPU) is loaded");
	if (gs_loaded < 0)
		return tap_fail;
	ok(gs_idle(), "gpusim starts with no allocation, pin or mapping");
	gs_set_rm_lock();
	gs_read(&gstart);

	rc = client_load();
	ok(rc == 0, "insmod %s%s%s", C->ko, *args ? " " : "", args);
	if (rc) {
		klog_diag();
		goto unload_gpusim;
	}
	if (C->version) {
		char v[64];

		read_line(v, sizeof(v), "/sys/module/%s/version", C->module);
		ok(!strncmp(v, C->version, strlen(C->version)),
		   "the loaded %s is version %s (want %s*)", C->module, v, C->version);
	}
	ok(core_has_client(),
	   "%s registered with the peer-memory core (" CORE_DBG "%s exists)",
	   C->label, C->core_name);
	if (!core_has_client()) {
		diag("%s did not register with the core: nothing below can work",
		     C->label);
		klog_diag();
		goto unload;
	}
	if (C->other_core) {
		char d[300];
		int there;

		snprintf(d, sizeof(d), CORE_DBG "%s", C->other_core);
		there = access(d, F_OK) == 0;
		ok(there == C->other_core_present, "%s %s a second client %s (%s %s)",
		   C->module, C->other_core_present ? "registers" : "does not register",
		   C->other_core, d, there ? "exists" : "does not exist");
	}
	read_line(flags, sizeof(flags), CORE_DBG "%s/flags", C->core_name);
	if (C->persistent)
		ok(strstr(flags, "invalidate=0") != NULL,
		   "the core treats %s as not invalidating: registered without an invalidation callback, it pins persistently (flags: %s)",
		   C->label, flags);
	else
		ok(strstr(flags, "invalidate=1") != NULL,
		   "the core treats %s as invalidating (flags: %s)", C->label, flags);
	ok(!cstats(&s0) && s0.alloc_mrs == 0 && s0.reg_bytes == 0 && sysfs_agrees(0),
	   "its core counters start at zero (" OFED_SYSFS "%s: %s)",
	   C->core_name, sysfs_what());
	if (C->live)
		ok(client_live_is(0, 0, 1), "%s shows nothing live (%s)",
		   C->label, C->live_what);
	else
		skip("%s shows nothing of what it holds: only the core and gpusim are checked for it",
		     C->label);

	rc = conn_open(&c);
	ok(rc == 0, "two RC QPs connected to each other on " RXE_DEV " (step %d)", rc);
	if (rc)
		goto unload;
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0)
		bail("open /dev/gpusim: %s", strerror(errno));

	/* Host memory: pinned by the core itself, no client involved. */
	cstats(&s0);
	gs_read(&g0);
	pin0 = vm_pin_kb();
	hmr = ibv_reg_mr(c.pd, hbuf, HOST_LEN, ACC);
	cstats(&s1);
	gs_read(&g1);
	ok(hmr && vm_pin_kb() - pin0 == (long)(HOST_LEN / 1024) &&
	   s1.alloc_mrs == s0.alloc_mrs && s1.free_callbacks == s0.free_callbacks &&
	   g1.get_pages == g0.get_pages && g1.gpp == g0.gpp && client_live_is(0, 0, 1),
	   "ibv_reg_mr on host memory takes the pinning path: VmPin +%lu KiB, %s never asked (core counters, gpusim calls unchanged)",
	   HOST_LEN / 1024, C->label);
	if (!hmr)
		bail("host MR failed: %s", strerror(errno));

	/* A GPU MR. */
	rc = gpu_alloc(&gb, gfd, GPU_LEN);
	ok(rc == 0, "GPUSIM_IOC_ALLOC: %lu KiB of GPU memory at %p", GPU_LEN / 1024,
	   (void *)gb.p);
	if (rc)
		bail("cannot allocate GPU memory: %s", strerror(-rc));
	fill(gb.p, GPU_LEN, 0x1e2e0001);
	cstats(&s0);
	gs_read(&g0);
	mr = ibv_reg_mr(c.pd, gb.p, GPU_LEN, ACC);
	rc = mr ? 0 : errno;
	ok(mr != NULL, "ibv_reg_mr on the GPU memory succeeds%s%s",
	   mr ? "" : ": ", mr ? "" : strerror(rc));
	if (!mr) {
		klog_diag();
		state_diag();
		goto free_gpu;
	}
	diag("GPU MR: addr %p length %lu lkey 0x%x rkey 0x%x", (void *)gb.p,
	     GPU_LEN, mr->lkey, mr->rkey);
	cstats(&s1);
	gs_read(&g1);
	ok(s1.alloc_mrs == s0.alloc_mrs + 1 &&
	   s1.reg_bytes == s0.reg_bytes + (long long)GPU_LEN &&
	   sg_added_ok(s1.reg_pages - s0.reg_pages, gpu_pages((uintptr_t)gb.p, GPU_LEN)) &&
	   sysfs_agrees(s1.alloc_mrs),
	   "core counters of %s: num_alloc_mrs +1, num_reg_bytes +%lu, num_reg_pages +%lld sg entries (want %s; %s)",
	   C->core_name, GPU_LEN, s1.reg_pages - s0.reg_pages,
	   sg_want(gpu_pages((uintptr_t)gb.p, GPU_LEN)), sysfs_what());
	ok(client_live_is(1, gpu_pages((uintptr_t)gb.p, GPU_LEN), 1) &&
	   g1.pins == g0.pins + 1 + C->keeper && g1.ppins == g0.ppins + !!C->persistent + C->keeper,
	   "%s holds one registration of %lld GPU pages; gpusim has one page table pinned (%s%s: live_persistent_pins +%lld)",
	   C->label, gpu_pages((uintptr_t)gb.p, GPU_LEN),
	   C->persistent ? "persistent" : "with a free callback",
	   C->keeper ? ", plus the persistent keeper" : "", g1.ppins - g0.ppins);

	/* RDMA WRITE host -> GPU, checked through gpusim's CPU mapping. */
	off = 3 * 4096 + 8, n = 200000;
	memcpy(expect, gb.p, GPU_LEN);
	fill(hbuf, n, 0x2e2e0002);
	memcpy(expect + off, hbuf, n);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, n, (uintptr_t)gb.p + off,
		     mr->rkey);
	ok(rc == 0 && !memcmp(gb.p, expect, GPU_LEN),
	   "RDMA WRITE host -> GPU: %zu bytes land at +%zu, nothing else changes (checked through gpusim's CPU mapping; %s)",
	   n, off, wc_str(rc));
	if (rc)
		requeue(&c);

	/* RDMA READ GPU -> host. */
	off = 1000, n = 131072;
	memset(hbuf + HOST_LEN / 2, 0, n);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf + HOST_LEN / 2, n,
		     (uintptr_t)gb.p + off, mr->rkey);
	ok(rc == 0 && !memcmp(hbuf + HOST_LEN / 2, gb.p + off, n) &&
	   !memcmp(gb.p, expect, GPU_LEN),
	   "RDMA READ GPU -> host: %zu bytes from +%zu match the CPU mapping (%s)",
	   n, off, wc_str(rc));
	if (rc)
		requeue(&c);

	/* The GPU MR as the local SGE: source of a WRITE, sink of a READ. */
	off = 131072, n = 100000;
	fill(gb.p + off, n, 0x3e2e0003);
	memset(hbuf + 300000, 0, n);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, mr, gb.p + off, n,
		     (uintptr_t)hbuf + 300000, hmr->rkey);
	ok(rc == 0 && check(hbuf + 300000, n, 0x3e2e0003),
	   "RDMA WRITE with the GPU MR as local source: the host gets its bytes (%s)",
	   wc_str(rc));
	if (rc)
		requeue(&c);
	off = 7, n = 50000;
	memcpy(expect, gb.p, GPU_LEN);
	fill(hbuf + 600000, n, 0x4e2e0004);
	memcpy(expect + off, hbuf + 600000, n);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, mr, gb.p + off, n,
		     (uintptr_t)hbuf + 600000, hmr->rkey);
	ok(rc == 0 && !memcmp(gb.p, expect, GPU_LEN),
	   "RDMA READ with the GPU MR as local sink: the bytes land in GPU memory at +%zu (%s)",
	   off, wc_str(rc));
	if (rc)
		requeue(&c);

	/* An unaligned sub-range MR of the same memory, beside the first. */
	cstats(&s0);
	smr = ibv_reg_mr(c.pd, gb.p + SUB_OFF, SUB_LEN, ACC);
	cstats(&s1);
	{
		uintptr_t a = (uintptr_t)gb.p + SUB_OFF;
		long long pg = gpu_pages(a, SUB_LEN);

		ok(smr && s1.alloc_mrs == s0.alloc_mrs + 1 &&
		   s1.reg_bytes == s0.reg_bytes + (long long)SUB_LEN &&
		   sg_added_ok(s1.reg_pages - s0.reg_pages, pg) &&
		   client_live_is(2, gpu_pages((uintptr_t)gb.p, GPU_LEN) + pg, 1),
		   "a second MR on the unaligned sub-range [+%lu, +%lu): +%lu bytes, +%lld sg entries (want %s), %lld more GPU pages pinned",
		   SUB_OFF, SUB_OFF + SUB_LEN, SUB_LEN, s1.reg_pages - s0.reg_pages,
		   sg_want(pg), pg);
	}
	if (smr) {
		int r2;

		memcpy(expect, gb.p, GPU_LEN);
		fill(hbuf, 8192, 0x5e2e0005);
		memcpy(expect + SUB_OFF, hbuf, 4096);
		memcpy(expect + SUB_OFF + SUB_LEN - 4096, hbuf + 4096, 4096);
		rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 4096,
			     (uintptr_t)gb.p + SUB_OFF, smr->rkey);
		r2 = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf + 4096, 4096,
			     (uintptr_t)gb.p + SUB_OFF + SUB_LEN - 4096, smr->rkey);
		ok(rc == 0 && r2 == 0 && !memcmp(gb.p, expect, GPU_LEN),
		   "RDMA WRITE at the first and last bytes of the sub-range MR (%s, %s)",
		   wc_str(rc), wc_str(r2));
		if (rc || r2)
			requeue(&c);
	}

	/* Deregistration. */
	cstats(&s0);
	rc = (smr ? ibv_dereg_mr(smr) : 0) | ibv_dereg_mr(mr);
	smr = mr = NULL;
	ok(rc == 0, "ibv_dereg_mr of both GPU MRs");
	client_flush();
	cstats(&s1);
	gs_read(&g1);
	ok(e2e_core_balanced(&s1) && s1.free_callbacks == s0.free_callbacks &&
	   client_live_is(0, 0, 1) && g1.pins == 0 && g1.dmas == 0,
	   "counters balanced (num_alloc_mrs = num_dealloc_mrs = %lld, num_reg_bytes = num_dereg_bytes, num_dereg_pages 0 as in OFED); %s and gpusim hold no pin",
	   s1.alloc_mrs, C->label);

	/* Free the GPU memory while two MRs on it are registered. */
	fill(gb.p, GPU_LEN, 0x6e2e0006);
	memcpy(saved, gb.p, GPU_LEN);
	mr = ibv_reg_mr(c.pd, gb.p, GPU_LEN, ACC);
	smr = ibv_reg_mr(c.pd, gb.p + SUB_OFF, SUB_LEN, ACC);
	rc = mr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 65536,
			  (uintptr_t)gb.p + 65536, mr->rkey) : -1;
	ok(mr && smr && rc == 0 && !memcmp(hbuf, saved + 65536, 65536),
	   "two fresh MRs on the GPU memory; RDMA READ through one works (%s)",
	   wc_str(rc));
	if (!mr || !smr)
		goto free_gpu;
	if (rc)
		requeue(&c);
	if (C->persistent) {
		free_persistent(&c, hmr, mr, smr, &gb, hbuf, expect);
		smr = mr = NULL;
		goto exits;
	}
	cstats(&s0);
	gs_read(&g0);
	rc = gpu_free(&gb);
	ok(rc == 0, "GPUSIM_IOC_FREE with both MRs still registered (what cudaFree does): %s",
	   rc ? strerror(-rc) : "0");
	/*
	 * An invalidation counts the MR as deallocated; its bytes come back
	 * when it is deregistered (at once for a client the core unmaps).
	 */
	done = WAIT_UNTIL(!cstats(&s1) && s1.invalidated_mrs >= s0.invalidated_mrs + 2 &&
			  s1.dealloc_mrs == s1.alloc_mrs && read_ll(GSDBG "live_pins") == 0 &&
			  read_ll(GSDBG "live_allocs") == 0, 20);
	ok(done && s1.invalidated_mrs == s0.invalidated_mrs + 2 &&
	   s1.alloc_mrs == s0.alloc_mrs && s1.dealloc_mrs == s0.dealloc_mrs + 2,
	   "the free invalidated both MRs through the core (num_free_callbacks +%lld, num_invalidated_mrs +%lld, num_dealloc_mrs +%lld) and gpusim got both page tables back",
	   s1.free_callbacks - s0.free_callbacks,
	   s1.invalidated_mrs - s0.invalidated_mrs, s1.dealloc_mrs - s0.dealloc_mrs);
	if (!done)
		state_diag();

	fill(hbuf, 8192, 0x7e2e0007);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 8192, (uintptr_t)gb.p,
		     mr->rkey);
	ok(rc > 0 && !memcmp(gb.p, saved, GPU_LEN),
	   "RDMA WRITE to the freed GPU memory completes in error (status %d: %s) and never reaches it",
	   rc, wc_str(rc));
	requeue(&c);
	memset(hbuf, 0x5a, 8192);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 8192,
		     (uintptr_t)gb.p + SUB_OFF, smr->rkey);
	ok(rc > 0 && hbuf[0] == 0x5a && !memcmp(hbuf, hbuf + 1, 8191),
	   "RDMA READ from the freed GPU memory (sub-range MR) completes in error (status %d: %s), no data",
	   rc, wc_str(rc));
	requeue(&c);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, mr, gb.p, 4096, (uintptr_t)hbuf,
		     hmr->rkey);
	ok(rc > 0 && hbuf[0] == 0x5a && !memcmp(hbuf, hbuf + 1, 4095),
	   "the freed GPU MR as local source completes in error (status %d: %s)",
	   rc, wc_str(rc));
	requeue(&c);
	rc = ibv_dereg_mr(smr) | ibv_dereg_mr(mr);
	smr = mr = NULL;
	ok(rc == 0, "ibv_dereg_mr of both invalidated MRs succeeds");
	gpu_unmap(&gb);
	done = WAIT_UNTIL(all_released(), 20);
	ok(done, "nothing left: core counters balanced, %s holds nothing, gpusim has no allocation, pin, mapping or memory",
	   C->label);
	if (!done)
		state_diag();

exits:
	/* Process exit instead of an explicit free, in both teardown orders. */
	exit_test(1);
	exit_test(0);

	/* The end: no leftovers, no stale calls. */
	ibv_dereg_mr(hmr);
	hmr = NULL;
	conn_close(&c);
	close(gfd);
	gfd = -1;
	cstats(&s1);
	gs_read(&g1);
	ok(s1.alloc_mrs == s1.dealloc_mrs && s1.dereg_pages == 0 &&
	   s1.dereg_bytes - s1.reg_bytes == exit_double_bytes &&
	   gs_idle() && client_live_is(0, 0, 1) && g1.stale == gstart.stale,
	   "at the end: num_alloc_mrs %lld == num_dealloc_mrs %lld, bytes balanced (but for %lld the exit tests saw counted twice), gpusim idle, %s idle, no call on a stale page table (stale_calls +%lld)",
	   s1.alloc_mrs, s1.dealloc_mrs, exit_double_bytes, C->label, g1.stale - gstart.stale);
	goto unload;

free_gpu:
	if (smr)
		ibv_dereg_mr(smr);
	if (mr)
		ibv_dereg_mr(mr);
	if (gb.p) {
		gpu_free(&gb);
		gpu_unmap(&gb);
	}
unload:
	if (hmr)
		ibv_dereg_mr(hmr);
	conn_close(&c);
	if (gfd >= 0)
		close(gfd);
	flush_own_pins(C->module);
	rc = run("rmmod %s", C->module);
	ok(rc == 0 && !core_has_client() &&
	   read_ll(OFED_SYSFS "%s/num_alloc_mrs", C->core_name) < 0,
	   "rmmod %s: the core forgets it (no debugfs or memory_peers entry left)",
	   C->module);
unload_gpusim:
	if (gs_loaded == 1) {
		ok(run("rmmod gpusim") == 0, "rmmod gpusim");
		ok(dmesg_count("gpusim: unloading with") == reclaims0,
		   "gpusim did not have to reclaim any pin at unload");
	}
	return tap_fail;
}
