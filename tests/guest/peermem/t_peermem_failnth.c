// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel fault injection at every allocation of peermem's registration and
 * teardown paths (and of the core, rxe and uverbs on the way), with the
 * debug rig's failslab and fail_page_alloc and the per-task fail-nth: for
 * each path, make the 1st, 2nd, 3rd ... allocation of this thread fail
 * until the call runs without reaching the n-th (the fault was not
 * injected: every allocation point of that call was tried once). After
 * each step: the errno is one docs/module.md documents, nothing is left
 * registered, pinned or mapped, and the client still works (a
 * registration without a fault, bytes read back over RDMA). The kernel
 * side (reports, kmemleak, DMA-API leaks) is checked by scripts/vm.sh.
 *
 * Paths: ibv_reg_mr (acquire, get_pages, dma_map; also with gpusim's
 * nvidia_p2p_get_pages* or nvidia_p2p_dma_map_pages failing in the same
 * call, which steps the error paths after a GPU driver failure), ibv_dereg_mr
 * (dma_unmap, put_pages, release), GPUSIM_IOC_FREE under a live MR (the
 * free callback and the core's invalidate), munmap under a live MR (the
 * mmu notifier's callback; its work item runs in a kworker, where a
 * per-task fault cannot reach: t_peermem_notifier_alloc covers it), and
 * loading peermem
 * (finit_module: the loader, peermem's init, its registration with the
 * core: t_peermem_failnth_load, the same program built with
 * FAILNTH_LOAD_ONLY, to keep each within the runner's time limit).
 */
#include "peermem_test.h"
#include <sys/syscall.h>

#define LEN (4 * GPU_PAGE)
#define MAX_STEPS 3000

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int fd;


/* Nothing of a registration is left (the allocation itself may stay). */
static int regs_idle(void)
{
	struct peer_stats s;

	return pm_idle() && gs("live_pins") == 0 && gs("live_dma_mappings") == 0 &&
	       peer_stats(pm_name, &s) == 0 && core_all_released(&s);
}

/* The client still works: register g, READ it back over RDMA, deregister. */
static int still_works(const struct gmem *g, uint32_t seed)
{
	struct ibv_mr *mr;
	int st;

	fill(g->p, LEN, seed);
	mr = ibv_reg_mr(c.pd, g->p, LEN, MR_ACCESS);
	if (!mr)
		return 0;
	memset(h, 0, LEN);
	st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g->p, mr->rkey);
	if (st && conn_qps(&c))
		bail("cannot recreate the QPs");
	ibv_dereg_mr(mr);
	return st == 0 && check(h, LEN, seed);
}

struct tally {
	int steps, injected_failed, injected_ok, bad_errno, leaks, broken, done;
	int errnos[4];	/* ENOMEM, EFAULT, EINVAL, other */
};

static void tally_errno(struct tally *t, int e)
{
	int i = e == ENOMEM ? 0 : e == EFAULT ? 1 : e == EINVAL ? 2 : 3;

	t->errnos[i]++;
	if (i == 3) {
		t->bad_errno++;
		diag("step %d: errno %d (%s)", t->steps, e, strerror(e));
	}
}

/*
 * The call of step t->steps returned (failed: with errno e): reset
 * fail-nth and count the step. Done once the call reached no n-th
 * allocation (every allocation point was tried).
 */
static void step_done(struct tally *t, int failed, int e)
{
	if (fnth_take() > 0)
		t->done = 1;
	else if (!failed)
		t->injected_ok++;
	else {
		t->injected_failed++;
		tally_errno(t, e);
	}
}

static void tally_after(struct tally *t, const struct gmem *g, const char *what)
{
	if (!wait_for(regs_idle, 10)) {
		t->leaks++;
		diag("%s, step %d: something is left", what, t->steps);
		pm_diag();
		gs_diag();
		peer_stats_diag(pm_name);
	}
	if (!still_works(g, 0x1000 + t->steps)) {
		t->broken++;
		diag("%s, step %d: the client no longer registers or reads back", what, t->steps);
	}
}

static void report(const char *what, const struct tally *t, const char *errnos)
{
	diag("%s: %d steps, %d failed cleanly (ENOMEM %d, EFAULT %d, EINVAL %d), %d succeeded despite the fault",
	     what, t->steps, t->injected_failed, t->errnos[0], t->errnos[1], t->errnos[2],
	     t->injected_ok);
	ok(t->done, "%s: every allocation point tried (%d steps until the call reached no n-th allocation)",
	   what, t->steps);
	ok(t->bad_errno == 0, "%s: every failure gave a documented errno (%s) (%d others)", what,
	   errnos, t->bad_errno);
	ok(t->leaks == 0, "%s: nothing left registered, pinned or mapped after any step (%d steps leaked)",
	   what, t->leaks);
	ok(t->broken == 0, "%s: the client worked after every step (%d steps broke it)", what, t->broken);
}

/*
 * Arm (val "1") or disarm (val "0") gpusim's injected failure of each
 * entry point in the NULL-terminated list.
 */
static void gs_arm(const char *const *entries, const char *val)
{
	char k[64];

	for (; entries && *entries; entries++) {
		snprintf(k, sizeof(k), "fail/%s", *entries);
		if (gs_knob(k, val))
			bail("cannot set gpusim's %s", k);
	}
}

/*
 * ibv_reg_mr with the n-th allocation failing; with `gpu_fail`, gpusim's
 * entry points in it fail too (each armed before every step, disarmed
 * after: a step whose allocation fault comes first never reaches them), so
 * the allocations on peermem's and the core's error paths after a GPU
 * driver failure are stepped as well. With a GPU failure the registration
 * must fail in every step.
 */
static void fault_reg(struct gmem *g, const char *const *gpu_fail, const char *what)
{
	struct tally t = { 0 };
	int worked = 0;

	for (t.steps = 1; t.steps <= MAX_STEPS && !t.done; t.steps++) {
		struct ibv_mr *mr;
		int e;

		/*
		 * Every step registers afresh: still_works() leaves the range
		 * in the watch-pin cache, whose hit would skip the pin with the
		 * free callback and peermem's allocations.
		 */
		pm_flush();
		gs_arm(gpu_fail, "1");
		fnth_set(t.steps);
		mr = ibv_reg_mr(c.pd, g->p, LEN, MR_ACCESS);
		e = errno;
		/* Step bookkeeping before anything else allocates in this thread. */
		step_done(&t, !mr, e);
		gs_arm(gpu_fail, "0");
		if (mr && gpu_fail) {
			worked++;
			diag("%s, step %d: ibv_reg_mr succeeded although the GPU driver failed", what, t.steps);
		}
		if (mr && ibv_dereg_mr(mr))
			diag("reg step %d: ibv_dereg_mr failed", t.steps);
		if (!t.done)
			tally_after(&t, g, what);
	}
	t.steps--;
	report(what, &t, "ENOMEM, EFAULT, EINVAL");
	if (gpu_fail)
		ok(worked == 0, "%s: the registration failed in every step (%d succeeded)", what, worked);
}

static void fault_dereg(struct gmem *g)
{
	struct tally t = { 0 };

	for (t.steps = 1; t.steps <= MAX_STEPS && !t.done; t.steps++) {
		struct ibv_mr *mr = ibv_reg_mr(c.pd, g->p, LEN, MR_ACCESS);
		int rc;

		if (!mr)
			bail("dereg step %d: ibv_reg_mr without a fault failed: %s", t.steps, strerror(errno));
		fnth_set(t.steps);
		rc = ibv_dereg_mr(mr);	/* the errno itself on failure */
		step_done(&t, rc, rc);
		if (rc && ibv_dereg_mr(mr))
			diag("dereg step %d: the second ibv_dereg_mr failed too", t.steps);
		if (!t.done)
			tally_after(&t, g, "ibv_dereg_mr");
	}
	t.steps--;
	report("ibv_dereg_mr of a GPU MR", &t, "ENOMEM");
}

static void fault_free(void)
{
	struct tally t = { 0 };
	struct gmem g2;

	if (gmem_alloc(fd, LEN, &g2))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	for (t.steps = 1; t.steps <= MAX_STEPS && !t.done; t.steps++) {
		struct gmem g;
		struct ibv_mr *mr;
		int rc, st;

		if (gmem_alloc(fd, LEN, &g))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		if (!mr)
			bail("free step %d: ibv_reg_mr without a fault failed: %s", t.steps, strerror(errno));
		fnth_set(t.steps);
		rc = gmem_free(fd, &g);
		step_done(&t, rc, -rc);
		if (rc) {
			/* The free failed: the MR must still work; then free it. */
			st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p, mr->rkey);
			if (st) {
				t.broken++;
				diag("free step %d: the free failed but the MR no longer works (%d)", t.steps, st);
				conn_qps(&c);
			}
			if (gmem_free(fd, &g))
				bail("free step %d: the second free failed: %s", t.steps, strerror(errno));
		}
		/*
		 * The free returned and the revocation it queued has run (nv_mem's
		 * keeper keeps the memory until then: docs/module.md, "The
		 * keeper"): the MR is revoked.
		 */
		if (!wait_for(pm_no_keepers, 20))
			diag("free step %d: the keeper pin was not put within 20 s of the free", t.steps);
		st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p, mr->rkey);
		if (st == 0) {
			t.broken++;
			diag("free step %d: an RDMA READ through the MR worked after the free", t.steps);
		} else if (conn_qps(&c)) {
			bail("cannot recreate the QPs");
		}
		ibv_dereg_mr(mr);
		gmem_drop(&g);
		if (!t.done)
			tally_after(&t, &g2, "GPUSIM_IOC_FREE");
	}
	t.steps--;
	gmem_free(fd, &g2);
	gmem_drop(&g2);
	report("GPUSIM_IOC_FREE under a live MR (free callback, invalidate)", &t, "ENOMEM");
}

static void fault_munmap(struct gmem *keep)
{
	struct tally t = { 0 };

	for (t.steps = 1; t.steps <= MAX_STEPS && !t.done; t.steps++) {
		struct gmem g;
		struct ibv_mr *mr;
		int rc, st = 0;
		double end;

		if (gmem_alloc(fd, LEN, &g))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		if (!mr)
			bail("munmap step %d: ibv_reg_mr without a fault failed: %s", t.steps, strerror(errno));
		fnth_set(t.steps);
		rc = munmap(g.p, g.len);
		step_done(&t, rc, errno);
		if (rc)
			munmap(g.p, g.len);
		/* The work item revokes the MR soon after. */
		end = now_s() + slow_s(10);
		while (now_s() < end) {
			st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 64, (uintptr_t)g.p, mr->rkey);
			if (st) {
				if (conn_qps(&c))
					bail("cannot recreate the QPs");
				break;
			}
			usleep(5000);
		}
		if (!st) {
			t.broken++;
			diag("munmap step %d: the MR was not revoked within 10 s", t.steps);
		}
		ibv_dereg_mr(mr);
		g.p = NULL;
		gmem_free(fd, &g);
		if (!t.done)
			tally_after(&t, keep, "munmap");
	}
	t.steps--;
	report("munmap under a live MR (the notifier's callback)", &t, "ENOMEM");
}

/*
 * One load of peermem with its n-th allocation failing (fail-nth), and what
 * must hold after it: loaded and serving registrations, or failed with
 * nothing of it left.
 */
static void load_step(struct tally *t, struct gmem *g, const char *ko, int n)
{
	int kfd = open(ko, O_RDONLY | O_CLOEXEC);
	long rc;

	t->steps = n;
	if (kfd < 0)
		bail("%s: %s", ko, strerror(errno));
	fnth_set(n);
	rc = syscall(SYS_finit_module, kfd, "", 0);
	step_done(t, rc, errno);
	close(kfd);
	if (rc == 0) {
		/*
		 * The core's debugfs directory of a client is best effort
		 * (debugfs failures are ignored, as everywhere in the kernel):
		 * its absence alone is no failure; that the client serves
		 * registrations is the check.
		 */
		if (access("/sys/kernel/debug/peer_memory/nv_mem", F_OK))
			diag("load step %d: peermem loaded; the core's debugfs directory for nv_mem was not created (an allocation of debugfs failed)",
			     n);
		long long a0 = pm("registrations_acquired");

		if (!still_works(g, 0x3000 + n) ||
		    (a0 >= 0 && pm("registrations_acquired") != a0 + 1)) {
			t->broken++;
			diag("load step %d: peermem loaded but nv_mem does not serve registrations", n);
		}
		if (syscall(SYS_delete_module, "peermem", O_NONBLOCK))
			bail("load step %d: cannot unload peermem: %s", n, strerror(errno));
	} else if (access("/sys/module/peermem", F_OK) == 0 ||
		   access("/sys/kernel/debug/peer_memory/nv_mem", F_OK) == 0) {
		t->leaks++;
		diag("load step %d: the load failed but peermem or its core client is still there", n);
	}
}

/*
 * Loading peermem makes about 1400 allocations that fail-nth can fail
 * (the module loader's, then peermem's init: debugfs files, the core's
 * registration), and one load takes about 2 s in the debug rig (more on a
 * slow machine): stepping each would take most of an hour. So the suite
 * works to a time budget, not a count: first a coarse pass fails every
 * 64th allocation in turn until a load reaches no n-th (the minimum, about
 * 22 loads, done whatever the time: it covers the whole range), then, while
 * FAILNTH_LOAD_SECONDS (default 20, counted from the start) lasts, it
 * halves the stride, visiting the allocations between (every 32nd, 16th,
 * ...), and says how far it got.
 * FAILNTH_LOAD_STRIDE=1 (with scripts/vm.sh --test-timeout 1800) steps
 * every one with no budget.
 */
#define LOAD_COARSE 64

static void fault_load(struct gmem *g)
{
	struct tally t = { 0 };
	char ko[512];
	int every = getenv("FAILNTH_LOAD_STRIDE") ? atoi(getenv("FAILNTH_LOAD_STRIDE")) : 0;
	int budget = getenv("FAILNTH_LOAD_SECONDS") ? atoi(getenv("FAILNTH_LOAD_SECONDS")) : 20;
	int n = 0, last, loads = 0, coarse_loads, whole, stride;
	double t0 = now_s();
	char what[160];

	snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	if (pm_rmmod())
		bail("cannot unload peermem");
	/* The coarse pass (or every FAILNTH_LOAD_STRIDE-th, with no budget). */
	whole = every > 0 ? every : LOAD_COARSE;
	for (n = 1; n <= MAX_STEPS && !t.done; n += whole, loads++)
		load_step(&t, g, ko, n);
	last = t.steps;
	coarse_loads = loads;
	/*
	 * Refinement, while the budget lasts: the allocations between, at half
	 * the stride each round; `whole` is the finest stride that covered the
	 * whole range, `n` where the round cut short by the budget stopped.
	 */
	stride = whole;
	while (every <= 0 && t.done && stride > 1 && now_s() - t0 < budget) {
		stride /= 2;
		for (n = 1 + stride; n < last && now_s() - t0 < budget; n += 2 * stride, loads++)
			load_step(&t, g, ko, n);
		if (n < last)
			break;
		whole = stride;
	}
	t.steps = last;
	if (whole != stride)
		diag("loading peermem: %d loads in %.0f s (budget %d s): every %d-th allocation up to the %d-th (coarse pass: %d loads), every %d-th up to the %d-th",
		     loads, now_s() - t0, budget, whole, last, coarse_loads, stride, n);
	else
		diag("loading peermem: %d loads in %.0f s (budget %d s): every %d-th allocation up to the %d-th (coarse pass: %d loads)",
		     loads, now_s() - t0, budget, whole, last, coarse_loads);
	snprintf(what, sizeof(what), "loading peermem (finit_module, at least every %d%s allocation failed in turn)",
		 every > 0 ? every : LOAD_COARSE, every == 1 ? "st" : "th");
	report(what, &t, "ENOMEM, EFAULT, EINVAL");
	load_modules(NULL);
}

int main(void)
{
	struct gmem g;

	rxe_up();
	load_modules(NULL);
	if (strcmp(pm_name, "nv_mem"))
		bail("this test expects peermem's default client name nv_mem (got %s)", pm_name);
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fnth_setup();
	ok(still_works(&g, 7), "a registration without faults works");

#ifdef FAILNTH_LOAD_ONLY
	fault_load(&g);
#else
	fault_reg(&g, NULL, "ibv_reg_mr on GPU memory");
	{
		/* Both clients' pins fail (nv_mem_nc would take the MR otherwise). */
		static const char *const pins[] = { "get_pages", "get_pages_persistent", NULL };
		static const char *const map[] = { "dma_map_pages", NULL };

		fault_reg(&g, pins, "ibv_reg_mr, GPU pin failing (fail/get_pages*)");
		fault_reg(&g, map, "ibv_reg_mr, GPU DMA mapping failing (fail/dma_map_pages)");
	}
	fault_dereg(&g);
	fault_free();
	fault_munmap(&g);
#endif

	ok(pm("errors") >= 0, "peermem's counters are readable after the faults (errors %lld)",
	   pm("errors"));
	gmem_free(fd, &g);
	gmem_drop(&g);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(pm_rmmod() == 0, "rmmod peermem");
	return finish();
}
