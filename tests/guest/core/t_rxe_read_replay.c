// SPDX-License-Identifier: GPL-2.0
/*
 * rxe: a retransmitted RDMA READ whose memory went away must not break the
 * connection.
 *
 * With a transport timeout of one jiffy every larger READ is retransmitted
 * while its responses are still on their way (what a loaded, emulated
 * machine does with the suites' normal timeout, only always). The requester
 * completes the READ from the original responses; the responder answers the
 * duplicate afterwards. Here the target MR is deregistered, or its peer
 * memory invalidated (revoked), right after each completion, so the replay
 * finds the memory gone. The rig's rxe NAKs such a duplicate and stays
 * operational; rxe as shipped moved its QP to the error state without the
 * requester noticing, and the next READ was never answered (retry_cnt 7:
 * retried forever). Every READ of the loop must complete successfully.
 */
#include "refclient_suite.h"

#define ROUNDS 20
#define RLEN (64 * 1024)

/* rxe's duplicate_request counter (requests the responder saw again). */
static long long rxe_dups(void)
{
	return read_ll("/sys/class/infiniband/" RXE_DEV
		       "/ports/1/hw_counters/duplicate_request");
}

static uint8_t *host_buf(size_t len)
{
	uint8_t *p = aligned_alloc(4096, len);

	if (!p)
		bail("out of memory");
	memset(p, 0, len);
	return p;
}

int main(void)
{
	static const struct suite_cfg cfg = {
		.invalidate = 1, .unmaps = 0, .page_kb = 64, .cpu_pages = 1,
	};
	struct ibv_mr *hmr, *mr;
	struct conn c;
	uint8_t *hbuf, *b, *p;
	long long d0, d1;
	int i, st, failed, fd;
	uint64_t ph;
	char tk[32];

	/* Retransmit after one jiffy; retry forever, as rxe does for 7. */
	qp_timeout = 1;
	qp_retry_cnt = 7;
	use_gpusim = 0;
	psize = cfg.page_kb * 1024UL;
	rxe_up();
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	hbuf = host_buf(RLEN);
	hmr = ibv_reg_mr(c.pd, hbuf, RLEN, MR_ACCESS);
	if (!hmr)
		bail("cannot register host memory: %s", strerror(errno));

	/* Host memory: deregister the target right after each READ. */
	d0 = rxe_dups();
	failed = -1;
	for (i = 0; i < ROUNDS && failed < 0; i++) {
		b = host_buf(RLEN);
		fill(b, RLEN, 0x1000 + i);
		mr = ibv_reg_mr(c.pd, b, RLEN, MR_ACCESS);
		if (!mr)
			bail("cannot register host memory: %s", strerror(errno));
		st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, RLEN,
			     (uintptr_t)b, mr->rkey);
		if (st || memcmp(hbuf, b, RLEN)) {
			diag("round %d: status %d", i, st);
			failed = i;
		}
		ibv_dereg_mr(mr);
		free(b);
	}
	d1 = rxe_dups();
	ok(failed < 0,
	   "%d RDMA READs, each target MR deregistered right after the READ: all completed with the data (first failure: round %d)",
	   ROUNDS, failed);
	ok(d1 > d0, "the responder answered retransmitted requests meanwhile (%lld)",
	   d1 - d0);
	if (failed >= 0 && conn_qps(&c))
		bail("cannot recreate the QPs");

	/* Peer memory: invalidate (revoke) the MR right after each READ. */
	if (load_client(&cfg))
		bail("cannot load the reference client");
	fd = src_open();
	if (fd < 0)
		bail("cannot open /dev/peer_refmem: %s", strerror(errno));
	d0 = rxe_dups();
	failed = -1;
	for (i = 0; i < ROUNDS && failed < 0; i++) {
		p = src_alloc(fd, PEER_LEN, &ph);
		if (!p)
			bail("cannot allocate peer memory: %s", strerror(errno));
		fill(p, RLEN, 0x2000 + i);
		mr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		if (!mr)
			bail("cannot register peer memory: %s", strerror(errno));
		st = rdma_op(&c, IBV_WR_RDMA_READ, hmr, hbuf, RLEN,
			     (uintptr_t)p, mr->rkey);
		if (st || memcmp(hbuf, p, RLEN)) {
			diag("round %d: status %d", i, st);
			failed = i;
		}
		snprintf(tk, sizeof(tk), "%lld", read_ll(RDBG "last_ticket"));
		if (write_str(RDBG "invalidate_ticket", tk))
			bail("cannot invalidate ticket %s", tk);
		ibv_dereg_mr(mr);
		munmap(p, PEER_LEN);
	}
	d1 = rxe_dups();
	ok(failed < 0,
	   "%d RDMA READs of peer memory, each MR revoked by an invalidation right after the READ: all completed with the data (first failure: round %d)",
	   ROUNDS, failed);
	ok(d1 > d0, "the responder answered retransmitted requests meanwhile (%lld)",
	   d1 - d0);
	/* The frees are asynchronous: wait until the client has let go. */
	{
		double end = now_s() + 30;

		while (!rc_all_idle() && now_s() < end)
			usleep(20000);
	}
	ok(rc_all_idle(), "client: no allocation, pin or mapping left");

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(run("rmmod peer_refclient") == 0, "rmmod peer_refclient");
	return finish();
}
