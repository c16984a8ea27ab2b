// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_pin - nvidia_p2p_get_pages / put_pages rules, driven through
 * the test client: alignment, ownership (foreign process), ranges crossing
 * allocations, bad arguments, CPU-addressable physical pages, double put.
 */
#include <pthread.h>

#include "gpusim_test.h"

#define NPAGES 8
#define SZ (NPAGES * GPU_PAGE)

static void test_good(int tc, char *p)
{
	struct gpusim_tc_req q, s;
	unsigned char *buf = malloc(SZ);
	int ret;

	ret = tc_get(tc, p, SZ, 0, &q);
	ok(ret == 0, "get_pages of a whole 512 KiB allocation (ret %d)", ret);
	if (ret)
		bail("cannot pin at all");
	ok(q.entries == NPAGES, "8 entries (%u)", q.entries);
	ok(q.page_size == 1, "page_size is NVIDIA_P2P_PAGE_SIZE_64KB (%u)", q.page_size);
	ok(q.version_ok && q.pt_version == (gs_branch() >= 580 ? 0x00020000u : 0x00010002u),
	   "page table version %#x, the one of branch %d", q.pt_version, gs_branch());
	ok(q.phys0 && q.phys0 % GPU_PAGE == 0, "physical address of page 0 is 64 KiB aligned (%#llx)",
	   (unsigned long long)q.phys0);
	ok(q.runs == NPAGES, "64 KiB contiguity: 8 physically separate runs (%u)", q.runs);
	ok(dbg_get("live_pins") == 1, "live_pins is 1");

	memset(&s, 0, sizeof(s));
	s.id = q.id;
	s.len = SZ;
	s.buf = (uintptr_t)buf;
	ret = tc_cmd(tc, GPUSIM_TC_READ, &s);
	ok(ret == 0 && check_pattern(buf, SZ, 5),
	   "the kernel reads the CPU-written data at phys_to_virt(physical_address)");
	fill_pattern(buf, GPU_PAGE, 99);
	s.off = 3 * GPU_PAGE;
	s.len = GPU_PAGE;
	ret = tc_cmd(tc, GPUSIM_TC_WRITE, &s);
	ok(ret == 0 && check_pattern(p + 3 * GPU_PAGE, GPU_PAGE, 99),
	   "a kernel write through the physical address shows in the user mapping");
	fill_pattern(p, SZ, 5);

	ret = tc_get(tc, p + 2 * GPU_PAGE, 3 * GPU_PAGE, 0, &s);
	ok(ret == 0 && s.entries == 3, "get_pages of a 3-page sub-range (ret %d, %u entries)",
	   ret, s.entries);
	if (!ret) {
		struct gpusim_tc_req r;

		memset(&r, 0, sizeof(r));
		r.id = s.id;
		r.len = 3 * GPU_PAGE;
		r.buf = (uintptr_t)buf;
		ok(tc_cmd(tc, GPUSIM_TC_READ, &r) == 0 &&
		   !memcmp(buf, p + 2 * GPU_PAGE, 3 * GPU_PAGE),
		   "the sub-range's pages are the right ones");
		ok(dbg_get("live_pins") == 2, "two pins on one allocation");
		ret = tc_id(tc, GPUSIM_TC_PUT, s.id, 0, &r);
		ok(ret == 0 && !r.pinned, "put the sub-range (ret %d)", ret);
		tc_id(tc, GPUSIM_TC_FORGET, s.id, 0, &r);
	}

	ret = tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &s);
	ok(ret == 0 && !s.pinned, "put_pages (ret %d)", ret);
	ok(dbg_get("live_pins") == 0, "live_pins back to 0");
	ret = tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &s);
	ok(ret == 0, "double put_pages: 0, as the 550 driver answers (stale_errno=0, the default) (ret %d)",
	   ret);
	ok(dbg_get("stale_calls") == 1, "stale_calls counted it");
	dbg_set("stale_errno", 22);
	ret = tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &s);
	ok(ret == -EINVAL && dbg_get("stale_calls") == 2,
	   "with stale_errno=22 (the refusing variant) a double put is -EINVAL (ret %d)", ret);
	dbg_set("stale_errno", 0);
	ok(dbg_get("free_callbacks") == 0, "no free callback ran");
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
	free(buf);
}

static void test_bad(int tc, char *p)
{
	struct gpusim_tc_req q;
	void *heap = aligned_alloc(GPU_PAGE, SZ);
	char stack_probe;

	ok(tc_get(tc, p + 4096, GPU_PAGE, 0, &q) == -EINVAL, "misaligned address: -EINVAL");
	ok(tc_get(tc, p, GPU_PAGE + 4096, 0, &q) == -EINVAL, "misaligned length: -EINVAL");
	ok(tc_get(tc, p, 4096, 0, &q) == -EINVAL, "length below 64 KiB: -EINVAL");
	ok(tc_get(tc, p, 0, 0, &q) == -EINVAL, "length 0: -EINVAL");
	ok(tc_get(tc, p + (NPAGES - 1) * GPU_PAGE, 2 * GPU_PAGE, 0, &q) == -EINVAL,
	   "range running past the end of the allocation: -EINVAL");
	ok(tc_get(tc, p, SZ + GPU_PAGE, 0, &q) == -EINVAL, "length larger than the allocation: -EINVAL");
	ok(tc_get(tc, (void *)(uintptr_t)0xffffffffffff0000ULL, GPU_PAGE * 2, 0, &q) == -EINVAL,
	   "range wrapping around: -EINVAL");
	ok(tc_get(tc, heap, GPU_PAGE, 0, &q) == -EINVAL, "ordinary heap memory: -EINVAL (not gpusim's)");
	ok(tc_get(tc, (void *)((uintptr_t)&stack_probe & ~(GPU_PAGE - 1)), GPU_PAGE, 0, &q) == -EINVAL,
	   "stack memory: -EINVAL");
	ok(tc_get(tc, NULL, GPU_PAGE, 0, &q) == -EINVAL, "address 0: -EINVAL");
	ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_NULL_CB, &q) == -EINVAL, "NULL free_callback: -EINVAL");
	ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_NULL_DATA, &q) == -EINVAL, "NULL callback data: -EINVAL");
	ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_TOKEN, &q) == -EINVAL, "non-zero p2p_token: -EINVAL");
	/* 550: flags must be 0; 570+: 1 is FORCE_BAR1, refused on a
	 * discrete GPU (cpu_cacheable 0) with -ENOTSUPP (t_gpusim_branch). */
	if (gs_branch() == 550)
		ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_PERSISTENT | GPUSIM_TC_BAD_FLAGS, &q) == -EINVAL,
		   "get_pages_persistent with flags 1: -EINVAL (branch 550)");
	else
		ok(tc_get(tc, p, GPU_PAGE, GPUSIM_TC_PERSISTENT | GPUSIM_TC_BAD_FLAGS, &q) == -524,
		   "get_pages_persistent with flags 1 (FORCE_BAR1) on a discrete GPU: -ENOTSUPP (branch %d)",
		   gs_branch());
	ok(dbg_get("live_pins") == 0, "nothing pinned by the refused calls");
	free(heap);
}

static void test_crossing(int fd, int tc)
{
	struct gpusim_alloc a, b;
	struct gpusim_tc_req q;
	void *hole = mmap(NULL, 20 * GPU_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t base = ((uintptr_t)hole + GPU_PAGE - 1) & ~(GPU_PAGE - 1);
	int ra, rb;

	munmap(hole, 20 * GPU_PAGE);
	ra = gs_alloc_at(fd, 4 * GPU_PAGE, base, &a);
	rb = gs_alloc_at(fd, 4 * GPU_PAGE, base + 4 * GPU_PAGE, &b);
	ok(ra == 0 && rb == 0, "two allocations back to back at %#llx", (unsigned long long)base);
	if (ra || rb)
		return;
	ok(tc_get(tc, (void *)(uintptr_t)(base + 3 * GPU_PAGE), 2 * GPU_PAGE, 0, &q) == -EINVAL,
	   "a range crossing from one allocation into the next: -EINVAL");
	ok(tc_get(tc, (void *)(uintptr_t)base, 8 * GPU_PAGE, 0, &q) == -EINVAL,
	   "a range covering both allocations: -EINVAL");
	ok(tc_get(tc, (void *)(uintptr_t)(base + 4 * GPU_PAGE), 4 * GPU_PAGE, 0, &q) == 0,
	   "the second one alone pins fine");
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &q);
	munmap((void *)(uintptr_t)base, 8 * GPU_PAGE);
	gs_free(fd, a.handle);
	gs_free(fd, b.handle);
}

static void test_foreign(int tc, char *p)
{
	struct gpusim_tc_req q;
	int to_parent[2], to_child[2];
	uint64_t child_va = 0;
	pid_t pid;
	int st;

	/* The child shares the test-client file but not the mapping. */
	pid = fork();
	if (pid == 0) {
		struct gpusim_tc_req cq;

		_exit(tc_get(tc, p, GPU_PAGE, 0, &cq) == -EINVAL ? 0 : 1);
	}
	ok(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "a child process cannot pin its parent's gpusim address (-EINVAL)");

	/* And the parent cannot pin a live child's allocation. */
	if (pipe(to_parent) || pipe(to_child))
		bail("pipe");
	pid = fork();
	if (pid == 0) {
		int cfd = gs_open();
		void *cva;

		/* Keep the child's allocation off the parent's address. */
		mmap(p, SZ, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		cva = gs_alloc(cfd, 2 * GPU_PAGE, NULL);
		uint64_t v;
		char c;

		v = (uintptr_t)cva;
		if (write(to_parent[1], &v, sizeof(v)) != sizeof(v))
			_exit(2);
		if (read(to_child[0], &c, 1) != 1)
			_exit(3);
		_exit(0);
	}
	if (read(to_parent[0], &child_va, sizeof(child_va)) != sizeof(child_va))
		bail("child did not report its allocation");
	/* The address may happen to be gpusim memory of ours too: make sure not. */
	ok(tc_get(tc, (void *)(uintptr_t)child_va, GPU_PAGE, 0, &q) == -EINVAL,
	   "the parent cannot pin a live child's gpusim address (-EINVAL)");
	if (write(to_child[1], "x", 1) != 1)
		bail("pipe write");
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited cleanly");
	close(to_parent[0]);
	close(to_parent[1]);
	close(to_child[0]);
	close(to_child[1]);

	/*
	 * A put from another process (the child shares the test-client file,
	 * so it names the parent's registration): NVIDIA's driver finds a
	 * non-persistent table only among the calling process's pins and
	 * answers 0 without unpinning; a persistent put works from anywhere.
	 */
	for (int persistent = 0; persistent <= 1; persistent++) {
		const char *kind = persistent ? "persistent" : "with a free callback";
		long long pins, foreign0 = dbg_get("foreign_puts");
		int ret;

		ret = tc_get(tc, p, 2 * GPU_PAGE, persistent ? GPUSIM_TC_PERSISTENT : 0, &q);
		pins = dbg_get("live_pins");
		if (ret)
			bail("cannot pin for the foreign-put case (%d)", ret);
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			struct gpusim_tc_req cq;

			_exit(tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &cq) == 0 ? 0 : 1);
		}
		st = -1;
		waitpid(pid, &st, 0);
		if (persistent)
			ok(WIFEXITED(st) && WEXITSTATUS(st) == 0 && dbg_get("live_pins") == pins - 1 &&
			   dbg_get("foreign_puts") == foreign0,
			   "a %s pin put by another process is unpinned (pins %lld)", kind, dbg_get("live_pins"));
		else
			ok(WIFEXITED(st) && WEXITSTATUS(st) == 0 && dbg_get("live_pins") == pins &&
			   dbg_get("foreign_puts") == foreign0 + 1,
			   "a pin %s put by another process: 0, and nothing unpinned (pins %lld, foreign_puts %+lld)",
			   kind, dbg_get("live_pins"), dbg_get("foreign_puts") - foreign0);
		if (persistent)
			continue;
		/* The pinning process's own put (the test client calls it again). */
		{
			struct gpusim_tc_req pq;

			ret = tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &pq);
		}
		ok(ret == 0 && dbg_get("live_pins") == pins - 1,
		   "... the pinning process's put unpins it (%d, pins %lld)", ret, dbg_get("live_pins"));
	}
}

/* ---- threads: the process, not the thread, owns gpusim memory */

struct thr_job {
	int fd, tc, ret;
	char *p;		/* in: memory to pin; out: memory allocated */
	uint64_t handle;
};

static void *thr_pin(void *arg)
{
	struct thr_job *j = arg;
	struct gpusim_tc_req q;

	j->ret = tc_get(j->tc, j->p, GPU_PAGE, 0, &q);
	if (j->ret == 0)
		tc_id(j->tc, GPUSIM_TC_PUT, q.id, 0, &q);
	return NULL;
}

static void *thr_alloc(void *arg)
{
	struct thr_job *j = arg;

	j->p = gs_alloc(j->fd, SZ, &j->handle);
	return NULL;
}

static void test_threads(int fd, int tc, char *p)
{
	struct gpusim_tc_req q;
	struct thr_job j = { .fd = fd, .tc = tc, .p = p };
	pthread_t t;
	int ret;

	/* What NCCL does: register from a thread other than the allocating one. */
	if (pthread_create(&t, NULL, thr_pin, &j))
		bail("pthread_create");
	pthread_join(t, NULL);
	ok(j.ret == 0, "a second thread of the process pins memory the main thread allocated (%d)", j.ret);

	/*
	 * A thread allocates and exits; the main thread pins and frees. gpusim
	 * once kept a "reference to the address space" that pointed into the
	 * allocating thread's task_struct: this was a KASAN use-after-free.
	 */
	memset(&j, 0, sizeof(j));
	j.fd = fd;
	if (pthread_create(&t, NULL, thr_alloc, &j))
		bail("pthread_create");
	pthread_join(t, NULL);
	ret = tc_get(tc, j.p, GPU_PAGE, 0, &q);
	ok(ret == 0, "the main thread pins memory an exited thread allocated (%d)", ret);
	if (ret == 0)
		tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &q);
	munmap(j.p, SZ);
	ok(gs_free(fd, j.handle) == 0, "and frees it after the thread is gone");
}

int main(void)
{
	int fd, tc;
	uint64_t h;
	char *p;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	p = gs_alloc(fd, SZ, &h);
	fill_pattern(p, SZ, 5);

	test_good(tc, p);
	test_bad(tc, p);
	test_crossing(fd, tc);
	test_foreign(tc, p);
	test_threads(fd, tc, p);

	close(tc);
	munmap(p, SZ);
	gs_free(fd, h);
	close(fd);
	ok(dbg_get("free_callbacks") == 0, "no free callback ran in this test");
	return gs_finish();
}
