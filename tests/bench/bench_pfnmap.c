// SPDX-License-Identifier: GPL-2.0
/*
 * bench_pfnmap - what peermem's PFN-map source (pfnmap=1, docs/module.md
 * "PFN-mapped memory") saves a data-acquisition application: sending 16
 * MiB out of a PFN-mapped ring (the rig's exporter, reserved RAM mapped with
 * remap_pfn_range) by RDMA WRITE straight from the ring, registered through
 * peermem, against what such an application does without it: memcpy the
 * ring into a registered staging buffer, then RDMA WRITE from there. Both
 * in one run, alternating round by round, each WRITE to the same host-memory
 * destination MR over the rxe loopback; the bytes at the destination are
 * checked after every transfer (outside the timed part).
 *
 * The order of the two paths alternates from round to round.
 *
 * Not a test: it fails (exit 1, a bail-out line) only if an operation
 * fails or something is left registered. Output, in bench_peermem's format
 * (tests/bench/report.py reads both): "# " lines, "info KEY VALUE..." lines
 * and one "sample FIGURE PARAM SIDE ROUND SECONDS" line per timed part of a
 * round, PARAM the size ("16M"):
 *   pfn_send_s        direct  the RDMA WRITE straight from the ring
 *   pfn_send_s        staged  memcpy ring -> staging buffer + RDMA WRITE
 *   pfn_memcpy_s      staged  of which the memcpy
 *   pfn_stage_write_s staged  of which the RDMA WRITE from the staging buffer
 * and a "result" line with the medians and their ratio.
 *
 *   bench_pfnmap [--rounds N] [--mib M]
 *
 * scripts/bench.sh runs it after bench_peermem in the same boot; by hand:
 * scripts/vm.sh --kdir K --cmd "tests/bench/bench_pfnmap" (needs gpusim,
 * peermem and tests/pfnmap built; GPUSIM_KO, PEERMEM_KO, PFNMAP_KO name
 * other builds; docs/benchmarks.md).
 */
#include "../guest/pfnmap/pfnmap_test.h"

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

int main(int argc, char **argv)
{
	int rounds = 10, mib = 16, efd, rc;
	struct ibv_mr *ring_mr, *stage_mr, *dst_mr;
	double t_direct[1000], t_staged[1000], t_copy[1000];
	uint8_t *ring, *stage, *dst;
	struct conn c;
	char param[16];
	size_t len;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = atoi(argv[++i]);
		else
			bail("usage: bench_pfnmap [--rounds N] [--mib M]");
	}
	if (rounds < 1 || rounds > 1000 || mib < 1 || mib > 64)
		bail("--rounds wants 1..1000, --mib 1..64");
	len = (size_t)mib << 20;

	rxe_up();
	load_modules("pfnmap=1");
	exporter_load();
	efd = exporter_open(O_RDWR);
	if (exporter_alloc(efd, len, PFNMAP_RESERVED, NULL))
		bail("the exporter cannot allocate %d MiB", mib);
	ring = exporter_map(efd, len, PROT_READ | PROT_WRITE, MAP_SHARED);
	stage = aligned_alloc(4096, len);
	dst = aligned_alloc(4096, len);
	if (!ring || !stage || !dst)
		bail("mmap/allocation failed");
	if (conn_open(&c))
		bail("cannot open rxe0");
	ring_mr = ibv_reg_mr(c.pd, ring, len, MR_ACCESS);
	stage_mr = ibv_reg_mr(c.pd, stage, len, MR_ACCESS);
	dst_mr = ibv_reg_mr(c.pd, dst, len, MR_ACCESS);
	if (!ring_mr || !stage_mr || !dst_mr)
		bail("ibv_reg_mr failed: %s", strerror(errno));
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("# %d MiB ring of the exporter (reserved RAM, remap_pfn_range, cached mapping), %d rounds; pfn sg entries %lld\n",
	       mib, rounds, pf("sg_entries_coalesced"));
	printf("info pfn_rounds %d\ninfo pfn_bytes %zu\ninfo pfn_sg_entries %lld\n",
	       rounds, len, pf("sg_entries_coalesced"));
	snprintf(param, sizeof(param), "%dM", mib);

	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < 2; k++) {
			double t0, t1, t2;
			uint32_t seed = 0x9000 + 2 * r + k;

			/* The "acquisition": new data in the ring before each transfer. */
			fill(ring, len, seed);
			memset(dst, 0, len);
			if ((r + k) % 2 == 0) {	/* direct first in even rounds */
				t0 = now_s();
				rc = rdma_op(&c, IBV_WR_RDMA_WRITE, ring_mr, ring, len,
					     (uintptr_t)dst, dst_mr->rkey);
				t1 = now_s();
				if (rc || !check(dst, len, seed))
					bail("direct RDMA WRITE from the ring: status %d or wrong bytes", rc);
				t_direct[r] = t1 - t0;
				printf("sample pfn_send_s %s direct %d %.9g\n", param, r, t_direct[r]);
				continue;
			}
			t0 = now_s();
			memcpy(stage, ring, len);
			t1 = now_s();
			rc = rdma_op(&c, IBV_WR_RDMA_WRITE, stage_mr, stage, len, (uintptr_t)dst,
				     dst_mr->rkey);
			t2 = now_s();
			if (rc || !check(dst, len, seed))
				bail("staged RDMA WRITE: status %d or wrong bytes", rc);
			t_copy[r] = t1 - t0;
			t_staged[r] = t2 - t0;
			printf("sample pfn_send_s %s staged %d %.9g\n", param, r, t_staged[r]);
			printf("sample pfn_memcpy_s %s staged %d %.9g\n", param, r, t_copy[r]);
			printf("sample pfn_stage_write_s %s staged %d %.9g\n", param, r, t2 - t1);
		}
	}
	{
		double d = median(t_direct, rounds), s = median(t_staged, rounds);
		double m = median(t_copy, rounds);

		printf("result %d MiB: direct from the PFN ring %.1f ms (%.0f MB/s), memcpy to staging + RDMA %.1f ms (of which memcpy %.1f ms), staged/direct %.2f\n",
		       mib, d * 1e3, len / d / 1e6, s * 1e3, m * 1e3, s / d);
	}
	ibv_dereg_mr(ring_mr);
	ibv_dereg_mr(stage_mr);
	ibv_dereg_mr(dst_mr);
	conn_close(&c);
	munmap(ring, len);
	ioctl(efd, PFNMAP_IOC_FREE);
	close(efd);
	if (!wait_for(pf_idle, 30))
		bail("the PFN-map source still holds a registration after the benchmark");
	printf("bench_pfnmap: done, nothing left registered\n");
	return 0;
}
