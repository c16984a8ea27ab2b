// SPDX-License-Identifier: GPL-2.0
/*
 * Address-space changes under live registrations: peermem's mmu interval
 * notifier. munmap of a registered GPU range, or mremap moving it away,
 * revokes the registration asynchronously (the core invalidates the MR,
 * peermem unpins the GPU pages while the MR is still registered, the next
 * RDMA to it fails, deregistration still works). mprotect of the whole
 * range, unmapping unrelated (even adjacent) memory and the teardown of an
 * exiting process are ignored. With mmu_notifier=0 (or enable_invalidate=0)
 * nothing watches the address space and an MR keeps reaching the GPU memory
 * behind an address that no longer maps it: the hazard the notifier closes.
 * Freeing first (free callback) and unmapping afterwards counts nothing
 * more. Then a registration racing munmap (inside peermem's get_pages and
 * dma_map windows) and a race loop of munmap against ibv_dereg_mr and of
 * GPUSIM_IOC_FREE against munmap.
 *
 * gpusim makes this observable: munmap never frees its memory and never
 * calls a free callback (docs/gpusim.md, "What address-space changes do"),
 * so only the notifier can tell peermem.
 */
#define _GNU_SOURCE		/* mremap; peermem_test.h includes libc headers first */
#include "peermem_test.h"

#define LEN (256 * 1024UL)		/* 4 GPU pages */
#define WAIT_S slow_s(30.0)		/* for the asynchronous revocation */
#define QUIET_S 3.0			/* for "nothing happens" */
#define ROUNDS 16
#define PARAM "/sys/module/peermem/parameters/mmu_notifier"

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h, *saved;
static int fd;

/* ---- counters ---- */

struct snap {
	long long inv_mmu, addr_chg, inv_free, free_cb, errors, acquired, gs_pins, gs_cb;
	struct peer_stats ps;
};

static void take(struct snap *s)
{
	s->inv_mmu = pm("invalidations_mmu_notifier");
	s->addr_chg = pm("address_changes");
	s->inv_free = pm("invalidations_gpu_free");
	s->free_cb = pm("free_callbacks");
	s->errors = pm("errors");
	s->acquired = pm("registrations_acquired");
	s->gs_pins = gs("live_pins");
	s->gs_cb = gs("free_callbacks");
	peer_stats(pm_name, &s->ps);
}

static void snap_diag(const char *what, const struct snap *a, const struct snap *b)
{
	diag("%s: invalidations_mmu_notifier %lld -> %lld, address_changes %lld -> %lld, invalidations_gpu_free %lld -> %lld, free_callbacks %lld -> %lld, errors %lld -> %lld, core invalidated %lld -> %lld, gpusim live_pins %lld -> %lld",
	     what, a->inv_mmu, b->inv_mmu, a->addr_chg, b->addr_chg, a->inv_free, b->inv_free,
	     a->free_cb, b->free_cb, a->errors, b->errors, a->ps.invalidated_mrs,
	     b->ps.invalidated_mrs, a->gs_pins, b->gs_pins);
}

/*
 * Wait up to WAIT_S for n registrations revoked because of an address
 * change since s0: n more mmu invalidations, address changes and core
 * invalidations, and gpusim's live pins down to pins. *s1 is the last look.
 */
static int wait_revoked(const struct snap *s0, long long n, long long pins, struct snap *s1)
{
	double end = now_s() + WAIT_S;

	for (;;) {
		take(s1);
		if (s1->inv_mmu >= s0->inv_mmu + n && s1->addr_chg >= s0->addr_chg + n &&
		    s1->ps.invalidated_mrs >= s0->ps.invalidated_mrs + n && s1->gs_pins <= pins)
			break;
		if (now_s() > end)
			return 0;
		usleep(20000);
	}
	usleep(100000);		/* a second look catches counting twice */
	take(s1);
	return 1;
}

/*
 * From s0 to s1 exactly n MRs were revoked for an address change: n more
 * of each of invalidations_mmu_notifier, address_changes and the core's
 * num_invalidated_mrs.
 */
static int revoked_exactly(const struct snap *s0, const struct snap *s1, long long n)
{
	return s1->inv_mmu == s0->inv_mmu + n && s1->addr_chg == s0->addr_chg + n &&
	       s1->ps.invalidated_mrs == s0->ps.invalidated_mrs + n;
}

/*
 * For secs, nothing that an address change or a free would move moves:
 * returns 0 as soon as something does. *s1 is the last look.
 */
static int stays_quiet(const struct snap *s0, double secs, struct snap *s1)
{
	double end = now_s() + secs;

	do {
		take(s1);
		if (s1->inv_mmu != s0->inv_mmu || s1->addr_chg != s0->addr_chg ||
		    s1->inv_free != s0->inv_free || s1->free_cb != s0->free_cb ||
		    s1->ps.invalidated_mrs != s0->ps.invalidated_mrs || s1->gs_pins != s0->gs_pins)
			return 0;
		usleep(50000);
	} while (now_s() < end);
	return 1;
}

/*
 * gpusim pins per GPU registration: nv_mem holds its pin with the free
 * callback and its keeper (persistent; docs/architecture.md, "The keeper"),
 * nv_mem_nc (enable_invalidate=0) one persistent pin.
 */
/*
 * gpusim pins a revoked registration keeps until it is deregistered: the
 * revocation's work item gives the keeper back, but the pin with the free
 * callback only the pinning process can put (docs/module.md, "Which
 * process gives a pin back"): nv_mem 1, nv_mem_nc none.
 */
static int kept_pins(void)
{
	return pm_param_on("enable_invalidate") ? 1 : 0;
}

static int reg_pins(void)
{
	return pm_param_on("enable_invalidate") ? 2 : 1;
}

static int balanced(void)
{
	struct peer_stats s;

	return peer_stats(pm_name, &s) == 0 && core_all_released(&s);
}

/* Idle, except for CPU mappings and allocations of gpusim. */
static int settled(void)
{
	return pm_idle() && gs("live_pins") == 0 && gs("live_dma_mappings") == 0;
}

static void all_diag(void)
{
	pm_diag();
	gs_diag();
	peer_stats_diag(pm_name);
}

/* ---- setup ---- */

static void conn_setup(void)
{
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	hmr = ibv_reg_mr(c.pd, h, 2 * LEN, MR_ACCESS);
	if (!hmr)
		bail("host MR failed: %s", strerror(errno));
}

static void conn_teardown(void)
{
	ibv_dereg_mr(hmr);
	hmr = NULL;
	conn_close(&c);
}

/* Reload peermem with args, the connection closed meanwhile. */
static void reload(const char *args)
{
	conn_teardown();
	load_modules(args);
	conn_setup();
}

static int param_is(const char *want)
{
	char buf[16];

	return read_line(PARAM, buf, sizeof(buf)) == 0 && !strcmp(buf, want);
}

/* ---- gpusim ---- */

static int ginfo(const struct gmem *g, struct gpusim_info *inf)
{
	memset(inf, 0, sizeof(*inf));
	inf->handle = g->handle;
	return ioctl(fd, GPUSIM_IOC_INFO, inf) ? -errno : 0;
}

static void alloc_filled(struct gmem *g, uint32_t seed)
{
	if (gmem_alloc(fd, LEN, g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g->p, LEN, seed);
	memcpy(saved, g->p, LEN);
}

/* ---- RDMA ---- */

/* RDMA WRITE of len bytes of pattern seed from host memory to raddr of mr. */
static int write_to(struct ibv_mr *mr, const void *raddr, uint32_t len, uint32_t seed)
{
	int rc;

	fill(h, len, seed);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, len, (uintptr_t)raddr, mr->rkey);
	if (rc && conn_qps(&c))
		bail("cannot recreate the QPs");
	return rc;
}

/* RDMA READ of len bytes at raddr of mr into host memory at h + LEN. */
static int read_from(struct ibv_mr *mr, const void *raddr, uint32_t len)
{
	int rc;

	memset(h + LEN, 0, len);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h + LEN, len, (uintptr_t)raddr, mr->rkey);
	if (rc && conn_qps(&c))
		bail("cannot recreate the QPs");
	return rc;
}

/* ---- the checks ---- */

/* 1. munmap of a registered range revokes the MR. */
static void test_munmap(void)
{
	struct snap pre, s0, s1;
	struct gpusim_info inf;
	struct ibv_mr *mr;
	struct gmem g;
	uint8_t *old;
	int rc, r;

	alloc_filled(&g, 0x1111);
	take(&pre);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	rc = write_to(mr, g.p + 4096, 8192, 0x1212);
	ok(rc == 0 && !memcmp(g.p + 4096, h, 8192) && gs("live_pins") == pre.gs_pins + reg_pins(),
	   "munmap: a 256 KiB GPU MR works before (RDMA WRITE status %d, bytes landed, %d gpusim pins: one registration's)",
	   rc, reg_pins());

	take(&s0);
	old = g.p;
	ok(munmap(g.p, LEN) == 0, "munmap: munmap of the registered range succeeds");
	g.p = NULL;
	r = wait_revoked(&s0, 1, pre.gs_pins + kept_pins(), &s1);
	ok(r && revoked_exactly(&s0, &s1, 1),
	   "munmap: within %.0f s invalidations_mmu_notifier +1, address_changes +1, core num_invalidated_mrs +1 (got %+lld %+lld %+lld)",
	   WAIT_S, s1.inv_mmu - s0.inv_mmu, s1.addr_chg - s0.addr_chg,
	   s1.ps.invalidated_mrs - s0.ps.invalidated_mrs);
	if (!r)
		snap_diag("munmap", &s0, &s1);
	rc = ginfo(&g, &inf);
	ok(s1.gs_pins == pre.gs_pins + kept_pins() && pm_live_pins() == kept_pins() &&
	   pm_live_maps() == 0 && pm_live_regs() == 1 && rc == 0 && inf.pins == (unsigned)kept_pins() &&
	   inf.addr == 0,
	   "munmap: the GPU pages are unpinned while the MR is still registered, but for the pin with the free callback, which the deregistration puts (gpusim live_pins %lld, before %lld; INFO pins %u addr %#llx; peermem pins %lld maps %lld regs %lld)",
	   s1.gs_pins, pre.gs_pins, inf.pins, (unsigned long long)inf.addr, pm_live_pins(),
	   pm_live_maps(), pm_live_regs());
	ok(s1.free_cb == s0.free_cb && s1.inv_free == s0.inv_free && s1.gs_cb == s0.gs_cb,
	   "munmap: no free callback and no free invalidation (the memory is not freed)");
	rc = write_to(mr, old + 4096, 8192, 0x1313);
	ok(rc == IBV_WC_REM_ACCESS_ERR,
	   "munmap: RDMA WRITE to the revoked MR completes with status 10, remote access error (got %d, %s)",
	   rc, wc_str(rc));
	ok(ibv_dereg_mr(mr) == 0, "munmap: ibv_dereg_mr of the revoked MR succeeds");
	take(&s0);
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == s0.free_cb &&
	   gs("free_callbacks") == s0.gs_cb,
	   "munmap: GPUSIM_IOC_FREE of the unmapped allocation succeeds without a free callback");
	ok(wait_for(all_idle, 10) && balanced(),
	   "munmap: core counters balanced, peermem and gpusim idle");
	if (!all_idle() || !balanced())
		all_diag();
}

/* 2. mremap moving the whole mapping revokes the MR at the old address. */
static void test_mremap(void)
{
	struct snap pre, s0, s1;
	struct gpusim_info inf;
	struct ibv_mr *mr, *mr2;
	struct gmem g;
	uint8_t *old, *q;
	size_t hole_len = LEN + 2 * GPU_PAGE;
	void *hole, *r;
	int rc, w;

	alloc_filled(&g, 0x2121);
	hole = mmap(NULL, hole_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole == MAP_FAILED)
		bail("mmap: %s", strerror(errno));
	q = (uint8_t *)(((uintptr_t)hole + GPU_PAGE - 1) & ~(GPU_PAGE - 1));
	take(&pre);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	rc = write_to(mr, g.p + 100000, 4096, 0x2222);
	ok(rc == 0 && !memcmp(g.p + 100000, h, 4096),
	   "mremap: the GPU MR works before (RDMA WRITE status %d)", rc);
	memcpy(saved, g.p, LEN);

	take(&s0);
	old = g.p;
	r = mremap(g.p, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, q);
	ok(r == q, "mremap: the whole mapping moves to %p (got %p, %s)", (void *)q, r,
	   r == MAP_FAILED ? strerror(errno) : "ok");
	if (r != q)
		bail("mremap failed; the rest would mean nothing");
	g.p = q;
	w = wait_revoked(&s0, 1, pre.gs_pins + kept_pins(), &s1);
	ok(w && revoked_exactly(&s0, &s1, 1) && s1.gs_pins == pre.gs_pins + kept_pins(),
	   "mremap: within %.0f s the MR at the old address is revoked: invalidations_mmu_notifier +1, address_changes +1, core num_invalidated_mrs +1, its keeper released (got %+lld %+lld %+lld, pins %lld)",
	   WAIT_S, s1.inv_mmu - s0.inv_mmu, s1.addr_chg - s0.addr_chg,
	   s1.ps.invalidated_mrs - s0.ps.invalidated_mrs, s1.gs_pins - pre.gs_pins);
	if (!w)
		snap_diag("mremap", &s0, &s1);
	rc = ginfo(&g, &inf);
	ok(rc == 0 && inf.addr == (uintptr_t)q && !memcmp(q, saved, LEN),
	   "mremap: the allocation and its data followed the mapping (INFO addr %#llx)",
	   (unsigned long long)inf.addr);
	rc = write_to(mr, old + 100000, 4096, 0x2323);
	ok(rc == IBV_WC_REM_ACCESS_ERR && !memcmp(q, saved, LEN),
	   "mremap: RDMA WRITE to the old MR completes with status 10 and does not touch the memory (got %d, %s)",
	   rc, wc_str(rc));

	mr2 = ibv_reg_mr(c.pd, q, LEN, MR_ACCESS);
	ok(mr2 != NULL, "mremap: ibv_reg_mr at the new address works (errno %d)", mr2 ? 0 : errno);
	rc = mr2 ? write_to(mr2, q + 70000, 100000, 0x2424) : -1;
	ok(rc == 0 && !memcmp(q + 70000, h, 100000) && !memcmp(q, saved, 70000) &&
	   !memcmp(q + 170000, saved + 170000, LEN - 170000),
	   "mremap: RDMA WRITE through the new MR lands at the new address and nowhere else (status %d)", rc);
	ok(ibv_dereg_mr(mr) == 0 && mr2 && ibv_dereg_mr(mr2) == 0,
	   "mremap: ibv_dereg_mr of the old and the new MR succeeds");
	/* The new MR's watch pin, cached, would see the free below. */
	pm_flush();
	take(&s0);
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == s0.free_cb,
	   "mremap: GPUSIM_IOC_FREE without a free callback");
	gmem_drop(&g);
	munmap(hole, hole_len);
	ok(wait_for(all_idle, 10) && balanced(), "mremap: core counters balanced, all idle");
	if (!all_idle() || !balanced())
		all_diag();
}

/*
 * 3. mprotect of the whole range, and munmap of unrelated host memory
 * (the mappings right before and after the GPU range, and another buffer).
 */
static void test_ignored(void)
{
	size_t area_len = 3 * LEN + GPU_PAGE;
	struct snap s0, s1;
	struct ibv_mr *mr;
	struct gmem g;
	uint8_t *area, *q, *other;
	int rc, m1, m2, m3;

	area = mmap(NULL, area_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		bail("mmap: %s", strerror(errno));
	q = (uint8_t *)(((uintptr_t)area + 2 * GPU_PAGE - 1) & ~(GPU_PAGE - 1));
	memset(area, 0x5a, area_len);
	if (munmap(q, LEN) || gmem_alloc_at(fd, LEN, q, &g) || g.p != q)
		bail("cannot place a GPU allocation between two host mappings: %s", strerror(errno));
	fill(g.p, LEN, 0x3131);
	memcpy(saved, g.p, LEN);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	take(&s0);

	m1 = mprotect(g.p, LEN, PROT_READ);
	ok(m1 == 0, "ignored: mprotect(PROT_READ) of the whole registered range succeeds (%s)",
	   m1 ? strerror(errno) : "ok");
	m1 = munmap(area, q - area);
	m2 = munmap(q + LEN, area + area_len - (q + LEN));
	other = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	m3 = other == MAP_FAILED ? -1 : 0;
	if (!m3) {
		memset(other, 1, 1 << 20);
		m3 = munmap(other, 1 << 20);
	}
	ok(!m1 && !m2 && !m3,
	   "ignored: munmap of the host mappings ending at and starting at the range's edges, and of another host buffer");
	rc = stays_quiet(&s0, QUIET_S, &s1);
	ok(rc, "ignored: for %.0f s no invalidation, address change, free callback or unpin",
	   QUIET_S);
	if (!rc)
		snap_diag("ignored", &s0, &s1);
	rc = write_to(mr, g.p + GPU_PAGE - 100, 8192, 0x3232);
	ok(rc == 0 && !memcmp(g.p + GPU_PAGE - 100, h, 8192) &&
	   !memcmp(g.p, saved, GPU_PAGE - 100) &&
	   !memcmp(g.p + GPU_PAGE - 100 + 8192, saved + GPU_PAGE - 100 + 8192,
		   LEN - (GPU_PAGE - 100 + 8192)),
	   "ignored: RDMA WRITE still succeeds (status %d, %s) and the bytes land (read through the read-only mapping)",
	   rc, wc_str(rc));
	take(&s1);
	ok(s1.inv_mmu == s0.inv_mmu && s1.addr_chg == s0.addr_chg &&
	   s1.ps.invalidated_mrs == s0.ps.invalidated_mrs,
	   "ignored: counters unchanged after the RDMA WRITE too");
	ok(ibv_dereg_mr(mr) == 0 && gmem_free(fd, &g) == 0, "ignored: dereg and free succeed");
	gmem_drop(&g);
	ok(wait_for(all_idle, 10) && balanced(), "ignored: core counters balanced, all idle");
	if (!all_idle() || !balanced())
		all_diag();
}

/* 4. Two MRs on the same GPU range: one munmap revokes both. */
static void test_two(void)
{
	struct snap pre, s0, s1;
	struct ibv_mr *a, *b;
	struct gmem g;
	uint8_t *old;
	int ra, rb, w;

	alloc_filled(&g, 0x4141);
	take(&pre);
	a = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	b = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!a || !b)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	ra = write_to(a, g.p, 4096, 0x4242);
	rb = write_to(b, g.p + LEN - 4096, 4096, 0x4242);
	ok(ra == 0 && rb == 0 && gs("live_pins") == pre.gs_pins + 2 * reg_pins(),
	   "two MRs: both work before (status %d, %d), %d gpusim pins: two registrations'", ra, rb,
	   2 * reg_pins());
	take(&s0);
	old = g.p;
	ok(munmap(g.p, LEN) == 0, "two MRs: munmap of the range");
	g.p = NULL;
	w = wait_revoked(&s0, 2, pre.gs_pins + 2 * kept_pins(), &s1);
	ok(w && revoked_exactly(&s0, &s1, 2) && s1.gs_pins == pre.gs_pins + 2 * kept_pins(),
	   "two MRs: both revoked within %.0f s: invalidations_mmu_notifier +2, address_changes +2, core +2, both keepers released (got %+lld %+lld %+lld, pins %+lld)",
	   WAIT_S, s1.inv_mmu - s0.inv_mmu, s1.addr_chg - s0.addr_chg,
	   s1.ps.invalidated_mrs - s0.ps.invalidated_mrs, s1.gs_pins - pre.gs_pins);
	if (!w)
		snap_diag("two MRs", &s0, &s1);
	ra = write_to(a, old, 4096, 0x4343);
	rb = write_to(b, old + LEN - 4096, 4096, 0x4343);
	ok(ra == IBV_WC_REM_ACCESS_ERR && rb == IBV_WC_REM_ACCESS_ERR,
	   "two MRs: RDMA WRITE to each completes with status 10 (got %d, %d)", ra, rb);
	ok(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(b) == 0, "two MRs: both deregister");
	take(&s0);
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == s0.free_cb,
	   "two MRs: GPUSIM_IOC_FREE without a free callback");
	ok(wait_for(all_idle, 10) && balanced(), "two MRs: core counters balanced, all idle");
	if (!all_idle() || !balanced())
		all_diag();
}

/* 4b. Freed first (free callback invalidates), munmap afterwards: nothing more. */
static void test_free_then_munmap(void)
{
	struct snap s0, s1, s2;
	long long pins0;
	struct ibv_mr *mr;
	struct gmem g;
	uint8_t *old;
	double end;
	int rc;

	alloc_filled(&g, 0x5151);
	pins0 = gs("live_pins");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	take(&s0);
	rc = gmem_free(fd, &g);
	take(&s1);
	ok(rc == 0 && s1.free_cb == s0.free_cb + 1,
	   "free first: GPUSIM_IOC_FREE calls the free callback (free_callbacks %+lld)",
	   s1.free_cb - s0.free_cb);
	/*
	 * nv_mem's revocation runs in a work item after the free returned: the
	 * core's invalidate (counted in invalidations_gpu_free), then the PCI
	 * unmap and the keeper's put (docs/architecture.md, "The keeper"). Wait for
	 * all of it, the pins back to where they were, before asking the munmap
	 * to change nothing.
	 */
	end = now_s() + WAIT_S;
	while ((s1.ps.invalidated_mrs < s0.ps.invalidated_mrs + 1 || s1.inv_free < s0.inv_free + 1 ||
		s1.gs_pins != pins0) && now_s() < end) {
		usleep(20000);
		take(&s1);
	}
	ok(s1.inv_free == s0.inv_free + 1,
	   "free first: the revocation invalidated through the core, once (invalidations_gpu_free %+lld)",
	   s1.inv_free - s0.inv_free);
	ok(s1.ps.invalidated_mrs == s0.ps.invalidated_mrs + 1 && s1.inv_mmu == s0.inv_mmu &&
	   s1.addr_chg == s0.addr_chg && s1.gs_pins == pins0,
	   "free first: the core revoked the MR and every pin is released, no mmu invalidation or address change counted (gpusim live_pins %lld, %lld before the registration)",
	   s1.gs_pins, pins0);
	old = g.p;
	ok(munmap(g.p, LEN) == 0, "free first: munmap of the freed, still mapped range");
	g.p = NULL;
	rc = stays_quiet(&s1, QUIET_S, &s2);
	ok(rc, "free first: the munmap does nothing more for %.0f s (no mmu invalidation, no address change)",
	   QUIET_S);
	if (!rc)
		snap_diag("free first", &s1, &s2);
	rc = write_to(mr, old, 4096, 0x5252);
	ok(rc == IBV_WC_REM_ACCESS_ERR, "free first: RDMA WRITE completes with status 10 (got %d, %s)",
	   rc, wc_str(rc));
	ok(ibv_dereg_mr(mr) == 0, "free first: ibv_dereg_mr succeeds");
	ok(wait_for(all_idle, 10) && balanced(), "free first: core counters balanced, all idle");
	if (!all_idle() || !balanced())
		all_diag();
}

/*
 * 5. Nothing watches the address space (mmu_notifier=0, or
 * enable_invalidate=0): the MR of an unmapped range keeps reaching the GPU
 * memory, which is still allocated but mapped nowhere.
 */
static void test_unwatched(const char *args)
{
	struct snap pre, s0, s1;
	struct gpusim_info inf;
	struct ibv_mr *mr;
	struct gmem g;
	uint8_t *old;
	int rc, q;

	alloc_filled(&g, 0x6161);
	take(&pre);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		bail("[%s] ibv_reg_mr on GPU memory: %s", args, strerror(errno));
	take(&s0);
	old = g.p;
	ok(munmap(g.p, LEN) == 0, "[%s] munmap of the registered range", args);
	g.p = NULL;
	q = stays_quiet(&s0, QUIET_S, &s1);
	rc = ginfo(&g, &inf);
	ok(q && rc == 0 && inf.addr == 0 && inf.pins == (unsigned int)reg_pins() &&
	   s1.gs_pins == pre.gs_pins + reg_pins(),
	   "[%s] for %.0f s no invalidation and no address change; the allocation stays pinned and mapped nowhere (INFO addr %#llx pins %u)",
	   args, QUIET_S, (unsigned long long)inf.addr, inf.pins);
	if (!q)
		snap_diag(args, &s0, &s1);
	rc = write_to(mr, old + 8192, 8192, 0x6262);
	ok(rc == 0, "[%s] RDMA WRITE through the MR of the unmapped range succeeds (status %d, %s): the hazard",
	   args, rc, wc_str(rc));
	memcpy(saved + 8192, h, 8192);
	rc = read_from(mr, old, LEN);
	ok(rc == 0 && !memcmp(h + LEN, saved, LEN),
	   "[%s] RDMA READ returns the bytes the CPU wrote before the munmap with the WRITE's bytes in them: the MR still reaches the old GPU memory (status %d)",
	   args, rc);
	take(&s1);
	ok(s1.inv_mmu == s0.inv_mmu && s1.addr_chg == s0.addr_chg &&
	   s1.ps.invalidated_mrs == s0.ps.invalidated_mrs,
	   "[%s] still no invalidation counted after the RDMA", args);
	ok(ibv_dereg_mr(mr) == 0, "[%s] ibv_dereg_mr succeeds", args);
	take(&s0);
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == s0.free_cb,
	   "[%s] GPUSIM_IOC_FREE without a free callback", args);
	ok(wait_for(all_idle, 10) && balanced(), "[%s] core counters balanced, all idle", args);
	if (!all_idle() || !balanced())
		all_diag();
}

static void test_exit(void)
{
	struct snap s0, s1;
	int i, st;

	for (i = 0; i < 2; i++) {
		const char *first = i ? "/dev/gpusim" : "uverbs";

		take(&s0);
		st = exit_child_run(i, LEN, 0x7171);
		ok(st == 0, "exit (%s opened first): a child registers GPU memory and exits holding it (status %d)",
		   first, st);
		ok(wait_for(all_idle, 30), "exit (%s opened first): the MR, the pin and the memory are released",
		   first);
		take(&s1);
		ok(s1.inv_mmu == s0.inv_mmu && s1.addr_chg == s0.addr_chg,
		   "exit (%s opened first): the address-space teardown is ignored: invalidations_mmu_notifier and address_changes unchanged (%+lld, %+lld)",
		   first, s1.inv_mmu - s0.inv_mmu, s1.addr_chg - s0.addr_chg);
		ok(core_all_released(&s1.ps) && s1.ps.alloc_mrs == s0.ps.alloc_mrs + 1,
		   "exit (%s opened first): core counters balanced", first);
		diag("exit (%s first): %lld core invalidation(s), %lld free callback(s)", first,
		     s1.ps.invalidated_mrs - s0.ps.invalidated_mrs, s1.free_cb - s0.free_cb);
		if (!all_idle())
			all_diag();
	}
}

/*
 * 7. Registration racing munmap, inside peermem's acquire (after the pin,
 * which runs with no lock held), inside its get_pages delay, and inside
 * its dma_map delay (the core then holds the umem's mapping lock, so the
 * notifier's invalidation waits until the registration fails or is live).
 * In acquire, ibv_reg_mr must fail with EFAULT (peermem claims the
 * range, counted in registrations_stale, and fails get_pages: declined,
 * the core would ask nv_mem_nc; issue 22). Later, either ibv_reg_mr fails with EFAULT or the MR it returns
 * is revoked; both are accepted, one of them must happen.
 *
 * The main thread registers and a second thread unmaps, not the other way
 * round: in the rig, gpusim's nvidia_p2p_get_pages fails with EINVAL when
 * called from another thread than the one that allocated the memory
 * (peermem then declines and ibv_reg_mr fails with EFAULT without any
 * munmap): its process identity (kernel::current!().mm() in
 * tests/gpusim/state.rs) differs between threads of one process. For the
 * same reason no thread here allocates gpusim memory: an allocation made by
 * a thread that exits before the file is released makes KASAN report a
 * use-after-free of that thread's task_struct in gpusim's mmdrop.
 */
struct unmapper {
	void *p;
	double t0, t_unmap;
	const char *mark;	/* the peermem counter that moves when the window opens */
	long long mark0;
	int claimed, ret;
};

static void *unmap_thread(void *arg)
{
	struct unmapper *u = arg;

	/* 50 ms after the start, and not before peermem reached the window. */
	while (now_s() < u->t0 + 3 && (now_s() < u->t0 + 0.05 || pm(u->mark) == u->mark0))
		usleep(2000);
	u->claimed = pm(u->mark) > u->mark0;
	u->t_unmap = now_s();
	u->ret = munmap(u->p, LEN) ? -errno : 0;
	return NULL;
}

static void test_reg_race(const char *knob_name, const char *where)
{
	char knob_path[128];
	struct unmapper u = { 0 };
	struct snap s0, s1;
	struct ibv_mr *mr;
	struct gmem g;
	double t_end;
	pthread_t t;
	int err, knob, outcome_ok = 0, rc;
	long long decl0, gp0, stale0, nc0;
	int dma = !strcmp(knob_name, "inject_delay_dma_map_ms");
	/*
	 * In acquire the pin runs with no lock held: the munmap lands after
	 * the pin (page_tables_pinned moved), before acquire stores the table
	 * and returns. The only right outcome there is a declined range:
	 * acquire returns before the core has a ticket to invalidate, and an
	 * MR that came out of it would never be revoked (the watch fires once).
	 */
	int acq = !strcmp(knob_name, "inject_delay_acquire_ms");

	snprintf(knob_path, sizeof(knob_path), PMDBG "%s", knob_name);
	alloc_filled(&g, 0x8181);
	take(&s0);
	decl0 = pm("registrations_declined");
	stale0 = pm("registrations_stale");
	nc0 = pm_nc("registrations_acquired");
	gp0 = gs("calls/get_pages");
	knob = write_str(knob_path, "300");
	ok(knob == 0, "reg race %s: %s set to 300 (%s)", where, knob_name, knob ? strerror(-knob) : "ok");
	u.p = g.p;
	u.mark = acq ? "page_tables_pinned" : "registrations_acquired";
	u.mark0 = pm(u.mark);
	u.t0 = now_s();
	if (pthread_create(&t, NULL, unmap_thread, &u))
		bail("pthread_create failed");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	err = mr ? 0 : errno;
	t_end = now_s();
	pthread_join(t, NULL);
	g.p = NULL;
	write_str(knob_path, "0");
	diag("reg race %s: munmap %.0f ms after the start (%s), ibv_reg_mr returned after %.0f ms: %s",
	     where, (u.t_unmap - u.t0) * 1000,
	     u.claimed ? "peermem had claimed the range" : "peermem had NOT claimed the range yet",
	     (t_end - u.t0) * 1000, mr ? "registered" : strerror(err));
	ok(u.ret == 0 && u.claimed && u.t_unmap < t_end,
	   "reg race %s: munmap ran after peermem %s, while ibv_reg_mr was in progress",
	   where, acq ? "pinned the range" : "claimed the range");
	if (!u.claimed)
		diag("reg race %s: registrations_declined %+lld, gpusim calls/get_pages %+lld",
		     where, pm("registrations_declined") - decl0, gs("calls/get_pages") - gp0);

	if (!mr && err == EFAULT) {
		/*
		 * Revoked before the core's get_pages, or before dma_map: then
		 * peermem had a ticket and the invalidation it sent found the
		 * umem never mapped (counted in invalidations_mmu_notifier or
		 * not, never by the core).
		 */
		double end = now_s() + WAIT_S;

		do {
			take(&s1);
			if (s1.addr_chg >= s0.addr_chg + 1 && s1.gs_pins <= s0.gs_pins)
				break;
			usleep(20000);
		} while (now_s() < end);
		usleep(100000);
		take(&s1);
		outcome_ok = s1.addr_chg == s0.addr_chg + 1 &&
			     (!acq || (pm("registrations_stale") == stale0 + 1 &&
				      pm("registrations_declined") == decl0)) &&
			     pm_nc("registrations_acquired") == nc0 &&
			     (s1.inv_mmu == s0.inv_mmu || (dma && s1.inv_mmu == s0.inv_mmu + 1)) &&
			     s1.ps.invalidated_mrs == s0.ps.invalidated_mrs &&
			     s1.ps.alloc_mrs == s0.ps.alloc_mrs;
		diag("reg race %s: outcome: ibv_reg_mr failed with EFAULT (revoked before %s; invalidations_mmu_notifier %+lld, core invalidate calls %+lld)",
		     where, dma ? "dma_map" : "get_pages", s1.inv_mmu - s0.inv_mmu,
		     s1.ps.free_callbacks - s0.ps.free_callbacks);
		if (!outcome_ok)
			snap_diag("reg race (EFAULT)", &s0, &s1);
	} else if (mr) {
		int w = wait_revoked(&s0, 1, s0.gs_pins, &s1);

		rc = write_to(mr, u.p, 4096, 0x8282);
		outcome_ok = !acq && w && revoked_exactly(&s0, &s1, 1) && rc == IBV_WC_REM_ACCESS_ERR;
		diag("reg race %s: outcome: ibv_reg_mr succeeded; the MR was %srevoked (RDMA WRITE status %d)",
		     where, w ? "" : "NOT ", rc);
		if (!outcome_ok)
			snap_diag("reg race (registered)", &s0, &s1);
		if (ibv_dereg_mr(mr)) {
			diag("reg race %s: ibv_dereg_mr failed: %s", where, strerror(errno));
			outcome_ok = 0;
		}
	} else {
		diag("reg race %s: ibv_reg_mr failed with %s, neither outcome", where, strerror(err));
	}
	ok(outcome_ok,
	   "reg race %s: either ibv_reg_mr fails with EFAULT (address_changes +1, no core invalidation, the core never mapped it) or it succeeds and the MR is revoked within %.0f s (address_changes, mmu and core invalidations +1, RDMA WRITE status 10)",
	   where, WAIT_S);
	ok(wait_for(settled, 10) && balanced(), "reg race %s: nothing registered or pinned, core counters balanced",
	   where);
	if (!settled() || !balanced())
		all_diag();
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == s0.free_cb && wait_for(all_idle, 10),
	   "reg race %s: GPUSIM_IOC_FREE without a free callback, all idle", where);
	if (!all_idle())
		all_diag();
}

/*
 * 7b. Issue 22: another gpusim allocation is moved (mremap MREMAP_FIXED)
 * onto the address while peermem's acquire holds its pins. nv_mem's
 * watch fires; before issue 22 it declined the range and the core gave
 * it to nv_mem_nc, whose persistent pin of the *new* allocation nothing
 * watches (nc/registrations_acquired +1, an MR never revoked). Now nv_mem
 * claims the range and get_pages fails: ibv_reg_mr fails with EFAULT,
 * nv_mem_nc is never asked.
 */
struct mover {
	void *from, *to;
	long long mark0;
	double t0;
	int claimed, ret;
};

static void *move_thread(void *arg)
{
	struct mover *m = arg;

	while (now_s() < m->t0 + 3 && (now_s() < m->t0 + 0.05 || pm("page_tables_pinned") == m->mark0))
		usleep(2000);
	m->claimed = pm("page_tables_pinned") > m->mark0;
	m->ret = mremap(m->from, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, m->to) == MAP_FAILED ? -errno : 0;
	return NULL;
}

static void test_acquire_moved(void)
{
	struct mover m = { 0 };
	struct ibv_mr *mr;
	struct gmem g, g2;
	long long stale0, nc0, ncdecl0;
	pthread_t t;
	int err;

	alloc_filled(&g, 0x8383);
	alloc_filled(&g2, 0x8484);
	stale0 = pm("registrations_stale");
	nc0 = pm_nc("registrations_acquired");
	ncdecl0 = pm_nc("registrations_declined");
	write_str(PMDBG "inject_delay_acquire_ms", "300");
	m.from = g2.p;
	m.to = g.p;
	m.mark0 = pm("page_tables_pinned");
	m.t0 = now_s();
	if (pthread_create(&t, NULL, move_thread, &m))
		bail("pthread_create failed");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	err = mr ? 0 : errno;
	pthread_join(t, NULL);
	write_str(PMDBG "inject_delay_acquire_ms", "0");
	ok(m.ret == 0 && m.claimed,
	   "moved in acquire: another allocation mremapped onto the range after peermem pinned it (%s)",
	   m.ret ? strerror(-m.ret) : "ok");
	ok(!mr && err == EFAULT, "moved in acquire: ibv_reg_mr fails with EFAULT (%s)",
	   mr ? "registered" : strerror(err));
	ok(pm("registrations_stale") == stale0 + 1 && pm_nc("registrations_acquired") == nc0 &&
	   pm_nc("registrations_declined") == ncdecl0,
	   "moved in acquire: nv_mem claimed the changed range (registrations_stale %+lld); nv_mem_nc was never asked (acquired %+lld, declined %+lld)",
	   pm("registrations_stale") - stale0, pm_nc("registrations_acquired") - nc0,
	   pm_nc("registrations_declined") - ncdecl0);
	if (mr)
		ibv_dereg_mr(mr);
	ok(wait_for(settled, 10) && balanced(), "moved in acquire: nothing registered or pinned, core counters balanced");
	if (!settled())
		all_diag();
	/* g2's allocation now lives at g.p; g's allocation lost its mapping. */
	err = gmem_free(fd, &g) == 0 && gmem_free(fd, &g2) == 0;
	munmap(g.p, LEN);
	ok(err && wait_for(all_idle, 10), "moved in acquire: both allocations freed and unmapped, all idle");
	if (!all_idle())
		all_diag();
}

/*
 * 8. Race loop: even rounds munmap racing ibv_dereg_mr; odd rounds
 * GPUSIM_IOC_FREE racing munmap of a registered range.
 */
struct oprace {
	struct gmem g;
	useconds_t after;
	int free;	/* 1: GPUSIM_IOC_FREE, 0: munmap */
	int ret;
};

static void *op_thread(void *arg)
{
	struct oprace *o = arg;

	usleep(o->after);
	o->ret = o->free ? gmem_free(fd, &o->g) : (munmap(o->g.p, o->g.len) ? -errno : 0);
	return NULL;
}

static void test_race_loop(void)
{
	struct snap l0, l1, s0, s1;
	int i, bad = 0, by_free = 0, by_mmu = 0, even_inval = 0, doubled = 0;

	take(&l0);
	for (i = 0; i < ROUNDS; i++) {
		int k = (i / 2) % 4, dr = 0, mu = 0, rc;
		struct oprace o = { .free = i & 1, .after = (useconds_t)k * 700 };
		struct ibv_mr *mr;
		pthread_t t;

		gs_knob("delay_us", i < ROUNDS / 2 ? "2000" : "0");
		alloc_filled(&o.g, 0x9000 + i);
		mr = ibv_reg_mr(c.pd, o.g.p, LEN, MR_ACCESS);
		if (!mr) {
			diag("round %d: ibv_reg_mr failed: %s", i, strerror(errno));
			bad++;
			gmem_free(fd, &o.g);
			gmem_drop(&o.g);
			continue;
		}
		take(&s0);
		if (pthread_create(&t, NULL, op_thread, &o))
			bail("pthread_create failed");
		usleep((3 - k) * 700);
		if (i & 1)
			mu = munmap(o.g.p, LEN) ? -errno : 0;
		else
			dr = ibv_dereg_mr(mr);
		pthread_join(t, NULL);
		if (o.ret || mu || dr) {
			diag("round %d: %s returned %d, %s %d", i, o.free ? "free" : "munmap", o.ret,
			     o.free ? "munmap" : "dereg", o.free ? mu : dr);
			bad++;
		}
		if (i & 1) {
			/* Freed and unmapped with the MR live: revoked once, by either path. */
			double end = now_s() + WAIT_S;

			do {
				take(&s1);
				if (s1.ps.invalidated_mrs >= s0.ps.invalidated_mrs + 1 &&
				    s1.inv_free + s1.inv_mmu >= s0.inv_free + s0.inv_mmu + 1)
					break;
				usleep(20000);
			} while (now_s() < end);
			rc = write_to(mr, (void *)o.g.p, 4096, 0x9999);
			take(&s1);
			if (s1.ps.invalidated_mrs != s0.ps.invalidated_mrs + 1 || rc == 0) {
				diag("round %d: the core did not invalidate the MR exactly once (RDMA WRITE status %d)",
				     i, rc);
				snap_diag("round", &s0, &s1);
				bad++;
			} else if (s1.inv_free + s1.inv_mmu != s0.inv_free + s0.inv_mmu + 1) {
				/* Both paths called the core's invalidate; it invalidated once. */
				diag("round %d: peermem sent %lld invalidations (free %+lld, mmu %+lld) for one MR; the core invalidated it once (%lld invalidate calls)",
				     i, s1.inv_free + s1.inv_mmu - s0.inv_free - s0.inv_mmu,
				     s1.inv_free - s0.inv_free, s1.inv_mmu - s0.inv_mmu,
				     s1.ps.free_callbacks - s0.ps.free_callbacks);
				doubled++;
			}
			by_free += s1.inv_free > s0.inv_free;
			by_mmu += s1.inv_mmu > s0.inv_mmu;
			if (ibv_dereg_mr(mr)) {
				diag("round %d: ibv_dereg_mr failed: %s", i, strerror(errno));
				bad++;
			}
		}
		if (!wait_for(settled, WAIT_S)) {
			diag("round %d: not settled", i);
			all_diag();
			bad++;
		}
		if (!(i & 1)) {
			/* Unmapped, still allocated: nothing pins it any more. */
			take(&s1);
			even_inval += s1.ps.invalidated_mrs > s0.ps.invalidated_mrs;
			if (gmem_free(fd, &o.g) || pm("free_callbacks") != s1.free_cb) {
				diag("round %d: free after the race failed or made a free callback", i);
				bad++;
			}
		}
		o.g.p = NULL;	/* unmapped either way */
	}
	gs_knob("delay_us", "0");
	take(&l1);
	diag("race loop: free/munmap rounds revoked by the free callback %d, by the notifier %d, by both (redundant invalidate call) %d; munmap/dereg rounds with a core invalidation %d; errors %+lld",
	     by_free, by_mmu, doubled, even_inval, l1.errors - l0.errors);
	ok(bad == 0,
	   "race loop: %d rounds of munmap racing ibv_dereg_mr and GPUSIM_IOC_FREE racing munmap: every call succeeds, each MR freed and unmapped while live is invalidated by the core exactly once and RDMA to it fails",
	   ROUNDS);
	ok(wait_for(all_idle, WAIT_S), "race loop: nothing registered, pinned, mapped, allocated or alive");
	if (!all_idle())
		all_diag();
	ok(balanced(), "race loop: core counters balanced");
	ok(pm("errors") == l0.errors, "race loop: peermem counted no error (%+lld)", pm("errors") - l0.errors);
}

int main(void)
{
	struct stat st;

	rxe_up();
	load_modules(NULL);
	ok(stat(PARAM, &st) == 0 && (st.st_mode & 0777) == 0444 && (param_is("Y") || param_is("1")),
	   "peermem loaded (client %s) with parameter mmu_notifier, read-only, on by default", pm_name);
	fd = open("/dev/gpusim", O_RDWR);
	h = aligned_alloc(4096, 2 * LEN);
	saved = malloc(LEN);
	if (fd < 0 || !h || !saved)
		bail("cannot open /dev/gpusim or allocate host memory");
	memset(h, 0, 2 * LEN);
	conn_setup();

	test_munmap();
	test_mremap();
	test_ignored();
	test_two();
	test_free_then_munmap();

	reload("mmu_notifier=0");
	ok(param_is("N") || param_is("0"), "peermem reloaded with mmu_notifier=0");
	test_unwatched("mmu_notifier=0");
	reload("enable_invalidate=0");
	test_unwatched("enable_invalidate=0");
	reload(NULL);
	ok(param_is("Y") || param_is("1"), "peermem reloaded with its defaults (mmu_notifier on)");

	test_exit();
	test_reg_race("inject_delay_acquire_ms", "in acquire");
	test_acquire_moved();
	test_reg_race("inject_delay_get_pages_ms", "in get_pages");
	test_reg_race("inject_delay_dma_map_ms", "in dma_map");
	test_race_loop();

	conn_teardown();
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(run("rmmod peermem") == 0, "rmmod peermem");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
