// SPDX-License-Identifier: GPL-2.0
/*
 * No lock-order cycle with the GPU driver's resource-manager (RM) lock
 * when peermem serves a registration and then a free of the memory
 * (gpusim rm_lock=1: RM's API lock held inside nvidia_p2p_get_pages*,
 * dma_map_pages and put_pages*, and across the free callbacks, as in
 * NVIDIA's driver; docs/gpusim.md, "The resource manager's lock").
 *
 * Steps, none racing another: register GPU memory through peermem
 * (acquire pins twice, dma_map maps the keeper: each takes RM),
 * deregister; register again and free the memory under the live MR (the
 * free callback runs under RM and takes only peermem's registration
 * lock; the core's invalidate, which takes the umem's mapping lock, runs
 * in peermem's work item with nothing held).
 *
 * Before issue 22 this provoked lockdep's report of the core's cycle
 * (the umem's mapping lock, held across dma_map and so across
 * nvidia_p2p_dma_map_pages, taken by invalidate from the callback under
 * RM) and ran alone in a boot of its own. Now any lockdep report fails
 * it (and the runner fails the run on it): docs/architecture.md, "Locking".
 */
#include "peermem_test.h"

#define LEN (4 * GPU_PAGE)

static int report(void)
{
	return dmesg_has("possible circular locking dependency|inconsistent lock state|possible recursive locking");
}

int main(void)
{
	struct conn c;
	struct gmem g;
	struct ibv_mr *mr;
	long long inv;
	int fd, done;

	if (!getenv("GPUSIM_RM_LOCK"))
		setenv("GPUSIM_RM_LOCK", "1", 1);
	rxe_up();
	load_modules(NULL);
	if (report())
		diag("the kernel log already has a lockdep report (an earlier test's): the checks below cannot tell");
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
	ok(gmem_free(fd, &g) == 0, "free the GPU memory under the live MR (the free callback queues the revocation)");
	done = wait_for(pm_no_keepers, 20);
	inv = pm("invalidations_gpu_free");
	ok(done && inv >= 1,
	   "peermem invalidated the MR through the core (invalidations_gpu_free %lld) and put the keeper, after the callback",
	   inv);
	ok(mr && ibv_dereg_mr(mr) == 0, "deregister the invalidated MR");
	gmem_drop(&g);

	ok(!dmesg_has("peermem_registration"),
	   "no lockdep report names peermem's registration lock (it is held across no RM call)");
	ok(!report(),
	   "no lockdep report at all: the core's mapping_lock is no longer taken under GPUSIM_RM_API_LOCK (the invalidate runs in peermem's work item)");

	close(fd);
	conn_close(&c);
	ok(pm_rmmod() == 0 && run("rmmod gpusim") == 0,
	   "rmmod peermem and gpusim (the next test loads its own)");
	return finish();
}
