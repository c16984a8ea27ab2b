// SPDX-License-Identifier: GPL-2.0
/*
 * The multi-threaded registration cache of docs/examples/peermem_mtcache.h
 * (libpeermem + an interval tree), shared by WORKERS threads, while
 * REPLACERS other threads replace the GPU memory behind its ranges.
 *
 * SLOTS GPU allocations at fixed addresses, each with a reader-writer lock.
 * A worker round: take a random slot's lock shared, get the cache's MR for
 * the whole slot (one MR serves every worker: hits across threads), RDMA
 * WRITE a new pattern from its own QP into its own part of the slot, check
 * every byte in GPU memory, RDMA READ it back, check every byte, put the
 * MR. A replacer round: take a random slot's lock exclusive, count the MRs
 * the cache holds on it (after a sync), replace the memory by new GPU
 * memory AT THE SAME ADDRESS after GPUSIM_IOC_FREE, munmap, mremap or
 * mmap(MAP_FIXED). So no RDMA races the revocation of its own range (that
 * one may fail, with or without a cache), while lookups, misses,
 * registrations, drains and revocations of other ranges run concurrently.
 *
 * Checks: every RDMA through a cached MR completes successfully (an MR the
 * cache kept after its revocation completes with a remote access error)
 * and every byte is right, in the new GPU memory and read back; the cache
 * drained exactly one record per MR it held on a replaced slot, and as
 * many as the generation counted; no overflow. Then a control: the same
 * cache told not to look at the counter hands out the stale MR, which must
 * not write the new memory (so the checks above can fail).
 *
 * Runs to a time budget: MTC_SECONDS (default 20; 30 until 2026-11-26) of rounds, at least
 * MTC_MIN_ROUNDS worker rounds (default 200), at most MTC_MAX_ROUNDS
 * (default 20000). MTC_WORKERS (4), MTC_REPLACERS (2). The machine may be
 * slow: nothing is asserted on speed; the numbers are printed.
 */
#define _GNU_SOURCE
#include <peermem/libpeermem.h>
#include "../peermem/peermem_test.h"
#include "../../../docs/examples/peermem_mtcache.h"

#define SLOTS 8
#define SLOT_LEN (256 * 1024UL)		/* 4 GPU pages */
#define MAXW 8
#define MAXR 4
#define XFER_MAX 8192

static struct conn base;		/* the context and PD everyone shares */
static struct mtcache mc;
static int gfd, nworkers = 4, nreplacers = 2;
static unsigned long min_rounds, max_rounds;
static double secs, t0;

struct slot {
	uint8_t *addr;			/* fixed for the whole run */
	struct gmem g;
	pthread_rwlock_t lock;
};
static struct slot s[SLOTS];

enum how { FREE, MUNMAP, MREMAP, MAPFIXED, NHOW };
static const char *how_str[] = { "GPUSIM_IOC_FREE", "munmap", "mremap", "mmap(MAP_FIXED)" };

static unsigned long rounds_done;	/* atomic: worker rounds */
static int stop;			/* atomic */

struct worker {
	int id;
	pthread_t t;
	struct conn c;			/* its own CQ and QPs on the shared PD */
	uint8_t *h;
	struct ibv_mr *hmr;
	uint64_t rng;
	unsigned long rounds, rdma, bad_status, bad_bytes, bad_readback, get_fail;
	char first_error[200];
};

struct replacer {
	pthread_t t;
	uint64_t rng;
	unsigned long replaced[NHOW], counted, multi, fail;
	char first_error[200];
};

static struct worker W[MAXW];
static struct replacer R[MAXR];

static uint32_t rnd(uint64_t *rng, uint32_t n)
{
	*rng ^= *rng << 13;
	*rng ^= *rng >> 7;
	*rng ^= *rng << 17;
	return (uint32_t)(*rng % n);
}

static int slot_alloc(struct slot *sl)
{
	int r = gmem_alloc_at(gfd, SLOT_LEN, sl->addr, &sl->g);

	if (r)
		return r;
	fill(sl->g.p, SLOT_LEN, 0x5a5a0000u ^ (uint32_t)(uintptr_t)sl->addr);
	return 0;
}

/* Replace the slot's memory by new GPU memory at the same address: 0 or a message. */
static const char *slot_replace(struct slot *sl, enum how how)
{
	void *q, *r;

	switch (how) {
	case FREE:
		if (gmem_free(gfd, &sl->g))
			return "GPUSIM_IOC_FREE failed";
		gmem_drop(&sl->g);
		break;
	case MUNMAP:
		if (munmap(sl->addr, SLOT_LEN))
			return "munmap failed";
		gmem_free(gfd, &sl->g);
		break;
	case MREMAP:
		q = mmap(NULL, SLOT_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		r = q == MAP_FAILED ? q :
		    mremap(sl->addr, SLOT_LEN, SLOT_LEN, MREMAP_MAYMOVE | MREMAP_FIXED, q);
		if (r == MAP_FAILED || r != q)
			return "mremap failed";
		munmap(q, SLOT_LEN);
		gmem_free(gfd, &sl->g);
		break;
	case MAPFIXED:
		r = mmap(sl->addr, SLOT_LEN, PROT_READ | PROT_WRITE,
			 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r != sl->addr)
			return "mmap(MAP_FIXED) failed";
		munmap(r, SLOT_LEN);
		gmem_free(gfd, &sl->g);
		break;
	default:
		break;
	}
	return slot_alloc(sl) ? "GPUSIM_IOC_ALLOC at the slot's address failed" : NULL;
}

static int keep_going(void)
{
	unsigned long n = __atomic_load_n(&rounds_done, __ATOMIC_RELAXED);

	if (__atomic_load_n(&stop, __ATOMIC_RELAXED))
		return 0;
	if (n >= max_rounds || (n >= min_rounds && now_s() - t0 >= secs)) {
		__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
		return 0;
	}
	return 1;
}

static void werr(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void werr(struct worker *w, const char *fmt, ...)
{
	va_list ap;

	if (w->first_error[0])
		return;
	va_start(ap, fmt);
	vsnprintf(w->first_error, sizeof(w->first_error), fmt, ap);
	va_end(ap);
}

static void *worker(void *arg)
{
	struct worker *w = arg;
	size_t part = SLOT_LEN / nworkers;

	while (keep_going()) {
		struct slot *sl = &s[rnd(&w->rng, SLOTS)];
		uint32_t len = 8 * (1 + rnd(&w->rng, XFER_MAX / 8));
		uint32_t off = (uint32_t)(w->id * part) + rnd(&w->rng, (uint32_t)((part - len) / 8)) * 8;
		uint32_t seed = (uint32_t)(w->id << 24) + (uint32_t)w->rounds;
		struct mtc_entry *e;
		int st;

		pthread_rwlock_rdlock(&sl->lock);
		e = mtc_get(&mc, sl->addr, SLOT_LEN);
		if (!e) {
			w->get_fail++;
			werr(w, "mtc_get of slot %ld: %s", (long)(sl - s), strerror(errno));
			pthread_rwlock_unlock(&sl->lock);
			continue;
		}
		fill(w->h, len, seed);
		st = rdma_op(&w->c, IBV_WR_RDMA_WRITE, w->hmr, w->h, len, (uintptr_t)sl->addr + off,
			     e->mr->rkey);
		w->rdma++;
		if (st) {
			w->bad_status++;
			werr(w, "round %lu: RDMA WRITE through the cached MR of slot %ld: %s", w->rounds,
			     (long)(sl - s), wc_str(st));
			if (conn_qps(&w->c))
				bail("worker %d: cannot recreate its QPs", w->id);
		} else {
			if (!check(sl->addr + off, len, seed)) {
				w->bad_bytes++;
				werr(w, "round %lu: slot %ld's GPU memory does not hold what the RDMA WRITE carried",
				     w->rounds, (long)(sl - s));
			}
			memset(w->h + XFER_MAX, 0, len);
			st = rdma_op(&w->c, IBV_WR_RDMA_READ, w->hmr, w->h + XFER_MAX, len,
				     (uintptr_t)sl->addr + off, e->mr->rkey);
			w->rdma++;
			if (st) {
				w->bad_status++;
				werr(w, "round %lu: RDMA READ: %s", w->rounds, wc_str(st));
				if (conn_qps(&w->c))
					bail("worker %d: cannot recreate its QPs", w->id);
			} else if (!check(w->h + XFER_MAX, len, seed)) {
				w->bad_readback++;
				werr(w, "round %lu: RDMA READ returned other bytes", w->rounds);
			}
		}
		mtc_put(&mc, e);
		pthread_rwlock_unlock(&sl->lock);
		w->rounds++;
		__atomic_fetch_add(&rounds_done, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void *replacer(void *arg)
{
	struct replacer *r = arg;

	while (keep_going()) {
		struct slot *sl = &s[rnd(&r->rng, SLOTS)];
		enum how how = (enum how)rnd(&r->rng, NHOW);
		const char *err;

		usleep(1000 + rnd(&r->rng, 4000));	/* let the workers use what exists */
		pthread_rwlock_wrlock(&sl->lock);
		/* The MRs on this slot: each gets exactly one record now. */
		{
			size_t k = mtc_count(&mc, sl->addr, SLOT_LEN);

			r->counted += k;
			r->multi += k > 1;	/* more than one MR on the range */
		}
		err = slot_replace(sl, how);
		pthread_rwlock_unlock(&sl->lock);
		if (err) {
			/* The slot has no memory now: stop the run, it says why. */
			r->fail++;
			if (!r->first_error[0])
				snprintf(r->first_error, sizeof(r->first_error), "%s: %s", how_str[how], err);
			__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
			break;
		}
		r->replaced[how]++;
	}
	return NULL;
}

int main(void)
{
	unsigned long rounds = 0, rdma = 0, bad_status = 0, bad_bytes = 0, bad_readback = 0, get_fail = 0;
	unsigned long replaced[NHOW] = { 0 }, counted = 0, multi = 0, rfail = 0, total_repl = 0;
	struct peermem_info info;
	pthread_rwlockattr_t ra;
	uint8_t *area;
	double took;
	int r, why;

	min_rounds = strtoul(getenv("MTC_MIN_ROUNDS") ?: "200", NULL, 10);
	max_rounds = strtoul(getenv("MTC_MAX_ROUNDS") ?: "20000", NULL, 10);
	secs = strtod(getenv("MTC_SECONDS") ?: "20", NULL);
	nworkers = atoi(getenv("MTC_WORKERS") ?: "4");
	nreplacers = atoi(getenv("MTC_REPLACERS") ?: "2");
	if (nworkers < 1 || nworkers > MAXW || nreplacers < 1 || nreplacers > MAXR || min_rounds > max_rounds)
		bail("MTC_WORKERS 1-%d, MTC_REPLACERS 1-%d, MTC_MIN_ROUNDS <= MTC_MAX_ROUNDS", MAXW, MAXR);

	rxe_up();
	load_modules(NULL);
	if (conn_open(&base))
		bail("cannot set up an RC loopback on " RXE_DEV);
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0)
		bail("open /dev/gpusim: %s", strerror(errno));
	r = mtc_init(&mc, base.pd, MR_ACCESS, 1024, &why);
	ok(r == 0, "the cache opened the channel through libpeermem (%d, %s)", r, strerror(-why));
	if (r)
		bail("no revocation channel");

	/*
	 * Fixed, 64 KiB aligned addresses, far below where mmap(NULL) places
	 * mappings (top-down from the stack): while a slot is a hole (between
	 * its munmap or mremap and the new allocation) another thread's
	 * mmap(NULL) (a replacer's mremap target, malloc, libibverbs) would
	 * otherwise take the hole first, as it is the highest gap that fits.
	 */
	area = MAP_FAILED;
	for (uintptr_t hint = 0x100000000000UL; area == MAP_FAILED && hint <= 0x400000000000UL;
	     hint += 0x080000000000UL)
		area = mmap((void *)hint, SLOTS * SLOT_LEN, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (area == MAP_FAILED)
		bail("mmap of the slot area: %s", strerror(errno));
	munmap(area, SLOTS * SLOT_LEN);
	pthread_rwlockattr_init(&ra);
	/* Writers first: a replacer must not starve behind a stream of workers. */
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	for (int i = 0; i < SLOTS; i++) {
		s[i].addr = area + i * SLOT_LEN;
		pthread_rwlock_init(&s[i].lock, &ra);
		if (slot_alloc(&s[i]))
			bail("GPUSIM_IOC_ALLOC at %p", (void *)s[i].addr);
	}
	for (int i = 0; i < nworkers; i++) {
		struct worker *w = &W[i];

		w->id = i;
		w->rng = 0x9e3779b97f4a7c15ULL * (i + 1);
		w->c = base;
		w->c.cq = NULL;
		w->c.qa = w->c.qb = NULL;
		w->h = aligned_alloc(4096, 2 * XFER_MAX);
		if (conn_qps(&w->c) || !w->h)
			bail("worker %d: QPs or buffer", i);
		w->hmr = ibv_reg_mr(base.pd, w->h, 2 * XFER_MAX, MR_ACCESS);
		if (!w->hmr)
			bail("host MR: %s", strerror(errno));
	}
	t0 = now_s();
	for (int i = 0; i < nreplacers; i++) {
		R[i].rng = 0xda942042e4dd58b5ULL * (i + 7);
		pthread_create(&R[i].t, NULL, replacer, &R[i]);
	}
	for (int i = 0; i < nworkers; i++)
		pthread_create(&W[i].t, NULL, worker, &W[i]);
	for (int i = 0; i < nworkers; i++)
		pthread_join(W[i].t, NULL);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < nreplacers; i++)
		pthread_join(R[i].t, NULL);
	took = now_s() - t0;

	for (int i = 0; i < nworkers; i++) {
		struct worker *w = &W[i];

		rounds += w->rounds;
		rdma += w->rdma;
		bad_status += w->bad_status;
		bad_bytes += w->bad_bytes;
		bad_readback += w->bad_readback;
		get_fail += w->get_fail;
		if (w->first_error[0])
			diag("worker %d: first error: %s", i, w->first_error);
		diag("worker %d: %lu rounds, %lu RDMA operations", i, w->rounds, w->rdma);
	}
	for (int i = 0; i < nreplacers; i++) {
		for (int h = 0; h < NHOW; h++) {
			replaced[h] += R[i].replaced[h];
			total_repl += R[i].replaced[h];
		}
		counted += R[i].counted;
		multi += R[i].multi;
		rfail += R[i].fail;
		if (R[i].first_error[0])
			diag("replacer %d: %s", i, R[i].first_error);
	}
	mtc_sync(&mc);
	memset(&info, 0, sizeof(info));
	if (peermem_info(mc.ch, &info, sizeof(info)))
		diag("the cache lost its channel (%lu drain errors)", mc.drain_errors);
	diag("%lu rounds (budget %.0f s, at least %lu, at most %lu) in %.1f s by %d worker threads, %d replacer threads; %lu RDMA operations; %lu replacements: %s %lu, %s %lu, %s %lu, %s %lu",
	     rounds, secs, min_rounds, max_rounds, took, nworkers, nreplacers, rdma, total_repl,
	     how_str[0], replaced[0], how_str[1], replaced[1], how_str[2], replaced[2], how_str[3],
	     replaced[3]);
	diag("cache: hits %lu misses %lu (waits for another thread's registration %lu), events (records) %lu, flushes %lu, MRs dropped %lu, evicted %lu, registrations retried %lu, MRs held on replaced slots %lu (replacements that found more than one: %lu); channel: generation %llu, drains %llu, overflows %llu",
	     mc.hits, mc.misses, mc.waits, mc.records, mc.flushes, mc.dropped, mc.evicted, mc.retries, counted, multi,
	     (unsigned long long)info.generation, (unsigned long long)info.drains,
	     (unsigned long long)info.overflows);

	ok(rounds >= min_rounds && rfail == 0 && replaced[FREE] && replaced[MUNMAP] && replaced[MREMAP] &&
	   replaced[MAPFIXED],
	   "%lu rounds (at least %lu) by %d threads while %d threads replaced memory %lu times, every way at least once",
	   rounds, min_rounds, nworkers, nreplacers, total_repl);
	ok(mc.hits > 0 && counted > 0,
	   "cached MRs were both reused (%lu hits) and revoked under the cache (%lu)", mc.hits, counted);
	ok(get_fail == 0, "every mtc_get succeeded (%lu failed)", get_fail);
	ok(bad_status == 0,
	   "every RDMA through a cached MR completed successfully: none went through a revoked MR (%lu of %lu failed)",
	   bad_status, rdma);
	ok(bad_bytes == 0 && bad_readback == 0,
	   "every byte is right: in the GPU memory behind the address now (%lu wrong) and read back (%lu wrong)",
	   bad_bytes, bad_readback);
	ok(mc.records == counted && mc.flushes == 0 && info.overflows == 0,
	   "the cache drained exactly one record per MR it held on a replaced slot (%lu records, %lu MRs, %lu flushes)",
	   mc.records, counted, mc.flushes);
	ok(info.records == mc.records && info.seen == info.generation && info.generation == mc.records,
	   "libpeermem handed every generation over once: records %llu = cache's %lu = generation %llu (seen %llu)",
	   (unsigned long long)info.records, mc.records, (unsigned long long)info.generation,
	   (unsigned long long)info.seen);

	/*
	 * The control: the same cache, told not to look at the counter, keeps
	 * the MR of replaced memory. Its RDMA must not write the new memory.
	 */
	for (int how = 0; how < NHOW; how++) {
		struct mtc_entry *e = mtc_get(&mc, s[0].addr, SLOT_LEN), *stale;
		unsigned long hits, misses;
		const char *err;
		int st, landed;

		if (!e)
			bail("mtc_get: %s", strerror(errno));
		mtc_put(&mc, e);
		err = slot_replace(&s[0], (enum how)how);
		if (err)
			bail("%s", err);
		hits = mc.hits;
		misses = mc.misses;
		mc.no_check = 1;
		stale = mtc_get(&mc, s[0].addr, SLOT_LEN);
		mc.no_check = 0;
		if (!stale)
			bail("mtc_get: %s", strerror(errno));
		fill(W[0].h, 8192, 0xc0de0000u + how);
		st = rdma_op(&W[0].c, IBV_WR_RDMA_WRITE, W[0].hmr, W[0].h, 8192, (uintptr_t)s[0].addr,
			     stale->mr->rkey);
		landed = st == 0 && check(s[0].addr, 8192, 0xc0de0000u + how);
		if (st && conn_qps(&W[0].c))
			bail("cannot recreate the QPs");
		ok(mc.hits == hits + 1 && mc.misses == misses && !landed,
		   "control, %s: the cache without its check hands out the old MR, which does not write the new memory (%s)",
		   how_str[how], wc_str(st));
		mtc_put(&mc, stale);
		ok(mtc_count(&mc, s[0].addr, SLOT_LEN) == 0,
		   "control, %s: after a sync the cache holds no MR on the slot", how_str[how]);
	}

	mtc_fini(&mc);
	for (int i = 0; i < nworkers; i++) {
		ibv_dereg_mr(W[i].hmr);
		ibv_destroy_qp(W[i].c.qa);
		ibv_destroy_qp(W[i].c.qb);
		ibv_destroy_cq(W[i].c.cq);
		free(W[i].h);
	}
	conn_close(&base);
	for (int i = 0; i < SLOTS; i++) {
		gmem_free(gfd, &s[i].g);
		gmem_drop(&s[i].g);
		pthread_rwlock_destroy(&s[i].lock);
	}
	close(gfd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle: the cache deregistered every MR");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	return finish();
}
