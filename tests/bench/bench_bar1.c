// SPDX-License-Identifier: GPL-2.0
/*
 * bench_bar1 - how much GPU memory a peer-memory client can register before
 * the driver runs out of BAR1 (gpusim's model of RM's: docs/gpusim.md,
 * "BAR1"). Run in the rig by scripts/bench.sh --bar1 (or by hand), as root:
 *
 *   bench_bar1 LABEL KO MODULE [ARGS...]
 *
 * loads module KO (its name MODULE, e.g. peermem or nvidia_peermem) with
 * ARGS, and for each BAR1 size in BENCH_BAR1_MIB (default "256 512"),
 * dynamic, prints
 *
 *   bar1 LABEL MIB one_mr_mib N small_mrs N
 *
 * one_mr_mib: the largest single MR (2 MiB steps, from above) that
 * registers; small_mrs: how many 2 MiB MRs register at once before one is
 * refused. Then, BAR1 back at its default, for each size in
 * BENCH_PIN_SIZES_KIB (default "64 2048 65536"):
 *
 *   pins LABEL KIB miss calls C pages P hit calls C pages P
 *
 * GPU pin calls (nvidia_p2p_get_pages and _persistent) and GPU pages
 * pinned (summed over the pins) per registration + deregistration: "miss"
 * of a range registered for the first time (distinct ranges), "hit" of the
 * same range again (BENCH_PIN_ROUNDS of each, default 8). Then unloads it.
 * Nothing is asserted: tests/guest/peermem/t_peermem_bar1 checks peermem's
 * figures; this compares clients.
 */
#include "../guest/peermem/peermem_test.h"

#define MIB (1024 * 1024UL)
#define SMALL (2 * MIB)
#define MAX_SMALL 600

static const char *label, *module;

static void unload(void)
{
	if (access("/sys/module/peermem", F_OK) == 0)
		pm_flush();
	if (module && access("/sys/kernel/debug", F_OK) == 0) {
		char p[128];

		snprintf(p, sizeof(p), "/sys/module/%s", module);
		if (access(p, F_OK) == 0 && run("rmmod %s", module))
			bail("cannot unload %s", module);
	}
}

/* The largest single MR of [p, p + max) that registers, in 2 MiB steps. */
static long one_mr(struct conn *c, uint8_t *p, long max_mib)
{
	for (long mib = max_mib; mib >= 2; mib -= 2) {
		struct ibv_mr *mr = ibv_reg_mr(c->pd, p, mib * MIB, MR_ACCESS);

		if (mr) {
			ibv_dereg_mr(mr);
			return mib;
		}
	}
	return 0;
}

/* How many 2 MiB MRs of [p, p + n * 2 MiB) register at once. */
static int small_mrs(struct conn *c, uint8_t *p, int max)
{
	static struct ibv_mr *mrs[MAX_SMALL];
	int n;

	for (n = 0; n < max && n < MAX_SMALL; n++) {
		mrs[n] = ibv_reg_mr(c->pd, p + n * SMALL, SMALL, MR_ACCESS);
		if (!mrs[n])
			break;
	}
	for (int i = 0; i < n; i++)
		ibv_dereg_mr(mrs[i]);
	return n;
}

static long long pin_calls(void)
{
	return gs("calls/get_pages") + gs("calls/get_pages_persistent");
}

/* Pin calls and pages per reg + dereg of `rounds` ranges of kib KiB. */
static void pins(struct conn *c, long kib, int rounds)
{
	size_t len = (size_t)kib * 1024, span = len * rounds;
	long long c0, p0, mc, mp, hc, hp;
	int fd = open("/dev/gpusim", O_RDWR);
	struct gmem g;

	if (fd < 0 || gmem_alloc(fd, span, &g))
		bail("gpusim allocation of %zu bytes failed", span);
	c0 = pin_calls();
	p0 = gs("pages_pinned");
	for (int i = 0; i < rounds; i++) {
		struct ibv_mr *mr = ibv_reg_mr(c->pd, g.p + i * len, len, MR_ACCESS);

		if (!mr || ibv_dereg_mr(mr))
			bail("registration of %ld KiB failed", kib);
	}
	mc = pin_calls() - c0;
	mp = gs("pages_pinned") - p0;
	c0 = pin_calls();
	p0 = gs("pages_pinned");
	for (int i = 0; i < rounds; i++) {
		struct ibv_mr *mr = ibv_reg_mr(c->pd, g.p, len, MR_ACCESS);

		if (!mr || ibv_dereg_mr(mr))
			bail("registration of %ld KiB failed", kib);
	}
	hc = pin_calls() - c0;
	hp = gs("pages_pinned") - p0;
	printf("pins %s %ld miss calls %.2f pages %.2f hit calls %.2f pages %.2f\n", label, kib,
	       (double)mc / rounds, (double)mp / rounds, (double)hc / rounds, (double)hp / rounds);
	fflush(stdout);
	if (access("/sys/module/peermem", F_OK) == 0)
		pm_flush();
	gmem_free(fd, &g);
	gmem_drop(&g);
	close(fd);
}

int main(int argc, char **argv)
{
	char sizes[128], *tok, *save = NULL, args[256] = "";
	struct conn c;

	if (argc < 4)
		bail("usage: bench_bar1 LABEL KO MODULE [ARGS...]");
	label = argv[1];
	module = argv[3];
	for (int i = 4; i < argc; i++)
		snprintf(args + strlen(args), sizeof(args) - strlen(args), "%s ", argv[i]);
	rxe_up();
	/* gpusim (and peermem, which load_modules insists on) then the client. */
	load_modules(NULL);
	unload();
	if (access("/sys/module/peermem", F_OK) == 0 && pm_rmmod())
		bail("cannot unload peermem");
	if (run("insmod %s %s", argv[2], args))
		bail("insmod %s %s failed", argv[2], args);
	/*
	 * nvidia-peermem's invalidating client has the core's mapping-lock /
	 * RM-lock cycle (docs/architecture.md, "Locking"), which lockdep reports in
	 * the debug rig: its runs go without gpusim's RM lock, as in the e2e
	 * tests. What fits in BAR1 does not depend on that lock.
	 */
	if (strcmp(module, "peermem"))
		gs_knob("rm_lock", "0");
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	snprintf(sizes, sizeof(sizes), "%s", getenv("BENCH_BAR1_MIB") ?: "256 512");
	for (tok = strtok_r(sizes, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
		long mib = atol(tok), alloc_mib = mib > 1024 ? 1024 : mib;
		int fd = open("/dev/gpusim", O_RDWR);
		struct gmem g;
		long one;
		int n;

		if (mib < 64 || mib > 65536 || fd < 0)
			bail("BENCH_BAR1_MIB: sizes from 64 to 65536 MiB, /dev/gpusim open");
		gs_knob("bar1_mib", tok);
		gs_knob("bar1_mode", "2");
		gs_knob("max_alloc_bytes", "1073741824");
		if (gmem_alloc(fd, alloc_mib * MIB, &g))
			bail("gpusim allocation of %ld MiB failed", alloc_mib);
		one = one_mr(&c, g.p, alloc_mib);
		if (access("/sys/module/peermem", F_OK) == 0)
			pm_flush();
		n = small_mrs(&c, g.p, (int)(alloc_mib / 2));
		if (access("/sys/module/peermem", F_OK) == 0)
			pm_flush();
		printf("bar1 %s %ld one_mr_mib %ld small_mrs %d bar1_refusals %lld\n", label, mib, one, n,
		       gs("bar1_refusals"));
		fflush(stdout);
		gmem_free(fd, &g);
		gmem_drop(&g);
		close(fd);
	}
	gs_knob("bar1_mib", "1024");
	gs_knob("bar1_mode", "0");
	snprintf(sizes, sizeof(sizes), "%s", getenv("BENCH_PIN_SIZES_KIB") ?: "64 2048 65536");
	for (tok = strtok_r(sizes, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
		long kib = atol(tok);
		int rounds = getenv("BENCH_PIN_ROUNDS") ? atoi(getenv("BENCH_PIN_ROUNDS")) : 8;

		if (kib < 64 || kib % 64 || kib > 262144 || rounds < 1 || rounds > 64 ||
		    (long long)kib * rounds > 1024 * 1024)
			bail("BENCH_PIN_SIZES_KIB: multiples of 64 KiB, at most 256 MiB, times BENCH_PIN_ROUNDS (1..64) at most 1 GiB");
		pins(&c, kib, rounds);
	}
	conn_close(&c);
	gs_knob("max_alloc_bytes", "268435456");
	unload();
	return 0;
}
