/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_test.h - helpers of the peermem guest tests: loading gpusim and
 * peermem, peermem's and gpusim's debugfs counters, gpusim allocations.
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
#include <sys/ioctl.h>

#include "../core/core_test.h"
#include "../../gpusim/gpusim_uapi.h"

#define PMDBG "/sys/kernel/debug/peermem/"
#define GSDBG "/sys/kernel/debug/gpusim/"
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		   IBV_ACCESS_REMOTE_READ)
#define GPU_PAGE ((uint64_t)GPUSIM_GPU_PAGE_SIZE)

/* The name peermem registered with the core (its peer_name parameter). */
static char pm_name[64];

static const char *root_dir(void)
{
	return getenv("PEERMEM_ROOT") ?: ".";
}

/* A peermem counter; -1 if unreadable. */
static long long pm(const char *counter)
{
	return read_ll(PMDBG "%s", counter);
}

/* What exists right now, derived from the monotonic counters. */
static long long pm_live_regs(void)
{
	return pm("registrations_acquired") - pm("registrations_released");
}

static long long pm_live_pins(void)
{
	return pm("page_tables_pinned") - pm("page_tables_unpinned");
}

static long long pm_live_maps(void)
{
	return pm("dma_maps") - pm("dma_unmaps");
}

static long long pm_live_objects(void)
{
	return pm("objects_created") - pm("objects_freed");
}

static int pm_idle(void)
{
	return pm_live_regs() == 0 && pm_live_pins() == 0 &&
	       pm_live_maps() == 0 && pm_live_objects() == 0 &&
	       pm("pages_pinned") == pm("pages_unpinned") &&
	       pm("bytes_pinned") == pm("bytes_unpinned");
}

static void pm_diag(void)
{
	diag("peermem: acquired %lld declined %lld released %lld pins %lld/%lld maps %lld/%lld objects %lld/%lld sg %lld->%lld free_cb %lld inval %lld errors %lld",
	     pm("registrations_acquired"), pm("registrations_declined"),
	     pm("registrations_released"), pm("page_tables_pinned"),
	     pm("page_tables_unpinned"), pm("dma_maps"), pm("dma_unmaps"),
	     pm("objects_created"), pm("objects_freed"),
	     pm("sg_entries_uncoalesced"), pm("sg_entries_coalesced"),
	     pm("free_callbacks"), pm("invalidations_gpu_free"), pm("errors"));
}

static long long gs(const char *what)
{
	return read_ll(GSDBG "%s", what);
}

/* gpusim has nothing allocated, pinned, mapped or held. */
static int gs_idle(void)
{
	return gs("live_allocs") == 0 && gs("live_pins") == 0 &&
	       gs("live_dma_mappings") == 0 && gs("live_vmas") == 0 &&
	       gs("live_mem_bytes") == 0;
}

static void gs_diag(void)
{
	diag("gpusim: allocs %lld pins %lld (persistent %lld) dma %lld vmas %lld mem %lld free_cb %lld stale %lld reaped %lld",
	     gs("live_allocs"), gs("live_pins"), gs("live_persistent_pins"),
	     gs("live_dma_mappings"), gs("live_vmas"), gs("live_mem_bytes"),
	     gs("free_callbacks"), gs("stale_calls"), gs("dma_reaped"));
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
	gs_knob("stale_errno", "22");
	gs_knob("fail_errno", "12");
	gs_knob("reset_totals", "1");
}

/* Wait up to secs for cond() (the core and the callbacks may lag a little). */
static int wait_for(int (*cond)(void), double secs)
{
	double end = now_s() + secs;

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

/*
 * Load gpusim (if needed) and peermem with module arguments args (reloading
 * peermem if it is loaded); the reference client goes first. Bails out on
 * failure. Sets pm_name.
 */
static void load_modules(const char *args)
{
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
		if (run("insmod %s", ko))
			bail("cannot load gpusim");
	}
	gs_defaults();
	if (access("/sys/module/peermem", F_OK) == 0 && run("rmmod peermem"))
		bail("cannot unload the loaded peermem");
	if (getenv("PEERMEM_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("PEERMEM_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/peermem.ko", root_dir());
	if (access(ko, R_OK))
		bail("%s is missing: build it with make KDIR=...", ko);
	if (run("insmod %s %s", ko, args ? args : ""))
		bail("insmod peermem.ko %s failed", args ? args : "");
	f = fopen("/sys/module/peermem/parameters/peer_name", "r");
	if (!f || !fgets(pm_name, sizeof(pm_name), f))
		bail("cannot read peermem's peer_name");
	fclose(f);
	pm_name[strcspn(pm_name, "\n")] = 0;
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

#endif /* PEERMEM_TEST_H */
