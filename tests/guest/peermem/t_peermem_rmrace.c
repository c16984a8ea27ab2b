// SPDX-License-Identifier: GPL-2.0
/*
 * A GPU free landing in each phase of a registration, with gpusim's RM
 * lock (rm_lock=1, held as NVIDIA's driver holds RM's locks: across
 * get_pages*, dma_map_pages, put_pages* and a whole free with its
 * callbacks) and lockdep on, for both of peermem's clients (issue 22).
 *
 * A phase is made wide with one of peermem's inject_delay_* knobs (or
 * gpusim's delay_us, which sleeps inside every gpusim entry point, under
 * the RM lock), and a thread frees the memory at a random moment of a
 * window covering it. Were the free callback to wait for anything that
 * waits for RM (a mapping in progress, the core's umem mapping lock,
 * held across dma_map and so across nvidia_p2p_dma_map_pages), a round
 * would hang: the runner's test timeout and the kernel's hung-task
 * report (30 s in the rig) catch it. So would lockdep's cycle report.
 *
 * Checked every round: ibv_reg_mr succeeds or fails with EFAULT (or
 * with EINVAL from a refused nvidia_p2p_dma_map_pages); the free returns
 * 0; for nv_mem, once the revocation the free callback queued has run
 * (the keeper pin put), an RDMA through a surviving MR completes in
 * error; deregistration succeeds. At the end nothing is left.
 *
 * Bounded by time, not rounds (the rig may be slow): RMRACE_SECONDS
 * (default 30; 45 until 2026-11-26) split between the clients and phases; each phase must
 * reach RMRACE_MIN_ROUNDS (default 8) rounds per client.
 */
#include "peermem_test.h"

#define LEN (4 * GPU_PAGE)

struct phase {
	const char *name;
	const char *knob;	/* peermem debugfs knob (ms), or NULL */
	const char *gs_delay;	/* gpusim delay_us, or NULL */
	int dereg;		/* free races the deregistration, not the registration */
	int after;		/* free after the registration returned */
	unsigned int window_us;	/* the free starts at a random time in [0, window) ... */
	const char *mark;	/* ... after this counter moved (gpusim's if "gs:..."), or NULL */
};

static const struct phase phases[] = {
	{ "inside acquire's pins (gpusim delay_us)", NULL, "20000", 0, 0, 40000, "gs:calls/get_pages" },
	{ "in acquire after its pins", PMDBG "inject_delay_acquire_ms", NULL, 0, 0, 100000, "page_tables_pinned" },
	{ "inside get_pages", PMDBG "inject_delay_get_pages_ms", NULL, 0, 0, 100000, "registrations_acquired" },
	{ "inside dma_map (before the map, then inside it: gpusim delay_us)", PMDBG "inject_delay_dma_map_ms", "20000", 0, 0, 120000, "registrations_acquired" },
	{ "while mapped (MR live)", NULL, NULL, 0, 1, 2000, NULL },
	{ "during put_pages (deregistration)", PMDBG "inject_delay_unpin_ms", NULL, 1, 0, 100000, NULL },
	{ "during release (deregistration)", PMDBG "inject_delay_release_ms", NULL, 1, 0, 100000, NULL },
};
#define NPHASES (sizeof(phases) / sizeof(phases[0]))

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int fd;

struct cell {
	int rounds, reg_ok, reg_efault, reg_einval, bad, in_phase;
};

/* The counter a phase's free waits for: peermem's MR client's, or gpusim's. */
static const char *mark_dir;

static long long mark_value(const char *mark)
{
	return strncmp(mark, "gs:", 3) ? pmc(mark_dir, mark) : gs(mark + 3);
}

struct racer {
	struct race r;
	const char *mark;
	long long mark0;
	int marked;
};

/* Frees x.r.g once the phase began (its mark moved), after x.r.free_after. */
static void *race_free_marked(void *arg)
{
	struct racer *x = arg;
	double end = now_s() + slow_s(5);

	if (x->mark) {
		while (mark_value(x->mark) == x->mark0 && now_s() < end)
			usleep(500);
		x->marked = mark_value(x->mark) != x->mark0;
	}
	return race_free(&x->r);
}

static void set_phase(const struct phase *p, int on)
{
	if (p->knob)
		/* Wide enough for the racing thread to land in it on a slow (TCG) guest. */
		write_str(p->knob, on ? "150" : "0");
	if (p->gs_delay)
		gs_knob("delay_us", on ? p->gs_delay : "0");
}

/* One round of phase p; nc: the MR client is nv_mem_nc (enable_invalidate=0). */
static void round_of(const struct phase *p, int nc, struct cell *cl)
{
	struct racer x = { .r = { .fd = fd }, .mark = p->mark };
	struct ibv_mr *mr = NULL;
	pthread_t t;
	int err = 0;

	if (gmem_alloc(fd, LEN, &x.r.g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	x.r.free_after = (useconds_t)(random() % p->window_us);
	cl->rounds++;
	/* nv_mem_nc pins with nvidia_p2p_get_pages_persistent only. */
	if (nc && x.mark && !strcmp(x.mark, "gs:calls/get_pages"))
		x.mark = "gs:calls/get_pages_persistent";
	if (x.mark)
		x.mark0 = mark_value(x.mark);
	if (p->dereg) {
		mr = ibv_reg_mr(c.pd, x.r.g.p, LEN, MR_ACCESS);
		if (!mr) {
			diag("%s: ibv_reg_mr before the race failed: %s", p->name, strerror(errno));
			cl->bad++;
			gmem_free(fd, &x.r.g);
			gmem_drop(&x.r.g);
			return;
		}
		cl->reg_ok++;
		set_phase(p, 1);
		pthread_create(&t, NULL, race_free_marked, &x);
		if (ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr failed: %s", p->name, strerror(errno));
			cl->bad++;
		}
		mr = NULL;
		pthread_join(t, NULL);
		set_phase(p, 0);
	} else if (p->after) {
		mr = ibv_reg_mr(c.pd, x.r.g.p, LEN, MR_ACCESS);
		err = errno;
		pthread_create(&t, NULL, race_free_marked, &x);
		pthread_join(t, NULL);
	} else {
		set_phase(p, 1);
		pthread_create(&t, NULL, race_free_marked, &x);
		mr = ibv_reg_mr(c.pd, x.r.g.p, LEN, MR_ACCESS);
		err = errno;
		pthread_join(t, NULL);
		set_phase(p, 0);
	}
	if (!p->dereg) {
		if (mr)
			cl->reg_ok++;
		else if (err == EFAULT)
			cl->reg_efault++;
		else if (err == EINVAL)
			cl->reg_einval++;
		else {
			diag("%s: ibv_reg_mr failed with %s", p->name, strerror(err));
			cl->bad++;
		}
	}
	if (!x.mark || x.marked)
		cl->in_phase++;
	if (x.r.free_ret) {
		diag("%s: the free failed: %s", p->name, strerror(-x.r.free_ret));
		cl->bad++;
	}
	/* nv_mem: the revocation the free callback queued puts the keeper last. */
	if (!nc && !wait_for(pm_no_keepers, 20)) {
		diag("%s: a keeper pin is still held 20 s after the free", p->name);
		cl->bad++;
	}
	if (mr) {
		/* nv_mem revoked it; nv_mem_nc's persistent pin keeps the memory. */
		int rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)x.r.g.p, mr->rkey);

		if (!nc && rc == 0) {
			diag("%s: an RDMA READ after the free and its revocation succeeded", p->name);
			cl->bad++;
		}
		if (rc != 0 && conn_qps(&c))
			bail("cannot recreate the QPs");
		if (ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr failed: %s", p->name, strerror(errno));
			cl->bad++;
		}
	}
	gmem_drop(&x.r.g);
}

static void run_client(int nc, double budget)
{
	const char *who = nc ? "nv_mem_nc (enable_invalidate=0)" : "nv_mem";
	const char *dir = nc ? PMDBG_NC : PMDBG;
	int min_rounds = getenv("RMRACE_MIN_ROUNDS") ? atoi(getenv("RMRACE_MIN_ROUNDS")) : 8;
	long long cb0 = pmc(PMDBG, "free_callbacks"), acq0 = pmc(dir, "registrations_acquired");
	int total = 0;

	mark_dir = dir;

	for (size_t i = 0; i < NPHASES; i++) {
		const struct phase *p = &phases[i];
		struct cell cl = { 0 };
		double end = now_s() + budget / NPHASES;

		while (now_s() < end || cl.rounds < min_rounds) {
			round_of(p, nc, &cl);
			if (cl.rounds % 25 == 0)
				diag("%s, free %s: %d rounds so far", who, p->name, cl.rounds);
		}
		total += cl.rounds;
		diag("%s, free %s: %d rounds (%d with the free after the phase began); registrations %d ok, %d EFAULT, %d EINVAL (refused map)",
		     who, p->name, cl.rounds, cl.in_phase, cl.reg_ok, cl.reg_efault, cl.reg_einval);
		ok(cl.bad == 0 && cl.rounds >= min_rounds,
		   "%s, free %s: %d rounds (at least %d), none hung, every registration succeeded or failed with EFAULT/EINVAL%s, nothing else failed",
		   who, p->name, cl.rounds, min_rounds,
		   nc ? "" : ", no RDMA after the revocation reached the memory");
	}
	ok(wait_for(all_idle, 30), "%s: after %d rounds nothing is registered, pinned, mapped or allocated", who, total);
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	diag("%s: %lld free callbacks, %lld registrations acquired, %lld revocations deferred", who,
	     pmc(PMDBG, "free_callbacks") - cb0, pmc(dir, "registrations_acquired") - acq0,
	     pmc(PMDBG, "revocations_deferred"));
}

int main(void)
{
	double budget = getenv("RMRACE_SECONDS") ? atof(getenv("RMRACE_SECONDS")) : 30;

	srandom(22);
	rxe_up();
	load_modules(NULL);
	ok(gs("rm_lock") == 1 || (getenv("GPUSIM_RM_LOCK") && !strcmp(getenv("GPUSIM_RM_LOCK"), "0")),
	   "gpusim holds its RM lock (rm_lock=%lld) unless GPUSIM_RM_LOCK=0 asks otherwise", gs("rm_lock"));
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);

	run_client(0, budget / 2);
	ok(pm("keeper_pins") > 0 && pm("keeper_pins_refused") == 0,
	   "nv_mem took a keeper pin per registration (%lld), none refused", pm("keeper_pins"));

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	load_modules("enable_invalidate=0");
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);
	run_client(1, budget / 2);

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(pm_rmmod() == 0, "rmmod peermem");
	ok(!dmesg_has("peermem: BUG|no longer holds|blocked for more than"),
	   "no internal error and no hung task in the kernel log");
	return finish();
}
