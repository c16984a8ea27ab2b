// SPDX-License-Identifier: GPL-2.0
/*
 * pm_demo - GPUDirect RDMA on emulated GPU memory, step by step, for a
 * person to read (run by tests/vm/demo-guest.sh in the rig VM).
 *
 *   pm_demo CLIENT [KIB]
 *
 * CLIENT is a peer-memory client of the adapter table (common.c: peermem,
 * refclient), already loaded, as gpusim is, and rxe0 is up. pm_demo
 * allocates KIB (default 1024) of gpusim memory, registers it with
 * ibv_reg_mr(), RDMA-writes into it and reads from it over an RC loopback
 * on rxe0 and checks the bytes through gpusim's CPU mapping, shows the
 * counters, then frees the GPU memory with the MR still registered and
 * shows that the next RDMA fails and ibv_dereg_mr() still works.
 * Exit status 0 if everything behaved as it must, 1 otherwise.
 */
#include <arpa/inet.h>
#include <dirent.h>

#include "../core/core_test.h"
#include "e2e.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
	     IBV_ACCESS_REMOTE_READ)

static const struct e2e_client *C;
static int bad;

static void step(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void step(const char *fmt, ...)
{
	static int n;
	va_list ap;

	printf("\n[%d] ", ++n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* "    what" or, if !good, "    UNEXPECTED: what" (and the demo fails). */
static void say(int good, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int good, const char *fmt, ...)
{
	va_list ap;

	printf("    %s", good ? "" : "UNEXPECTED: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (!good)
		bad++;
}

static const char *dir_prefix;

static int wanted(const struct dirent *d)
{
	return d->d_name[0] != '.' &&
	       (!dir_prefix || !strncmp(d->d_name, dir_prefix, strlen(dir_prefix)));
}

/* The counter files of @dir (starting with @prefix, if set), "name=value". */
static void show_dir(const char *label, const char *dir, const char *prefix)
{
	struct dirent **ents;
	int n, i, col = 0;

	dir_prefix = prefix;
	n = scandir(dir, &ents, wanted, alphasort);
	if (n < 0) {
		printf("    %s %s: (absent)\n", label, dir);
		return;
	}
	printf("    %s %s:\n", label, dir);
	for (i = 0; i < n; i++) {
		char val[64];

		if (read_line(val, sizeof(val), "%s/%s", dir, ents[i]->d_name) > 0) {
			printf("%s%s=%s", col ? "  " : "      ", ents[i]->d_name, val);
			if (++col == 4) {
				printf("\n");
				col = 0;
			}
		}
		free(ents[i]);
	}
	if (col)
		printf("\n");
	free(ents);
}

static void show_counters(void)
{
	char d[300];

	snprintf(d, sizeof(d), CORE_DBG "%s", C->core_name);
	show_dir("core  ", d, "num_");
	if (C->dbg)
		show_dir("client", C->dbg, NULL);
	printf("    gpusim: live_allocs=%lld live_pins=%lld live_vmas=%lld live_mem_bytes=%lld free_callbacks=%lld\n",
	       read_ll(GSDBG "live_allocs"), read_ll(GSDBG "live_pins"),
	       read_ll(GSDBG "live_vmas"), read_ll(GSDBG "live_mem_bytes"),
	       read_ll(GSDBG "free_callbacks"));
}

/* One RDMA operation, described; returns its completion status. */
static int xfer(struct conn *c, enum ibv_wr_opcode op, struct ibv_mr *lmr,
		void *laddr, size_t len, uint64_t raddr, uint32_t rkey)
{
	double t = now_s();
	int st = rdma_op(c, op, lmr, laddr, len, raddr, rkey);

	printf("    %s of %zu bytes, local %p (lkey 0x%x) <-> remote 0x%llx (rkey 0x%x): %s (%.1f ms)\n",
	       op == IBV_WR_RDMA_WRITE ? "RDMA WRITE" : "RDMA READ", len, laddr,
	       lmr->lkey, (unsigned long long)raddr, rkey,
	       st > 0 ? ibv_wc_status_str(st) : st == 0 ? "success" : "no completion",
	       (now_s() - t) * 1000);
	return st;
}

/* How many of @len bytes at @a equal @b. */
static size_t same_bytes(const uint8_t *a, const uint8_t *b, size_t len)
{
	size_t i, n = 0;

	for (i = 0; i < len; i++)
		n += a[i] == b[i];
	return n;
}

/*
 * munmap of a registered range: the address no longer means the GPU
 * memory, and the client revokes the MR (asynchronously, from a work item).
 */
static void unmap_step(struct conn *c, struct ibv_mr *hmr, uint8_t *hbuf, int fd)
{
	size_t len = 256 * 1024;
	struct peer_stats s0, s1;
	long long a0, a1;
	struct gpu_buf g2;
	struct ibv_mr *mr;
	int rc, st;

	step("Unmap a registered GPU range (munmap while the MR is registered)");
	if ((rc = gpu_alloc(&g2, fd, len))) {
		say(0, "cannot allocate gpusim memory: %s", strerror(-rc));
		return;
	}
	mr = ibv_reg_mr(c->pd, g2.p, len, ACC);
	if (!mr) {
		say(0, "ibv_reg_mr on %zu KiB of GPU memory: %s", len / 1024, strerror(errno));
		gpu_free(&g2);
		gpu_unmap(&g2);
		return;
	}
	say(1, "another %zu KiB of GPU memory at %p registered: rkey 0x%x", len / 1024,
	    (void *)g2.p, mr->rkey);
	peer_stats(C->core_name, &s0);
	a0 = read_ll("%s/address_changes", C->dbg);
	rc = munmap(g2.p, len);
	{
		double end = now_s() + slow_s(20);

		while (peer_stats(C->core_name, &s1) == 0 &&
		       s1.invalidated_mrs == s0.invalidated_mrs && now_s() < end)
			usleep(20000);
	}
	a1 = read_ll("%s/address_changes", C->dbg);
	say(rc == 0 && s1.invalidated_mrs == s0.invalidated_mrs + 1 && a1 == a0 + 1,
	    "munmap -> %d; the client's mmu notifier saw the range go and revoked the MR through ib_core: address_changes %lld -> %lld, num_invalidated_mrs %lld -> %lld (the GPU memory itself is still allocated)",
	    rc, a0, a1, s0.invalidated_mrs, s1.invalidated_mrs);
	st = xfer(c, IBV_WR_RDMA_WRITE, hmr, hbuf, 65536, (uintptr_t)g2.p, mr->rkey);
	say(st > 0, "RDMA WRITE through the old rkey: the HCA refused it (%s), so it can no longer reach memory the address stopped meaning",
	    st > 0 ? ibv_wc_status_str(st) : "it did NOT refuse");
	conn_qps(c);
	rc = ibv_dereg_mr(mr);
	say(rc == 0, "ibv_dereg_mr -> %d", rc);
	g2.p = NULL;	/* unmapped already */
	rc = gpu_free(&g2);
	say(rc == 0, "GPUSIM_IOC_FREE of that allocation -> %d (no free callback: the client had let go)", rc);
}

int main(int argc, char **argv)
{
	struct peer_stats s0, s1;
	struct gpu_buf g;
	struct conn c;
	struct ibv_mr *hmr, *mr;
	size_t len = 1024 * 1024, part, same;
	uint8_t *hbuf, *saved;
	char gid[64];
	int fd, rc, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2 || argc > 3 || !(C = e2e_client_find(argv[1]))) {
		fprintf(stderr, "usage: pm_demo CLIENT [KIB]\n");
		return 2;
	}
	if (argc == 3) {
		char *e;
		unsigned long k = strtoul(argv[2], &e, 0);

		if (*e || k < 128 || k > 65536) {
			fprintf(stderr, "pm_demo: KIB must be 128..65536, not '%s'\n", argv[2]);
			return 2;
		}
		len = k * 1024;
	}
	part = len / 4;
	hbuf = aligned_alloc(4096, len);
	saved = malloc(len);
	if (!hbuf || !saved)
		return 1;
	printf("pm_demo: ibv_reg_mr() on GPU memory (gpusim, the emulated GPU) served by the peer-memory client \"%s\"\n",
	       C->core_name);

	step("Allocate GPU memory (what cudaMalloc does)");
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0 || (rc = gpu_alloc(&g, fd, len))) {
		say(0, "cannot allocate gpusim memory: %s (is gpusim loaded?)",
		    strerror(fd < 0 ? errno : -rc));
		return 1;
	}
	say(1, "GPUSIM_IOC_ALLOC %zu KiB -> GPU virtual address %p (handle %llu)",
	    len / 1024, (void *)g.p, (unsigned long long)g.handle);
	fill(g.p, len, 0xdeadbeef);
	say(1, "wrote a test pattern into it through gpusim's CPU mapping");

	step("Open %s and connect two RC queue pairs to each other (loopback)", RXE_DEV);
	rc = conn_open(&c);
	if (rc) {
		say(0, "cannot set up the RC loopback on %s (step %d)", RXE_DEV, rc);
		return 1;
	}
	inet_ntop(AF_INET6, c.gid.raw, gid, sizeof(gid));
	say(1, "QP %u <-> QP %u, GID index %d (%s), path MTU 1024", c.qa->qp_num,
	    c.qb->qp_num, c.gid_index, gid);
	hmr = ibv_reg_mr(c.pd, hbuf, len, ACC);
	if (!hmr) {
		say(0, "ibv_reg_mr on a host buffer: %s", strerror(errno));
		return 1;
	}
	say(1, "host buffer %p registered the ordinary way (pinned): lkey 0x%x rkey 0x%x",
	    (void *)hbuf, hmr->lkey, hmr->rkey);

	step("ibv_reg_mr(pd, %p, %zu, LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ) on the GPU memory",
	     (void *)g.p, len);
	peer_stats(C->core_name, &s0);
	mr = ibv_reg_mr(c.pd, g.p, len, ACC);
	if (!mr) {
		say(0, "ibv_reg_mr failed: %s", strerror(errno));
		show_counters();
		return 1;
	}
	peer_stats(C->core_name, &s1);
	say(1, "-> lkey 0x%x rkey 0x%x", mr->lkey, mr->rkey);
	say(s1.alloc_mrs == s0.alloc_mrs + 1,
	    "the pages could not be pinned as host memory, so ib_core asked its peer-memory clients and \"%s\" took the range (num_alloc_mrs %lld -> %lld)",
	    C->core_name, s0.alloc_mrs, s1.alloc_mrs);
	show_counters();

	step("RDMA WRITE: host buffer -> GPU memory");
	fill(hbuf, part, 0x0badcafe);
	st = xfer(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, part,
		  (uintptr_t)g.p + part, mr->rkey);
	same = same_bytes(g.p + part, hbuf, part);
	say(st == 0 && same == part,
	    "read back through gpusim's CPU mapping at GPU +%zu KiB: %zu of %zu bytes as written",
	    part / 1024, same, part);

	step("RDMA READ: GPU memory -> host buffer");
	memset(hbuf + part, 0, part);
	st = xfer(&c, IBV_WR_RDMA_READ, hmr, hbuf + part, part,
		  (uintptr_t)g.p + 2 * part, mr->rkey);
	same = same_bytes(hbuf + part, g.p + 2 * part, part);
	say(st == 0 && same == part,
	    "host buffer now holds %zu of %zu bytes equal to the GPU memory at +%zu KiB",
	    same, part, 2 * part / 1024);

	step("Free the GPU memory while the MR is still registered (what cudaFree does)");
	memcpy(saved, g.p, len);
	peer_stats(C->core_name, &s0);
	rc = gpu_free(&g);
	say(rc == 0, "GPUSIM_IOC_FREE -> %d (gpusim calls the free callback of every pin on the memory: here the client's)",
	    rc);
	{
		double end = now_s() + slow_s(20);

		while (peer_stats(C->core_name, &s1) == 0 &&
		       s1.invalidated_mrs == s0.invalidated_mrs && now_s() < end)
			usleep(50000);
	}
	say(s1.invalidated_mrs == s0.invalidated_mrs + 1,
	    "the client invalidated the MR through ib_core: num_free_callbacks %lld -> %lld, num_invalidated_mrs %lld -> %lld",
	    s0.free_callbacks, s1.free_callbacks, s0.invalidated_mrs,
	    s1.invalidated_mrs);
	fill(hbuf, 65536, 0x1234567);
	st = xfer(&c, IBV_WR_RDMA_WRITE, hmr, hbuf, 65536, (uintptr_t)g.p,
		  mr->rkey);
	same = same_bytes(g.p, saved, len);
	say(st > 0 && same == len,
	    "the HCA refused the access (%s); the old memory is untouched (%zu of %zu bytes unchanged)",
	    st > 0 ? ibv_wc_status_str(st) : "it did NOT refuse", same, len);
	conn_qps(&c);	/* the error moved the QPs to the error state */

	step("ibv_dereg_mr on the invalidated MR");
	rc = ibv_dereg_mr(mr);
	say(rc == 0, "-> %d (deregistering an invalidated MR still succeeds)", rc);

	/* A client that watches address-space changes (peermem's mmu notifier). */
	if (C->dbg && read_ll("%s/address_changes", C->dbg) >= 0)
		unmap_step(&c, hmr, hbuf, fd);
	gpu_unmap(&g);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	{
		double end = now_s() + slow_s(20);

		while ((peer_stats(C->core_name, &s1) || !e2e_core_balanced(&s1) ||
			read_ll(GSDBG "live_mem_bytes") != 0) && now_s() < end)
			usleep(50000);
	}
	say(e2e_core_balanced(&s1) && read_ll(GSDBG "live_pins") == 0 &&
	    read_ll(GSDBG "live_allocs") == 0 && read_ll(GSDBG "live_mem_bytes") == 0,
	    "every registration undone (num_alloc_mrs = num_dealloc_mrs = %lld), gpusim holds nothing",
	    s1.dealloc_mrs);

	printf("\npm_demo: %s\n", bad ? "SOMETHING UNEXPECTED HAPPENED (see UNEXPECTED above)" :
	       "every step behaved as it must");
	return bad ? 1 : 0;
}
