// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_unload - gpusim and its test client unload cleanly with nothing
 * left behind and load again (runs last: the name sorts after the others).
 * Skipped when another module (peermem) uses gpusim.
 */
#include "gpusim_test.h"

int main(void)
{
	int ret;

	gs_setup();
	gs_check_zero("before unloading");
	if (other_holders()) {
		skip("unload gpusim: another module uses it");
		return finish();
	}
	ret = syscall(SYS_delete_module, "gpusim_testclient", O_NONBLOCK);
	ok(ret == 0, "rmmod gpusim_testclient (%s)", ret ? strerror(errno) : "ok");
	ret = syscall(SYS_delete_module, "gpusim", O_NONBLOCK);
	ok(ret == 0, "rmmod gpusim (%s)", ret ? strerror(errno) : "ok");
	ok(access("/dev/gpusim", F_OK) && access(DBG, F_OK), "/dev/gpusim and its debugfs directory are gone");
	/* The defaults and the rm_lock parameter, both ways. */
	ret = load_module_args("tests/gpusim/gpusim.ko", "");
	ok(ret == 0 && dbg_get("stale_errno") == 0 && dbg_get("rm_lock") == GPUSIM_RM_LOCK_DEFAULT,
	   "gpusim without arguments: stale_errno=0 (the 550 driver's answer), rm_lock=%d (%s)",
	   GPUSIM_RM_LOCK_DEFAULT, strerror(-ret));
	ok(syscall(SYS_delete_module, "gpusim", O_NONBLOCK) == 0, "rmmod gpusim");
	ret = load_module_args("tests/gpusim/gpusim.ko",
			       GPUSIM_RM_LOCK_DEFAULT ? "rm_lock=0" : "rm_lock=1");
	ok(ret == 0 && dbg_get("rm_lock") == !GPUSIM_RM_LOCK_DEFAULT,
	   "gpusim rm_lock=%d: debugfs rm_lock reads %d (%s)", !GPUSIM_RM_LOCK_DEFAULT,
	   !GPUSIM_RM_LOCK_DEFAULT, strerror(-ret));
	ok(syscall(SYS_delete_module, "gpusim", O_NONBLOCK) == 0, "rmmod gpusim");
	ret = load_module("tests/gpusim/gpusim.ko");
	ok(ret == 0 && dbg_get("rm_lock") == gpusim_args_rm_lock(),
	   "load gpusim again with GPUSIM_ARGS='%s': rm_lock %lld (%s)", gpusim_args(),
	   dbg_get("rm_lock"), strerror(-ret));
	ret = load_module("tests/gpusim/testclient/gpusim_testclient.ko");
	ok(ret == 0, "load gpusim_testclient again (%s)", strerror(-ret));
	{
		int fd = gs_open();
		uint64_t h;
		char *p = gs_alloc(fd, GPU_PAGE, &h);

		p[0] = 1;
		ok(p[0] == 1, "the reloaded gpusim works");
		munmap(p, GPU_PAGE);
		close(fd);
	}
	return gs_finish();
}
