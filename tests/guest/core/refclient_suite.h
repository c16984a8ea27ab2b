/* SPDX-License-Identifier: GPL-2.0 */
/*
 * refclient_suite.h - the peer-memory core tests, run against the reference
 * client (tests/refclient) loaded with one configuration. Each t_refclient_*
 * program runs this suite with its own module parameters.
 */
#ifndef REFCLIENT_SUITE_H
#define REFCLIENT_SUITE_H

#include <linux/capability.h>
#include <sys/ioctl.h>

#include "core_test.h"
#include "../../gpusim/gpusim_uapi.h"

struct suite_cfg {
	int invalidate;		/* register with an invalidate callback */
	int unmaps;		/* PEER_MEM_INVALIDATE_UNMAPS */
	int page_kb;		/* client page size */
	int cpu_pages;		/* 0: dma_map fails for rxe */
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
		if (run("insmod %s", ko))
			bail("cannot load gpusim");
	}
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

static int run_refclient_suite(const struct suite_cfg *cfg)
{
	struct peer_stats s0, s1;
	struct ibv_mr *hmr, *pmr, *smr;
	struct conn c;
	uint8_t *hbuf, *p, *saved;
	long pin0, pin1;
	long long t, v;
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
	ok(read_ll("/sys/kernel/mm/memory_peers/" CLIENT "/num_alloc_mrs") == 0,
	   "OFED sysfs directory /sys/kernel/mm/memory_peers/" CLIENT " exists");

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

	if (!cfg->cpu_pages) {
		pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		rc = errno;
		peer_stats(CLIENT, &s1);
		ok(!pmr && rc == EOPNOTSUPP,
		   "ibv_reg_mr on memory without CPU pages fails with EOPNOTSUPP for rxe (errno %d)",
		   rc);
		ok(s1.alloc_mrs == 0 && rc_live("live_pins") == 0 &&
		   rc_live("live_maps") == 0,
		   "the failed registration left nothing pinned or mapped");
		if (pmr)
			ibv_dereg_mr(pmr);
		src_free(fd, p, PEER_LEN, ph);
		src_drop(p, PEER_LEN);
		goto out;
	}

	/* A whole peer allocation. */
	fill(p, PEER_LEN, 0x1111);
	pin0 = vm_pin_kb();
	pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
	ok(pmr != NULL, "ibv_reg_mr on VM_PFNMAP peer memory succeeds (errno %d)",
	   pmr ? 0 : errno);
	if (!pmr)
		bail("peer MR failed; the core or rxe wiring is broken");
	peer_stats(CLIENT, &s1);
	ok(s1.alloc_mrs == 1 && s1.reg_pages == (long long)(PEER_LEN / 4096) &&
	   s1.reg_bytes == (long long)PEER_LEN,
	   "counters: num_alloc_mrs 1, num_reg_pages %lu, num_reg_bytes %lu",
	   PEER_LEN / 4096, PEER_LEN);
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
		/* [69632, 172032) in 4 KiB pages */
		long long want = (((uintptr_t)p + 170000 + 4095) / 4096) -
				 ((uintptr_t)p + 70000) / 4096;

		ok(smr && s1.alloc_mrs == 2 &&
		   s1.reg_pages == (long long)(PEER_LEN / 4096) + want &&
		   s1.reg_bytes == (long long)PEER_LEN + 100000,
		   "unaligned sub-range MR [+70000, +100000): %lld pages, 100000 bytes (got %lld)",
		   want, s1.reg_pages - (long long)(PEER_LEN / 4096));
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
	   s1.free_callbacks == 0,
	   "counters balanced after deregistration (no invalidation)");
	ok(rc_live("live_pins") == 0 && rc_live("live_maps") == 0,
	   "the core put every page back");
	ok(vm_pin_kb() == pin0, "VmPin back to %ld KiB", pin0);

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
		ok(rc == 0 && s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   peer_stats_balanced(&s1) && rc_live("live_pins") == 0,
		   "invalidating its ticket unmaps it at once (%s)",
		   cfg->unmaps ? "the client puts the pages" :
				 "the core puts the pages");
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
		   "nothing left pinned or mapped");

		/*
		 * An invalidation that reaches the core between get_pages()
		 * and the moment rxe's MR is live: it waits for the mapping
		 * lock, then revokes the fresh MR.
		 */
		fill(p, PEER_LEN, 0x6767);
		memcpy(saved, p, PEER_LEN);
		peer_stats(CLIENT, &s0);
		rc = write_str(RDBG "race_invalidate", "1");
		pmr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		ok(rc == 0 && pmr != NULL,
		   "registration succeeds with an invalidation of it in flight");
		{
			double end = now_s() + 20;

			do {
				peer_stats(CLIENT, &s1);
				if (s1.invalidated_mrs > s0.invalidated_mrs &&
				    peer_stats_balanced(&s1))
					break;
				usleep(50000);
			} while (now_s() < end);
		}
		ok(s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   s1.alloc_mrs == s0.alloc_mrs + 1 && peer_stats_balanced(&s1),
		   "the early invalidation was held until the MR was live, then revoked it");
		if (s1.invalidated_mrs != s0.invalidated_mrs + 1 ||
		    s1.alloc_mrs != s0.alloc_mrs + 1 || !peer_stats_balanced(&s1)) {
			diag("before:");
			diag("  alloc %lld dealloc %lld invalidated %lld free_cb %lld",
			     s0.alloc_mrs, s0.dealloc_mrs, s0.invalidated_mrs,
			     s0.free_callbacks);
			peer_stats_diag(CLIENT);
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
	ok(src_free(fd, p, PEER_LEN, ph) == 0, "%s frees the peer memory",
	   use_gpusim ? "GPUSIM_IOC_FREE" : "munmap");
	if (cfg->invalidate) {
		/* refmem invalidates from a work item after the munmap. */
		double end = now_s() + 20;

		do {
			peer_stats(CLIENT, &s1);
			if (s1.invalidated_mrs > s0.invalidated_mrs && src_freed())
				break;
			usleep(50000);
		} while (now_s() < end);
		ok(s1.free_callbacks == s0.free_callbacks + 1 &&
		   s1.invalidated_mrs == s0.invalidated_mrs + 1 &&
		   peer_stats_balanced(&s1),
		   "the free invalidated the live MR through the core");
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
	ok(peer_stats_balanced(&s1) && rc_all_idle(),
	   "after deregistration nothing is allocated, pinned or mapped");

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
	{
		double end = now_s() + 30;

		do {
			peer_stats(CLIENT, &s1);
			if (s1.alloc_mrs == s0.alloc_mrs + 1 &&
			    peer_stats_balanced(&s1) && rc_all_idle())
				break;
			usleep(100000);
		} while (now_s() < end);
	}
	ok(s1.alloc_mrs == s0.alloc_mrs + 1 && peer_stats_balanced(&s1) &&
	   rc_all_idle(),
	   "process exit releases the MR and the memory");
	/*
	 * Whether the memory went first (the MR is invalidated) or the uverbs
	 * file (a plain deregistration) depends on the order of teardown;
	 * either way everything must be released.
	 */
	diag("exit: %lld invalidation(s)", s1.invalidated_mrs - s0.invalidated_mrs);

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
	ok(s1.alloc_mrs == s0.alloc_mrs + 1 && peer_stats_balanced(&s1) &&
	   rc_all_idle(), "the refused registration never reached the client's pages");

out:
	peer_stats_diag(CLIENT);
	if (!cfg->invalidate && !use_gpusim && cfg->cpu_pages) {
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
			double end = now_s() + 60;

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
	ok(run("dmesg | grep -Eq 'peer_refclient: (leaked|.*before|.*did not fill|.*still pinned)'") != 0,
	   "the client saw every call in order and reported no leak at unload");
	return finish();
}

#endif /* REFCLIENT_SUITE_H */
