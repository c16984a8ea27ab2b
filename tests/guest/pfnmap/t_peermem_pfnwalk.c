// SPDX-License-Identifier: GPL-2.0
/*
 * t_peermem_pfnwalk - the cost and the bounds of the PFN-map source's walk
 * of a range (issue 21, finding 3; docs/module.md, "PFN-mapped memory"):
 *
 *  - a 1 GiB ring: a memmap= reservation of 1 GiB does not fit the 2 GiB
 *    rig guest, so the exporter reserves the largest of 1 GiB, 512 MiB and
 *    256 MiB it can get (4 MiB pieces, PageReserved) and maps it over and
 *    over into one 1 GiB mapping (PFNMAP_REPEAT_OFFSET; at most 4 times,
 *    DMA-API debug allows 7 overlapping mappings of a cacheline): the walk
 *    reads 262144 pages, as for a 1 GiB ring. It is registered through the
 *    core's rig-only umem_test hook (kind mr: acquire, get_pages, dma_map
 *    of peermem's nv_mem as for an MR; rxe cannot make a 1 GiB MR, its own
 *    per-page table is over the page allocator's largest order), timed,
 *    with a GPU registration timed after it (printed, not judged); the
 *    device reads its first bytes through the mapping;
 *  - the same 1 GiB walk, not slowed, registered by another process, with
 *    a GPU registration timed beside it (printed, not judged; both must
 *    succeed);
 *  - the walk classifies per physical run, not per page: the firmware's
 *    resource map is searched at most twice per run
 *    (pfn/walk_resource_lookups), not once or twice per page;
 *  - the walk does not hold up other registrations: while a child's 1 GiB
 *    walk is made slow on purpose (inject_delay_pfn_walk_ms), a GPU
 *    registration of this process completes, and the walk is still
 *    running when it does (pfn/walks_started - walks_ended). Before the
 *    fix the walk ran in acquire, under the core's global client lock, and
 *    the GPU registration waited for it;
 *  - a fatal signal stops the walk: the child is killed in the middle of
 *    it and the walk read fewer pages than the range has (pfn/walk_pages,
 *    walks_killed);
 *  - the documented limit of the run list (262144 runs, 4 MiB): a range of
 *    262145 pages with no two neighbours physically contiguous
 *    (PFNMAP_SCATTER_OFFSET) fails with ENOMEM and a log line, nothing
 *    held; one of 262144 such pages passes the walk (and is refused by the
 *    access check after it: a writable MR of a read-only mapping, EACCES;
 *    mapping 2 pages 131072 times each would exceed DMA-API debug's
 *    overlap limit).
 *
 * No assertion depends on the machine's speed: the concurrency checks are
 * ordered by the counters, the injected delay only makes the window long.
 */
#include "pfnmap_test.h"
#include <signal.h>
#include <sys/wait.h>

#define RING (1ull << 30)		/* the 1 GiB ring */
#define MAX_RUNS 262144ull		/* docs/module.md, "Limits" */
#define GPU_LEN (256u << 10)

static struct conn c;
static int efd, gfd;
static uint64_t buf_len;		/* the exporter's buffer, repeated into the ring */
static uint32_t chunks;

struct walk_snap {
	long long started, ended, pages, lookups, killed, over;
};

static void wtake(struct walk_snap *s)
{
	s->started = pf("walks_started");
	s->ended = pf("walks_ended");
	s->pages = pf("walk_pages");
	s->lookups = pf("walk_resource_lookups");
	s->killed = pf("walks_killed");
	s->over = pf("walks_over_limit");
}

static uint8_t *map_at(uint64_t off, uint64_t len, int prot)
{
	void *p = mmap(NULL, len, prot, MAP_SHARED, efd, off);

	if (p == MAP_FAILED)
		bail("mmap of the exporter at %#llx, %#llx bytes: %s", (unsigned long long)off,
		     (unsigned long long)len, strerror(errno));
	return p;
}

static int walk_running(void)
{
	return pf("walks_started") - pf("walks_ended") == 1;
}

/* The 1 GiB ring through umem_test, timed, and a GPU registration timed after it. */
static void test_ring(void)
{
	uint64_t magic = 0x5eed0f1a2b3c4d5eull, head = 0;
	struct walk_snap s0, s1;
	struct umem_info u;
	struct ibv_mr *gmr;
	struct gmem g;
	double t0, t1, t2;
	uint8_t *p = map_at(PFNMAP_REPEAT_OFFSET, RING, PROT_READ | PROT_WRITE);
	int f, rc;

	if (exporter_rw(efd, 1, 0, 0, &magic, sizeof(magic)))
		bail("cannot write through the exporter's CPU view");
	if (gmem_alloc(gfd, GPU_LEN, &g))
		bail("gpusim allocation: %s", strerror(errno));
	f = umem_open();
	if (f < 0)
		bail("open %s: %s", UMEM_TEST, strerror(-f));
	wtake(&s0);
	t0 = now_s();
	rc = umem_get(f, RXE_DEV, p, RING, "mr");
	t1 = now_s();
	wtake(&s1);
	gmr = ibv_reg_mr(c.pd, g.p, GPU_LEN, MR_ACCESS);
	t2 = now_s();
	diag("1 GiB PFN ring: registered in %.3f s (walk of %lld pages, %lld resource lookups); a 256 KiB GPU registration after it: %.3f s",
	     t1 - t0, s1.pages - s0.pages, s1.lookups - s0.lookups, t2 - t1);
	memset(&u, 0, sizeof(u));
	if (!rc)
		umem_read(f, &u);
	memcpy(&head, &magic, sizeof(head));
	ok(rc == 0 && !strcmp(u.client, pm_name) && u.dma_bytes == (long long)RING &&
	   (!u.first_ok || u.first == head),
	   "a 1 GiB ring (the %llu MiB buffer %llu times over) registers through %s (%s; %lld DMA bytes in %lld entries, the device read its first bytes: %s)",
	   (unsigned long long)(buf_len >> 20), (unsigned long long)(RING / buf_len), pm_name,
	   rc ? strerror(-rc) : "ok", u.dma_bytes, u.nents,
	   u.first_ok ? (u.first == head ? "right" : "WRONG") : "not read");
	ok(s1.pages - s0.pages == (long long)(RING / 4096),
	   "its walk read each of the ring's %llu pages once (walk_pages %+lld)", RING / 4096,
	   s1.pages - s0.pages);
	ok(s1.lookups - s0.lookups <= 2 * (long long)(RING >> 22),
	   "the firmware's resource map was searched at most twice per physical run, not per page (walk_resource_lookups %+lld; the ring has at most %llu runs)",
	   s1.lookups - s0.lookups, RING >> 22);
	ok(gmr != NULL, "the GPU registration after it works (errno %d)", gmr ? 0 : errno);
	if (gmr)
		ibv_dereg_mr(gmr);
	close(f);
	gmem_free(gfd, &g);
	gmem_drop(&g);
	munmap(p, RING);
	ok(wait_for(all_idle, 10) && wait_for(pf_idle, 10) && pm_balanced(),
	   "1 GiB ring: nothing held afterwards");
}

/*
 * A child maps the ring, says so on ready, waits for go, registers it
 * through umem_test (writing the errno, 0 for success, to ready), lets it
 * go and exits.
 */
static pid_t ring_child(int ready[2], int go[2])
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		uint8_t *p;
		char b;
		int e, f = umem_open();

		if (f < 0)
			_exit(20);
		p = mmap(NULL, RING, PROT_READ | PROT_WRITE, MAP_SHARED, efd, PFNMAP_REPEAT_OFFSET);
		if (p == MAP_FAILED)
			_exit(21);
		if (write(ready[1], "r", 1) != 1 || read(go[0], &b, 1) != 1)
			_exit(22);
		e = -umem_get(f, RXE_DEV, p, RING, "mr");
		if (write(ready[1], &e, sizeof(e)) != sizeof(e))
			_exit(23);
		close(f);
		_exit(0);
	}
	if (pid < 0)
		bail("fork: %s", strerror(errno));
	return pid;
}

/* A ring child and the pipes to it (ring_start, ring_end). */
struct ring_run {
	int ready[2], go[2];
	pid_t pid;
};

/*
 * The set-up the walk cases share: starts a ring child and, once it has
 * mapped the ring, lets it register it. With g, GPU_LEN of GPU memory is
 * allocated first, before the fork (the child inherits that mapping, as it
 * did when each case wrote this out); with delay_ms, peermem's
 * inject_delay_pfn_walk_ms is set to it before the go. The walk counters
 * are taken into s0 just before the go; returns the time of the go.
 */
static double ring_start(struct ring_run *r, struct gmem *g, const char *delay_ms,
			 struct walk_snap *s0)
{
	double t0;
	char b;

	if (pipe(r->ready) || pipe(r->go))
		bail("pipe: %s", strerror(errno));
	if (g && gmem_alloc(gfd, GPU_LEN, g))
		bail("gpusim allocation: %s", strerror(errno));
	r->pid = ring_child(r->ready, r->go);
	if (read(r->ready[0], &b, 1) != 1)
		bail("the ring child failed before registering");
	if (delay_ms && write_str(PMDBG "inject_delay_pfn_walk_ms", delay_ms))
		bail("cannot set inject_delay_pfn_walk_ms");
	wtake(s0);
	t0 = now_s();
	if (write(r->go[1], "g", 1) != 1)
		bail("the ring child is gone");
	return t0;
}

/* Frees what ring_start took (the child is reaped by then): g, the pipes. */
static void ring_end(struct ring_run *r, struct gmem *g)
{
	if (g) {
		gmem_free(gfd, g);
		gmem_drop(g);
	}
	close(r->ready[0]);
	close(r->ready[1]);
	close(r->go[0]);
	close(r->go[1]);
}

/* The ring's walk, slowed down, does not hold up a GPU registration. */
static void test_concurrent(void)
{
	int st = -1, e = -1, running;
	struct walk_snap s0, s1;
	struct ring_run r;
	struct ibv_mr *gmr;
	struct gmem g;
	double t0, t1, t2;

	/*
	 * 64 batches of 16 MiB, 100 ms each: a walk of 6.4 s at least, where
	 * the GPU registration takes 0.05-0.2 s (250 ms and 16 s until
	 * 2026-11-26; the knob is read when a walk starts).
	 */
	t0 = ring_start(&r, &g, "100", &s0);
	running = wait_for(walk_running, 60);
	t1 = now_s();
	gmr = ibv_reg_mr(c.pd, g.p, GPU_LEN, MR_ACCESS);
	t2 = now_s();
	wtake(&s1);
	ok(running && gmr != NULL && s1.ended == s0.ended,
	   "while another process's 1 GiB PFN walk runs (slowed: 100 ms per 16 MiB), a GPU registration completes before the walk ends (walk seen running: %s; GPU MR %s, errno %d; walks ended meanwhile %+lld)",
	   running ? "yes" : "no", gmr ? "ok" : "failed", gmr ? 0 : errno, s1.ended - s0.ended);
	diag("GPU registration %.3f s, started %.3f s into the ring's registration", t2 - t1, t1 - t0);
	if (gmr)
		ibv_dereg_mr(gmr);
	if (read(r.ready[0], &e, sizeof(e)) != sizeof(e))
		e = -1;
	t2 = now_s();
	write_str(PMDBG "inject_delay_pfn_walk_ms", "0");
	waitpid(r.pid, &st, 0);
	ok(e == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "the slowed ring registration itself succeeds, %.1f s after it began (errno %d, child status %#x)",
	   t2 - t0, e, st);
	ring_end(&r, &g);
	ok(wait_for(all_idle, 10) && wait_for(pf_idle, 10) && pm_balanced(),
	   "concurrent: nothing held afterwards");
}

/*
 * The measurement: a GPU registration timed beside a 1 GiB walk
 * that is not slowed (another process registers the ring; this one
 * registers GPU memory as soon as the walk is seen running). Printed, not
 * judged: whether the walk is still running when the GPU registration
 * ends depends on the machine's speed. Before the fix the GPU
 * registration waited for the whole walk (the core's client lock).
 */
static long long beside_ended0;

/* The walk runs, or is over already (a fast machine). */
static int walk_begun(void)
{
	return walk_running() || pf("walks_ended") > beside_ended0;
}

static void test_beside(void)
{
	int st = -1, e = -1, running, still;
	struct walk_snap s0, s1;
	struct ring_run r;
	struct ibv_mr *gmr;
	struct gmem g;
	double t0, t1, t2, t3;

	t0 = ring_start(&r, &g, NULL, &s0);
	/* walk_begun's reference: it is first called after this. */
	beside_ended0 = s0.ended;
	running = wait_for(walk_begun, 60) && walk_running();
	t1 = now_s();
	gmr = ibv_reg_mr(c.pd, g.p, GPU_LEN, MR_ACCESS);
	t2 = now_s();
	still = walk_running();
	wtake(&s1);
	if (read(r.ready[0], &e, sizeof(e)) != sizeof(e))
		e = -1;
	t3 = now_s();
	waitpid(r.pid, &st, 0);
	diag("beside: 1 GiB PFN ring registered in %.3f s by another process; a 256 KiB GPU registration started %.3f s into it took %.3f s (walk running when it began: %s, when it ended: %s; walks ended meanwhile %+lld)",
	     t3 - t0, t1 - t0, t2 - t1, running ? "yes" : "no", still ? "yes" : "no",
	     s1.ended - s0.ended);
	ok(gmr != NULL && e == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "beside: the GPU registration beside a 1 GiB walk and the ring's registration both succeed (GPU errno %d, ring errno %d, child status %#x)",
	   gmr ? 0 : errno, e, st);
	if (gmr)
		ibv_dereg_mr(gmr);
	ring_end(&r, &g);
	ok(wait_for(all_idle, 10) && wait_for(pf_idle, 10) && pm_balanced(),
	   "beside: nothing held afterwards");
}

/* A fatal signal stops the walk. */
static void test_killed(void)
{
	int st = -1, running;
	struct walk_snap s0, s1;
	struct ring_run r;

	ring_start(&r, NULL, "250", &s0);
	running = wait_for(walk_running, 60);
	usleep(600000);	/* a few batches in */
	kill(r.pid, SIGKILL);
	waitpid(r.pid, &st, 0);
	/* The walk's counters were added before its system call returned. */
	wtake(&s1);
	write_str(PMDBG "inject_delay_pfn_walk_ms", "0");
	ok(running && WIFSIGNALED(st) && s1.ended == s0.ended + 1 &&
	   s1.pages - s0.pages < (long long)(RING / 4096) && s1.killed == s0.killed + 1,
	   "a process killed during its 1 GiB walk stops it: the walk read %lld of %llu pages (walks_killed %+lld, walk seen running: %s, status %#x)",
	   s1.pages - s0.pages, RING / 4096, s1.killed - s0.killed, running ? "yes" : "no", st);
	ring_end(&r, NULL);
	ok(wait_for(pf_idle, 10) && wait_for(pm_balanced, 10), "killed: nothing held afterwards");
}

/* The run list's documented limit. */
static void test_limit(void)
{
	struct walk_snap s0, s1;
	uint64_t len = (MAX_RUNS + 1) * 4096;
	struct ibv_mr *mr;
	uint8_t *p = map_at(PFNMAP_SCATTER_OFFSET, len, PROT_READ);
	int e;

	wtake(&s0);
	errno = 0;
	mr = ibv_reg_mr(c.pd, p, len, MR_ACCESS);
	e = errno;
	wtake(&s1);
	ok(!mr && e == ENOMEM && s1.over == s0.over + 1,
	   "a range of %llu pages, no two neighbours physically contiguous (%llu runs, one over the limit): ENOMEM (got %s, errno %d; walks_over_limit %+lld)",
	   MAX_RUNS + 1, MAX_RUNS + 1, mr ? "an MR" : "NULL", e, s1.over - s0.over);
	ok(dmesg_has("peermem: pfnmap: .*262144"), "the log says why, with the limit");
	if (mr)
		ibv_dereg_mr(mr);
	ok(wait_for(pf_idle, 10) && pm_balanced(), "over the limit: nothing held");
	munmap(p, len);

	/* At the limit: the walk takes it; the access check after it refuses. */
	len = MAX_RUNS * 4096;
	p = map_at(PFNMAP_SCATTER_OFFSET, len, PROT_READ);
	wtake(&s0);
	errno = 0;
	mr = ibv_reg_mr(c.pd, p, len, MR_ACCESS);
	e = errno;
	wtake(&s1);
	ok(!mr && e == EACCES && s1.over == s0.over && s1.pages - s0.pages == (long long)MAX_RUNS,
	   "a range of exactly %llu runs passes the walk (%lld pages read, walks_over_limit %+lld) and only the access check after it refuses it (writable MR, read-only mapping: got errno %d, EACCES expected)",
	   MAX_RUNS, s1.pages - s0.pages, s1.over - s0.over, e);
	if (mr)
		ibv_dereg_mr(mr);
	munmap(p, len);
	ok(wait_for(pf_idle, 10) && pm_balanced(), "at the limit: nothing held afterwards");
}

int main(void)
{
	rxe_up();
	load_modules("pfnmap=1");
	exporter_load();
	efd = exporter_open(O_RDWR);
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0)
		bail("open /dev/gpusim: %s", strerror(errno));
	if (conn_open(&c))
		bail("cannot open rxe0");
	for (buf_len = RING; buf_len >= (256ull << 20); buf_len >>= 1)
		if (exporter_alloc(efd, buf_len, PFNMAP_RESERVED, &chunks) == 0)
			break;
	if (buf_len < (256ull << 20))
		bail("the exporter could not reserve 256 MiB");
	ok(1, "exporter: %llu MiB of reserved RAM in %u physically contiguous pieces (the largest of 1 GiB, 512 MiB, 256 MiB this guest had)",
	   (unsigned long long)(buf_len >> 20), chunks);

	test_ring();
	test_beside();
	test_concurrent();
	test_killed();
	test_limit();

	conn_close(&c);
	ioctl(efd, PFNMAP_IOC_FREE);
	close(efd);
	close(gfd);
	ok(wait_for(all_idle, 10) && pf_idle(), "peermem (every client and the pfn source) and gpusim idle at the end");
	ok(run("rmmod peermem") == 0 && run("rmmod pfnmap_exporter") == 0, "rmmod peermem and the exporter");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
