// SPDX-License-Identifier: GPL-2.0
/*
 * Process identity (docs/gpusim.md, "Process identity"; docs/module.md,
 * "Locking"): NVIDIA's driver gives a pin with a free callback back only
 * to the process that made it; a put from anywhere else (a work item,
 * another process, module unload) returns 0 and unpins nothing, and the
 * pin's free callback stays registered. gpusim does the same (counted in
 * foreign_puts). Checked here: peermem never makes such a put, and a pin
 * it cannot give back keeps its registration until the driver calls the
 * callback, which unload waits for:
 *  - munmap of a registered range: the revocation's work item puts the
 *    keeper, not the pin with the callback; the process's deregistration
 *    does (with a keeper, and with one pin when the keeper is refused);
 *  - a forked child holding the last reference to the verbs file: its
 *    release leaves the pin to its callback, and rmmod waits until the
 *    parent frees the memory;
 *  - unload with cached watch pins of a live process (one of them
 *    unmapped): rmmod waits for the frees;
 *  - the watch-pin cache per process: another process neither evicts nor
 *    flushes this one's entries, and its failed pin drains only its own;
 *  - the keeper's errors: ENOTSUPP falls back to one pin, ENOMEM gives
 *    back the process's cached pins and tries again, then (like EIO)
 *    declines the range, which nv_mem_nc then takes.
 * gs_idle() (all_idle) also checks that no put was ignored.
 */
#include "peermem_test.h"

#define LEN (1024 * 1024UL)		/* 16 GPU pages */

static struct conn c;
static struct ibv_mr *hmr;
static uint8_t *h;
static int fd;

struct unload {
	pthread_t t;
	volatile int done;
	int ret;
};

static void *unload_thread(void *arg)
{
	struct unload *u = arg;

	/* Not pm_rmmod(): this process's cached pins are what it waits for. */
	u->ret = run("rmmod peermem");
	u->done = 1;
	return NULL;
}

/* rmmod in a thread (another process); 1 if it is still waiting after a while. */
static int unload_waits(struct unload *u)
{
	u->done = 0;
	pthread_create(&u->t, NULL, unload_thread, u);
	usleep((useconds_t)(slow_s(1.5) * 1e6));
	return !u->done && access("/sys/module/peermem", F_OK) == 0;
}

/* rmmod returned (within a while): 1 if it did, with status 0. */
static int unload_done(struct unload *u)
{
	double end = now_s() + slow_s(15);

	while (!u->done && now_s() < end)
		usleep(20000);
	if (!u->done)
		bail("rmmod does not return: the rest would hang too");
	pthread_join(u->t, NULL);
	return u->ret == 0;
}

/* all_idle() within a while; if not, what is left goes to the log. */
static int settled(void)
{
	if (wait_for(all_idle, 10))
		return 1;
	pm_diag();
	gs_diag();
	diag("pages %lld/%lld bytes %lld/%lld keepers %lld/%lld nc pages %lld/%lld", pm("pages_pinned"), pm("pages_unpinned"), pm("bytes_pinned"), pm("bytes_unpinned"), pm("keeper_pins"), pm("keeper_unpins"), pm_nc("pages_pinned"), pm_nc("pages_unpinned"));
	return 0;
}

static void reload(const char *args)
{
	load_modules(args);
	fd = gpusim_and_host_mr(&c, LEN, &h, &hmr);
}

static void loopback_end(void)
{
	ibv_dereg_mr(hmr);
	conn_close(&c);
	free(h);
	close(fd);
}

/* 1. munmap: the work item puts the keeper only; the deregistration the rest. */
static void munmap_revocation(int one_pin)
{
	const char *what = one_pin ? "one pin (keeper refused)" : "with a keeper";
	long long inv0, ref0 = pm("keeper_pins_refused");
	struct ibv_mr *mr;
	struct gmem g;
	int rc;

	if (gmem_alloc(fd, LEN, &g))
		bail("gpusim allocation failed");
	if (one_pin) {
		gs_knob("fail_errno", "524");	/* ENOTSUPP: refused by design */
		gs_knob("fail/get_pages_persistent", "1");
	}
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	gs_knob("fail_errno", "12");
	ok(mr && gs("live_pins") == (one_pin ? 1 : 2) &&
	   pm("keeper_pins_refused") == ref0 + one_pin,
	   "munmap, %s: registered (pins %lld, keepers refused %+lld)", what, gs("live_pins"),
	   pm("keeper_pins_refused") - ref0);
	if (!mr)
		bail("ibv_reg_mr: %s", strerror(errno));
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0, "munmap, %s: the MR works (status %d)", what, rc);
	inv0 = pm("invalidations_mmu_notifier");
	munmap(g.p, LEN);
	g.p = NULL;
	{
		double end = now_s() + slow_s(10);

		while (pm("invalidations_mmu_notifier") == inv0 && now_s() < end)
			usleep(20000);
	}
	ok(pm("invalidations_mmu_notifier") == inv0 + 1 && wait_for(pm_no_keepers, 10) &&
	   gs("live_pins") == 1 && gs("live_persistent_pins") == 0 && gs("foreign_puts") == 0,
	   "munmap, %s: the revocation's work item gives the keeper back, not the pin with the free callback (a kworker is not the pinning process: pins %lld, persistent %lld, ignored puts %lld)",
	   what, gs("live_pins"), gs("live_persistent_pins"), gs("foreign_puts"));
	rc = ibv_dereg_mr(mr);
	ok(rc == 0 && gs("live_pins") == 0 && gs("foreign_puts") == 0 && pm_cached() == 0,
	   "munmap, %s: the process's deregistration gives that pin back (pins %lld, ignored puts %lld)",
	   what, gs("live_pins"), gs("foreign_puts"));
	ok(gmem_free(fd, &g) == 0 && settled(), "munmap, %s: freed, nothing left", what);
}

/* 2. A forked child closes the verbs file last: its release cannot put the pin. */
static void child_last_close(void)
{
	long long left0 = pm("pins_left_to_callback");
	struct ibv_context *ctx = open_rxe();
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_mr *mr;
	struct unload u;
	struct gmem g;
	int go[2], st = -1;
	pid_t pid;

	if (!pd || gmem_alloc(fd, LEN, &g) || pipe(go))
		bail("set-up of the fork case failed");
	mr = ibv_reg_mr(pd, g.p, LEN, MR_ACCESS);
	ok(mr != NULL, "fork: registered in the parent");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		char x;

		close(go[1]);
		/* Holds the verbs file until the parent has closed its copy. */
		_exit(read(go[0], &x, 1) == 1 ? 0 : 1);
	}
	close(go[0]);
	/* The parent's references to the verbs file go; the child's stays. */
	close(ctx->cmd_fd);
	close(ctx->async_fd);
	ok(pm_live_regs() == 1, "fork: the parent closed its verbs file, the child's copy keeps the MR");
	if (write(go[1], "x", 1) != 1)
		bail("pipe write");
	close(go[1]);
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0 && pm_live_regs() == 0 &&
	   pm("pins_left_to_callback") == left0 + 1 && gs("live_pins") == 1 &&
	   gs("live_persistent_pins") == 0 && gs("foreign_puts") == 0,
	   "fork: the child's exit releases the MR; the pin with the free callback is left to its callback, the keeper put (left %+lld, pins %lld, persistent %lld, ignored puts %lld)",
	   pm("pins_left_to_callback") - left0, gs("live_pins"), gs("live_persistent_pins"),
	   gs("foreign_puts"));
	ok(dmesg_has("made by process [0-9]+ ends in process [0-9]+, where NVIDIA.s driver ignores a put"),
	   "fork: the log says which process holds the pin");
	ok(unload_waits(&u), "fork: rmmod waits while that pin's callback can still come");
	ok(gmem_free(fd, &g) == 0 && unload_done(&u) && gs("live_pins") == 0,
	   "fork: the parent frees the memory, the callback comes, rmmod returns 0 (pins %lld)",
	   gs("live_pins"));
	gmem_drop(&g);
	loopback_end();
	reload(NULL);
}

/* 3. Unload with cached watch pins of this (live) process, one of them unmapped. */
static void unload_with_entries(void)
{
	struct unload u;
	struct gmem a, b;

	if (gmem_alloc(fd, LEN, &a) || gmem_alloc(fd, LEN, &b))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, a.p, LEN) == 0 && reg_dereg(&c, b.p, LEN) == 0 && pm_cached() == 2,
	   "unload: two entries cached");
	munmap(b.p, LEN);
	b.p = NULL;
	/* Its work item leaves the entry: only this process can put its pin. */
	usleep((useconds_t)(slow_s(0.5) * 1e6));
	ok(pm_cached() == 2 && gs("live_pins") == 2 && gs("foreign_puts") == 0,
	   "unload: the unmapped entry stays cached, its pin held (pins %lld)", gs("live_pins"));
	ok(unload_waits(&u) && gs("live_pins") == 2 && gs("foreign_puts") == 0,
	   "unload: rmmod (another process) waits: it cannot give this process's pins back (pins %lld, ignored puts %lld)",
	   gs("live_pins"), gs("foreign_puts"));
	ok(gmem_free(fd, &a) == 0 && !u.done && gs("live_pins") == 1,
	   "unload: one of the memories freed, rmmod still waits for the other");
	ok(gmem_free(fd, &b) == 0 && unload_done(&u) && gs("live_pins") == 0,
	   "unload: both freed: rmmod returns 0, nothing pinned");
	gmem_drop(&a);
	loopback_end();
	reload(NULL);
}

struct flusher {
	pthread_t t;
	int ret;
};

static void *flush_thread(void *arg)
{
	struct flusher *f = arg;

	f->ret = write_str(PMDBG "watch_cache_flush", "1");
	return NULL;
}

/*
 * 3b. Unload while a flush holds an entry it took out of the table, still
 * marked parked (inject_delay_drop_parked_ms), and the memory is freed
 * meanwhile: its callback queues the work item, so the work queue must
 * outlive the flush. The open flush file holds a module reference, so
 * rmmod is refused until the write is done (and exit removes the file
 * before its own drain).
 */
static void unload_during_flush(void)
{
	long long entered = read_ll(PMDBG "inject/inject_delay_drop_parked_ms.entered");
	struct flusher fl;
	struct gmem a;
	double end;
	int rc;

	if (gmem_alloc(fd, LEN, &a))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, a.p, LEN) == 0 && pm_cached() == 1, "unload during a flush: an entry cached");
	write_str(PMDBG "inject_delay_drop_parked_ms", "2000");
	pthread_create(&fl.t, NULL, flush_thread, &fl);
	end = now_s() + slow_s(10);
	while (read_ll(PMDBG "inject/inject_delay_drop_parked_ms.entered") == entered && now_s() < end)
		usleep(2000);
	ok(read_ll(PMDBG "inject/inject_delay_drop_parked_ms.entered") == entered + 1,
	   "unload during a flush: the flush holds the entry out of the table");
	rc = run("rmmod peermem 2>/dev/null");
	ok(rc != 0 && access("/sys/module/peermem", F_OK) == 0,
	   "unload during a flush: rmmod is refused while the flush file is being written (the open file holds the module)");
	ok(gmem_free(fd, &a) == 0, "unload during a flush: the memory freed meanwhile (its callback queues the work item)");
	pthread_join(fl.t, NULL);
	ok(fl.ret == 0 && wait_for(idle_but_vmas, 10) && pm_rmmod() == 0,
	   "unload during a flush: the flush returns, nothing is left, rmmod returns 0");
	gmem_drop(&a);
	loopback_end();
	reload(NULL);
}

/* 4. The cache per process: another process neither evicts, flushes nor drains our entries. */
static void per_process(void)
{
	long long ev0, hits0, park0, d0, nc0;
	struct gmem a;
	int st = -1;
	pid_t pid;

	loopback_end();
	reload("watch_cache=1");
	if (gmem_alloc(fd, LEN, &a))
		bail("gpusim allocation failed");
	ok(reg_dereg(&c, a.p, LEN) == 0 && pm_cached() == 1, "per process (watch_cache=1): our entry cached");
	ev0 = pm("watch_cache_evicted");
	park0 = pm("watch_cache_parked");
	d0 = pm("registrations_declined");
	nc0 = pm_nc("registrations_acquired");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct conn cc;
		struct gmem gc;
		int f = child_own_gpu(&cc, LEN, &gc);

		/* The cache is full with the parent's entry: ours is not kept. */
		if (reg_dereg(&cc, gc.p, LEN))
			_exit(3);
		/* Our flush drops nothing of the parent's. */
		if (write_str(PMDBG "watch_cache_flush", "1"))
			_exit(4);
		/* A failed pin drains only our entries (none): declined, nv_mem_nc takes it. */
		gs_knob("fail/get_pages", "1");
		if (reg_dereg(&cc, gc.p, LEN))
			_exit(5);
		conn_close(&cc);
		gmem_free(f, &gc);
		_exit(0);
	}
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "per process: the child's registrations succeed (status %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	ok(pm("watch_cache_evicted") == ev0 && pm("watch_cache_parked") == park0 && pm_cached() == 1 &&
	   gs("live_pins") == 1 && gs("foreign_puts") == 0,
	   "per process: the child's registration, flush and failed pin leave our entry (evicted %+lld, parked %+lld, pins %lld, ignored puts %lld)",
	   pm("watch_cache_evicted") - ev0, pm("watch_cache_parked") - park0, gs("live_pins"),
	   gs("foreign_puts"));
	ok(pm("registrations_declined") == d0 + 1 && pm_nc("registrations_acquired") == nc0 + 1,
	   "per process: the child's failed pin was declined by nv_mem and taken by nv_mem_nc (declined %+lld, nc %+lld)",
	   pm("registrations_declined") - d0, pm_nc("registrations_acquired") - nc0);
	hits0 = pm("watch_cache_hits");
	ok(reg_dereg(&c, a.p, LEN) == 0 && pm("watch_cache_hits") == hits0 + 1,
	   "per process: our entry is still there (a hit)");
	ok(write_str(PMDBG "watch_cache_flush", "1") == 0 && pm_cached() == 0 && gs("live_pins") == 0,
	   "per process: our own flush drops it, its pin put");
	st = gmem_free(fd, &a);
	gmem_drop(&a);
	ok(st == 0 && settled(), "per process: nothing left");
	loopback_end();
	reload(NULL);
}

/* 5. The keeper's errors. */
static void keeper_errors(void)
{
	long long k0, f0, ev0, d0, nc0;
	struct ibv_mr *mr;
	struct gmem a, b;
	int rc;

	if (gmem_alloc(fd, LEN, &a) || gmem_alloc(fd, LEN, &b))
		bail("gpusim allocation failed");

	/* ENOMEM with a cached pin of ours: it is given back, the keeper tried again. */
	ok(reg_dereg(&c, a.p, LEN) == 0 && pm_cached() == 1, "keeper ENOMEM: an entry of ours cached");
	k0 = pm("keeper_pins");
	ev0 = pm("watch_cache_evicted");
	gs_knob("fail/get_pages_persistent", "1");
	mr = ibv_reg_mr(c.pd, b.p, LEN, MR_ACCESS);
	ok(mr && pm("keeper_pins") == k0 + 1 && pm("watch_cache_evicted") == ev0 + 1 &&
	   gs("live_persistent_pins") == 1 && pm_cached() == 0,
	   "keeper ENOMEM (BAR1 full): our cached pin is given back and the keeper pinned on the second try (keepers %+lld, evicted %+lld)",
	   pm("keeper_pins") - k0, pm("watch_cache_evicted") - ev0);
	if (mr)
		ibv_dereg_mr(mr);
	pm_flush();

	/* ENOMEM with nothing cached, and EIO: declined; nv_mem_nc takes the range. */
	for (int eio = 0; eio <= 1; eio++) {
		const char *what = eio ? "EIO" : "ENOMEM, nothing cached";

		f0 = pm("keeper_pins_failed");
		d0 = pm("registrations_declined");
		nc0 = pm_nc("registrations_acquired");
		gs_knob("fail_errno", eio ? "5" : "12");
		gs_knob("fail/get_pages_persistent", "1");
		mr = ibv_reg_mr(c.pd, b.p, LEN, MR_ACCESS);
		gs_knob("fail_errno", "12");
		ok(mr && pm("keeper_pins_failed") == f0 + 1 && pm("registrations_declined") == d0 + 1 &&
		   pm_nc("registrations_acquired") == nc0 + 1 && pm_live_regs() == 0,
		   "keeper %s: nv_mem declines the range (no fallback to one pin), nv_mem_nc registers it (failed %+lld, declined %+lld, nc %+lld)",
		   what, pm("keeper_pins_failed") - f0, pm("registrations_declined") - d0,
		   pm_nc("registrations_acquired") - nc0);
		if (mr)
			ibv_dereg_mr(mr);
	}
	ok(dmesg_has("BAR1 aperture is full"), "keeper ENOMEM: the log says BAR1 is full");
	rc = gmem_free(fd, &a) | gmem_free(fd, &b);
	gmem_drop(&a);
	gmem_drop(&b);
	ok(rc == 0 && settled(), "keeper errors: nothing left");
}

int main(void)
{
	rxe_up();
	reload(NULL);
	munmap_revocation(0);
	munmap_revocation(1);
	keeper_errors();
	per_process();
	child_last_close();
	unload_with_entries();
	unload_during_flush();
	loopback_end();
	ok(pm_rmmod() == 0, "rmmod");
	return finish();
}
