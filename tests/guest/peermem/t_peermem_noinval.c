// SPDX-License-Identifier: GPL-2.0
/*
 * peermem with enable_invalidate=0: only the non-invalidating client
 * nv_mem_nc is registered, and memory registrations go to it (persistent
 * pins, like NVIDIA's nv_mem_nc). Freeing the GPU memory does not touch a
 * live MR (the memory stays allocated, RDMA keeps working on it) until the
 * MR is deregistered; rmmod waits for the MR.
 */
#include "peermem_test.h"

#define LEN (512 * 1024UL)

int main(void)
{
	struct peer_stats s0, s1;
	struct ibv_mr *hmr, *mr;
	struct conn c;
	struct gmem g;
	uint8_t *h, *saved;
	char path[160], flags[80];
	int fd, rc, st, waited;
	pid_t pid;

	rxe_up();
	load_modules("enable_invalidate=0");
	ok(!strcmp(pm_name, "nv_mem_nc") && access("/sys/kernel/debug/peer_memory/nv_mem", F_OK) != 0,
	   "peermem loaded with enable_invalidate=0: only %s is registered", pm_name);
	snprintf(path, sizeof(path), "/sys/kernel/debug/peer_memory/%s/flags", pm_name);
	read_line(path, flags, sizeof(flags));
	ok(!strcmp(flags, "invalidate=0 invalidate_unmaps=0"), "the core sees a non-invalidating client (%s)", flags);
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	h = aligned_alloc(4096, LEN);
	saved = malloc(LEN);
	if (fd < 0 || !h || !saved)
		bail("cannot open /dev/gpusim or allocate memory");
	hmr = ibv_reg_mr(c.pd, h, LEN, MR_ACCESS);
	if (!hmr)
		bail("host MR failed");

	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0x3131);
	memcpy(saved, g.p, LEN);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	ok(mr && gs("live_persistent_pins") == 1 && pm_live_pins() == 1,
	   "ibv_reg_mr pins the GPU memory persistently (errno %d)", mr ? 0 : errno);
	if (!mr)
		bail("GPU MR failed");
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && !memcmp(h, saved, LEN), "RDMA READ of the GPU MR (status %d)", rc);
	ok(pm_live_maps() == 1 && gs("live_dma_mappings") == 1,
	   "mapped for rxe's PCI device (nvidia_p2p_dma_map_pages)");

	peer_stats(pm_name, &s0);
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == 0,
	   "GPUSIM_IOC_FREE: no free callback for a persistent pin");
	memset(h, 0, LEN);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && !memcmp(h, saved, LEN), "RDMA READ still returns the pinned bytes (status %d)", rc);
	if (rc && conn_qps(&c))
		bail("cannot recreate the QPs");
	{
		uint8_t *p = g.p;

		gmem_drop(&g);
		g.p = p;	/* the MR's address, no longer mapped */
	}
	ok(gs("live_allocs") == 0 && gs("live_persistent_pins") == 1 && gs("live_mem_bytes") == (long long)LEN,
	   "freed and unmapped, the memory stays allocated while the MR pins it");
	memset(h, 0, LEN);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && !memcmp(h, saved, LEN), "after munmap too, RDMA READ returns the pinned bytes (status %d)", rc);
	if (rc && conn_qps(&c))
		bail("cannot recreate the QPs");
	peer_stats(pm_name, &s1);
	ok(s1.invalidated_mrs == s0.invalidated_mrs && s1.alloc_mrs == s1.dealloc_mrs + 1,
	   "the core saw no invalidation");

	/* rmmod waits for the MR. */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		execlp("rmmod", "rmmod", "peermem", (char *)NULL);
		_exit(127);
	}
	sleep(3);
	ok(waitpid(pid, &st, WNOHANG) == 0 && access("/sys/module/peermem", F_OK) == 0,
	   "rmmod blocks while an MR uses peermem");
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0, "the MR still works meanwhile (status %d)", rc);
	ok(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	{
		double end = now_s() + slow_s(60);

		while (waitpid(pid, &st, WNOHANG) == 0 && now_s() < end)
			usleep(100000);
		waited = now_s() < end;
	}
	ok(waited && WIFEXITED(st) && WEXITSTATUS(st) == 0 && access("/sys/module/peermem", F_OK) != 0,
	   "deregistering the MR lets rmmod finish");
	ok(gs_idle(), "the memory went back with the last pin");
	if (!gs_idle())
		gs_diag();
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(dmesg_has("peermem: unloading: waiting until the 1 registration"),
	   "rmmod said what it was waiting for");
	return finish();
}
