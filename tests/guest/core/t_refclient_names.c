// SPDX-License-Identifier: GPL-2.0
/*
 * Client names, registration order and OFED's memory_peers, with the
 * reference client (refmem source, invalidating, 64 KiB pages):
 *
 * - OFED 25.10 checks no name: two clients of the same name both register
 *   (the reference client's twin=1 registers a second one after the first),
 *   the first registered is asked first and claims, the second is asked
 *   only when the first declines; the rig's debugfs names the second
 *   <name>-2. *client_context starts as garbage (OFED: an uninitialised
 *   variable; the rig: a poison value) and is not reset between clients.
 *   Any positive acquire() return claims. A name with '/' registers too.
 * - /sys/kernel/mm/memory_peers/ exists only on an OFED built for a kernel
 *   that exports mm_kobj, which no current kernel does: absent by default,
 *   present for clients registered while the rig knob
 *   ib_core.peer_mem_sysfs is 1 (version and OFED's seven counters); a
 *   second client of the same name is then refused, as OFED's
 *   kobject_add() refuses it.
 */
#include "refclient_suite.h"

#define KNOB "/sys/module/ib_core/parameters/peer_mem_sysfs"
#define PMDBG "/sys/kernel/debug/peer_memory/"
#define MMPEERS "/sys/kernel/mm/memory_peers"
/* What the client's decline leaves in *client_context (peer_refclient.c). */
#define DECLINE_MARK 0x7265666c64636cULL

static char knob0[8];

static void knob_restore(void)
{
	if (knob0[0])
		write_str(KNOB, knob0[0] == 'Y' ? "1" : "0");
}

static int insmod_ref(const char *args)
{
	const char *root = getenv("PEERMEM_ROOT") ?: ".";

	if (access("/sys/module/peer_refclient", F_OK) == 0)
		run("rmmod peer_refclient");
	return run("insmod %s/tests/refclient/peer_refclient.ko %s 2>/dev/null",
		   root, args);
}

static int rmmod_ref(void)
{
	return run("rmmod peer_refclient");
}

static unsigned long long read_hex(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	if (fscanf(f, "%llx", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static int read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	buf[0] = 0;
	if (!f)
		return -1;
	if (!fgets(buf, len, f))
		buf[0] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* Lines of the kernel log matching an extended regex. */
static int klog_count(const char *re)
{
	char cmd[512];
	int n = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "dmesg | grep -cE '%s'", re);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &n) != 1)
		n = -1;
	pclose(f);
	return n;
}

/* Register [p, +PEER_LEN), READ it back, deregister; the READ status. */
static int reg_read(struct conn *c, struct ibv_mr *hmr, uint8_t *hbuf,
		    uint8_t *p, uint32_t seed)
{
	struct ibv_mr *mr;
	int rc;

	fill(p, PEER_LEN, seed);
	mr = ibv_reg_mr(c->pd, p, PEER_LEN, MR_ACCESS);
	if (!mr) {
		diag("ibv_reg_mr: %s", strerror(errno));
		return -1;
	}
	rc = rdma_op(c, IBV_WR_RDMA_READ, hmr, hbuf, PEER_LEN, (uintptr_t)p,
		     mr->rkey);
	if (!rc && memcmp(hbuf, p, PEER_LEN))
		rc = -2;
	if (ibv_dereg_mr(mr))
		rc = -3;
	return rc;
}

static void twin_checks(void)
{
	struct peer_stats a0, a1, b0, b1;
	struct ibv_mr *hmr, *mr;
	char flags[128];
	struct conn c;
	uint8_t *hbuf, *p;
	long long acq, tacq;
	unsigned long long ctx;
	int fd, rc, regs0;

	regs0 = klog_count("peer_mem: registered client refclient ");
	rc = insmod_ref("name=" CLIENT " twin=1 invalidate=1 page_kb=64");
	ok(rc == 0, "insmod peer_refclient twin=1: a second client named " CLIENT " registers after the first (OFED refuses no name)");
	if (rc)
		bail("cannot load the reference client with twin=1");
	read_line(PMDBG CLIENT "-2/flags", flags, sizeof(flags));
	ok(peer_stats(CLIENT, &a0) == 0 && peer_stats(CLIENT "-2", &b0) == 0 &&
	   !strcmp(flags, "invalidate=1 invalidate_unmaps=0") &&
	   klog_count("peer_mem: registered client refclient ") == regs0 + 2,
	   "both are registered; the rig's debugfs shows the second as " CLIENT "-2 (rig only)");

	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	hbuf = aligned_alloc(4096, HOST_LEN);
	if (!hbuf)
		bail("out of memory");
	memset(hbuf, 0, HOST_LEN);
	hmr = ibv_reg_mr(c.pd, hbuf, HOST_LEN, MR_ACCESS);
	fd = src_open();
	p = fd >= 0 ? src_alloc(fd, PEER_LEN, &(uint64_t){ 0 }) : NULL;
	if (!hmr || !p)
		bail("cannot set up memory: %s", strerror(errno));

	acq = rc_live("acquire_calls");
	tacq = rc_live("twin_acquire_calls");
	rc = reg_read(&c, hmr, hbuf, p, 0x7171);
	peer_stats(CLIENT, &a1);
	peer_stats(CLIENT "-2", &b1);
	ok(rc == 0 && a1.alloc_mrs == a0.alloc_mrs + 1 &&
	   b1.alloc_mrs == b0.alloc_mrs &&
	   rc_live("acquire_calls") == acq + 1 &&
	   rc_live("twin_acquire_calls") == tacq,
	   "a peer MR: the first registered claims it, the second is never asked (status %d)",
	   rc);
	ctx = read_hex(RDBG "ctx_on_entry");
	ok(ctx != 0, "acquire() finds garbage, not NULL, in *client_context (%#llx): a client must set it when it claims",
	   ctx);

	/* The first declines, after writing into *client_context. */
	write_str(RDBG "decline", "1");
	a0 = a1;
	b0 = b1;
	rc = reg_read(&c, hmr, hbuf, p, 0x7272);
	peer_stats(CLIENT, &a1);
	peer_stats(CLIENT "-2", &b1);
	ok(rc == 0 && a1.alloc_mrs == a0.alloc_mrs &&
	   b1.alloc_mrs == b0.alloc_mrs + 1 &&
	   rc_live("twin_acquire_calls") == tacq + 1 &&
	   rc_live("twin_claims") == 1 && peer_stats_balanced(&b1),
	   "when the first declines, the second of the same name is asked, claims, and serves the MR (status %d)",
	   rc);
	ctx = read_hex(RDBG "twin_ctx_on_entry");
	ok(ctx == DECLINE_MARK,
	   "*client_context is not reset between clients: the second finds what the first left there (%#llx)",
	   ctx);
	write_str(RDBG "decline", "0");

	/* Any positive return of acquire() claims. */
	write_str(RDBG "acquire_ret", "2");
	a0 = a1;
	rc = reg_read(&c, hmr, hbuf, p, 0x7373);
	peer_stats(CLIENT, &a1);
	ok(rc == 0 && a1.alloc_mrs == a0.alloc_mrs + 1 &&
	   rc_live("twin_acquire_calls") == tacq + 1,
	   "acquire() returning 2 claims the range, as OFED takes any value > 0 (status %d)",
	   rc);
	write_str(RDBG "acquire_ret", "1");

	/* Host memory pins; no client is asked. */
	acq = rc_live("acquire_calls");
	mr = ibv_reg_mr(c.pd, hbuf + 65536, 65536, MR_ACCESS);
	ok(mr && rc_live("acquire_calls") == acq &&
	   rc_live("twin_acquire_calls") == tacq + 1,
	   "host memory pins normally; neither client is asked");
	if (mr)
		ibv_dereg_mr(mr);

	src_free(fd, p, PEER_LEN, 0);
	close(fd);
	ibv_dereg_mr(hmr);
	conn_close(&c);
	free(hbuf);
	rc = rmmod_ref();
	ok(rc == 0 && access(PMDBG CLIENT, F_OK) != 0 &&
	   access(PMDBG CLIENT "-2", F_OK) != 0,
	   "rmmod unregisters both; their debugfs directories are gone");

	/* No name check: a name no directory can have registers too. */
	rc = insmod_ref("name=a/b invalidate=0");
	ok(rc == 0 && klog_count("peer_mem: registered client a/b ") >= 1 &&
	   klog_count("client name .a/b. cannot name a debugfs directory") >= 1,
	   "a client named a/b registers (OFED checks no name); the rig only skips its debugfs directory");
	if (rc == 0)
		rmmod_ref();
}

static void sysfs_checks(void)
{
	char ver[64];
	int rc, refused0;

	ok(access(MMPEERS, F_OK) != 0 && knob0[0] == 'N',
	   "no %s while ib_core.peer_mem_sysfs is N (the default: OFED 25.10 on a kernel without mm_kobj)",
	   MMPEERS);
	rc = write_str(KNOB, "1");
	ok(rc == 0, "set ib_core.peer_mem_sysfs=1 (emulate an OFED for a kernel exporting mm_kobj)");
	rc = insmod_ref("name=" CLIENT " invalidate=1");
	read_line(MMPEERS "/" CLIENT "/version", ver, sizeof(ver));
	ok(rc == 0 && !strcmp(ver, "1.0") &&
	   read_ll(MMPEERS "/" CLIENT "/num_alloc_mrs") == 0 &&
	   read_ll(MMPEERS "/" CLIENT "/num_dereg_pages") == 0 &&
	   read_ll(MMPEERS "/" CLIENT "/num_free_callbacks") == 0 &&
	   access(MMPEERS "/" CLIENT "/num_invalidated_mrs", F_OK) != 0,
	   "a client registered now has %s/" CLIENT "/ with version (%s) and OFED's counters only",
	   MMPEERS, ver);
	if (rc == 0) {
		struct ibv_mr *mr;
		struct peer_stats s;
		struct conn c;
		uint8_t *p;
		long long n;
		int fd;

		/* The same counters as the rig's debugfs, OFED's semantics. */
		fd = src_open();
		p = fd >= 0 ? src_alloc(fd, PEER_LEN, &(uint64_t){ 0 }) : NULL;
		if (conn_open(&c) || !p)
			bail("cannot set up the MR test: %s", strerror(errno));
		mr = ibv_reg_mr(c.pd, p, PEER_LEN, MR_ACCESS);
		n = rc_live("last_nents");
		peer_stats(CLIENT, &s);
		ok(mr && read_ll(MMPEERS "/" CLIENT "/num_alloc_mrs") == 1 &&
		   read_ll(MMPEERS "/" CLIENT "/num_reg_pages") == n &&
		   read_ll(MMPEERS "/" CLIENT "/num_reg_bytes") == (long long)PEER_LEN &&
		   s.reg_pages == n,
		   "a peer MR shows in memory_peers as in debugfs: num_alloc_mrs 1, num_reg_pages %lld (DMA entries), num_reg_bytes %lu",
		   n, PEER_LEN);
		ok(mr && ibv_dereg_mr(mr) == 0 &&
		   read_ll(MMPEERS "/" CLIENT "/num_dealloc_mrs") == 1 &&
		   read_ll(MMPEERS "/" CLIENT "/num_dereg_bytes") == (long long)PEER_LEN &&
		   read_ll(MMPEERS "/" CLIENT "/num_dereg_pages") == 0,
		   "after ibv_dereg_mr: num_dealloc_mrs 1, num_dereg_bytes %lu, num_dereg_pages 0 (as OFED)",
		   PEER_LEN);
		conn_close(&c);
		src_free(fd, p, PEER_LEN, 0);
		close(fd);
		rmmod_ref();
	}
	ok(access(MMPEERS "/" CLIENT, F_OK) != 0,
	   "unregistering removes its directory");

	/*
	 * The kernel's sysfs prints "cannot create duplicate filename" with a
	 * stack dump here, as under OFED with mm_kobj; scripts/vm.sh does not
	 * count that as a kernel report.
	 */
	refused0 = klog_count("cannot create /sys/kernel/mm/memory_peers/refclient");
	rc = insmod_ref("name=" CLIENT " twin=1 invalidate=1");
	ok(rc != 0 &&
	   klog_count("cannot create /sys/kernel/mm/memory_peers/refclient") == refused0 + 1 &&
	   access(PMDBG CLIENT, F_OK) != 0 && access(MMPEERS "/" CLIENT, F_OK) != 0,
	   "with memory_peers, a second client named " CLIENT " is refused (register returns NULL, as OFED's kobject_add fails); the first is unregistered again by the failed load");
	if (rc == 0)
		rmmod_ref();

	rc = write_str(KNOB, "0");
	ok(rc == 0, "ib_core.peer_mem_sysfs back to 0");
	rc = insmod_ref("name=" CLIENT " invalidate=1");
	ok(rc == 0 && access(MMPEERS "/" CLIENT, F_OK) != 0 &&
	   access(PMDBG CLIENT, F_OK) == 0,
	   "a client registered after that has no memory_peers directory again");
	if (rc == 0)
		rmmod_ref();
}

int main(void)
{
	psize = 64 * 1024;
	use_gpusim = 0;
	rxe_up();
	if (read_line(KNOB, knob0, sizeof(knob0)))
		bail("%s is missing: the rig kernel's core has no peer_mem_sysfs knob", KNOB);
	atexit(knob_restore);
	twin_checks();
	sysfs_checks();
	ok(run("dmesg | grep -Eq 'peer_refclient: (leaked|.*before|.*did not fill|.*still pinned|.*another device)'") != 0,
	   "the client saw every call in order and reported no leak at unload");
	return finish();
}
