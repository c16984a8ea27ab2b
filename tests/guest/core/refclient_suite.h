/* SPDX-License-Identifier: GPL-2.0 */
/*
 * refclient_suite.h - the peer-memory core tests, run against the reference
 * client (tests/refclient) loaded with one configuration. Each t_refclient_*
 * program runs this suite with its own module parameters.
 */
#ifndef REFCLIENT_SUITE_H
#define REFCLIENT_SUITE_H

#include "core_test.h"

#include <dirent.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/ioctl.h>

#include "../../gpusim/gpusim_uapi.h"

struct suite_cfg {
	int invalidate;		/* register with an invalidate callback */
	int unmaps;		/* PEER_MEM_INVALIDATE_UNMAPS */
	int page_kb;		/* client page size */
	int cpu_pages;		/* 0: reserved memory, dma_map_resource, no pages in the table */
	int gpusim;		/* memory from gpusim instead of /dev/peer_refmem */
};

#define CLIENT "refclient"
#define RDBG "/sys/kernel/debug/peer_refclient/"
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		   IBV_ACCESS_REMOTE_READ)
#define PEER_LEN (256 * 1024UL)
#define HOST_LEN (1024 * 1024UL)

static size_t psize;
static int use_gpusim;

#define GSDBG "/sys/kernel/debug/gpusim/"

static long long rc_live(const char *what)
{
	return read_ll(RDBG "%s", what);
}


/* The memory source has nothing allocated, pinned or mapped. */
static int src_idle(void)
{
	if (!use_gpusim)
		return rc_live("live_allocs") == 0 &&
		       rc_live("live_mem_bytes") == 0;
	return read_ll(GSDBG "live_allocs") == 0 &&
	       read_ll(GSDBG "live_pins") == 0 &&
	       read_ll(GSDBG "live_dma_mappings") == 0 &&
	       read_ll(GSDBG "live_vmas") == 0 &&
	       read_ll(GSDBG "live_mem_bytes") == 0;
}

static int rc_all_idle(void)
{
	return src_idle() && rc_live("live_pins") == 0 &&
	       rc_live("live_maps") == 0;
}

/* Map len bytes of /dev/peer_refmem at a psize-aligned address. */
static void *ref_map(int fd, size_t len)
{
	uint8_t *res, *p;
	uintptr_t a;

	res = mmap(NULL, len + psize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
		   -1, 0);
	if (res == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)res + psize - 1) & ~(uintptr_t)(psize - 1);
	p = mmap((void *)a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		 fd, 0);
	if (p == MAP_FAILED) {
		munmap(res, len + psize);
		return NULL;
	}
	if ((uint8_t *)a > res)
		munmap(res, (uint8_t *)a - res);
	if (res + len + psize > p + len)
		munmap(p + len, res + len + psize - (p + len));
	return p;
}

static int src_open(void)
{
	return open(use_gpusim ? "/dev/gpusim" : "/dev/peer_refmem", O_RDWR);
}

/* Allocate len bytes of peer memory, mapped for the CPU. */
static uint8_t *src_alloc(int fd, size_t len, uint64_t *handle)
{
	struct gpusim_alloc a = { .size = len };

	*handle = 0;
	if (!use_gpusim)
		return ref_map(fd, len);
	if (ioctl(fd, GPUSIM_IOC_ALLOC, &a))
		return NULL;
	*handle = a.handle;
	return (uint8_t *)(uintptr_t)a.addr;
}

/* Free it (what cudaFree is to a GPU): refmem by munmap, gpusim by ioctl. */
static int src_free(int fd, uint8_t *p, size_t len, uint64_t handle)
{
	struct gpusim_free f = { .handle = handle };

	if (!use_gpusim)
		return munmap(p, len);
	return ioctl(fd, GPUSIM_IOC_FREE, &f);
}

/* After src_free: drop what is left (gpusim's CPU mapping outlives the free). */
static void src_drop(uint8_t *p, size_t len)
{
	if (use_gpusim)
		munmap(p, len);
}

/* After src_free with pins revoked: the memory is gone from the source. */
static int src_freed(void)
{
	if (!use_gpusim)
		return rc_live("live_mem_bytes") == 0;
	return read_ll(GSDBG "live_allocs") == 0 &&
	       read_ll(GSDBG "live_pins") == 0;
}

/* After src_free with a non-invalidating client: a pin still holds it. */
static int src_held(void)
{
	if (!use_gpusim)
		return rc_live("live_mem_bytes") == (long long)PEER_LEN;
	return read_ll(GSDBG "live_allocs") == 0 &&
	       read_ll(GSDBG "live_persistent_pins") == 1;
}

/*
 * Wait up to secs for the client's n-th call of the core's invalidate
 * function to have returned (with, for unmaps=1, the client's own unmap
 * after it) and, if freed, for the memory source to have let go of the
 * memory. The client makes some of these calls from work items; once one
 * has returned, the core's counters for it are final.
 */
static int wait_invalidations(long long n, int freed, double secs)
{
	double end = now_s() + secs;

	for (;;) {
		if (rc_live("invalidate_done") >= n && (!freed || src_freed()))
			return 1;
		if (now_s() >= end)
			break;
		usleep(20000);
	}
	diag("after %.0f s: %lld of %lld invalidate calls returned, memory %s",
	     secs, rc_live("invalidate_done"), n,
	     src_freed() ? "freed" : "not freed");
	return 0;
}

static void stats_diag(const char *what, const struct peer_stats *s)
{
	diag("%s: alloc %lld dealloc %lld reg_pages %lld dereg_pages %lld reg_bytes %lld dereg_bytes %lld free_cb %lld invalidated %lld",
	     what, s->alloc_mrs, s->dealloc_mrs, s->reg_pages, s->dereg_pages,
	     s->reg_bytes, s->dereg_bytes, s->free_callbacks,
	     s->invalidated_mrs);
}

static int load_client(const struct suite_cfg *cfg)
{
	const char *root = getenv("PEERMEM_ROOT") ?: ".";
	char ko[512];

	if (cfg->gpusim && access("/sys/module/gpusim", F_OK) != 0) {
		/* GPUSIM_KO: a gpusim.ko built elsewhere (default: the repo's). */
		if (getenv("GPUSIM_KO"))
			snprintf(ko, sizeof(ko), "%s", getenv("GPUSIM_KO"));
		else
			snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root);
		if (access(ko, R_OK))
			bail("%s is missing: build it with make -C tests/gpusim", ko);
		/* GPUSIM_ARGS: gpusim's module arguments (e.g. rm_lock=0). */
		if (run("insmod %s %s", ko, getenv("GPUSIM_ARGS") ?: ""))
			bail("cannot load gpusim %s", getenv("GPUSIM_ARGS") ?: "");
	}
	/*
	 * gpusim's RM lock: $GPUSIM_RM_LOCK, off by default here because the
	 * reference client holds its context lock across nvidia_p2p_get_pages
	 * and takes it in its free callback, a lockdep cycle with the RM lock
	 * (docs/gpusim.md, "The resource manager's lock").
	 */
	if (cfg->gpusim &&
	    write_str(GSDBG "rm_lock", getenv("GPUSIM_RM_LOCK") ?: "0"))
		bail("cannot set gpusim's rm_lock");
	snprintf(ko, sizeof(ko), "%s/tests/refclient/peer_refclient.ko", root);
	if (access(ko, R_OK))
		bail("%s is missing: build it with make -C tests/refclient", ko);
	if (access("/sys/module/peer_refclient", F_OK) == 0)
		run("rmmod peer_refclient");
	return run("insmod %s name=%s source=%s invalidate=%d unmaps=%d page_kb=%d cpu_pages=%d",
		   ko, CLIENT, cfg->gpusim ? "gpusim" : "refmem",
		   cfg->invalidate, cfg->unmaps, cfg->page_kb, cfg->cpu_pages);
}

/* Child of the RLIMIT test: without CAP_IPC_LOCK and 64 KiB of MEMLOCK. */
static int memlock_child(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	struct rlimit rl = { 64 * 1024, 64 * 1024 };
	struct ibv_mr *mr;
	struct conn c;
	void *p, *h_buf;
	uint64_t ph;
	int fd = src_open();

	if (syscall(SYS_capget, &h, d))
		return 10;
	d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	if (syscall(SYS_capset, &h, d))
		return 11;
	if (setrlimit(RLIMIT_MEMLOCK, &rl))
		return 12;
	if (fd < 0 || conn_open(&c))
		return 13;
	p = src_alloc(fd, PEER_LEN, &ph);
	h_buf = aligned_alloc(4096, PEER_LEN);
	if (!p || !h_buf)
		return 14;
	memset(h_buf, 1, PEER_LEN);
	mr = ibv_reg_mr(c.pd, h_buf, PEER_LEN, MR_ACCESS);
	if (mr || errno != ENOMEM)
		return 15;	/* the control: host memory over the limit */
	mr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
	if (mr || errno != ENOMEM)
		return 16;
	/* Within the limit it works. */
	mr = ibv_reg_mr(c.pd, p, 64 * 1024, MR_ACCESS);
	if (!mr)
		return 17;
	ibv_dereg_mr(mr);
	conn_close(&c);
	close(fd);
	return 0;
}

/* Child of the exit test: registers peer memory and exits holding it. */
static int exit_child(void)
{
	struct ibv_mr *mr;
	struct conn c;
	uint64_t h;
	uint8_t *p;
	/* Opened first: at exit it is closed (memory freed) before uverbs. */
	int fd = src_open();

	if (fd < 0 || conn_open(&c))
		return 20;
	p = src_alloc(fd, PEER_LEN, &h);
	if (!p)
		return 21;
	fill(p, PEER_LEN, 0x5151);
	mr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
	if (!mr)
		return 22;
	return 0;	/* exit with the MR registered and the memory mapped */
}

/* ---- the core's dma_test hook (peer_memory/<client>/dma_test) ---- */

#define DMA_TEST "/sys/kernel/debug/peer_memory/" CLIENT "/dma_test"

struct dt_result {
	long long ret, nmap, orig_nents, page_size, dma_bytes, pages;
};

/* Read the hook's line about its last run; -1 if it does not parse. */
static int dt_read(struct dt_result *r)
{
	char line[256];
	FILE *f = fopen(DMA_TEST, "r");
	int n = 0;

	memset(r, 0xff, sizeof(*r));
	if (!f)
		return -1;
	if (fgets(line, sizeof(line), f))
		n = sscanf(line, "ret=%lld nmap=%lld orig_nents=%lld page_size=%lld dma_bytes=%lld pages=%lld",
			   &r->ret, &r->nmap, &r->orig_nents, &r->page_size,
			   &r->dma_bytes, &r->pages);
	fclose(f);
	return n == 6 ? 0 : -1;
}

/* Write a request; returns 0 or -errno of the write, and reads the result. */
static int dt_run(struct dt_result *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int dt_run(struct dt_result *r, const char *fmt, ...)
{
	char req[256];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(req, sizeof(req), fmt, ap);
	va_end(ap);
	rc = write_str(DMA_TEST, req);
	if (dt_read(r))
		diag("cannot parse %s", DMA_TEST);
	return rc;
}

static void dt_diag(const struct dt_result *r)
{
	diag("dma_test: ret=%lld nmap=%lld orig_nents=%lld page_size=%lld dma_bytes=%lld pages=%lld",
	     r->ret, r->nmap, r->orig_nents, r->page_size, r->dma_bytes,
	     r->pages);
}

/*
 * A PCI device of the guest: the rig's RDMA DMA device (QEMU edu behind
 * the IOMMU, $PEERMEM_DMA_DEVICE from the VM's init) if there is one, else
 * a virtio one, else the first.
 */
static int pci_device(char *name, size_t len)
{
	const char *dir = "/sys/bus/pci/devices";
	const char *rig = getenv("PEERMEM_DMA_DEVICE");
	char line[64], path[512];
	struct dirent *d;
	DIR *dp;
	int found = 0;

	if (rig && *rig) {
		snprintf(path, sizeof(path), "%s/%s", dir, rig);
		if (access(path, F_OK) == 0) {
			snprintf(name, len, "%s", rig);
			return 0;
		}
	}
	dp = opendir(dir);
	if (!dp)
		return -1;
	while ((d = readdir(dp))) {
		FILE *f;

		if (d->d_name[0] == '.')
			continue;
		if (!found) {
			snprintf(name, len, "%s", d->d_name);
			found = 1;
		}
		snprintf(path, sizeof(path), "%s/%s/vendor", dir, d->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(line, sizeof(line), f) && !strncmp(line, "0x1af4", 6)) {
			snprintf(name, len, "%s", d->d_name);
			fclose(f);
			break;
		}
		fclose(f);
	}
	closedir(dp);
	return found ? 0 : -1;
}

/* Nothing pinned or mapped by the client or in the memory source. */
static int dt_idle(void)
{
	if (rc_live("live_pins") || rc_live("live_maps"))
		return 0;
	if (use_gpusim)
		return read_ll(GSDBG "live_pins") == 0 &&
		       read_ll(GSDBG "live_dma_mappings") == 0;
	return 1;
}

/*
 * The hook maps [p, p + len) through the client for a PCI device: both
 * sources map their pages with the DMA API, one entry per client page in
 * the CPU view (orig_nents), the DMA entries (nmap, what the client
 * reported, maybe merged) covering the trimmed range.
 */
static int dt_expect(const struct dt_result *r, int rc, uintptr_t a, size_t len)
{
	long long pages = ((a + len + 4095) / 4096) - a / 4096;
	long long cpages = ((a + len + psize - 1) / psize) - a / psize;

	return r->pages == pages && rc == 0 && r->ret == 0 && r->nmap >= 1 &&
	       r->nmap <= cpages && r->nmap == rc_live("last_nents") &&
	       r->orig_nents == cpages && r->page_size == (long long)psize &&
	       r->dma_bytes == pages * 4096;
}

/* Run the calling thread on CPU 0 only (cpu < 0: on every CPU again). */
static int pin_cpu(int cpu)
{
	cpu_set_t set;
	int i;

	CPU_ZERO(&set);
	if (cpu >= 0)
		CPU_SET(cpu, &set);
	else
		for (i = 0; i < CPU_SETSIZE; i++)
			CPU_SET(i, &set);
	return sched_setaffinity(0, sizeof(set), &set);
}

static void dma_test_checks(const struct suite_cfg *cfg, uint8_t *p,
			    uint8_t *hbuf)
{
	struct peer_stats s0, s1;
	struct dt_result r;
	struct stat stb;
	char dev[256];
	long pin0 = vm_pin_kb();
	long long v;
	uint8_t *gone;
	int rc, st;

	if (pci_device(dev, sizeof(dev)))
		bail("no PCI device in /sys/bus/pci/devices for the dma_test hook");
	peer_stats(CLIENT, &s0);
	rc = dt_read(&r);
	ok(stat(DMA_TEST, &stb) == 0 && (stb.st_mode & 0777) == 0600 &&
	   rc == 0 && r.ret == -ENODATA,
	   "core: %s exists, mode 0600, no run yet (ret=%lld)", DMA_TEST,
	   r.ret);

	rc = dt_run(&r, "%#lx %lu %s\n", (unsigned long)(uintptr_t)p, PEER_LEN,
		    dev);
	ok(dt_expect(&r, rc, (uintptr_t)p, PEER_LEN),
	   "dma_test of the whole allocation for PCI device %s: mapped with the DMA API (%s), %lld DMA entries (write %d)",
	   dev, cfg->cpu_pages ? "dma_map_sgtable" : "dma_map_resource",
	   r.nmap, rc);
	dt_diag(&r);
	ok(dt_idle(), "dma_test left nothing pinned or mapped");

	rc = dt_run(&r, "%lu %d %s", (unsigned long)(uintptr_t)p + 70000,
		    100000, dev);
	ok(dt_expect(&r, rc, (uintptr_t)p + 70000, 100000) && dt_idle(),
	   "dma_test of an unaligned sub-range (decimal address): trimmed to %lld PAGE_SIZE pages (write %d)",
	   r.pages, rc);
	if (!dt_expect(&r, rc, (uintptr_t)p + 70000, 100000))
		dt_diag(&r);

	rc = dt_run(&r, "%#lx %lu %s", (unsigned long)(uintptr_t)hbuf, 65536UL,
		    dev);
	ok(rc == -ENOENT && r.ret == -ENOENT,
	   "dma_test of host memory the client does not own: ENOENT (write %d)",
	   rc);
	gone = mmap(NULL, 65536, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (gone != MAP_FAILED)
		munmap(gone, 65536);
	rc = dt_run(&r, "%#lx %lu %s", (unsigned long)(uintptr_t)gone, 65536UL,
		    dev);
	ok(gone != MAP_FAILED && rc == -ENOENT && r.ret == -ENOENT,
	   "dma_test of an unmapped address: ENOENT (write %d)", rc);
	rc = dt_run(&r, "%#lx %lu 0000:ff:1f.7", (unsigned long)(uintptr_t)p,
		    PEER_LEN);
	ok(rc == -ENODEV && r.ret == -ENODEV,
	   "dma_test with an unknown PCI device: ENODEV (write %d)", rc);
	rc = dt_run(&r, "%#lx 0 %s", (unsigned long)(uintptr_t)p, dev);
	ok(rc == -EINVAL && r.ret == -EINVAL,
	   "dma_test of zero bytes: EINVAL (write %d)", rc);
	rc = dt_run(&r, "0xfffffffffffff000 0x2000 %s", dev);
	ok(rc == -EINVAL && r.ret == -EINVAL,
	   "dma_test of a range that wraps around: EINVAL (write %d)", rc);
	rc = dt_run(&r, "%#lx %lu", (unsigned long)(uintptr_t)p, PEER_LEN);
	st = dt_run(&r, "%#lx %lu %s extra", (unsigned long)(uintptr_t)p,
		    PEER_LEN, dev);
	v = dt_run(&r, "0xzz 4096 %s", dev);
	ok(rc == -EINVAL && st == -EINVAL && v == -EINVAL && r.ret == -EINVAL,
	   "dma_test with two or four words or a bad number: EINVAL (writes %d %d %lld)",
	   rc, st, v);
	ok(dt_idle() && vm_pin_kb() == pin0,
	   "nothing pinned or mapped, VmPin unchanged (%ld KiB)", pin0);

	if (cfg->invalidate) {
		long long lc = rc_live("late_core_calls");
		long long lr = rc_live("late_restores");
		uintptr_t a = (uintptr_t)p + 70000;

		/*
		 * An invalidation of the run's ticket while the hook holds the
		 * mapping, from a SCHED_FIFO thread on the CPU this thread is
		 * pinned to: it waits for the mapping lock and runs the moment
		 * the core's teardown drops it, before the core goes on. The
		 * range is unaligned, so the core trimmed the table's first
		 * entry. Without PEER_MEM_INVALIDATE_UNMAPS the core unmaps
		 * under the lock: the invalidation finds nothing to do and the
		 * core never comes back. With it (OFED's order) the core
		 * unlocks first, then restores the trimmed entries in the
		 * client's table and calls dma_unmap() and put_pages(): after
		 * the client's invalidate call returned and it had unmapped by
		 * itself. A client that frees its table in its invalidation
		 * path would be written to after the free here.
		 */
		v = rc_live("invalidate_done");
		st = pin_cpu(0);
		rc = write_str(RDBG "race_invalidate", "2");
		rc = rc ? rc : dt_run(&r, "%#lx %d %s", (unsigned long)a, 100000,
				      dev);
		pin_cpu(-1);
		ok(st == 0 && dt_expect(&r, rc, a, 100000),
		   "dma_test with an invalidation of its ticket in flight, from a real-time thread on the same CPU (write %d)",
		   rc);
		st = wait_invalidations(v + 1, 0, 30);
		peer_stats(CLIENT, &s1);
		ok(st && s1.free_callbacks == s0.free_callbacks + 1 &&
		   s1.invalidated_mrs == s0.invalidated_mrs && dt_idle(),
		   "the invalidation waited and found nothing to invalidate; nothing left pinned or mapped");
		if (!st || s1.free_callbacks != s0.free_callbacks + 1 ||
		    s1.invalidated_mrs != s0.invalidated_mrs) {
			stats_diag("before", &s0);
			stats_diag("after", &s1);
		}
		if (cfg->unmaps)
			ok(rc_live("late_restores") == lr + 1 &&
			   rc_live("late_core_calls") == lc + 2,
			   "PEER_MEM_INVALIDATE_UNMAPS: the core restored the trimmed entries in the client's table and called dma_unmap/put_pages after the client's invalidate returned (late restores +%lld, late calls +%lld): the table must live until release()",
			   rc_live("late_restores") - lr,
			   rc_live("late_core_calls") - lc);
		else
			ok(rc_live("late_restores") == lr &&
			   rc_live("late_core_calls") == lc,
			   "without PEER_MEM_INVALIDATE_UNMAPS the core was done with the table before the invalidation returned (late restores +%lld, late calls +%lld)",
			   rc_live("late_restores") - lr,
			   rc_live("late_core_calls") - lc);
		s0.free_callbacks = s1.free_callbacks;
	}
	peer_stats(CLIENT, &s1);
	ok(s1.alloc_mrs == s0.alloc_mrs && s1.dealloc_mrs == s0.dealloc_mrs &&
	   s1.reg_pages == s0.reg_pages && s1.reg_bytes == s0.reg_bytes &&
	   s1.dereg_bytes == s0.dereg_bytes &&
	   s1.free_callbacks == s0.free_callbacks,
	   "dma_test runs leave the MR statistics alone");
}

/*
 * A bus address that does not translate: the client hands the core, for
 * one DMA entry, an address nobody mapped for the device (bad_entry). The
 * core cannot tell (OFED does not either); the device's DMA through the
 * IOMMU fails, so RDMA on that entry must complete in error, and RDMA on
 * the other entries must still work.
 */
static void bad_address_checks(struct conn *c, struct ibv_mr *hmr,
			       uint8_t *hbuf, uint8_t *p)
{
	struct ibv_mr *mr;
	long long off, len;
	int rc, st;

	fill(p, PEER_LEN, 0xbad0);
	memcpy(hbuf + 512 * 1024, p, PEER_LEN);
	rc = write_str(RDBG "bad_entry", "1");
	mr = ibv_reg_mr(c->pd, p, PEER_LEN, MR_ACCESS);
	off = read_ll(RDBG "bad_offset");
	len = read_ll(RDBG "bad_len");
	ok(rc == 0 && mr && read_ll(RDBG "bad_entry") == -1 && off > 0 &&
	   len >= 4096 && off + len <= (long long)PEER_LEN,
	   "bad_entry=1: the MR registers with DMA entry 1 ([+%lld, +%lld)) pointing at a bus address nobody mapped (the core cannot tell)",
	   off, len);
	if (!mr || off <= 0 || len < 4096 || off + len > (long long)PEER_LEN) {
		if (mr)
			ibv_dereg_mr(mr);
		return;
	}
	rc = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, 4096, (uintptr_t)p,
		     mr->rkey);
	ok(rc == 0 && !memcmp(hbuf, p, 4096),
	   "RDMA READ of entry 0 works (status %d)", rc);
	rc = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, 4096,
		     (uintptr_t)p + off, mr->rkey);
	ok(rc > 0, "RDMA READ of the entry whose bus address does not translate completes in error (status %d: %s)",
	   rc, rc > 0 ? ibv_wc_status_str(rc) : "none");
	if (conn_qps(c))
		bail("cannot recreate the QPs");
	fill(hbuf, 4096, 0xbad1);
	st = rdma_op(c, IBV_WR_RDMA_WRITE, hmr, hbuf, 4096,
		     (uintptr_t)p + off + len - 4096, mr->rkey);
	ok(st > 0 && !memcmp(p, hbuf + 512 * 1024, PEER_LEN),
	   "RDMA WRITE to it completes in error (status %d: %s) and no byte of the memory changed",
	   st, st > 0 ? ibv_wc_status_str(st) : "none");
	if (conn_qps(c))
		bail("cannot recreate the QPs");
	ok(ibv_dereg_mr(mr) == 0 && rc_live("live_pins") == 0 &&
	   rc_live("live_maps") == 0,
	   "ibv_dereg_mr succeeds; the client unmapped what it really mapped");
}

/*
 * Non-MR umems through the core's rig-only umem_test hook: kind "queue"
 * is ib_umem_get_peer(..., 0), what mlx5 does for CQ/QP/SRQ buffers and
 * the doorbell page: only non-invalidating clients are asked. Kind "mr"
 * (IB_PEER_MEM_INVAL_SUPP) asks every client. The hook reads the first
 * u64 of the range through the bus address the client mapped, translated
 * by the IOMMU as the device would.
 */
static void umem_test_checks(const struct suite_cfg *cfg, uint8_t *p)
{
	struct peer_stats s0, s1;
	struct ut_info u;
	char first[40];
	long long acq, n, bad_len;
	int fd, fd2, rc;

	fd = open(UMEM_TEST, O_RDWR);
	if (fd < 0) {
		ok(0, "open %s: %s", UMEM_TEST, strerror(errno));
		return;
	}
	fill(p, PEER_LEN, 0x0ee0);
	peer_stats(CLIENT, &s0);
	acq = rc_live("acquire_calls");
	rc = ut_get(fd, RXE_DEV, p, PEER_LEN, "queue");
	if (cfg->invalidate) {
		peer_stats(CLIENT, &s1);
		ok(rc == -EFAULT && rc_live("acquire_calls") == acq &&
		   s1.alloc_mrs == s0.alloc_mrs,
		   "a queue umem (flags 0) on peer memory: EFAULT, an invalidating client is not even asked (%d)",
		   rc);
	} else {
		n = rc == 0 ? rc_live("last_nents") : -1;
		ut_first(p, first, sizeof(first));
		ok(rc == 0 && ut_read(fd, &u) == 0 && !strcmp(u.client, CLIENT) &&
		   !strcmp(u.kind, "queue") && u.nents == n &&
		   u.page_size == (long long)psize &&
		   u.dma_bytes == (long long)PEER_LEN &&
		   u.translated == u.dma_bytes && !strcmp(u.first, first),
		   "a queue umem (flags 0) on peer memory is served by the non-invalidating client, every bus address translates and reads the memory (%d)",
		   rc);
		if (rc || strcmp(u.first, first))
			ut_diag(&u);
		peer_stats(CLIENT, &s1);
		ok(s1.alloc_mrs == s0.alloc_mrs + 1 &&
		   s1.reg_pages == s0.reg_pages + n &&
		   rc_live("live_pins") == 1 && rc_live("live_maps") == 1,
		   "the core counts it like an MR (num_alloc_mrs +1, num_reg_pages +%lld); it stays pinned while the file holds it",
		   n);
		rc = ut_get(fd, RXE_DEV, p, 4096, "queue");
		ok(rc == -EBUSY, "a second umem on the same file: EBUSY (%d)",
		   rc);
		close(fd);
		peer_stats(CLIENT, &s1);
		ok(peer_stats_settled(&s1, 0) && rc_live("live_pins") == 0 &&
		   rc_live("live_maps") == 0,
		   "closing the file releases it (dma_unmap, put_pages, release), counters balanced");

		/* mlx5's doorbell: one 4 KiB page. */
		fd = open(UMEM_TEST, O_RDWR);
		rc = fd < 0 ? -errno : ut_get(fd, RXE_DEV, p + 3 * 4096, 4096,
					      "queue");
		ut_first(p + 3 * 4096, first, sizeof(first));
		ok(rc == 0 && ut_read(fd, &u) == 0 && u.dma_bytes == 4096 &&
		   u.translated == 4096 && u.page_size == (long long)psize &&
		   !strcmp(u.first, first),
		   "a doorbell-like umem of one 4 KiB page: the client maps a whole %zu KiB page, the core trims it to 4096 bytes that translate (%d)",
		   psize / 1024, rc);
		if (rc)
			ut_diag(&u);
	}
	if (fd >= 0)
		close(fd);

	/* Kind mr: every client is asked; a bad entry does not translate. */
	fd = open(UMEM_TEST, O_RDWR);
	rc = write_str(RDBG "bad_entry", "1");
	rc = rc ? rc : ut_get(fd, RXE_DEV, p, PEER_LEN, "mr");
	bad_len = read_ll(RDBG "bad_len");
	ut_first(p, first, sizeof(first));
	if (rc == 0 && ut_read(fd, &u))
		rc = -EPROTO;
	ok(rc == 0 && !strcmp(u.kind, "mr") &&
	   u.dma_bytes == (long long)PEER_LEN &&
	   u.translated == u.dma_bytes - bad_len && !strcmp(u.first, first),
	   "an MR umem with a bad bus address in DMA entry 1: %lld of %lld bytes translate, the first u64 reads through the IOMMU (%d)",
	   u.translated, u.dma_bytes, rc);
	if (rc || u.translated != u.dma_bytes - bad_len)
		ut_diag(&u);
	fd2 = open(UMEM_TEST, O_RDWR);
	rc = ut_get(fd2, "rxe9", p, PEER_LEN, "mr");
	ok(rc == -ENODEV, "umem_test on an unknown device: ENODEV (%d)", rc);
	rc = ut_get(fd2, RXE_DEV, p, PEER_LEN, "cq");
	ok(rc == -EINVAL, "umem_test with an unknown kind: EINVAL (%d)", rc);
	close(fd2);
	if (cfg->invalidate) {
		char tk[32];

		snprintf(tk, sizeof(tk), "%lld", read_ll(RDBG "last_ticket"));
		rc = write_str(RDBG "invalidate_ticket", tk);
		ok(rc == 0 && ut_read(fd, &u) == 0 && u.invalidated == 1 &&
		   u.dma_bytes == 0,
		   "invalidating it calls the driver's notifier and takes the mapping away");
	}
	close(fd);
	peer_stats(CLIENT, &s1);
	ok(peer_stats_settled(&s1, 0) && rc_live("live_pins") == 0 &&
	   rc_live("live_maps") == 0,
	   "every umem_test umem released, counters balanced");
	if (!peer_stats_settled(&s1, 0))
		stats_diag("after", &s1);
}

/*
 * PEER_MEM_INVALIDATE_UNMAPS: an invalidation between the core's stop of
 * an MR (at deregistration) and its unmapping. The client's dma_unmap()
 * has a work item invalidate the mapping first and waits for it: the
 * core's invalidate gets the mapping lock at once (the stop dropped it),
 * finds the mapping unmapped, marks it invalidated and returns 0; the
 * client unmaps and puts its pages by itself; then the core's put_pages()
 * still comes, and at the release OFED counts num_dereg_bytes a second
 * time. Returns the bytes counted twice.
 */
static long long late_invalidation_check(struct conn *c, uint8_t *p)
{
	struct peer_stats s0, s1;
	struct ibv_mr *mr;
	long long lc, v;
	int rc;

	mr = ibv_reg_mr(c->pd, p, PEER_LEN, MR_ACCESS);
	peer_stats(CLIENT, &s0);
	lc = rc_live("late_core_calls");
	v = rc_live("invalidate_done");
	rc = write_str(RDBG "invalidate_in_unmap", "1");
	ok(mr && rc == 0 && ibv_dereg_mr(mr) == 0,
	   "deregistration with an invalidation of the MR between the core's stop and its dma_unmap()");
	peer_stats(CLIENT, &s1);
	ok(rc_live("invalidate_done") == v + 1 &&
	   s1.free_callbacks == s0.free_callbacks + 1 &&
	   s1.invalidated_mrs == s0.invalidated_mrs &&
	   s1.dealloc_mrs == s0.dealloc_mrs + 1,
	   "the invalidation returned at once and revoked nothing (the MR was already stopped)");
	ok(s1.dereg_bytes - s0.dereg_bytes == 2 * (long long)PEER_LEN,
	   "num_dereg_bytes counted twice for it (+%lld), as OFED 25.10 counts an UNMAPPED->INVALIDATED->UNMAPPED umem",
	   s1.dereg_bytes - s0.dereg_bytes);
	ok(rc_live("late_core_calls") == lc + 1 && rc_live("live_pins") == 0 &&
	   rc_live("live_maps") == 0,
	   "the core still called put_pages() after the client's invalidate returned and it had unmapped by itself (late calls +%lld): the context and its table must outlive the client's own unmap",
	   rc_live("late_core_calls") - lc);
	return s1.dereg_bytes - s0.dereg_bytes - (long long)PEER_LEN;
}

static int run_refclient_suite(const struct suite_cfg *cfg)
{
	struct peer_stats s0, s1;
	struct ibv_mr *hmr, *pmr, *smr;
	struct conn c;
	uint8_t *hbuf, *p, *saved;
	long pin0, pin1;
	/* dbl: num_dereg_bytes counted twice so far (OFED, see above) */
	long long t, v, nents, pend, dbl = 0, x = 0;
	char flags[128], want[128];
	uint64_t ph;
	int fd, st, rc;
	pid_t pid;

	use_gpusim = cfg->gpusim;
	psize = cfg->page_kb * 1024UL;
	rxe_up();
	rc = load_client(cfg);
	ok(rc == 0, "insmod peer_refclient invalidate=%d unmaps=%d page_kb=%d cpu_pages=%d",
	   cfg->invalidate, cfg->unmaps, cfg->page_kb, cfg->cpu_pages);
	if (rc)
		bail("cannot load the reference client");
	ok(peer_stats(CLIENT, &s0) == 0 && s0.alloc_mrs == 0 &&
	   s0.free_callbacks == 0 && s0.reg_pages == 0,
	   "core lists the client in debugfs with zero counters");
	{
		FILE *f = fopen("/sys/kernel/debug/peer_memory/" CLIENT "/flags", "r");

		flags[0] = 0;
		if (f) {
			if (!fgets(flags, sizeof(flags), f))
				flags[0] = 0;
			fclose(f);
		}
		snprintf(want, sizeof(want), "invalidate=%d invalidate_unmaps=%d\n",
			 cfg->invalidate, cfg->unmaps);
		ok(!strcmp(flags, want), "core sees the registration flags: %s",
		   want);
	}
	{
		char knob[8] = "";
		FILE *f = fopen("/sys/module/ib_core/parameters/peer_mem_sysfs", "r");

		if (f) {
			if (!fgets(knob, sizeof(knob), f))
				knob[0] = 0;
			fclose(f);
		}
		ok(knob[0] == 'N' &&
		   access("/sys/kernel/mm/memory_peers/" CLIENT, F_OK) != 0 &&
		   access("/sys/kernel/mm/memory_peers", F_OK) != 0,
		   "no /sys/kernel/mm/memory_peers/" CLIENT " by default, as OFED 25.10 on a kernel without mm_kobj (ib_core.peer_mem_sysfs=%.1s)",
		   knob);
	}

	rc = conn_open(&c);
	if (rc)
		bail("cannot set up an RC loopback on " RXE_DEV " (step %d)", rc);
	fd = src_open();
	if (fd < 0)
		bail("cannot open the %s device: %s",
		     use_gpusim ? "gpusim" : "peer_refmem", strerror(errno));

	/* Ordinary host memory: the normal pinning path. */
	hbuf = aligned_alloc(4096, HOST_LEN);
	saved = malloc(PEER_LEN);
	if (!hbuf || !saved)
		bail("out of memory");
	memset(hbuf, 0, HOST_LEN);
	pin0 = vm_pin_kb();
	hmr = ibv_reg_mr(c.pd, hbuf, HOST_LEN, MR_ACCESS);
	peer_stats(CLIENT, &s1);
	ok(hmr && s1.alloc_mrs == 0 && s1.reg_pages == 0,
	   "ibv_reg_mr on host memory pins normally (client counters unchanged)");
	if (!hmr)
		bail("host MR failed: %s", strerror(errno));
	ok(vm_pin_kb() - pin0 == (long)(HOST_LEN / 1024),
	   "VmPin grows by %lu KiB for the host MR", HOST_LEN / 1024);
	fill(hbuf, 65536, 0xabcd);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 65536,
		     (uintptr_t)hbuf + 65536, hmr->rkey);
	ok(rc == 0 && !memcmp(hbuf, hbuf + 65536, 65536),
	   "RDMA WRITE host->host on " RXE_DEV " (status %d)", rc);

	p = src_alloc(fd, PEER_LEN, &ph);
	if (!p)
		bail("cannot allocate peer memory: %s", strerror(errno));

	dma_test_checks(cfg, p, hbuf);
	peer_stats(CLIENT, &s0);	/* dma_test may have called invalidate */

	/* A whole peer allocation. */
	fill(p, PEER_LEN, 0x1111);
	pin0 = vm_pin_kb();
	pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
	ok(pmr != NULL, "ibv_reg_mr on VM_PFNMAP peer memory succeeds (errno %d)",
	   pmr ? 0 : errno);
	if (!pmr)
		bail("peer MR failed; the core or rxe wiring is broken");
	peer_stats(CLIENT, &s1);
	nents = rc_live("last_nents");
	ok(s1.alloc_mrs == 1 && nents >= 1 &&
	   nents <= (long long)(PEER_LEN / psize) && s1.reg_pages == nents &&
	   s1.reg_bytes == (long long)PEER_LEN,
	   "counters: num_alloc_mrs 1, num_reg_pages %lld = the DMA entries the client mapped (OFED counts entries, not pages), num_reg_bytes %lu",
	   nents, PEER_LEN);
	ok(rc_live("live_pins") == 1 && rc_live("live_maps") == 1,
	   "the client pinned and mapped once");
	pin1 = vm_pin_kb();
	ok(pin1 - pin0 == (long)(PEER_LEN / 1024),
	   "RLIMIT_MEMLOCK accounting: VmPin grows by %lu KiB (got %ld)",
	   PEER_LEN / 1024, pin1 - pin0);

	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 65536,
		     (uintptr_t)p + 1000, pmr->rkey);
	ok(rc == 0 && !memcmp(hbuf, p + 1000, 65536),
	   "RDMA READ peer->host returns the bytes of the CPU mapping (status %d)",
	   rc);
	fill(hbuf, 200000, 0x2222);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 200000,
		     (uintptr_t)p + 3 * 4096 + 8, pmr->rkey);
	ok(rc == 0 && !memcmp(hbuf, p + 3 * 4096 + 8, 200000),
	   "RDMA WRITE host->peer lands in the CPU mapping (status %d)", rc);
	fill(p + 131072, 100000, 0x3333);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, pmr, p + 131072, 100000,
		     (uintptr_t)hbuf + 300000, hmr->rkey);
	ok(rc == 0 && !memcmp(hbuf + 300000, p + 131072, 100000),
	   "RDMA WRITE from a peer MR as local source (status %d)", rc);

	/* An unaligned sub-range: the core trims the client's first/last pages. */
	smr = ibv_reg_mr(c.pd, p + 70000, 100000, MR_ACCESS);
	peer_stats(CLIENT, &s1);
	{
		/* [65536, 196608) in client pages */
		long long cp = (((uintptr_t)p + 170000 + psize - 1) / psize) -
			       ((uintptr_t)p + 70000) / psize;
		long long n2 = rc_live("last_nents");

		ok(smr && s1.alloc_mrs == 2 && n2 >= 1 && n2 <= cp &&
		   s1.reg_pages == nents + n2 &&
		   s1.reg_bytes == (long long)PEER_LEN + 100000,
		   "unaligned sub-range MR [+70000, +100000): %lld DMA entries for %lld client pages, 100000 bytes (num_reg_pages +%lld)",
		   n2, cp, s1.reg_pages - nents);
	}
	if (smr) {
		fill(hbuf, 8000, 0x4444);
		rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 5000,
			     (uintptr_t)p + 70000, smr->rkey);
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf + 5000, 3000,
			     (uintptr_t)p + 170000 - 3000, smr->rkey);
		ok(rc == 0 && st == 0 && !memcmp(p + 70000, hbuf, 5000) &&
		   !memcmp(p + 167000, hbuf + 5000, 3000),
		   "RDMA WRITE at the first and last byte of the sub-range");
		rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf + 400000, 100000,
			     (uintptr_t)p + 70000, smr->rkey);
		ok(rc == 0 && !memcmp(hbuf + 400000, p + 70000, 100000),
		   "RDMA READ of the whole sub-range matches the CPU mapping");
		ok(ibv_dereg_mr(smr) == 0, "ibv_dereg_mr of the sub-range MR");
	}
	ok(ibv_dereg_mr(pmr) == 0, "ibv_dereg_mr of the peer MR");
	peer_stats(CLIENT, &s1);
	ok(peer_stats_balanced(&s1) && s1.dealloc_mrs == 2 &&
	   s1.free_callbacks == s0.free_callbacks,
	   "counters balanced after deregistration (no invalidation): num_dealloc_mrs 2, num_dereg_bytes = num_reg_bytes, num_dereg_pages still 0 (as OFED)");
	if (!peer_stats_balanced(&s1))
		stats_diag("after", &s1);
	ok(rc_live("live_pins") == 0 && rc_live("live_maps") == 0,
	   "the core put every page back");
	ok(vm_pin_kb() == pin0, "VmPin back to %ld KiB", pin0);

	bad_address_checks(&c, hmr, hbuf, p);
	umem_test_checks(cfg, p);

	if (cfg->invalidate) {
		/* A stale ticket and one never handed out are no-ops. */
		pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		t = read_ll(RDBG "last_ticket");
		ok(pmr && ibv_dereg_mr(pmr) == 0 && t >= 0,
		   "register and deregister once more (ticket %lld)", t);
		peer_stats(CLIENT, &s0);
		snprintf(want, sizeof(want), "%lld", t);
		rc = write_str(RDBG "invalidate_ticket", want);
		v = read_ll(RDBG "last_invalidate_ret");
		peer_stats(CLIENT, &s1);
		ok(rc == 0 && v == 0 && s1.free_callbacks == s0.free_callbacks + 1 &&
		   s1.invalidated_mrs == s0.invalidated_mrs &&
		   s1.dealloc_mrs == s0.dealloc_mrs,
		   "invalidate with a stale ticket returns 0 and changes nothing");
		rc = write_str(RDBG "invalidate_ticket", "4000000000");
		v = read_ll(RDBG "last_invalidate_ret");
		peer_stats(CLIENT, &s0);
		ok(rc == 0 && v == 0 && s0.free_callbacks == s1.free_callbacks + 1 &&
		   s0.invalidated_mrs == s1.invalidated_mrs,
		   "invalidate with a ticket never handed out returns 0 and changes nothing");

		/* Invalidating a live registration, memory still there. */
		fill(p, PEER_LEN, 0x6666);
		memcpy(saved, p, PEER_LEN);
		pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		t = read_ll(RDBG "last_ticket");
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 4096,
				   (uintptr_t)p, pmr->rkey) : -1;
		ok(rc == 0, "a fresh peer MR works (ticket %lld, status %d, errno %d)",
		   t, rc, pmr ? 0 : errno);
		peer_stats(CLIENT, &s0);
		snprintf(want, sizeof(want), "%lld", t);
		rc = write_str(RDBG "invalidate_ticket", want);
		peer_stats(CLIENT, &s1);
		/* OFED counts an UNMAPS client's bytes at the release. */
		pend = cfg->unmaps ? (long long)PEER_LEN : 0;
		ok(rc == 0 && s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   peer_stats_settled(&s1, pend) && rc_live("live_pins") == 0 &&
		   rc_live("live_maps") == 0,
		   "invalidating its ticket unmaps it at once (%s; num_dealloc_mrs +1, num_dereg_bytes %s)",
		   cfg->unmaps ? "the client unmaps and puts the pages" :
				 "the core unmaps and puts the pages",
		   cfg->unmaps ? "only at the release" : "+length");
		if (!peer_stats_settled(&s1, pend))
			stats_diag("after", &s1);
		fill(hbuf, 4096, 0x7777);
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 4096,
				   (uintptr_t)p, pmr->rkey) : -1;
		ok(rc > 0 && !memcmp(p, saved, PEER_LEN),
		   "RDMA WRITE to the invalidated MR completes in error (status %d: %s) and the memory is untouched",
		   rc, rc > 0 ? ibv_wc_status_str(rc) : "none");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_WRITE, pmr, p, 4096,
				   (uintptr_t)hbuf, hmr->rkey) : -1;
		ok(rc > 0, "the invalidated MR as local source completes in error (status %d: %s)",
		   rc, rc > 0 ? ibv_wc_status_str(rc) : "none");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		ok(pmr && ibv_dereg_mr(pmr) == 0,
		   "ibv_dereg_mr of the invalidated MR succeeds");
		peer_stats(CLIENT, &s1);
		ok(peer_stats_balanced(&s1) && rc_live("live_pins") == 0 &&
		   rc_live("live_maps") == 0,
		   "nothing left pinned or mapped, counters balanced");
		if (!peer_stats_balanced(&s1))
			stats_diag("after", &s1);

		/*
		 * An invalidation that reaches the core between get_pages()
		 * and the moment rxe's MR is live: it waits for the mapping
		 * lock, then revokes the fresh MR.
		 */
		fill(p, PEER_LEN, 0x6767);
		memcpy(saved, p, PEER_LEN);
		peer_stats(CLIENT, &s0);
		v = rc_live("invalidate_done");
		rc = write_str(RDBG "race_invalidate", "1");
		pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		ok(rc == 0 && pmr != NULL,
		   "registration succeeds with an invalidation of it in flight");
		/* The client's work item returns from invalidate after the MR is live. */
		st = wait_invalidations(v + 1, 0, 30);
		peer_stats(CLIENT, &s1);
		ok(st && s1.free_callbacks == s0.free_callbacks + 1 &&
		   s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   s1.alloc_mrs == s0.alloc_mrs + 1 &&
		   peer_stats_settled(&s1, pend),
		   "the early invalidation was held until the MR was live, then revoked it");
		if (!st || s1.free_callbacks != s0.free_callbacks + 1 ||
		    s1.invalidated_mrs != s0.invalidated_mrs + 1 ||
		    s1.alloc_mrs != s0.alloc_mrs + 1 ||
		    !peer_stats_settled(&s1, pend)) {
			stats_diag("before", &s0);
			stats_diag("after", &s1);
		}
		fill(hbuf, 4096, 0x7878);
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 4096,
				   (uintptr_t)p, pmr->rkey) : -1;
		ok(rc > 0 && !memcmp(p, saved, PEER_LEN),
		   "RDMA WRITE to it completes in error (status %d) and the memory is untouched",
		   rc);
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		ok(pmr && ibv_dereg_mr(pmr) == 0 && rc_live("live_pins") == 0 &&
		   rc_live("live_maps") == 0,
		   "ibv_dereg_mr succeeds, nothing left pinned or mapped");
		if (cfg->unmaps)
			dbl += late_invalidation_check(&c, p);
	}

	/* Free the memory while the MR is live. */
	fill(p, PEER_LEN, 0x8888);
	memcpy(saved, p, PEER_LEN);
	pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
	rc = pmr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 8192,
			   (uintptr_t)p + 8192, pmr->rkey) : -1;
	ok(rc == 0 && !memcmp(hbuf, saved + 8192, 8192),
	   "peer MR works before the free");
	peer_stats(CLIENT, &s0);
	v = rc_live("invalidate_done");
	ok(src_free(fd, p, PEER_LEN, ph) == 0, "%s frees the peer memory",
	   use_gpusim ? "GPUSIM_IOC_FREE" : "munmap");
	if (cfg->invalidate) {
		/*
		 * refmem invalidates from a work item after the munmap: wait
		 * until its invalidate call has returned and the memory is
		 * gone, then the counters are final.
		 */
		st = wait_invalidations(v + 1, 1, 30);
		peer_stats(CLIENT, &s1);
		pend = (cfg->unmaps ? (long long)PEER_LEN : 0) - dbl;
		ok(st && s1.free_callbacks == s0.free_callbacks + 1 &&
		   s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   peer_stats_settled(&s1, pend),
		   "the free invalidated the live MR through the core");
		if (!st || s1.free_callbacks != s0.free_callbacks + 1 ||
		    s1.invalidated_mrs != s0.invalidated_mrs + 1 ||
		    !peer_stats_settled(&s1, pend)) {
			stats_diag("before", &s0);
			stats_diag("after", &s1);
		}
		ok(src_freed(), "the memory is gone right after the invalidation");
		fill(hbuf, 8192, 0x9999);
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 8192,
				   (uintptr_t)p, pmr->rkey) : -1;
		/* gpusim keeps the CPU mapping until munmap: check it too. */
		ok(rc > 0 && (!use_gpusim || !memcmp(p, saved, PEER_LEN)),
		   "RDMA WRITE to freed peer memory completes in error (status %d: %s)%s",
		   rc, rc > 0 ? ibv_wc_status_str(rc) : "none",
		   use_gpusim ? " and never reaches it" : "");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 8192,
				   (uintptr_t)p, pmr->rkey) : -1;
		ok(rc > 0, "RDMA READ from freed peer memory completes in error (status %d: %s)",
		   rc, rc > 0 ? ibv_wc_status_str(rc) : "none");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
	} else {
		usleep(200000);
		peer_stats(CLIENT, &s1);
		ok(s1.free_callbacks == 0 && s1.alloc_mrs == s1.dealloc_mrs + 1,
		   "a non-invalidating client keeps the MR mapped after the free");
		ok(src_held(), "the pinned memory outlives the free until the core puts it");
		rc = pmr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 65536,
				   (uintptr_t)p, pmr->rkey) : -1;
		ok(rc == 0 && !memcmp(hbuf, saved, 65536),
		   "RDMA READ still returns the pinned bytes (status %d)", rc);
	}
	ok(pmr && ibv_dereg_mr(pmr) == 0, "ibv_dereg_mr after the free succeeds");
	src_drop(p, PEER_LEN);
	peer_stats(CLIENT, &s1);
	ok(peer_stats_settled(&s1, -dbl) && rc_all_idle(),
	   "after deregistration nothing is allocated, pinned or mapped");
	if (!peer_stats_settled(&s1, -dbl))
		stats_diag("after", &s1);

	/* Process exit with a registered MR on peer memory. */
	peer_stats(CLIENT, &s0);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(exit_child());
	st = -1;
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "a child registers peer memory and exits without cleaning up (status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	/*
	 * Whether the memory went first (the MR is invalidated) or the uverbs
	 * file (a plain deregistration) depends on the order of teardown;
	 * either way everything must be released. For a
	 * PEER_MEM_INVALIDATE_UNMAPS client an invalidation can also land
	 * between the core's stop and its release of the umem: OFED then
	 * counts num_dereg_bytes twice (see late_invalidation_check()).
	 */
	{
		double end = now_s() + slow_s(30);

		do {
			peer_stats(CLIENT, &s1);
			x = s1.dereg_bytes - s1.reg_bytes - dbl;
			if (s1.alloc_mrs == s0.alloc_mrs + 1 &&
			    (x == 0 || (cfg->unmaps && x == (long long)PEER_LEN)) &&
			    peer_stats_settled(&s1, -dbl - x) && rc_all_idle())
				break;
			usleep(100000);
		} while (now_s() < end);
	}
	ok(s1.alloc_mrs == s0.alloc_mrs + 1 &&
	   peer_stats_settled(&s1, -dbl - x) &&
	   (x == 0 || (cfg->unmaps && x == (long long)PEER_LEN)) &&
	   rc_all_idle(),
	   "process exit releases the MR and the memory");
	diag("exit: %lld invalidation(s), num_dereg_bytes counted %s",
	     s1.invalidated_mrs - s0.invalidated_mrs,
	     x ? "twice (invalidated between stop and release)" : "once");
	if (!peer_stats_settled(&s1, -dbl - x))
		stats_diag("after", &s1);
	dbl += x;

	/* RLIMIT_MEMLOCK is enforced for peer memory like for host memory. */
	peer_stats(CLIENT, &s0);
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(memlock_child());
	st = -1;
	waitpid(pid, &st, 0);
	peer_stats(CLIENT, &s1);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "without CAP_IPC_LOCK and 64 KiB RLIMIT_MEMLOCK, a 256 KiB peer MR fails with ENOMEM and a 64 KiB one works (child status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	ok(s1.alloc_mrs == s0.alloc_mrs + 1 && peer_stats_settled(&s1, -dbl) &&
	   rc_all_idle(), "the refused registration never reached the client's pages");

	peer_stats_diag(CLIENT);
	/* rxe's non-zero counters since boot: retries show a loaded machine. */
	run("cd /sys/class/infiniband/" RXE_DEV "/ports/1/hw_counters && grep -H . * | grep -v ':0$' | tr '\\n' ' ' | sed 's/^/# rxe: /; s/$/\\n/'");
	if (!cfg->invalidate && !use_gpusim) {
		/*
		 * Unregistration waits for the umems: pinned memory whose
		 * mapping and file are gone keeps an MR alive; rmmod then
		 * blocks in ib_unregister_peer_memory_client() until the MR
		 * is deregistered.
		 */
		uint8_t *q = src_alloc(fd, PEER_LEN, &ph);
		struct ibv_mr *qmr;
		int waited = 0;

		if (!q)
			bail("cannot allocate peer memory: %s", strerror(errno));
		fill(q, PEER_LEN, 0x4242);
		memcpy(saved, q, PEER_LEN);
		qmr = ibv_reg_mr(c.pd, q, PEER_LEN, MR_ACCESS);
		munmap(q, PEER_LEN);
		close(fd);
		fd = -1;
		ok(qmr && rc_all_idle() == 0, "an MR pins memory that is no longer mapped");
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			execlp("rmmod", "rmmod", "peer_refclient", (char *)NULL);
			_exit(127);
		}
		sleep(3);
		ok(waitpid(pid, &st, WNOHANG) == 0 &&
		   access("/sys/module/peer_refclient", F_OK) == 0,
		   "rmmod blocks while the MR uses the client");
		rc = qmr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, 65536,
				   (uintptr_t)q, qmr->rkey) : -1;
		ok(rc == 0 && !memcmp(hbuf, saved, 65536),
		   "the MR still works meanwhile (status %d)", rc);
		if (qmr)
			ibv_dereg_mr(qmr);
		ibv_dereg_mr(hmr);
		{
			double end = now_s() + slow_s(60);

			while (waitpid(pid, &st, WNOHANG) == 0 && now_s() < end)
				usleep(100000);
			waited = now_s() < end;
		}
		ok(waited && WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
		   access("/sys/module/peer_refclient", F_OK) != 0,
		   "deregistering the MR lets rmmod finish");
		conn_close(&c);
	} else {
		ibv_dereg_mr(hmr);
		conn_close(&c);
		close(fd);
		ok(rc_all_idle(), "client: no allocation, pin or mapping left");
		rc = run("rmmod peer_refclient");
		ok(rc == 0 && access("/sys/kernel/debug/peer_memory/" CLIENT, F_OK) != 0,
		   "rmmod unregisters the client and removes its statistics");
	}
	ok(run("dmesg | grep -Eq 'peer_refclient: (leaked|.*before|.*did not fill|.*still pinned|.*another device)'") != 0,
	   "the client saw every call in order and reported no leak at unload");
	return finish();
}

#endif /* REFCLIENT_SUITE_H */
