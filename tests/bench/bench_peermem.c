// SPDX-License-Identifier: GPL-2.0
/*
 * bench_peermem - what peermem's design buys, as ratios measured within
 * one run in the rig (the VM's absolute times mean nothing; scripts/bench.sh
 * boots it and runs this). Each comparison alternates its two sides round
 * by round and compares medians, so drift and noise hit both alike.
 *
 *   1. Registration: ibv_reg_mr + ibv_dereg_mr of GPU memory through
 *      peermem against the same on host memory (pin_user_pages). Also the
 *      GPU pins per registration (gpusim's get_pages calls): 1 for peermem,
 *      2 for NVIDIA's nvidia-peermem (it pins in acquire and get_pages).
 *   2. Coalescing: RDMA WRITE into a GPU MR whose memory is one physically
 *      contiguous run (peermem hands rxe 1 scatter entry) against one in
 *      64 KiB runs (one entry per GPU page, what a client without
 *      coalescing hands over for any memory).
 *
 * Not a test: it fails (exit 1) only if an operation fails. Output: "# "
 * lines, then one "bench:" line per result.
 *
 *   bench_peermem [ROUNDS]     (default 20)
 */
#include "../guest/peermem/peermem_test.h"

#define LEN (4 * 1024 * 1024UL)		/* 64 GPU pages */
#define XFER (1024 * 1024UL)		/* per RDMA WRITE (rxe under TCG is slow) */

static struct conn c;
static int fd;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds for one ibv_reg_mr + ibv_dereg_mr of [p, p + LEN). */
static double reg_dereg(void *p)
{
	double t0 = now_s();
	struct ibv_mr *mr = ibv_reg_mr(c.pd, p, LEN, MR_ACCESS);

	if (!mr)
		bail("ibv_reg_mr of %p: %s", p, strerror(errno));
	if (ibv_dereg_mr(mr))
		bail("ibv_dereg_mr failed");
	return now_s() - t0;
}

/* A GPU allocation of LEN bytes in physically contiguous runs of contig bytes (0: one run). */
static void gpu_alloc(struct gmem *g, const char *contig)
{
	if (gs_knob("contig_bytes", contig))
		bail("cannot set gpusim's contig_bytes to %s", contig);
	if (gmem_alloc(fd, LEN, g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	memset(g->p, 0x5a, LEN);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	double *ta, *tb, ma, mb;
	struct ibv_mr *hmr, *ma_mr, *mb_mr;
	struct gmem g, g1, g64;
	long long calls0, pins, e0, e1, eb;
	uint8_t *h;
	int i, st;

	if (rounds < 5 || rounds > 100000)
		bail("ROUNDS must be 5..100000");
	setvbuf(stdout, NULL, _IOLBF, 0);
	ta = calloc(rounds, sizeof(*ta));
	tb = calloc(rounds, sizeof(*tb));
	h = aligned_alloc(4096, LEN);
	if (!ta || !tb || !h)
		bail("out of memory");
	memset(h, 0xa5, LEN);
	rxe_up();
	load_modules(NULL);
	gs_defaults();
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));
	diag("%d rounds per side, %lu KiB per registration, rxe (%s), peermem as %s",
	     rounds, LEN / 1024, RXE_DEV, pm_name);
	diag("rxe copies with the CPU, per scatter entry: the coalescing gain on an HCA, whose DMA engine fetches one descriptor per entry, is not what rxe shows");

	/* 1. Registration cost, and pins per registration. */
	gpu_alloc(&g, "65536");
	reg_dereg(g.p);		/* warm both paths once */
	reg_dereg(h);
	calls0 = gs("calls/get_pages");
	for (i = 0; i < rounds; i++) {
		ta[i] = reg_dereg(g.p);
		tb[i] = reg_dereg(h);
	}
	pins = gs("calls/get_pages") - calls0;
	ma = median(ta, rounds);
	mb = median(tb, rounds);
	printf("bench: register+deregister %lu KiB: GPU memory through peermem %.0f us, host memory (pinned by ib_core) %.0f us (median); GPU/host %.2f\n",
	       LEN / 1024, ma * 1e6, mb * 1e6, ma / mb);
	printf("bench: GPU pins per registration: %.2f (%lld nvidia_p2p_get_pages calls for %d registrations; nvidia-peermem makes 2 per registration)\n",
	       (double)pins / rounds, pins, rounds);
	gmem_free(fd, &g);
	gmem_drop(&g);

	/* 2. Scatter entries: one contiguous run against 64 KiB runs. */
	hmr = ibv_reg_mr(c.pd, h, LEN, MR_ACCESS);
	if (!hmr)
		bail("host MR: %s", strerror(errno));
	gpu_alloc(&g1, "0");
	e0 = pm("sg_entries_coalesced");
	ma_mr = ibv_reg_mr(c.pd, g1.p, LEN, MR_ACCESS);
	e1 = pm("sg_entries_coalesced");
	gpu_alloc(&g64, "65536");
	mb_mr = ibv_reg_mr(c.pd, g64.p, LEN, MR_ACCESS);
	eb = pm("sg_entries_coalesced") - e1;
	gs_knob("contig_bytes", "65536");
	if (!ma_mr || !mb_mr)
		bail("GPU MR: %s", strerror(errno));
	for (i = 0; i < rounds; i++) {
		double t0 = now_s();

		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, XFER, (uintptr_t)g1.p, ma_mr->rkey);
		ta[i] = now_s() - t0;
		if (st)
			bail("RDMA WRITE into the contiguous MR: status %d", st);
		t0 = now_s();
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, XFER, (uintptr_t)g64.p, mb_mr->rkey);
		tb[i] = now_s() - t0;
		if (st)
			bail("RDMA WRITE into the 64 KiB-run MR: status %d", st);
	}
	if (memcmp(g1.p, h, XFER) || memcmp(g64.p, h, XFER))
		bail("the RDMA WRITEs did not land");
	ma = median(ta, rounds);
	mb = median(tb, rounds);
	printf("bench: RDMA WRITE %lu KiB into a %lu KiB GPU MR: %lld scatter entry(ies) %.2f MB/s, %lld entries %.2f MB/s (median); speed-up from coalescing %.2f\n",
	       XFER / 1024, LEN / 1024, e1 - e0, XFER / ma / 1e6, eb, XFER / mb / 1e6, mb / ma);
	ibv_dereg_mr(ma_mr);
	ibv_dereg_mr(mb_mr);
	ibv_dereg_mr(hmr);
	gmem_free(fd, &g1);
	gmem_drop(&g1);
	gmem_free(fd, &g64);
	gmem_drop(&g64);
	conn_close(&c);
	close(fd);
	if (!wait_for(all_idle, 30))
		bail("something is still registered or pinned after the benchmark");
	printf("bench: done, nothing left registered or pinned\n");
	return 0;
}
