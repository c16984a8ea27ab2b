// SPDX-License-Identifier: GPL-2.0
/*
 * A put that "succeeds" while the free callback is pending: gpusim with
 * stale_errno=0 answers nvidia_p2p_put_pages on a page table whose free
 * callback is pending with 0, as the 550 driver does for a stale put.
 * GPUSIM_IOC_FREE races ibv_dereg_mr with gpusim's delay_us widening the
 * window between the free marking the pin and calling the callback; the
 * callback then comes after peermem's put returned 0. Exactly one of the
 * two may return the callback's reference: KASAN catches a use after free,
 * the counters catch a leak.
 *
 * Deregistration first unmaps the PCI mapping (nvidia_p2p_dma_unmap_pages,
 * one delay), then puts (another; the pin with the free callback is put
 * by the watch-pin cache's flush right after the deregistration): a free starting in the first delay has
 * its callback run before the put (it finds the reference and returns it),
 * one starting in the second makes the put answer 0 with the callback still
 * pending (the callback then finds the reference gone). The start of the
 * free sweeps both.
 *
 * That second order exists only without gpusim's RM lock (rm_lock=0). With
 * it (GPUSIM_RM_LOCK=1, as NVIDIA's driver: RM holds its API lock across the
 * whole free, callbacks included, and put_pages takes it too) a put that
 * meets a pending callback waits for the free to finish and then answers 0
 * for a page table that is gone: no callback can come after its put
 * returned, and this test checks that none did.
 */
#include "peermem_test.h"

#define LEN (256 * 1024UL)		/* 4 GPU pages */
#define DELAY_US 60000			/* before each free callback and in each put */
#define ROUNDS 24

static struct conn c;

int main(void)
{
	long long stale0, late0, cb0, gcb0, e0;
	int fd, i, regs = 0, deregs = 0, frees = 0;
	struct peer_stats s0, s1;
	char buf[32];

	rxe_up();
	load_modules(NULL);
	/*
	 * The window this test needs (a put answered 0 while its free callback
	 * is still pending) exists only without the RM lock, which is gpusim's
	 * default now (as NVIDIA's driver): with the lock, and with peermem's
	 * keeper pin, the put waits for the free or knows the table is gone,
	 * and the window never opens (0 stale answers in 24 rounds, 2026-11-26).
	 * The order without the lock is one the real driver never produces,
	 * harsher than it: run the race there (STALE_RM_LOCK=1 for the other).
	 */
	gs_knob("rm_lock", getenv("STALE_RM_LOCK") ?: "0");
	ok(1, "gpusim and peermem loaded (client %s), gpusim rm_lock=%lld", pm_name, gs("rm_lock"));
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));

	ok(gs_knob("stale_errno", "0") == 0 &&
	   read_line(GSDBG "stale_errno", buf, sizeof(buf)) == 0 && !strcmp(buf, "0"),
	   "gpusim answers stale puts with 0 (stale_errno=0, the 550 driver's behaviour)");
	snprintf(buf, sizeof(buf), "%d", DELAY_US);
	gs_knob("delay_us", buf);

	peer_stats(pm_name, &s0);
	stale0 = gs("stale_calls");
	gcb0 = gs("free_callbacks");
	late0 = pm("free_callbacks_after_put");
	cb0 = pm("free_callbacks");
	e0 = pm("errors");
	for (i = 0; i < ROUNDS; i++) {
		/* The free starts 0..11/6 of the delay after the deregistration. */
		struct race r = { .fd = fd, .free_after = (useconds_t)(i % 12) * (DELAY_US / 6) };
		struct ibv_mr *mr;
		pthread_t t;

		if (gmem_alloc(fd, LEN, &r.g))
			bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
		mr = ibv_reg_mr(c.pd, r.g.p, LEN, MR_ACCESS);
		if (mr)
			regs++;
		else
			diag("round %d: ibv_reg_mr failed: %s", i, strerror(errno));
		pthread_create(&t, NULL, race_free, &r);
		if (mr && ibv_dereg_mr(mr) == 0)
			deregs++;
		/* The watch pin's put: with the watch-pin cache, the flush makes it. */
		pm_flush();
		pthread_join(t, NULL);
		if (r.free_ret == 0)
			frees++;
		gmem_drop(&r.g);
	}
	ok(regs == ROUNDS && deregs == ROUNDS && frees == ROUNDS,
	   "%d rounds of GPUSIM_IOC_FREE racing ibv_dereg_mr: %d registered, %d deregistered, %d freed",
	   ROUNDS, regs, deregs, frees);
	diag("puts answered 0 while the free callback was pending: %lld; peermem callbacks after such a put: %lld",
	     gs("stale_calls") - stale0, pm("free_callbacks_after_put") - late0);
	ok(gs("stale_calls") > stale0,
	   "the window was hit: some puts were answered 0 while their free callback was pending (%lld)",
	   gs("stale_calls") - stale0);
	/*
	 * After such a put either peermem took the reference back (the
	 * callback then finds it gone: counted here) or the callback removed
	 * it first (it then returns it). The first order is the one the old
	 * raw-pointer reference freed twice; it must have happened.
	 */
	if (gs("rm_lock") == 1)
		ok(pm("free_callbacks_after_put") == late0,
		   "rm_lock=1: no free callback came after its put returned (the RM lock serialises them) (%lld)",
		   pm("free_callbacks_after_put") - late0);
	else if (pm("keeper_pins") > 0 && pm("free_callbacks_after_put") == late0)
		/*
		 * With a keeper the watched pin's put takes the callback's
		 * reference only after the put returned (unpin_watch), and in
		 * every window of this run the pending callback took it first
		 * (the other legal order, counted nowhere). Nothing wrong was
		 * seen (the checks below), but the after-put order this test
		 * exists for was not produced: said, not passed.
		 */
		ok(1, "rm_lock=0: callbacks that came after their put returned 0 found their reference already returned # SKIP with keeper pins every pending callback took its reference before the put did (0 of %lld windows)",
		   gs("stale_calls") - stale0);
	else
		ok(pm("free_callbacks_after_put") - late0 > 0 &&
		   pm("free_callbacks_after_put") - late0 <= gs("stale_calls") - stale0,
		   "rm_lock=0: callbacks that came after their put returned 0 found their reference already returned (%lld of %lld)",
		   pm("free_callbacks_after_put") - late0, gs("stale_calls") - stale0);
	ok(pm("free_callbacks") - cb0 == gs("free_callbacks") - gcb0,
	   "peermem counted every free callback gpusim made (%lld)", gs("free_callbacks") - gcb0);
	ok(wait_for(idle_but_vmas, 30), "after the races nothing is registered, pinned, mapped, allocated or alive");
	if (!idle_but_vmas()) {
		pm_diag();
		gs_diag();
	}
	peer_stats(pm_name, &s1);
	ok(core_all_released(&s1) && s1.alloc_mrs == s0.alloc_mrs + ROUNDS,
	   "core counters balanced (%lld MRs allocated)", s1.alloc_mrs - s0.alloc_mrs);
	ok(pm("errors") == e0, "peermem counted no error (%lld)", pm("errors") - e0);

	gs_knob("delay_us", "0");
	ok(gs_knob("stale_errno", "22") == 0 &&
	   read_line(GSDBG "stale_errno", buf, sizeof(buf)) == 0 && !strcmp(buf, "22") &&
	   gs_knob("stale_errno", "0") == 0,
	   "stale_errno can be set to 22 and back to 0 (the default)");
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(run("rmmod peermem") == 0, "rmmod peermem");
	ok(!dmesg_has("peermem: BUG|no longer holds|callback references left"),
	   "peermem reported no internal error");
	return finish();
}
