/* SPDX-License-Identifier: GPL-2.0 */
/*
 * core_test.h - helpers of the peer-memory core guest tests: TAP output,
 * module loading, debugfs counters, rxe0 bring-up and an RC loopback
 * connection on rxe0 for RDMA WRITE/READ.
 *
 * The tests run as root in the rig VM (scripts/vm.sh) with PEERMEM_ROOT
 * set; they use libibverbs from the shared root and iproute2's ip/rdma.
 */
#ifndef CORE_TEST_H
#define CORE_TEST_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tap.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * secs scaled by the guest's measured slowdown (PEERMEM_SLOWDOWN, percent,
 * set by tests/vm/guest-init.sh; 100 if unset or lower, at most 800): the
 * limit of a wait for something that takes longer on a slower machine, so
 * that no test fails for the machine's speed alone.
 */
static double slow_s(double secs)
{
	const char *e = getenv("PEERMEM_SLOWDOWN");
	long pct = e ? strtol(e, NULL, 10) : 100;

	if (pct < 100)
		pct = 100;
	if (pct > 800)
		pct = 800;
	return secs * (double)pct / 100.0;
}

/*
 * A plain command (words of [A-Za-z0-9_./=:,+@-], at most 31, and at most a
 * trailing " 2>/dev/null") runs without /bin/sh: each program start costs
 * 0.3-2 s in the rig (KASAN, lockdep, TCG), and most commands here are an
 * insmod or rmmod. Returns its exit status, -1 if it is not plain (or did
 * not exit), with *plain saying which.
 */
static int run_plain(char *cmd, int *plain)
{
	static const char quiet[] = " 2>/dev/null";
	size_t len = strlen(cmd), ql = sizeof(quiet) - 1;
	char *argv[32], *p;
	int argc = 0, devnull = 0, st;
	pid_t pid;

	*plain = 0;
	if (len > ql && !strcmp(cmd + len - ql, quiet)) {
		cmd[len - ql] = 0;
		devnull = 1;
	}
	for (p = cmd; *p; p++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+@- ", *p))
			goto shell;
	for (p = cmd; *p; p++)
		if (*p != ' ' && (p == cmd || p[-1] == ' ') && ++argc > 31)
			goto shell;
	if (!argc)
		goto shell;
	argc = 0;
	for (p = strtok(cmd, " "); p; p = strtok(NULL, " "))
		argv[argc++] = p;
	argv[argc] = NULL;
	*plain = 1;
	pid = fork();
	if (pid == 0) {
		if (devnull) {
			int fd = open("/dev/null", O_WRONLY);

			if (fd >= 0)
				dup2(fd, 2);
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	if (pid < 0)
		return -1;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
shell:
	/* Not plain: undo the cut (strtok never runs on a refused command). */
	if (devnull)
		cmd[len - ql] = ' ';
	return -1;
}

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	int rc, plain;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fflush(stderr);
	rc = run_plain(cmd, &plain);
	if (plain)
		return rc;
	rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A decimal counter file; -1 if unreadable. */
static long long read_ll(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static long long read_ll(const char *fmt, ...)
{
	char path[512];
	long long v;
	va_list ap;
	FILE *f;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%lld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static int write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, s, strlen(s));
	close(fd);
	return n < 0 ? -errno : 0;
}

/* VmPin of this process in KiB (the pinned_vm the RDMA core charges). */
static long vm_pin_kb(void)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* ---- the core's per-client counters ---- */

struct peer_stats {
	long long alloc_mrs, dealloc_mrs, reg_pages, dereg_pages;
	long long reg_bytes, dereg_bytes, free_callbacks, invalidated_mrs;
};

static int peer_stats(const char *client, struct peer_stats *s)
{
	const char *d = "/sys/kernel/debug/peer_memory";

	s->alloc_mrs = read_ll("%s/%s/num_alloc_mrs", d, client);
	s->dealloc_mrs = read_ll("%s/%s/num_dealloc_mrs", d, client);
	s->reg_pages = read_ll("%s/%s/num_reg_pages", d, client);
	s->dereg_pages = read_ll("%s/%s/num_dereg_pages", d, client);
	s->reg_bytes = read_ll("%s/%s/num_reg_bytes", d, client);
	s->dereg_bytes = read_ll("%s/%s/num_dereg_bytes", d, client);
	s->free_callbacks = read_ll("%s/%s/num_free_callbacks", d, client);
	s->invalidated_mrs = read_ll("%s/%s/num_invalidated_mrs", d, client);
	return s->alloc_mrs < 0 ? -1 : 0;
}

/*
 * Every umem the core made through the client is undone, counted as OFED
 * 25.10 counts: a dealloc per alloc, the bytes back, and num_dereg_pages
 * never moves (OFED adds the entries of a table it has already cleared).
 * @pending: bytes of mappings a PEER_MEM_INVALIDATE_UNMAPS client
 * invalidated that are not released yet (OFED counts their
 * num_dereg_bytes at the release, not at the invalidation).
 */
static int peer_stats_settled(const struct peer_stats *s, long long pending)
{
	return s->alloc_mrs == s->dealloc_mrs && s->dereg_pages == 0 &&
	       s->dereg_bytes == s->reg_bytes - pending;
}

static int peer_stats_balanced(const struct peer_stats *s)
{
	return peer_stats_settled(s, 0);
}

static void peer_stats_diag(const char *client)
{
	struct peer_stats s;

	if (peer_stats(client, &s))
		return;
	diag("%s: alloc %lld dealloc %lld reg_pages %lld dereg_pages %lld reg_bytes %lld dereg_bytes %lld free_cb %lld invalidated %lld",
	     client, s.alloc_mrs, s.dealloc_mrs, s.reg_pages, s.dereg_pages,
	     s.reg_bytes, s.dereg_bytes, s.free_callbacks, s.invalidated_mrs);
}

/* ---- the core's umem_test hook (rig kernel only, not OFED) ---- */

#define UMEM_TEST "/sys/kernel/debug/peer_memory/umem_test"

/* What reading umem_test says about the umem its file holds. */
struct ut_info {
	char client[64], kind[8], first[40];
	long long nents, page_size, dma_bytes, translated;
	int invalidated;
};

/*
 * Get a umem of [addr, addr + len) on ibdev through the hook's file fd:
 * kind "queue" (ib_umem_get_peer(..., 0), like mlx5's queue buffers and
 * doorbell page) or "mr" (IB_PEER_MEM_INVAL_SUPP). 0 or -errno.
 */
static int ut_get(int fd, const char *ibdev, const void *addr, size_t len,
		  const char *kind)
{
	char req[160];
	ssize_t n;

	snprintf(req, sizeof(req), "%s %#lx %#zx %s\n", ibdev,
		 (unsigned long)(uintptr_t)addr, len, kind);
	n = pwrite(fd, req, strlen(req), 0);
	return n < 0 ? -errno : n == (ssize_t)strlen(req) ? 0 : -EIO;
}

/* Read the hook's line; 0 if it parses. */
static int ut_read(int fd, struct ut_info *u)
{
	char line[512];
	ssize_t n = pread(fd, line, sizeof(line) - 1, 0);

	memset(u, 0, sizeof(*u));
	if (n <= 0)
		return -1;
	line[n] = 0;
	return sscanf(line, "client=%63s kind=%7s nents=%lld page_size=%lld dma_bytes=%lld translated=%lld invalidated=%d first=%39s",
		      u->client, u->kind, &u->nents, &u->page_size,
		      &u->dma_bytes, &u->translated, &u->invalidated,
		      u->first) == 8 ? 0 : -1;
}

static void ut_diag(const struct ut_info *u)
{
	diag("umem_test: client=%s kind=%s nents=%lld page_size=%lld dma_bytes=%lld translated=%lld invalidated=%d first=%s",
	     u->client, u->kind, u->nents, u->page_size, u->dma_bytes,
	     u->translated, u->invalidated, u->first);
}

/* The u64 at p as the umem_test line prints it. */
static void ut_first(const void *p, char *buf, size_t len)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	snprintf(buf, len, "%016llx", (unsigned long long)v);
}

/* ---- rxe0 ---- */

#define RXE_DEV "rxe0"

static void rxe_up(void)
{
	if (access("/sys/class/infiniband/" RXE_DEV, F_OK) == 0)
		return;
	if (access("/sys/class/net/veth0", F_OK) != 0) {
		if (run("ip link add veth0 type veth peer name veth1"))
			bail("cannot create veth0/veth1 (CONFIG_VETH?)");
		run("ip addr add 10.55.0.1/24 dev veth0");
		run("ip link set veth0 up");
		run("ip link set veth1 up");
	}
	if (run("rdma link add " RXE_DEV " type rxe netdev veth0"))
		bail("rdma link add " RXE_DEV " failed (CONFIG_RDMA_RXE?)");
}

/* ---- an RC QP pair on rxe0 talking to itself ---- */

/*
 * Transport timeout and retry count of the QPs. A timeout of 17 (0.5 s)
 * keeps spurious retransmissions rare on a loaded, emulated machine, and
 * retry_cnt 6 (rxe retries 7 forever) turns a connection that stopped
 * answering into an error completion instead of a hang.
 */
static int qp_timeout = 17, qp_retry_cnt = 6;

struct conn {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	int gid_index;
	union ibv_gid gid;
};

static struct ibv_context *open_rxe(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list)
		return NULL;
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), RXE_DEV))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

/* The IPv4-mapped RoCE v2 GID of port 1, waiting for it to appear. */
static int find_gid(struct conn *c)
{
	double end = now_s() + slow_s(20);

	do {
		for (int i = 0; i < 16; i++) {
			union ibv_gid g;

			if (ibv_query_gid(c->ctx, 1, i, &g))
				continue;
			if (g.raw[10] == 0xff && g.raw[11] == 0xff &&
			    !memcmp(g.raw, "\0\0\0\0\0\0\0\0\0\0", 10)) {
				c->gid_index = i;
				c->gid = g;
				return 0;
			}
		}
		usleep(200000);
	} while (now_s() < end);
	return -1;
}

static int qp_to_rts(struct conn *c, struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_LOCAL_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = c->gid;
	a.ah_attr.grh.sgid_index = c->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = qp_timeout;
	a.retry_cnt = qp_retry_cnt;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct ibv_qp *make_qp(struct conn *c)
{
	struct ibv_qp_init_attr ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = c->cq;
	ia.recv_cq = c->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = 2;
	ia.cap.max_recv_sge = 2;
	return ibv_create_qp(c->pd, &ia);
}

/* (Re)create the CQ and the two QPs: an error completion kills a QP. */
static int conn_qps(struct conn *c)
{
	if (c->qa)
		ibv_destroy_qp(c->qa);
	if (c->qb)
		ibv_destroy_qp(c->qb);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	c->qa = c->qb = NULL;
	c->cq = ibv_create_cq(c->ctx, 64, NULL, NULL, 0);
	if (!c->cq)
		return -1;
	c->qa = make_qp(c);
	c->qb = make_qp(c);
	if (!c->qa || !c->qb)
		return -1;
	if (qp_to_rts(c, c->qa, c->qb->qp_num) ||
	    qp_to_rts(c, c->qb, c->qa->qp_num))
		return -1;
	return 0;
}

static int conn_open(struct conn *c)
{
	memset(c, 0, sizeof(*c));
	c->ctx = open_rxe();
	if (!c->ctx)
		return -1;
	if (find_gid(c))
		return -2;
	c->pd = ibv_alloc_pd(c->ctx);
	if (!c->pd)
		return -3;
	return conn_qps(c) ? -4 : 0;
}

static void conn_close(struct conn *c)
{
	if (c->qa)
		ibv_destroy_qp(c->qa);
	if (c->qb)
		ibv_destroy_qp(c->qb);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->ctx)
		ibv_close_device(c->ctx);
	memset(c, 0, sizeof(*c));
}

/*
 * Post one signaled work request on QP a and wait for its completion.
 * Returns the completion status, or -1 if posting failed or no completion
 * came within 30 s (the QPs' states and rxe's counters are shown then).
 */
static int post_wait(struct conn *c, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	double end;
	int n;

	n = ibv_post_send(c->qa, wr, &bad);
	if (n) {
		diag("ibv_post_send: %s", strerror(n));
		return -1;
	}
	end = now_s() + slow_s(30);
	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0) {
			diag("ibv_poll_cq failed");
			return -1;
		}
		if (n == 1) {
			if (wc.wr_id != wr->wr_id)
				diag("completion of another request (wr_id %llu)",
				     (unsigned long long)wc.wr_id);
			return wc.status;
		}
		usleep(1000);
	} while (now_s() < end);
	diag("no completion within %.0f s (30 s times the guest's slowdown)", slow_s(30));
	{
		struct ibv_qp_attr qa, qb;
		struct ibv_qp_init_attr ia;

		if (!ibv_query_qp(c->qa, &qa, IBV_QP_STATE, &ia) &&
		    !ibv_query_qp(c->qb, &qb, IBV_QP_STATE, &ia))
			diag("QP states: requester %d, responder %d", qa.qp_state,
			     qb.qp_state);
		run("cd /sys/class/infiniband/" RXE_DEV "/ports/1/hw_counters && grep -H . * | grep -v ':0$' | sed 's/^/# /'");
	}
	return -1;
}

/*
 * Post one RDMA WRITE or READ on QP a: local [laddr, +len) in lmr, remote
 * raddr/rkey (served by QP b). Returns the completion status, or -1 if
 * posting failed or no completion came within 30 s.
 */
static int rdma_op(struct conn *c, enum ibv_wr_opcode op, struct ibv_mr *lmr,
		   void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)laddr, .length = len, .lkey = lmr->lkey,
	};
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 42;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return post_wait(c, &wr);
}

/* rdma_op, then new QPs after an error completion (which leaves them in the error state); bails out if that fails. */
static int rdma_op_renew(struct conn *c, enum ibv_wr_opcode op, struct ibv_mr *lmr,
			 void *laddr, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	int rc = rdma_op(c, op, lmr, laddr, len, raddr, rkey);

	if (rc && conn_qps(c))
		bail("cannot recreate the QPs after an error completion");
	return rc;
}

/* A completion status (or -1 from rdma_op/post_wait) as text. */
static const char *wc_str(int rc)
{
	return rc < 0 ? "no completion" : ibv_wc_status_str((enum ibv_wc_status)rc);
}

static void fill(void *p, size_t len, uint32_t seed)
{
	uint32_t *w = p;

	for (size_t i = 0; i < len / 4; i++)
		w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static int check(const void *p, size_t len, uint32_t seed)
{
	const uint32_t *w = p;

	for (size_t i = 0; i < len / 4; i++)
		if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
			return 0;
	return 1;
}

#endif /* CORE_TEST_H */
