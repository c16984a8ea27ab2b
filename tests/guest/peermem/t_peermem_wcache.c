// SPDX-License-Identifier: GPL-2.0
/*
 * The watch-pin cache (issue 26; docs/module.md, "The watch-pin cache"):
 * a deregistered nv_mem range keeps its pin with the free callback and
 * its address watch, and the next registration of the same range by the
 * same process takes only the keeper. Checked here, with gpusim's RM lock
 * on (the default):
 *  - a hit pins once (gpusim's call counts), its MR moves the data, and
 *    the keeper, which keeps memory, is put at every deregistration;
 *  - a cached pin keeps no memory: freeing it calls the callback, drops
 *    the entry, and the memory is freed at once;
 *  - munmap drops the entry, and a registration of new memory mapped at
 *    the same address (before the entry's work item ran) is no hit and
 *    moves the new memory's data;
 *  - a registration taken from the cache is revoked on munmap and on GPU
 *    free as any other;
 *  - a different range (another start, or the same start and another
 *    length), or another process, is no hit;
 *  - a free while a hit waits for its keeper declines it, nothing held;
 *  - the bounds: the oldest entry goes when the cache is full
 *    (watch_cache=2), a range over watch_cache_mib is not cached,
 *    watch_cache=0 caches nothing, out-of-range values fail the load;
 *  - the flush file and process exit. Unload with entries cached, and
 *    what another process may do to them: t_peermem_identity.
 */
#include "peermem_test.h"

#define LEN (1024 * 1024UL)		/* 16 GPU pages */

static long long calls(const char *what)
{
	char name[64];

	snprintf(name, sizeof(name), "calls/%s", what);
	return gs(name);
}

/* gpusim's pin calls of both kinds so far. */
static long long pin_calls(void)
{
	return calls("get_pages") + calls("get_pages_persistent");
}

static int no_entries(void)
{
	return pm_cached() == 0;
}

/* Free a gpusim allocation and drop its mapping. */
static void gmem_gone(int fd, struct gmem *g)
{
	gmem_free(fd, g);
	gmem_drop(g);
}

/* peermem loaded again with args; a new loopback and host MR of LEN bytes. */
static int reload_with(const char *args, struct conn *c, uint8_t **h, struct ibv_mr **hmr)
{
	load_modules(args);
	return gpusim_and_host_mr(c, LEN, h, hmr);
}

static void loopback_end(struct conn *c, struct ibv_mr *hmr)
{
	ibv_dereg_mr(hmr);
	conn_close(c);
}

struct keeper_race {
	struct conn *c;
	void *p;
	struct ibv_mr *mr;
	int err;
};

static void *race_reg(void *arg)
{
	struct keeper_race *r = arg;

	r->mr = ibv_reg_mr(r->c->pd, r->p, LEN, MR_ACCESS);
	r->err = r->mr ? 0 : errno;
	return NULL;
}

/*
 * A registration taken from the cache was just revoked by `what` (counted
 * in `counter`, which read `before`): once the revocation's work item
 * ran, an RDMA READ through it fails. Deregisters it.
 */
static void hit_revoked(struct conn *c, struct ibv_mr *hmr, uint8_t *h, struct ibv_mr *mr, void *p,
			const char *counter, long long before, const char *what)
{
	int settled = wait_for(pm_no_keepers, 10), st;
	long long d = pm(counter) - before;

	ok(settled && d == 1, "%s: the hit's MR is revoked (%s %+lld)", what, counter, d);
	st = mr ? rdma_op_renew(c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)p, mr->rkey) : -1;
	ok(st == IBV_WC_REM_ACCESS_ERR, "%s: an RDMA READ through it fails (status %d)", what, st);
	if (mr)
		ibv_dereg_mr(mr);
}

/* What happens while a hit waits for its keeper (during_hit()). */
struct cause {
	int fd;
	struct gmem *g;
	int unmap;	/* munmap the range; else free the memory */
};

/*
 * Register [p, p + LEN) (a hit) in a thread held after its keeper pin
 * (inject_delay_acquire_ms) while the cause runs: r holds the
 * registration's outcome; returns the cause's (0 or -errno).
 */
static int during_hit(struct conn *c, void *p, struct keeper_race *r, const struct cause *ca)
{
	long long entered = read_ll(PMDBG "inject/inject_delay_acquire_ms.entered");
	pthread_t t;
	int rc;

	r->c = c;
	r->p = p;
	r->mr = NULL;
	write_str(PMDBG "inject_delay_acquire_ms", "500");
	pthread_create(&t, NULL, race_reg, r);
	while (read_ll(PMDBG "inject/inject_delay_acquire_ms.entered") == entered)
		usleep(2000);
	rc = ca->unmap ? (munmap(p, LEN) ? -errno : 0) : gmem_free(ca->fd, ca->g);
	pthread_join(t, NULL);
	write_str(PMDBG "inject_delay_acquire_ms", "0");
	return rc;
}

int main(void)
{
	long long pins0, hits0, ev0, fcb0, inv0, park0, d0;
	struct gmem g, g2, g3, g4;
	struct ibv_mr *hmr, *mr;
	struct conn c;
	uint8_t *h;
	int fd, rc, st;
	pid_t pid;

	rxe_up();
	load_modules(NULL);
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);
	ok(read_ll("/sys/module/peermem/parameters/watch_cache") == 32 &&
	   read_ll("/sys/module/peermem/parameters/watch_cache_mib") == 256,
	   "defaults: watch_cache=32 entries, watch_cache_mib=256");
	if (gmem_alloc(fd, LEN, &g))
		bail("gpusim allocation failed");
	fill(g.p, LEN, 1);

	/* First registration: two pins (watch and keeper); deregistered, the watch pin stays. */
	pins0 = pin_calls();
	park0 = pm("watch_cache_parked");
	rc = reg_dereg(&c, g.p, LEN);
	pins0 = pin_calls() - pins0;
	ok(rc == 0 && pins0 == 2,
	   "a first registration pins twice (the pin with the free callback and the keeper): %+lld", pins0);
	ok(pm("watch_cache_parked") == park0 + 1 && pm_cached() == 1 && gs("live_pins") == 1 &&
	   gs("live_persistent_pins") == 0 && pm_live_regs() == 0 && pm_live_keepers() == 0,
	   "deregistered: cached (1 entry), one pin left (not persistent: the keeper was put), nothing registered (pins %lld, persistent %lld)",
	   gs("live_pins"), gs("live_persistent_pins"));

	/* The same range again: one pin, and the MR works. */
	pins0 = pin_calls();
	hits0 = pm("watch_cache_hits");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	pins0 = pin_calls() - pins0;
	ok(mr && pins0 == 1 && pm("watch_cache_hits") == hits0 + 1 && pm_cached() == 0 &&
	   gs("live_persistent_pins") == 1,
	   "the same range again: a hit, one pin (the keeper: %+lld pin calls), the entry taken", pins0);
	if (!mr)
		bail("the hit's ibv_reg_mr failed: %s", strerror(errno));
	fill(h, LEN, 2);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && check(g.p, LEN, 2), "the hit's MR: an RDMA WRITE of 1 MiB lands in the GPU memory (status %d)", rc);
	fill(g.p, LEN, 3);
	memset(h, 0, LEN);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && check(h, LEN, 3), "the hit's MR: an RDMA READ of 1 MiB reads it (status %d)", rc);
	ok(ibv_dereg_mr(mr) == 0 && pm_cached() == 1 && gs("live_persistent_pins") == 0,
	   "deregistered again: back in the cache, the keeper put");

	/* A different range (same memory, other start) is no hit. */
	pins0 = pin_calls();
	hits0 = pm("watch_cache_hits");
	rc = reg_dereg(&c, g.p + GPU_PAGE, LEN - GPU_PAGE);
	pins0 = pin_calls() - pins0;
	ok(rc == 0 && pins0 == 2 && pm("watch_cache_hits") == hits0 && pm_cached() == 2,
	   "a different range of the same memory is no hit: two pins (%+lld), a second entry", pins0);

	/* Another process: no hit (its address space is another). */
	hits0 = pm("watch_cache_hits");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct conn cc;

		if (conn_open(&cc))
			_exit(2);
		_exit(reg_dereg(&cc, g.p, LEN) == 0 ? 0 : 3);
	}
	st = -1;
	waitpid(pid, &st, 0);
	/* The child's own entry, if its mapping came along, goes with its memory or the flush below. */
	ok(pm("watch_cache_hits") == hits0,
	   "another process registering the same address is no hit (child status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);

	/* Two registrations of the range at once: one hit, one not; one entry kept. */
	{
		struct ibv_mr *m1, *m2;
		long long pins;

		hits0 = pm("watch_cache_hits");
		m1 = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		m2 = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		hits0 = pm("watch_cache_hits") - hits0;
		rc = (m1 ? ibv_dereg_mr(m1) : -1) | (m2 ? ibv_dereg_mr(m2) : -1);
		pins = gs("live_pins");
		ok(m1 && m2 && rc == 0 && hits0 == 1 && pins == 2 && pm_cached() == 2,
		   "the range registered twice at once: one hit, and once both are deregistered one entry for it (pins %lld: it and the other range's; hits %+lld)",
		   pins, hits0);
	}

	/* The same start, another length: no hit (the entry is its range's). */
	pins0 = pin_calls();
	hits0 = pm("watch_cache_hits");
	rc = reg_dereg(&c, g.p, LEN - GPU_PAGE);
	pins0 = pin_calls() - pins0;
	ok(rc == 0 && pins0 == 2 && pm("watch_cache_hits") == hits0 && pm_cached() == 3,
	   "the same start with another length is no hit: two pins (%+lld), a third entry", pins0);

	/* The flush file: 1 drops every entry, anything else is refused. */
	ok(write_str(PMDBG "watch_cache_flush", "2") == -EINVAL, "watch_cache_flush: 2 is refused with EINVAL");
	{
		int f = open(PMDBG "watch_cache_flush", O_WRONLY);

		ok(f >= 0 && write(f, "0\n", 2) < 0 && errno == EINVAL && write(f, "x", 1) < 0 &&
		   errno == EINVAL && write(f, "1\n", 2) == 2 && write(f, "1\n", 2) == 2,
		   "watch_cache_flush: each write is a whole value (\"1\\n\" twice on one open file works; 0 and junk are refused)");
		if (f >= 0)
			close(f);
		/* Cache the two ranges again for the flush below. */
		reg_dereg(&c, g.p, LEN);
		reg_dereg(&c, g.p + GPU_PAGE, LEN - GPU_PAGE);
	}
	ev0 = pm("watch_cache_evicted");
	rc = write_str(PMDBG "watch_cache_flush", "1");
	ev0 = pm("watch_cache_evicted") - ev0;
	ok(rc == 0 && pm_cached() == 0 && ev0 >= 2 && gs("live_pins") == 0 && pm_idle(),
	   "watch_cache_flush: every entry dropped, every pin put (evicted %+lld)", ev0);

	/* A cached pin keeps no memory: the free calls the callback, the memory goes at once. */
	ok(reg_dereg(&c, g.p, LEN) == 0 && pm_cached() == 1, "cached again");
	fcb0 = pm("free_callbacks");
	rc = gmem_free(fd, &g);
	{
		long long allocs = gs("live_allocs"), pins = gs("live_pins");

		ok(rc == 0 && pm("free_callbacks") == fcb0 + 1 && allocs == 0 && pins == 0,
		   "GPU free of cached memory: the free callback comes, and the memory and the pin are gone when the free returns (allocs %lld, pins %lld)",
		   allocs, pins);
	}
	ok(wait_for(no_entries, 5) && pm_idle(), "... and its entry is dropped (its work item)");
	gmem_drop(&g);

	/* munmap drops the entry; new memory at the address is no hit, even before the entry's work item ran. */
	if (gmem_alloc(fd, LEN, &g2))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, g2.p, LEN) == 0 && pm_cached() == 1, "munmap: a range cached");
	write_str(PMDBG "inject_delay_address_work_ms", "1000");
	ok(munmap(g2.p, LEN) == 0, "munmap: the cached range unmapped (its work item held back 1 s)");
	rc = gmem_alloc_at(fd, LEN, g2.p, &g3);
	ok(rc == 0 && g3.p == g2.p, "munmap: other GPU memory mapped at the same address (%d)", rc);
	if (rc || g3.p != g2.p)
		bail("cannot map gpusim memory at a fixed address");
	fill(g3.p, LEN, 4);
	pins0 = pin_calls();
	hits0 = pm("watch_cache_hits");
	mr = ibv_reg_mr(c.pd, g3.p, LEN, MR_ACCESS);
	pins0 = pin_calls() - pins0;
	hits0 = pm("watch_cache_hits") - hits0;
	ok(mr && hits0 == 0 && pins0 == 2,
	   "munmap: registering the address again is no hit (pins %+lld, hits %+lld)", pins0, hits0);
	memset(h, 0, LEN);
	rc = mr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g3.p, mr->rkey) : -1;
	ok(rc == 0 && check(h, LEN, 4), "munmap: the new MR reads the new memory (status %d)", rc);
	write_str(PMDBG "inject_delay_address_work_ms", "0");
	ok(wait_for(no_entries, 10) && gs("live_pins") == 2,
	   "munmap: the unmapped range's entry is dropped, its pin put (pins %lld: the new MR's two)", gs("live_pins"));

	/* A registration taken from the cache is revoked on munmap as any other. */
	if (mr)
		ibv_dereg_mr(mr);
	ok(pm_cached() == 1, "revocation: the new range cached");
	mr = ibv_reg_mr(c.pd, g3.p, LEN, MR_ACCESS);
	inv0 = pm("invalidations_mmu_notifier");
	ok(mr && pm_cached() == 0 && munmap(g3.p, LEN) == 0, "revocation: a hit registered, then its range unmapped");
	hit_revoked(&c, hmr, h, mr, g3.p, "invalidations_mmu_notifier", inv0, "revocation by munmap");
	ok(pm_cached() == 0, "revocation: a revoked registration is not cached");
	g3.p = NULL;
	gmem_free(fd, &g3);
	gmem_free(fd, &g2);

	/* ... and on GPU free. */
	if (gmem_alloc(fd, LEN, &g4))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, g4.p, LEN) == 0 && (mr = ibv_reg_mr(c.pd, g4.p, LEN, MR_ACCESS)) != NULL &&
	   pm_cached() == 0, "GPU free: a hit registered");
	inv0 = pm("invalidations_gpu_free");
	ok(gmem_free(fd, &g4) == 0, "GPU free: the hit's memory freed");
	hit_revoked(&c, hmr, h, mr, g4.p, "invalidations_gpu_free", inv0, "GPU free");
	gmem_drop(&g4);
	ok(pm_cached() == 0 && wait_for(all_idle, 10), "GPU free: nothing cached, pinned or left");

	/* A free while a hit waits for its keeper: declined, nothing held. */
	if (gmem_alloc(fd, LEN, &g4))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, g4.p, LEN) == 0 && pm_cached() == 1, "free during a hit: cached");
	{
		struct cause ca = { .fd = fd, .g = &g4 };
		struct keeper_race r;

		hits0 = pm("watch_cache_hits");
		d0 = pm("registrations_declined");
		fcb0 = pm("free_callbacks");
		rc = during_hit(&c, g4.p, &r, &ca);
		ok(rc == 0 && pm("watch_cache_hits") == hits0 + 1 && pm("free_callbacks") == fcb0 + 1 &&
		   pm("registrations_declined") == d0 + 1 && pm_live_regs() == 0 && pm_live_keepers() == 0,
		   "free during a hit: the hit, waiting for its keeper, is declined by %s when the memory is freed (callbacks %+lld, declined %+lld; the MR %s, errno %d)",
		   pm_name, pm("free_callbacks") - fcb0, pm("registrations_declined") - d0,
		   r.mr ? "made by another client" : "failed", r.err);
		if (r.mr)
			ibv_dereg_mr(r.mr);
	}
	gmem_drop(&g4);
	ok(wait_for(all_idle, 10), "free during a hit: nothing cached, pinned or left");

	/* munmap while a hit waits for its keeper: the registration fails (EFAULT), nothing held. */
	if (gmem_alloc(fd, LEN, &g4))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, g4.p, LEN) == 0 && pm_cached() == 1, "munmap during a hit: cached");
	{
		struct cause ca = { .unmap = 1 };
		struct keeper_race r;
		long long stale0 = pm("registrations_stale");

		hits0 = pm("watch_cache_hits");
		rc = during_hit(&c, g4.p, &r, &ca);
		hits0 = pm("watch_cache_hits") - hits0;
		stale0 = pm("registrations_stale") - stale0;
		ok(rc == 0 && hits0 == 1 && !r.mr && r.err == EFAULT && stale0 == 1,
		   "munmap during a hit: the registration fails with EFAULT, counted stale (hits %+lld, stale %+lld, errno %d)",
		   hits0, stale0, r.err);
		if (r.mr)
			ibv_dereg_mr(r.mr);
	}
	g4.p = NULL;
	gmem_free(fd, &g4);
	ok(wait_for(all_idle, 10) && pm_cached() == 0, "munmap during a hit: nothing cached, pinned or left");

	/* GPU free while release runs (before it parks): not cached, nothing left. */
	if (gmem_alloc(fd, LEN, &g4))
		bail("gpusim allocation failed");
	mr = ibv_reg_mr(c.pd, g4.p, LEN, MR_ACCESS);
	{
		struct race fr = { .fd = fd, .g = g4, .free_after = 200000 };
		pthread_t t;

		park0 = pm("watch_cache_parked");
		write_str(PMDBG "inject_delay_release_ms", "600");
		pthread_create(&t, NULL, race_free, &fr);
		rc = mr ? ibv_dereg_mr(mr) : -1;
		pthread_join(t, NULL);
		write_str(PMDBG "inject_delay_release_ms", "0");
		park0 = pm("watch_cache_parked") - park0;
		ok(mr && rc == 0 && fr.free_ret == 0 && park0 == 0,
		   "GPU free during release: the deregistration succeeds, nothing parked (parked %+lld)", park0);
	}
	gmem_drop(&g4);
	ok(wait_for(all_idle, 10), "GPU free during release: nothing cached, pinned or left");

	/* Process exit with an entry cached: the memory goes with the process, and the entry with it. */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct conn cc;
		struct gmem gc;

		child_own_gpu(&cc, LEN, &gc);
		_exit(reg_dereg(&cc, gc.p, LEN) == 0 && pm_cached() == 1 ? 0 : 3);
	}
	st = -1;
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0 && wait_for(no_entries, 10) && wait_for(all_idle, 10),
	   "process exit with an entry cached: its memory is freed and the entry dropped (child status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);

	/* A process exiting with a live registration: its release (the exit's) parks nothing. */
	for (int first = 1; first >= 0; first--) {
		/*
		 * /dev/gpusim opened first: the exit releases the MR before
		 * the memory goes (its file is put last), so only the check
		 * of the releasing address space keeps it out of the cache.
		 */
		park0 = pm("watch_cache_parked");
		st = exit_child_run(first, LEN, 5);
		park0 = pm("watch_cache_parked") - park0;
		ok(st == 0 && wait_for(all_idle, 10) && park0 == 0,
		   "a process that exits holding its MR (/dev/gpusim opened %s): the exit releases it, nothing parked (parked %+lld; child status %d)",
		   first ? "first" : "after the verbs device", park0, st);
	}

	/* The bounds. */
	loopback_end(&c, hmr);
	fd = reload_with("watch_cache=2", &c, &h, &hmr);
	{
		struct gmem a, b, d;

		if (gmem_alloc(fd, LEN, &a) || gmem_alloc(fd, LEN, &b) || gmem_alloc(fd, LEN, &d))
			bail("gpusim allocation failed");
		ev0 = pm("watch_cache_evicted");
		ok(reg_dereg(&c, a.p, LEN) == 0 && reg_dereg(&c, b.p, LEN) == 0 && reg_dereg(&c, d.p, LEN) == 0 &&
		   pm_cached() == 2 && pm("watch_cache_evicted") == ev0 + 1 && gs("live_pins") == 2,
		   "watch_cache=2: a third range evicts one (cached %lld, evicted %+lld, pins %lld)",
		   pm_cached(), pm("watch_cache_evicted") - ev0, gs("live_pins"));
		hits0 = pm("watch_cache_hits");
		ok(reg_dereg(&c, a.p, LEN) == 0 && pm("watch_cache_hits") == hits0,
		   "watch_cache=2: the oldest was the one evicted (no hit for it)");
		hits0 = pm("watch_cache_hits");
		ok(reg_dereg(&c, d.p, LEN) == 0 && pm("watch_cache_hits") == hits0 + 1,
		   "watch_cache=2: the newest is still there (a hit)");
		gmem_gone(fd, &a);
		gmem_gone(fd, &b);
		gmem_gone(fd, &d);
	}
	ok(wait_for(all_idle, 10), "watch_cache=2: nothing left after the frees");
	loopback_end(&c, hmr);

	/* A cached watch pin covers one GPU page: 64 KiB of BAR1, whatever the range. */
	fd = reload_with("watch_cache_mib=1", &c, &h, &hmr);
	if (gmem_alloc(fd, 2 * LEN, &g))
		bail("gpusim allocation failed");
	park0 = pm("watch_cache_parked");
	ev0 = pm("watch_cache_evicted");
	rc = 0;
	for (int i = 0; i < 16; i++)
		rc |= reg_dereg(&c, g.p + i * GPU_PAGE, 2 * LEN - i * GPU_PAGE);
	ok(rc == 0 && pm("watch_cache_parked") == park0 + 16 && pm("watch_cache_evicted") == ev0 &&
	   gs("live_pins") == 16,
	   "watch_cache_mib=1: 16 ranges of up to 2 MiB are cached, one 64 KiB pin each (rc %d, parked %+lld, evicted %+lld, pins %lld)",
	   rc, pm("watch_cache_parked") - park0, pm("watch_cache_evicted") - ev0, gs("live_pins"));
	ok(reg_dereg(&c, g.p + 16 * GPU_PAGE, LEN) == 0 && pm("watch_cache_parked") == park0 + 17 &&
	   pm("watch_cache_evicted") == ev0 + 1 && gs("live_pins") == 16,
	   "watch_cache_mib=1: a 17th evicts the oldest (1 MiB of BAR1 is 16 of them; evicted %+lld)",
	   pm("watch_cache_evicted") - ev0);
	gmem_gone(fd, &g);
	ok(wait_for(all_idle, 10), "watch_cache_mib=1: nothing left after the free");
	loopback_end(&c, hmr);

	fd = reload_with("watch_cache=0", &c, &h, &hmr);
	if (gmem_alloc(fd, LEN, &g))
		bail("gpusim allocation failed");
	pins0 = pin_calls();
	ok(reg_dereg(&c, g.p, LEN) == 0 && reg_dereg(&c, g.p, LEN) == 0 && pin_calls() == pins0 + 4 &&
	   pm("watch_cache_parked") == 0 && gs("live_pins") == 0,
	   "watch_cache=0: nothing cached, two pins per registration (%+lld for two)", pin_calls() - pins0);
	gmem_gone(fd, &g);
	loopback_end(&c, hmr);

	ok(run("rmmod peermem") == 0, "rmmod");
	ok(run("insmod %s/peermem.ko watch_cache=65", root_dir()) != 0 &&
	   dmesg_has("watch_cache=65 is out of range"),
	   "watch_cache=65: the load fails, saying the range");
	ok(run("insmod %s/peermem.ko watch_cache_mib=1048577", root_dir()) != 0 &&
	   dmesg_has("watch_cache_mib=1048577 is out of range"),
	   "watch_cache_mib=1048577: the load fails, saying the range");
	load_modules(NULL);
	ok(wait_for(all_idle, 10), "nothing left");
	return finish();
}
