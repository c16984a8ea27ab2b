/* SPDX-License-Identifier: GPL-2.0 */
/*
 * gpusim_test.h - shared helpers of the gpusim guest tests: TAP output,
 * module loading, the debugfs knobs and counters, and thin wrappers of the
 * /dev/gpusim and /dev/gpusim_testclient ioctls.
 *
 * Every test: gs_setup() (loads gpusim and its test client if needed,
 * resets the knobs), its checks, then gs_finish(), which asserts that no
 * allocation, pin, DMA mapping, mapping or memory is left over, and
 * returns the exit status (non-zero if any check failed).
 */
#ifndef GPUSIM_TEST_H
#define GPUSIM_TEST_H

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../gpusim/gpusim_uapi.h"
#include "../../gpusim/testclient/gpusim_testclient.h"

#define GPU_PAGE ((uint64_t)GPUSIM_GPU_PAGE_SIZE)
#define DBG "/sys/kernel/debug/gpusim/"

#include "../tap.h"

/* ---- debugfs */

static long long dbg_get(const char *name)
{
	char path[256], buf[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), DBG "%s", name);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		bail("open %s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		bail("read %s", path);
	buf[n] = 0;
	return strtoll(buf, NULL, 0);
}

/* Returns 0 or -errno of the write (knobs validate what they accept). */
static int dbg_set(const char *name, long long v)
{
	char path[256], buf[64];
	int fd, len, ret = 0;

	snprintf(path, sizeof(path), DBG "%s", name);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		bail("open %s: %s", path, strerror(errno));
	len = snprintf(buf, sizeof(buf), "%lld\n", v);
	if (write(fd, buf, len) != len)
		ret = -errno;
	close(fd);
	return ret;
}

/* ---- modules */

/*
 * The repository: $PEERMEM_ROOT if it holds tests/gpusim, else derived from
 * this program's own path (<root>/tests/guest/gpusim/t_...).
 */
static const char *root_dir(void)
{
	static char root[512];
	const char *r = getenv("PEERMEM_ROOT");
	char probe[600];
	ssize_t n;
	int i;

	if (root[0])
		return root;
	if (r && *r) {
		snprintf(probe, sizeof(probe), "%s/tests/gpusim", r);
		if (access(probe, F_OK) == 0) {
			snprintf(root, sizeof(root), "%s", r);
			return root;
		}
	}
	n = readlink("/proc/self/exe", root, sizeof(root) - 1);
	root[n > 0 ? n : 0] = 0;
	for (i = 0; i < 4; i++) {	/* strip t_x, gpusim, guest, tests */
		char *slash = strrchr(root, '/');

		if (slash)
			*slash = 0;
	}
	if (!root[0])
		snprintf(root, sizeof(root), "/work/main");
	return root;
}

/* gpusim's module arguments for this run: $GPUSIM_ARGS (e.g. "rm_lock=0"). */
static const char *gpusim_args(void)
{
	return getenv("GPUSIM_ARGS") ?: "";
}

/* gpusim's rm_lock parameter when GPUSIM_ARGS does not set it. */
#define GPUSIM_RM_LOCK_DEFAULT 1

/* The rm_lock gpusim_args() asks for (0 or 1). */
static int gpusim_args_rm_lock(void)
{
	const char *a = strstr(gpusim_args(), "rm_lock=");

	if (!a)
		return GPUSIM_RM_LOCK_DEFAULT;
	a += strlen("rm_lock=");
	return !(*a == '0' || *a == 'n' || *a == 'N');
}

/* Load a module of the repo with module arguments @args. */
static int load_module_args(const char *rel, const char *args)
{
	char path[512];
	int fd, ret;

	snprintf(path, sizeof(path), "%s/%s", root_dir(), rel);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = syscall(SYS_finit_module, fd, args, 0);
	ret = ret ? -errno : 0;
	close(fd);
	return ret == -EEXIST ? 0 : ret;
}

/* Load a module of the repo; gpusim.ko gets gpusim_args(). */
static int load_module(const char *rel)
{
	return load_module_args(rel, strstr(rel, "/gpusim.ko") ? gpusim_args() : "");
}

static int module_loaded(const char *name)
{
	char path[256];

	snprintf(path, sizeof(path), "/sys/module/%s", name);
	return access(path, F_OK) == 0;
}

static void gs_reset_knobs(void)
{
	dbg_set("delay_us", 0);
	dbg_set("contig_bytes", 65536);
	dbg_set("stale_errno", 0);	/* the default: the 550 driver's answer */
	/* GPUSIM_RM_LOCK=0 runs the area without the RM lock (default on). */
	dbg_set("rm_lock", getenv("GPUSIM_RM_LOCK") ? atoi(getenv("GPUSIM_RM_LOCK")) : 1);
	dbg_set("cpu_cacheable", 0);	/* a discrete GPU behind PCIe (x86) */
	dbg_set("fail_errno", 12);
	dbg_set("max_alloc_bytes", 256 << 20);
	dbg_set("bar1_mib", 1024);	/* BAR1: 1 GiB, dynamic (docs/gpusim.md) */
	dbg_set("bar1_mode", 0);
	dbg_set("fb_mib", 16384);
	dbg_set("reset_totals", 1);	/* also disarms every fail/<entry> */
}

static void gs_setup(void)
{
	int ret;

	if (!module_loaded("gpusim")) {
		ret = load_module("tests/gpusim/gpusim.ko");
		if (ret)
			bail("load gpusim.ko from %s/tests/gpusim: %s (build it with make -C tests/gpusim)",
			     root_dir(), strerror(-ret));
	}
	if (!module_loaded("gpusim_testclient")) {
		ret = load_module("tests/gpusim/testclient/gpusim_testclient.ko");
		if (ret)
			bail("load gpusim_testclient.ko: %s", strerror(-ret));
	}
	if (access(DBG "live_pins", R_OK))
		bail("no %s (is debugfs mounted?)", DBG);
	gs_reset_knobs();
}

/* The NVIDIA driver branch gpusim emulates (module parameter branch). */
static int gs_branch(void)
{
	char buf[16] = "";
	int fd = open("/sys/module/gpusim/parameters/branch", O_RDONLY);

	if (fd < 0)
		bail("open /sys/module/gpusim/parameters/branch: %s", strerror(errno));
	if (read(fd, buf, sizeof(buf) - 1) <= 0)
		bail("read /sys/module/gpusim/parameters/branch");
	close(fd);
	return atoi(buf);
}

/* 1 if gpusim holds its emulated RM lock (module parameter rm_lock). */
static int gs_rm_lock(void)
{
	return dbg_get("rm_lock") == 1;
}

/* Everything gpusim hands out must be gone once a test has cleaned up. */
static void gs_check_zero(const char *when)
{
	static const char *const live[] = {
		"live_allocs", "live_pins", "live_persistent_pins",
		"live_dma_mappings", "live_vmas", "live_mem_bytes",
	};
	unsigned int i;

	for (i = 0; i < sizeof(live) / sizeof(live[0]); i++) {
		long long v = dbg_get(live[i]);

		ok(v == 0, "%s: %s is 0 (is %lld)", when, live[i], v);
	}
}

/*
 * Unload the test client and gpusim: a test unloads what it loads (the
 * runner fails one that leaves a module; the next test loads gpusim with
 * arguments of its own, e.g. another branch).
 */
static void gs_unload(void)
{
	static const char *const mods[] = { "gpusim_testclient", "gpusim" };

	for (size_t i = 0; i < sizeof(mods) / sizeof(mods[0]); i++) {
		int r;

		if (!module_loaded(mods[i]))
			continue;
		r = syscall(SYS_delete_module, mods[i], O_NONBLOCK) ? errno : 0;
		ok(r == 0, "unload %s at the end (%s)", mods[i], r ? strerror(r) : "done");
	}
}

static int gs_finish(void)
{
	gs_check_zero("at the end");
	gs_reset_knobs();
	gs_unload();
	return finish();
}

/* ---- /dev/gpusim */

static int gs_open(void)
{
	int fd = open("/dev/gpusim", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		bail("open /dev/gpusim: %s", strerror(errno));
	return fd;
}

/* Returns 0 or -errno; fills *a. */
static int gs_alloc_at(int fd, uint64_t size, uint64_t addr, struct gpusim_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->size = size;
	a->addr = addr;
	return ioctl(fd, GPUSIM_IOC_ALLOC, a) ? -errno : 0;
}

/* Allocates or bails; returns the address. */
static void *gs_alloc(int fd, uint64_t size, uint64_t *handle)
{
	struct gpusim_alloc a;
	int ret = gs_alloc_at(fd, size, 0, &a);

	if (ret)
		bail("GPUSIM_IOC_ALLOC of %llu bytes: %s", (unsigned long long)size, strerror(-ret));
	if (handle)
		*handle = a.handle;
	return (void *)(uintptr_t)a.addr;
}

static int gs_free(int fd, uint64_t handle)
{
	struct gpusim_free f = { .handle = handle };

	return ioctl(fd, GPUSIM_IOC_FREE, &f) ? -errno : 0;
}

static int gs_info(int fd, uint64_t handle, struct gpusim_info *i)
{
	memset(i, 0, sizeof(*i));
	i->handle = handle;
	return ioctl(fd, GPUSIM_IOC_INFO, i) ? -errno : 0;
}

/* ---- /dev/gpusim_testclient */

static int tc_open(void)
{
	int fd = open("/dev/gpusim_testclient", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		bail("open /dev/gpusim_testclient: %s", strerror(errno));
	return fd;
}

/* Issue a test-client command; returns the ioctl's -errno or 0. */
static int tc_cmd(int fd, unsigned long cmd, struct gpusim_tc_req *q)
{
	return ioctl(fd, cmd, q) ? -errno : 0;
}

/* Pin [va, va+len) of the calling process; returns nvidia_p2p_get_pages's
 * return value and fills *q (q->id is the registration). */
static int tc_get(int fd, const void *va, uint64_t len, uint32_t flags,
		  struct gpusim_tc_req *q)
{
	int ret;

	memset(q, 0, sizeof(*q));
	q->va = (uintptr_t)va;
	q->len = len;
	q->flags = flags;
	ret = tc_cmd(fd, GPUSIM_TC_GET, q);
	if (ret)
		bail("GPUSIM_TC_GET ioctl: %s", strerror(-ret));
	return q->ret;
}

/* Run an id-based command; bails if the registration is unknown. */
static int tc_id(int fd, unsigned long cmd, uint32_t id, uint32_t flags,
		 struct gpusim_tc_req *q)
{
	int ret;

	memset(q, 0, sizeof(*q));
	q->id = id;
	q->flags = flags;
	ret = tc_cmd(fd, cmd, q);
	if (ret)
		bail("test-client command %#lx on registration %u: %s", cmd, id, strerror(-ret));
	return q->ret;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void fill_pattern(void *p, size_t len, uint32_t seed)
{
	uint32_t *w = p;
	size_t i;

	for (i = 0; i < len / 4; i++)
		w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static int check_pattern(const void *p, size_t len, uint32_t seed)
{
	const uint32_t *w = p;
	size_t i;

	for (i = 0; i < len / 4; i++)
		if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
			return 0;
	return 1;
}

/* Modules other than the test client that hold gpusim (peermem, say). */
static inline int other_holders(void)
{
	DIR *d = opendir("/sys/module/gpusim/holders");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && strcmp(e->d_name, "gpusim_testclient")) {
			diag("gpusim is used by %s", e->d_name);
			n++;
		}
	closedir(d);
	return n;
}

#endif /* GPUSIM_TEST_H */
