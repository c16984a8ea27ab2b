// SPDX-License-Identifier: GPL-2.0
/*
 * common.c - the client-adapter table of the end-to-end test and the
 * gpusim memory helpers (shared by the test and the demo program).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "e2e.h"
#include "../../gpusim/gpusim_uapi.h"

/*
 * peermem (the module under test, ./peermem.ko) with its defaults: core
 * name nv_mem (the one NCCL looks for), invalidating. It links to gpusim's
 * nvidia_p2p_* directly. Its counters (rust/client/stats.rs) are monotonic pairs:
 * per MR one claimed range, one registration object, one page table
 * pinned with every GPU page of the range, one DMA mapping (rxe: CPU
 * pages, no IOMMU).
 */
static const struct e2e_live peermem_live[] = {
	{ "registrations_acquired", "registrations_released", 1, 0 },
	{ "objects_created", "objects_freed", 1, 0 },
	{ "page_tables_pinned", "page_tables_unpinned", 1, 0 },
	{ "pages_pinned", "pages_unpinned", 0, 1 },
	{ "bytes_pinned", "bytes_unpinned", 0, GPU_PAGE },
	{ "dma_maps", "dma_unmaps", 1, 0 },
	{ "keeper_pins", "keeper_unpins", 1, 0 },	/* nv_mem's keeper (issue 22) */
	{ NULL, NULL, 0, 0 },
};

/*
 * The reference C client (tests/refclient), gpusim source, invalidating,
 * unmapping itself after an invalidation (PEER_MEM_INVALIDATE_UNMAPS). Its
 * counters are live values: one page table pinned and one mapping per MR;
 * it allocates no memory of its own with source=gpusim.
 */
static const struct e2e_live refclient_live[] = {
	{ "live_pins", NULL, 1, 0 },
	{ "live_maps", NULL, 1, 0 },
	{ "live_allocs", NULL, 0, 0 },
	{ "live_mem_bytes", NULL, 0, 0 },
	{ NULL, NULL, 0, 0 },
};

/*
 * NVIDIA's nvidia-peermem, unmodified (built by tests/nvpeermem from
 * Debian's nvidia-open-kernel-dkms): registers nv_mem (invalidating,
 * PEER_MEM_INVALIDATE_UNMAPS) and nv_mem_nc, links to gpusim's
 * nvidia_p2p_*. It keeps no counters, but it takes a reference on its own
 * module for each range it acquires and drops it in release
 * (nvidia-peermem.c 550.163.01, nv_mem_acquire and nv_mem_release), so its
 * module's refcnt is the number of contexts it holds: one per MR.
 */
static const struct e2e_live nvpeermem_live[] = {
	{ "/sys/module/nvidia_peermem/refcnt", NULL, 1, 0 },
	{ NULL, NULL, 0, 0 },
};

/* Why a 595 run is skipped: its module is built only from an imported source. */
#define NVPM_ABSENT(mode)							\
	"nvidia-peermem 595.45.04, " mode ": tests/nvpeermem/595/nvidia-peermem.ko is not built: "	\
	"its source is not in $PEERMEM_CACHE/nvidia-src (NVIDIA's public open-gpu-kernel-modules "	\
	"is not reachable from CI; import it with tests/nvpeermem/build.sh --import-git DIR --tag 595.45.04)"

const struct e2e_client e2e_clients[] = {
	{
		.label = "peermem",
		.ko = "peermem.ko",
		.module = "peermem",
		.args = "",
		.core_name = "nv_mem",
		.dbg = "/sys/kernel/debug/peermem",
		.live = peermem_live,
		.live_what = "its debugfs counters",
		.sg_per_gpu_page = 0,	/* coalesces contiguous bus addresses */
		.keeper = 1,
	},
	{
		.label = "refclient",
		.ko = "tests/refclient/peer_refclient.ko",
		.module = "peer_refclient",
		.args = "name=refclient source=gpusim invalidate=1 unmaps=1",
		.core_name = "refclient",
		.dbg = "/sys/kernel/debug/peer_refclient",
		.live = refclient_live,
		.live_what = "its debugfs live_* values",
		.sg_per_gpu_page = 0,	/* dma_map_sgtable() may merge entries */
	},
	{
		.label = "nvpeermem",
		.ko = "tests/nvpeermem/nvidia-peermem.ko",
		.module = "nvidia_peermem",
		.args = "",
		.core_name = "nv_mem",
		.dbg = NULL,
		.live = nvpeermem_live,
		.live_what = "its module refcnt (one reference per acquired range)",
		.sg_per_gpu_page = 1,	/* nv_dma_map: one entry per GPU page */
	},
	/*
	 * nvidia-peermem 595.45.04 from NVIDIA's open-gpu-kernel-modules,
	 * unmodified, where its source was imported into the cache
	 * (tests/nvpeermem/build.sh --import-git; CI cannot reach NVIDIA's
	 * repository). Its default, persistent_api_support=1, registers only
	 * one client, the persistent ("nc") one, under the name nv_mem, with
	 * no invalidation callback: it pins with get_pages_persistent. Its
	 * acquire (nv_mem_acquire_nc) also takes a reference on its module
	 * per range, dropped in release, as 550's.
	 */
	{
		.label = "nvpeermem595",
		.ko = "tests/nvpeermem/595/nvidia-peermem.ko",
		.module = "nvidia_peermem",
		.args = "",
		.core_name = "nv_mem",
		.dbg = NULL,
		.live = nvpeermem_live,
		.live_what = "its module refcnt (one reference per acquired range)",
		.sg_per_gpu_page = 1,
		.persistent = 1,
		.version = "595.",
		.other_core = "nv_mem_nc",
		.other_core_present = 0,
		.absent_why = NVPM_ABSENT("persistent_api_support=1 (default)"),
	},
	/*
	 * The same module with persistent_api_support=0 (legacy): nv_mem
	 * invalidating with PEER_MEM_INVALIDATE_UNMAPS, registered first, so
	 * it takes every MR, plus the persistent nv_mem_nc, as 550.
	 */
	{
		.label = "nvpeermem595-legacy",
		.ko = "tests/nvpeermem/595/nvidia-peermem.ko",
		.module = "nvidia_peermem",
		.args = "persistent_api_support=0",
		.core_name = "nv_mem",
		.dbg = NULL,
		.live = nvpeermem_live,
		.live_what = "its module refcnt (one reference per acquired range)",
		.sg_per_gpu_page = 1,
		.persistent = 0,
		.version = "595.",
		.other_core = "nv_mem_nc",
		.other_core_present = 1,
		.absent_why = NVPM_ABSENT("persistent_api_support=0"),
	},
	{ .label = NULL },
};

const struct e2e_client *e2e_client_find(const char *label)
{
	const struct e2e_client *cl;

	for (cl = e2e_clients; cl->label; cl++)
		if (label && !strcmp(cl->label, label))
			return cl;
	fprintf(stderr, "unknown client '%s'; known clients:", label ? label : "");
	for (cl = e2e_clients; cl->label; cl++)
		fprintf(stderr, " %s", cl->label);
	fprintf(stderr, "\n");
	return NULL;
}

int gpu_alloc(struct gpu_buf *g, int fd, size_t len)
{
	struct gpusim_alloc a = { .size = len };

	memset(g, 0, sizeof(*g));
	g->fd = fd;
	if (ioctl(fd, GPUSIM_IOC_ALLOC, &a))
		return -errno;
	g->p = (uint8_t *)(uintptr_t)a.addr;
	g->len = len;
	g->handle = a.handle;
	return 0;
}

int gpu_free(struct gpu_buf *g)
{
	struct gpusim_free f = { .handle = g->handle };

	return ioctl(g->fd, GPUSIM_IOC_FREE, &f) ? -errno : 0;
}

void gpu_unmap(struct gpu_buf *g)
{
	if (g->p)
		munmap(g->p, g->len);
	g->p = NULL;
}

int read_line(char *buf, size_t len, const char *fmt, ...)
{
	char path[600];
	va_list ap;
	FILE *f;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	buf[0] = 0;
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, len, f))
		buf[0] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return (int)strlen(buf);
}

const char *e2e_root(void)
{
	static char root[512];
	const char *env = getenv("PEERMEM_ROOT");
	char exe[400];
	ssize_t n;

	if (root[0])
		return root;
	if (env && *env) {
		snprintf(root, sizeof(root), "%s", env);
		return root;
	}
	/* tests/guest/e2e/<exe> -> the repository */
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;
	snprintf(root, sizeof(root), "%s/../../../..", exe);
	return root;
}
