// SPDX-License-Identifier: GPL-2.0
/*
 * Proof that gpusim's RM lock (rm_lock=1) lets lockdep catch a client that
 * holds one of its own locks across nvidia_p2p_get_pages and takes the same
 * lock in its free callback: the order NVIDIA's driver turns into a
 * deadlock, since RM calls free callbacks with its API lock held and takes
 * it inside get_pages (docs/gpusim.md, "The resource manager's lock").
 *
 * Not a t_* program: it provokes a kernel report on purpose, which fails
 * any VM run. tests/host/scripts/run.sh runs it in the runner's failure
 * boot and expects exactly that report, attributed to it. The test client's GPUSIM_TC_HOLD_LOCK holds
 * its file lock across get_pages; its free callback always takes it.
 *
 * First without the RM lock (control: the same calls, no report), then
 * with it (the report, read back from the kernel log).
 */
#include "gpusim_test.h"

/* 1 if the kernel log contains @what. */
static int klog_has(const char *what)
{
	char line[1024];
	int found = 0;
	FILE *f = popen("dmesg", "r");

	if (!f)
		bail("cannot run dmesg: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (strstr(line, what))
			found = 1;
	pclose(f);
	return found;
}

/* Pin with the client's lock held across get_pages, then free the memory. */
static void pin_locked_and_free(int fd, int tc, int rm_lock)
{
	struct gpusim_tc_req q, s;
	uint64_t h;
	char *p = gs_alloc(fd, GPU_PAGE, &h);

	dbg_set("rm_lock", rm_lock);
	ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_HOLD_LOCK, &q) == 0,
	   "rm_lock=%d: pin holding the client's lock across get_pages", rm_lock);
	ok(gs_free(fd, h) == 0, "rm_lock=%d: free the memory (the callback takes that lock)", rm_lock);
	ok(tc_id(tc, GPUSIM_TC_STATUS, q.id, 0, &s) == 0 && s.callbacks == 1,
	   "rm_lock=%d: the free callback ran once", rm_lock);
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
	munmap(p, GPU_PAGE);
}

int main(void)
{
	int fd, tc;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	if (klog_has("possible circular locking dependency"))
		bail("the kernel log already has a lockdep cycle report: run this alone in a fresh boot");

	pin_locked_and_free(fd, tc, 0);
	ok(!klog_has("possible circular locking dependency"),
	   "rm_lock=0: no lockdep report (nothing orders the client's lock against gpusim)");

	pin_locked_and_free(fd, tc, 1);
	ok(klog_has("possible circular locking dependency") && klog_has("GPUSIM_RM_API_LOCK"),
	   "rm_lock=1: lockdep reports the cycle through GPUSIM_RM_API_LOCK");

	close(tc);
	close(fd);
	return gs_finish();
}
