// SPDX-License-Identifier: GPL-2.0
/*
 * BAR1 at 256 MiB, dynamic (a GPU without resizable BAR; docs/gpusim.md,
 * "BAR1"): what peermem can register before the driver refuses with
 * ENOMEM, against what one pin per MR in the process's client (what
 * nvidia-peermem holds) allows: RM's bound is the BAR1 size less its
 * 36 MiB reserve, 220 MiB (docs/module.md, "The watch pin covers one GPU
 * page"). peermem holds the range in RM's internal client (the keeper) and
 * one 64 KiB page in the process's (the watch pin):
 *  - one MR of 220 MiB registers and moves data; 222 MiB is refused
 *    (keeper ENOMEM, declined by both clients), counted and logged;
 *  - 2 MiB MRs: 110 register at once, the 111th is refused;
 *  - gpusim's BAR1 figures follow, and nothing is left after.
 * With a whole-range watch pin the same BAR1 took 128 MiB of one MR.
 */
#include "peermem_test.h"

#define MIB (1024 * 1024UL)
#define BAR1_MIB 256
#define BOUND_MIB (BAR1_MIB - 36)	/* RM's CLI_THIRD_PARTY_P2P_BAR1_RESERVE */
#define SMALL (2 * MIB)
#define MAX_SMALL 160

int main(void)
{
	static struct ibv_mr *mrs[MAX_SMALL];
	long long f0, r0, d0;
	struct ibv_mr *hmr, *mr;
	struct conn c;
	struct gmem g;
	uint8_t *h;
	int fd, n, rc, err = 0;

	rxe_up();
	load_modules(NULL);
	fd = gpusim_and_host_mr(&c, 1 * MIB, &h, &hmr);
	gs_knob("bar1_mib", "256");
	gs_knob("bar1_mode", "2");
	ok(read_ll(GSDBG "bar1_mib") == BAR1_MIB && read_ll(GSDBG "bar1_mapped_bytes") == 0,
	   "gpusim: BAR1 of 256 MiB, dynamic, nothing mapped");
	if (gmem_alloc(fd, 256 * MIB, &g))
		bail("gpusim allocation of 256 MiB failed");

	/* One large MR: 220 MiB fits. */
	mr = ibv_reg_mr(c.pd, g.p, BOUND_MIB * MIB, MR_ACCESS);
	ok(mr && gs("live_persistent_pins") == 1 &&
	   read_ll(GSDBG "bar1_internal_bytes") == (long long)(BOUND_MIB * MIB) &&
	   read_ll(GSDBG "bar1_mapped_bytes") == (long long)(BOUND_MIB * MIB + GPU_PAGE),
	   "one MR of %d MiB (RM's bound: BAR1 less 36 MiB) registers: the keeper's %d MiB in the internal client, the watch pin's 64 KiB in the process's (mapped %lld)",
	   BOUND_MIB, BOUND_MIB, read_ll(GSDBG "bar1_mapped_bytes"));
	if (!mr)
		bail("ibv_reg_mr of %d MiB: %s", BOUND_MIB, strerror(errno));
	fill(g.p + 200 * MIB, 4096, 7);
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p + 200 * MIB, mr->rkey);
	ok(rc == 0 && check(h, 4096, 7), "... and moves data at 200 MiB into it (status %d)", rc);
	ibv_dereg_mr(mr);
	pm_flush();
	ok(read_ll(GSDBG "bar1_mapped_bytes") == 0, "deregistered (and flushed): BAR1 empty");

	/* 222 MiB does not: the keeper's ENOMEM, both clients decline. */
	f0 = pm("keeper_pins_failed");
	r0 = gs("bar1_refusals");
	d0 = pm("registrations_declined");
	mr = ibv_reg_mr(c.pd, g.p, (BOUND_MIB + 2) * MIB, MR_ACCESS);
	err = mr ? 0 : errno;
	ok(!mr && pm("keeper_pins_failed") == f0 + 1 && pm("registrations_declined") == d0 + 1 &&
	   gs("bar1_refusals") >= r0 + 2 && gs("live_pins") == 0,
	   "one MR of %d MiB is refused (errno %d): the keeper gets ENOMEM, nv_mem declines, nv_mem_nc's pin gets ENOMEM too (refusals %+lld), nothing held",
	   BOUND_MIB + 2, err, gs("bar1_refusals") - r0);
	ok(dmesg_has("BAR1 aperture is full"), "the log says BAR1 is full");
	if (mr)
		ibv_dereg_mr(mr);

	/* 2 MiB MRs at once: 110 fit, as one pin each in one client would. */
	for (n = 0; n < MAX_SMALL; n++) {
		mrs[n] = ibv_reg_mr(c.pd, g.p + n * SMALL, SMALL, MR_ACCESS);
		if (!mrs[n])
			break;
	}
	ok(n == BOUND_MIB / 2 && read_ll(GSDBG "bar1_internal_bytes") == (long long)(n * SMALL),
	   "2 MiB MRs at once: %d register (RM's bound for one pin each: %d), the next is refused (internal %lld MiB, all %lld KiB)",
	   n, BOUND_MIB / 2, read_ll(GSDBG "bar1_internal_bytes") / (long long)MIB,
	   read_ll(GSDBG "bar1_mapped_bytes") / 1024);
	rc = 0;
	for (int i = 0; i < n; i++)
		rc |= ibv_dereg_mr(mrs[i]);
	pm_flush();
	ok(rc == 0 && read_ll(GSDBG "bar1_mapped_bytes") == 0 && gs("live_pins") == 0,
	   "all deregistered (and flushed): BAR1 empty, nothing pinned");
	gmem_free(fd, &g);
	gmem_drop(&g);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	gs_knob("bar1_mib", "1024");
	gs_knob("bar1_mode", "0");
	ok(wait_for(all_idle, 10), "nothing left");
	ok(pm_rmmod() == 0, "rmmod");
	return finish();
}
