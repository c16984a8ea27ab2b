// SPDX-License-Identifier: GPL-2.0
/*
 * Does the address-change work item allocate? It runs in a kworker, where
 * t_peermem_failnth's per-task fail-nth cannot reach, and the debug rig
 * has no CONFIG_FAULT_INJECTION_STACKTRACE_FILTER to aim failslab at it.
 * If the work item (peermem's revocation, the core's invalidate, rxe, the
 * GPU driver's dma_unmap and put_pages under it) allocates nothing, there
 * is no allocation failure to inject there; this test checks exactly that,
 * with the kernel's own tracepoints: every slab, page and per-cpu
 * allocation (kmem:kmalloc, kmem:kmem_cache_alloc, kmem:mm_page_alloc,
 * percpu:percpu_alloc_percpu) made by a task between
 * workqueue:workqueue_execute_start and _end of peermem_watch_work.
 *
 * It does allocate, measured: the IOMMU's free_iova_fast() takes a new
 * IOVA magazine now and then while the GPU driver's dma_unmap runs
 * (GFP_ATOMIC; on failure it frees the IOVA the slow way), plus what the
 * allocator and kmemleak make for that (slab sheaves, kmemleak's
 * metadata, their pages, all atomic). None of them is made by peermem, the
 * core, rxe or the GPU driver, and no failure of them reaches a caller:
 * dma_unmap and put_pages return nothing to fail. So the test checks (1)
 * that every allocation in the work item is one of those (call sites in
 * ALLOWED, page allocations atomic), which fails the moment anything on
 * that path allocates elsewhere, and (2) injects the one real one: with
 * failslab's cache filter every IOVA magazine allocation fails, whichever
 * task makes it, while munmap revokes large MRs; each must still be
 * revoked with nothing left and no report.
 *
 * The method is checked on a path that does allocate (this thread's
 * ibv_reg_mr must show allocations), and the work items must all be seen
 * running (none may hide in a lost trace buffer).
 */
#include "peermem_test.h"
#include <sys/syscall.h>

#define TR "/sys/kernel/tracing/"
#define NMR 8
#define LEN (4 * GPU_PAGE)
#define WORK_FN "peermem_watch_work"

static const char *const alloc_events[] = {
	"kmem/kmalloc", "kmem/kmem_cache_alloc", "kmem/mm_page_alloc",
	"percpu/percpu_alloc_percpu", NULL,
};

/* Allocation sites allowed in the work item (see above). */
static const char *const allowed[] = {
	"call_site=free_iova_fast+",	/* IOMMU IOVA magazine, falls back */
	"call_site=__alloc_object+",	/* kmemleak's metadata */
	"call_site=__alloc_empty_sheaf+",	/* slab's per-CPU sheaf */
	NULL,
};

static int alloc_allowed(const char *l)
{
	int i;

	if (strstr(l, " mm_page_alloc:"))
		return strstr(l, "gfp_flags=GFP_ATOMIC") || strstr(l, "gfp_flags=GFP_NOWAIT");
	for (i = 0; allowed[i]; i++)
		if (strstr(l, allowed[i]))
			return 1;
	return 0;
}

static int tr_write(const char *file, const char *val)
{
	char p[256];

	snprintf(p, sizeof(p), TR "%s", file);
	return write_str(p, val);
}

static void trace_setup(void)
{
	char p[160];
	int i;

	if (access(TR "trace", F_OK) && run("mount -t tracefs nodev /sys/kernel/tracing"))
		bail("cannot mount tracefs (the rig kernel has CONFIG_TRACING)");
	tr_write("tracing_on", "0");
	tr_write("buffer_size_kb", "16384");
	tr_write("trace", "");
	if (tr_write("events/workqueue/workqueue_execute_start/enable", "1") ||
	    tr_write("events/workqueue/workqueue_execute_end/enable", "1"))
		bail("cannot enable the workqueue tracepoints");
	for (i = 0; alloc_events[i]; i++) {
		snprintf(p, sizeof(p), "events/%s/enable", alloc_events[i]);
		if (tr_write(p, "1"))
			bail("cannot enable the tracepoint %s", alloc_events[i]);
	}
}

static void trace_off(void)
{
	tr_write("tracing_on", "0");
	tr_write("events/enable", "0");
}

/* The pid of a trace line "comm-pid [cpu] ...", or -1. */
static long line_pid(const char *l)
{
	const char *br = strstr(l, " [");
	const char *d;

	if (!br)
		return -1;
	for (d = br; d > l && d[-1] != '-'; d--)
		;
	return d > l ? strtol(d, NULL, 10) : -1;
}

static int is_alloc(const char *l)
{
	return strstr(l, " kmalloc:") || strstr(l, " kmem_cache_alloc:") ||
	       strstr(l, " mm_page_alloc:") || strstr(l, " percpu_alloc_percpu:");
}

/*
 * An event from an interrupt or softirq that ran on the task's stack (the
 * trace's flags "d.s1." etc.: third column h, s or H), not the task's own.
 */
static int in_irq_context(const char *l)
{
	const char *f = strstr(l, "] ");

	if (!f)
		return 0;
	for (f += 2; *f == ' '; f++)
		;
	return strlen(f) > 3 && (f[2] == 'h' || f[2] == 's' || f[2] == 'H');
}

struct result {
	int works, work_allocs, work_other, self_allocs, lost;
};

/*
 * Reads the trace: allocations inside peermem_watch_work executions (per
 * task: a kworker runs one work item at a time), and those of `self`.
 */
static void trace_read(long self, struct result *r)
{
	enum { MAXT = 64 };
	long inside[MAXT];
	int ninside = 0, i, shown = 0;
	char l[1024];
	FILE *f = fopen(TR "trace", "r");

	if (!f)
		bail("cannot read " TR "trace: %s", strerror(errno));
	memset(r, 0, sizeof(*r));
	while (fgets(l, sizeof(l), f)) {
		long pid;

		if (l[0] == '#')
			continue;
		if (strstr(l, "LOST") && strstr(l, "EVENTS"))
			r->lost++;
		pid = line_pid(l);
		if (pid < 0)
			continue;
		if (strstr(l, "workqueue_execute_start:") && strstr(l, WORK_FN)) {
			r->works++;
			if (ninside < MAXT)
				inside[ninside++] = pid;
			continue;
		}
		if (strstr(l, "workqueue_execute_end:")) {
			for (i = 0; i < ninside; i++)
				if (inside[i] == pid) {
					inside[i] = inside[--ninside];
					break;
				}
			continue;
		}
		if (!is_alloc(l) || in_irq_context(l))
			continue;
		if (pid == self)
			r->self_allocs++;
		for (i = 0; i < ninside; i++)
			if (inside[i] == pid) {
				r->work_allocs++;
				if (!alloc_allowed(l)) {
					r->work_other++;
					if (shown++ < 10)
						diag("allocation in the work item: %s", l);
				}
			}
	}
	fclose(f);
}

/*
 * munmaps the n registered ranges, waits up to secs for peermem to count n
 * address changes since ac0, then counts the MRs an RDMA READ no longer
 * gets through (revoked).
 */
static int unmap_and_count_revoked(struct conn *c, struct gmem *g, struct ibv_mr **mr, int n,
				   long long ac0, double secs, struct ibv_mr *hmr, uint8_t *h)
{
	double end = now_s() + secs;
	int i, revoked = 0;

	for (i = 0; i < n; i++)
		if (munmap(g[i].p, g[i].len))
			bail("munmap: %s", strerror(errno));
	while (now_s() < end && pm("address_changes") < ac0 + n)
		usleep(10000);
	for (i = 0; i < n; i++) {
		int st = rdma_op(c, IBV_WR_RDMA_READ, hmr, h, 64, (uintptr_t)g[i].p, mr[i]->rkey);

		if (st) {
			revoked++;
			if (conn_qps(c))
				bail("cannot recreate the QPs");
		}
	}
	return revoked;
}

static int fs_write(const char *file, const char *val)
{
	char p[256];

	snprintf(p, sizeof(p), "/sys/kernel/debug/failslab/%s", file);
	return write_str(p, val);
}

/*
 * Every IOVA magazine allocation fails while munmap revokes BIGN MRs of
 * BIGLEN (BIGN * BIGLEN / 64 KiB IOVAs freed by the GPU driver's dma_unmap
 * in the work items: several magazines' worth).
 */
#define BIGN 32
#define BIGLEN (64 * GPU_PAGE)
#define MAG "/sys/kernel/slab/iommu_iova_magazine/failslab"
static void inject_iova(struct conn *c, int fd, struct ibv_mr *hmr, uint8_t *h)
{
	struct gmem g[BIGN];
	struct ibv_mr *mr[BIGN];
	long long ac0, left;
	int i, revoked = 0;

	if (access(MAG, W_OK)) {
		ok(0, "failslab on the IOVA magazine cache: %s (needs CONFIG_FAILSLAB and an unmerged cache)",
		   strerror(errno));
		return;
	}
	for (i = 0; i < BIGN; i++) {
		if (gmem_alloc(fd, BIGLEN, &g[i]))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		mr[i] = ibv_reg_mr(c->pd, g[i].p, BIGLEN, MR_ACCESS);
		if (!mr[i])
			bail("ibv_reg_mr of %llu KiB of GPU memory: %s", (unsigned long long)BIGLEN >> 10,
			     strerror(errno));
	}
	ac0 = pm("address_changes");
	/* The filter and the cache's flag before the probability. */
	if (fs_write("verbose", getenv("FS_VERBOSE") ?: "0") || fs_write("task-filter", "N") ||
	    fs_write("cache-filter", "Y") || write_str(MAG, "1") || fs_write("interval", "1") ||
	    fs_write("space", "0") || fs_write("ignore-gfp-wait", "N") || fs_write("times", "100000") ||
	    fs_write("probability", "100"))
		bail("cannot set up failslab for the IOVA magazine cache");
	revoked = unmap_and_count_revoked(c, g, mr, BIGN, ac0, 30, hmr, h);
	usleep(200000);
	/* Probability 0 first: without the cache filter every cache would fail. */
	if (fs_write("probability", "0"))
		bail("cannot switch failslab off");
	left = read_ll("/sys/kernel/debug/failslab/times");
	write_str(MAG, "0");
	fs_write("cache-filter", "N");
	fs_write("times", "1");
	for (i = 0; i < BIGN; i++) {
		ibv_dereg_mr(mr[i]);
		g[i].p = NULL;
		gmem_free(fd, &g[i]);
	}
	ok(left >= 0 && left < 100000,
	   "failslab: IOVA magazine allocations failed while the work items unmapped (%lld injected)",
	   left >= 0 ? 100000 - left : -1);
	ok(revoked == BIGN && pm("address_changes") == ac0 + BIGN,
	   "with them failing, munmap of %d GPU MRs of %llu KiB: %d revoked, %lld address changes", BIGN,
	   (unsigned long long)BIGLEN >> 10, revoked, pm("address_changes") - ac0);
	ok(wait_for(all_idle, 10),
	   "with them failing: nothing left pinned, mapped or registered");
}

int main(void)
{
	struct gmem g[NMR];
	struct ibv_mr *mr[NMR], *hmr, *probe;
	struct conn c;
	struct result r;
	long long ac0;
	uint8_t *h;
	int fd, i, revoked = 0;

	rxe_up();
	load_modules(NULL);
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);
	for (i = 0; i < NMR; i++) {
		if (gmem_alloc(fd, LEN, &g[i]))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		mr[i] = ibv_reg_mr(c.pd, g[i].p, LEN, MR_ACCESS);
		if (!mr[i])
			bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	}
	ac0 = pm("address_changes");

	trace_setup();
	tr_write("tracing_on", "1");
	/* The control: a registration allocates, in this thread. */
	probe = ibv_reg_mr(c.pd, g[0].p, LEN, MR_ACCESS);
	if (!probe)
		bail("ibv_reg_mr (control): %s", strerror(errno));
	ibv_dereg_mr(probe);
	/* Each revocation has run to its end: every RDMA through the MRs fails. */
	revoked = unmap_and_count_revoked(&c, g, mr, NMR, ac0, 20, hmr, h);
	usleep(200000);
	trace_off();
	trace_read((long)syscall(SYS_gettid), &r);
	tr_write("trace", "");
	tr_write("buffer_size_kb", "1408");

	ok(revoked == NMR && pm("address_changes") == ac0 + NMR,
	   "munmap of %d registered GPU ranges: %d MRs revoked, %lld address changes", NMR, revoked,
	   pm("address_changes") - ac0);
	ok(r.lost == 0, "no trace events lost (%d LOST markers)", r.lost);
	ok(r.self_allocs > 0, "control: the method sees allocations (ibv_reg_mr in this thread made %d)",
	   r.self_allocs);
	ok(r.works >= NMR, "every address-change work item was traced (%d executions of %s, %d expected)",
	   r.works, WORK_FN, NMR);
	ok(r.works > 0 && r.work_other == 0,
	   "the address-change work item allocates only in the IOMMU's IOVA cache, the slab allocator and kmemleak (%d allocations in %d executions, %d elsewhere)",
	   r.work_allocs, r.works, r.work_other);

	for (i = 0; i < NMR; i++) {
		ibv_dereg_mr(mr[i]);
		g[i].p = NULL;
		gmem_free(fd, &g[i]);
	}
	inject_iova(&c, fd, hmr, h);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(run("rmmod peermem") == 0, "rmmod peermem");
	return finish();
}
