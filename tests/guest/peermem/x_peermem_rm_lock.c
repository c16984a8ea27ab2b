// SPDX-License-Identifier: GPL-2.0
/*
 * Which locks close a cycle with the GPU driver's resource-manager (RM)
 * lock when peermem serves a registration and then a free of the memory
 * (gpusim rm_lock=1: RM's API lock held inside nvidia_p2p_get_pages,
 * dma_map_pages and put_pages, and across the free callbacks, as in
 * NVIDIA 550; docs/gpusim.md, "The resource manager's lock").
 *
 * Not a t_* program: it provokes a lockdep report on purpose, which fails
 * any VM run; tests/host/rmlock/run.sh runs it alone in its own boot.
 *
 * Steps, none racing another: register GPU memory through peermem
 * (acquire pins, dma_map maps: each takes RM), deregister; register again
 * and free the memory under the live MR (the free callback runs under RM,
 * takes peermem's registration lock, then invalidates through the core,
 * which takes the umem's mapping lock).
 *
 * peermem's own lock must not be in a cycle with RM: lockdep checks the
 * callback's lock (peermem_registration) before the core's, so a cycle
 * through it would be the report. The cycle that remains is the core's:
 * OFED holds the umem's mapping lock across the client's dma_map (where
 * any client calls nvidia_p2p_dma_map_pages) and takes it in invalidate,
 * which a free callback must call (ib_peer_umem_get / ib_invalidate_peer_memory
 * in OFED 25.10 peer_mem.c). The program checks that this is the report.
 */
#include "peermem_test.h"

#define LEN (4 * GPU_PAGE)

static int report(void)
{
	return dmesg_has("possible circular locking dependency");
}

int main(void)
{
	struct conn c;
	struct gmem g;
	struct ibv_mr *mr;
	int fd;

	if (!getenv("GPUSIM_RM_LOCK"))
		setenv("GPUSIM_RM_LOCK", "1", 1);
	rxe_up();
	load_modules(NULL);
	if (report())
		bail("the kernel log already has a lockdep cycle report: run this alone in a fresh boot");
	ok(gs("rm_lock") == 1, "gpusim holds its RM lock (rm_lock=1)");
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));

	/* Register and deregister: acquire's pin and dma_map's mapping take RM. */
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	ok(mr != NULL, "register GPU memory through peermem (%s)", mr ? "ok" : strerror(errno));
	ok(mr && ibv_dereg_mr(mr) == 0, "deregister it");
	ok(!report(), "no lockdep report from registering and deregistering");

	/* Register again and free the memory under the live MR. */
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	ok(mr != NULL, "register it again");
	ok(gmem_free(fd, &g) == 0, "free the GPU memory under the live MR (the free callback invalidates)");
	ok(pm("invalidations_gpu_free") >= 1, "peermem invalidated the MR through the core (%lld)",
	   pm("invalidations_gpu_free"));
	ok(mr && ibv_dereg_mr(mr) == 0, "deregister the invalidated MR");
	gmem_drop(&g);

	ok(!dmesg_has("peermem_registration"),
	   "no lockdep report names peermem's registration lock (it is held across no RM call)");
	ok(report() && dmesg_has("GPUSIM_RM_API_LOCK") && dmesg_has("mapping_lock"),
	   "the report is the core's: the umem's mapping_lock (held across dma_map, taken by invalidate) against GPUSIM_RM_API_LOCK");

	close(fd);
	conn_close(&c);
	return finish();
}
