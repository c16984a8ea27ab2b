// SPDX-License-Identifier: GPL-2.0
/*
 * t_peermem_pfnmap - peermem's PFN-map source (docs/module.md, "PFN-mapped
 * memory") on the rig's exporter, a stand-in for a data-acquisition driver
 * that maps reserved RAM to user space with remap_pfn_range:
 *
 *  - ibv_reg_mr on the mapping fails without pfnmap=1 (pin_user_pages
 *    refuses VM_PFNMAP) and succeeds with it, coalesced into at most one
 *    scatter entry per physically contiguous 4 MiB piece;
 *  - RDMA WRITE and READ through the MR, every byte checked through the
 *    exporter's own CPU view (not through the user mapping);
 *  - the exporter zapping its mappings (unmap_mapping_range), reallocating
 *    its buffer, munmap, mprotect and process exit revoke the MR *before* the call
 *    that changed the mapping returns (the counters have moved when it
 *    returns, no waiting), the next RDMA completes in error and no byte
 *    of the old or the new memory is written;
 *  - a writable MR on a read-only mapping is refused (EACCES), a
 *    read-only one works; a copy-on-write (private, writable) mapping,
 *    ordinary kernel pages (not reserved) and device memory that is no
 *    PCI BAR (the legacy VGA window) are refused (PCI BARs: t_peermem_p2p);
 *  - clear_refs (the soft-dirty reset invalidates the whole address space)
 *    and PAGEMAP_SCAN's write-protect request (a protection-change
 *    invalidation of the range, which then skips VM_PFNMAP) change nothing
 *    a PFN mapping maps: no revocation, no event;
 *  - each revocation is reported on /dev/peermem (revocation events) with
 *    its range and cause: driver (zap, realloc), unmap, protect; the
 *    child's at its exit goes to no one;
 *  - munmap's revocation completes while the kernel cannot start a
 *    worker thread (no free PID, every worker of the unbound pool busy):
 *    the notifier waits for peermem's work item, which the work queue's
 *    rescuer runs (WQ_MEM_RECLAIM); without one, munmap would wait for the
 *    first free PID;
 *  - the source's counters move and come back to zero, the core's
 *    balance, nothing leaks.
 */
#include "pfnmap_test.h"
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "../../../include/uapi/peermem.h"

#define LEN (8u << 20)		/* two 4 MiB pieces of the exporter */
/*
 * The READs: 2 MiB across the two pieces' boundary. The 8 MiB WRITE
 * reaches every page of the MR; a READ of all 8 MiB cost 15 s of the rig
 * each (CI's time, issue 27) and proves no page the WRITE did not.
 */
#define RD_OFF (3u << 20)
#define RD_LEN (2u << 20)

static struct conn c;
static struct ibv_mr *lmr;	/* the local (host memory) side of every RDMA */
static uint8_t *h, *cpu, *cpu2;
static int efd;
static int evfd = -1;	/* /dev/peermem, non-blocking */

/*
 * PFNMAP_CASES=name,name,...: run only these cases (the set-up always
 * runs; names as in main()); unset: all of them.
 */
static int want(const char *name)
{
	const char *l = getenv("PFNMAP_CASES");
	size_t n = strlen(name);

	if (!l || !*l)
		return 1;
	for (const char *q = l; (q = strstr(q, name)); q += n)
		if ((q == l || q[-1] == ',') && (q[n] == ',' || !q[n]))
			return 1;
	return 0;
}

/* RDMA op between h + hoff and the remote MR at raddr; recreates the QPs after an error. */
static int rdma(enum ibv_wr_opcode op, uint64_t hoff, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return rdma_op_renew(&c, op, lmr, h + hoff, len, raddr, rkey);
}

/*
 * The events /dev/peermem queued since the last call: exactly one, for
 * [p, p + len) with cause `cause` (0: none at all).
 */
static int event_is(const char *what, const void *p, uint64_t len, unsigned int cause)
{
	struct peermem_event ev[4];
	ssize_t n = read(evfd, ev, sizeof(ev));
	int got = n < 0 ? 0 : (int)(n / sizeof(ev[0]));

	if (n < 0 && errno != EAGAIN) {
		diag("%s: read /dev/peermem: %s", what, strerror(errno));
		return 0;
	}
	for (int i = 0; i < got; i++)
		diag("%s: event generation %llu start %#llx length %#llx cause %u client %s", what,
		     (unsigned long long)ev[i].generation, (unsigned long long)ev[i].start,
		     (unsigned long long)ev[i].length, ev[i].cause, ev[i].client);
	if (!cause)
		return got == 0;
	return got == 1 && ev[0].start == (uintptr_t)p && ev[0].length == len && ev[0].cause == cause &&
	       !strcmp(ev[0].client, "nv_mem");
}

/* The exporter's current buffer, bytes [off, off + len), equals p. */
static int cpu_view_is(int old, uint64_t off, const void *p, uint64_t len)
{
	uint8_t *b = old ? cpu2 : cpu;

	if (exporter_rw(efd, 0, old, off, b, len))
		return 0;
	return !memcmp(b, p, len);
}

struct snap {
	long long acq, decl, inv, chg, maps, unmaps;
	struct peer_stats ps;
};

static void take(struct snap *s)
{
	s->acq = pf("registrations_acquired");
	s->decl = pf("registrations_declined");
	s->inv = pf("invalidations_mmu_notifier");
	s->chg = pf("address_changes");
	s->maps = pf("dma_maps");
	s->unmaps = pf("dma_unmaps");
	if (peer_stats(pm_name, &s->ps))
		bail("cannot read the core's counters of %s", pm_name);
}

/*
 * A revocation is complete when the call that changed the mapping
 * returned: the notifier waited for it. Checked without any waiting.
 */
static int revoked_now(const struct snap *s0, const char *what)
{
	struct snap s1;

	take(&s1);
	if (s1.inv == s0->inv + 1 && s1.chg == s0->chg + 1 && s1.unmaps == s0->unmaps + 1 &&
	    s1.ps.invalidated_mrs == s0->ps.invalidated_mrs + 1 && pmc_live_maps(PMDBG_PFN) == 0 &&
	    pmc_live_pins(PMDBG_PFN) == 0)
		return 1;
	diag("%s: invalidations_mmu_notifier %+lld address_changes %+lld dma_unmaps %+lld core invalidated %+lld, live maps %lld pins %lld",
	     what, s1.inv - s0->inv, s1.chg - s0->chg, s1.unmaps - s0->unmaps,
	     s1.ps.invalidated_mrs - s0->ps.invalidated_mrs, pmc_live_maps(PMDBG_PFN),
	     pmc_live_pins(PMDBG_PFN));
	return 0;
}

static uint8_t *map_rw(void)
{
	uint8_t *p = exporter_map(efd, LEN, PROT_READ | PROT_WRITE, MAP_SHARED);

	if (!p)
		bail("mmap of the exporter: %s", strerror(errno));
	return p;
}

/* Register [p, p + len) or bail out. */
static struct ibv_mr *reg(void *p, size_t len, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(c.pd, p, len, access);

	if (!mr)
		bail("ibv_reg_mr on the PFN mapping: %s", strerror(errno));
	return mr;
}

/*
 * The set-up of the cases that change a registered mapping: the exporter's
 * buffer written with the pattern of seed through its CPU view (cpu2 keeps
 * the pattern: what cpu_view_is compares the buffer with afterwards, to see
 * that nothing was written), mapped read-write at *p and registered.
 */
static struct ibv_mr *filled_mr(uint32_t seed, uint8_t **p)
{
	fill(cpu2, LEN, seed);
	if (exporter_rw(efd, 1, 0, 0, cpu2, LEN))
		bail("cannot write through the exporter's CPU view");
	*p = map_rw();
	return reg(*p, LEN, MR_ACCESS);
}

/*
 * The end of the cases that must change nothing a PFN mapping maps: no
 * event, the MR still works (a page written at p + 4096 with the pattern
 * of seed lands in the exporter's buffer and nowhere else), then it is
 * deregistered and unmapped. what names the case in the diagnostics, name
 * in the TAP lines.
 */
static void unchanged_end(const char *what, const char *name, uint8_t *p, struct ibv_mr *mr,
			  uint32_t seed)
{
	int rc;

	ok(event_is(what, NULL, 0, 0), "%s: nothing reported on /dev/peermem", name);
	fill(h, 4096, seed);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p + 4096, mr->rkey);
	memcpy(cpu2 + 4096, h, 4096);
	ok(rc == 0 && cpu_view_is(0, 0, cpu2, LEN),
	   "%s: the MR still works: RDMA WRITE lands in the exporter's buffer (status %d)", name, rc);
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "%s: ibv_dereg_mr; pfn counters idle, the core's balance", name);
	munmap(p, LEN);
}

static void test_without_option(void)
{
	uint32_t chunks = 0;
	struct ibv_mr *mr;
	uint8_t *p;
	int e, rc;

	load_modules(NULL);
	ok(!pm_param_on("pfnmap"), "peermem loaded with its defaults: pfnmap is off");
	rc = exporter_alloc(efd, LEN, PFNMAP_RESERVED, &chunks);
	ok(rc == 0 && chunks == 2,
	   "exporter: 8 MiB of reserved RAM in %u physically contiguous pieces", chunks);
	p = map_rw();
	errno = 0;
	mr = ibv_reg_mr(c.pd, p, LEN, MR_ACCESS);
	e = errno;
	ok(!mr && e == EFAULT && pf("registrations_acquired") == 0,
	   "without pfnmap: ibv_reg_mr on the PFN mapping fails with EFAULT, as without peermem (got %s, errno %d; pfn acquired %lld)",
	   mr ? "an MR" : "NULL", e, pf("registrations_acquired"));
	if (mr)
		ibv_dereg_mr(mr);
	munmap(p, LEN);
}

static void test_write_read(void)
{
	struct snap s0, s1;
	struct ibv_mr *mr;
	uint8_t *p;
	int rc;

	load_modules("pfnmap=1");
	ok(pm_param_on("pfnmap"), "peermem reloaded with pfnmap=1");
	if (conn_open(&c))
		bail("cannot open rxe0 after the reload");
	lmr = ibv_reg_mr(c.pd, h, LEN, MR_ACCESS);
	if (!lmr)
		bail("ibv_reg_mr on host memory: %s", strerror(errno));
	if (!want("write_read"))
		return;
	p = map_rw();
	take(&s0);
	mr = ibv_reg_mr(c.pd, p, LEN, MR_ACCESS);
	take(&s1);
	ok(mr != NULL && s1.acq == s0.acq + 1 && s1.maps == s0.maps + 1 &&
	   s1.ps.alloc_mrs == s0.ps.alloc_mrs + 1,
	   "with pfnmap: ibv_reg_mr on the 8 MiB PFN mapping succeeds through %s (errno %d; pfn acquired %+lld dma_maps %+lld)",
	   pm_name, mr ? 0 : errno, s1.acq - s0.acq, s1.maps - s0.maps);
	if (!mr)
		bail("no MR; the rest would mean nothing");
	ok(pf("sg_entries_uncoalesced") == LEN / 4096 && pf("sg_entries_coalesced") >= 1 &&
	   pf("sg_entries_coalesced") <= 2 && pf("pages_pinned") == LEN / 4096 &&
	   pf("bytes_pinned") == LEN,
	   "2048 pages coalesced into %lld scatter entries (at most one per contiguous piece; rxe_dma's max segment is 2 GiB)",
	   pf("sg_entries_coalesced"));

	fill(h, LEN, 0x1111);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, LEN, (uintptr_t)p, mr->rkey);
	ok(rc == 0 && cpu_view_is(0, 0, h, LEN),
	   "RDMA WRITE of 8 MiB into the PFN MR: status %d, every byte in the exporter's buffer", rc);
	fill(cpu2, LEN, 0x2222);
	if (exporter_rw(efd, 1, 0, 0, cpu2, LEN))
		bail("cannot write through the exporter's CPU view");
	memset(h, 0, LEN);
	rc = rdma(IBV_WR_RDMA_READ, RD_OFF, RD_LEN, (uintptr_t)p + RD_OFF, mr->rkey);
	ok(rc == 0 && !memcmp(h + RD_OFF, cpu2 + RD_OFF, RD_LEN),
	   "RDMA READ of 2 MiB across the two pieces from the PFN MR: status %d, every byte is what the exporter wrote", rc);
	/* An unaligned piece across the two physical pieces. */
	fill(h, 100000, 0x3333);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 100000, (uintptr_t)p + (4u << 20) - 50001, mr->rkey);
	fill(cpu2, LEN, 0x2222);
	memcpy(cpu2 + (4u << 20) - 50001, h, 100000);
	ok(rc == 0 && cpu_view_is(0, 0, cpu2, LEN),
	   "RDMA WRITE of 100000 bytes at an odd offset across the 4 MiB boundary lands there and nowhere else (status %d)", rc);
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "ibv_dereg_mr; the pfn counters are back to zero live, the core's balance");
	if (!pf_idle())
		pmc_diag("pfn", PMDBG_PFN);
	munmap(p, LEN);
}

/* The exporter zaps (unmap_mapping_range) or reallocates: the MR is revoked first. */
static void test_driver_change(int realloc)
{
	const char *what = realloc ? "realloc" : "zap";
	struct snap s0;
	struct ibv_mr *mr;
	uint8_t *p;
	int rc;

	mr = filled_mr(0x4444, &p);
	fill(h, 4096, 0x4545);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p + 8192, mr->rkey);
	memcpy(cpu2 + 8192, h, 4096);
	ok(rc == 0 && cpu_view_is(0, 0, cpu2, LEN), "%s: the MR works before (status %d)", what, rc);
	take(&s0);
	if (ioctl(efd, realloc ? PFNMAP_IOC_REALLOC : PFNMAP_IOC_ZAP))
		bail("%s ioctl: %s", what, strerror(errno));
	ok(revoked_now(&s0, what),
	   "%s: when the exporter's unmap_mapping_range returned, the MR was revoked (pfn invalidations_mmu_notifier +1, address_changes +1, dma_unmaps +1, core num_invalidated_mrs +1)",
	   what);
	ok(event_is(what, p, LEN, PEERMEM_CAUSE_DRIVER),
	   "%s: /dev/peermem reported the MR's range revoked, cause driver (%d)", what, PEERMEM_CAUSE_DRIVER);
	fill(h, LEN, 0x4646);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, LEN, (uintptr_t)p, mr->rkey);
	ok(rc == IBV_WC_REM_ACCESS_ERR, "%s: RDMA WRITE to the revoked MR completes with status 10, remote access error (got %d, %s)",
	   what, rc, wc_str(rc));
	if (realloc) {
		memset(cpu2, 0x5a, LEN);
		ok(cpu_view_is(0, 0, cpu2, LEN),
		   "realloc: no byte of the exporter's new buffer was written");
		fill(cpu2, LEN, 0x4444);
		fill(h, 4096, 0x4545);
		memcpy(cpu2 + 8192, h, 4096);
		ok(cpu_view_is(1, 0, cpu2, LEN),
		   "realloc: no byte of the retired buffer was written after the zap");
	} else {
		fill(h, 4096, 0x4545);
		memcpy(cpu2 + 8192, h, 4096);
		ok(cpu_view_is(0, 0, cpu2, LEN), "zap: no byte of the buffer was written after the zap");
	}
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "%s: ibv_dereg_mr of the revoked MR; pfn counters idle, the core's balance", what);
	if (!pf_idle())
		pmc_diag("pfn", PMDBG_PFN);
	munmap(p, LEN);
}

/*
 * The blocking revocation when no worker thread can be made. munmap's
 * notifier call waits for peermem's work item, holding the mmap lock; the
 * work queue's rescuer must run it when the pool has no idle worker and
 * cannot start one (memory pressure on a real machine; here: no free PID,
 * pid_max at its minimum and its one free PID taken, and every worker of
 * the default unbound pool held by the exporter's hogs). A watchdog thread
 * gives the PIDs back after 20 s (times the slowdown) whatever happens, so
 * a queue without a rescuer shows as a munmap that returned only then.
 */
static volatile int wd_done, wd_fired;
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static char pid_max_old[32];

static int pid_max_set(const char *v)
{
	int fd = open("/proc/sys/kernel/pid_max", O_WRONLY);
	int ok_ = fd >= 0 && write(fd, v, strlen(v)) == (ssize_t)strlen(v);

	if (fd >= 0)
		close(fd);
	return ok_;
}

static void *watchdog(void *arg)
{
	struct timespec end;
	int fired = 0;

	(void)arg;
	clock_gettime(CLOCK_REALTIME, &end);
	end.tv_sec += (time_t)slow_s(20);
	pthread_mutex_lock(&wd_lock);
	while (!wd_done && !fired)
		fired = pthread_cond_timedwait(&wd_cond, &wd_lock, &end) == ETIMEDOUT;
	pthread_mutex_unlock(&wd_lock);
	if (fired) {
		wd_fired = 1;
		pid_max_set(pid_max_old);
	}
	return NULL;
}

/* Threads that hold PIDs (a thread takes one, as a process does) until released. */
#define FILLERS_MAX 1024
static pthread_t fillers[FILLERS_MAX];
static int fill_done;

static void *filler(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&wd_lock);
	while (!fill_done)
		pthread_cond_wait(&wd_cond, &wd_lock);
	pthread_mutex_unlock(&wd_lock);
	return NULL;
}

static int hog(uint32_t add, uint32_t release, struct pfnmap_hog *out)
{
	struct pfnmap_hog hg = { .add = add, .release = release };

	if (ioctl(efd, PFNMAP_IOC_HOG, &hg))
		return -errno;
	if (out)
		*out = hg;
	return 0;
}

/* Every queued hog sleeps in a worker within about secs; *hg: the last state. */
static int hogs_running(double secs, struct pfnmap_hog *hg)
{
	double end = now_s() + secs;

	do {
		if (hog(0, 0, hg))
			return 0;
		if (hg->running == hg->queued)
			return 1;
		usleep(20000);
	} while (now_s() < end);
	return 0;
}

static void test_rescuer(void)
{
	int nkids = 0, pool_full = 0, fd, rc;
	pthread_attr_t small;
	struct pfnmap_hog hg = { 0 };
	pthread_t wd;
	double t0, took;
	struct snap s0;
	struct ibv_mr *mr;
	uint8_t *p;
	ssize_t n;

	fd = open("/proc/sys/kernel/pid_max", O_RDONLY);
	n = fd < 0 ? -1 : read(fd, pid_max_old, sizeof(pid_max_old) - 1);
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		bail("cannot read /proc/sys/kernel/pid_max: %s", strerror(errno));
	pid_max_old[n] = 0;
	mr = filled_mr(0x7171, &p);
	/* Workers in the pool for four hogs, while PIDs are still free. */
	rc = hog(4, 0, NULL);
	if (rc || !hogs_running(slow_s(10), &hg))
		bail("the exporter's hogs did not start (%s; %u of %u running)", strerror(-rc),
		     hg.running, hg.queued);
	if (pthread_create(&wd, NULL, watchdog, NULL))
		bail("pthread_create");
	/* No free PID: pid_max at its minimum (301), every PID below it taken. */
	if (!pid_max_set("301"))
		bail("cannot write /proc/sys/kernel/pid_max: %s", strerror(errno));
	pthread_attr_init(&small);
	pthread_attr_setstacksize(&small, 64 << 10);
	while (nkids < FILLERS_MAX && !pthread_create(&fillers[nkids], &small, filler, NULL))
		nkids++;
	pthread_attr_destroy(&small);
	/* One more hog at a time until one waits: no idle worker, none can be made. */
	for (int i = 0; i < 64 && !pool_full; i++) {
		if (hog(1, 0, NULL))
			break;
		pool_full = !hogs_running(slow_s(1), &hg);
	}
	diag("rescuer: %d sleeping threads took the free PIDs; hogs %u queued, %u running", nkids,
	     hg.queued, hg.running);
	take(&s0);
	t0 = now_s();
	rc = munmap(p, LEN);
	took = now_s() - t0;
	ok(pool_full && !wd_fired && rc == 0 && revoked_now(&s0, "rescuer"),
	   "munmap with no worker to be had (no free PID, the unbound pool's workers all busy): the revocation completed through the work queue's rescuer, %.1f s, before the PIDs came back (pool full %d, watchdog %d)",
	   took, pool_full, wd_fired);
	pid_max_set(pid_max_old);
	pthread_mutex_lock(&wd_lock);
	wd_done = fill_done = 1;
	pthread_cond_broadcast(&wd_cond);
	pthread_mutex_unlock(&wd_lock);
	pthread_join(wd, NULL);
	for (int i = 0; i < nkids; i++)
		pthread_join(fillers[i], NULL);
	rc = hog(0, 1, &hg);
	ok(rc == 0 && hg.queued == 0 && hg.running == 0,
	   "rescuer: PIDs back, every hog released (%s)", strerror(-rc));
	ok(event_is("rescuer", p, LEN, PEERMEM_CAUSE_UNMAP) && ibv_dereg_mr(mr) == 0 && pf_idle() &&
	   pm_balanced(),
	   "rescuer: reported as unmap; ibv_dereg_mr; pfn counters idle, the core's balance");
}

static void test_munmap(void)
{
	struct snap s0;
	struct ibv_mr *mr;
	uint8_t *p;
	int rc;

	mr = filled_mr(0x6666, &p);
	take(&s0);
	ok(munmap(p, LEN) == 0 && revoked_now(&s0, "munmap"),
	   "munmap: when munmap returned, the MR was revoked (pfn invalidations_mmu_notifier +1, address_changes +1, core num_invalidated_mrs +1)");
	ok(event_is("munmap", p, LEN, PEERMEM_CAUSE_UNMAP),
	   "munmap: /dev/peermem reported the MR's range revoked, cause unmap (%d)", PEERMEM_CAUSE_UNMAP);
	fill(h, LEN, 0x6767);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, LEN, (uintptr_t)p, mr->rkey);
	ok(rc == IBV_WC_REM_ACCESS_ERR && cpu_view_is(0, 0, cpu2, LEN),
	   "munmap: RDMA WRITE to the revoked MR completes with status 10 and writes nothing (got %d, %s)",
	   rc, wc_str(rc));
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "munmap: ibv_dereg_mr; pfn counters idle, the core's balance");
}

/* mprotect invalidates the range too: the MR is revoked (even for a read-only MR). */
static void test_mprotect(void)
{
	struct snap s0;
	struct ibv_mr *mr;
	uint8_t *p;
	int rc;

	p = map_rw();
	mr = reg(p, LEN, IBV_ACCESS_REMOTE_READ);
	take(&s0);
	ok(mprotect(p, LEN, PROT_READ) == 0 && revoked_now(&s0, "mprotect"),
	   "mprotect: when mprotect(PROT_READ) returned, the (read-only) MR was revoked");
	ok(event_is("mprotect", p, LEN, PEERMEM_CAUSE_PROTECT),
	   "mprotect: /dev/peermem reported the MR's range revoked, cause protect (%d)", PEERMEM_CAUSE_PROTECT);
	rc = rdma(IBV_WR_RDMA_READ, 0, 4096, (uintptr_t)p, mr->rkey);
	ok(rc == IBV_WC_REM_ACCESS_ERR, "mprotect: RDMA READ from the revoked MR completes with status 10 (got %d, %s)",
	   rc, wc_str(rc));
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "mprotect: ibv_dereg_mr; pfn counters idle, the core's balance");
	munmap(p, LEN);
}

/*
 * What changes nothing a PFN mapping maps does not revoke (issue 21,
 * finding 8): /proc/self/clear_refs, every kind, among them the soft-dirty
 * reset (4), which invalidates the whole address space with
 * MMU_NOTIFY_SOFT_DIRTY but skips VM_PFNMAP mappings, their entries and
 * protections untouched (before the fix: revoked and reported as cause
 * driver). The MR stays, works, and nothing is reported.
 */
static void test_clear_refs(void)
{
	static const char *const kinds[] = { "1", "2", "3", "4", "5" };
	struct snap s0, s1;
	struct ibv_mr *mr;
	unsigned int i, written = 0;
	uint8_t *p;

	mr = filled_mr(0x6868, &p);
	take(&s0);
	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		written += write_str("/proc/self/clear_refs", kinds[i]) == 0;
	take(&s1);
	ok(written == 5 && s1.inv == s0.inv && s1.chg == s0.chg &&
	   s1.ps.invalidated_mrs == s0.ps.invalidated_mrs,
	   "clear_refs 1-5 (4: the soft-dirty reset, an invalidation of the whole address space) do not revoke the PFN MR (%u of 5 written; invalidations_mmu_notifier %+lld, address_changes %+lld, core invalidated %+lld)",
	   written, s1.inv - s0.inv, s1.chg - s0.chg,
	   s1.ps.invalidated_mrs - s0.ps.invalidated_mrs);
	unchanged_end("clear_refs", "clear_refs", p, mr, 0x6969);
}

/*
 * PAGEMAP_SCAN (linux/fs.h from 6.7 on; the host's headers may be older).
 * With PM_SCAN_WP_MATCHING the kernel sends MMU_NOTIFY_PROTECTION_VMA over
 * the whole range asked for, then skips every mapping without userfaultfd
 * write-protection, VM_PFNMAP ones among them: the protection of a PFN
 * mapping never changes (issue 21, the audit after finding 8).
 */
struct t_pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define T_PAGEMAP_SCAN _IOWR('f', 16, struct t_pm_scan_arg)
#define T_PM_SCAN_WP_MATCHING 1ull

static void test_pagemap_scan(void)
{
	struct t_pm_scan_arg a;
	struct snap s0, s1;
	struct ibv_mr *mr;
	uint8_t *p;
	long r;
	int pm, e;

	mr = filled_mr(0x6a6a, &p);
	pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pm < 0)
		bail("open /proc/self/pagemap: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.flags = T_PM_SCAN_WP_MATCHING;
	a.start = (uintptr_t)p;
	a.end = (uintptr_t)p + LEN;
	take(&s0);
	r = ioctl(pm, T_PAGEMAP_SCAN, &a);
	e = errno;
	take(&s1);
	close(pm);
	ok(r >= 0 && s1.inv == s0.inv && s1.chg == s0.chg &&
	   s1.ps.invalidated_mrs == s0.ps.invalidated_mrs,
	   "PAGEMAP_SCAN with PM_SCAN_WP_MATCHING over the range (a write-protect request it skips for VM_PFNMAP) does not revoke the PFN MR (ioctl %ld, %s; invalidations_mmu_notifier %+lld, address_changes %+lld, core invalidated %+lld)",
	   r, r < 0 ? strerror(e) : "ok", s1.inv - s0.inv, s1.chg - s0.chg,
	   s1.ps.invalidated_mrs - s0.ps.invalidated_mrs);
	unchanged_end("pagemap_scan", "PAGEMAP_SCAN", p, mr, 0x6b6b);
}

/* A child registers the PFN mapping and exits holding the MR. */
static void test_exit(void)
{
	struct snap s0, s1;
	pid_t pid;
	int st = -1;

	take(&s0);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct conn cc;
		struct ibv_mr *mr;
		uint8_t *p;

		if (conn_open(&cc))
			_exit(20);
		p = exporter_map(efd, LEN, PROT_READ | PROT_WRITE, MAP_SHARED);
		if (!p)
			_exit(21);
		mr = ibv_reg_mr(cc.pd, p, LEN, MR_ACCESS);
		if (!mr)
			_exit(22);
		if (rdma_op(&cc, IBV_WR_RDMA_READ, mr, p, 4096, (uintptr_t)p + 8192, mr->rkey))
			_exit(23);
		_exit(0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		bail("fork/waitpid: %s", strerror(errno));
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "exit: a child registered the PFN mapping, used it, and exited holding the MR (status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	ok(wait_for(pf_idle, 10) && wait_for(pm_balanced, 10), "exit: the child's MR is gone, pfn counters idle, the core's balance");
	take(&s1);
	ok(s1.inv == s0.inv + 1 && s1.ps.invalidated_mrs == s0.ps.invalidated_mrs + 1,
	   "exit: the MR was revoked by the address watch at the address space's teardown, before uverbs released it (pfn invalidations_mmu_notifier %+lld, core num_invalidated_mrs %+lld)",
	   s1.inv - s0.inv, s1.ps.invalidated_mrs - s0.ps.invalidated_mrs);
}

/*
 * Once a PFN MR's blocking watch fired (the range was revoked), the watch
 * must not stand in the way of a call that may not block (issue 21,
 * finding 5): the process maps anonymous memory over the revoked range,
 * is killed, and process_mrelease() (the OOM reaper's code,
 * __oom_reap_task_mm, with its non-blockable mmu notifier call) must reap
 * it, not fail with EAGAIN. The child stays alive meanwhile in a second
 * registration, held in get_pages by peermem's inject_delay_get_pages_ms
 * (an uninterruptible sleep, so the killed child's address space outlives
 * the call).
 */
static void test_reap(void)
{
	int ready[2], go[2], st = -1, r, pidfd;
	char b = 0;
	pid_t pid;

	if (pipe(ready) || pipe(go))
		bail("pipe: %s", strerror(errno));
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct conn cc;
		struct ibv_mr *mr;
		uint8_t *p, *q, *p2;

		if (conn_open(&cc))
			_exit(20);
		p = exporter_map(efd, LEN, PROT_READ | PROT_WRITE, MAP_SHARED);
		p2 = exporter_map(efd, LEN, PROT_READ, MAP_SHARED);
		if (!p || !p2)
			_exit(21);
		mr = ibv_reg_mr(cc.pd, p, LEN, MR_ACCESS);
		if (!mr)
			_exit(22);
		/* Revokes the MR (the watch fires), keeps its range watched. */
		q = mmap(p, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (q != p)
			_exit(23);
		memset(q, 0x5a, LEN);
		if (write(ready[1], "r", 1) != 1 || read(go[0], &b, 1) != 1)
			_exit(24);
		if (write(ready[1], "w", 1) != 1)
			_exit(25);
		/* Held in get_pages until killed; never returns. */
		ibv_reg_mr(cc.pd, p2, LEN, IBV_ACCESS_REMOTE_READ);
		_exit(26);
	}
	if (pid < 0)
		bail("fork: %s", strerror(errno));
	pidfd = syscall(SYS_pidfd_open, pid, 0);
	ok(read(ready[0], &b, 1) == 1 && b == 'r',
	   "reap: a child registered a PFN mapping and mapped anonymous memory over it (the MR is revoked)");
	if (write_str(PMDBG "inject_delay_get_pages_ms", "3000"))
		bail("cannot set peermem's inject_delay_get_pages_ms");
	if (write(go[1], "g", 1) != 1 || read(ready[0], &b, 1) != 1)
		bail("reap: the child is gone");
	usleep(500000);	/* the child is in get_pages' delay */
	kill(pid, SIGKILL);
	errno = 0;
	r = pidfd < 0 ? -1 : (int)syscall(SYS_process_mrelease, pidfd, 0);
	r = r ? errno : 0;
	write_str(PMDBG "inject_delay_get_pages_ms", "0");
	ok(r == 0,
	   "reap: process_mrelease of the killed child (a non-blockable mmu notifier call over the revoked range) reaps it (%s; EAGAIN: the fired watch refused)",
	   r ? strerror(r) : "0");
	waitpid(pid, &st, 0);
	ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "reap: the child was killed (status %#x)", st);
	if (pidfd >= 0)
		close(pidfd);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
	ok(wait_for(pf_idle, 10) && wait_for(pm_balanced, 10),
	   "reap: the child's MRs are gone, pfn counters idle, the core's balance");
	if (!pf_idle())
		pmc_diag("pfn", PMDBG_PFN);
}

/*
 * The core's get_pages `force` is "the umem is read-only" (OFED and the
 * rig's core pass !writable; include/peer_mem_abi.h): a read-only PFN
 * mapping registers without write access and is mapped so the device
 * only reads, and a registration asking for write access is refused. A
 * client that took force as "write access is needed" fails both.
 */
static void test_read_only(void)
{
	struct ibv_mr *mr;
	uint8_t *p;
	int rfd, e, rc;

	fill(cpu2, LEN, 0x7777);
	if (exporter_rw(efd, 1, 0, 0, cpu2, LEN))
		bail("cannot write through the exporter's CPU view");
	rfd = exporter_open(O_RDONLY);
	p = exporter_map(rfd, LEN, PROT_READ, MAP_SHARED);
	if (!p)
		bail("read-only mmap: %s", strerror(errno));
	errno = 0;
	mr = ibv_reg_mr(c.pd, p, LEN, MR_ACCESS);
	e = errno;
	ok(!mr && e == EACCES,
	   "read-only mapping: a writable MR (LOCAL_WRITE|REMOTE_WRITE) is refused with EACCES (got %s, errno %d)",
	   mr ? "an MR" : "NULL", e);
	if (mr)
		ibv_dereg_mr(mr);
	mr = ibv_reg_mr(c.pd, p, LEN, IBV_ACCESS_REMOTE_READ);
	ok(mr != NULL, "read-only mapping: a REMOTE_READ-only MR is accepted (errno %d)", mr ? 0 : errno);
	if (mr) {
		memset(h, 0, LEN);
		rc = rdma(IBV_WR_RDMA_READ, RD_OFF, RD_LEN, (uintptr_t)p + RD_OFF, mr->rkey);
		ok(rc == 0 && !memcmp(h + RD_OFF, cpu2 + RD_OFF, RD_LEN),
		   "read-only mapping: RDMA READ of 2 MiB across the two pieces, every byte right (status %d)", rc);
		fill(h, 4096, 0x7878);
		rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p, mr->rkey);
		ok(rc == IBV_WC_REM_ACCESS_ERR && cpu_view_is(0, 0, cpu2, LEN),
		   "read-only mapping: RDMA WRITE to it completes with status 10 and writes nothing (got %d, %s)",
		   rc, wc_str(rc));
		ok(ibv_dereg_mr(mr) == 0, "read-only mapping: ibv_dereg_mr");
	}
	munmap(p, LEN);
	close(rfd);
	ok(wait_for(pf_idle, 5) && pm_balanced(), "read-only mapping: pfn counters idle, the core's balance");
}

/* Mappings that are not the source's: refused, nothing held. */
/*
 * ibv_reg_mr of [p, p + len) must be declined by the PFN source ("not
 * mine": EFAULT, pfn registrations_declined +1); `what` names the case.
 */
static void declined(const char *what, void *p, size_t len, int access)
{
	long long d0 = pf("registrations_declined");
	struct ibv_mr *mr;
	int e;

	errno = 0;
	mr = ibv_reg_mr(c.pd, p, len, access);
	e = errno;
	ok(!mr && e == EFAULT && pf("registrations_declined") == d0 + 1,
	   "%s: refused with EFAULT, pfn registrations_declined +1 (got %s, errno %d)",
	   what, mr ? "an MR" : "NULL", e);
	if (mr)
		ibv_dereg_mr(mr);
}

/*
 * Device memory that is no PCI BAR, mapped as a driver maps its BAR (the
 * exporter's physical window, io_remap_pfn_range): not RAM, refused ("not
 * mine", EFAULT). PCI BARs: t_peermem_p2p.
 */
static void test_window(const char *what, uint64_t phys, uint64_t len)
{
	struct pfnmap_window w = { .phys = phys, .len = len };
	char desc[300];
	uint8_t *p;

	if (ioctl(efd, PFNMAP_IOC_WINDOW, &w))
		bail("PFNMAP_IOC_WINDOW %#llx+%#llx: %s", (unsigned long long)phys,
		     (unsigned long long)len, strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, efd, PFNMAP_WINDOW_OFFSET);
	if (p == MAP_FAILED)
		bail("mmap of the window %#llx+%#llx: %s", (unsigned long long)phys,
		     (unsigned long long)len, strerror(errno));
	snprintf(desc, sizeof(desc), "%s (%#llx+%#llx, VM_PFNMAP)", what,
		 (unsigned long long)phys, (unsigned long long)len);
	declined(desc, p, len, IBV_ACCESS_REMOTE_READ);
	munmap(p, len);
}

static void test_refused(void)
{
	uint8_t *p;

	/*
	 * remap_pfn_range maps a copy-on-write mapping only in one call: one
	 * 4 MiB piece.
	 */
	if (exporter_alloc(efd, 4u << 20, PFNMAP_RESERVED, NULL))
		bail("exporter: cannot allocate 4 MiB");
	p = exporter_map(efd, 4u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE);
	if (!p)
		bail("private mmap: %s", strerror(errno));
	declined("copy-on-write (MAP_PRIVATE, writable) PFN mapping", p, 4u << 20, MR_ACCESS);
	munmap(p, 4u << 20);

	ok(exporter_alloc(efd, LEN, 0, NULL) == 0, "exporter: 8 MiB of ordinary kernel pages (not reserved)");
	p = map_rw();
	declined("PFN mapping of RAM the page allocator manages (\"not mine\")", p, LEN, MR_ACCESS);
	munmap(p, LEN);
	test_window("the legacy VGA window 0xa0000-0xbffff (device memory inside the kernel's memory map, its pages PageReserved)",
		    0xa0000, 0x20000);
	ok(pf_idle() && pm_balanced(), "refusals hold nothing: pfn counters idle, the core's balance");
}

int main(void)
{
	h = aligned_alloc(4096, LEN);
	cpu = malloc(LEN);
	cpu2 = malloc(LEN);
	if (!h || !cpu || !cpu2)
		bail("out of memory");
	rxe_up();
	exporter_load();
	efd = exporter_open(O_RDWR);
	if (conn_open(&c))
		bail("cannot open rxe0");
	if (want("without_option"))
		test_without_option();
	else if (exporter_alloc(efd, LEN, PFNMAP_RESERVED, NULL))
		bail("the exporter could not reserve %u MiB", LEN >> 20);
	conn_close(&c);

	test_write_read();
	evfd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (evfd < 0)
		bail("cannot open %s: %s", PEERMEM_DEVICE_PATH, strerror(errno));
	ok(event_is("before", NULL, 0, 0), "/dev/peermem open, no event queued");
	if (want("zap"))
		test_driver_change(0);
	if (want("realloc"))
		test_driver_change(1);
	if (want("munmap"))
		test_munmap();
	if (want("rescuer"))
		test_rescuer();
	if (want("mprotect"))
		test_mprotect();
	if (want("clear_refs"))
		test_clear_refs();
	if (want("pagemap_scan"))
		test_pagemap_scan();
	if (want("exit")) {
		test_exit();
		test_reap();
		ok(event_is("exit", NULL, 0, 0),
		   "exit: the child's revocation is not reported to this process (its address space's, not ours)");
	}
	if (want("read_only"))
		test_read_only();
	if (want("refused"))
		test_refused();

	ok(event_is("end", NULL, 0, 0), "no other revocation was reported (read-only and refused ranges)");
	close(evfd);
	ibv_dereg_mr(lmr);
	conn_close(&c);
	ioctl(efd, PFNMAP_IOC_FREE);
	close(efd);
	ok(wait_for(all_idle, 10) && pf_idle(), "peermem (every client and the pfn source) and gpusim idle at the end");
	ok(run("rmmod peermem") == 0 && run("rmmod pfnmap_exporter") == 0, "rmmod peermem and the exporter");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
