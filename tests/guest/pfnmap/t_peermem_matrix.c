// SPDX-License-Identifier: GPL-2.0
/*
 * The race matrix (issue 24): every revocation cause landed in every phase
 * of a registration, for nv_mem, nv_mem_nc and the PFN source, each cell
 * deterministically and proven to have landed.
 *
 * A phase is held open by one of peermem's inject_delay_* knobs (table
 * below); the registering (or deregistering) thread sleeps there while a
 * second thread waits for the knob's debugfs count inject/<knob>.entered
 * to move, checks that .left has not, and only then fires the cause. A
 * cell whose cause was not fired inside its window in every round fails:
 * it did not test what it names. The cause's system call may return while
 * the phase is still open (it waits for nothing there: "inside") or only
 * after it ended (it waited for a lock the phase holds: "waited"); both
 * are tallied per cell.
 *
 * Causes: GPU free (GPUSIM_IOC_FREE), munmap, mremap (moved away),
 * mmap(MAP_FIXED) over the range, fork then the child's exit, exit of the
 * registering process, unload of peermem (rmmod), and for PFN memory the
 * exporter's zap (unmap_mapping_range) and mprotect(PROT_READ).
 *
 * Phases and their knobs (docs/module.md, "Test knobs"):
 *   acquire      inject_delay_acquire_ms (GPU: after the pins, before the
 *                registration lock; PFN: watch armed, nothing read yet)
 *   pre-gp       inject_delay_get_pages_ms (start of get_pages: between
 *                acquire and get_pages' work)
 *   get_pages    inject_delay_get_pages_inner_ms (GPU: ticket stored,
 *                events armed, lock dropped; PFN: runs read, not stored)
 *   dma_map      inject_delay_mapping_ms (Mapping, lock dropped, before
 *                the table is mapped for the device)
 *   live         none: the cause comes after ibv_reg_mr returned
 *   dma_unmap    inject_delay_dma_unmap_ms (deregistration)
 *   put_pages    GPU: inject_delay_unpin_ms (the put in flight, the
 *                watch pin's for nv_mem: with the watch-pin cache, on by
 *                default, the deregistration parks it and the cache's
 *                flush right after puts it, through the same code);
 *                PFN: inject_delay_put_pages_ms
 *   release      inject_delay_release_ms (ticket cleared, before unpin)
 *
 * Outcomes checked (docs/architecture.md, "Every interleaving", "PFN-mapped
 * memory"):
 *   - registration phases, revoking cause (nv_mem and PFN): ibv_reg_mr
 *     fails with EFAULT, or succeeds and the MR is revoked: the event
 *     counter had moved (one record, the cause's) when ibv_reg_mr
 *     returned, and an RDMA WRITE completes with a remote access error
 *     writing nothing (checked through the memory's remaining CPU view:
 *     the freed allocation's mapping, the moved mapping, the exporter's
 *     buffer);
 *   - live MR: the counter moved (one record, the cause's) when the
 *     cause's call returned; PFN: the MR is revoked then too (blocking
 *     notifier), nv_mem after its work item (the keeper keeps the memory);
 *     the RDMA WRITE after fails and writes nothing;
 *   - nv_mem_nc (persistent pins, nothing watched), fork then child exit:
 *     nothing revoked, no record, registration succeeds and its RDMA works;
 *   - deregistration phases: ibv_dereg_mr succeeds, at most one record,
 *     of the cause's kind;
 *   - unload: rmmod does not return while the MR exists, and returns 0
 *     once it is deregistered;
 *   - process exit: the process is reaped, everything it held released;
 *   - every round: the client's counters back to idle, gpusim's pins and
 *     mappings back, the core's counters balanced; and every cell: no
 *     kernel report (read from /dev/kmsg after each cell).
 *
 * One client per program, so the suite's VM slots share the matrix out:
 * t_peermem_matrix (nv_mem), t_peermem_matrix_nc (nv_mem_nc: peermem
 * loaded with enable_invalidate=0) and t_peermem_matrix_pfn (the PFN
 * source), built from this file with MATRIX_CLIENT; MATRIX_ALL=1 runs
 * all three in one. MATRIX_ROUNDS (default 1) rounds per cell; MATRIX_DELAY_MS (default
 * 120, times the guest's slowdown) the window; MATRIX_ONLY=client[,cause[,phase]]
 * (names as printed, "all" for any) runs part of it. MATRIX_SHARE=N (default
 * 1: every cell) runs the cells whose cause and phase numbers add up to a
 * multiple of N, so that every cause still lands in some phases and every
 * phase still meets some causes: tests/run-all.sh runs N=4 (a quarter, for
 * CI's time; the whole matrix is about 6 minutes of an idle rig), and the
 * whole matrix on request (PEERMEM_MATRIX_FULL=1).
 */
#define _GNU_SOURCE
#include "matrix_test.h"
#include "../../../include/uapi/peermem.h"
#include <sys/prctl.h>

#define GLEN (128 * 1024UL)	/* GPU: 2 GPU pages */
#define PLEN (1024 * 1024UL)	/* PFN: 1 MiB of the exporter's reserved buffer */
#define WLEN 4096		/* the RDMA WRITE that must not land */

enum client { NVMEM, NC, PFN, NCLIENTS };
#ifndef MATRIX_CLIENT
#define MATRIX_CLIENT NVMEM
#endif

static const char *client_name[] = { "nv_mem", "nv_mem_nc", "pfn" };

static const char *knob_of(enum phase p, enum client cl)
{
	switch (p) {
	case ACQ: return "inject_delay_acquire_ms";
	case PREGP: return "inject_delay_get_pages_ms";
	case GP: return "inject_delay_get_pages_inner_ms";
	case MAP: return "inject_delay_mapping_ms";
	case LIVE: return NULL;
	case UNMAP: return "inject_delay_dma_unmap_ms";
	case PUT: return cl == PFN ? "inject_delay_put_pages_ms" : "inject_delay_unpin_ms";
	case REL: return "inject_delay_release_ms";
	default: return NULL;
	}
}

/* Why a cell is not run (NULL: it is). */
static const char *not_applicable(enum cause ca, enum client cl)
{
	if (cl == PFN && ca == FREE)
		return "PFN memory has no GPU free (the exporter's zap is its counterpart)";
	if (cl != PFN && (ca == ZAP || ca == MPROTECT))
		return "GPU memory: the issue's zap and mprotect causes are the PFN exporter's";
	return NULL;
}

/*
 * Why a cell of a phase is not run (NULL: it is). nv_mem x unload x
 * put_pages: with the watch-pin cache no deregistration puts the watch
 * pin; the flush that puts it instead holds the module (an open debugfs
 * file: rmmod fails with EBUSY meanwhile), and the unload's own drain puts
 * the cached ones, so an unload cannot race that put
 * (t_peermem_wcache unloads with entries cached).
 */
static const char *phase_not_applicable(enum cause ca, enum client cl, enum phase ph)
{
	if (cl == NVMEM && ca == UNLOAD && ph == PUT &&
	    read_ll("/sys/module/peermem/parameters/watch_cache") > 0)
		return "with the watch-pin cache (watch_cache > 0) the watch pin is put by the cache's flush, which holds the module, or by the unload's own drain: no unload can race it";
	return NULL;
}

/* The watch pin's put of a deregistered nv_mem MR, in the put_pages phase (the flush). */
static void put_watch_pin(enum client cl, enum phase ph)
{
	if (cl == NVMEM && ph == PUT)
		pm_flush();
}

/* The cause revokes this client's MR (nv_mem_nc's persistent pins are not watched). */
static int revoking(enum cause ca, enum client cl)
{
	if (cl == NC || ca == FORK || ca == EXIT || ca == UNLOAD)
		return 0;
	return 1;
}

static unsigned int cause_code(enum cause ca, enum client cl)
{
	switch (ca) {
	case FREE: return PEERMEM_CAUSE_GPU_FREE;
	case MUNMAP: case MAPFIXED: return PEERMEM_CAUSE_UNMAP;
	case MREMAP: return PEERMEM_CAUSE_MOVE;
	case ZAP: return PEERMEM_CAUSE_DRIVER;
	case MPROTECT: return PEERMEM_CAUSE_PROTECT;
	default: (void)cl; return 0;
	}
}

struct tally {
	int rounds, landed, inside, waited, reg_ok, reg_efault, refused_with_event, double_count, bad;
};

static struct tally tal[NCLIENTS][NCAUSES][NPHASES];
static int delay_ms = 120, rounds_per_cell = 1;
static const char *only;
static int share = 1;		/* MATRIX_SHARE */

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int gfd = -1, efd = -1, kmsg = -1;
static uint8_t *view;		/* a buffer of PLEN for the CPU views */

/* ---- events ---- */

static int evfd = -1;
static struct peermem_gen_page *evpg;

static void events_open(void)
{
	evfd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	evpg = evfd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ, MAP_SHARED, evfd, 0);
	if (evpg == MAP_FAILED)
		bail("cannot open and map %s: %s", PEERMEM_DEVICE_PATH, strerror(errno));
}

static void events_close(void)
{
	if (evfd < 0)
		return;
	munmap(evpg, 4096);
	close(evfd);
	evfd = -1;
}

static long long gen(void)
{
	return evfd < 0 ? -1 : (long long)__atomic_load_n(&evpg->generation, __ATOMIC_ACQUIRE);
}

/* Read what is queued: how many records; *bad set if one is not {start, len, cause}. */
static int drain(const void *start, size_t len, unsigned int cause, int *bad)
{
	struct peermem_event ev[8];
	int n = 0;
	ssize_t r;

	while ((r = read(evfd, ev, sizeof(ev))) > 0) {
		for (int i = 0; i < (int)(r / sizeof(ev[0])); i++, n++)
			if (ev[i].start != (uintptr_t)start || ev[i].length != len ||
			    (cause && ev[i].cause != cause)) {
				diag("record: start %#llx length %#llx cause %u; want %p %#zx %u",
				     (unsigned long long)ev[i].start, (unsigned long long)ev[i].length,
				     ev[i].cause, start, len, cause);
				*bad = 1;
			}
	}
	return n;
}

/* ---- kernel reports ---- */

/* New kernel log lines naming a report since the last call (printed); how many. */
static int kernel_reports(const char *cell)
{
	char rec[2048];
	const char *msg;
	int n = 0;

	while ((msg = kmsg_next(kmsg, rec, sizeof(rec)))) {
		if (strstr(msg, "BUG:") || strstr(msg, "WARNING:") || strstr(msg, "KCSAN") ||
		    strstr(msg, "possible circular") || strstr(msg, "blocked for more than") ||
		    strstr(msg, "Oops") || strstr(msg, "peermem: BUG") ||
		    strstr(msg, "no longer holds") || strstr(msg, "inconsistent lock") ||
		    strstr(msg, "kmemleak")) {
			diag("%s: kernel: %s", cell, msg);
			n++;
		}
	}
	return n;
}

/* ---- knobs ---- */

static long long knob_count(const char *knob, const char *which)
{
	return read_ll(PMDBG "inject/%s.%s", knob, which);
}

static void knob_set(const char *knob, int ms)
{
	char path[160], v[16];

	if (!knob)
		return;
	snprintf(path, sizeof(path), PMDBG "%s", knob);
	snprintf(v, sizeof(v), "%d", ms);
	if (write_str(path, v)) {
		/*
		 * Seen in unload cells (2026-11-26): the reset after the race
		 * met the module in its exit ("going", the knobs being removed),
		 * which the unload cells no longer do (round_parent). Should a
		 * knob still be missing: say what the module's state is, give it
		 * 5 s, and fail if it does not come.
		 */
		char st[32] = "?";
		double end = now_s() + slow_s(5);

		read_line("/sys/module/peermem/initstate", st, sizeof(st));
		diag("%s missing (%s); peermem initstate %s; waiting", path, strerror(errno), st);
		while (write_str(path, v) && now_s() < end)
			usleep(50000);
	}
	if (write_str(path, v))
		bail("cannot set %s (%s; peermem %s)", path, strerror(errno),
		     access("/sys/module/peermem", F_OK) ? "not loaded" : "loaded");
}

/* ---- the memory of one round (struct mem: matrix_test.h) ---- */

static void mem_get(struct mem *m, enum client cl)
{
	if (cl != PFN) {
		mem_get_gpu(m, gfd, GLEN);
		return;
	}
	memset(m, 0, sizeof(*m));
	m->pfn = 1;
	m->len = PLEN;
	fill(view, PLEN, 0x1111);
	if (exporter_rw(efd, 1, 0, 0, view, PLEN))
		bail("cannot write through the exporter's CPU view");
	m->p = exporter_map(efd, PLEN, PROT_READ | PROT_WRITE, MAP_SHARED);
	if (!m->p)
		bail("mmap of the exporter: %s", strerror(errno));
}

/* What a CPU view of the memory shows is still the fill (no RDMA byte landed); -1: no view left. */
static int mem_untouched(struct mem *m)
{
	if (m->pfn) {
		if (exporter_rw(efd, 0, 0, 0, view, PLEN))
			return -1;
		return check(view, PLEN, 0x1111);
	}
	if (m->moved)
		return check(m->moved, m->len, 0x1111);
	if (!m->unmapped)
		return check(m->p, m->len, 0x1111);
	return -1;
}

/* ---- the causes ---- */

/* FORK: the window's knob, and whether it was still open when fork() returned. */
static const char *fork_knob;
static long long fork_left0;
static int fork_inside;

static void fork_returned(void)
{
	fork_inside = !fork_knob || knob_count(fork_knob, "left") == fork_left0;
}

static int do_cause(enum cause ca, struct mem *m)
{
	switch (ca) {
	case ZAP:
		return ioctl(efd, PFNMAP_IOC_ZAP) ? -errno : 0;
	case MPROTECT:
		return mprotect(m->p, m->len, PROT_READ) ? -errno : 0;
	default:
		return mem_cause(ca, m, gfd, fork_returned);
	}
}

/* ---- unload (unload_thread: matrix_test.h) ---- */

/* The module is being unloaded (its exit runs: the core's unregister waits). */
static int unloading(void)
{
	char st[32];

	return read_line("/sys/module/peermem/initstate", st, sizeof(st)) || !strcmp(st, "going");
}

static const char *client_args(enum client cl)
{
	return cl == NC ? "enable_invalidate=0 pfnmap=1" : "pfnmap=1";
}

static void reload(enum client cl)
{
	load_modules(client_args(cl));	/* with PEERMEM_EXTRA_ARGS (peermem_test.h) */
}

/* After an unload: load peermem again as it was (finit_module: no process to start). */
static void reload_fast(enum client cl)
{
	char ko[512], args[256];
	int fd;

	double end = now_s() + slow_s(10);
	char st[32];

	/* The unload returned: the module must be gone before it is loaded again. */
	while (access("/sys/module/peermem", F_OK) == 0 && now_s() < end)
		usleep(20000);
	if (access("/sys/module/peermem", F_OK) == 0)
		bail("peermem still in /sys/module after its unload returned");
	snprintf(ko, sizeof(ko), "%s", getenv("PEERMEM_KO") ?: "");
	if (!ko[0])
		snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	fd = open(ko, O_RDONLY | O_CLOEXEC);
	snprintf(args, sizeof(args), "%s %s", client_args(cl), getenv("PEERMEM_EXTRA_ARGS") ?: "");
	if (fd < 0 || syscall(SYS_finit_module, fd, args, 0))
		bail("cannot load %s again: %s", ko, strerror(errno));
	close(fd);
	if (read_line("/sys/module/peermem/initstate", st, sizeof(st)) || strcmp(st, "live"))
		bail("peermem loaded again but not live (initstate %s)", st);
	if (access(PMDBG "inject_delay_acquire_ms", F_OK))
		bail("peermem loaded again (%s), but without its debugfs knobs: %s",
		     access("/sys/module/peermem", F_OK) ? "not in /sys/module" : "in /sys/module",
		     strerror(errno));
}

/* ---- one round ---- */

/*
 * The window a cause gets: MATRIX_DELAY_MS times the guest's slowdown (a
 * slower guest takes longer to fire the cause); three times that for a
 * fork (and its child's exit), a process exit and an unload (which starts
 * the module's exit), which take longer than a system call.
 */
static int delay_of(enum cause ca)
{
	int d = (int)(slow_s(delay_ms / 1000.0) * 1000);

	return ca == FORK || ca == EXIT || ca == UNLOAD ? 3 * d : d;
}

struct racer {
	enum cause ca;
	struct mem *m;
	const char *knob;
	long long entered0, left0;
	int landed, inside, ret;
	long long gen_at_return;
	struct unloader *u;
};

/* Fire the cause once the knob's window is open (entered moved, left not). */
static void *racer_thread(void *arg)
{
	struct racer *x = arg;
	double end = now_s() + slow_s(10), before = now_s(), close_by;
	long long e;

	/* before: the last time the window was seen not begun yet. */
	while (((e = knob_count(x->knob, "entered")) == x->entered0 || e < 0) && now_s() < end) {
		before = now_s();
		usleep(500);
	}
	/* The window stays open until at least close_by (it began after before). */
	close_by = before + delay_of(x->ca) / 1000.0;
	x->landed = e > x->entered0 && knob_count(x->knob, "left") == x->left0;
	if (x->ca == UNLOAD) {
		/*
		 * Landed: the module was going (its exit began: the core's
		 * unregister) before the window can have closed. The knob's
		 * files went with the module's debugfs, so time proves it.
		 */
		x->ret = pthread_create(&x->u->t, NULL, unload_thread, x->u);
		while (!unloading() && !x->u->done && now_s() < end)
			usleep(200);
		x->landed = x->landed && unloading() && now_s() < close_by;
		x->inside = x->landed;
		if (!x->landed)
			diag("unload: going %d, %.0f ms after the window was seen open (it lasts %d ms)",
			     unloading(), (now_s() - before) * 1000, delay_of(x->ca));
		return NULL;
	}
	fork_knob = x->knob;
	fork_left0 = x->left0;
	fork_inside = 1;
	x->ret = do_cause(x->ca, x->m);
	x->gen_at_return = gen();
	/* A fork counts as inside when fork() returned in the window (its child's exit may come after). */
	x->inside = x->landed && (x->ca == FORK ? fork_inside : knob_count(x->knob, "left") == x->left0);
	return NULL;
}

static int idle_of_client_pfn(void)
{
	return pm_idle() && pf_idle() && gs("live_pins") == 0 && gs("live_dma_mappings") == 0;
}

/* The RDMA WRITE through a revoked MR fails and writes nothing (where a view is left). */
static int write_refused(struct mem *m, struct ibv_mr *mr, const char *cell)
{
	int rc, un;

	fill(h, WLEN, 0x2222);
	rc = rdma_op_renew(&c, IBV_WR_RDMA_WRITE, hmr, h, WLEN, (uintptr_t)m->p, mr->rkey);
	un = mem_untouched(m);
	if (rc != IBV_WC_REM_ACCESS_ERR || un == 0) {
		diag("%s: RDMA WRITE through the revoked MR: %s, memory %s", cell, wc_str(rc),
		     un < 0 ? "has no view" : un ? "untouched" : "WRITTEN");
		return 0;
	}
	return 1;
}

static int write_works(struct mem *m, struct ibv_mr *mr, const char *cell)
{
	int rc;

	fill(h, WLEN, 0x3333);
	rc = rdma_op_renew(&c, IBV_WR_RDMA_WRITE, hmr, h, WLEN, (uintptr_t)m->p, mr->rkey);
	if (rc == 0 && m->pfn) {
		if (exporter_rw(efd, 0, 0, 0, view, WLEN) || memcmp(view, h, WLEN))
			rc = -2;
	} else if (rc == 0 && !m->unmapped && memcmp(m->p, h, WLEN)) {
		rc = -2;
	}
	if (rc) {
		diag("%s: RDMA WRITE through the live MR: %s", cell, rc == -2 ? "bytes not there" : wc_str(rc));
		return 0;
	}
	/* The fill back, for a later check that nothing more landed. */
	if (m->pfn) {
		fill(view, PLEN, 0x1111);
		if (exporter_rw(efd, 1, 0, 0, view, PLEN))
			bail("cannot write through the exporter's CPU view");
	} else if (!m->unmapped) {
		fill(m->p, m->len, 0x1111);
	}
	return 1;
}

/* Wait until a revocation of nv_mem's MR ran to its end (keeper put, address work done). */
/*
 * The revocation's work item finished: the keeper is given back. The pin
 * with the free callback stays with the registration until it is
 * deregistered (only the pinning process can put it; a work item cannot),
 * unless the cause took it (a GPU free).
 */
static int revocation_settled(void)
{
	return pm_live_keepers() == 0 && pmc_live_pins(PMDBG) <= 1;
}

/*
 * The core's counters of the serving client moved by whole rounds since s0:
 * every mapping stopped, the bytes back. OFED counts an invalidated MR's
 * bytes twice when the invalidation came after its release began (a
 * revocation racing the deregistration; docs/core.md, "Statistics"): at
 * most len more is allowed, and tallied.
 */
static int core_round_ok(const struct peer_stats *s0, size_t len, struct tally *t, const char *cell)
{
	struct peer_stats s1;
	long long dreg, ddereg;

	if (peer_stats(pm_name, &s1))
		return 0;
	dreg = s1.reg_bytes - s0->reg_bytes;
	ddereg = s1.dereg_bytes - s0->dereg_bytes;
	if (s1.alloc_mrs == s1.dealloc_mrs && s1.dereg_pages == 0 &&
	    (ddereg == dreg || ddereg == dreg + (long long)len)) {
		t->double_count += ddereg != dreg;
		return 1;
	}
	diag("%s: core %s: mrs %lld/%lld, bytes +%lld registered, +%lld deregistered", cell, pm_name,
	     s1.alloc_mrs, s1.dealloc_mrs, dreg, ddereg);
	return 0;
}

static int core_idle(void)
{
	struct peer_stats s;

	return peer_stats(pm_name, &s) == 0 && s.alloc_mrs == s.dealloc_mrs;
}

static void round_parent(enum client cl, enum cause ca, enum phase ph, struct tally *t,
			 const char *cell)
{
	struct peer_stats s0;
	const char *knob = knob_of(ph, cl);
	int dereg = ph >= UNMAP, rev = revoking(ca, cl), bad = 0, err = 0, recbad = 0, n;
	struct unloader u = { .module = "peermem" };
	struct racer x = { .ca = ca, .knob = knob, .u = &u };
	struct ibv_mr *mr = NULL;
	long long g0, g_reg;
	struct mem m;
	pthread_t rt;

	mem_get(&m, cl);
	x.m = &m;
	t->rounds++;
	if (peer_stats(pm_name, &s0))
		bail("cannot read the core's counters of %s", pm_name);
	g0 = gen();
	if (ph == LIVE || dereg) {
		mr = ibv_reg_mr(c.pd, m.p, m.len, MR_ACCESS);
		if (!mr) {
			diag("%s: ibv_reg_mr before the race: %s", cell, strerror(errno));
			t->bad++;
			mem_put(&m, gfd);
			return;
		}
		if (!write_works(&m, mr, cell))
			bad = 1;
	}
	if (ph == LIVE) {
		if (ca == UNLOAD) {
			double end = now_s() + slow_s(5);

			pthread_create(&u.t, NULL, unload_thread, &u);
			while (!unloading() && !u.done && now_s() < end)
				usleep(1000);
			usleep(100000);
			x.ret = 0;
		} else {
			fork_knob = NULL;
			x.ret = do_cause(ca, &m);
		}
		x.gen_at_return = gen();
		x.landed = x.inside = 1;
		g_reg = g0;
	} else {
		x.entered0 = knob_count(knob, "entered");
		x.left0 = knob_count(knob, "left");
		knob_set(knob, delay_of(ca));
		pthread_create(&rt, NULL, racer_thread, &x);
		if (dereg) {
			if (ibv_dereg_mr(mr)) {
				diag("%s: ibv_dereg_mr: %s", cell, strerror(errno));
				bad = 1;
			}
			put_watch_pin(cl, ph);
			mr = NULL;
		} else {
			mr = ibv_reg_mr(c.pd, m.p, m.len, MR_ACCESS);
			err = mr ? 0 : errno;
		}
		g_reg = gen();
		pthread_join(rt, NULL);
		/*
		 * Not after an unload: the module is going away (its exit runs
		 * once the MR is gone, and removes the knobs: EIO, then ENOENT,
		 * the intermittent "missing knob" of 2026-11-26), and the one
		 * loaded again starts with every knob at 0.
		 */
		if (ca != UNLOAD)
			knob_set(knob, 0);
	}
	t->landed += x.landed;
	t->inside += x.inside;
	t->waited += x.landed && !x.inside;
	if (!x.landed)
		diag("%s: the cause did NOT land in the window (entered %lld -> %lld, left %lld -> %lld)",
		     cell, x.entered0, knob ? knob_count(knob, "entered") : 0, x.left0,
		     knob ? knob_count(knob, "left") : 0);
	if (x.ret) {
		diag("%s: the cause failed: %d %s", cell, x.ret, x.ret < 0 ? strerror(-x.ret) : "");
		bad = 1;
	}
	if (!dereg) {
		if (mr)
			t->reg_ok++;
		else if (err == EFAULT && rev)
			t->reg_efault++;
		else {
			diag("%s: ibv_reg_mr failed with %s (only a revoking cause may refuse it, with EFAULT)",
			     cell, strerror(err));
			bad = 1;
		}
	}
	if (ca == UNLOAD) {
		usleep(100000);
		if (u.done) {
			diag("%s: rmmod returned (%d) while the MR %s", cell, u.ret,
			     mr ? "is registered" : "was being deregistered");
			bad = mr || bad;
		}
		if (mr && ph != LIVE && !write_works(&m, mr, cell))
			bad = 1;
		if (mr && ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr: %s", cell, strerror(errno));
			bad = 1;
		}
		mr = NULL;
		pthread_join(u.t, NULL);
		if (u.ret || access("/sys/module/peermem", F_OK) == 0) {
			diag("%s: rmmod peermem: %s", cell, strerror(-u.ret));
			bad = 1;
		}
		mem_put(&m, gfd);
		if (gs("live_pins") != 0 || gs("live_dma_mappings") != 0) {
			diag("%s: gpusim pins or mappings left after the unload", cell);
			gs_diag();
			bad = 1;
		}
		reload_fast(cl);
		t->bad += bad;
		return;
	}
	if (rev && !dereg) {
		if (mr) {
			/* The MR survived the cause: it is revoked, reported once. */
			if (ph == LIVE ? x.gen_at_return != g0 + 1 : g_reg != g0 + 1) {
				diag("%s: the event counter had moved by %lld when %s returned (want 1)", cell,
				     (ph == LIVE ? x.gen_at_return : g_reg) - g0,
				     ph == LIVE ? "the cause" : "ibv_reg_mr");
				bad = 1;
			}
			if (cl == PFN && ph == LIVE && pmc_live_maps(PMDBG_PFN) != 0) {
				diag("%s: the PFN MR was still mapped when the cause returned", cell);
				bad = 1;
			}
			if (cl == NVMEM && !wait_for(revocation_settled, 10)) {
				diag("%s: the revocation did not finish within 10 s", cell);
				bad = 1;
			}
			if (!write_refused(&m, mr, cell))
				bad = 1;
		} else if (gen() != g0) {
			t->refused_with_event++;
		}
		n = drain(m.p, m.len, cause_code(ca, cl), &recbad);
		if (n != (int)(gen() - g0) || recbad || n > 1) {
			diag("%s: %d records for a generation move of %lld%s", cell, n, gen() - g0,
			     recbad ? ", one of them wrong" : "");
			bad = 1;
		}
	} else if (!dereg) {
		/* Nothing revoked: the MR works, nothing reported. */
		if (gen() != g0 || drain(m.p, m.len, 0, &recbad)) {
			diag("%s: a revocation was reported (generation %lld -> %lld)", cell, g0, gen());
			bad = 1;
		}
		if (mr && !write_works(&m, mr, cell))
			bad = 1;
	} else {
		/* Deregistration raced: at most one record, the cause's. */
		n = drain(m.p, m.len, rev ? cause_code(ca, cl) : 0, &recbad);
		if (n > (rev ? 1 : 0) || recbad) {
			diag("%s: %d records during the deregistration", cell, n);
			bad = 1;
		}
	}
	if (mr && ibv_dereg_mr(mr)) {
		diag("%s: ibv_dereg_mr: %s", cell, strerror(errno));
		bad = 1;
	}
	mem_put(&m, gfd);
	if (!wait_for(cl == PFN ? idle_of_client_pfn : idle_but_vmas, 10) || !wait_for(core_idle, 5) ||
	    !core_round_ok(&s0, m.len, t, cell)) {
		diag("%s: not idle after the round", cell);
		pm_diag();
		pmc_diag("pfn", PMDBG_PFN);
		gs_diag();
		bad = 1;
	}
	t->bad += bad;
}

/* ---- process exit: the child registers (or deregisters) and exits in the window ---- */

struct exiter {
	const char *knob;
	long long entered0, left0;
	int fd;
};

static void *exit_thread(void *arg)
{
	struct exiter *e = arg;
	double end = now_s() + slow_s(10);
	char r;

	long long n;

	while (((n = knob_count(e->knob, "entered")) == e->entered0 || n < 0) && now_s() < end)
		usleep(500);
	r = n > e->entered0 &&
	    knob_count(e->knob, "left") == e->left0 ? 'L' : 'M';
	if (write(e->fd, &r, 1) != 1)
		_exit(31);
	_exit(0);	/* exit_group: the registering thread dies at its return to user space */
	return NULL;
}

static int mx_exit_child(enum client cl, enum phase ph, int pfd)
{
	const char *knob = knob_of(ph, cl);
	struct exiter e = { .knob = knob, .fd = pfd };
	struct exit_child ch;
	pthread_t t;
	int rc;

	mem_get(&ch.m, cl);
	rc = exit_child_start(&ch, ph, pfd);
	if (rc >= 0)
		return rc;
	e.entered0 = knob_count(knob, "entered");
	e.left0 = knob_count(knob, "left");
	pthread_create(&t, NULL, exit_thread, &e);
	if (ph >= UNMAP) {
		ibv_dereg_mr(ch.mr);
		put_watch_pin(cl, ph);
	} else {
		ibv_reg_mr(ch.pd, ch.m.p, ch.m.len, MR_ACCESS);
	}
	pause();	/* exit_thread ends the process */
	return 24;
}

static void round_exit(enum client cl, enum phase ph, struct tally *t, const char *cell)
{
	struct peer_stats s0;
	const char *knob = knob_of(ph, cl);
	int p[2], bad = 0;
	char r;
	pid_t pid;

	t->rounds++;
	if (peer_stats(pm_name, &s0))
		bail("cannot read the core's counters of %s", pm_name);
	knob_set(knob, delay_of(EXIT));
	pid = exit_fork(p, &gfd);
	if (pid == 0)
		_exit(mx_exit_child(cl, ph, p[1]));
	r = exit_wait(pid, p, cell, &bad);
	knob_set(knob, 0);
	t->landed += r == 'L';
	t->inside += r == 'L';
	if (r != 'L')
		diag("%s: the exit did NOT land in the window (%c)", cell, r ? r : '-');
	if (!wait_for(cl == PFN ? idle_of_client_pfn : idle_but_vmas, 15) || !wait_for(core_idle, 5) ||
	    !core_round_ok(&s0, cl == PFN ? PLEN : GLEN, t, cell)) {
		diag("%s: not idle after the child's exit", cell);
		pm_diag();
		pmc_diag("pfn", PMDBG_PFN);
		gs_diag();
		bad = 1;
	}
	t->bad += bad;
}

/* ---- the matrix ---- */

static int selected(enum client cl, enum cause ca, enum phase ph)
{
	const char *names[3] = { client_name[cl], cause_name[ca], phase_name[ph] };

	if (share > 1 && ((int)ca + (int)ph) % share)
		return 0;
	return only_selects(only, names, 3);
}

static void run_client(enum client cl)
{
	/* Unload last: it needs /dev/peermem closed (an open file pins the module). */
	static const enum cause order[] = { FREE, MUNMAP, MREMAP, MAPFIXED, ZAP, MPROTECT, FORK,
					    EXIT, UNLOAD };

	reload(cl);
	events_open();
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum cause ca = order[i];

		if (not_applicable(ca, cl))
			continue;
		if (ca == UNLOAD)
			events_close();
		for (enum phase ph = 0; ph < NPHASES; ph++) {
			struct tally *t = &tal[cl][ca][ph];
			char cell[96];
			int rep;
			double t0 = now_s();

			if (!selected(cl, ca, ph))
				continue;
			snprintf(cell, sizeof(cell), "%s x %s x %s", client_name[cl], cause_name[ca],
				 phase_name[ph]);
			if (phase_not_applicable(ca, cl, ph)) {
				skip("%s: not applicable: %s", cell, phase_not_applicable(ca, cl, ph));
				continue;
			}
			for (int r = 0; r < rounds_per_cell; r++) {
				if (ca == EXIT)
					round_exit(cl, ph, t, cell);
				else
					round_parent(cl, ca, ph, t, cell);
			}
			rep = kernel_reports(cell);
			ok(t->bad == 0 && t->landed == t->rounds && rep == 0,
			   "%s: %d rounds, landed %d (returned inside %d, waited for the phase %d); registered %d, EFAULT %d (with a record %d); core double count %d; no kernel report (%d) [%.1f s]",
			   cell, t->rounds, t->landed, t->inside, t->waited, t->reg_ok, t->reg_efault,
			   t->refused_with_event, t->double_count, rep, now_s() - t0);
		}
	}
	events_close();
}

int main(void)
{
	double t0 = now_s();

	if (getenv("MATRIX_ROUNDS"))
		rounds_per_cell = atoi(getenv("MATRIX_ROUNDS")) > 0 ? atoi(getenv("MATRIX_ROUNDS")) : 1;
	if (getenv("MATRIX_DELAY_MS"))
		delay_ms = atoi(getenv("MATRIX_DELAY_MS")) > 0 ? atoi(getenv("MATRIX_DELAY_MS")) : 120;
	only = getenv("MATRIX_ONLY");
	if (getenv("MATRIX_SHARE"))
		share = atoi(getenv("MATRIX_SHARE")) > 0 ? atoi(getenv("MATRIX_SHARE")) : 1;
	kmsg = kmsg_open();
	h = aligned_alloc(4096, PLEN);
	view = malloc(PLEN);
	if (!h || !view)
		bail("out of memory");
	rxe_up();
	exporter_load();
	efd = exporter_open(O_RDWR);
	if (exporter_alloc(efd, PLEN, PFNMAP_RESERVED, NULL))
		bail("exporter: cannot allocate %lu bytes of reserved RAM", PLEN);
	load_modules("pfnmap=1");
	gfd = gpusim_and_host_mr(&c, PLEN, &h, &hmr);
	diag("matrix: %d round(s) a cell, windows of %d ms (%d for fork, exit and unload)%s%s%s",
	     rounds_per_cell, delay_of(FREE), delay_of(FORK), only ? ", only " : "", only ? only : "",
	     share > 1 ? ", the cells whose cause + phase is a multiple of MATRIX_SHARE" : "");
	for (enum client cl = 0; cl < NCLIENTS; cl++)
		for (enum cause ca = 0; ca < NCAUSES; ca++)
			if ((cl == MATRIX_CLIENT || getenv("MATRIX_ALL")) && not_applicable(ca, cl))
				diag("%s x %s: not applicable: %s", client_name[cl], cause_name[ca],
				     not_applicable(ca, cl));
	for (enum client cl = 0; cl < NCLIENTS; cl++)
		if (cl == MATRIX_CLIENT || getenv("MATRIX_ALL"))
			run_client(cl);

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(gfd);
	ioctl(efd, PFNMAP_IOC_FREE);
	close(efd);
	ok(wait_for(all_idle, 10) && pf_idle(), "peermem (both clients, the PFN source) and gpusim idle at the end");
	ok(run("rmmod peermem") == 0 && run("rmmod pfnmap_exporter") == 0, "rmmod peermem and the exporter");
	ok(kernel_reports("end") == 0, "no kernel report at the end");
	diag("matrix: %.0f s", now_s() - t0);
	return finish();
}
