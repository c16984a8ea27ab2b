// SPDX-License-Identifier: GPL-2.0
/*
 * The registration cache of docs/examples/peermem_rcache.h, kept correct
 * by peermem's revocation events alone (no malloc, free, munmap or CUDA
 * hooks): SLOTS GPU allocations at fixed addresses; in each of ROUNDS
 * rounds one slot may be replaced by new GPU memory AT THE SAME ADDRESS
 * after its old memory went by GPUSIM_IOC_FREE, munmap, mremap or
 * mmap(MAP_FIXED); then the cache's MR for a random part of a random slot
 * carries an RDMA WRITE of a new pattern into it and an RDMA READ back.
 * Every RDMA must complete successfully (an MR the cache kept after its
 * revocation completes with a remote access error) and every byte must be
 * right, in GPU memory (a stale MR still reaching the old memory would
 * leave the new memory unchanged) and read back. The number of events the
 * cache drained equals the number of cached MRs revoked.
 *
 * The loop runs to a time budget, not a count: RCACHE_SECONDS (default 20; 30 until 2026-11-26)
 * of rounds, at least RCACHE_MIN_ROUNDS (default 200: each way of replacing
 * memory about 25 times, reached in about 30 s on one core of a loaded
 * machine) and at most RCACHE_ROUNDS (default 2000). The checks scale with
 * the rounds actually run.
 */
#define _GNU_SOURCE
#include "peermem_test.h"
#include "../../../docs/examples/peermem_rcache.h"

#define SLOTS 4
#define SLOT_LEN (256 * 1024UL)		/* 4 GPU pages */

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int gfd;

struct slot {
	uint8_t *addr;		/* fixed for the whole run */
	struct gmem g;
};

static struct slot s[SLOTS];
static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static void slot_alloc(struct slot *sl)
{
	int r = gmem_alloc_at(gfd, SLOT_LEN, sl->addr, &sl->g);

	if (r)
		bail("GPUSIM_IOC_ALLOC at %p: %s", (void *)sl->addr, strerror(-r));
	fill(sl->g.p, SLOT_LEN, 0x5a5a0000u ^ (uint32_t)(uintptr_t)sl->addr);
}

enum how { FREE, MUNMAP, MREMAP, MAPFIXED, NHOW };
static const char *how_str[] = { "GPUSIM_IOC_FREE", "munmap", "mremap", "mmap(MAP_FIXED)" };

/* Replace the slot's memory by new GPU memory at the same address. */
static void slot_replace(struct slot *sl, enum how how)
{
	void *q, *r;

	switch (how) {
	case FREE:
		if (gmem_free(gfd, &sl->g))
			bail("GPUSIM_IOC_FREE: %s", strerror(errno));
		gmem_drop(&sl->g);
		break;
	case MUNMAP:
		if (munmap(sl->addr, SLOT_LEN))
			bail("munmap: %s", strerror(errno));
		gmem_free(gfd, &sl->g);
		break;
	case MREMAP:
		q = mmap(NULL, SLOT_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		r = q == MAP_FAILED ? q :
		    mremap(sl->addr, SLOT_LEN, SLOT_LEN, MREMAP_MAYMOVE | MREMAP_FIXED, q);
		if (r == MAP_FAILED || r != q)
			bail("mremap: %s", strerror(errno));
		munmap(q, SLOT_LEN);
		gmem_free(gfd, &sl->g);
		break;
	case MAPFIXED:
		r = mmap(sl->addr, SLOT_LEN, PROT_READ | PROT_WRITE,
			 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r != sl->addr)
			bail("mmap(MAP_FIXED): %s", strerror(errno));
		munmap(r, SLOT_LEN);
		gmem_free(gfd, &sl->g);
		break;
	default:
		break;
	}
	slot_alloc(sl);
}

/* Whether the cache holds an MR covering part of the slot. */
static int cached(const struct rcache *rc, const struct slot *sl)
{
	for (int i = 0; i < RCACHE_MAX; i++)
		if (rc->e[i].mr && rc->e[i].start < (uintptr_t)sl->addr + SLOT_LEN &&
		    (uintptr_t)sl->addr < rc->e[i].start + rc->e[i].len)
			return 1;
	return 0;
}

int main(void)
{
	unsigned long max_rounds = strtoul(getenv("RCACHE_ROUNDS") ?: "2000", NULL, 10);
	unsigned long min_rounds = strtoul(getenv("RCACHE_MIN_ROUNDS") ?: "200", NULL, 10);
	double secs = strtod(getenv("RCACHE_SECONDS") ?: "20", NULL);
	unsigned long rounds;
	unsigned long replaced[NHOW] = { 0 }, revoked_cached = 0, rdma = 0, bad_status = 0;
	unsigned long bad_bytes = 0, bad_readback = 0, reg_fail = 0;
	struct rcache rc;
	uint8_t *base;
	double t0;
	int r;

	rxe_up();
	load_modules(NULL);
	gfd = gpusim_and_host_mr(&c, 2 * SLOT_LEN, &h, &hmr);
	r = rcache_init(&rc, c.pd, MR_ACCESS);
	ok(r == 0, "the cache opened /dev/peermem and mapped its generation page (%s)", strerror(-r));
	if (r)
		bail("no revocation channel");

	/* Fixed, 64 KiB aligned addresses: a reserved area, given back. */
	base = mmap(NULL, (SLOTS + 1) * SLOT_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		bail("mmap");
	munmap(base, (SLOTS + 1) * SLOT_LEN);
	base = (uint8_t *)(((uintptr_t)base + GPU_PAGE - 1) & ~(GPU_PAGE - 1));
	for (int i = 0; i < SLOTS; i++) {
		s[i].addr = base + i * SLOT_LEN;
		slot_alloc(&s[i]);
	}

	if (min_rounds > max_rounds)
		min_rounds = max_rounds;
	t0 = now_s();
	for (rounds = 0; rounds < max_rounds &&
	     (rounds < min_rounds || now_s() - t0 < secs); rounds++) {
		unsigned long n = rounds;
		struct slot *sl;
		struct ibv_mr *mr;
		uint32_t off, len, seed = 0x1000000u + (uint32_t)n;
		int st;

		/* Half the rounds replace the memory behind one slot. */
		if (rnd(2)) {
			enum how how = (enum how)rnd(NHOW);

			sl = &s[rnd(SLOTS)];
			revoked_cached += cached(&rc, sl);
			slot_replace(sl, how);
			replaced[how]++;
		}
		sl = &s[rnd(SLOTS)];
		/* Small transfers: rxe under TCG pays per 1 KiB packet. */
		off = rnd(SLOT_LEN / 4096 - 4) * 4096 + rnd(64) * 8;
		len = 8 * (1 + rnd(2048));
		/* The whole slot is registered, the RDMA uses part of it. */
		mr = rcache_get(&rc, sl->addr, SLOT_LEN);
		if (!mr) {
			reg_fail++;
			continue;
		}
		fill(h, len, seed);
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, len, (uintptr_t)sl->addr + off, mr->rkey);
		rdma++;
		if (st) {
			if (bad_status++ < 5)
				diag("round %lu: RDMA WRITE through the cached MR of slot %ld: status %d (%s)",
				     n, (long)(sl - s), st, st < 0 ? "none" : ibv_wc_status_str(st));
			if (conn_qps(&c))
				bail("cannot recreate the QPs");
			continue;
		}
		if (!check(sl->addr + off, len, seed) && bad_bytes++ < 5)
			diag("round %lu: slot %ld's GPU memory does not hold what the RDMA WRITE carried", n,
			     (long)(sl - s));
		memset(h + SLOT_LEN, 0, len);
		st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h + SLOT_LEN, len, (uintptr_t)sl->addr + off,
			     mr->rkey);
		rdma++;
		if (st) {
			if (bad_status++ < 5)
				diag("round %lu: RDMA READ: status %d", n, st);
			if (conn_qps(&c))
				bail("cannot recreate the QPs");
			continue;
		}
		if (!check(h + SLOT_LEN, len, seed) && bad_readback++ < 5)
			diag("round %lu: RDMA READ returned other bytes", n);
	}
	diag("%lu rounds (budget %.0f s, at least %lu, at most %lu) in %.1f s: %lu RDMA operations; replaced by %s %lu, %s %lu, %s %lu, %s %lu; cache hits %lu misses %lu, events %lu (overflows %lu), MRs dropped %lu",
	     rounds, secs, min_rounds, max_rounds, now_s() - t0, rdma, how_str[0], replaced[0], how_str[1], replaced[1],
	     how_str[2], replaced[2], how_str[3], replaced[3], rc.hits, rc.misses, rc.events,
	     rc.overflows, rc.dropped);
	ok(replaced[FREE] && replaced[MUNMAP] && replaced[MREMAP] && replaced[MAPFIXED] &&
	   rc.hits > rounds / 4 && revoked_cached > rounds / 8,
	   "every way of replacing memory happened and cached MRs were both reused (%lu hits) and revoked under the cache (%lu)",
	   rc.hits, revoked_cached);
	ok(reg_fail == 0, "every registration the cache made succeeded (%lu failed)", reg_fail);
	ok(bad_status == 0, "every RDMA through a cached MR completed successfully: none went through a revoked MR (%lu of %lu failed)",
	   bad_status, rdma);
	ok(bad_bytes == 0 && bad_readback == 0,
	   "every byte is right: in the GPU memory behind the address now (%lu wrong) and read back (%lu wrong)",
	   bad_bytes, bad_readback);
	rcache_sync(&rc);
	ok(rc.events == revoked_cached && rc.overflows == 0,
	   "the cache drained exactly one event per cached MR revoked (%lu events, %lu revoked, %lu overflows)",
	   rc.events, revoked_cached, rc.overflows);

	/*
	 * The control: what a cache that does not look at the counter would
	 * do, once per way of replacing memory. Its old MR must not reach the
	 * new memory: the RDMA fails, or the new memory does not get the bytes.
	 */
	for (int how = 0; how < NHOW; how++) {
		struct ibv_mr *stale = rcache_get(&rc, s[0].addr, SLOT_LEN);
		int st, landed;

		if (!stale)
			bail("ibv_reg_mr: %s", strerror(errno));
		slot_replace(&s[0], (enum how)how);
		fill(h, 8192, 0xc0de0000u + how);
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, 8192, (uintptr_t)s[0].addr, stale->rkey);
		landed = st == 0 && check(s[0].addr, 8192, 0xc0de0000u + how);
		if (st && conn_qps(&c))
			bail("cannot recreate the QPs");
		ok(!landed, "control, %s: the MR registered before, used without looking at the counter, does not write the new memory at the same address (status %d)",
		   how_str[how], st);
		rcache_sync(&rc);
		ok(!cached(&rc, &s[0]), "control, %s: after the cache synced it no longer holds that MR",
		   how_str[how]);
	}
	rcache_fini(&rc);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	for (int i = 0; i < SLOTS; i++) {
		gmem_free(gfd, &s[i].g);
		gmem_drop(&s[i].g);
	}
	close(gfd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	return finish();
}
