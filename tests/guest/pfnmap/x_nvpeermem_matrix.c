// SPDX-License-Identifier: GPL-2.0
/*
 * The race matrix (t_peermem_matrix.c) against NVIDIA's nvidia-peermem,
 * unmodified (550.163.01, tests/nvpeermem/nvidia-peermem.ko; with
 * NVPEERMEM_BRANCH=595, tests/nvpeermem/595/ with persistent_api_support=0,
 * its invalidating nv_mem as 550's): each revocation cause landed in each
 * phase of a registration that nv_mem serves, where that can apply.
 * On request only (x_: tests/run-all.sh runs t_* programs; docs/testing.md
 * has the table and how to run it):
 *
 *   scripts/vm.sh --kdir $K --test-timeout 1800 -- tests/guest/pfnmap/x_nvpeermem_matrix
 *
 * How a phase is held open. nvidia-peermem has none of peermem's
 * inject_delay_* knobs; gpusim's delay_us sleeps at the entry of every
 * nvidia_p2p_* call, after counting it in calls/<entry>. So a phase is the
 * GPU-driver call nvidia-peermem makes in it, and the cause lands at that
 * call's entry, before its work (the pin, the mapping, the unpin):
 *   acquire    nv_mem_acquire's nvidia_p2p_get_pages (get_pages call 1)
 *   pre-gp     nv_mem_acquire's nvidia_p2p_put_pages (put_pages call 1):
 *              after acquire's pin, before get_pages (the closest gpusim
 *              can hold open: nothing of the driver runs between the two)
 *   get_pages  nv_mem_get_pages' nvidia_p2p_get_pages (get_pages call 2)
 *   dma_map    nv_dma_map's nvidia_p2p_dma_map_pages
 *   live       none: the cause comes after ibv_reg_mr returned
 *   dma_unmap  nv_dma_unmap's nvidia_p2p_dma_unmap_pages (deregistration)
 *   put_pages  nv_mem_put_pages' nvidia_p2p_put_pages (deregistration)
 *   release    not applicable: nv_mem_release calls nothing of the GPU
 *              driver (sg_free_table, kfree, module_put): no window gpusim
 *              can hold open there.
 * The program sets delay_us, and a second thread waits for the phase's
 * call counter to move, clears delay_us (so that no later call, nor the
 * cause's own free callback, sleeps), and fires the cause. Landed: fired
 * before the call's sleep can have ended (the sleep began after the last
 * poll that saw the counter still, and lasts the whole window) and before
 * the next call of the registration was counted. A cell whose cause did
 * not land in every round fails.
 *
 * Causes: GPU free, munmap, mremap, mmap(MAP_FIXED), fork then the
 * child's exit, exit of the registering process, unload (delete_module of
 * nvidia_peermem, as rmmod does it). Not applicable: the PFN source's zap
 * and mprotect (nvidia-peermem serves no PFN-mapped memory); nv_mem_nc
 * (nv_mem is registered first and claims every gpusim range, so nv_mem_nc
 * never serves a registration while nv_mem is there).
 *
 * Each round records what happened rather than peermem's promise, since
 * nvidia-peermem's known defects (docs/testing.md: t_free_window, the soak) are
 * expected here: the registration's result (ok or its errno); for a
 * registered MR, whether the core was told (its invalidated count moved)
 * and what an RDMA WRITE after the cause did (refused, or landed: in the
 * freed GPU memory, in memory the process unmapped or moved); the
 * nvidia-peermem messages of the round ("invalid dma_mapping" and the
 * like); rmmod's result. A cell passes when the cause landed in every
 * round, nothing is left afterwards (gpusim's pins and DMA mappings,
 * nvidia-peermem's module references, the core's mappings), no kernel
 * report (BUG, WARNING, lockdep, hung task) appeared, rmmod did not return
 * 0 while an MR of the module was registered, and every RDMA WRITE
 * completed (in success or with a remote access error). A WRITE that
 * lands after a revoking cause is a finding, counted and printed, not a
 * failure: it is one of nvidia-peermem's known defects (no mmu notifier;
 * the free window), and gpusim keeps a freed allocation's memory while a
 * pin or mapping holds it, so it lands harmlessly here.
 *
 * gpusim runs without its RM lock (rm_lock=0), as t_free_window does for
 * nvidia-peermem: with it, lockdep reports nvidia-peermem's mapping-lock /
 * RM cycle (x_nvpeermem_rmrace's subject) and the program would measure
 * that instead. NVMX_ROUNDS (default 1) rounds a cell, NVMX_DELAY_MS
 * (default 150, times the slowdown) the window, NVMX_ONLY=cause[,phase].
 */
#define _GNU_SOURCE
#include "matrix_test.h"

#define GLEN (128 * 1024UL)	/* 2 GPU pages */
#define WLEN 4096

/* The causes (zap and mprotect not applicable here), phases and their names: matrix_test.h. */

/* The gpusim call that holds a phase open: calls/<mark> moved by need; the next call after it. */
static const struct {
	const char *mark;
	int need;
	const char *next;
	int next_need;
} win[NPHASES] = {
	[ACQ] = { "get_pages", 1, "put_pages", 1 },
	[PREGP] = { "put_pages", 1, "get_pages", 2 },
	[GP] = { "get_pages", 2, "dma_map_pages", 1 },
	[MAP] = { "dma_map_pages", 1, NULL, 0 },
	[LIVE] = { NULL, 0, NULL, 0 },
	[UNMAP] = { "dma_unmap_pages", 1, "put_pages", 1 },
	[PUT] = { "put_pages", 1, NULL, 0 },
	[REL] = { NULL, 0, NULL, 0 },
};

struct tally {
	int rounds, landed, inside;
	int reg_ok, reg_err[4];		/* EFAULT, EINVAL, ENOMEM, other */
	int told, write_refused, write_landed, write_landed_freed;
	int nv_msgs, rmmod_busy, rmmod_ok, rmmod_err, bad;
};

static struct tally tal[NCAUSES][NPHASES];
static int delay_ms = 150, rounds_per_cell = 1;
static const char *only;
static const char *nv_ko, *nv_args = "";
static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int gfd = -1, kmsg = -1;

#define CORE "nv_mem"
#define NVMOD "nvidia_peermem"

static long long calls(const char *entry)
{
	return read_ll(GSDBG "calls/%s", entry);
}

static long long nv_refcnt(void)
{
	return read_ll("/sys/module/" NVMOD "/refcnt");
}

static int nv_load(void)
{
	return run("insmod %s/%s %s", root_dir(), nv_ko, nv_args);
}

/* Kernel log since the last call: reports (returned) and nvidia-peermem's own errors (*nv). */
static int kernel_reports(const char *cell, int *nv)
{
	char rec[2048];
	const char *msg;
	int n = 0;

	while ((msg = kmsg_next(kmsg, rec, sizeof(rec)))) {
		if (strstr(msg, "nvidia-peermem") && strstr(msg, "ERROR")) {
			if (nv && (*nv)++ < 3)
				diag("%s: kernel: %s", cell, msg);
			continue;
		}
		if (strstr(msg, "BUG:") || strstr(msg, "WARNING:") || strstr(msg, "KCSAN") ||
		    strstr(msg, "possible circular") || strstr(msg, "blocked for more than") ||
		    strstr(msg, "Oops") || strstr(msg, "no longer holds") ||
		    strstr(msg, "inconsistent lock") || strstr(msg, "kmemleak") ||
		    strstr(msg, "general protection") || strstr(msg, "KASAN")) {
			diag("%s: kernel: %s", cell, msg);
			n++;
		}
	}
	return n;
}

/* The memory of a round (GLEN of gpusim's) and the causes on it: matrix_test.h. */

static int delay_of(enum cause ca)
{
	int d = (int)(slow_s(delay_ms / 1000.0) * 1000);

	return ca == FORK || ca == EXIT || ca == UNLOAD ? 3 * d : d;
}

static void delay_set(int ms)
{
	char v[24];

	snprintf(v, sizeof(v), "%d", ms * 1000);
	if (gs_knob("delay_us", v))
		bail("cannot set gpusim's delay_us");
}

/* ---- one round in this process ---- */

static void unload_start(struct unloader *u)
{
	double end = now_s() + slow_s(2);
	char st[32] = "";

	u->started = pthread_create(&u->t, NULL, unload_thread, u) == 0;
	/* Until it returned or the module is going (its exit runs). */
	while (u->started && !u->done && now_s() < end &&
	       (read_line("/sys/module/" NVMOD "/initstate", st, sizeof(st)) == 0 && !strcmp(st, "live")))
		usleep(200);
}

static int unload_end(struct unloader *u)
{
	if (u->started)
		pthread_join(u->t, NULL);
	u->started = 0;
	return u->ret;
}

struct racer {
	struct unloader *u;
	enum cause ca;
	enum phase ph;
	struct mem *m;
	long long mark0, next0;
	volatile int op_returned;	/* ibv_reg_mr / ibv_dereg_mr returned */
	int landed, inside, ret;
};

static int next_still(const struct racer *x)
{
	return !win[x->ph].next || calls(win[x->ph].next) < x->next0 + win[x->ph].next_need;
}

static void *racer_thread(void *arg)
{
	struct racer *x = arg;
	double end = now_s() + slow_s(20), before = now_s(), fired;

	while (calls(win[x->ph].mark) < x->mark0 + win[x->ph].need && now_s() < end) {
		before = now_s();
		usleep(300);
	}
	delay_set(0);
	fired = now_s();
	x->landed = calls(win[x->ph].mark) >= x->mark0 + win[x->ph].need && next_still(x) &&
		    !x->op_returned && fired < before + delay_of(x->ca) / 1000.0;
	if (x->ca == UNLOAD)
		unload_start(x->u);
	else
		x->ret = mem_cause(x->ca, x->m, gfd, NULL);
	x->inside = x->landed && next_still(x) && !x->op_returned;
	return NULL;
}

static int write_to(struct mem *m, struct ibv_mr *mr)
{
	fill(h, WLEN, 0x2222);
	return rdma_op_renew(&c, IBV_WR_RDMA_WRITE, hmr, h, WLEN, (uintptr_t)m->p, mr->rkey);
}

static int nothing_left(void)
{
	struct peer_stats s;

	return gs("live_pins") == 0 && gs("live_dma_mappings") == 0 && nv_refcnt() == 0 &&
	       peer_stats(CORE, &s) == 0 && s.alloc_mrs == s.dealloc_mrs;
}

static void left_diag(const char *cell)
{
	diag("%s: left: gpusim pins %lld, DMA mappings %lld; nvidia_peermem refcnt %lld", cell,
	     gs("live_pins"), gs("live_dma_mappings"), nv_refcnt());
	peer_stats_diag(CORE);
}

static void round_parent(enum cause ca, enum phase ph, struct tally *t, const char *cell)
{
	int dereg = ph >= UNMAP, bad = 0, err = 0, rc;
	struct unloader u = { .module = NVMOD };
	struct racer x = { .ca = ca, .ph = ph, .u = &u };
	struct peer_stats s0, s1;
	struct ibv_mr *mr = NULL;
	struct mem m;
	pthread_t rt;

	mem_get_gpu(&m, gfd, GLEN);
	x.m = &m;
	t->rounds++;
	if (peer_stats(CORE, &s0))
		bail("cannot read the core's counters of " CORE);
	if (ph == LIVE || dereg) {
		mr = ibv_reg_mr(c.pd, m.p, GLEN, MR_ACCESS);
		if (!mr) {
			diag("%s: ibv_reg_mr before the race: %s", cell, strerror(errno));
			t->bad++;
			mem_put(&m, gfd);
			return;
		}
	}
	if (ph == LIVE) {
		if (ca == UNLOAD)
			unload_start(&u);
		else
			x.ret = mem_cause(ca, &m, gfd, NULL);
		x.landed = x.inside = 1;
	} else {
		x.mark0 = calls(win[ph].mark);
		x.next0 = win[ph].next ? calls(win[ph].next) : 0;
		delay_set(delay_of(ca));
		pthread_create(&rt, NULL, racer_thread, &x);
		if (dereg) {
			if (ibv_dereg_mr(mr)) {
				diag("%s: ibv_dereg_mr: %s", cell, strerror(errno));
				bad = 1;
			}
			mr = NULL;
		} else {
			mr = ibv_reg_mr(c.pd, m.p, GLEN, MR_ACCESS);
			err = mr ? 0 : errno;
		}
		x.op_returned = 1;
		pthread_join(rt, NULL);
		delay_set(0);
	}
	t->landed += x.landed;
	t->inside += x.inside;
	if (!x.landed)
		diag("%s: the cause did NOT land in the window", cell);
	if (ca == UNLOAD && u.done && u.ret == 0 && mr) {
		diag("%s: rmmod nvidia_peermem returned 0 while an MR it serves is registered", cell);
		bad = 1;
	}
	if (ca != UNLOAD && x.ret) {
		diag("%s: the cause failed: %s", cell, strerror(-x.ret));
		bad = 1;
	}
	if (!dereg) {
		if (mr)
			t->reg_ok++;
		else
			t->reg_err[err == EFAULT ? 0 : err == EINVAL ? 1 : err == ENOMEM ? 2 : 3]++;
		if (!mr && err != EFAULT && err != EINVAL && err != ENOMEM)
			diag("%s: ibv_reg_mr: %s", cell, strerror(err));
	}
	if (mr) {
		/* What the MR does after the cause. */
		usleep(50000);
		if (peer_stats(CORE, &s1) == 0 && s1.invalidated_mrs > s0.invalidated_mrs)
			t->told++;
		rc = write_to(&m, mr);
		if (rc == IBV_WC_REM_ACCESS_ERR) {
			t->write_refused++;
		} else if (rc == 0) {
			t->write_landed++;
			t->write_landed_freed += m.freed;
		} else {
			diag("%s: RDMA WRITE through the MR: %s", cell, wc_str(rc));
			bad = 1;
		}
		if (ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr: %s", cell, strerror(errno));
			bad = 1;
		}
	}
	mem_put(&m, gfd);
	if (ca == UNLOAD) {
		x.ret = unload_end(&u);
		if (x.ret == 0)
			t->rmmod_ok++;
		else if (x.ret == -EAGAIN || x.ret == -EBUSY)
			t->rmmod_busy++;
		else {
			t->rmmod_err++;
			diag("%s: delete_module: %s", cell, strerror(-x.ret));
		}
	}
	if (ca == UNLOAD && access("/sys/module/" NVMOD, F_OK)) {
		/* It went (its exit waited for the core to let go of the MR): load it again. */
		if (nv_load())
			bail("cannot load %s again", nv_ko);
	} else if (ca == UNLOAD) {
		char st[32] = "?";

		read_line("/sys/module/" NVMOD "/initstate", st, sizeof(st));
		if (strcmp(st, "live")) {
			/* Going: wait for it to leave, then load it again. */
			double end = now_s() + slow_s(20);

			while (access("/sys/module/" NVMOD, F_OK) == 0 && now_s() < end)
				usleep(20000);
			if (access("/sys/module/" NVMOD, F_OK) == 0) {
				diag("%s: nvidia_peermem stuck in state %s after its MR was deregistered",
				     cell, st);
				bad = 1;
			} else if (nv_load()) {
				bail("cannot load %s again", nv_ko);
			}
		}
	}
	if (!wait_for(nothing_left, 10)) {
		diag("%s: something is left after the round", cell);
		left_diag(cell);
		bad = 1;
	}
	t->bad += bad;
}

/* ---- process exit: a child registers (or deregisters) and exits in the window ---- */

struct exiter {
	enum phase ph;
	long long mark0, next0;
	int fd;
	volatile int op_returned;
};

static void *exit_thread(void *arg)
{
	struct exiter *e = arg;
	double end = now_s() + slow_s(20), before = now_s();
	char r;
	struct racer x = { .ph = e->ph, .next0 = e->next0 };

	while (calls(win[e->ph].mark) < e->mark0 + win[e->ph].need && now_s() < end) {
		before = now_s();
		usleep(300);
	}
	delay_set(0);
	r = calls(win[e->ph].mark) >= e->mark0 + win[e->ph].need && next_still(&x) &&
	    !e->op_returned && now_s() < before + delay_of(EXIT) / 1000.0 ? 'L' : 'M';
	if (write(e->fd, &r, 1) != 1)
		_exit(31);
	_exit(0);	/* exit_group: the registering thread dies on its way back */
	return NULL;
}

static int nvx_exit_child(enum phase ph, int pfd)
{
	struct exiter e = { .ph = ph, .fd = pfd };
	struct exit_child ch;
	pthread_t t;
	int rc;

	mem_get_gpu(&ch.m, gfd, GLEN);
	rc = exit_child_start(&ch, ph, pfd);
	if (rc >= 0)
		return rc;
	e.mark0 = calls(win[ph].mark);
	e.next0 = win[ph].next ? calls(win[ph].next) : 0;
	delay_set(delay_of(EXIT));
	pthread_create(&t, NULL, exit_thread, &e);
	if (ph >= UNMAP)
		ibv_dereg_mr(ch.mr);
	else
		ibv_reg_mr(ch.pd, ch.m.p, GLEN, MR_ACCESS);
	e.op_returned = 1;
	pause();
	return 24;
}

static void round_exit(enum phase ph, struct tally *t, const char *cell)
{
	int p[2], bad = 0;
	char r;
	pid_t pid;

	t->rounds++;
	pid = exit_fork(p, &gfd);
	if (pid == 0)
		_exit(nvx_exit_child(ph, p[1]));
	r = exit_wait(pid, p, cell, &bad);
	delay_set(0);
	t->landed += r == 'L';
	t->inside += r == 'L';
	if (r != 'L')
		diag("%s: the exit did NOT land in the window (%c)", cell, r ? r : '-');
	if (!wait_for(nothing_left, 15)) {
		diag("%s: something is left after the child's exit", cell);
		left_diag(cell);
		bad = 1;
	}
	t->bad += bad;
}

/* ---- the matrix ---- */

static int selected(enum cause ca, enum phase ph)
{
	const char *names[2] = { cause_name[ca], phase_name[ph] };

	return only_selects(only, names, 2);
}

/* The cell's outcome in the words of docs/testing.md's table. */
static void outcome(const struct tally *t, enum cause ca, enum phase ph, char *buf, size_t n)
{
	size_t o = 0;

#define ADD(...) (o += snprintf(buf + o, o < n ? n - o : 0, o ? ", " : ""), \
		  o += snprintf(buf + o, o < n ? n - o : 0, __VA_ARGS__))
	buf[0] = 0;
	if (ph < UNMAP && ph != LIVE) {
		if (t->reg_err[0])
			ADD("EFAULT %d", t->reg_err[0]);
		if (t->reg_err[1])
			ADD("EINVAL %d", t->reg_err[1]);
		if (t->reg_err[2])
			ADD("ENOMEM %d", t->reg_err[2]);
		if (t->reg_err[3])
			ADD("other errno %d", t->reg_err[3]);
		if (t->reg_ok)
			ADD("reg %d", t->reg_ok);
	}
	if (ph == LIVE && ca != EXIT)
		ADD("reg");
	if (ph >= UNMAP && ca != EXIT)
		ADD("dereg");
	if (ca == EXIT)
		ADD("exit");
	if (t->told)
		ADD("told the core %d", t->told);
	if (t->write_refused)
		ADD("WRITE refused %d", t->write_refused);
	if (t->write_landed)
		ADD("WRITE landed %d%s", t->write_landed,
		    t->write_landed_freed ? " (in freed GPU memory)" : "");
	if (ca == UNLOAD)
		ADD("rmmod went %d, busy %d%s", t->rmmod_ok, t->rmmod_busy,
		    t->rmmod_err ? ", failed" : "");
	if (t->nv_msgs)
		ADD("nvidia-peermem ERROR lines %d", t->nv_msgs);
	if (t->inside != t->landed)
		ADD("waited %d", t->landed - t->inside);
#undef ADD
}

int main(void)
{
	static const enum cause order[] = { FREE, MUNMAP, MREMAP, MAPFIXED, FORK, EXIT, UNLOAD };
	const char *branch = getenv("NVPEERMEM_BRANCH") ?: "550";
	double t0 = now_s();
	char ko[600];

	if (getenv("NVMX_ROUNDS") && atoi(getenv("NVMX_ROUNDS")) > 0)
		rounds_per_cell = atoi(getenv("NVMX_ROUNDS"));
	if (getenv("NVMX_DELAY_MS") && atoi(getenv("NVMX_DELAY_MS")) > 0)
		delay_ms = atoi(getenv("NVMX_DELAY_MS"));
	only = getenv("NVMX_ONLY");
	if (!strcmp(branch, "550")) {
		nv_ko = "tests/nvpeermem/nvidia-peermem.ko";
	} else if (!strcmp(branch, "595")) {
		nv_ko = "tests/nvpeermem/595/nvidia-peermem.ko";
		nv_args = "persistent_api_support=0";
	} else {
		bail("NVPEERMEM_BRANCH wants 550 or 595, not %s", branch);
	}
	snprintf(ko, sizeof(ko), "%s/%s", root_dir(), nv_ko);
	if (access(ko, R_OK))
		bail("%s is not built (tests/nvpeermem/build.sh)", ko);
	kmsg = kmsg_open();
	h = aligned_alloc(4096, GLEN);
	if (!h)
		bail("out of memory");
	rxe_up();
	/* gpusim as the matrix has it, then peermem out of the way and nvidia-peermem in. */
	load_modules(NULL);
	if (run("rmmod peermem"))
		bail("cannot unload peermem");
	gs_knob("rm_lock", "0");
	if (access("/sys/module/" NVMOD, F_OK) == 0 && run("rmmod " NVMOD))
		bail("cannot unload the loaded nvidia_peermem");
	if (nv_load())
		bail("cannot load %s %s", ko, nv_args);
	gfd = gpusim_and_host_mr(&c, GLEN, &h, &hmr);
	diag("nvidia-peermem %s matrix: %d round(s) a cell, windows of %d ms (%d for fork, exit and unload); gpusim rm_lock=0",
	     branch, rounds_per_cell, delay_of(FREE), delay_of(FORK));
	diag("not applicable: every cause x release (nv_mem_release calls nothing of the GPU driver: no window to hold open); zap and mprotect (no PFN source in nvidia-peermem); nv_mem_nc (nv_mem claims every range first)");
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum cause ca = order[i];

		for (enum phase ph = 0; ph < NPHASES; ph++) {
			struct tally *t = &tal[ca][ph];
			char cell[96], out[400];
			double c0 = now_s();
			int rep;

			if (ph == REL || !selected(ca, ph))
				continue;
			snprintf(cell, sizeof(cell), "nv_mem(nvidia-peermem %s) x %s x %s", branch,
				 cause_name[ca], phase_name[ph]);
			for (int r = 0; r < rounds_per_cell; r++) {
				if (ca == EXIT)
					round_exit(ph, t, cell);
				else
					round_parent(ca, ph, t, cell);
			}
			rep = kernel_reports(cell, &t->nv_msgs);
			outcome(t, ca, ph, out, sizeof(out));
			ok(t->bad == 0 && t->landed == t->rounds && rep == 0,
			   "%s: %d rounds, landed %d: %s; nothing left; no kernel report (%d) [%.1f s]",
			   cell, t->rounds, t->landed, out, rep, now_s() - c0);
		}
	}
	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(gfd);
	ok(wait_for(nothing_left, 10), "nothing left at the end");
	ok(run("rmmod " NVMOD) == 0, "rmmod nvidia_peermem");
	ok(kernel_reports("end", NULL) == 0, "no kernel report at the end");
	diag("nvidia-peermem matrix: %.0f s", now_s() - t0);
	return finish();
}
