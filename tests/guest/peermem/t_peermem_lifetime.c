// SPDX-License-Identifier: GPL-2.0
/*
 * Lifetime windows of a registration, each held open with one of peermem's
 * inject_* delays so another thread lands in it every time:
 *
 *  1. unpin: put_pages took the page table out of the registration and
 *     dropped the lock; a GPU free runs its callback meanwhile and the
 *     driver frees the table. peermem must not read the table after that
 *     (KASAN reports a use-after-free if it does).
 *  2. release: an munmap's work item invalidated the MR through the core
 *     but has not unmapped it yet; the MR is deregistered and, while
 *     release runs, the GPU memory is freed. The free callback must not
 *     call the core's invalidate once release lets go (release returns, the
 *     core may free its client: peermem counts and reports an invalidate
 *     still running as release returns), and release must not call this
 *     legitimate race a core bug.
 *  3. unload: the last reference to a registration is the free callback's;
 *     rmmod waits for it. rmmod must not finish while that teardown still
 *     runs module code (a thread returning into unloaded code oopses).
 */
#include "peermem_test.h"

#define LEN (512 * 1024UL)		/* 8 GPU pages */

static struct conn c;
static int fd;

static void knob(const char *name, int ms)
{
	char path[256], val[32];

	snprintf(path, sizeof(path), PMDBG "inject_delay_%s_ms", name);
	snprintf(val, sizeof(val), "%d", ms);
	if (write_str(path, val))
		bail("cannot set %s", path);
}

struct dereg {
	struct ibv_mr *mr;
	useconds_t after;
	int flush;	/* then drop the watch-pin cache (the watch pin's put) */
	int ret;
	double done;
};

static void *dereg_thread(void *arg)
{
	struct dereg *d = arg;

	usleep(d->after);
	d->ret = ibv_dereg_mr(d->mr);
	if (d->flush)
		pm_flush();
	d->done = now_s();
	return NULL;
}

struct freer {
	struct gmem *g;
	useconds_t after;
	int ret;
	double done;
};

static void *free_thread(void *arg)
{
	struct freer *f = arg;

	usleep(f->after);
	f->ret = gmem_free(fd, f->g);
	f->done = now_s();
	return NULL;
}

static struct ibv_mr *reg_gpu(struct gmem *g, const char *what)
{
	struct ibv_mr *mr;

	if (gmem_alloc(fd, LEN, g))
		bail("%s: GPUSIM_IOC_ALLOC: %s", what, strerror(errno));
	mr = ibv_reg_mr(c.pd, g->p, LEN, MR_ACCESS);
	if (!mr)
		bail("%s: ibv_reg_mr on GPU memory: %s", what, strerror(errno));
	return mr;
}

/*
 * 1. The free callback while put_pages gives the page table back (the
 * watch pin's: with the watch-pin cache, the flush after the
 * deregistration puts it, through the same code).
 */
static void test_unpin(void)
{
	struct gmem g;
	struct dereg d = { .after = 0, .flush = 1 };
	struct freer f = { .g = &g, .after = 400000 };
	long long cb0, e0;
	pthread_t td, tf;

	d.mr = reg_gpu(&g, "unpin");
	cb0 = pm("free_callbacks");
	e0 = pm("errors");
	knob("unpin", 1500);
	pthread_create(&td, NULL, dereg_thread, &d);
	pthread_create(&tf, NULL, free_thread, &f);
	pthread_join(tf, NULL);
	pthread_join(td, NULL);
	knob("unpin", 0);
	ok(d.ret == 0 && f.ret == 0 && f.done < d.done,
	   "unpin: the GPU memory is freed inside the watch pin's put (free %.2f s before dereg and flush return), both succeed",
	   d.done - f.done);
	ok(pm("free_callbacks") == cb0 + 1 && pm("errors") == e0,
	   "unpin: one free callback, no error counted (errors %+lld)", pm("errors") - e0);
	ok(!dmesg_has("BUG: KASAN"), "unpin: peermem never reads the page table the driver freed (no KASAN report)");
	ok(wait_for(idle_but_vmas, 10), "unpin: nothing registered, pinned or left");
	if (!idle_but_vmas()) {
		pm_diag();
		gs_diag();
	}
	gmem_drop(&g);
}

/* 2. GPU free while release runs after an munmap invalidated the MR. */
static void test_release(void)
{
	struct peer_stats s0, s1;
	struct gmem g;
	struct dereg d = { .after = 0 };
	struct freer f = { .g = &g, .after = 400000 };
	long long inv0, e0, cb0;
	pthread_t td, tf;
	double end;

	d.mr = reg_gpu(&g, "release");
	peer_stats(pm_name, &s0);
	inv0 = pm("invalidations_gpu_free");
	cb0 = pm("free_callbacks");
	e0 = pm("errors");
	/* The work item invalidates through the core, then waits 3 s before it unmaps. */
	knob("address_change", (int)slow_s(3000));
	if (munmap(g.p, LEN))
		bail("munmap: %s", strerror(errno));
	g.p = NULL;
	end = now_s() + slow_s(2);
	do {
		peer_stats(pm_name, &s1);
		if (s1.invalidated_mrs > s0.invalidated_mrs)
			break;
		usleep(20000);
	} while (now_s() < end);
	ok(s1.invalidated_mrs == s0.invalidated_mrs + 1,
	   "release: munmap invalidated the MR through the core (num_invalidated_mrs %+lld)",
	   s1.invalidated_mrs - s0.invalidated_mrs);
	/* release waits 1.5 s; the free comes 0.4 s in, its invalidate would wait 3 s. */
	knob("release", 1500);
	knob("invalidate", 3000);
	pthread_create(&td, NULL, dereg_thread, &d);
	pthread_create(&tf, NULL, free_thread, &f);
	pthread_join(td, NULL);
	pthread_join(tf, NULL);
	knob("release", 0);
	knob("invalidate", 0);
	knob("address_change", 0);
	ok(d.ret == 0 && f.ret == 0, "release: ibv_dereg_mr and GPUSIM_IOC_FREE succeed");
	ok(pm("free_callbacks") == cb0 + 1 && pm("invalidations_gpu_free") == inv0,
	   "release: the free callback did not invalidate the released MR through the core (invalidations_gpu_free %+lld)",
	   pm("invalidations_gpu_free") - inv0);
	ok(!dmesg_has("release returns while the core.s invalidate runs"),
	   "release: no invalidate of the core outlived release");
	ok(!dmesg_has("put_pages or release before dma_unmap"),
	   "release: the munmap/dereg race is not reported as a core bug");
	ok(pm("errors") == e0, "release: no error counted (errors %+lld)", pm("errors") - e0);
	ok(wait_for(idle_but_vmas, 10), "release: nothing registered, pinned or left");
	if (!idle_but_vmas()) {
		pm_diag();
		gs_diag();
	}
}

/* 3. rmmod waits for a teardown the free callback runs. */
static void test_unload(void)
{
	struct gmem g;
	struct freer f = { .g = &g, .after = 0 };
	struct ibv_mr *mr;
	pthread_t tf;
	double t0, t1;
	int rc;

	mr = reg_gpu(&g, "unload");
	/* The callback holds its reference 2 s; the teardown then takes 3 s. */
	knob("free_callback", 2000);
	knob("teardown", 3000);
	pthread_create(&tf, NULL, free_thread, &f);
	usleep(500000);
	ok(ibv_dereg_mr(mr) == 0, "unload: the invalidated MR deregisters while the free callback holds the registration");
	t0 = now_s();
	rc = pm_rmmod();
	t1 = now_s();
	pthread_join(tf, NULL);
	ok(rc == 0 && access("/sys/module/peermem", F_OK) != 0, "unload: rmmod peermem succeeds");
	ok(t1 >= f.done, "unload: rmmod returned after the free callback's teardown ended (%.2f s after)",
	   t1 - f.done);
	diag("unload: rmmod took %.1f s", t1 - t0);
	ok(f.ret == 0 && gs("live_pins") == 0, "unload: the free succeeded, nothing pinned");
	gmem_drop(&g);
	load_modules(NULL);
	mr = reg_gpu(&g, "reload");
	ok(mr && ibv_dereg_mr(mr) == 0, "unload: peermem loads again and registers GPU memory");
	gmem_free(fd, &g);
	gmem_drop(&g);
	ok(wait_for(all_idle, 10), "unload: all idle at the end");
}

int main(void)
{
	rxe_up();
	load_modules(NULL);
	ok(1, "gpusim and peermem loaded (client %s)", pm_name);
	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim");
	test_release();
	test_unpin();
	/* Last: on a peermem with the bug, the thread in unloaded code oopses. */
	test_unload();
	ok(pm_rmmod() == 0, "rmmod peermem");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	close(fd);
	conn_close(&c);
	return finish();
}
