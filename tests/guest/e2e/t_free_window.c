// SPDX-License-Identifier: GPL-2.0
/*
 * The GPU memory is freed while a registration is between the client's
 * get_pages and its dma_map, for every client of the end-to-end table
 * (peermem, the reference client, NVIDIA's nvidia-peermem unmodified).
 *
 * gpusim sleeps delay_us at the start of every nvidia_p2p_* entry point
 * and counts the call first; the test frees the memory from a second
 * thread as soon as calls/dma_map_pages moves, so the free callback runs
 * while the registering thread sleeps inside nvidia_p2p_dma_map_pages,
 * after its get_pages returned: the window nvidia-peermem's free callback
 * does not handle (nvidia-peermem.c, nv_get_p2p_free_callback: with no DMA
 * mapping yet it logs "invalid dma_mapping" and returns without
 * invalidating or freeing the page table).
 *
 * What must hold for a correct client: the registration fails, or the
 * client revokes the MR through the core (the core's invalidated count
 * moves); no RDMA reaches the freed memory; afterwards nothing is pinned
 * or DMA-mapped at gpusim, the core's counters balance, and the client
 * still registers GPU memory.
 *
 * gpusim maps a page table whose free callback is pending, as NVIDIA's
 * driver does (docs/gpusim.md). nvidia-peermem misses the window: its
 * callback finds no DMA mapping yet and returns without telling the core
 * ("invalid dma_mapping"). For it the test checks that the defect is
 * reproduced, so the rig cannot quietly become kinder again. What follows
 * in NVIDIA's driver is a use after free (the table is freed right after
 * the callback returns, and the map call still in the driver reads it, or
 * inserts a mapping the free has already passed): gpusim cannot do that
 * safely and refuses the map of a freed table with EINVAL instead, so the
 * registration fails here (docs/core.md lists this). The reference client
 * maps through struct pages, not nvidia_p2p_dma_map_pages: the window
 * does not exist for it.
 */
#define _GNU_SOURCE
#include "e2e.h"
#include "../core/core_test.h"
#include "../../gpusim/gpusim_uapi.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#define LEN (4 * GPU_PAGE)
#define DELAY_US "700000"

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;

static long long gsv(const char *what)
{
	return read_ll(GSDBG "%s", what);
}

static int gs_set(const char *knob, const char *v)
{
	char p[128];

	snprintf(p, sizeof(p), GSDBG "%s", knob);
	return write_str(p, v);
}

struct racer {
	struct gpu_buf *g;
	long long maps0;
	int freed, ret;
};

/* Frees the memory once the registering thread is inside dma_map_pages. */
static void *free_in_window(void *arg)
{
	struct racer *r = arg;
	double end = now_s() + slow_s(60);

	while (now_s() < end && gsv("calls/dma_map_pages") <= r->maps0)
		usleep(1000);
	if (gsv("calls/dma_map_pages") <= r->maps0)
		return NULL;
	/*
	 * The map call sleeps its delay_us now; the free must not sleep its
	 * own before the callback, or the callback comes after the map
	 * returned and the window is missed.
	 */
	gs_set("delay_us", "0");
	r->ret = gpu_free(r->g);
	r->freed = 1;
	return NULL;
}

static int nothing_held(void)
{
	return gsv("live_pins") == 0 && gsv("live_dma_mappings") == 0;
}

static int wait_nothing_held(double secs)
{
	double end = now_s() + secs;

	while (now_s() < end) {
		if (nothing_held())
			return 1;
		usleep(20000);
	}
	return nothing_held();
}

static const char *root;

static int load(const char *ko, const char *args)
{
	return run("insmod %s/%s %s", root, ko, args);
}

static void one_client(const struct e2e_client *cl, const char *defect, int fd)
{
	struct gpu_buf g, g2;
	struct racer r = { 0 };
	struct ibv_mr *mr;
	pthread_t t;
	int e, st = -1, st2 = -1, dmesg_invalid, told;
	char core[256];
	struct peer_stats s0, s1;

	run("dmesg -C");
	/*
	 * gpusim's RM lock as NVIDIA's driver holds it ($GPUSIM_RM_LOCK
	 * overrides), except for nvidia-peermem, whose invalidating free
	 * callback calls the core's invalidate under RM: a cycle with the
	 * core's umem mapping lock that lockdep reports (docs/module.md,
	 * "Locking"); peermem's callback waits for nothing (issue 22).
	 */
	gs_set("rm_lock", getenv("GPUSIM_RM_LOCK") ?: (strcmp(cl->label, "peermem") ? "0" : "1"));
	diag("%s: gpusim rm_lock=%lld", cl->label, gsv("rm_lock"));
	if (load(cl->ko, cl->args)) {
		ok(0, "%s: insmod %s", cl->label, cl->ko);
		return;
	}
	snprintf(core, sizeof(core), "%s", cl->core_name);
	if (peer_stats(core, &s0))
		bail("%s: cannot read the core's counters of %s", cl->label, core);
	if (gpu_alloc(&g, fd, LEN))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	memset(g.p, 0x5a, LEN);
	r.g = &g;
	r.maps0 = gsv("calls/dma_map_pages");
	gs_set("delay_us", DELAY_US);
	pthread_create(&t, NULL, free_in_window, &r);
	mr = ibv_reg_mr(c.pd, g.p, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ);
	e = errno;
	pthread_join(t, NULL);
	gs_set("delay_us", "0");
	ok(r.freed && r.ret == 0, "%s: the memory was freed while the registration was inside nvidia_p2p_dma_map_pages (free %s)",
	   cl->label, r.freed ? strerror(-r.ret) : "never ran: dma_map_pages was not reached");
	diag("%s: ibv_reg_mr %s", cl->label, mr ? "succeeded" : strerror(e));
	if (peer_stats(core, &s1))
		bail("%s: cannot read the core's counters of %s", cl->label, core);
	told = s1.invalidated_mrs > s0.invalidated_mrs;
	dmesg_invalid = run("dmesg | grep -q 'invalid dma_mapping'") == 0;
	diag("%s: kernel log %s \"invalid dma_mapping\"", cl->label, dmesg_invalid ? "has" : "has no");
	if (mr) {
		memset(h, 0xa5, 4096);
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, 4096, (uintptr_t)g.p, mr->rkey);
		if (st && conn_qps(&c))
			bail("cannot recreate the QPs");
	}
	if (!defect) {
		ok(!mr || told, "%s: the registration %s", cl->label,
		   !mr ? "failed" : told ? "succeeded and the client revoked it through the core" :
					   "succeeded and the core was never told: a live MR on freed GPU memory");
		ok(!mr || st != 0, "%s: no RDMA reaches the freed memory (%s)", cl->label,
		   !mr ? "no MR" : st ? "the WRITE completed in error" : "an RDMA WRITE succeeded");
	} else {
		ok(dmesg_invalid && !told, "%s: known defect reproduced: %s (kernel log %s it; core invalidations %lld)",
		   cl->label, defect, dmesg_invalid ? "has" : "has not", s1.invalidated_mrs - s0.invalidated_mrs);
		ok(!mr || st != 0,
		   "%s: no RDMA reaches the freed memory (%s)", cl->label,
		   !mr ? "the registration failed: gpusim refused to map the freed table, where NVIDIA's driver would read it after free" :
		   st ? "the WRITE completed in error: gpusim unmapped the table after the callback" :
			"an RDMA WRITE succeeded");
	}
	if (mr)
		ibv_dereg_mr(mr);
	gpu_unmap(&g);
	ok(wait_nothing_held(10), "%s: afterwards nothing is pinned or DMA-mapped at the GPU driver (pins %lld, mappings %lld)",
	   cl->label, gsv("live_pins"), gsv("live_dma_mappings"));
	if (peer_stats(core, &s1) == 0) {
		ok(s1.alloc_mrs == s1.dealloc_mrs, "%s: the core's counters balance (alloc %lld, dealloc %lld MRs)",
		   cl->label, s1.alloc_mrs, s1.dealloc_mrs);
		peer_stats_diag(core);
	}
	/* The client still works. */
	if (gpu_alloc(&g2, fd, LEN))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g2.p, LEN, 0x77);
	mr = ibv_reg_mr(c.pd, g2.p, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ);
	if (mr) {
		memset(h, 0, LEN);
		st2 = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g2.p, mr->rkey);
		ibv_dereg_mr(mr);
	}
	ok(mr && st2 == 0 && check(h, LEN, 0x77), "%s: a new registration works and reads back", cl->label);
	gpu_free(&g2);
	gpu_unmap(&g2);
	ok(run("rmmod %s", cl->module) == 0, "%s: rmmod %s", cl->label, cl->module);
}

int main(void)
{
	static const struct {
		const char *label, *defect;
	} clients[] = {
		{ "peermem", NULL },
		{ "nvpeermem", "nv_get_p2p_free_callback found no DMA mapping yet and returned without invalidating (nvidia-peermem.c, \"invalid dma_mapping\")" },
		{ NULL, NULL },
	};
	char ko[600];
	int fd, i;

	root = e2e_root();
	rxe_up();
	if (access("/sys/module/gpusim", F_OK)) {
		snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root);
		if (run("insmod %s", ko))
			bail("cannot load %s", ko);
	}
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	h = aligned_alloc(4096, LEN);
	if (fd < 0 || !h)
		bail("cannot open /dev/gpusim or allocate host memory");
	hmr = ibv_reg_mr(c.pd, h, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ);
	if (!hmr)
		bail("host MR failed: %s", strerror(errno));
	for (i = 0; clients[i].label; i++) {
		const struct e2e_client *cl = e2e_client_find(clients[i].label);

		if (!cl)
			bail("no client %s in the table", clients[i].label);
		one_client(cl, clients[i].defect, fd);
	}
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(run("rmmod gpusim") == 0, "rmmod gpusim");
	return finish();
}
