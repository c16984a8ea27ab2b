/* SPDX-License-Identifier: GPL-2.0 */
/*
 * soak.h - the race soak (the hardening issue): several processes with two
 * threads each loop over whole registration lifetimes on gpusim memory,
 * with randomised sizes, sub-ranges, MR counts, teardown orders and
 * gpusim/peermem delay knobs widening the windows, and check every byte.
 *
 * One round of a thread: allocate GPU memory (64 KiB .. 1 MiB), fill it,
 * register 1-3 MRs on it (the whole range and unaligned sub-ranges), RDMA
 * WRITE into each and READ back, every byte compared with the CPU view;
 * then one teardown, chosen at random:
 *   dereg    deregister, then free;
 *   free     free the GPU memory under the MRs: the next RDMA through them
 *            must complete in error (both clients revoke on a free);
 *   munmap   unmap the range under the MRs (peermem revokes: waited for);
 *   mremap   move the range elsewhere under the MRs (idem);
 *   fixed    mmap(MAP_FIXED) anonymous memory over the range: an RDMA
 *            WRITE through an old MR must never reach the new memory;
 *   fork     fork a child that exits at once: the MRs keep working;
 *   exit     the process exits holding its MRs, mid-round in its other
 *            thread (the parent starts another).
 * With peermem, about one round in four (when tests/pfnmap's exporter is
 * built) is on PFN-mapped memory instead (peermem's pfnmap=1 source): the
 * thread maps the exporter's reserved-RAM buffer, registers 1-2 MRs on its
 * own 256 KiB slot of it (the whole slot and an unaligned sub-range),
 * checks WRITE/READ through the mapping, and ends with dereg, munmap,
 * mremap, MAP_FIXED (the revocation must be complete when the call
 * returns: the next RDMA completes in error at once, and MAP_FIXED's new
 * memory is never written), fork or exit; "free" (no GPU memory) is a
 * dereg there. Where the rig has a PCI BAR the DMA device reaches
 * peer-to-peer (scripts/vm.sh's ivshmem below the switch), about half of those
 * rounds map the same slot of that BAR instead (the exporter's physical
 * window, io_remap_pfn_range), served by bus address.
 * Between epochs the parent stops the workers, checks that nothing is
 * left (gpusim's live counters, peermem's counters, the core's), changes
 * the delay knobs, and every few epochs unloads and reloads the client.
 *
 * soak_main() prints progress lines ("# ...") and a final TAP table. The
 * kernel side (reports, kmemleak, DMA-API leaks) is checked by
 * scripts/vm.sh around the program.
 */
#ifndef SOAK_H
#define SOAK_H

#define _GNU_SOURCE	/* before any system header: mremap */
#include "../pfnmap/pfnmap_test.h"

#include <getopt.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

enum { T_DEREG, T_FREE, T_MUNMAP, T_MREMAP, T_FIXED, T_FORK, T_EXIT, T_N };
static const char *const tname[T_N] = {
	"dereg", "free", "munmap", "mremap", "fixed", "fork", "exit",
};

/* Counters shared by every worker process (MAP_SHARED). */
struct soak_shared {
	atomic_llong rounds, regs, rdma, bytes_checked;
	atomic_llong teardown[T_N];
	atomic_llong wrong_bytes;	/* bytes that differ from what they must be */
	atomic_llong unexpected;	/* failures that must not happen */
	atomic_llong revoke_waits;	/* revocations waited for after munmap/mremap/fixed */
	atomic_llong revoke_late;	/* ... that did not come within the limit */
	atomic_llong pfn_rounds;	/* rounds on PFN-mapped memory */
	atomic_llong pfn_revoke_late;	/* PFN revocations not complete when munmap & co returned */
	atomic_llong pfn_bar_rounds;	/* of pfn_rounds, on the PCI BAR */
	atomic_llong pfn_started;	/* PFN rounds begun: every other one on the BAR */
	atomic_int stop;
	long long target;
	/* The seed each worker process started with (the first SOAK_SEEDS). */
#define SOAK_SEEDS 16384
	atomic_int nseeds;
	uint32_t seeds[SOAK_SEEDS];
	char last_error[256];
	atomic_int error_lock;
};

static struct soak_shared *S;
static int soak_revokes_on_unmap;	/* the client revokes on munmap (peermem) */
static int soak_pfn;			/* PFN rounds: peermem with pfnmap=1 and the exporter */
static int soak_bar;			/* the exporter's window maps a peer-to-peer BAR */
#define PFN_SLOT (256 * 1024UL)		/* each thread's part of the exporter's buffer */
#define PFN_LEN (64 * 2 * PFN_SLOT)	/* 64 processes x 2 threads */

/*
 * With seconds > 0 the run is bounded by time, not by rounds: each epoch
 * gets an equal slice of it (rounds is then only a cap), and the run checks
 * it did at least min_rounds rounds and at least one round in every epoch,
 * so a slow machine passes with less work and a stuck one still fails.
 */
struct soak_opts {
	long long rounds, min_rounds;
	int seconds, procs, epochs, reload_every;
	const char *client;	/* "peermem" or "nvpeermem" */
	unsigned int seed;
};

static void soak_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void soak_error(const char *fmt, ...)
{
	va_list ap;
	int z = 0;

	atomic_fetch_add(&S->unexpected, 1);
	if (!atomic_compare_exchange_strong(&S->error_lock, &z, 1))
		return;
	va_start(ap, fmt);
	vsnprintf(S->last_error, sizeof(S->last_error), fmt, ap);
	va_end(ap);
	atomic_store(&S->error_lock, 0);
}

static uint32_t rnd(uint32_t *s)
{
	if (!*s)
		*s = 0x9e3779b9;	/* xorshift never leaves 0 */
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* One worker thread: its own verbs context, PD, QPs and host buffer. */
struct worker {
	int fd;			/* /dev/gpusim of the process */
	int pfd;		/* /dev/pfnmap_exporter of the process, or -1 */
	int idx;
	int slot;		/* its PFN_SLOT in the exporter's buffer */
	uint32_t seed;
	struct conn c;
	uint8_t *h;		/* host buffer, 2 x 64 KiB */
	struct ibv_mr *hmr;
};

#define HLEN (128 * 1024UL)
#define CHUNK (64 * 1024UL)

/* RDMA through a (possibly revoked) MR: 0 ok, 1 completed in error, -1 broken. */
static int op_status(struct worker *w, enum ibv_wr_opcode op, void *l, uint32_t len,
		     uint64_t raddr, uint32_t rkey)
{
	int st = rdma_op(&w->c, op, w->hmr, l, len, raddr, rkey);

	atomic_fetch_add(&S->rdma, 1);
	if (st == IBV_WC_SUCCESS)
		return 0;
	/* An error completion kills the QPs: make new ones. */
	if (conn_qps(&w->c)) {
		soak_error("thread %d: cannot recreate the QPs after an error completion", w->idx);
		return -1;
	}
	return st > 0 ? 1 : -1;
}

/* WRITE a pattern into [addr, +len) of mr and READ it back; bytes checked. */
static void write_read(struct worker *w, struct ibv_mr *mr, uint8_t *addr, uint32_t len)
{
	uint32_t s = rnd(&w->seed);

	fill(w->h, len & ~3u, s);
	if (op_status(w, IBV_WR_RDMA_WRITE, w->h, len & ~3u, (uintptr_t)addr, mr->rkey)) {
		soak_error("thread %d: RDMA WRITE into a live MR failed", w->idx);
		return;
	}
	if (!check(addr, len & ~3u, s))
		atomic_fetch_add(&S->wrong_bytes, len & ~3u);
	memset(w->h + CHUNK, 0, len);
	if (op_status(w, IBV_WR_RDMA_READ, w->h + CHUNK, len & ~3u, (uintptr_t)addr, mr->rkey)) {
		soak_error("thread %d: RDMA READ from a live MR failed", w->idx);
		return;
	}
	if (memcmp(w->h + CHUNK, addr, len & ~3u))
		atomic_fetch_add(&S->wrong_bytes, len & ~3u);
	atomic_fetch_add(&S->bytes_checked, 2 * (len & ~3u));
}

/*
 * A child is forked and exits at once: its copy of the mapping goes, ours
 * does not, so the n MRs must still work (a short write and read of each).
 */
static void fork_child_exits(struct worker *w, struct ibv_mr **mr, uint8_t **base,
			     const uint32_t *mlen, int n)
{
	pid_t pid;
	int st;

	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(0);
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		soak_error("thread %d: fork/wait failed", w->idx);
	for (int i = 0; i < n; i++)
		write_read(w, mr[i], base[i], mlen[i] < 4096 ? mlen[i] : 4096);
}

/* Wait until an RDMA READ through mr at raddr completes in error (revoked). */
static int wait_revoked(struct worker *w, struct ibv_mr *mr, uint64_t raddr, double secs)
{
	double end = now_s() + secs;

	do {
		int st = op_status(w, IBV_WR_RDMA_READ, w->h + CHUNK, 64, raddr, mr->rkey);

		if (st)
			return st > 0;
		usleep(2000);
	} while (now_s() < end);
	return 0;
}

/* A free address range of len bytes (reserved, then given back). */
static void *free_range(size_t len)
{
	void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void round_once(struct worker *w, int may_exit)
{
	static const size_t lens[] = { 64 * 1024, 192 * 1024, 1024 * 1024 };
	struct ibv_mr *mr[3] = { 0 };
	uint8_t *base[3];
	uint32_t mlen[3];
	struct gmem g;
	int n, i, t;

	if (gmem_alloc(w->fd, lens[rnd(&w->seed) % 3], &g)) {
		soak_error("thread %d: GPUSIM_IOC_ALLOC: %s", w->idx, strerror(errno));
		usleep(10000);
		return;
	}
	fill(g.p, g.len, rnd(&w->seed));
	n = 1 + rnd(&w->seed) % 3;
	for (i = 0; i < n; i++) {
		size_t off = 0, len = g.len;

		if (i) {	/* an unaligned sub-range of at least 4 KiB */
			off = (rnd(&w->seed) % (g.len / 2)) & ~7ul;
			len = 4096 + rnd(&w->seed) % (g.len - off - 4096);
		}
		base[i] = g.p + off;
		mlen[i] = len;
		mr[i] = ibv_reg_mr(w->c.pd, base[i], len, MR_ACCESS);
		if (!mr[i]) {
			soak_error("thread %d: ibv_reg_mr(%zu bytes at +%zu): %s", w->idx, len, off,
				   strerror(errno));
			n = i;
			break;
		}
		atomic_fetch_add(&S->regs, 1);
	}
	for (i = 0; i < n; i++) {
		uint32_t len = mlen[i] < CHUNK ? mlen[i] : CHUNK;
		uint32_t at = (rnd(&w->seed) % (mlen[i] - len + 1)) & ~3u;

		write_read(w, mr[i], base[i] + at, len);
	}

	t = rnd(&w->seed) % T_N;
	if (t == T_EXIT && !may_exit)
		t = T_DEREG;
	atomic_fetch_add(&S->teardown[t], 1);
	switch (t) {
	case T_EXIT:
		atomic_fetch_add(&S->rounds, 1);
		fflush(stdout);
		_exit(0);	/* with the MRs, the memory and the other thread */
	case T_DEREG:
		break;
	case T_FREE:
		if (gmem_free(w->fd, &g))
			soak_error("thread %d: GPUSIM_IOC_FREE: %s", w->idx, strerror(errno));
		g.handle = 0;
		/*
		 * Every MR on the freed memory is revoked: at once where the
		 * client revokes inside the free callback (nvidia-peermem, the
		 * reference client, peermem without a keeper pin), soon after
		 * for peermem's nv_mem with its keeper pin, which keeps the
		 * memory allocated until the revocation work item has run
		 * (docs/architecture.md, "The keeper"): an RDMA until then reads the
		 * old memory, never memory the driver gave to someone else. So
		 * the check waits, as for munmap: an MR still usable after
		 * 10 s (times the slowdown) is an error.
		 */
		for (i = 0; i < n; i++)
			if (!wait_revoked(w, mr[i], (uintptr_t)base[i], slow_s(10)))
				soak_error("thread %d: an RDMA READ through an MR on freed GPU memory did not complete in error within %.0f s",
					   w->idx, slow_s(10));
		break;
	case T_MUNMAP:
	case T_MREMAP:
	case T_FIXED: {
		uint8_t *old = g.p;

		if (t == T_MUNMAP) {
			munmap(g.p, g.len);
			g.p = NULL;
		} else if (t == T_MREMAP) {
			void *to = free_range(g.len);
			void *p = to ? mremap(g.p, g.len, g.len, MREMAP_MAYMOVE | MREMAP_FIXED, to) : MAP_FAILED;

			if (p == MAP_FAILED) {
				soak_error("thread %d: mremap: %s", w->idx, strerror(errno));
				break;
			}
			g.p = p;
		} else {
			void *p = mmap(g.p, g.len, PROT_READ | PROT_WRITE,
				       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

			if (p == MAP_FAILED) {
				soak_error("thread %d: mmap(MAP_FIXED): %s", w->idx, strerror(errno));
				break;
			}
			/* New memory at the old address: no RDMA may reach it. */
			memset(p, 0x5a, g.len);
			fill(w->h, 4096, 0xdead);
			op_status(w, IBV_WR_RDMA_WRITE, w->h, 4096, (uintptr_t)base[0], mr[0]->rkey);
			for (size_t k = 0; k < g.len; k++)
				if (((uint8_t *)p)[k] != 0x5a) {
					atomic_fetch_add(&S->wrong_bytes, 1);
				}
			/* The anonymous memory is ours to unmap; the GPU memory is freed below by handle. */
			g.p = p;
		}
		if (soak_revokes_on_unmap) {
			atomic_fetch_add(&S->revoke_waits, 1);
			if (!wait_revoked(w, mr[0], (uintptr_t)old, slow_s(10)))
				atomic_fetch_add(&S->revoke_late, 1);
		}
		break;
	}
	case T_FORK:
		fork_child_exits(w, mr, base, mlen, n);
		break;
	}
	for (i = 0; i < n; i++)
		if (ibv_dereg_mr(mr[i]))
			soak_error("thread %d: ibv_dereg_mr failed", w->idx);
	if (g.handle && gmem_free(w->fd, &g))
		soak_error("thread %d: GPUSIM_IOC_FREE: %s", w->idx, strerror(errno));
	if (g.p)
		munmap(g.p, g.len);
	atomic_fetch_add(&S->rounds, 1);
}

/*
 * Point the exporter's window at the PCI BAR below the DMA device's switch
 * (its first PFN_LEN bytes): 1 if done, 0 if the rig has none (logged).
 */
static int soak_bar_window(int efd)
{
	struct rig_bar sw, rc;
	struct pfnmap_window win;
	char port[32];

	if (rig_ivshmem(&sw, &rc, port, sizeof(port)) || sw.len < PFN_LEN) {
		diag("soak: no PCI BAR of %lu MiB below the DMA device's switch: PFN rounds on RAM only",
		     PFN_LEN >> 20);
		return 0;
	}
	win.phys = sw.phys;
	win.len = PFN_LEN;
	if (ioctl(efd, PFNMAP_IOC_WINDOW, &win))
		bail("PFNMAP_IOC_WINDOW on ivshmem %s's BAR: %s", sw.dev, strerror(errno));
	diag("soak: half the PFN rounds on ivshmem %s's BAR 2 (%#llx), peer-to-peer", sw.dev,
	     (unsigned long long)sw.phys);
	return 1;
}

/* A round on PFN-mapped memory (see the top of the file). */
static void round_pfn(struct worker *w, int may_exit)
{
	struct ibv_mr *mr[2] = { 0 };
	uint8_t *map, *base[2], *slot;
	uint32_t mlen[2];
	int n, i, t, bar = soak_bar && atomic_fetch_add(&S->pfn_started, 1) % 2;

	if (bar) {
		map = mmap(NULL, PFN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, w->pfd,
			   PFNMAP_WINDOW_OFFSET);
		if (map == MAP_FAILED)
			map = NULL;
	} else {
		map = exporter_map(w->pfd, PFN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED);
	}
	if (!map) {
		soak_error("thread %d: mmap of the exporter%s: %s", w->idx,
			   bar ? "'s window (the BAR)" : "", strerror(errno));
		usleep(10000);
		return;
	}
	slot = map + (size_t)w->slot * PFN_SLOT;
	n = 1 + rnd(&w->seed) % 2;
	for (i = 0; i < n; i++) {
		size_t off = 0, len = PFN_SLOT;

		if (i) {	/* an unaligned sub-range of at least 4 KiB */
			off = (rnd(&w->seed) % (PFN_SLOT / 2)) & ~7ul;
			len = 4096 + rnd(&w->seed) % (PFN_SLOT - off - 4096);
		}
		base[i] = slot + off;
		mlen[i] = len;
		mr[i] = ibv_reg_mr(w->c.pd, base[i], len, MR_ACCESS);
		if (!mr[i]) {
			soak_error("thread %d: ibv_reg_mr on PFN memory (%zu bytes at +%zu): %s",
				   w->idx, len, off, strerror(errno));
			n = i;
			break;
		}
		atomic_fetch_add(&S->regs, 1);
	}
	for (i = 0; i < n; i++) {
		uint32_t len = mlen[i] < CHUNK ? mlen[i] : CHUNK;
		uint32_t at = (rnd(&w->seed) % (mlen[i] - len + 1)) & ~3u;

		write_read(w, mr[i], base[i] + at, len);
	}
	t = rnd(&w->seed) % T_N;
	if ((t == T_EXIT && !may_exit) || t == T_FREE || !n)
		t = T_DEREG;
	atomic_fetch_add(&S->teardown[t], 1);
	atomic_fetch_add(&S->pfn_rounds, 1);
	if (bar)
		atomic_fetch_add(&S->pfn_bar_rounds, 1);
	switch (t) {
	case T_EXIT:
		atomic_fetch_add(&S->rounds, 1);
		fflush(stdout);
		_exit(0);
	case T_MUNMAP:
	case T_MREMAP:
	case T_FIXED: {
		uint8_t *old = base[0];
		void *p;

		if (t == T_MUNMAP) {
			munmap(map, PFN_LEN);
			map = NULL;
		} else if (t == T_MREMAP) {
			void *to = free_range(PFN_LEN);

			p = to ? mremap(map, PFN_LEN, PFN_LEN, MREMAP_MAYMOVE | MREMAP_FIXED, to) :
				 MAP_FAILED;
			if (p == MAP_FAILED) {
				soak_error("thread %d: mremap of the PFN mapping: %s", w->idx,
					   strerror(errno));
				break;
			}
			map = p;
		} else {
			p = mmap(slot, PFN_SLOT, PROT_READ | PROT_WRITE,
				 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED) {
				soak_error("thread %d: mmap(MAP_FIXED) over the PFN mapping: %s",
					   w->idx, strerror(errno));
				break;
			}
			memset(p, 0x5a, PFN_SLOT);
			fill(w->h, 4096, 0xdead);
			op_status(w, IBV_WR_RDMA_WRITE, w->h, 4096, (uintptr_t)old, mr[0]->rkey);
			for (size_t k = 0; k < PFN_SLOT; k++)
				if (((uint8_t *)p)[k] != 0x5a)
					atomic_fetch_add(&S->wrong_bytes, 1);
		}
		/* The call returned: the revocation is complete already. */
		atomic_fetch_add(&S->revoke_waits, 1);
		if (op_status(w, IBV_WR_RDMA_READ, w->h + CHUNK, 64, (uintptr_t)old, mr[0]->rkey) != 1)
			atomic_fetch_add(&S->pfn_revoke_late, 1);
		break;
	}
	case T_FORK:
		fork_child_exits(w, mr, base, mlen, n);
		break;
	default:
		break;
	}
	for (i = 0; i < n; i++)
		if (ibv_dereg_mr(mr[i]))
			soak_error("thread %d: ibv_dereg_mr (PFN) failed", w->idx);
	if (map)
		munmap(map, PFN_LEN);
	atomic_fetch_add(&S->rounds, 1);
}

static void *worker_thread(void *arg)
{
	struct worker *w = arg;

	while (!atomic_load(&S->stop) && atomic_load(&S->rounds) < S->target) {
		if (w->pfd >= 0 && rnd(&w->seed) % 4 == 0)
			round_pfn(w, w->idx == 0);
		else
			round_once(w, w->idx == 0);
	}
	return NULL;
}

/* A worker process: two threads. Exits 0, also when a round chose T_EXIT. */
static int worker_process(int id, uint32_t seed)
{
	struct worker w[2];
	pthread_t t[2];
	int fd = open("/dev/gpusim", O_RDWR);
	int pfd = soak_pfn ? open(PFNMAP_DEV, O_RDWR) : -1;
	int si = atomic_fetch_add(&S->nseeds, 1);

	if (si < SOAK_SEEDS)
		S->seeds[si] = seed;
	if (fd < 0 || (soak_pfn && pfd < 0)) {
		soak_error("worker %d: open /dev/gpusim or the exporter: %s", id, strerror(errno));
		return 1;
	}
	for (int i = 0; i < 2; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].fd = fd;
		w[i].pfd = pfd;
		w[i].slot = id * 2 + i;
		w[i].idx = i;
		w[i].seed = seed * 2654435761u + i + 1;
		if (conn_open(&w[i].c)) {
			soak_error("worker %d: cannot open rxe0", id);
			return 1;
		}
		w[i].h = aligned_alloc(4096, HLEN);
		w[i].hmr = w[i].h ? ibv_reg_mr(w[i].c.pd, w[i].h, HLEN, MR_ACCESS) : NULL;
		if (!w[i].hmr) {
			soak_error("worker %d: host MR: %s", id, strerror(errno));
			return 1;
		}
	}
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, worker_thread, &w[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 2; i++) {
		ibv_dereg_mr(w[i].hmr);
		conn_close(&w[i].c);
	}
	close(fd);
	if (pfd >= 0)
		close(pfd);
	return 0;
}

/* ---- the parent ---- */

static const char *soak_core_name = "nv_mem";

static int soak_load(const struct soak_opts *o)
{
	char ko[600];

	if (!strcmp(o->client, "peermem")) {
		/* gpusim (if needed) and peermem, knobs reset */
		load_modules(soak_pfn ? "pfnmap=1" : NULL);
		soak_core_name = pm_name;
		soak_revokes_on_unmap = pm_param_on("mmu_notifier");
		return 0;
	}
	if (access("/sys/module/peermem", F_OK) == 0 && run("rmmod peermem"))
		return -1;
	if (access("/sys/module/peer_refclient", F_OK) == 0 && run("rmmod peer_refclient"))
		return -1;
	if (access("/sys/module/gpusim", F_OK) != 0) {
		snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root_dir());
		if (run("insmod %s %s", ko, getenv("GPUSIM_ARGS") ?: ""))
			return -1;
	}
	gs_defaults();
	/*
	 * gpusim's RM lock (on by gs_defaults, as NVIDIA's driver holds RM's
	 * lock) makes lockdep report nvidia-peermem's mapping-lock/RM cycle
	 * at the first free that races a registration (its free callback
	 * invalidates under RM, its get_pages takes RM under the core's
	 * mapping lock: x_nvpeermem_rmrace's subject), which fails the run
	 * and turns lockdep off for the rest of it. So with lockdep
	 * (/proc/lockdep) the soak runs nvidia-peermem without it, as
	 * t_free_window does; without lockdep (the plain kernel) with it,
	 * where a deadlock would show as a hang. GPUSIM_RM_LOCK overrides.
	 */
	gs_knob("rm_lock", getenv("GPUSIM_RM_LOCK") ?: access("/proc/lockdep", F_OK) ? "1" : "0");
	diag("soak: nvidia-peermem with gpusim rm_lock=%lld%s", gs("rm_lock"),
	     getenv("GPUSIM_RM_LOCK") ? " (GPUSIM_RM_LOCK)" :
	     access("/proc/lockdep", F_OK) ? "" : " (lockdep: its RM cycle is x_nvpeermem_rmrace's)");
	if (access("/sys/module/nvidia_peermem", F_OK) == 0 && run("rmmod nvidia_peermem"))
		return -1;
	snprintf(ko, sizeof(ko), "%s/tests/nvpeermem/nvidia-peermem.ko", root_dir());
	if (access(ko, R_OK)) {
		diag("%s is missing: build it with tests/nvpeermem/build.sh", ko);
		return -1;
	}
	soak_core_name = "nv_mem";
	soak_revokes_on_unmap = 0;	/* nvidia-peermem has no mmu notifier */
	return run("insmod %s", ko);
}

static int soak_unload(const struct soak_opts *o)
{
	/* This process's cached watch pins first (peermem's unload waits for them). */
	if (!strcmp(o->client, "peermem"))
		write_str("/sys/kernel/debug/peermem/watch_cache_flush", "1");
	return run("rmmod %s", strcmp(o->client, "peermem") ? "nvidia_peermem" : "peermem");
}

/* Nothing is left anywhere; diagnostics if something is. */
static int soak_idle(const struct soak_opts *o)
{
	struct peer_stats s;
	int ok_core = peer_stats(soak_core_name, &s) == 0 && core_all_released(&s);
	int ok_pm = strcmp(o->client, "peermem") || (pm_idle() && (!soak_pfn || pf_idle()));

	if (gs_idle() && ok_core && ok_pm)
		return 1;
	gs_diag();
	peer_stats_diag(soak_core_name);
	if (!strcmp(o->client, "peermem"))
		pm_diag();
	if (soak_pfn)
		pmc_diag("pfn", PMDBG_PFN);
	return 0;
}

static int idle_cond_client;	/* for wait_for(): 1 = peermem */
static int soak_idle_cond(void)
{
	struct peer_stats s;

	return gs_idle() && peer_stats(soak_core_name, &s) == 0 && core_all_released(&s) &&
	       (!idle_cond_client || (pm_idle() && (!soak_pfn || pf_idle())));
}

/* Delay knobs for an epoch: none, gpusim's, or gpusim's and peermem's. */
static void soak_knobs(const struct soak_opts *o, uint32_t *seed, char *desc, size_t dlen)
{
	static const char *const us[] = { "0", "0", "50", "300" };
	static const char *const pmk[] = {
		"inject_delay_acquire_ms", "inject_delay_get_pages_ms", "inject_delay_dma_map_ms",
		"inject_delay_unpin_ms",
		"inject_delay_release_ms", "inject_delay_address_work_ms",
		"inject_delay_address_change_ms",
		"inject_delay_invalidate_ms", "inject_delay_free_callback_ms",
	};
	const char *d = us[rnd(seed) % 4];
	char path[200];
	int k = -1;

	gs_knob("delay_us", d);
	if (!strcmp(o->client, "peermem")) {
		for (size_t i = 0; i < sizeof(pmk) / sizeof(pmk[0]); i++) {
			snprintf(path, sizeof(path), PMDBG "%s", pmk[i]);
			write_str(path, "0");
		}
		if (rnd(seed) % 2) {
			k = rnd(seed) % (sizeof(pmk) / sizeof(pmk[0]));
			snprintf(path, sizeof(path), PMDBG "%s", pmk[k]);
			write_str(path, "1");
		}
	}
	snprintf(desc, dlen, "gpusim delay_us=%s%s%s", d, k >= 0 ? ", peermem " : "",
		 k >= 0 ? pmk[k] : "");
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* How many worker processes started with a seed another one had already. */
static int soak_seed_repeats(int *n)
{
	static uint32_t v[SOAK_SEEDS];
	int r = 0;

	*n = atomic_load(&S->nseeds);
	if (*n > SOAK_SEEDS)
		*n = SOAK_SEEDS;
	memcpy(v, S->seeds, *n * sizeof(v[0]));
	qsort(v, *n, sizeof(v[0]), cmp_u32);
	for (int i = 1; i < *n; i++)
		r += v[i] == v[i - 1];
	return r;
}

static int soak_main(const struct soak_opts *o)
{
	long long per_epoch, prev = 0;
	int epoch, reloads = 0, idle_fail = 0, load_fail = 0, exits = 0, crashes = 0;
	int empty_epochs = 0;
	uint32_t seed = o->seed ?: (uint32_t)time(NULL);
	double t0 = now_s(), last = t0;
	char knobs[200];

	S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (S == MAP_FAILED)
		bail("mmap of the shared counters failed");
	memset(S, 0, sizeof(*S));
	rxe_up();
	/*
	 * PFN rounds: peermem only (nvidia-peermem serves no PFN-mapped
	 * memory), when the exporter is built; SOAK_PFN=0 turns them off.
	 */
	if (!strcmp(o->client, "peermem") && !(getenv("SOAK_PFN") && !strcmp(getenv("SOAK_PFN"), "0"))) {
		char ko[600];

		snprintf(ko, sizeof(ko), "%s/tests/pfnmap/pfnmap_exporter.ko", root_dir());
		soak_pfn = access(ko, R_OK) == 0;
		if (soak_pfn) {
			int efd;

			exporter_load();
			efd = exporter_open(O_RDWR);
			if (exporter_alloc(efd, PFN_LEN, PFNMAP_RESERVED, NULL))
				bail("the exporter cannot allocate %lu MiB", PFN_LEN >> 20);
			soak_bar = soak_bar_window(efd);
			close(efd);
		}
	}
	if (soak_load(o))
		bail("cannot load %s", o->client);
	idle_cond_client = !strcmp(o->client, "peermem");
	if (o->seconds)
		diag("soak: client %s, %d s in %d epochs of %.0f s (at most %lld rounds, at least %lld), %d processes x 2 threads, reload every %d, seed %u",
		     o->client, o->seconds, o->epochs, (double)o->seconds / o->epochs, o->rounds,
		     o->min_rounds, o->procs, o->reload_every, seed);
	else
		diag("soak: client %s, %lld rounds, %d processes x 2 threads, %d epochs, reload every %d, seed %u",
		     o->client, o->rounds, o->procs, o->epochs, o->reload_every, seed);
	per_epoch = (o->rounds + o->epochs - 1) / o->epochs;
	for (epoch = 0; epoch < o->epochs; epoch++) {
		int live = 0;
		pid_t pids[64];
		long long epoch_start = atomic_load(&S->rounds);
		/* Time mode: this epoch's slice of the run ends here. */
		double epoch_end = t0 + (double)o->seconds * (epoch + 1) / o->epochs;

		if (epoch && o->reload_every && epoch % o->reload_every == 0) {
			if (soak_unload(o) || soak_load(o))
				load_fail++;
			else
				reloads++;
		}
		soak_knobs(o, &seed, knobs, sizeof(knobs));
		S->target = o->seconds ? o->rounds : (epoch + 1) * per_epoch;
		if (S->target > o->rounds)
			S->target = o->rounds;
		atomic_store(&S->stop, 0);
		for (int p = 0; p < o->procs && p < 64; p++) {
			/*
			 * The worker's seed is drawn here, in the parent: drawn
			 * in the child, it left the parent's seed where it was,
			 * and every worker of an epoch (and every replacement
			 * after an exit round) ran the same rounds again.
			 */
			uint32_t ws = rnd(&seed);

			fflush(stdout);
			pids[p] = fork();
			if (pids[p] == 0)
				_exit(worker_process(p, ws));
			live += pids[p] > 0;
		}
		while (live) {
			int st;
			pid_t pid = waitpid(-1, &st, WNOHANG);

			if (pid > 0) {
				int p;

				for (p = 0; p < o->procs && pids[p] != pid; p++)
					;
				if (!WIFEXITED(st) || WEXITSTATUS(st)) {
					crashes++;
					soak_error("a worker process ended with status %#x", st);
				} else {
					exits++;
				}
				live--;
				/* A process that exited mid-epoch (T_EXIT) is replaced. */
				if (p < o->procs && !atomic_load(&S->stop) &&
				    atomic_load(&S->rounds) < S->target) {
					uint32_t ws = rnd(&seed);

					fflush(stdout);
					pids[p] = fork();
					if (pids[p] == 0)
						_exit(worker_process(p, ws));
					live += pids[p] > 0;
				}
				continue;
			}
			/*
			 * The epoch's slice is over; it ends once it has a round
			 * (on a very slow machine a slice can pass with none: a
			 * soak that makes no progress at all is still killed by
			 * the runner's limit).
			 */
			if (o->seconds && now_s() > epoch_end && atomic_load(&S->rounds) > epoch_start)
				atomic_store(&S->stop, 1);
			if (now_s() - last >= 30) {
				long long r = atomic_load(&S->rounds);

				last = now_s();
				diag("progress: %lld/%lld rounds, %lld MRs, %lld RDMA, %.0f s, %.1f rounds/s, %lld unexpected, %lld wrong bytes (epoch %d: %s)",
				     r, o->rounds, (long long)atomic_load(&S->regs),
				     (long long)atomic_load(&S->rdma), last - t0, (r - prev) / 30.0,
				     (long long)atomic_load(&S->unexpected),
				     (long long)atomic_load(&S->wrong_bytes), epoch, knobs);
				prev = r;
			}
			usleep(50000);
		}
		if (!wait_for(soak_idle_cond, 60) && !soak_idle(o)) {
			idle_fail++;
			diag("epoch %d: something is left after the workers ended (above)", epoch);
		}
		if (atomic_load(&S->rounds) == epoch_start) {
			empty_epochs++;
			diag("epoch %d (%s): no round finished in its %.0f s", epoch, knobs,
			     (double)o->seconds / o->epochs);
		}
		if (!o->seconds && atomic_load(&S->rounds) >= o->rounds)
			break;
	}
	gs_knob("delay_us", "0");
	if (!strcmp(o->client, "peermem"))
		run("for f in " PMDBG "inject_delay_*; do echo 0 > $f; done");

	diag("soak done: %lld rounds in %.0f s; teardowns:", (long long)atomic_load(&S->rounds),
	     now_s() - t0);
	for (int t = 0; t < T_N; t++)
		diag("  %-7s %lld", tname[t], (long long)atomic_load(&S->teardown[t]));
	diag("  of all rounds, on PFN-mapped memory: %lld (on the PCI BAR: %lld)",
	     (long long)atomic_load(&S->pfn_rounds), (long long)atomic_load(&S->pfn_bar_rounds));
	diag("  MRs %lld, RDMA operations %lld, bytes checked %lld, worker exits %d, reloads %d",
	     (long long)atomic_load(&S->regs), (long long)atomic_load(&S->rdma),
	     (long long)atomic_load(&S->bytes_checked), exits, reloads);
	if (S->last_error[0])
		diag("last unexpected failure: %s", S->last_error);

	if (o->seconds)
		ok(atomic_load(&S->rounds) >= o->min_rounds && !empty_epochs,
		   "%s: %lld rounds in %.0f s (at least %lld asked, %.2f rounds/s) and every one of %d epochs did some (%d did none)",
		   o->client, (long long)atomic_load(&S->rounds), now_s() - t0, o->min_rounds,
		   atomic_load(&S->rounds) / (now_s() - t0), o->epochs, empty_epochs);
	else
		ok(atomic_load(&S->rounds) >= o->rounds, "%s: %lld rounds done (%lld asked)", o->client,
		   (long long)atomic_load(&S->rounds), o->rounds);
	ok(atomic_load(&S->wrong_bytes) == 0, "%s: no wrong byte (%lld bytes checked)", o->client,
	   (long long)atomic_load(&S->bytes_checked));
	ok(atomic_load(&S->unexpected) == 0, "%s: no unexpected failure (%lld)", o->client,
	   (long long)atomic_load(&S->unexpected));
	ok(crashes == 0, "%s: no worker process died (%d)", o->client, crashes);
	{
		/*
		 * The rounds are random only if no two worker processes run the
		 * same sequence: each starts with its own seed (a process that
		 * replays another's sequence, or its predecessor's after an
		 * exit round, repeats the same rounds), and with enough rounds
		 * every teardown is chosen (at random each is 1 in T_N; a
		 * quarter of that is required from 40 rounds a kind on).
		 */
		int nseeds, rep = soak_seed_repeats(&nseeds), rare = -1;
		long long r = atomic_load(&S->rounds), least = -1;

		for (int t = 0; t < T_N; t++)
			if (least < 0 || atomic_load(&S->teardown[t]) < least) {
				least = atomic_load(&S->teardown[t]);
				rare = t;
			}
		ok(rep == 0, "%s: every worker process started with its own seed (%d started, %d repeated one)",
		   o->client, nseeds, rep);
		if (r >= 40 * T_N)
			ok(least * T_N * 4 >= r,
			   "%s: every teardown was chosen at least a quarter of 1 in %d of %lld rounds (the rarest, %s: %lld)",
			   o->client, T_N, r, tname[rare], least);
		else
			skip("%s: too few rounds (%lld) to require every teardown a share", o->client, r);
	}
	if (soak_revokes_on_unmap)
		ok(atomic_load(&S->revoke_late) == 0,
		   "%s: every munmap/mremap/MAP_FIXED revoked the MR within 10 s (%lld of %lld late)",
		   o->client, (long long)atomic_load(&S->revoke_late),
		   (long long)atomic_load(&S->revoke_waits));
	else
		skip("%s: revocation on munmap/mremap/MAP_FIXED not checked: the client has no mmu notifier",
		     o->client);
	if (soak_pfn)
		ok(atomic_load(&S->pfn_rounds) > 0 && atomic_load(&S->pfn_revoke_late) == 0,
		   "%s: %lld rounds on PFN-mapped memory (pfnmap=1); every munmap/mremap/MAP_FIXED of one had revoked its MR when it returned (%lld not)",
		   o->client, (long long)atomic_load(&S->pfn_rounds),
		   (long long)atomic_load(&S->pfn_revoke_late));
	else
		skip("%s: no rounds on PFN-mapped memory (not peermem, tests/pfnmap not built, or SOAK_PFN=0)",
		     o->client);
	if (soak_bar && atomic_load(&S->pfn_started) < 4)
		skip("%s: too few PFN rounds to require one on the PCI BAR (%lld begun; a slow machine)",
		     o->client, (long long)atomic_load(&S->pfn_started));
	else if (soak_bar)
		ok(atomic_load(&S->pfn_bar_rounds) > 0,
		   "%s: %lld of the PFN rounds on a PCI BAR reached peer-to-peer (pfn bar_maps_bus_addr)",
		   o->client, (long long)atomic_load(&S->pfn_bar_rounds));
	else if (soak_pfn)
		skip("%s: no PFN rounds on a PCI BAR (the rig has no BAR of %lu MiB below the DMA device's switch)",
		     o->client, PFN_LEN >> 20);
	ok(idle_fail == 0, "%s: after every epoch nothing was left registered, pinned, mapped or allocated (%d epochs failed)",
	   o->client, idle_fail);
	ok(load_fail == 0, "%s: every unload and reload worked (%d reloads, %d failed)", o->client,
	   reloads, load_fail);
	ok(soak_unload(o) == 0, "%s: the client unloads at the end", o->client);
	if (soak_pfn) {
		int efd = exporter_open(O_RDWR);

		ioctl(efd, PFNMAP_IOC_FREE);
		close(efd);
		ok(run("rmmod pfnmap_exporter") == 0, "the PFN exporter unloads at the end");
	}
	return finish();
}

static void soak_parse(int argc, char **argv, struct soak_opts *o)
{
	static const struct option lo[] = {
		{ "rounds", required_argument, 0, 'r' },
		{ "seconds", required_argument, 0, 's' },
		{ "min-rounds", required_argument, 0, 'm' },
		{ "procs", required_argument, 0, 'p' },
		{ "epochs", required_argument, 0, 'e' },
		{ "reload-every", required_argument, 0, 'l' },
		{ "client", required_argument, 0, 'c' },
		{ "seed", required_argument, 0, 'S' },
		{ 0, 0, 0, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'r': o->rounds = atoll(optarg); break;
		case 's': o->seconds = atoi(optarg); break;
		case 'm': o->min_rounds = atoll(optarg); break;
		case 'p': o->procs = atoi(optarg); break;
		case 'e': o->epochs = atoi(optarg); break;
		case 'l': o->reload_every = atoi(optarg); break;
		case 'c': o->client = optarg; break;
		case 'S': o->seed = (unsigned int)strtoul(optarg, NULL, 0); break;
		default:
			bail("usage: soak [--rounds N] [--seconds S [--min-rounds M]] [--procs P] [--epochs E] [--reload-every K] [--client peermem|nvpeermem] [--seed N]");
		}
	}
	if (o->rounds < 1 || o->procs < 1 || o->procs > 64 || o->epochs < 1 || o->seconds < 0 ||
	    o->min_rounds < 0 ||
	    (strcmp(o->client, "peermem") && strcmp(o->client, "nvpeermem")))
		bail("soak: bad arguments (rounds >= 1, 1 <= procs <= 64, epochs >= 1, client peermem or nvpeermem)");
}

#endif /* SOAK_H */
