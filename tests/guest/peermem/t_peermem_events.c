// SPDX-License-Identifier: GPL-2.0
/*
 * Revocation events (/dev/peermem, include/uapi/peermem.h, docs/module.md
 * "Revocation events"): the device node; the generation page (version,
 * sizes, starts at 0, read-only: PROT_WRITE refused, mprotect to write
 * refused, wrong size or offset refused, not inherited by fork, not
 * even after madvise(MADV_DOFORK), which fails, and /proc/self/mem
 * cannot read it); read()
 * sizes (EINVAL) and EAGAIN; for each cause the rig can produce
 * (GPUSIM_IOC_FREE, munmap, mremap, mmap(MAP_FIXED) over the range) the
 * counter moves by exactly one per revoked MR, already when the call that
 * revoked returns, and the record says generation, start, length, cause
 * and client; deregistered MRs and MRs revoked twice (free, then munmap)
 * count nothing more; another process's revocations and exit are
 * invisible, and the inherited fd is refused to a forked child (EPERM);
 * an munmap while get_pages waits (inject_delay_get_pages_ms): reported
 * once if the work item then revokes the MR (inject_delay_address_work_ms),
 * nothing if the registration fails; a record read() could not copy
 * becomes an overflow record and the records stay in generation order;
 * blocking read and poll wake; the overflow record (event_queue_len=4);
 * rmmod refused while a file is open, fine with only the mapping left;
 * events=0 leaves the device out.
 *
 * Not testable: the "exit" cause (a process cannot read its own exit,
 * and no other process may read its events; peermem never delivers it)
 * and "driver" (the NVIDIA P2P free callback does not say why it runs).
 */
#define _GNU_SOURCE
#include <poll.h>
#include "peermem_test.h"
#include "../../../include/uapi/peermem.h"

#define LEN (128 * 1024UL)	/* 2 GPU pages */

static struct conn c;
static int gfd;

static long long gen_of(const volatile struct peermem_gen_page *pg)
{
	return (long long)__atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE);
}

struct chan {
	int fd;
	struct peermem_gen_page *pg;
};

static int chan_open(struct chan *ch)
{
	ch->fd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_CLOEXEC);
	if (ch->fd < 0)
		return -errno;
	ch->pg = mmap(NULL, 4096, PROT_READ, MAP_SHARED, ch->fd, 0);
	if (ch->pg == MAP_FAILED) {
		int e = -errno;

		close(ch->fd);
		return e;
	}
	return 0;
}

static void chan_close(struct chan *ch)
{
	munmap(ch->pg, 4096);
	close(ch->fd);
}

/* Read up to max records without blocking: how many, or -errno. */
static int drain(int fd, struct peermem_event *ev, int max)
{
	ssize_t n = read(fd, ev, max * sizeof(*ev));

	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	if (n % sizeof(*ev))
		return -EIO;
	return n / sizeof(*ev);
}

/* read(): its errno, or 0 if it did not fail. */
static int rd_errno(int fd, void *buf, size_t n)
{
	return read(fd, buf, n) == -1 ? errno : 0;
}

static int set_nonblock(int fd)
{
	return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static const char *cause_str(unsigned int c)
{
	switch (c) {
	case PEERMEM_CAUSE_GPU_FREE: return "gpu_free";
	case PEERMEM_CAUSE_UNMAP: return "unmap";
	case PEERMEM_CAUSE_MOVE: return "move";
	case PEERMEM_CAUSE_EXIT: return "exit";
	case PEERMEM_CAUSE_DRIVER: return "driver";
	case PEERMEM_CAUSE_OVERFLOW: return "overflow";
	}
	return "?";
}

/* The record is {gen, start, len, cause, pm_name}. */
static int rec_is(const struct peermem_event *e, long long gen, const void *start,
		  size_t len, unsigned int cause)
{
	int good = e->generation == (unsigned long long)gen &&
		   e->start == (uintptr_t)start && e->length == len && e->cause == cause &&
		   e->flags == 0 && !strcmp(e->client, pm_name);

	if (!good)
		diag("record: generation %llu start %#llx length %#llx cause %u (%s) flags %u client '%.64s'; want %lld %p %#zx %u (%s) '%s'",
		     (unsigned long long)e->generation, (unsigned long long)e->start,
		     (unsigned long long)e->length, e->cause, cause_str(e->cause), e->flags,
		     e->client, gen, start, len, cause, cause_str(cause), pm_name);
	return good;
}

static struct ibv_mr *reg(struct gmem *g)
{
	struct ibv_mr *mr = ibv_reg_mr(c.pd, g->p, g->len, MR_ACCESS);

	if (!mr)
		bail("ibv_reg_mr on GPU memory: %s", strerror(errno));
	return mr;
}

static void alloc(struct gmem *g, size_t len)
{
	if (gmem_alloc(gfd, len, g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
}

/* ---- the device and the page ---- */

static void test_device(struct chan *ch)
{
	struct peermem_event ev[2];
	struct stat st = { 0 };
	void *p;
	int r, rw;

	ok(stat(PEERMEM_DEVICE_PATH, &st) == 0 && S_ISCHR(st.st_mode) &&
	   (st.st_mode & 0777) == 0666 && st.st_uid == 0,
	   "/dev/peermem is a character device, mode 0666, owner root (mode %o uid %d)",
	   st.st_mode & 0777, (int)st.st_uid);
	r = chan_open(ch);
	if (r)
		bail("open and mmap of /dev/peermem: %s", strerror(-r));
	ok(ch->pg->version == PEERMEM_EVENTS_VERSION &&
	   ch->pg->event_size == sizeof(struct peermem_event) && ch->pg->queue_len == 256 &&
	   gen_of(ch->pg) == 0 && ch->pg->reserved == 0,
	   "generation page: version %u, event_size %u (sizeof %zu), queue_len %u (default 256), generation %lld at open",
	   ch->pg->version, ch->pg->event_size, sizeof(struct peermem_event), ch->pg->queue_len,
	   gen_of(ch->pg));
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ch->fd, 0);
	r = p == MAP_FAILED ? errno : 0;
	ok(r == EACCES, "mmap with PROT_WRITE of an O_RDONLY fd is refused with EACCES (%s)",
	   r ? strerror(r) : "mapped");
	if (p != MAP_FAILED)
		munmap(p, 4096);
	rw = open(PEERMEM_DEVICE_PATH, O_RDWR);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
	r = p == MAP_FAILED ? errno : 0;
	ok(rw >= 0 && r == EPERM, "mmap with PROT_WRITE of an O_RDWR fd is refused by peermem with EPERM (%s)",
	   r ? strerror(r) : "mapped");
	if (p != MAP_FAILED)
		munmap(p, 4096);
	p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, rw, 0);
	r = p == MAP_FAILED ? errno : 0;
	ok(r == 0 && mprotect(p, 4096, PROT_READ | PROT_WRITE) == -1 && errno == EACCES,
	   "a MAP_PRIVATE read-only mapping of an O_RDWR fd cannot be made writable (mprotect: EACCES; mmap %s)",
	   r ? strerror(r) : "ok");
	if (p != MAP_FAILED)
		munmap(p, 4096);
	close(rw);
	errno = 0;
	ok(mprotect(ch->pg, 4096, PROT_READ | PROT_WRITE) == -1 && errno == EACCES,
	   "mprotect of the page to PROT_WRITE is refused with EACCES (%s)", strerror(errno));
	p = mmap(NULL, 8192, PROT_READ, MAP_SHARED, ch->fd, 0);
	ok(p == MAP_FAILED && errno == EINVAL, "mmap of two pages is refused with EINVAL (%s)",
	   p == MAP_FAILED ? strerror(errno) : "mapped");
	if (p != MAP_FAILED)
		munmap(p, 8192);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, ch->fd, 4096);
	ok(p == MAP_FAILED && errno == EINVAL, "mmap at offset 4096 is refused with EINVAL (%s)",
	   p == MAP_FAILED ? strerror(errno) : "mapped");
	if (p != MAP_FAILED)
		munmap(p, 4096);
	set_nonblock(ch->fd);
	r = rd_errno(ch->fd, ev, 0);
	ok(r == EINVAL, "read of 0 bytes: EINVAL (%s)", strerror(r));
	r = rd_errno(ch->fd, ev, sizeof(ev[0]) - 1);
	ok(r == EINVAL, "read of sizeof(record) - 1 bytes: EINVAL (%s)", strerror(r));
	r = rd_errno(ch->fd, ev, sizeof(ev[0]) + 1);
	ok(r == EINVAL, "read of sizeof(record) + 1 bytes: EINVAL (%s)", strerror(r));
	r = rd_errno(ch->fd, ev, sizeof(ev));
	ok(r == EAGAIN, "non-blocking read of two records with nothing queued: EAGAIN (%s)", strerror(r));
	r = pread(ch->fd, ev, sizeof(ev[0]), 0) == -1 ? errno : 0;
	ok(r == ESPIPE, "pread is refused (ESPIPE: %s)", strerror(r));
}

/* ---- one cause at a time ---- */

enum how { FREE, MUNMAP, MREMAP, MAPFIXED };
static const char *how_str[] = { "GPUSIM_IOC_FREE", "munmap", "mremap", "mmap(MAP_FIXED)" };

/* Revoke g's MR by how; g->p is what the MR was registered at. */
static int revoke_by(struct gmem *g, enum how how)
{
	void *q, *r;

	switch (how) {
	case FREE:
		return gmem_free(gfd, g);
	case MUNMAP:
		return munmap(g->p, g->len);
	case MREMAP:
		q = mmap(NULL, g->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED)
			return -1;
		r = mremap(g->p, g->len, g->len, MREMAP_MAYMOVE | MREMAP_FIXED, q);
		if (r != q)
			return -1;
		munmap(q, g->len);	/* the allocation, moved: gpusim frees it below */
		return 0;
	case MAPFIXED:
		r = mmap(g->p, g->len, PROT_READ | PROT_WRITE,
			 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r != g->p)
			return -1;
		munmap(r, g->len);
		return 0;
	}
	return -1;
}

/*
 * After the revoked MRs of g were deregistered: free what is left of g (a
 * freed allocation is only dropped), then nothing more may be counted or
 * queued than generation g1.
 */
static void settle(struct chan *ch, struct gmem *g, enum how how, long long g1, const char *what)
{
	struct peermem_event ev[8];
	int n;

	if (how != FREE)
		gmem_free(gfd, g);
	else
		gmem_drop(g);
	usleep(200000);
	n = drain(ch->fd, ev, 8);
	ok(gen_of(ch->pg) == g1 && n == 0,
	   "%s: nothing more after deregistration and cleanup (generation %lld, %d records)",
	   what, gen_of(ch->pg), n);
}

static void test_cause(struct chan *ch, enum how how, unsigned int cause)
{
	struct peermem_event ev[4];
	long long g0, g1;
	struct ibv_mr *mr;
	struct gmem g;
	int n;

	alloc(&g, LEN);
	mr = reg(&g);
	g0 = gen_of(ch->pg);
	ok(revoke_by(&g, how) == 0, "%s: revoking the MR's range succeeds", how_str[how]);
	g1 = gen_of(ch->pg);
	ok(g1 == g0 + 1, "%s: the counter moved by exactly one when the call returned (%lld -> %lld)",
	   how_str[how], g0, g1);
	n = drain(ch->fd, ev, 4);
	ok(n == 1 && rec_is(&ev[0], g1, g.p, LEN, cause),
	   "%s: one record {generation %lld, start, length %#lx, cause %s, client %s} (got %d)",
	   how_str[how], g1, LEN, cause_str(cause), pm_name, n);
	ok(ibv_dereg_mr(mr) == 0, "%s: ibv_dereg_mr of the revoked MR succeeds", how_str[how]);
	settle(ch, &g, how, g1, how_str[how]);
}

/* Several MRs: one count each, records in order; deregistered ones count nothing. */
static void test_several(struct chan *ch)
{
	struct peermem_event ev[8];
	struct ibv_mr *mr[4];
	struct gmem g[4];
	void *p[3];
	long long g0;
	int n, good = 1;

	for (int i = 0; i < 4; i++) {
		alloc(&g[i], LEN);
		mr[i] = reg(&g[i]);
	}
	for (int i = 0; i < 3; i++)
		p[i] = g[i].p;
	g0 = gen_of(ch->pg);
	ibv_dereg_mr(mr[3]);	/* deregistered first: never reported */
	gmem_free(gfd, &g[3]);
	gmem_drop(&g[3]);
	ok(gen_of(ch->pg) == g0, "several: freeing a deregistered MR's memory counts nothing (%lld -> %lld)",
	   g0, gen_of(ch->pg));
	gmem_free(gfd, &g[0]);
	munmap(g[1].p, LEN);
	gmem_free(gfd, &g[2]);
	ok(gen_of(ch->pg) == g0 + 3, "several: three MRs revoked, the counter moved by three (%lld -> %lld)",
	   g0, gen_of(ch->pg));
	/* Free, then munmap, of the same MR: revoked once, counted once. */
	munmap(g[0].p, LEN);
	munmap(g[2].p, LEN);
	g[0].p = g[2].p = NULL;
	usleep(200000);
	ok(gen_of(ch->pg) == g0 + 3,
	   "several: munmap of ranges whose memory was freed counts nothing more (%lld)", gen_of(ch->pg));
	n = drain(ch->fd, ev, 8);
	if (n == 3) {
		good &= rec_is(&ev[0], g0 + 1, p[0], LEN, PEERMEM_CAUSE_GPU_FREE);
		good &= rec_is(&ev[1], g0 + 2, p[1], LEN, PEERMEM_CAUSE_UNMAP);
		good &= rec_is(&ev[2], g0 + 3, p[2], LEN, PEERMEM_CAUSE_GPU_FREE);
	}
	ok(n == 3 && good, "several: three records in order: gpu_free, unmap, gpu_free with generations %lld..%lld (got %d)",
	   g0 + 1, g0 + 3, n);
	for (int i = 0; i < 3; i++)
		ibv_dereg_mr(mr[i]);
	gmem_free(gfd, &g[1]);
}

/*
 * Two MRs on one range (a cache and the application both registered it)
 * and a third on its second half: one revocation reports each, one
 * record per MR with the MR's own range, in one generation step each.
 */
static void test_same_range(struct chan *ch, enum how how, unsigned int cause)
{
	struct peermem_event ev[8];
	struct ibv_mr *mr[3];
	int n, seen_whole = 0, seen_half = 0, gens_ok = 1;
	char what[64];
	long long g0, g1;
	struct gmem g;
	void *p;

	alloc(&g, LEN);
	p = g.p;
	mr[0] = reg(&g);
	mr[1] = reg(&g);
	mr[2] = ibv_reg_mr(c.pd, (uint8_t *)g.p + LEN / 2, LEN / 2, MR_ACCESS);
	if (!mr[2])
		bail("ibv_reg_mr on the second half: %s", strerror(errno));
	g0 = gen_of(ch->pg);
	ok(revoke_by(&g, how) == 0, "same range, %s: revoking the range under three MRs succeeds", how_str[how]);
	g1 = gen_of(ch->pg);
	ok(g1 == g0 + 3, "same range, %s: the counter moved by three, one per MR (%lld -> %lld)",
	   how_str[how], g0, g1);
	n = drain(ch->fd, ev, 8);
	for (int i = 0; i < n; i++) {
		gens_ok &= ev[i].generation == (unsigned long long)(g0 + 1 + i) && ev[i].cause == cause &&
			   !strcmp(ev[i].client, pm_name);
		if (ev[i].start == (uintptr_t)p && ev[i].length == LEN)
			seen_whole++;
		else if (ev[i].start == (uintptr_t)p + LEN / 2 && ev[i].length == LEN / 2)
			seen_half++;
	}
	ok(n == 3 && gens_ok && seen_whole == 2 && seen_half == 1,
	   "same range, %s: three records, cause %s, generations %lld..%lld: two of the whole range, one of its second half (got %d: %d whole, %d half)",
	   how_str[how], cause_str(cause), g0 + 1, g0 + 3, n, seen_whole, seen_half);
	for (int i = 0; i < 3; i++)
		ibv_dereg_mr(mr[i]);
	snprintf(what, sizeof(what), "same range, %s", how_str[how]);
	settle(ch, &g, how, g1, what);
}

/* ---- an unmap before get_pages arms the registration (issue 21, finding 4) ---- */

struct late_unmap {
	void *p;
	long long mark0;	/* registrations_acquired before ibv_reg_mr */
	double t0, t_unmap;
	int claimed, ret;
};

/* munmap 50 ms after acquire claimed the range: inside get_pages' delay. */
static void *late_unmap_thread(void *arg)
{
	struct late_unmap *u = arg;

	while (now_s() < u->t0 + 3 && pm("registrations_acquired") == u->mark0)
		usleep(2000);
	u->claimed = pm("registrations_acquired") > u->mark0;
	usleep(50000);
	u->t_unmap = now_s();
	u->ret = munmap(u->p, LEN) ? -errno : 0;
	return NULL;
}

static int pm_knob(const char *name, int ms)
{
	char path[128], val[16];

	snprintf(path, sizeof(path), PMDBG "%s", name);
	snprintf(val, sizeof(val), "%d", ms);
	return write_str(path, val);
}

/*
 * The notifier fires while get_pages sleeps (inject_delay_get_pages_ms),
 * before the core's ticket is stored. work_ms: how long the address-change
 * work item waits before it takes the registration lock
 * (inject_delay_address_work_ms). 0: it runs at once, finds no ticket, and
 * get_pages fails with EFAULT: never an MR, so nothing is reported. 800: it
 * runs after get_pages stored the ticket and revokes the live MR through
 * the core: that revocation must be reported like any other, once.
 */
static void test_unmap_before_arm(struct chan *ch, int work_ms)
{
	struct peermem_event ev[4];
	struct late_unmap u = { 0 };
	long long g0, g_reg, g1, ac0, inv0;
	const char *what = work_ms ? "work item after get_pages" : "work item before get_pages";
	struct ibv_mr *mr;
	struct gmem g;
	pthread_t t;
	double end;
	int err, n;

	alloc(&g, LEN);
	g0 = gen_of(ch->pg);
	ac0 = pm("address_changes");
	inv0 = pm("invalidations_mmu_notifier");
	if (pm_knob("inject_delay_get_pages_ms", 300) || pm_knob("inject_delay_address_work_ms", work_ms))
		bail("cannot set the inject_delay knobs");
	u.p = g.p;
	u.mark0 = pm("registrations_acquired");
	u.t0 = now_s();
	if (pthread_create(&t, NULL, late_unmap_thread, &u))
		bail("pthread_create");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	err = mr ? 0 : errno;
	g_reg = gen_of(ch->pg);
	pthread_join(t, NULL);
	pm_knob("inject_delay_get_pages_ms", 0);
	/* The work item has run when address_changes moved (it waits work_ms). */
	end = now_s() + slow_s(5);
	while (pm("address_changes") == ac0 && now_s() < end)
		usleep(20000);
	usleep(300000);
	pm_knob("inject_delay_address_work_ms", 0);
	g1 = gen_of(ch->pg);
	n = drain(ch->fd, ev, 4);
	diag("unmap before arm (%s): munmap %.0f ms after the start (%s), ibv_reg_mr: %s; generation %lld -> %lld at ibv_reg_mr's return -> %lld; address_changes %+lld, invalidations_mmu_notifier %+lld; %d records",
	     what, (u.t_unmap - u.t0) * 1000, u.claimed ? "acquire had claimed the range" : "NOT claimed yet",
	     mr ? "registered" : strerror(err), g0, g_reg, g1, pm("address_changes") - ac0,
	     pm("invalidations_mmu_notifier") - inv0, n);
	ok(u.ret == 0 && u.claimed, "unmap before arm (%s): munmap ran after acquire, inside get_pages' delay", what);
	if (!work_ms) {
		ok(!mr && err == EFAULT && pm("address_changes") == ac0 + 1 &&
		   pm("invalidations_mmu_notifier") == inv0,
		   "unmap before arm (%s): ibv_reg_mr fails with EFAULT, no invalidation through the core (%s)",
		   what, mr ? "registered" : strerror(err));
		ok(g1 == g0 && n == 0,
		   "unmap before arm (%s): never an MR, nothing reported (generation %lld -> %lld, %d records)",
		   what, g0, g1, n);
	} else {
		ok(mr && pm("address_changes") == ac0 + 1 && pm("invalidations_mmu_notifier") == inv0 + 1,
		   "unmap before arm (%s): ibv_reg_mr succeeds and the work item revokes the MR through the core (%s)",
		   what, mr ? "registered" : strerror(err));
		ok(g1 == g0 + 1 && n == 1 && rec_is(&ev[0], g0 + 1, g.p, LEN, PEERMEM_CAUSE_UNMAP),
		   "unmap before arm (%s): the revocation is reported once: generation %lld -> %lld, one unmap record (%d records)",
		   what, g0, g1, n);
		ok(g_reg == g0 + 1,
		   "unmap before arm (%s): the counter had moved already when ibv_reg_mr returned (%lld)",
		   what, g_reg);
	}
	if (mr)
		ibv_dereg_mr(mr);
	g.p = NULL;
	gmem_free(gfd, &g);
	usleep(200000);
	ok(gen_of(ch->pg) == g1 && drain(ch->fd, ev, 4) == 0,
	   "unmap before arm (%s): nothing more after deregistration and the free (generation %lld)",
	   what, gen_of(ch->pg));
}

/* ---- a record read() could not copy (issue 21, finding 8) ---- */

/*
 * Three records queued; read() copies the first and faults on the second
 * (lost: the second half of the buffer is PROT_NONE), or faults on the
 * first (EFAULT). What follows must still be in generation order, and the
 * lost record covered by an overflow record (generation at least the lost
 * one's), the last record read carrying the counter's value.
 */
static void test_lost_copy(struct chan *ch, int partial)
{
	struct peermem_event ev[8], *buf;
	long long g0, g1, prev;
	struct ibv_mr *mr[3];
	struct gmem g[3];
	int n, inorder = 1, covered = 0, got = 0, err = 0;
	const char *what = partial ? "second record faults" : "first record faults";
	char *area;
	ssize_t r;

	area = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED || mprotect(area + 4096, 4096, PROT_NONE))
		bail("mmap/mprotect of the read buffer");
	buf = (struct peermem_event *)(area + (partial ? 4096 - sizeof(*buf) : 4096));
	for (int i = 0; i < 3; i++) {
		alloc(&g[i], LEN);
		mr[i] = reg(&g[i]);
	}
	g0 = gen_of(ch->pg);
	for (int i = 0; i < 3; i++)
		gmem_free(gfd, &g[i]);
	g1 = gen_of(ch->pg);
	r = read(ch->fd, buf, 2 * sizeof(*buf));
	if (r < 0)
		err = errno;
	prev = g0;
	if (partial && r == sizeof(*buf)) {
		got = 1;
		inorder = rec_is(&buf[0], g0 + 1, g[0].p, LEN, PEERMEM_CAUSE_GPU_FREE);
		prev = g0 + 1;
	}
	n = drain(ch->fd, ev, 8);
	for (int i = 0; i < n; i++) {
		diag("lost copy (%s): record %d: generation %llu cause %s", what, i,
		     (unsigned long long)ev[i].generation, cause_str(ev[i].cause));
		if ((long long)ev[i].generation <= prev)
			inorder = 0;
		prev = ev[i].generation;
		if (ev[i].cause == PEERMEM_CAUSE_OVERFLOW && (long long)ev[i].generation >= g0 + 1 + got)
			covered = 1;
	}
	ok(g1 == g0 + 3 && (partial ? r == sizeof(*buf) : err == EFAULT),
	   "lost copy (%s): three revocations (generation %lld -> %lld); read returns %s (%zd, %s)",
	   what, g0, g1, partial ? "the first record" : "EFAULT", r, err ? strerror(err) : "-");
	ok(n > 0 && inorder && covered && (long long)ev[n - 1].generation == g1,
	   "lost copy (%s): the records that follow are in generation order, the lost one is covered by an overflow record, the last one has the counter's generation %lld (%d records)",
	   what, g1, n);
	for (int i = 0; i < 3; i++) {
		ibv_dereg_mr(mr[i]);
		gmem_drop(&g[i]);
	}
	munmap(area, 8192);
}

/* ---- other processes ---- */

/* Child: its own channel, its own MR freed: sees exactly its one revocation. */
static int child_own(int go_fd, int done_fd)
{
	struct peermem_event ev[4];
	struct ibv_mr *mr;
	struct conn cc;
	struct chan ch;
	struct gmem g;
	int fd, n;
	char b;

	if (chan_open(&ch) || conn_open(&cc))
		return 10;
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0 || gmem_alloc(fd, LEN, &g))
		return 11;
	mr = ibv_reg_mr(cc.pd, g.p, LEN, MR_ACCESS);
	if (!mr)
		return 12;
	if (write(done_fd, "r", 1) != 1 || read(go_fd, &b, 1) != 1)	/* parent revokes its own now */
		return 13;
	if (gen_of(ch.pg) != 0)
		return 14;	/* saw the parent's revocation */
	if (gmem_free(fd, &g))
		return 15;
	if (gen_of(ch.pg) != 1)
		return 16;
	set_nonblock(ch.fd);
	n = drain(ch.fd, ev, 4);
	if (n != 1 || ev[0].generation != 1 || ev[0].start != (uintptr_t)g.p ||
	    ev[0].cause != PEERMEM_CAUSE_GPU_FREE)
		return 17;
	ibv_dereg_mr(mr);
	if (write(done_fd, "d", 1) != 1)
		return 18;
	return 0;
}

static void test_other_process(struct chan *ch)
{
	int go[2], done[2], st = -1;
	struct peermem_event ev[4];
	long long g0;
	struct ibv_mr *mr;
	struct gmem g;
	pid_t pid;
	char b = 0;

	if (pipe(go) || pipe(done))
		bail("pipe");
	alloc(&g, LEN);
	mr = reg(&g);
	g0 = gen_of(ch->pg);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(child_own(go[0], done[1]));
	ok(read(done[0], &b, 1) == 1 && b == 'r', "other process: a child opened its own channel and registered an MR");
	gmem_free(gfd, &g);	/* the parent's revocation */
	ok(gen_of(ch->pg) == g0 + 1, "other process: the parent's free counts in the parent (%lld -> %lld)",
	   g0, gen_of(ch->pg));
	ok(write(go[1], "g", 1) == 1 && read(done[0], &b, 1) == 1 && b == 'd',
	   "other process: the child freed its own memory");
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "other process: the child saw only its own revocation (generation 0 after the parent's free, 1 after its own, one gpu_free record; status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	ok(gen_of(ch->pg) == g0 + 1 && drain(ch->fd, ev, 4) == 1 && ev[0].generation == (unsigned long long)g0 + 1,
	   "other process: the parent saw only its own (generation %lld, one record)", gen_of(ch->pg));
	ibv_dereg_mr(mr);
	gmem_drop(&g);

	/* A child that registers and exits holding its MR: nothing for the parent. */
	g0 = gen_of(ch->pg);
	ok(exit_child_run(0, LEN, 0x4444) == 0, "other process: a child registered GPU memory and exited holding it");
	usleep(200000);
	ok(gen_of(ch->pg) == g0 && drain(ch->fd, ev, 4) == 0,
	   "other process: the child's exit is invisible to the parent (generation %lld -> %lld)", g0, gen_of(ch->pg));

	/* The inherited fd and mapping. */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		unsigned char vec;
		void *p;

		if (read(ch->fd, ev, sizeof(ev[0])) != -1 || errno != EPERM)
			_exit(20);
		p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, ch->fd, 0);
		if (p != MAP_FAILED || errno != EPERM)
			_exit(21);
		/* VM_DONTCOPY: the parent's mapping is not in the child. */
		if (mincore(ch->pg, 4096, &vec) != -1 || errno != ENOMEM)
			_exit(22);
		_exit(0);
	}
	st = -1;
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "other process: a forked child gets EPERM from read and mmap of the inherited fd, and has no copy of the page (status %d: 20 read, 21 mmap, 22 mapping)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
}

/*
 * The generation page stays the opener's (issue 21, finding 6): fork()
 * never copies it, not even after madvise(MADV_DOFORK), which must be
 * refused (EINVAL) or at least leave the child without the page; and no
 * get_user_pages reaches it, so /proc/self/mem cannot read it either.
 */
static void test_inherit(struct chan *ch)
{
	char path[64], buf[8];
	int r, st = -1, mfd;
	ssize_t n;
	pid_t pid;

	errno = 0;
	r = madvise(ch->pg, 4096, MADV_DOFORK);
	r = r ? errno : 0;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		unsigned char vec;

		/* Mapped in the child: mincore succeeds. */
		_exit(mincore(ch->pg, 4096, &vec) == 0 ? 30 : 0);
	}
	waitpid(pid, &st, 0);
	ok(r == EINVAL && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "madvise(MADV_DOFORK) of the generation page is refused with EINVAL (%s), and a child forked after it has no copy of the page (status %d: 30 mapped)",
	   r ? strerror(r) : "accepted", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	if (!r)
		madvise(ch->pg, 4096, MADV_DONTFORK);
	snprintf(path, sizeof(path), "/proc/%d/mem", (int)getpid());
	mfd = open(path, O_RDONLY | O_CLOEXEC);
	if (mfd < 0)
		bail("open %s: %s", path, strerror(errno));
	errno = 0;
	n = pread(mfd, buf, sizeof(buf), (off_t)(uintptr_t)ch->pg);
	r = n < 0 ? errno : 0;
	ok(n < 0 && r == EIO,
	   "a read of /proc/self/mem at the generation page fails with EIO: get_user_pages does not reach it (%s, %zd bytes)",
	   r ? strerror(r) : "read", n);
	close(mfd);
}

/* ---- waking ---- */

struct waiter {
	int fd, mode;	/* 0: poll, 1: blocking read */
	int revents;
	ssize_t n;
	struct peermem_event ev;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	struct pollfd p = { .fd = w->fd, .events = POLLIN };

	if (w->mode == 0) {
		if (poll(&p, 1, 20000) == 1)
			w->revents = p.revents;
	} else {
		w->n = read(w->fd, &w->ev, sizeof(w->ev));
	}
	return NULL;
}

static void test_wake(struct chan *ch)
{
	struct peermem_event ev[2];
	struct waiter w;
	struct ibv_mr *mr;
	pthread_t t;
	struct gmem g;
	int bfd;

	for (int mode = 0; mode < 2; mode++) {
		memset(&w, 0, sizeof(w));
		bfd = open(PEERMEM_DEVICE_PATH, O_RDONLY);	/* blocking */
		w.fd = mode == 0 ? ch->fd : bfd;
		w.mode = mode;
		alloc(&g, LEN);
		mr = reg(&g);
		pthread_create(&t, NULL, wait_thread, &w);
		usleep(300000);
		gmem_free(gfd, &g);
		pthread_join(t, NULL);
		if (mode == 0)
			ok((w.revents & POLLIN) && drain(ch->fd, ev, 2) == 1,
			   "poll: a thread waiting in poll() wakes with POLLIN when an MR is revoked (revents %#x)",
			   w.revents);
		else
			ok(w.n == sizeof(w.ev) && w.ev.cause == PEERMEM_CAUSE_GPU_FREE && w.ev.generation == 1,
			   "blocking read: a thread in read() on a new fd returns the record when an MR is revoked (%zd bytes, generation %llu)",
			   w.n, (unsigned long long)w.ev.generation);
		drain(ch->fd, ev, 2);
		ibv_dereg_mr(mr);
		gmem_drop(&g);
		close(bfd);
	}
}

/* ---- overflow (event_queue_len=4) ---- */

static void test_overflow(void)
{
	struct peermem_event ev[8];
	struct ibv_mr *mr[7];
	struct gmem g[7];
	struct chan ch;
	int n, good;

	if (chan_open(&ch))
		bail("open /dev/peermem after the reload");
	set_nonblock(ch.fd);
	ok(ch.pg->queue_len == 4, "overflow: peermem loaded with event_queue_len=4 (page says %u)", ch.pg->queue_len);
	for (int i = 0; i < 7; i++) {
		alloc(&g[i], LEN);
		mr[i] = reg(&g[i]);
	}
	for (int i = 0; i < 6; i++)
		gmem_free(gfd, &g[i]);
	ok(gen_of(ch.pg) == 6, "overflow: six revocations unread: generation 6 (%lld)", gen_of(ch.pg));
	n = drain(ch.fd, ev, 8);
	good = n == 5;
	for (int i = 0; good && i < 4; i++)
		good = rec_is(&ev[i], i + 1, g[i].p, LEN, PEERMEM_CAUSE_GPU_FREE);
	ok(good && ev[4].cause == PEERMEM_CAUSE_OVERFLOW && ev[4].generation == 6 &&
	   ev[4].start == 0 && ev[4].length == 0 && ev[4].client[0] == 0,
	   "overflow: the four queued records, then one overflow record of generation 6 (got %d records, last cause %s generation %llu)",
	   n, n > 0 ? cause_str(ev[n - 1].cause) : "-", n > 0 ? (unsigned long long)ev[n - 1].generation : 0ULL);
	gmem_free(gfd, &g[6]);
	n = drain(ch.fd, ev, 8);
	ok(n == 1 && rec_is(&ev[0], 7, g[6].p, LEN, PEERMEM_CAUSE_GPU_FREE),
	   "overflow: once read, the next revocation queues normally (generation 7; %d records)", n);
	for (int i = 0; i < 7; i++) {
		ibv_dereg_mr(mr[i]);
		gmem_drop(&g[i]);
	}
	chan_close(&ch);
}

/* ---- unload ---- */

static void test_unload(void)
{
	struct chan ch;
	long long v;

	conn_close(&c);
	if (chan_open(&ch))
		bail("open /dev/peermem");
	ok(run("rmmod peermem 2>/dev/null") != 0 && access("/sys/module/peermem", F_OK) == 0,
	   "unload: rmmod peermem is refused while /dev/peermem is open");
	close(ch.fd);
	v = gen_of(ch.pg);
	/* The mapping holds the file (vm_file): it is released at munmap. */
	ok(run("rmmod peermem 2>/dev/null") != 0 && gen_of(ch.pg) == v &&
	   ch.pg->version == PEERMEM_EVENTS_VERSION,
	   "unload: closed but still mapped: rmmod is still refused, the page stays readable (generation %lld)", v);
	ok(munmap(ch.pg, 4096) == 0, "unload: munmap of the page");
	ok(run("rmmod peermem") == 0, "unload: with the file closed and unmapped rmmod succeeds");
	load_modules("events=0");
	ok(access(PEERMEM_DEVICE_PATH, F_OK) != 0, "events=0: no /dev/peermem");
	ok(run("rmmod peermem") == 0 && run("insmod %s/peermem.ko event_queue_len=1 2>/dev/null", root_dir()) != 0,
	   "event_queue_len=1 is refused at load");
	ok(dmesg_has("event_queue_len=1 is out of range"), "event_queue_len=1: the log says the range");
}

int main(void)
{
	struct chan ch;

	rxe_up();
	load_modules(NULL);
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0)
		bail("open /dev/gpusim");
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);

	test_device(&ch);
	test_cause(&ch, FREE, PEERMEM_CAUSE_GPU_FREE);
	test_cause(&ch, MUNMAP, PEERMEM_CAUSE_UNMAP);
	test_cause(&ch, MREMAP, PEERMEM_CAUSE_MOVE);
	test_cause(&ch, MAPFIXED, PEERMEM_CAUSE_UNMAP);
	test_several(&ch);
	test_same_range(&ch, FREE, PEERMEM_CAUSE_GPU_FREE);
	test_same_range(&ch, MUNMAP, PEERMEM_CAUSE_UNMAP);
	test_unmap_before_arm(&ch, 0);
	test_unmap_before_arm(&ch, 800);
	test_lost_copy(&ch, 1);
	test_lost_copy(&ch, 0);
	test_other_process(&ch);
	test_inherit(&ch);
	test_wake(&ch);
	chan_close(&ch);

	conn_close(&c);
	load_modules("event_queue_len=4");
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	test_overflow();
	ok(wait_for(all_idle, 10), "peermem and gpusim idle");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	test_unload();
	close(gfd);
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
