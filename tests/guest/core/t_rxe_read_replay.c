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
 *
 * Whether a READ is retransmitted depends on when the next timer tick comes
 * (one jiffy after the request went out, the completer must find no
 * response queued), so it happens to some rounds only: 0 to 35% of them,
 * depending on the machine (READs of 2 MiB instead of 64 KiB did not raise
 * the share). Each loop therefore runs ROUNDS rounds and then goes on, up
 * to MAX_ROUNDS or EXTRA_S seconds, until the responder has seen at least
 * one duplicate; a run without any would prove nothing and fails.
 */
#include "refclient_suite.h"

#ifndef ROUNDS
#define ROUNDS 20
#endif
#define MAX_ROUNDS 2000
#define EXTRA_S 90
#define RLEN (64 * 1024UL)

/* rxe's duplicate_request counter (requests the responder saw again). */
static long long rxe_dups(void)
{
	return read_ll("/sys/class/infiniband/" RXE_DEV
		       "/ports/1/hw_counters/duplicate_request");
}

/* Go on with the loop: ROUNDS first, then until a duplicate was seen. */
static int more_rounds(int i, long long d0, double end)
{
	if (i < ROUNDS)
		return 1;
	return i < MAX_ROUNDS && now_s() < end && rxe_dups() == d0;
}

static uint8_t *host_buf(size_t len)
{
	uint8_t *p = aligned_alloc(4096, len);

	if (!p)
		bail("out of memory");
	memset(p, 0, len);
	return p;
}

/*
 * One loop: each round registers a fresh RLEN target (host memory, or peer
 * memory from the reference client's source peer_fd if >= 0), READs it
 * whole, and takes it away right after the completion (peer memory is
 * revoked by an invalidation first), so a retransmitted READ finds it gone.
 * Checks that every READ completed with the data and that rxe retransmitted
 * meanwhile.
 */
static void read_loop(struct conn *c, struct ibv_mr *hmr, uint8_t *hbuf, int peer_fd)
{
	int peer = peer_fd >= 0, i, st, failed = -1;
	long long d0 = rxe_dups(), d1;
	double end = now_s() + EXTRA_S;
	struct ibv_mr *mr;
	uint8_t *p;
	uint64_t ph;
	char tk[32];

	for (i = 0; failed < 0 && more_rounds(i, d0, end); i++) {
		p = peer ? src_alloc(peer_fd, RLEN, &ph) : host_buf(RLEN);
		if (!p)
			bail("cannot allocate peer memory: %s", strerror(errno));
		fill(p, RLEN, (peer ? 0x2000 : 0x1000) + i);
		mr = ibv_reg_mr(c->pd, p, RLEN, MR_ACCESS);
		if (!mr)
			bail("cannot register %s memory: %s", peer ? "peer" : "host", strerror(errno));
		st = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, RLEN, (uintptr_t)p, mr->rkey);
		if (st || memcmp(hbuf, p, RLEN)) {
			diag("round %d: status %d", i, st);
			failed = i;
		}
		if (peer) {
			snprintf(tk, sizeof(tk), "%lld", read_ll(RDBG "last_ticket"));
			if (write_str(RDBG "invalidate_ticket", tk))
				bail("cannot invalidate ticket %s", tk);
		}
		ibv_dereg_mr(mr);
		if (peer)
			munmap(p, RLEN);
		else
			free(p);
	}
	d1 = rxe_dups();
	if (peer)
		ok(failed < 0,
		   "%d RDMA READs of %lu KiB of peer memory, each MR revoked by an invalidation right after the READ: all completed with the data (first failure: round %d)",
		   i, RLEN / 1024, failed);
	else
		ok(failed < 0,
		   "%d RDMA READs of %lu KiB, each target MR deregistered right after the READ: all completed with the data (first failure: round %d)",
		   i, RLEN / 1024, failed);
	ok(d1 > d0, "the responder answered retransmitted requests meanwhile (%lld in %d rounds)",
	   d1 - d0, i);
	if (failed >= 0 && conn_qps(c))
		bail("cannot recreate the QPs");
}

int main(void)
{
	static const struct suite_cfg cfg = {
		.invalidate = 1, .unmaps = 0, .page_kb = 64, .cpu_pages = 1,
	};
	struct ibv_mr *hmr;
	struct conn c;
	uint8_t *hbuf;
	double end;
	int fd;

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
	read_loop(&c, hmr, hbuf, -1);

	/* Peer memory: invalidate (revoke) the MR right after each READ. */
	if (load_client(&cfg))
		bail("cannot load the reference client");
	fd = src_open();
	if (fd < 0)
		bail("cannot open /dev/peer_refmem: %s", strerror(errno));
	read_loop(&c, hmr, hbuf, fd);
	/* The frees are asynchronous: wait until the client has let go. */
	end = now_s() + slow_s(30);
	while (!rc_all_idle() && now_s() < end)
		usleep(20000);
	ok(rc_all_idle(), "client: no allocation, pin or mapping left");

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(run("rmmod peer_refclient") == 0, "rmmod peer_refclient");
	return finish();
}
