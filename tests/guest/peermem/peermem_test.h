/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_test.h - helpers of the peermem guest tests: loading gpusim and
 * peermem, peermem's and gpusim's debugfs counters, gpusim allocations,
 * the core's umem_test hook.
 * TAP output, rxe0 and the RC loopback come from the core tests'
 * core_test.h (used as is).
 *
 * The tests run as root in the rig VM (scripts/vm.sh) with PEERMEM_ROOT
 * set. They load $PEERMEM_ROOT/tests/gpusim/gpusim.ko (GPUSIM_KO= to use
 * another) and $PEERMEM_ROOT/peermem.ko (PEERMEM_KO=); the reference client
 * is unloaded first, as it would claim gpusim memory too.
 */
#ifndef PEERMEM_TEST_H
#define PEERMEM_TEST_H

#include <pthread.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>

#include "../core/core_test.h"
#include "../../gpusim/gpusim_uapi.h"

#define PMDBG "/sys/kernel/debug/peermem/"	/* counters of nv_mem (and knobs) */
#define PMDBG_NC PMDBG "nc/"			/* counters of nv_mem_nc */
#define GSDBG "/sys/kernel/debug/gpusim/"
#ifndef UMEM_TEST
#define UMEM_TEST "/sys/kernel/debug/peer_memory/umem_test"
#endif
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		   IBV_ACCESS_REMOTE_READ)
#define GPU_PAGE ((uint64_t)GPUSIM_GPU_PAGE_SIZE)

/*
 * The client that serves memory registrations (ibv_reg_mr): the
 * invalidating one (peer_name, nv_mem by default), or with
 * enable_invalidate=0 the non-invalidating one (peer_name + "_nc"). pm()
 * reads its counters. pm_nc_name: the non-invalidating client ("" with
 * enable_nc=0), whose counters pm_nc() reads.
 */
static char pm_name[64], pm_nc_name[64];
static const char *pm_dir = PMDBG;

static const char *root_dir(void)
{
	return getenv("PEERMEM_ROOT") ?: ".";
}

/* A counter of the client whose debugfs directory is dir; -1 if unreadable. */
static long long pmc(const char *dir, const char *counter)
{
	return read_ll("%s%s", dir, counter);
}

/* A counter of the MR client (pm_name); -1 if unreadable. */
static long long pm(const char *counter)
{
	return pmc(pm_dir, counter);
}

/* A counter of the non-invalidating client; -1 if unreadable. */
static long long pm_nc(const char *counter)
{
	return pmc(PMDBG_NC, counter);
}

/* What exists right now, derived from the monotonic counters. */
static long long pmc_live_regs(const char *dir)
{
	return pmc(dir, "registrations_acquired") - pmc(dir, "registrations_released");
}

static long long pmc_live_pins(const char *dir)
{
	return pmc(dir, "page_tables_pinned") - pmc(dir, "page_tables_unpinned");
}

static long long pmc_live_maps(const char *dir)
{
	return pmc(dir, "dma_maps") - pmc(dir, "dma_unmaps");
}

static long long pmc_live_objects(const char *dir)
{
	return pmc(dir, "objects_created") - pmc(dir, "objects_freed");
}

static long long pm_live_regs(void)
{
	return pmc_live_regs(pm_dir);
}

static long long pm_live_pins(void)
{
	return pmc_live_pins(pm_dir);
}

static long long pm_live_maps(void)
{
	return pmc_live_maps(pm_dir);
}

static long long pm_live_objects(void)
{
	return pmc_live_objects(pm_dir);
}

/*
 * Drops peermem's watch-pin cache: deregistered nv_mem ranges whose pin
 * with the free callback peermem keeps for the next registration of the
 * range by the same process (docs/module.md, "The watch-pin cache").
 * "Nothing pinned" is checked after it; what the cache itself does is
 * t_peermem_wcache's. Nothing happens without the file (an older module).
 */
static void pm_flush(void)
{
	write_str(PMDBG "watch_cache_flush", "1");
}

/* Entries in the watch-pin cache right now. */
static long long pm_cached(void)
{
	return pmc(PMDBG, "watch_cache_parked") - pmc(PMDBG, "watch_cache_hits") -
	       pmc(PMDBG, "watch_cache_evicted");
}

/* The client of directory dir holds nothing (and its counters are readable). */
static int pmc_idle(const char *dir)
{
	pm_flush();
	return pmc(dir, "registrations_acquired") >= 0 &&
	       pmc_live_regs(dir) == 0 && pmc_live_pins(dir) == 0 &&
	       pmc_live_maps(dir) == 0 && pmc_live_objects(dir) == 0 &&
	       pmc(dir, "pages_pinned") == pmc(dir, "pages_unpinned") &&
	       pmc(dir, "bytes_pinned") == pmc(dir, "bytes_unpinned") &&
	       pmc(dir, "keeper_pins") == pmc(dir, "keeper_unpins");
}

/*
 * nv_mem's keeper pins (persistent pins beside the pin with the free
 * callback) held right now. A free callback only queues the revocation:
 * the core's invalidate, the unmap and the keeper's put follow in a work
 * item, so after a GPU free returns wait for this to drop before
 * expecting the MR revoked (docs/architecture.md, "The keeper").
 */
static long long pm_live_keepers(void)
{
	return pm("keeper_pins") - pm("keeper_unpins");
}

static int pm_no_keepers(void)
{
	return pm_live_keepers() == 0;
}

/* Neither of peermem's clients holds anything. */
static int pm_idle(void)
{
	return pmc_idle(PMDBG) && pmc_idle(PMDBG_NC);
}

static void pmc_diag(const char *what, const char *dir)
{
	diag("peermem %s: acquired %lld declined %lld released %lld pins %lld/%lld maps %lld/%lld objects %lld/%lld sg %lld->%lld free_cb %lld inval %lld errors %lld",
	     what, pmc(dir, "registrations_acquired"), pmc(dir, "registrations_declined"),
	     pmc(dir, "registrations_released"), pmc(dir, "page_tables_pinned"),
	     pmc(dir, "page_tables_unpinned"), pmc(dir, "dma_maps"), pmc(dir, "dma_unmaps"),
	     pmc(dir, "objects_created"), pmc(dir, "objects_freed"),
	     pmc(dir, "sg_entries_uncoalesced"), pmc(dir, "sg_entries_coalesced"),
	     pmc(dir, "free_callbacks"), pmc(dir, "invalidations_gpu_free"), pmc(dir, "errors"));
}

static void pm_diag(void)
{
	pmc_diag("nv_mem", PMDBG);
	pmc_diag("nv_mem_nc", PMDBG_NC);
}

/*
 * The core's per-client counters follow OFED's (docs/core.md):
 * num_reg_pages adds the entries of each table, num_dereg_pages never
 * moves, num_dealloc_mrs counts a mapping when it stops being mapped
 * (deregistered or invalidated), num_dereg_bytes when its umem is unmapped
 * (at deregistration; for an invalidated one at its release, twice if the
 * invalidation came after the release began).
 */

/* Every mapping the core made through the client stopped being mapped. */
static int core_none_mapped(const struct peer_stats *s)
{
	return s->alloc_mrs >= 0 && s->alloc_mrs == s->dealloc_mrs;
}

/* ... and every umem it made through the client was released. */
static int core_all_released(const struct peer_stats *s)
{
	return core_none_mapped(s) && s->dereg_bytes >= s->reg_bytes;
}

static long long gs(const char *what)
{
	return read_ll(GSDBG "%s", what);
}

/*
 * gpusim has nothing allocated, pinned, mapped or held, and no put was
 * ignored since the last load_modules(): gpusim, as NVIDIA's driver, ignores
 * a put of a pin with a free callback from any process but the pinning one
 * (foreign_puts), and peermem never makes one.
 */
static int gs_idle(void)
{
	return gs("live_allocs") == 0 && gs("live_pins") == 0 &&
	       gs("live_dma_mappings") == 0 && gs("live_vmas") == 0 &&
	       gs("live_mem_bytes") == 0 && gs("foreign_puts") == 0;
}

static void gs_diag(void)
{
	diag("gpusim: allocs %lld pins %lld (persistent %lld) dma %lld vmas %lld mem %lld free_cb %lld stale %lld reaped %lld foreign_puts %lld",
	     gs("live_allocs"), gs("live_pins"), gs("live_persistent_pins"),
	     gs("live_dma_mappings"), gs("live_vmas"), gs("live_mem_bytes"),
	     gs("free_callbacks"), gs("stale_calls"), gs("dma_reaped"), gs("foreign_puts"));
}

static int gs_knob(const char *knob, const char *val)
{
	char path[256];

	snprintf(path, sizeof(path), GSDBG "%s", knob);
	return write_str(path, val);
}

/* Reset gpusim's knobs to their defaults. */
static void gs_defaults(void)
{
	gs_knob("delay_us", "0");
	gs_knob("contig_bytes", "65536");
	/* GPUSIM_STALE_ERRNO=22: run with the refusing variant (default 0, the 550 driver's answer). */
	gs_knob("stale_errno", getenv("GPUSIM_STALE_ERRNO") ?: "0");
	/*
	 * gpusim's RM lock, held as NVIDIA's driver holds RM's locks (across
	 * get_pages*, put_pages*, dma_map_pages and a whole free with its
	 * callbacks): on by default, as the driver is. GPUSIM_RM_LOCK=0 runs
	 * without it (the orders the real driver never produces, e.g. a
	 * callback after its put returned). peermem's free callback waits
	 * for nothing that waits for the driver (docs/architecture.md, "Locking").
	 */
	gs_knob("rm_lock", getenv("GPUSIM_RM_LOCK") ?: "1");
	gs_knob("fail_errno", "12");
	/* The pin-cost model (docs/gpusim.md, "Pin cost"): off, the rig's default. */
	gs_knob("pin_call_us", "0");
	gs_knob("pin_page_ns", "0");
	/* BAR1 (docs/gpusim.md, "BAR1"): 1 GiB, dynamic against 16 GiB of FB. */
	gs_knob("bar1_mib", "1024");
	gs_knob("bar1_mode", "0");
	gs_knob("fb_mib", "16384");
	gs_knob("reset_totals", "1");
}

/* Wait up to secs for cond() (the core and the callbacks may lag a little). */
static int wait_for(int (*cond)(void), double secs)
{
	double end = now_s() + slow_s(secs);

	while (!cond()) {
		if (now_s() > end)
			return 0;
		usleep(20000);
	}
	return 1;
}

static int all_idle(void)
{
	return pm_idle() && gs_idle();
}

/* Idle, except for CPU mappings of freed allocations (gmem_drop removes them). */
static int idle_but_vmas(void)
{
	return pm_idle() && gs("live_allocs") == 0 && gs("live_pins") == 0 &&
	       gs("live_dma_mappings") == 0;
}

/* A Y/N parameter of the loaded peermem. */
static int pm_param_on(const char *param)
{
	char path[128], v[8] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/sys/module/peermem/parameters/%s", param);
	f = fopen(path, "r");
	if (!f || !fgets(v, sizeof(v), f))
		bail("cannot read peermem's parameter %s", param);
	fclose(f);
	return v[0] == 'Y' || v[0] == '1';
}

/*
 * Load gpusim (if needed) and peermem with module arguments args (reloading
 * peermem if it is loaded); the reference client goes first. Bails out on
 * failure. Sets pm_name, pm_nc_name and pm_dir.
 */
/*
 * The host side of a test on gpusim memory: an RC loopback on rxe in *c,
 * /dev/gpusim opened (the fd is returned) and a zeroed host buffer of len
 * bytes registered in *h / *hmr. Bails out on any failure.
 */
static int gpusim_and_host_mr(struct conn *c, size_t len, uint8_t **h, struct ibv_mr **hmr)
{
	int fd;

	if (conn_open(c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	*h = aligned_alloc(4096, len);
	if (fd < 0 || !*h)
		bail("cannot open /dev/gpusim or allocate host memory");
	memset(*h, 0, len);
	*hmr = ibv_reg_mr(c->pd, *h, len, MR_ACCESS);
	if (!*hmr)
		bail("host MR failed: %s", strerror(errno));
	return fd;
}

/*
 * rmmod peermem, after giving back this process's cached watch pins: only
 * the process that pinned one can (NVIDIA's driver ignores a put from
 * elsewhere), so peermem's unload waits for the pins of a live process
 * until it frees the memory or exits, and rmmod run by that very process
 * would wait for itself.
 */
static int pm_rmmod(void)
{
	pm_flush();
	return run("rmmod peermem");
}

static void load_modules(const char *args)
{
	/*
	 * PEERMEM_EXTRA_ARGS: more module arguments for every load (a run of
	 * a program under another configuration, e.g. watch_cache=0; on
	 * request, docs/testing.md).
	 */
	const char *extra = getenv("PEERMEM_EXTRA_ARGS") ?: "";
	char ko[512];
	FILE *f;

	if (access("/sys/module/peer_refclient", F_OK) == 0 &&
	    run("rmmod peer_refclient"))
		bail("cannot unload the reference client (it would claim gpusim memory)");
	if (access("/sys/module/gpusim", F_OK) != 0) {
		if (getenv("GPUSIM_KO"))
			snprintf(ko, sizeof(ko), "%s", getenv("GPUSIM_KO"));
		else
			snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root_dir());
		if (access(ko, R_OK))
			bail("%s is missing: build it with make -C tests/gpusim", ko);
		/* GPUSIM_ARGS: gpusim's module arguments (e.g. rm_lock=0). */
		if (run("insmod %s %s", ko, getenv("GPUSIM_ARGS") ?: ""))
			bail("cannot load gpusim %s", getenv("GPUSIM_ARGS") ?: "");
	}
	gs_defaults();
	if (access("/sys/module/peermem", F_OK) == 0 && pm_rmmod())
		bail("cannot unload the loaded peermem");
	if (getenv("PEERMEM_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("PEERMEM_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	if (access(ko, R_OK))
		bail("%s is missing: build it with make KDIR=...", ko);
	if (run("insmod %s %s %s", ko, args ? args : "", extra))
		bail("insmod peermem.ko %s %s failed", args ? args : "", extra);
	f = fopen("/sys/module/peermem/parameters/peer_name", "r");
	if (!f || !fgets(pm_name, sizeof(pm_name), f))
		bail("cannot read peermem's peer_name");
	fclose(f);
	pm_name[strcspn(pm_name, "\n")] = 0;
	pm_nc_name[0] = 0;
	if (pm_param_on("enable_nc"))
		snprintf(pm_nc_name, sizeof(pm_nc_name), "%.60s_nc", pm_name);
	pm_dir = PMDBG;
	if (!pm_param_on("enable_invalidate")) {
		/* The non-invalidating client takes the registrations. */
		snprintf(pm_name, sizeof(pm_name), "%s", pm_nc_name);
		pm_dir = PMDBG_NC;
	}
}

/* The serving client's core counters show every MR released (peer_stats_balanced). */
static int pm_balanced(void)
{
	struct peer_stats s;

	return !peer_stats(pm_name, &s) && peer_stats_balanced(&s);
}

/* Register [p, p + len) and deregister it at once: 0, or errno. */
static int reg_dereg(struct conn *c, void *p, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(c->pd, p, len, MR_ACCESS);

	if (!mr)
		return errno;
	return ibv_dereg_mr(mr) ? EIO : 0;
}

/* A gpusim allocation of len bytes mapped in this process. */
struct gmem {
	uint8_t *p;
	uint64_t handle;
	size_t len;
	uint32_t chunk;
};

/* A gpusim allocation of len bytes, mapped at addr (64 KiB aligned) or, for NULL, anywhere. */
static int gmem_alloc_at(int fd, size_t len, void *addr, struct gmem *g)
{
	struct gpusim_alloc a = { .size = len, .addr = (uintptr_t)addr };

	memset(g, 0, sizeof(*g));
	if (ioctl(fd, GPUSIM_IOC_ALLOC, &a))
		return -errno;
	g->p = (uint8_t *)(uintptr_t)a.addr;
	g->handle = a.handle;
	g->len = len;
	g->chunk = a.chunk_bytes;
	return 0;
}

static int gmem_alloc(int fd, size_t len, struct gmem *g)
{
	return gmem_alloc_at(fd, len, NULL, g);
}

/*
 * In a forked child: its own /dev/gpusim (returned), RC loopback in *cc and
 * allocation of len bytes in *gc; exits with status 2 if any fails.
 */
static int child_own_gpu(struct conn *cc, size_t len, struct gmem *gc)
{
	int f = open("/dev/gpusim", O_RDWR);

	if (f < 0 || conn_open(cc) || gmem_alloc(f, len, gc))
		_exit(2);
	return f;
}

/*
 * Child of an exit test: registers len bytes of GPU memory (filled with
 * seed), reads from it once, and returns 0 to exit holding the MR and the
 * memory; gpusim_first: open /dev/gpusim before uverbs (the other order
 * of teardown at exit). Non-zero: which step failed.
 */
static int exit_child(int gpusim_first, size_t len, uint32_t seed)
{
	struct ibv_mr *mr;
	struct conn cc;
	struct gmem g;
	int fd = -1;

	if (gpusim_first)
		fd = open("/dev/gpusim", O_RDWR);
	if (conn_open(&cc))
		return 20;
	if (!gpusim_first)
		fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0 || gmem_alloc(fd, len, &g))
		return 21;
	fill(g.p, len, seed);
	mr = ibv_reg_mr(cc.pd, g.p, len, MR_ACCESS);
	if (!mr)
		return 22;
	if (rdma_op(&cc, IBV_WR_RDMA_READ, mr, g.p, 4096, (uintptr_t)g.p + 8192, mr->rkey))
		return 23;
	return 0;
}

/* Fork, run exit_child() in the child and reap it: its exit status, or -1. */
static int exit_child_run(int gpusim_first, size_t len, uint32_t seed)
{
	int st = -1;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(exit_child(gpusim_first, len, seed));
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Free it (what cudaFree is to a GPU); the CPU mapping stays until gmem_drop. */
static int gmem_free(int fd, struct gmem *g)
{
	struct gpusim_free f = { .handle = g->handle };

	return ioctl(fd, GPUSIM_IOC_FREE, &f) ? -errno : 0;
}

static void gmem_drop(struct gmem *g)
{
	if (g->p)
		munmap(g->p, g->len);
	g->p = NULL;
}

/* Read the first line of a file into buf (newline removed); -1 if unreadable. */
static int read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	buf[0] = 0;
	if (!f)
		return -1;
	if (!fgets(buf, len, f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* dmesg mentions pattern (an extended regex) since the mark. */
static int dmesg_has(const char *pattern)
{
	return run("dmesg | grep -Eq '%s'", pattern) == 0;
}

/* A thread that frees GPU memory after a delay, racing the caller. */
struct race {
	int fd;
	struct gmem g;
	useconds_t free_after;
	int free_ret;
};

static void *race_free(void *arg)
{
	struct race *r = arg;

	usleep(r->free_after);
	r->free_ret = gmem_free(r->fd, &r->g);
	return NULL;
}

/*
 * The core's rig-only umem_test hook (debugfs peer_memory/umem_test): an
 * open file holds at most one umem of the writer's range, got as a driver
 * gets its queue buffers (kind "queue": ib_umem_get_peer(..., 0), only
 * non-invalidating clients are asked) or an MR ("mr": IB_PEER_MEM_INVAL_SUPP),
 * until it is closed.
 */
struct umem_info {
	char client[64];	/* "none", "pinned" (not peer memory) or the client's name */
	char kind[16];
	long long nents, page_size, dma_bytes, translated;
	int invalidated;
	int first_ok;		/* first= was read through the bus address */
	uint64_t first;		/* the u64 at the umem's address, as the device reads it */
};

static int umem_open(void)
{
	int f = open(UMEM_TEST, O_RDWR);

	return f < 0 ? -errno : f;
}

/* Get a umem of [addr, addr + len) of kind on ibdev: 0 or -errno. */
static int umem_get(int f, const char *ibdev, const void *addr, size_t len, const char *kind)
{
	char line[128];
	ssize_t n;

	snprintf(line, sizeof(line), "%s %#llx %#zx %s", ibdev,
		 (unsigned long long)(uintptr_t)addr, len, kind);
	n = write(f, line, strlen(line));
	if (n < 0)
		return -errno;
	return n == (ssize_t)strlen(line) ? 0 : -EIO;
}

/* What the umem of f looks like now: 0, or -1 if the line does not parse. */
static int umem_read(int f, struct umem_info *u)
{
	char line[512], first[40] = "";
	ssize_t n;

	memset(u, 0, sizeof(*u));
	n = pread(f, line, sizeof(line) - 1, 0);
	if (n <= 0)
		return -1;
	line[n] = 0;
	if (sscanf(line, "client=%63s kind=%15s nents=%lld page_size=%lld dma_bytes=%lld translated=%lld invalidated=%d first=%39s",
		   u->client, u->kind, &u->nents, &u->page_size, &u->dma_bytes,
		   &u->translated, &u->invalidated, first) != 8) {
		diag("umem_test: unexpected line '%s'", line);
		return -1;
	}
	u->first_ok = strncmp(first, "none:", 5) != 0;
	u->first = strtoull(u->first_ok ? first : first + 5, NULL, 16);
	return 0;
}

static void umem_diag(const char *what, const struct umem_info *u)
{
	diag("%s: client=%s kind=%s nents=%lld page_size=%lld dma_bytes=%lld translated=%lld invalidated=%d first=%s%016llx",
	     what, u->client, u->kind, u->nents, u->page_size, u->dma_bytes, u->translated,
	     u->invalidated, u->first_ok ? "" : "none:", (unsigned long long)u->first);
}

/*
 * The calling thread's fail-nth (/proc/self/task/TID/fail-nth; the debug
 * rig's CONFIG_FAULT_INJECTION): fnth_setup() opens it and lets failslab
 * and fail_page_alloc fail any allocation of this thread, fnth_set(n) makes
 * its n-th allocation from now fail, fnth_take() resets it and returns what
 * was left (0: the fault was injected).
 */
static int fnth __attribute__((unused)) = -1;

static void fnth_set(int n)
{
	char b[16];
	int l = snprintf(b, sizeof(b), "%d", n);

	if (pwrite(fnth, b, l, 0) != l)
		bail("cannot write fail-nth: %s", strerror(errno));
}

static int fnth_take(void)
{
	char b[16] = "";
	int left;

	if (pread(fnth, b, sizeof(b) - 1, 0) <= 0)
		bail("cannot read fail-nth: %s", strerror(errno));
	left = atoi(b);
	fnth_set(0);
	return left;
}

static void fnth_setup(void)
{
	char p[64];

	run("echo N > /sys/kernel/debug/failslab/ignore-gfp-wait");
	run("echo 0 > /sys/kernel/debug/failslab/verbose");
	run("echo N > /sys/kernel/debug/fail_page_alloc/ignore-gfp-wait");
	run("echo N > /sys/kernel/debug/fail_page_alloc/ignore-gfp-highmem");
	run("echo 0 > /sys/kernel/debug/fail_page_alloc/min-order");
	run("echo 0 > /sys/kernel/debug/fail_page_alloc/verbose");
	snprintf(p, sizeof(p), "/proc/self/task/%ld/fail-nth", (long)syscall(SYS_gettid));
	fnth = open(p, O_RDWR);
	if (fnth < 0)
		bail("%s: %s (needs CONFIG_FAULT_INJECTION, the debug rig kernel)", p, strerror(errno));
}

#endif /* PEERMEM_TEST_H */
