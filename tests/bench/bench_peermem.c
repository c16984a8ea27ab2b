// SPDX-License-Identifier: GPL-2.0
/*
 * bench_peermem - peermem, NVIDIA's nvidia-peermem and the floor, measured
 * in one run in the rig, alternating round by round (scripts/bench.sh
 * builds everything, boots the rig, runs this and turns its output into a
 * table, bench-results.json and a plot; docs/benchmarks.md explains them).
 *
 * The three sides, each doing the same work on the same gpusim memory:
 *
 *   peermem         ibv_reg_mr/ibv_dereg_mr on rxe0 with peermem.ko loaded
 *                   (the default build, registered as nv_mem + nv_mem_nc)
 *   nvidia-peermem  the same with NVIDIA's nvidia-peermem.ko, unmodified
 *                   (tests/nvpeermem builds it from Debian's package)
 *   floor           the same GPU range pinned and DMA-mapped for the same
 *                   PCI device (the rig's RDMA DMA device) directly through
 *                   nvidia_p2p_get_pages + nvidia_p2p_dma_map_pages and
 *                   undone, by gpusim's test client: one ioctl each way, no
 *                   peer-memory core and no RDMA device in between
 *
 * Only one of the two peer clients is loaded at a time (both claim gpusim
 * memory, and the first registered would win): each round loads them in
 * turn, in an order that rotates from round to round, and measures every
 * figure once per side (the floor needs no reload). Figures: see the
 * "sample" lines below and docs/benchmarks.md.
 *
 * Not a test: it fails (exit 1, "not ok ... (bailing out)") only if an
 * operation fails. Output: "# " lines, "info KEY VALUE..." lines and one
 * "sample FIGURE PARAM SIDE ROUND VALUE" line per raw sample (seconds,
 * counts or bytes as the figure's name says). With --tap (the smoke run of
 * tests/guest/bench) the samples are kept and one TAP result per figure
 * and side says it was measured.
 *
 *   bench_peermem [--rounds N] [--large BYTES] [--smoke] [--tap]
 *                 [--events-only] [--memory-detail] [--profile SIDE BYTES|free N]
 *                 [--only GROUPS]
 *
 * --only GROUPS: only these figure groups, comma-separated: latency,
 * pincost, layers, free, munmap, events, threads, memory, sg (e.g.
 * latency,free: what the keeper changes, in a fraction of the time);
 * scaling runs only when named.
 *
 * --memory-detail: only the kernel memory figures, each also broken down by
 * counter (slab cache, /proc/meminfo, /proc/vmstat) in "memdetail" lines
 * (scripts/bench.sh --memory-detail; report.py memdetail makes the table).
 *
 * Environment: PEERMEM_DMA_DEVICE (the rig's DMA device, exported by the
 * guest's init; required), GPUSIM_KO, TESTCLIENT_KO, PEERMEM_KO,
 * NVPEERMEM_KO (default: the builds in $PEERMEM_ROOT; NVPEERMEM_KO may be
 * 595's, tests/nvpeermem/595/), BENCH_NV_ARGS (nvidia-peermem's module
 * parameters, e.g. persistent_api_support=0 for 595's invalidating mode),
 * BENCH_PIN_COSTS (the pin-cost models, fig_pincost).
 */
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>

#include "../guest/peermem/peermem_test.h"
#include "../gpusim/testclient/gpusim_testclient.h"
#include "../../include/uapi/peermem.h"

enum { S_PM, S_NV, S_FLOOR, NSIDES, S_HOST = NSIDES };
/* "host": a reference, measured in the floor's turn (no peer memory at all). */
static const char *const side_name[NSIDES + 1] = { "peermem", "nvidia-peermem", "floor", "host" };
/* Module names of the two peer clients, and their .ko (env, default). */
static const char *const side_mod[2] = { "peermem", "nvidia_peermem" };
static const char *const side_env[2] = { "PEERMEM_KO", "NVPEERMEM_KO" };
static const char *const side_def[2] = { "peermem.ko", "tests/nvpeermem/nvidia-peermem.ko" };

#define MIB (1024 * 1024UL)
#define SLICE GPU_PAGE			/* free->revoke: one MR per GPU page */
#define NFREE_MRS 64
#define FREE_LEN (NFREE_MRS * SLICE)	/* 4 MiB */
#define SG_LEN (64 * MIB)		/* scatter entries: per registration */
#define MAXS 4096			/* samples per series */

static int rounds = 10, tap_mode, smoke, events_only;
/* --only GROUPS: the figure groups measured (NULL: all). */
static const char *only;

/* Is figure group g (latency, layers, free, munmap, events, threads, memory, sg) measured? */
static int named(const char *g)
{
	size_t n = strlen(g);

	for (const char *p = only; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, g, n) && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

static int want(const char *g)
{
	return named(g) || !only;
}
/* --memory-detail: only the memory figures, each with its breakdown. */
static int mem_detail;
/* --profile: only N reg+dereg of BYTES on SIDE, for a profiler around the run. */
static int prof_side = -1, prof_n, prof_threads = 1;
static size_t prof_len;
/* --profile SIDE free N: N GPU frees under 64 live MRs, profiled around the free only. */
static int prof_free;
static size_t large = 512 * MIB;
static struct conn c;
static int gfd, tcfd;
static struct ibv_mr *hmr;		/* host buffer: source of the WRITEs */
static uint8_t *hbuf, *hbig;		/* hbig: 4 MiB of host memory */
static struct gmem gbig, gcontig, gfrag;

/* ---- samples ----------------------------------------------------------- */

struct series {
	char fig[40], param[24];
	int side, n;
	double v[MAXS];
};
static struct series *ser[256];
static int nser;

static void sample(const char *fig, const char *param, int side, int round, double v)
{
	struct series *s = NULL;

	for (int i = 0; i < nser; i++)
		if (ser[i]->side == side && !strcmp(ser[i]->fig, fig) &&
		    !strcmp(ser[i]->param, param))
			s = ser[i];
	if (!s) {
		if (nser == (int)(sizeof(ser) / sizeof(ser[0])))
			bail("too many series");
		s = calloc(1, sizeof(*s));
		if (!s)
			bail("out of memory");
		snprintf(s->fig, sizeof(s->fig), "%s", fig);
		snprintf(s->param, sizeof(s->param), "%s", param);
		s->side = side;
		ser[nser++] = s;
	}
	if (s->n < MAXS)
		s->v[s->n++] = v;
	if (!tap_mode)
		printf("sample %s %s %s %d %.9g\n", fig, param, side_name[side], round, v);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const struct series *s)
{
	double t[MAXS];

	memcpy(t, s->v, s->n * sizeof(double));
	qsort(t, s->n, sizeof(double), cmp_d);
	return s->n % 2 ? t[s->n / 2] : (t[s->n / 2 - 1] + t[s->n / 2]) / 2;
}

static const char *size_str(size_t len, char *buf, size_t n)
{
	if (len % MIB == 0)
		snprintf(buf, n, "%zuM", len / MIB);
	else
		snprintf(buf, n, "%zuK", len / 1024);
	return buf;
}

/* ---- modules ------------------------------------------------------------ */

static int loaded(const char *mod)
{
	char p[128];

	snprintf(p, sizeof(p), "/sys/module/%s", mod);
	return access(p, F_OK) == 0;
}

static void ko_path(const char *env, const char *def, char *buf, size_t n)
{
	if (getenv(env))
		snprintf(buf, n, "%s", getenv(env));
	else
		snprintf(buf, n, "%s/%s", root_dir(), def);
	if (access(buf, R_OK))
		bail("%s is missing: build it (scripts/bench.sh does; or %s=)", buf, env);
}

/*
 * Unloads side s's module if it is loaded: 0, or rmmod's status. peermem
 * first gives back this process's cached watch pins (only the pinning
 * process can; its unload waits for the pins of a live process).
 */
static int unload_side(int s)
{
	if (!loaded(side_mod[s]))
		return 0;
	if (s == S_PM)
		pm_flush();
	return run("rmmod %s", side_mod[s]);
}

static void insmod(const char *env, const char *def, const char *args)
{
	char ko[512];

	ko_path(env, def, ko, sizeof(ko));
	if (run("insmod %s %s", ko, args))
		bail("insmod %s %s failed", ko, args);
}

/* Make side s's peer client the only one loaded (the floor needs none). */
static void use_side(int s)
{
	/*
	 * gpusim holds its RM lock by default, as NVIDIA's driver does. NVIDIA's
	 * nvidia-peermem (the invalidating 550 client) has the core's
	 * mapping_lock <-> RM lock cycle (docs/architecture.md, "Locking"), which
	 * lockdep reports in the debug rig and which is a real deadlock when a
	 * free races a registration: its side runs with rm_lock=0, as in
	 * tests/guest/e2e. peermem and the floor keep the lock.
	 */
	/*
	 * BENCH_PM_RM_LOCK=0: peermem's side without it too (a module from
	 * before issue 22's keeper, whose free callback invalidates under RM,
	 * has the same cycle; for a before/after comparison both run so).
	 */
	/*
	 * BENCH_NV_RM_LOCK=1: nvidia-peermem's side with it, as on NVIDIA's
	 * driver, where every client's pins, puts and mappings take RM's
	 * lock (issue 26: the same conditions for both clients; only on a
	 * kernel without lockdep, which reports the cycle, and only where no
	 * free races a registration, as in these figures).
	 */
	int nv_lock = getenv("BENCH_NV_RM_LOCK") && !strcmp(getenv("BENCH_NV_RM_LOCK"), "1");

	gs_knob("rm_lock", (s == S_NV && !nv_lock) ||
				   (s == S_PM && getenv("BENCH_PM_RM_LOCK") &&
				    !strcmp(getenv("BENCH_PM_RM_LOCK"), "0")) ? "0" : "1");
	if (s == S_FLOOR)
		return;
	if (unload_side(!s))
		bail("cannot unload %s", side_mod[!s]);
	/* BENCH_PM_ARGS: peermem's module parameters (a measurement, issue 26). */
	if (!loaded(side_mod[s]))
		insmod(side_env[s], side_def[s],
		       s == S_PM && getenv("BENCH_PM_ARGS")   ? getenv("BENCH_PM_ARGS")
		       : s == S_NV && getenv("BENCH_NV_ARGS") ? getenv("BENCH_NV_ARGS")
							      : "");
}

/* ---- one registration, whichever side --------------------------------- */

struct reg {
	struct ibv_mr *mr;
	uint32_t id;
	struct gpusim_tc_req q;		/* floor: what GET said */
};

static int side_reg(int s, int fd, struct ibv_pd *pd, void *p, size_t len, struct reg *r)
{
	memset(r, 0, sizeof(*r));
	if (s != S_FLOOR) {
		r->mr = ibv_reg_mr(pd, p, len, MR_ACCESS);
		return r->mr ? 0 : -errno;
	}
	r->q.va = (uintptr_t)p;
	r->q.len = len;
	r->q.flags = GPUSIM_TC_MAP | GPUSIM_TC_CB_UNMAP;
	if (ioctl(fd, GPUSIM_TC_GET, &r->q))
		return -errno;
	r->id = r->q.id;
	if (r->q.ret && r->id) {	/* map failed and the pin is stuck */
		struct gpusim_tc_req f = { .id = r->id };

		ioctl(fd, GPUSIM_TC_FORGET, &f);
	}
	return r->q.ret;
}

static int side_dereg(int s, int fd, struct reg *r)
{
	struct gpusim_tc_req f = { .id = r->id, .flags = GPUSIM_TC_UNMAP };

	if (s != S_FLOOR)
		return ibv_dereg_mr(r->mr) ? -EIO : 0;
	return ioctl(fd, GPUSIM_TC_FORGET, &f) ? -errno : 0;
}

static void reg_or_bail(int s, void *p, size_t len, struct reg *r)
{
	int e = side_reg(s, tcfd, c.pd, p, len, r);

	if (e)
		bail("%s: registering %zu bytes at %p failed: %s", side_name[s], len, p,
		     strerror(-e));
}

static void dereg_or_bail(int s, struct reg *r)
{
	if (side_dereg(s, tcfd, r))
		bail("%s: deregistration failed", side_name[s]);
}

/* ---- RDMA WRITE with a busy-polled completion ------------------------- */

static int write_poll(struct ibv_mr *lmr, void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = len, .lkey = lmr->lkey };
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;
	double end;
	int n;

	wr.wr_id = 7;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(c.qa, &wr, &bad))
		return -1;
	end = now_s() + 30;
	while ((n = ibv_poll_cq(c.cq, 1, &wc)) == 0)
		if (now_s() > end)
			return -1;
	return n < 0 ? -1 : (int)wc.status;
}

/* ---- figures ------------------------------------------------------------ */

/*
 * The pin-cost model (by default): reg+dereg at 64 KiB, 2 MiB, 64 MiB and
 * the large size with gpusim's pin_call_us/pin_page_ns set to each model of
 * BENCH_PIN_COSTS ("CALL_US:PAGE_NS,...", default 45 us and 70 us per call
 * plus 190 ns per 64 KiB page: gdrcopy's pin benchmarks of NVIDIA's pin;
 * 0:0 is free pins, 1000:190 the GPUDirect RDMA guide's "up to
 * milliseconds"; docs/benchmarks.md, "The pin-cost model"). Each size twice:
 *  - miss: a range registered for the first time: each registration at
 *    the next distinct range of its size in the big allocation (peermem's
 *    watch-pin cache evicts its oldest entries on the way, as it does for
 *    a program that registers ever new ranges; the first range is the
 *    hits'); where the allocation has no range left (64 MiB after 7, the
 *    large size every time) peermem's
 *    cache is given back first (watch_cache_flush, then a settle until
 *    its registrations are gone, both untimed);
 *  - hit: the same range again (the allocation's first), once untimed to
 *    park it, then timed (peermem's parked watch pin taken back).
 * Samples "pincost_miss_s" and "pincost_s" (the hit), param
 * "SIZE@CALL_US+PAGE_NS"; and per registration, summed over every pin
 * (nvidia_p2p_get_pages and _persistent): "pins_miss_calls",
 * "pins_miss_pages", "pins_hit_calls", "pins_hit_pages", param SIZE (the
 * first model's; the counts do not depend on the model).
 */
/*
 * peermem's watch-pin cache given back, and its registrations gone (their
 * teardown may finish after the flush returns): nothing of it left to
 * run beside the next timed registration. Bounded (2 s).
 */
static void pm_flush_settled(void)
{
	double end;

	pm_flush();
	end = now_s() + 2;
	while ((pm_live_objects() != 0 || pm_cached() != 0) && now_s() < end)
		usleep(1000);
}

/* The next distinct range of len bytes in the big allocation, per size. */
static uint8_t *miss_range(int s, size_t len)
{
	static size_t next[2][8];
	/* The first range is the hits' (fig_pincost): misses take the others. */
	size_t slots = gbig.len / len, first = slots > 1, *n;
	int sz = 0;

	while (sz < 7 && ((size_t)64 * 1024) << (5 * sz) < len)
		sz++;
	n = &next[s == S_PM][sz];
	if (first + *n >= slots) {
		*n = 0;
		if (s == S_PM)
			pm_flush_settled();
	}
	return gbig.p + (first + (*n)++) * len;
}

static void pincost_one(int s, int round, size_t len, int miss, int reps, const char *param,
			int count)
{
	long long c0, p0, c1, p1;
	char ps[24], fig[32];
	struct reg r;

	if (!miss) {
		/* Parked (peermem) before the timed registrations. */
		reg_or_bail(s, gbig.p, len, &r);
		dereg_or_bail(s, &r);
	}
	c0 = gs("calls/get_pages") + gs("calls/get_pages_persistent");
	p0 = gs("pages_pinned");
	for (int k = 0; k < reps; k++) {
		uint8_t *p = miss ? miss_range(s, len) : gbig.p;
		double t0;

		t0 = now_s();
		reg_or_bail(s, p, len, &r);
		dereg_or_bail(s, &r);
		sample(miss ? "pincost_miss_s" : "pincost_s", param, s, round, now_s() - t0);
	}
	if (!count)
		return;
	/* Pins made (a put changes neither counter). */
	c1 = gs("calls/get_pages") + gs("calls/get_pages_persistent");
	p1 = gs("pages_pinned");
	size_str(len, ps, sizeof(ps));
	snprintf(fig, sizeof(fig), "pins_%s_calls", miss ? "miss" : "hit");
	sample(fig, ps, s, round, (double)(c1 - c0) / reps);
	snprintf(fig, sizeof(fig), "pins_%s_pages", miss ? "miss" : "hit");
	sample(fig, ps, s, round, (double)(p1 - p0) / reps);
}

static void fig_pincost(int s, int round)
{
	const char *models = getenv("BENCH_PIN_COSTS") ?: "45:190,70:190";
	size_t sizes[] = { 64 * 1024, 2 * MIB, 64 * MIB, large };
	/* The smoke: one model, the two small sizes (CI's time). */
	int nsz = smoke ? 2 : 4, first = 1;
	char buf[256], *save = NULL, ps[24], param[64], v[24];

	snprintf(buf, sizeof(buf), "%s", models);
	for (char *m = strtok_r(buf, ",", &save); m; m = strtok_r(NULL, ",", &save), first = 0) {
		unsigned long call_us, page_ns;

		if (sscanf(m, "%lu:%lu", &call_us, &page_ns) != 2 || call_us > 1000000 || page_ns > 1000000)
			bail("BENCH_PIN_COSTS: '%s' is not CALL_US:PAGE_NS (each 0..1000000)", m);
		if (smoke && !first)
			break;
		snprintf(v, sizeof(v), "%lu", call_us);
		if (gs_knob("pin_call_us", v))
			bail("cannot set gpusim's pin_call_us (a gpusim without the pin-cost model?)");
		snprintf(v, sizeof(v), "%lu", page_ns);
		if (gs_knob("pin_page_ns", v))
			bail("cannot set gpusim's pin_page_ns");
		for (int i = 0; i < nsz; i++) {
			size_t len = sizes[i];
			int reps = smoke ? 1 : len <= 2 * MIB ? 4 : len <= 64 * MIB ? 2 : 1;

			size_str(len, ps, sizeof(ps));
			snprintf(param, sizeof(param), "%s@%lu+%lu", ps, call_us, page_ns);
			pincost_one(s, round, len, 1, reps, param, first);
			pincost_one(s, round, len, 0, reps, param, first);
		}
	}
	gs_knob("pin_call_us", "0");
	gs_knob("pin_page_ns", "0");
}

/* Registration latency: reg and dereg timed apart, at each size. */
static void fig_latency(int s, int round)
{
	size_t sizes[] = { 64 * 1024, 2 * MIB, 64 * MIB, large };
	/* The smoke: the figure, at its two small sizes (CI's time). */
	int nsz = smoke ? 2 : 4;
	char ps[24];

	for (int i = 0; i < nsz; i++) {
		size_t len = sizes[i];
		int reps = smoke ? 1 : len <= 2 * MIB ? 6 : len <= 64 * MIB ? 2 : 1;
		long long c0 = gs("calls/get_pages"), p0 = gs("pages_pinned");
		long long q0 = gs("calls/get_pages_persistent");
		long long m0 = gs("calls/dma_map_pages"), d0 = gs("pages_dma_mapped");

		size_str(len, ps, sizeof(ps));
		for (int k = 0; k < reps; k++) {
			struct reg r;
			double t0, t1, t2;

			t0 = now_s();
			reg_or_bail(s, gbig.p, len, &r);
			t1 = now_s();
			dereg_or_bail(s, &r);
			t2 = now_s();
			sample("reg_s", ps, s, round, t1 - t0);
			sample("dereg_s", ps, s, round, t2 - t1);
			sample("regdereg_s", ps, s, round, t2 - t0);
		}
		if (len == 2 * MIB) {
			long long c1 = gs("calls/get_pages"), q1 = gs("calls/get_pages_persistent");

			sample("gpu_pins_per_reg", ps, s, round, (double)(c1 - c0) / reps);
			/*
			 * nvidia_p2p_get_pages_persistent calls: nv_mem's keeper
			 * pin (issue 22); all pins: both entry points.
			 */
			sample("gpu_persistent_pins_per_reg", ps, s, round, (double)(q1 - q0) / reps);
			sample("gpu_all_pins_per_reg", ps, s, round,
			       (double)(c1 - c0 + q1 - q0) / reps);
			sample("gpu_pages_pinned_per_reg", ps, s, round,
			       (double)(gs("pages_pinned") - p0) / reps);
			sample("gpu_dma_maps_per_reg", ps, s, round,
			       (double)(gs("calls/dma_map_pages") - m0) / reps);
			sample("gpu_pages_dma_mapped_per_reg", ps, s, round,
			       (double)(gs("pages_dma_mapped") - d0) / reps);
		}
	}
}

/* A fresh gpusim allocation of len bytes in contig-byte runs. */
static void galloc(struct gmem *g, size_t len, const char *contig)
{
	int e;

	if (gs_knob("contig_bytes", contig))
		bail("cannot set gpusim's contig_bytes to %s", contig);
	e = gmem_alloc(gfd, len, g);
	if (e)
		bail("GPUSIM_IOC_ALLOC of %zu bytes: %s", len, strerror(-e));
	memset(g->p, 0x5a, 4096);
}

/*
 * GPU free -> revoked, with n live registrations on a 4 MiB allocation (n
 * = 1: one over all of it; n = 64: one per 64 KiB GPU page). For the MR
 * sides: from GPUSIM_IOC_FREE until an RDMA WRITE into the last registered
 * MR completes in error (WRITEs that still succeed are retried). For the
 * floor: until the free returned, which is after every free callback ran
 * (gpusim waits for them; the test client's unmaps its DMA mapping).
 *
 * Also: GPU free -> pins back, until gpusim's live pins are back to what
 * they were before the registrations (every pin on the freed memory put:
 * the driver may reuse it). A free callback's pin goes when its callback
 * returns, inside the free; nv_mem's keeper pin (issue 22) stays until
 * the revocation work item put it. Polled right after the MR was seen
 * revoked (before the QPs the error completion killed are made again), so
 * it is at least the revocation's time, by construction.
 */
/* Polls until gpusim's live pins are back to lp0 (at most 30 s after t0); when. */
static double wait_pins_back(int s, long long lp0, double t0)
{
	while (gs("live_pins") > lp0) {
		if (now_s() - t0 > 30)
			bail("%s: %lld GPU pins still held 30 s after the free (%lld before the registrations)",
			     side_name[s], gs("live_pins"), lp0);
		usleep(50);
	}
	return now_s();
}

/* fig_scaling: the free figures under a name prefix and another parameter. */
static const char *free_prefix = "";
static char free_param[24];

static void fig_free(int s, int round, int n)
{
	struct reg r[NFREE_MRS];
	struct gmem g;
	struct peer_stats st0, st1;
	double t0, t1, t2, t3;
	int okw = 0, st;
	long long lp0 = gs("live_pins");
	char ps[24], fn[64];

	snprintf(ps, sizeof(ps), "%d", n);
	if (free_param[0])
		snprintf(ps, sizeof(ps), "%s", free_param);
	galloc(&g, FREE_LEN, "2097152");
	for (int i = 0; i < n; i++)
		reg_or_bail(s, g.p + (n == 1 ? 0 : i * SLICE), n == 1 ? FREE_LEN : SLICE, &r[i]);
	if (s != S_FLOOR) {
		st = write_poll(hmr, hbuf, 8, (uintptr_t)g.p + (n - 1) * (n == 1 ? 0 : SLICE),
				r[n - 1].mr->rkey);
		if (st)
			bail("%s: RDMA WRITE into a live MR failed (status %d)", side_name[s], st);
		peer_stats("nv_mem", &st0);
	}
	t0 = now_s();
	if (gmem_free(gfd, &g))
		bail("GPUSIM_IOC_FREE: %s", strerror(errno));
	t1 = now_s();
	if (s != S_FLOOR) {
		for (;;) {
			st = write_poll(hmr, hbuf, 8, (uintptr_t)g.p + (n - 1) * (n == 1 ? 0 : SLICE),
					r[n - 1].mr->rkey);
			if (st != IBV_WC_SUCCESS)
				break;
			if (++okw > 10000)
				bail("%s: RDMA WRITEs still succeed 10000 times after the GPU memory was freed",
				     side_name[s]);
		}
		t2 = now_s();
		t3 = wait_pins_back(s, lp0, t0);
		if (st < 0)
			bail("%s: no completion for the RDMA WRITE after the free", side_name[s]);
		peer_stats("nv_mem", &st1);
		if (st1.invalidated_mrs - st0.invalidated_mrs != n)
			diag("%s: the core counted %lld invalidated MRs for %d freed",
			     side_name[s], st1.invalidated_mrs - st0.invalidated_mrs, n);
		if (conn_qps(&c))	/* the error completion killed the QPs */
			bail("cannot recreate the QPs");
		if (!free_prefix[0])
			sample("free_revoke_writes_ok", ps, s, round, okw);
	} else {
		t2 = t1;
		t3 = wait_pins_back(s, lp0, t0);
		for (int i = 0; i < n; i++) {
			struct gpusim_tc_req q = { .id = r[i].id };

			if (ioctl(tcfd, GPUSIM_TC_STATUS, &q) || q.callbacks != 1 || q.pinned)
				bail("floor: registration %d not revoked by the free (callbacks %u)", i,
				     q.callbacks);
		}
	}
	snprintf(fn, sizeof(fn), "%sfree_ioctl_s", free_prefix);
	sample(fn, ps, s, round, t1 - t0);
	snprintf(fn, sizeof(fn), "%sfree_revoke_s", free_prefix);
	sample(fn, ps, s, round, t2 - t0);
	snprintf(fn, sizeof(fn), "%sfree_unpinned_s", free_prefix);
	sample(fn, ps, s, round, t3 - t0);
	for (int i = 0; i < n; i++)
		dereg_or_bail(s, &r[i]);
	gmem_drop(&g);
}

/*
 * What revocation events cost (issue 13), peermem only: GPU free of a 4
 * MiB allocation under 64 live MRs (one per GPU page), with /dev/peermem
 * open in this process (every free callback then bumps the counter and
 * queues a record before it invalidates) and closed (one atomic load per
 * revocation), in alternating order within the same round. The sample is
 * the GPUSIM_IOC_FREE call, inside which the 64 free callbacks run (each
 * invalidates through the core); the ratio open / closed is the cost.
 */
static void fig_free_events(int round)
{
	struct reg r[NFREE_MRS];
	struct peermem_event ev[NFREE_MRS + 1];
	struct gmem g;
	double t0, t1;

	for (int k = 0; k < 2; k++) {
		int open_ch = k ^ (round & 1), efd = -1;
		const struct peermem_gen_page *pg = NULL;
		ssize_t n;

		if (open_ch) {
			efd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK);
			pg = efd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ, MAP_SHARED, efd, 0);
			if (pg == MAP_FAILED)
				bail("cannot open and map %s: %s", PEERMEM_DEVICE_PATH, strerror(errno));
		}
		galloc(&g, FREE_LEN, "2097152");
		for (int i = 0; i < NFREE_MRS; i++)
			reg_or_bail(S_PM, g.p + i * SLICE, SLICE, &r[i]);
		t0 = now_s();
		if (gmem_free(gfd, &g))
			bail("GPUSIM_IOC_FREE: %s", strerror(errno));
		t1 = now_s();
		if (open_ch) {
			n = read(efd, ev, sizeof(ev));
			if (__atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE) != NFREE_MRS ||
			    n != NFREE_MRS * (ssize_t)sizeof(ev[0]))
				bail("events: %d MRs freed, generation %llu and %zd bytes of records",
				     NFREE_MRS, (unsigned long long)pg->generation, n);
			munmap((void *)pg, 4096);
			close(efd);
		}
		sample(open_ch ? "free_events_open_s" : "free_events_closed_s", "64", S_PM, round, t1 - t0);
		for (int i = 0; i < NFREE_MRS; i++)
			dereg_or_bail(S_PM, &r[i]);
		gmem_drop(&g);
	}
}

/*
 * Revocation cost against open files (issue 21, finding 2), peermem only:
 * an munmap of a registered 64 KiB range (peermem's notifier reports the
 * revocation inside the call, under the event lock; the invalidation
 * follows in a work item) while this process holds one /dev/peermem file
 * and N more are held by other processes (N/EVF_PER_CHILD children, each
 * a different user, each holding EVF_PER_CHILD files: the per-user limit's
 * default allows that many). A report that visits every open file costs
 * time in proportion to N; one that visits the revoked address space's
 * files only does not. Sample: each munmap (EVF_MRS per N and round).
 */
#define EVF_PER_CHILD 1000
#define EVF_MRS 16
static const int evf_n[] = { 0, 1000, 4000, 16000 };

/* Children holding n files open, as users 20000, 20001, ...; how many. */
static int evf_hold(int n, pid_t *pids, int *go_w)
{
	int nchild = (n + EVF_PER_CHILD - 1) / EVF_PER_CHILD, ready[2], go[2];
	char b;

	if (pipe(ready) || pipe(go))
		bail("pipe: %s", strerror(errno));
	fflush(stdout);
	for (int i = 0; i < nchild; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			struct rlimit rl = { EVF_PER_CHILD + 64, EVF_PER_CHILD + 64 };
			int want = n - i * EVF_PER_CHILD < EVF_PER_CHILD ? n - i * EVF_PER_CHILD : EVF_PER_CHILD;

			close(ready[0]);
			close(go[1]);
			if (setrlimit(RLIMIT_NOFILE, &rl) || setgid(20000 + i) || setuid(20000 + i))
				_exit(1);
			for (int k = 0; k < want; k++)
				if (open(PEERMEM_DEVICE_PATH, O_RDONLY) < 0)
					_exit(2);
			if (write(ready[1], "r", 1) != 1)
				_exit(3);
			(void)!read(go[0], &b, 1);	/* EOF: the parent is done */
			_exit(0);
		}
		if (pids[i] < 0)
			bail("fork: %s", strerror(errno));
	}
	close(ready[1]);
	close(go[0]);
	for (int i = 0; i < nchild; i++)
		if (read(ready[0], &b, 1) != 1)
			bail("events/files: a child could not open its %d files of /dev/peermem", EVF_PER_CHILD);
	close(ready[0]);
	*go_w = go[1];
	return nchild;
}

static void fig_events_files(int round)
{
	for (size_t j = 0; j < sizeof(evf_n) / sizeof(evf_n[0]); j++) {
		int n = evf_n[(j + round) % (sizeof(evf_n) / sizeof(evf_n[0]))];
		pid_t pids[64];
		struct reg r[EVF_MRS];
		struct gmem g[EVF_MRS];
		const struct peermem_gen_page *pg;
		int nchild, go_w = -1, efd, st;
		char param[16];
		double t0, t1;

		nchild = evf_hold(n, pids, &go_w);
		efd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK);
		pg = efd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ, MAP_SHARED, efd, 0);
		if (pg == MAP_FAILED)
			bail("cannot open and map %s: %s", PEERMEM_DEVICE_PATH, strerror(errno));
		for (int i = 0; i < EVF_MRS; i++) {
			galloc(&g[i], SLICE, "2097152");
			reg_or_bail(S_PM, g[i].p, SLICE, &r[i]);
		}
		snprintf(param, sizeof(param), "%d", n);
		/* Registration with n other files open (scaling, issue 26). */
		for (int k = 0; k < 8; k++) {
			struct reg q;

			t0 = now_s();
			reg_or_bail(S_PM, gcontig.p, SLICE, &q);
			dereg_or_bail(S_PM, &q);
			sample("events_files_regdereg_s", param, S_PM, round, now_s() - t0);
		}
		for (int i = 0; i < EVF_MRS; i++) {
			t0 = now_s();
			if (munmap(g[i].p, SLICE))
				bail("munmap: %s", strerror(errno));
			t1 = now_s();
			g[i].p = NULL;
			sample("events_files_unmap_s", param, S_PM, round, t1 - t0);
		}
		if (__atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE) != EVF_MRS)
			bail("events/files: %d MRs unmapped, generation %llu", EVF_MRS,
			     (unsigned long long)pg->generation);
		for (int i = 0; i < EVF_MRS; i++) {
			dereg_or_bail(S_PM, &r[i]);
			gmem_free(gfd, &g[i]);
		}
		munmap((void *)pg, 4096);
		close(efd);
		close(go_w);
		for (int i = 0; i < nchild; i++)
			waitpid(pids[i], &st, 0);
	}
}

/*
 * Scaling (--only scaling, issue 26): with n live 64 KiB registrations of
 * distinct GPU pages in this process (BENCH_SCALE_N, default 1,100,10000;
 * the first 8192 on the large allocation, the rest on a second one of 128
 * MiB, so at most 10240), the time of a reg + dereg of one more 64 KiB
 * range (8 of them: reg and dereg timed apart), and GPU free -> MR revoked
 * of one more MR on an allocation of its own (fig_free's figure). Peer
 * sides only (the floor's test client is no process-wide registration
 * table). Then, for peermem, the registration and munmap -> revoked
 * against open /dev/peermem files (fig_events_files).
 */
#define SCALE_MAX 10240
static struct gmem gscale;
static struct reg *scale_regs;

static void fig_scaling(int s, int round)
{
	const char *ns = getenv("BENCH_SCALE_N") ?: "1,100,10000";
	char buf[128], *save = NULL, param[24];

	if (s == S_FLOOR)
		goto files;
	if (!scale_regs && !(scale_regs = calloc(SCALE_MAX, sizeof(*scale_regs))))
		bail("out of memory");
	snprintf(buf, sizeof(buf), "%s", ns);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		long n = strtol(t, NULL, 10);
		size_t big_pages = large / SLICE;
		double t0, t1, t2;

		if (n < 1 || n > SCALE_MAX)
			bail("BENCH_SCALE_N: %s is not 1..%d", t, SCALE_MAX);
		if ((size_t)n > big_pages && !gscale.p)
			galloc(&gscale, SCALE_MAX * SLICE - large, "2097152");
		for (long i = 0; i < n; i++) {
			void *p = (size_t)i < big_pages ? gbig.p + i * SLICE
							: gscale.p + (i - big_pages) * SLICE;

			reg_or_bail(s, p, SLICE, &scale_regs[i]);
		}
		snprintf(param, sizeof(param), "%ld", n);
		for (int k = 0; k < 8; k++) {
			struct reg q;

			t0 = now_s();
			reg_or_bail(s, gcontig.p, SLICE, &q);
			t1 = now_s();
			dereg_or_bail(s, &q);
			t2 = now_s();
			sample("scale_reg_s", param, s, round, t1 - t0);
			sample("scale_dereg_s", param, s, round, t2 - t1);
			sample("scale_regdereg_s", param, s, round, t2 - t0);
		}
		free_prefix = "scale_";
		snprintf(free_param, sizeof(free_param), "%ld", n);
		fig_free(s, round, 1);
		free_prefix = "";
		free_param[0] = 0;
		t0 = now_s();
		for (long i = 0; i < n; i++)
			dereg_or_bail(s, &scale_regs[i]);
		sample("scale_dereg_all_s", param, s, round, now_s() - t0);
	}
files:
	if (s == S_PM)
		fig_events_files(round);
}

/*
 * munmap -> revoked (peermem's mmu notifier). nvidia-peermem has none: it
 * keeps serving the old memory; checked and said once, no figure.
 */
static void fig_munmap(int s, int round)
{
	struct reg r;
	struct gmem g;
	double t0, t1;
	int st, okw = 0;

	if (s == S_FLOOR || (s == S_NV && round > 0))
		return;
	galloc(&g, FREE_LEN, "2097152");
	reg_or_bail(s, g.p, FREE_LEN, &r);
	st = write_poll(hmr, hbuf, 8, (uintptr_t)g.p, r.mr->rkey);
	if (st)
		bail("%s: RDMA WRITE into a live MR failed (status %d)", side_name[s], st);
	t0 = now_s();
	if (munmap(g.p, g.len))
		bail("munmap: %s", strerror(errno));
	for (;;) {
		st = write_poll(hmr, hbuf, 8, (uintptr_t)g.p, r.mr->rkey);
		if (st != IBV_WC_SUCCESS)
			break;
		okw++;
		if (s == S_NV && okw == 3)
			break;
		if (okw > 10000)
			bail("%s: RDMA WRITEs still succeed 10000 times after munmap", side_name[s]);
	}
	t1 = now_s();
	if (st < 0)
		bail("%s: no completion for the RDMA WRITE after munmap", side_name[s]);
	if (s == S_NV) {
		printf("info munmap_revoke nvidia-peermem %s (%d RDMA WRITEs after munmap succeeded)\n",
		       st == IBV_WC_SUCCESS ? "never" : "revoked", okw);
	} else {
		sample("munmap_revoke_s", "1", s, round, t1 - t0);
		sample("munmap_revoke_writes_ok", "1", s, round, okw);
	}
	if (st != IBV_WC_SUCCESS && conn_qps(&c))
		bail("cannot recreate the QPs");
	g.p = NULL;	/* unmapped */
	if (gmem_free(gfd, &g))
		bail("GPUSIM_IOC_FREE: %s", strerror(errno));
	dereg_or_bail(s, &r);
}

/* 1 vs 2 threads registering different 2 MiB ranges concurrently. */
struct thr {
	int side, fd, ops, err;
	uint8_t *p;
	pthread_barrier_t *bar;
	double t0, t1;		/* the thread's own first start and last end */
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;

	pthread_barrier_wait(t->bar);
	t->t0 = now_s();
	for (int i = 0; i < t->ops && !t->err; i++) {
		struct reg r;

		t->err = side_reg(t->side, t->fd, c.pd, t->p, 2 * MIB, &r);
		if (!t->err)
			t->err = side_dereg(t->side, t->fd, &r);
	}
	t->t1 = now_s();
	return NULL;
}

static double thr_run(int s, int nthr, int ops)
{
	pthread_barrier_t bar;
	pthread_t tid[2];
	struct thr t[2];
	double t0, t1;

	pthread_barrier_init(&bar, NULL, nthr + 1);
	for (int i = 0; i < nthr; i++) {
		/* Host memory (S_HOST): 2 MiB each out of hbig; GPU: 32 MiB apart. */
		uint8_t *p = s == S_HOST ? hbig + i * 2 * MIB : gbig.p + i * 32 * MIB;

		t[i] = (struct thr){ .side = s, .ops = ops, .p = p, .bar = &bar };
		/* Own test client file per thread: its registrations' lock is per file. */
		t[i].fd = s == S_FLOOR ? open("/dev/gpusim_testclient", O_RDWR) : -1;
		if (s == S_FLOOR && t[i].fd < 0)
			bail("open /dev/gpusim_testclient: %s", strerror(errno));
		if (pthread_create(&tid[i], NULL, thr_main, &t[i]))
			bail("pthread_create failed");
	}
	pthread_barrier_wait(&bar);
	for (int i = 0; i < nthr; i++)
		pthread_join(tid[i], NULL);
	pthread_barrier_destroy(&bar);
	/*
	 * From the first thread's start to the last one's end, as the threads
	 * saw them: the main thread may run again only after the workers are
	 * done (2 vCPUs, 3 threads), so its own clock would miss their work.
	 */
	t0 = t[0].t0;
	t1 = t[0].t1;
	for (int i = 1; i < nthr; i++) {
		t0 = fmin(t0, t[i].t0);
		t1 = fmax(t1, t[i].t1);
	}
	for (int i = 0; i < nthr; i++) {
		if (t[i].fd >= 0)
			close(t[i].fd);
		if (t[i].err)
			bail("%s: thread %d: registration failed: %s", side_name[s], i,
			     strerror(-t[i].err));
	}
	return t1 - t0;
}

static void fig_threads(int s, int round)
{
	int ops = smoke ? 2 : 8;

	/* In the floor's turn also host memory: how rxe and uverbs scale alone. */
	for (int h = 0; h <= (s == S_FLOOR); h++) {
		int side = h ? S_HOST : s;
		double t1 = thr_run(side, 1, ops), t2 = thr_run(side, 2, ops);

		sample("thr1_ops_per_s", "2M", side, round, ops / t1);
		sample("thr2_ops_per_s", "2M", side, round, 2 * ops / t2);
		sample("thr2_over_thr1", "2M", side, round, (2 * ops / t2) / (ops / t1));
	}
}

/*
 * Kernel memory, in bytes: free pages counted exactly (the free lists of
 * every zone plus the per-CPU lists, which MemFree leaves out, after
 * folding the per-CPU counter deltas with vm.stat_refresh) and the slab.
 */
struct meminfo {
	long long free, slab;
};

static void meminfo(struct meminfo *m, int settle_ms)
{
	char line[256], key[64];
	long long v, pages = 0;
	FILE *f;

	usleep(settle_ms * 1000);
	write_str("/proc/sys/vm/stat_refresh", "1");
	memset(m, 0, sizeof(*m));
	f = fopen("/proc/zoneinfo", "r");
	if (!f)
		bail("cannot read /proc/zoneinfo");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, " %63s %lld", key, &v) == 2 &&
		    (!strcmp(key, "nr_free_pages") || !strcmp(key, "count:")))
			pages += v;
	fclose(f);
	m->free = pages * sysconf(_SC_PAGESIZE);
	f = fopen("/proc/meminfo", "r");
	if (!f)
		bail("cannot read /proc/meminfo");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Slab: %lld", &v) == 1)
			m->slab = v * 1024;
	fclose(f);
}

/*
 * --memory-detail: what the memory figures' free pages went to, by counter.
 * A snapshot holds, in bytes: each slab cache's objects in use
 * ("slab_objs:NAME", active_objs x objsize of /proc/slabinfo) and the pages
 * of its slabs ("slab_pages:NAME", num_slabs x pagesperslab), every
 * /proc/meminfo line ("meminfo:KEY") and every nr_* counter of /proc/vmstat
 * ("vmstat:KEY", pages x the page size, or bytes for the *_B ones). Taken
 * right after meminfo() (which folded the per-CPU counters).
 */
#define SNAP_KEYS 1024

struct snap {
	int n;
	char key[SNAP_KEYS][80];
	long long v[SNAP_KEYS];
};

static void snap_add(struct snap *s, const char *pre, const char *key, long long v)
{
	if (s->n == SNAP_KEYS)
		bail("--memory-detail: more than %d counters", SNAP_KEYS);
	snprintf(s->key[s->n], sizeof(s->key[0]), "%s:%s", pre, key);
	s->v[s->n++] = v;
}

static void snapshot(struct snap *s)
{
	long long pg = sysconf(_SC_PAGESIZE), a, nobj, osz, per, pps, as, ns, v;
	char line[512], name[64];
	FILE *f;

	s->n = 0;
	f = fopen("/proc/slabinfo", "r");
	if (!f)
		bail("--memory-detail: cannot read /proc/slabinfo: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %lld %lld %lld %lld %lld : tunables %*d %*d %*d : slabdata %lld %lld",
			   name, &a, &nobj, &osz, &per, &pps, &as, &ns) == 8) {
			snap_add(s, "slab_objs", name, a * osz);
			snap_add(s, "slab_pages", name, ns * pps * pg);
		}
	fclose(f);
	f = fopen("/proc/meminfo", "r");
	if (!f)
		bail("cannot read /proc/meminfo");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63[^:]: %lld", name, &v) == 2)
			snap_add(s, "meminfo", name, strstr(line, " kB") ? v * 1024 : v);
	fclose(f);
	f = fopen("/proc/vmstat", "r");
	if (!f)
		bail("cannot read /proc/vmstat");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %lld", name, &v) == 2 && !strncmp(name, "nr_", 3)) {
			size_t l = strlen(name);

			snap_add(s, "vmstat", name, l > 2 && !strcmp(name + l - 2, "_B") ? v : v * pg);
		}
	fclose(f);
}

/*
 * One "memdetail FIGURE PARAM SIDE ROUND KEY BYTES" line per counter that
 * moved between a and b, per registration (tests/bench/report.py memdetail
 * makes the table).
 */
static void snap_diff(const struct snap *a, const struct snap *b, const char *fig,
		      const char *param, int side, int round, int n)
{
	for (int i = 0; i < b->n; i++) {
		long long va = 0;

		for (int j = 0; j < a->n; j++) {
			int k = (i + j) % a->n;	/* the same order, mostly */

			if (!strcmp(a->key[k], b->key[i])) {
				va = a->v[k];
				break;
			}
		}
		if (b->v[i] != va)
			printf("memdetail %s %s %s %d %s %.9g\n", fig, param, side_name[side], round,
			       b->key[i], (double)(b->v[i] - va) / n);
	}
}

/*
 * Kernel memory per live registration: n registrations of len bytes live
 * at once (distinct ranges at 2 MiB, the same range at the large size):
 * free pages and slab before and while they live, per registration. Free
 * pages cover every kernel allocation (slab, page allocations, the IOMMU's
 * page tables, vmalloc); the program allocates nothing in between.
 * core_only: the same through the rig core's umem_test hook (core and
 * client, no rxe MR and no uverbs object), for the MR sides.
 */
#define MEM_NREG 256	/* live registrations at most (256 x 2 MiB = 512 MiB) */

static void fig_memory(int s, int round, size_t len, int n, int core_only)
{
	static struct reg r[MEM_NREG];
	static int ufd[MEM_NREG];
	static struct snap sa, sb;
	struct meminfo a, b, e;
	long long runs0 = 0;
	char ps[24];

	if (core_only && s == S_FLOOR)
		return;
	if (n > MEM_NREG)
		n = MEM_NREG;
	size_str(len, ps, sizeof(ps));
	if (mem_detail)
		runs0 = gs("dma_runs_mapped");
	/* The smoke does not judge the figures: a shorter settle (CI's time). */
	meminfo(&a, smoke ? 30 : 300);
	if (mem_detail)
		snapshot(&sa);
	for (int i = 0; i < n; i++) {
		uint8_t *p = gbig.p + (len == large ? 0 : i * len);

		if (!core_only) {
			reg_or_bail(s, p, len, &r[i]);
			continue;
		}
		ufd[i] = open(UMEM_TEST, O_RDWR);
		if (ufd[i] < 0 || umem_get(ufd[i], RXE_DEV, p, len, "mr"))
			bail("%s: umem_test of %zu bytes failed", side_name[s], len);
	}
	meminfo(&b, smoke ? 30 : 300);
	if (mem_detail) {
		snapshot(&sb);
		snap_diff(&sa, &sb, core_only ? "core_kmem_per_reg_bytes" : "kmem_per_reg_bytes",
			  ps, s, round, n);
		/* A count, not bytes: the runs the source's mappings came in. */
		printf("memdetail %s %s %s %d count:gpusim_dma_runs_mapped %.9g\n",
		       core_only ? "core_kmem_per_reg_bytes" : "kmem_per_reg_bytes", ps,
		       side_name[s], round, (double)(gs("dma_runs_mapped") - runs0) / n);
	}
	for (int i = 0; i < n; i++) {
		if (core_only)
			close(ufd[i]);
		else
			dereg_or_bail(s, &r[i]);
	}
	meminfo(&e, smoke ? 30 : 300);
	sample(core_only ? "core_kmem_per_reg_bytes" : "kmem_per_reg_bytes", ps, s, round,
	       (double)(a.free - b.free) / n);
	sample(core_only ? "core_slab_per_reg_bytes" : "slab_per_reg_bytes", ps, s, round,
	       (double)(b.slab - a.slab) / n);
	sample(core_only ? "core_kmem_after_dereg_bytes" : "kmem_after_dereg_bytes", ps, s,
	       round, (double)(a.free - e.free));
}

/*
 * Scatter entries per registered GiB, for 64 MiB registrations of memory
 * in one run per 4 MiB (contig_bytes 0: gpusim's largest run) and in one
 * run per 64 KiB GPU page. The MR sides: the core's num_reg_pages (the DMA
 * entries of the table the client handed over). The floor: the DMA-
 * contiguous runs of its mapping, split at the DMA device's max segment
 * size and boundary (what the device can take). For every side also the
 * bus-contiguous runs of the very mapping gpusim handed out for this
 * registration (its dma_runs_mapped counter): behind the IOMMU each mapping
 * gets its own bus addresses, so the runs differ from mapping to mapping,
 * and a client is judged against the runs it was given.
 */
static void fig_sg(int s, int round)
{
	struct gmem *gm[2] = { &gcontig, &gfrag };
	const char *what[2] = { "contig", "64K" };
	/* The smoke registers 8 MiB of each (the figure is per GiB; CI's time). */
	size_t len = smoke ? 8 * MIB : SG_LEN;

	for (int i = 0; i < 2; i++) {
		struct peer_stats p0, p1;
		struct reg r;
		long long runs0 = gs("dma_runs_mapped");
		double v;

		if (s != S_FLOOR && peer_stats("nv_mem", &p0))
			bail("no core counters for nv_mem");
		reg_or_bail(s, gm[i]->p, len, &r);
		sample("source_dma_runs_per_gib", what[i], s, round,
		       (gs("dma_runs_mapped") - runs0) * (double)(1024 * MIB / len));
		if (s != S_FLOOR) {
			peer_stats("nv_mem", &p1);
			v = p1.reg_pages - p0.reg_pages;
		} else {
			/* What the device can take: runs split at its segment limits. */
			v = r.q.dma_segs;
			sample("source_phys_runs_per_gib", what[i], s, round,
			       r.q.runs * (double)(1024 * MIB / len));
			sample("source_dma_entries_per_gib", what[i], s, round,
			       r.q.dma_entries * (double)(1024 * MIB / len));
		}
		sample("sg_entries_per_gib", what[i], s, round, v * (1024 * MIB / len));
		dereg_or_bail(s, &r);
	}
}

/*
 * Where the time goes, in layers, 2 MiB: the MR sides' registration
 * through the core and the client alone (the rig core's umem_test hook:
 * ib_umem_get_peer on rxe0 with no MR, no uverbs object; closing the file
 * releases it), and in the floor's turn the same ibv_reg_mr/ibv_dereg_mr
 * on 2 MiB of host memory (rxe and uverbs, no peer client).
 */
static void fig_layers(int s, int round)
{
	int reps = smoke ? 1 : 6;

	for (int k = 0; k < reps; k++) {
		double t0, t1, t2;

		if (s == S_FLOOR) {
			struct ibv_mr *mr;

			t0 = now_s();
			mr = ibv_reg_mr(c.pd, hbig, 2 * MIB, MR_ACCESS);
			t1 = now_s();
			if (!mr || ibv_dereg_mr(mr))
				bail("ibv_reg_mr/ibv_dereg_mr of host memory failed");
			t2 = now_s();
			sample("reg_s", "2M", S_HOST, round, t1 - t0);
			sample("dereg_s", "2M", S_HOST, round, t2 - t1);
			sample("regdereg_s", "2M", S_HOST, round, t2 - t0);
		} else {
			int fd = open(UMEM_TEST, O_RDWR), e;

			if (fd < 0)
				bail("cannot open " UMEM_TEST ": %s", strerror(errno));
			t0 = now_s();
			e = umem_get(fd, RXE_DEV, gbig.p, 2 * MIB, "mr");
			t1 = now_s();
			close(fd);
			t2 = now_s();
			if (e)
				bail("%s: umem_test of 2 MiB: %s", side_name[s], strerror(-e));
			sample("core_reg_s", "2M", s, round, t1 - t0);
			sample("core_dereg_s", "2M", s, round, t2 - t1);
			sample("core_regdereg_s", "2M", s, round, t2 - t0);
		}
	}
}

static void run_side(int s, int round)
{
	struct reg r;

	use_side(s);
	/*
	 * Warm the path after a (re)load: once, or BENCH_WARM times at 64 KiB
	 * and at 2 MiB (issue 26: under TCG a freshly loaded module's code is
	 * translated again as it first runs, which weighs on the first
	 * registrations of each round; every side gets the same warm-up).
	 */
	{
		int warm = getenv("BENCH_WARM") ? atoi(getenv("BENCH_WARM")) : 0;

		if (warm < 0 || warm > 10000)
			bail("BENCH_WARM: 0..10000");
		reg_or_bail(s, gbig.p, 2 * MIB, &r);
		dereg_or_bail(s, &r);
		for (int k = 0; k < warm; k++) {
			reg_or_bail(s, gbig.p, 64 * 1024, &r);
			dereg_or_bail(s, &r);
			reg_or_bail(s, gbig.p, 2 * MIB, &r);
			dereg_or_bail(s, &r);
		}
	}
	if (mem_detail)
		goto memory;
	if (want("latency"))
		fig_latency(s, round);
	if (want("pincost"))
		fig_pincost(s, round);
	if (named("scaling"))
		fig_scaling(s, round);
	if (want("layers"))
		fig_layers(s, round);
	if (want("free")) {
		fig_free(s, round, 1);
		/* The smoke keeps the figure, not its size (each MR costs ~0.1 s in the rig). */
		fig_free(s, round, smoke ? 8 : NFREE_MRS);
	}
	if (want("munmap"))
		fig_munmap(s, round);
	if (s == S_PM && want("events"))
		fig_free_events(round);
	if (want("threads"))
		fig_threads(s, round);
	if (!want("memory"))
		goto sg;
	/*
	 * Many small registrations, so that what they hold outgrows what the
	 * slab caches keep free (SLUB's per-CPU and partial slabs): counted in
	 * free pages, a few dozen small objects can come out of slack alone.
	 */
memory:
	fig_memory(s, round, 2 * MIB, smoke ? 4 : (int)(large / (2 * MIB)), 0);
	fig_memory(s, round, large, smoke ? 1 : 4, 0);
	fig_memory(s, round, 2 * MIB, smoke ? 4 : (int)(large / (2 * MIB)), 1);
	fig_memory(s, round, large, smoke ? 1 : 4, 1);
sg:
	if (!mem_detail && want("sg"))
		fig_sg(s, round);
}

/*
 * --profile SIDE free N: N times a 4 MiB allocation with 64 live MRs (one
 * per 64 KiB GPU page, as fig_free) and its GPUSIM_IOC_FREE, with perf's
 * events enabled around the free alone (ctl: perf runs with --control);
 * then the MRs are deregistered. Prints the frees' wall time: the samples
 * per free against it say how much of a free the CPUs were busy.
 */
#define PERF_CTL "/tmp/bench-perf.ctl"
#define PERF_ACK "/tmp/bench-perf.ack"

static void perf_ctl(const char *cmd)
{
	char ack[16] = "";
	int fd = open(PERF_CTL, O_WRONLY), afd;

	if (fd < 0 || write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd))
		bail("perf control %s: %s", PERF_CTL, strerror(errno));
	close(fd);
	afd = open(PERF_ACK, O_RDONLY);
	if (afd < 0 || read(afd, ack, sizeof(ack) - 1) <= 0 || strncmp(ack, "ack", 3))
		bail("perf did not acknowledge '%s' on %s", cmd, PERF_ACK);
	close(afd);
}

static void prof_free_loop(int s, int n, int ctl)
{
	struct reg r[NFREE_MRS];
	double t[MAXS], sum = 0;
	struct series tmp = { .n = 0 };

	if (n > MAXS)
		n = MAXS;
	for (int k = 0; k < n; k++) {
		struct gmem g;
		double t0;

		galloc(&g, FREE_LEN, "2097152");
		for (int i = 0; i < NFREE_MRS; i++)
			reg_or_bail(s, g.p + i * SLICE, SLICE, &r[i]);
		if (ctl)
			perf_ctl("enable\n");
		t0 = now_s();
		if (gmem_free(gfd, &g))
			bail("GPUSIM_IOC_FREE: %s", strerror(errno));
		t[k] = now_s() - t0;
		if (ctl)
			perf_ctl("disable\n");
		sum += t[k];
		for (int i = 0; i < NFREE_MRS; i++)
			dereg_or_bail(s, &r[i]);
		gmem_drop(&g);
	}
	memcpy(tmp.v, t, n * sizeof(double));
	tmp.n = n;
	printf("profile %s free: %d GPUSIM_IOC_FREE of 4 MiB under %d MRs, median %.3f ms, sum %.3f s (perf enabled around the frees only)\n",
	       side_name[s], n, NFREE_MRS, median(&tmp) * 1e3, sum);
}

/*
 * BENCH_PROF_COUNTERS=1 (--profile, registrations): the kernel's own
 * counters around the loop, per reg+dereg: this thread's CPU time and
 * context switches (getrusage: a voluntary switch is a sleep: a mutex, a
 * completion, a flush, a grace period), the whole guest's busy CPU time
 * (/proc/stat: work done beside the thread, on the other vCPU), and every
 * row of /proc/softirqs and /proc/interrupts summed over the CPUs (RCU
 * softirqs, IPIs: TLB shootdowns, function calls, rescheduling). A CPU
 * profile cannot see a sleep; these can, without a tracer (the benchmark
 * kernel has no ftrace, kprobes or BPF).
 */
#define NCROWS 96
struct crow {
	char name[24];
	double v;
};
#define NCTASKS 1024
struct ctask {
	int tid;
	char comm[20];
	double ticks;
};
struct csnap {
	double wall, utime, stime, nvcsw, nivcsw, busy, idle;
	int n, nt;
	struct crow row[NCROWS];
	struct ctask task[NCTASKS];
};

/* Every task's CPU ticks (utime + stime of /proc/PID/task/TID/stat). */
static void csnap_tasks(struct csnap *c)
{
	DIR *pd = opendir("/proc");
	struct dirent *pe;

	if (!pd)
		return;
	while ((pe = readdir(pd)) && c->nt < NCTASKS) {
		char path[600];
		DIR *td;
		struct dirent *te;

		if (!isdigit((unsigned char)pe->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/task", pe->d_name);
		td = opendir(path);
		if (!td)
			continue;
		while ((te = readdir(td)) && c->nt < NCTASKS) {
			char buf[1024], *rp;
			unsigned long long ut, st;
			FILE *f;
			int ok;

			if (!isdigit((unsigned char)te->d_name[0]))
				continue;
			snprintf(path, sizeof(path), "/proc/%s/task/%s/stat", pe->d_name, te->d_name);
			f = fopen(path, "r");
			if (!f)
				continue;
			ok = fgets(buf, sizeof(buf), f) != NULL;
			fclose(f);
			rp = ok ? strrchr(buf, ')') : NULL;
			/* After "(comm)": state, then fields 4..13, then utime, stime. */
			if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
				continue;
			c->task[c->nt].tid = atoi(te->d_name);
			*rp = 0;
			snprintf(c->task[c->nt].comm, sizeof(c->task[c->nt].comm), "%s", strchr(buf, '(') + 1);
			c->task[c->nt].ticks = ut + st;
			c->nt++;
		}
		closedir(td);
	}
	closedir(pd);
}

static void csnap_rows(struct csnap *c, const char *path, const char *prefix)
{
	char line[4096];
	FILE *f = fopen(path, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f) && c->n < NCROWS) {
		char *tok, *save = NULL, name[24];
		double sum = 0;
		int any = 0, k;

		tok = strtok_r(line, " \t\n", &save);
		if (!tok || tok[strlen(tok) - 1] != ':')
			continue;
		tok[strlen(tok) - 1] = 0;
		/* Device interrupt lines (numbered) are summed into one row. */
		snprintf(name, sizeof(name), "%s%s", prefix,
			 isdigit((unsigned char)tok[0]) ? "dev-irqs" : tok);
		while ((tok = strtok_r(NULL, " \t\n", &save)) && isdigit((unsigned char)tok[0])) {
			sum += strtod(tok, NULL);
			any = 1;
		}
		if (!any)
			continue;
		for (k = 0; k < c->n && strcmp(c->row[k].name, name); k++)
			;
		if (k == c->n) {
			snprintf(c->row[k].name, sizeof(c->row[k].name), "%s", name);
			c->row[k].v = 0;
			c->n++;
		}
		c->row[k].v += sum;
	}
	fclose(f);
}

static void csnap_take(struct csnap *c)
{
	struct rusage ru;
	unsigned long long v[10] = { 0 };
	FILE *f;

	memset(c, 0, sizeof(*c));
	csnap_tasks(c);
	csnap_rows(c, "/proc/softirqs", "softirq ");
	csnap_rows(c, "/proc/interrupts", "irq ");
	f = fopen("/proc/stat", "r");
	if (f) {
		if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
			   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8)
			memset(v, 0, sizeof(v));
		fclose(f);
	}
	c->busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / sysconf(_SC_CLK_TCK);
	c->idle = (double)(v[3] + v[4]) / sysconf(_SC_CLK_TCK);
	getrusage(RUSAGE_SELF, &ru);
	c->utime = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6;
	c->stime = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
	c->nvcsw = ru.ru_nvcsw;
	c->nivcsw = ru.ru_nivcsw;
	c->wall = now_s();
}

static void csnap_print(int s, const struct csnap *a, const struct csnap *b, int n)
{
	const char *side = side_name[s];

	printf("counter %s wall_us %.2f\n", side, (b->wall - a->wall) * 1e6 / n);
	printf("counter %s thread_cpu_us %.2f\n", side, (b->utime + b->stime - a->utime - a->stime) * 1e6 / n);
	printf("counter %s thread_sys_us %.2f\n", side, (b->stime - a->stime) * 1e6 / n);
	printf("counter %s voluntary_switches %.4f\n", side, (b->nvcsw - a->nvcsw) / n);
	printf("counter %s involuntary_switches %.4f\n", side, (b->nivcsw - a->nivcsw) / n);
	printf("counter %s guest_busy_us %.2f\n", side, (b->busy - a->busy) * 1e6 / n);
	printf("counter %s guest_idle_us %.2f\n", side, (b->idle - a->idle) * 1e6 / n);
	for (int k = 0; k < b->n; k++) {
		double before = 0;

		for (int j = 0; j < a->n; j++)
			if (!strcmp(a->row[j].name, b->row[k].name))
				before = a->row[j].v;
		if (b->row[k].v != before)
			printf("counter %s %s %.4f\n", side, b->row[k].name, (b->row[k].v - before) / n);
	}
	/* The tasks that took CPU during the loop (ticks of 1/CLK_TCK s). */
	for (int k = 0; k < b->nt; k++) {
		double before = 0;

		for (int j = 0; j < a->nt; j++)
			if (a->task[j].tid == b->task[k].tid)
				before = a->task[j].ticks;
		if (b->task[k].ticks > before)
			printf("counter %s task_us %s/%d %.2f\n", side, b->task[k].comm, b->task[k].tid,
			       (b->task[k].ticks - before) * 1e6 / sysconf(_SC_CLK_TCK) / n);
	}
}

static int idle_all(void)
{
	/*
	 * BENCH_PM_FOREIGN=1 (scripts/bench.sh with BENCH_PM_KO): peermem's
	 * turn runs another module under peermem's name, which has none of
	 * peermem's counters; gpusim's say whether it let go of everything.
	 */
	int foreign = getenv("BENCH_PM_FOREIGN") && !strcmp(getenv("BENCH_PM_FOREIGN"), "1");

	return gs("live_pins") == 0 && gs("live_dma_mappings") == 0 &&
	       (!loaded("peermem") || foreign || pm_idle());
}

int main(int argc, char **argv)
{
	char ko[512], args[160], buf[64];
	const char *dev = getenv("PEERMEM_DMA_DEVICE");
	double t_start = now_s();
	int idle;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--large") && i + 1 < argc)
			large = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--smoke"))
			smoke = 1;
		else if (!strcmp(argv[i], "--events-only"))
			events_only = 1;
		else if (!strcmp(argv[i], "--memory-detail"))
			mem_detail = 1;
		else if (!strcmp(argv[i], "--tap"))
			tap_mode = 1;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--profile") && i + 3 < argc) {
			for (prof_side = 0; prof_side < NSIDES; prof_side++)
				if (!strcmp(argv[i + 1], side_name[prof_side]))
					break;
			prof_free = !strcmp(argv[i + 2], "free");
			prof_len = prof_free ? 2 * MIB : strtoull(argv[i + 2], NULL, 0);
			prof_n = atoi(argv[i + 3]);
			i += 3;
			if (prof_side == NSIDES || prof_len % GPU_PAGE || !prof_len || prof_n < 1)
				bail("--profile SIDE BYTES|free N: SIDE peermem, nvidia-peermem or floor; BYTES a multiple of 64 KiB up to --large");
		} else
			bail("usage: bench_peermem [--rounds N] [--large BYTES] [--smoke] [--tap] [--events-only] [--memory-detail] [--only GROUPS] [--profile SIDE BYTES|free N]");
	}
	if (rounds < 1 || rounds > 1000)
		bail("--rounds must be 1..1000");
	if (large < 64 * MIB || large % (2 * MIB))
		bail("--large must be a multiple of 2 MiB, at least 64 MiB");
	if (!dev || !*dev)
		bail("PEERMEM_DMA_DEVICE is not set: run this in the rig (its init exports the RDMA DMA device)");
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* Modules: gpusim, the test client for the DMA device, no peer client yet. */
	if (loaded("peer_refclient") && run("rmmod peer_refclient"))
		bail("cannot unload the reference client (it would claim gpusim memory)");
	for (int s = 0; s < 2; s++)
		if (unload_side(s))
			bail("cannot unload %s", side_mod[s]);
	if (!loaded("gpusim"))
		insmod("GPUSIM_KO", "tests/gpusim/gpusim.ko", "");
	if (loaded("gpusim_testclient") && run("rmmod gpusim_testclient"))
		bail("cannot unload gpusim_testclient (to reload it for %s)", dev);
	snprintf(args, sizeof(args), "peer=%s", dev);
	insmod("TESTCLIENT_KO", "tests/gpusim/testclient/gpusim_testclient.ko", args);
	for (int s = 0; s < (events_only ? 1 : 2); s++)	/* all there before the first round */
		ko_path(side_env[s], side_def[s], ko, sizeof(ko));
	gs_defaults();
	snprintf(buf, sizeof(buf), "%zu", large + 64 * MIB);
	if (gs_knob("max_alloc_bytes", buf))
		bail("cannot raise gpusim's max_alloc_bytes");
	rxe_up();
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	gfd = open("/dev/gpusim", O_RDWR);
	tcfd = open("/dev/gpusim_testclient", O_RDWR);
	if (gfd < 0 || tcfd < 0)
		bail("cannot open /dev/gpusim or /dev/gpusim_testclient: %s", strerror(errno));
	hbuf = aligned_alloc(4096, 4096);
	hbig = aligned_alloc(4096, 4 * MIB);
	if (!hbuf || !hbig)
		bail("out of memory");
	memset(hbig, 0x3c, 4 * MIB);
	memset(hbuf, 0xa5, 4096);
	hmr = ibv_reg_mr(c.pd, hbuf, 4096, MR_ACCESS);
	if (!hmr)
		bail("host MR: %s", strerror(errno));
	galloc(&gbig, large, "2097152");
	galloc(&gcontig, SG_LEN, "0");
	galloc(&gfrag, SG_LEN, "65536");
	gs_knob("contig_bytes", "65536");

	if (prof_side >= 0) {
		const char *perf_out = getenv("BENCH_PERF_OUT");
		struct reg r;
		double t0, t1;
		pid_t perf = -1;

		if (prof_len > large)
			bail("--profile: at most --large bytes");
		/* BENCH_PROF_THREADS=2: two threads on distinct 2 MiB ranges, as fig_threads. */
		if (getenv("BENCH_PROF_THREADS"))
			prof_threads = atoi(getenv("BENCH_PROF_THREADS"));
		if (prof_threads != 1 && (prof_threads != 2 || prof_len != 2 * MIB))
			bail("BENCH_PROF_THREADS: 1, or 2 with 2 MiB registrations");
		use_side(prof_side);
		reg_or_bail(prof_side, gbig.p, prof_len, &r);	/* warm */
		dereg_or_bail(prof_side, &r);
		/* BENCH_PERF_OUT=FILE: a system-wide perf record around the loop only. */
		if (perf_out) {
			/*
			 * BENCH_PERF_CALLGRAPH=1: with kernel call chains (perf -g:
			 * the kernel's ORC unwinder, no frame pointers needed).
			 * The free profile starts perf with its events disabled and
			 * enables them around each GPUSIM_IOC_FREE only, through
			 * perf's control FIFO (perf_ctl).
			 */
			const char *av[24];
			int ac = 0;

			av[ac++] = "perf"; av[ac++] = "record"; av[ac++] = "-q"; av[ac++] = "-a";
			/*
			 * BENCH_PERF_EVENT=EVENT (a software event: cs): one sample
			 * per event (-c 1) instead of the cpu-clock sampling.
			 */
			if (getenv("BENCH_PERF_EVENT") && *getenv("BENCH_PERF_EVENT")) {
				av[ac++] = "-e"; av[ac++] = getenv("BENCH_PERF_EVENT");
				av[ac++] = "-c"; av[ac++] = "1";
			} else {
				av[ac++] = "-e"; av[ac++] = "cpu-clock"; av[ac++] = "-F"; av[ac++] = "4000";
			}
			av[ac++] = "-o"; av[ac++] = perf_out;
			if (getenv("BENCH_PERF_CALLGRAPH") && !strcmp(getenv("BENCH_PERF_CALLGRAPH"), "1"))
				av[ac++] = "-g";
			if (prof_free) {
				unlink(PERF_CTL);
				unlink(PERF_ACK);
				if (mkfifo(PERF_CTL, 0600) || mkfifo(PERF_ACK, 0600))
					bail("mkfifo %s, %s: %s", PERF_CTL, PERF_ACK, strerror(errno));
				av[ac++] = "-D"; av[ac++] = "-1";
				av[ac++] = "--control=fifo:" PERF_CTL "," PERF_ACK;
			}
			av[ac] = NULL;
			fflush(stdout);
			unlink(perf_out);	/* the file that says perf is up (below) */
			perf = fork();
			if (perf == 0) {
				execvp("perf", (char *const *)av);
				_exit(127);
			}
			if (perf < 0)
				bail("fork: %s", strerror(errno));
			/*
			 * perf is up: its output file exists (it writes the header
			 * once its events are open), plus 2 s; a loaded host may
			 * take longer than the 2 s alone, and a SIGINT before that
			 * leaves no file.
			 */
			for (int w = 0; w < 600 && access(perf_out, R_OK); w++)
				usleep(100000);
			sleep(2);
		}
		t0 = now_s();
		if (prof_free) {
			prof_free_loop(prof_side, prof_n, perf > 0);
		} else if (prof_threads == 2) {	/* 2 threads, prof_n each (2 MiB) */
			thr_run(prof_side, 2, prof_n);
		} else {
			int counters = getenv("BENCH_PROF_COUNTERS") &&
				       !strcmp(getenv("BENCH_PROF_COUNTERS"), "1");
			struct csnap ca, cb;

			/*
			 * BENCH_PROF_UMEM=1: the MR sides through the rig core's
			 * umem_test hook (the core and the client alone, no rxe MR,
			 * no uverbs object), as the layers figure.
			 */
			int umem = prof_side != S_FLOOR && getenv("BENCH_PROF_UMEM") &&
				   !strcmp(getenv("BENCH_PROF_UMEM"), "1");

			/*
			 * BENCH_PROF_INSNS=1: the markers of the QEMU plugin
			 * tests/bench/insncount (scripts/vm.sh PEERMEM_QEMU_PLUGIN):
			 * "xchg %r13,%r13" zeroes its counts of executed guest
			 * instructions, "xchg %r14,%r14" writes them out; the
			 * loop's instructions, every vCPU's, whatever the host's
			 * load. The modules' symbols follow ("ksym" lines).
			 */
			int insns = getenv("BENCH_PROF_INSNS") && !strcmp(getenv("BENCH_PROF_INSNS"), "1");
			/*
			 * BENCH_PROF_MISS=1: each registration at the next distinct
			 * range of its size (a watch-pin cache miss, as the pin-cost
			 * figure's "first"), not the same range again.
			 */
			int miss = getenv("BENCH_PROF_MISS") && !strcmp(getenv("BENCH_PROF_MISS"), "1");

			if (counters)
				csnap_take(&ca);
			if (insns)
				__asm__ volatile(".byte 0x4d, 0x87, 0xed" ::: "memory");
			for (int k = 0; k < prof_n; k++) {
				if (umem) {
					int fd = open(UMEM_TEST, O_RDWR), e;

					if (fd < 0)
						bail("cannot open " UMEM_TEST ": %s", strerror(errno));
					e = umem_get(fd, RXE_DEV, gbig.p, prof_len, "mr");
					close(fd);
					if (e)
						bail("%s: umem_test: %s", side_name[prof_side], strerror(-e));
					continue;
				}
				reg_or_bail(prof_side, miss ? miss_range(prof_side, prof_len) : gbig.p,
					    prof_len, &r);
				dereg_or_bail(prof_side, &r);
			}
			if (insns) {
				__asm__ volatile(".byte 0x4d, 0x87, 0xf6" ::: "memory");
				printf("insns-dump %s %zu %d\n", side_name[prof_side], prof_len, prof_n);
				fflush(stdout);
				run("grep ' [tT] .*\\[' /proc/kallsyms | sed 's/^/ksym %s /'", side_name[prof_side]);
			}
			if (counters) {
				csnap_take(&cb);
				csnap_print(prof_side, &ca, &cb, prof_n);
			}
		}
		t1 = now_s();
		if (perf > 0) {
			int st;

			kill(perf, SIGINT);
			if (waitpid(perf, &st, 0) != perf || access(perf_out, R_OK) ||
			    (WIFEXITED(st) && WEXITSTATUS(st) == 127))
				bail("perf record failed (is perf installed? Debian: linux-perf)");
			if (prof_free) {
				unlink(PERF_CTL);
				unlink(PERF_ACK);
			}
			/*
			 * BENCH_KALLSYMS=FILE: the kernel's symbols while this side's
			 * module is still loaded (the run unloads it before perf
			 * report runs, which then cannot name its functions).
			 */
			if (getenv("BENCH_KALLSYMS") && run("cat /proc/kallsyms > %s", getenv("BENCH_KALLSYMS")))
				bail("cannot copy /proc/kallsyms to %s", getenv("BENCH_KALLSYMS"));
		}
		if (!prof_free)
			printf("profile %s %zu bytes, %d thread(s): %d reg+dereg each, %.3f ms per reg+dereg (wall, all threads)\n",
			       side_name[prof_side], prof_len, prof_threads, prof_n,
			       (t1 - t0) * 1e3 / (prof_n * prof_threads));
		rounds = 0;
	}
	printf("info rounds %d\n", rounds);
	printf("info large_bytes %zu\n", large);
	printf("info dma_device %s\n", dev);
	printf("info contig_bytes_latency 2097152\n");
	printf("info guest_cpus %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
	fflush(stdout);
	run("echo \"info dma_peer $(dmesg | sed -n 's/.*gpusim_testclient: DMA peer is //p' | tail -n 1)\"; "
	    "echo \"info guest_kernel $(uname -r) $(uname -v)\"; "
	    "echo \"info guest_mem_kb $(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)\"");
	diag("%d rounds; sides in a rotating order; %zu MiB the large size; DMA device %s",
	     rounds, large / MIB, dev);

	for (int round = 0; round < rounds && events_only; round++) {
		/* --events-only: the revocation events' cost alone (peermem). */
		if (round == 0)
			use_side(S_PM);
		fig_free_events(round);
		fig_events_files(round);
	}
	for (int round = 0; round < rounds && !events_only; round++) {
		for (int k = 0; k < NSIDES; k++) {
			int s = (round + k) % NSIDES;

			run_side(s, round);
		}
		diag("round %d done (%.0f s)", round, now_s() - t_start);
	}

	/* Tidy up: nothing may be left pinned, mapped or registered. */
	ibv_dereg_mr(hmr);
	conn_close(&c);
	gmem_free(gfd, &gbig);
	gmem_drop(&gbig);
	gmem_free(gfd, &gcontig);
	gmem_drop(&gcontig);
	gmem_free(gfd, &gfrag);
	gmem_drop(&gfrag);
	if (gscale.p) {
		gmem_free(gfd, &gscale);
		gmem_drop(&gscale);
	}
	close(tcfd);
	idle = wait_for(idle_all, 30);
	if (!idle && !tap_mode)
		bail("something is still pinned, mapped or registered after the benchmark");
	for (int s = 0; s < 2; s++)
		if (unload_side(s))
			bail("cannot unload %s", side_mod[s]);
	close(gfd);
	gs_knob("max_alloc_bytes", "268435456");
	run("rmmod gpusim_testclient");
	printf("info elapsed_s %.1f\n", now_s() - t_start);

	if (tap_mode) {
		static const char *const figs[] = {
			"reg_s", "dereg_s", "regdereg_s", "gpu_pins_per_reg",
			"gpu_all_pins_per_reg", "gpu_pages_pinned_per_reg", "free_revoke_s",
			"free_unpinned_s", "thr2_over_thr1",
			"kmem_per_reg_bytes", "sg_entries_per_gib", "pincost_miss_s",
			"pincost_s", "pins_miss_pages", "pins_hit_pages",
		};

		for (size_t f = 0; f < sizeof(figs) / sizeof(figs[0]); f++)
			for (int s = 0; s < NSIDES; s++) {
				int n = 0, good = 1;

				for (int i = 0; i < nser; i++) {
					if (ser[i]->side != s || strcmp(ser[i]->fig, figs[f]))
						continue;
					n += ser[i]->n;
					for (int j = 0; j < ser[i]->n; j++)
						good &= isfinite(ser[i]->v[j]);
				}
				ok(n > 0 && good, "%s measured for %s (%d samples)", figs[f],
				   side_name[s], n);
			}
		{
			/* Exactly one series, peermem's: a missing one fails too. */
			int found = 0, pm_only = 1;
			double med = 0;

			for (int i = 0; i < nser; i++)
				if (!strcmp(ser[i]->fig, "munmap_revoke_s")) {
					found += ser[i]->n > 0;
					pm_only &= ser[i]->side == S_PM;
					med = median(ser[i]);
				}
			ok(found == 1 && pm_only,
			   "munmap -> revoked measured for peermem only (%d series; median %.6f s)",
			   found, med);
		}
		ok(idle, "every registration undone, nothing pinned or mapped (gpusim live_pins %lld, live_dma_mappings %lld)",
		   gs("live_pins"), gs("live_dma_mappings"));
		return finish();
	}
	printf("bench: done, nothing left registered or pinned\n");
	return 0;
}
