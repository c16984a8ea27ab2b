// SPDX-License-Identifier: GPL-2.0
/*
 * GPU memory freed under live registrations: the free ioctl (cudaFree) and
 * process exit invalidate the MRs through the core (the next RDMA completes
 * in error and never touches the memory, deregistration still works,
 * nothing stays pinned); then a race loop with gpusim's delay_us freeing
 * the memory while registrations are made and taken down.
 */
#include "peermem_test.h"

#define LEN (512 * 1024UL)		/* 8 GPU pages */

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;

/* Wait until the core completed n more invalidations than in *s0. */
static int wait_invalidated(const struct peer_stats *s0, long long n, struct peer_stats *s1)
{
	double end = now_s() + slow_s(20);

	do {
		peer_stats(pm_name, s1);
		if (s1->invalidated_mrs >= s0->invalidated_mrs + n && core_none_mapped(s1))
			return 1;
		usleep(20000);
	} while (now_s() < end);
	return 0;
}

int main(void)
{
	struct peer_stats s0, s1;
	struct ibv_mr *mr, *mr2;
	struct gmem g;
	uint8_t *saved;
	long long cb0, inv0, e0, maps0;
	int fd, rc, st, i;

	rxe_up();
	load_modules(NULL);
	ok(1, "gpusim and peermem loaded (client %s)", pm_name);
	fd = gpusim_and_host_mr(&c, 2 * LEN, &h, &hmr);
	saved = malloc(LEN);
	if (!saved)
		bail("out of memory");

	/* --- GPUSIM_IOC_FREE while two MRs (whole, and a sub-range) are live. */
	for (int contig = 0; contig < 2; contig++) {
		gs_knob("contig_bytes", contig ? "0" : "65536");
		if (gmem_alloc(fd, LEN, &g))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		fill(g.p, LEN, 0x8888 + contig);
		memcpy(saved, g.p, LEN);
		mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		mr2 = ibv_reg_mr(c.pd, g.p + 100000, 200000, MR_ACCESS);
		rc = mr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 8192, (uintptr_t)g.p + 8192, mr->rkey) : -1;
		ok(mr && mr2 && rc == 0 && !memcmp(h, saved + 8192, 8192),
		   "[contig %s] two GPU MRs work before the free", contig ? "whole" : "64K");
		peer_stats(pm_name, &s0);
		cb0 = pm("free_callbacks");
		inv0 = pm("invalidations_gpu_free");
		ok(gmem_free(fd, &g) == 0, "[contig %s] GPUSIM_IOC_FREE returns", contig ? "whole" : "64K");
		ok(pm("free_callbacks") == cb0 + 2,
		   "[contig %s] one free callback per registration, called before the free returned",
		   contig ? "whole" : "64K");
		/* The callbacks queued the revocations (the keepers hold the memory until they ran). */
		ok(wait_for(pm_no_keepers, 20) && pm("invalidations_gpu_free") == inv0 + 2,
		   "[contig %s] each registration then invalidated through the core (%lld) and its keeper put",
		   contig ? "whole" : "64K", pm("invalidations_gpu_free") - inv0);
		rc = wait_invalidated(&s0, 2, &s1);
		ok(rc && s1.free_callbacks == s0.free_callbacks + 2,
		   "[contig %s] the core revoked both MRs (num_invalidated_mrs +%lld)",
		   contig ? "whole" : "64K", s1.invalidated_mrs - s0.invalidated_mrs);
		ok(pm_live_pins() == 0 && pm_live_maps() == 0 && gs("live_pins") == 0 &&
		   gs("live_dma_mappings") == 0 && gs("live_allocs") == 0,
		   "[contig %s] nothing pinned or mapped once revoked (gpusim pins %lld)",
		   contig ? "whole" : "64K", gs("live_pins"));
		ok(pm_live_regs() == 2 && pm_live_objects() == 2,
		   "[contig %s] the two registrations exist until deregistered", contig ? "whole" : "64K");
		fill(h, 8192, 0x9999);
		rc = mr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, 8192, (uintptr_t)g.p, mr->rkey) : -1;
		ok(rc > 0 && !memcmp(g.p, saved, LEN),
		   "[contig %s] RDMA WRITE to the freed memory completes in error (%s) and never reaches it",
		   contig ? "whole" : "64K", rc > 0 ? ibv_wc_status_str(rc) : "no error");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		rc = mr2 ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 8192, (uintptr_t)g.p + 100000, mr2->rkey) : -1;
		ok(rc > 0, "[contig %s] RDMA READ from the freed sub-range completes in error (%s)",
		   contig ? "whole" : "64K", rc > 0 ? ibv_wc_status_str(rc) : "no error");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		rc = mr ? rdma_op(&c, IBV_WR_RDMA_WRITE, mr, g.p, 4096, (uintptr_t)h, hmr->rkey) : -1;
		ok(rc > 0, "[contig %s] the freed MR as local source completes in error (%s)",
		   contig ? "whole" : "64K", rc > 0 ? ibv_wc_status_str(rc) : "no error");
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		ok(mr && ibv_dereg_mr(mr) == 0 && mr2 && ibv_dereg_mr(mr2) == 0,
		   "[contig %s] ibv_dereg_mr of both invalidated MRs succeeds", contig ? "whole" : "64K");
		ok(pm_idle() && gs("live_pins") == 0,
		   "[contig %s] peermem idle after deregistration", contig ? "whole" : "64K");
		gmem_drop(&g);
		ok(gs_idle(), "[contig %s] gpusim idle once the CPU mapping is gone", contig ? "whole" : "64K");
	}
	gs_knob("contig_bytes", "65536");

	/* Registering freed memory is declined; the address means nothing now. */
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	gmem_free(fd, &g);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	rc = errno;
	ok(!mr && rc == EFAULT && pm_idle(), "ibv_reg_mr on freed GPU memory fails with EFAULT (errno %d)", rc);
	if (mr)
		ibv_dereg_mr(mr);
	gmem_drop(&g);

	/*
	 * --- The free callback in the windows of a registration, made wide
	 * with peermem's inject_* delays: between acquire and get_pages (no
	 * ticket yet: nothing to invalidate), and between get_pages and
	 * dma_map (the core's invalidate waits for the mapping lock the
	 * registration holds). Both registrations fail with EFAULT.
	 */
	for (i = 0; i < 2; i++) {
		const char *knob = i ? PMDBG "inject_delay_dma_map_ms" : PMDBG "inject_delay_get_pages_ms";
		const char *where = i ? "between get_pages and dma_map" : "between acquire and get_pages";
		struct race r = { .fd = fd, .free_after = 500000 };
		long long e1;
		double t0, t1;
		pthread_t t;

		if (gmem_alloc(fd, LEN, &r.g))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		peer_stats(pm_name, &s0);
		cb0 = pm("free_callbacks");
		inv0 = pm("invalidations_gpu_free");
		e1 = pm("errors");
		write_str(knob, "1500");
		t0 = now_s();
		pthread_create(&t, NULL, race_free, &r);
		mr = ibv_reg_mr(c.pd, r.g.p, LEN, MR_ACCESS);
		rc = errno;
		t1 = now_s();
		pthread_join(t, NULL);
		write_str(knob, "0");
		ok(!mr && rc == EFAULT, "free %s: ibv_reg_mr fails with EFAULT (errno %d, after %.1f s)",
		   where, mr ? 0 : rc, t1 - t0);
		if (mr)
			ibv_dereg_mr(mr);
		/* The revocation the callback queued runs after it. */
		wait_for(idle_but_vmas, 10);
		peer_stats(pm_name, &s1);
		ok(r.free_ret == 0 && pm("free_callbacks") == cb0 + 1 && pm("errors") == e1 + 1 &&
		   pm("invalidations_gpu_free") == inv0 + i && s1.free_callbacks == s0.free_callbacks + i,
		   "free %s: one free callback, %s", where,
		   i ? "which invalidated its ticket through the core" : "no ticket yet, so no invalidation");
		ok(s1.alloc_mrs == s0.alloc_mrs && s1.invalidated_mrs == s0.invalidated_mrs &&
		   core_all_released(&s1), "free %s: the core never mapped it", where);
		ok(wait_for(idle_but_vmas, 10), "free %s: nothing registered, pinned or left", where);
		if (!idle_but_vmas()) {
			pm_diag();
			gs_diag();
		}
		gmem_drop(&r.g);
	}

	/* --- Process exit with a live MR, both orders of teardown. */
	for (i = 0; i < 2; i++) {
		peer_stats(pm_name, &s0);
		st = exit_child_run(i, LEN, 0x5151);
		ok(st == 0, "a child registers GPU memory (%s opened first) and exits holding it (status %d)",
		   i ? "/dev/gpusim" : "uverbs", st);
		ok(wait_for(all_idle, 30), "process exit releases the MR, the pin and the memory");
		peer_stats(pm_name, &s1);
		ok(core_all_released(&s1) && s1.alloc_mrs == s0.alloc_mrs + 1,
		   "core counters balanced after the exit");
		diag("exit %d: %lld invalidation(s), %lld free callback(s)", i,
		     s1.invalidated_mrs - s0.invalidated_mrs, s1.free_callbacks - s0.free_callbacks);
		if (!all_idle()) {
			pm_diag();
			gs_diag();
		}
	}

	/*
	 * --- Races: gpusim sleeps delay_us at every entry point and before
	 * each free callback, so a free started a little after a registration
	 * lands in a different step each round (inside the pin of acquire,
	 * between acquire and get_pages, before dma_map, with the MR live,
	 * during deregistration). A registration fails with EFAULT when
	 * peermem sees the free first; or with the GPU driver's errno from
	 * nvidia_p2p_dma_map_pages, which gpusim refuses with EINVAL for a
	 * page table whose free callback is pending (docs/gpusim.md; the 550
	 * driver maps it, and the callback then revokes the new MR): accepted
	 * only in a round where peermem called it.
	 */
	e0 = pm("errors");
	{
		int regs_ok = 0, regs_failed = 0, bad_errno = 0, refused_maps = 0, rounds = 24;
		/* How long a registration takes, with gpusim's delay and without. */
		useconds_t t_reg[2];

		for (i = 0; i < 2; i++) {
			double t0;

			gs_knob("delay_us", i ? "0" : "3000");
			if (gmem_alloc(fd, LEN, &g))
				bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
			t0 = now_s();
			mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
			t_reg[i] = (useconds_t)((now_s() - t0) * 1e6);
			if (!mr)
				bail("ibv_reg_mr for the timing: %s", strerror(errno));
			ibv_dereg_mr(mr);
			gmem_free(fd, &g);
			gmem_drop(&g);
		}
		diag("a registration takes %u us with gpusim's delay_us=3000, %u us without", t_reg[0], t_reg[1]);

		for (i = 0; i < rounds; i++) {
			/*
			 * 3 ms in gpusim for the first 16 rounds, then none; the
			 * free starts 0 to 1.4 registration times after it.
			 */
			struct race r = {
				.fd = fd,
				.free_after = (useconds_t)(i % 8) * t_reg[i < 16 ? 0 : 1] / 5,
			};
			pthread_t t;

			gs_knob("delay_us", i < 16 ? "3000" : "0");

			if (gmem_alloc(fd, LEN, &r.g))
				bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
			fill(r.g.p, LEN, 0x4000 + i);
			maps0 = gs("calls/dma_map_pages");
			pthread_create(&t, NULL, race_free, &r);
			mr = ibv_reg_mr(c.pd, r.g.p, LEN, MR_ACCESS);
			if (!mr && errno == EINVAL && gs("calls/dma_map_pages") > maps0) {
				refused_maps++;
				regs_failed++;
			} else if (mr) {
				regs_ok++;
				if (i & 1) {
					/* Deregister right away, racing the free. */
					ibv_dereg_mr(mr);
					mr = NULL;
				}
			} else {
				regs_failed++;
				if (errno != EFAULT)
					bad_errno++;
			}
			pthread_join(t, NULL);
			/*
			 * The free returned; its revocation follows in peermem's
			 * work item, while the keeper pin still holds the memory.
			 */
			if (!wait_for(pm_no_keepers, 20))
				bad_errno++;
			if (mr) {
				rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)r.g.p, mr->rkey);
				if (rc == 0)
					diag("round %d: RDMA READ after the free succeeded", i);
				if (rc != 0 && conn_qps(&c))
					bail("cannot recreate the QPs");
				if (rc == 0)
					bad_errno++;
				ibv_dereg_mr(mr);
			}
			if (r.free_ret)
				bad_errno++;
			gmem_drop(&r.g);
		}
		diag("races: %d registrations succeeded, %d failed with EFAULT, %d with EINVAL from nvidia_p2p_dma_map_pages",
		     regs_ok, regs_failed - bad_errno - refused_maps, refused_maps);
		ok(bad_errno == 0, "%d rounds of free racing registration/deregistration: every registration succeeds, or fails with EFAULT or with the driver's refusal to map a page table being freed; no RDMA after a free succeeds",
		   rounds);
		ok(regs_ok > 0 && regs_failed > 0,
		   "the free landed both before and after registrations completed (%d succeeded, %d failed)",
		   regs_ok, regs_failed);
		ok(wait_for(all_idle, 30), "after the races nothing is registered, pinned, mapped or allocated");
		if (!all_idle()) {
			pm_diag();
			gs_diag();
		}
		peer_stats(pm_name, &s1);
		ok(core_all_released(&s1), "core counters balanced after the races");
	}
	gs_knob("delay_us", "0");
	diag("errors counted during the races: %lld (freed memory, EFAULT)", pm("errors") - e0);

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(pm_rmmod() == 0, "rmmod peermem");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
