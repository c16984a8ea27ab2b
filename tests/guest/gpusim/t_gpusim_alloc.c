// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_alloc - /dev/gpusim: allocation, CPU access, bad ioctl
 * arguments, and what munmap/mremap/fork/close do to an allocation.
 */
#include "gpusim_test.h"

static void test_basic(void)
{
	struct gpusim_alloc a;
	struct gpusim_info inf;
	int fd = gs_open();
	int ret;
	char *p;

	ret = gs_alloc_at(fd, 1 << 20, 0, &a);
	ok(ret == 0, "alloc 1 MiB (%s)", strerror(-ret));
	if (ret)
		return;
	p = (char *)(uintptr_t)a.addr;
	ok(a.addr && a.addr % GPU_PAGE == 0, "address %#llx is 64 KiB aligned",
	   (unsigned long long)a.addr);
	ok(a.handle != 0, "handle is non-zero (%llu)", (unsigned long long)a.handle);
	ok(a.chunk_bytes == GPU_PAGE, "default contiguity is 64 KiB (%u)", a.chunk_bytes);
	ok(dbg_get("live_allocs") == 1 && dbg_get("live_vmas") == 1 &&
	   dbg_get("live_mem_bytes") == 1 << 20,
	   "counters: 1 allocation, 1 mapping, 1 MiB of memory");

	fill_pattern(p, 1 << 20, 0x1234);
	ok(check_pattern(p, 1 << 20, 0x1234), "CPU writes through the mapping read back");
	ok(gs_info(fd, a.handle, &inf) == 0 && inf.addr == a.addr &&
	   inf.size == 1 << 20 && inf.pins == 0 && inf.chunk_bytes == GPU_PAGE,
	   "GPUSIM_IOC_INFO describes it");

	ret = gs_free(fd, a.handle);
	ok(ret == 0, "free it (%s)", strerror(-ret));
	ok(dbg_get("live_allocs") == 0, "live_allocs back to 0 after free");
	ok(dbg_get("live_mem_bytes") == 1 << 20,
	   "memory stays while the CPU mapping exists");
	ok(check_pattern(p, 1 << 20, 0x1234), "the stale mapping still reads the old data");
	ok(gs_free(fd, a.handle) == -ENOENT, "second free of the handle: ENOENT");
	ok(gs_info(fd, a.handle, &inf) == -ENOENT, "INFO of a freed handle: ENOENT");
	ok(munmap(p, 1 << 20) == 0, "munmap the freed allocation");
	ok(dbg_get("live_mem_bytes") == 0 && dbg_get("live_vmas") == 0,
	   "memory returned once the mapping is gone");

	ret = gs_alloc_at(fd, 100, 0, &a);
	ok(ret == 0 && gs_info(fd, a.handle, &inf) == 0 && inf.size == GPU_PAGE,
	   "a 100-byte allocation is rounded up to 64 KiB");
	if (!ret) {
		munmap((void *)(uintptr_t)a.addr, GPU_PAGE);
		gs_free(fd, a.handle);
	}
	close(fd);
}

static void test_bad_args(void)
{
	struct gpusim_alloc a, b;
	int fd = gs_open(), fd2 = gs_open(), rofd;
	uint64_t max = dbg_get("max_alloc_bytes");
	void *hole;
	int ret;

	ok(gs_alloc_at(fd, 0, 0, &a) == -EINVAL, "size 0: EINVAL");
	memset(&a, 0, sizeof(a));
	a.size = GPU_PAGE;
	a.flags = 1;
	ok(ioctl(fd, GPUSIM_IOC_ALLOC, &a) && errno == EINVAL, "unknown flags: EINVAL");
	ok(gs_alloc_at(fd, 1ULL << 62, 0, &a) == -ENOMEM, "size 2^62: ENOMEM");
	ok(gs_alloc_at(fd, ~0ULL, 0, &a) == -ENOMEM, "size 2^64-1: ENOMEM");
	ok(gs_alloc_at(fd, max + 1, 0, &a) == -ENOMEM, "size max_alloc_bytes+1: ENOMEM");
	ok(gs_alloc_at(fd, GPU_PAGE, 0x10000000 + 4096, &a) == -EINVAL,
	   "misaligned fixed address: EINVAL");
	ok(ioctl(fd, GPUSIM_IOC_ALLOC, NULL) && errno == EFAULT, "NULL argument: EFAULT");
	ok(ioctl(fd, GPUSIM_IOC_ALLOC, (void *)1) && errno == EFAULT, "bogus argument pointer: EFAULT");
	ok(ioctl(fd, GPUSIM_IOC_FREE, (void *)-4096L) && errno == EFAULT,
	   "FREE with a kernel-space pointer: EFAULT");
	ok(ioctl(fd, _IO('G', 0x7f), 0) && errno == ENOTTY, "unknown ioctl: ENOTTY");
	ok(gs_free(fd, 0) == -ENOENT, "free handle 0: ENOENT");
	ok(gs_free(fd, 0xdeadbeefULL) == -ENOENT, "free unknown handle: ENOENT");
	ok(dbg_get("live_allocs") == 0, "no allocation left behind by the refused calls");

	/* Handles are per open file. */
	ret = gs_alloc_at(fd, GPU_PAGE, 0, &a);
	ok(ret == 0, "alloc on the first file");
	ok(gs_free(fd2, a.handle) == -ENOENT, "freeing it through another open file: ENOENT");

	/* A fixed address: must be free, and is honoured exactly. */
	ok(gs_alloc_at(fd, GPU_PAGE, a.addr, &b) == -EEXIST, "fixed address already mapped: EEXIST");
	hole = mmap(NULL, 4 * GPU_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole != MAP_FAILED) {
		uint64_t want = ((uintptr_t)hole + GPU_PAGE - 1) & ~(GPU_PAGE - 1);

		munmap(hole, 4 * GPU_PAGE);
		ret = gs_alloc_at(fd, GPU_PAGE, want, &b);
		ok(ret == 0 && b.addr == want, "fixed free address %#llx honoured (%s)",
		   (unsigned long long)want, strerror(-ret));
		if (!ret) {
			munmap((void *)(uintptr_t)b.addr, GPU_PAGE);
			gs_free(fd, b.handle);
		}
	}
	munmap((void *)(uintptr_t)a.addr, GPU_PAGE);
	gs_free(fd, a.handle);

	/* The ioctl maps read-write: a read-only open cannot allocate. */
	rofd = open("/dev/gpusim", O_RDONLY);
	ok(rofd >= 0 && gs_alloc_at(rofd, GPU_PAGE, 0, &a) == -EACCES,
	   "alloc on a read-only open: EACCES");
	if (rofd >= 0)
		close(rofd);

	/* Only GPUSIM_IOC_ALLOC may mmap the device. */
	hole = mmap(NULL, GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ok(hole == MAP_FAILED && errno == EINVAL, "direct mmap of /dev/gpusim: EINVAL");
	hole = mmap(NULL, GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096 * 1);
	ok(hole == MAP_FAILED, "direct mmap with a handle-like offset is refused too");
	close(fd2);
	close(fd);
}

static void test_mapping_changes(void)
{
	int fd = gs_open();
	struct gpusim_info inf;
	uint64_t h;
	char *p = gs_alloc(fd, 4 * GPU_PAGE, &h), *q;
	void *hole, *r;
	pid_t pid;
	int st;

	fill_pattern(p, 4 * GPU_PAGE, 77);

	/* Splitting the mapping is refused. */
	ok(munmap(p, GPU_PAGE) == -1 && errno == EINVAL, "partial munmap: EINVAL");
	ok(munmap(p + GPU_PAGE, GPU_PAGE) == -1 && errno == EINVAL, "munmap of a middle piece: EINVAL");
	ok(mprotect(p, GPU_PAGE, PROT_READ) == -1 && errno == EINVAL, "partial mprotect: EINVAL");
	r = mremap(p, 4 * GPU_PAGE, 2 * GPU_PAGE, 0);
	ok(r == MAP_FAILED && errno == EINVAL, "mremap shrink: EINVAL");
	r = mremap(p, 4 * GPU_PAGE, 8 * GPU_PAGE, MREMAP_MAYMOVE);
	ok(r == MAP_FAILED && errno == EFAULT, "mremap grow: EFAULT (VM_DONTEXPAND)");
	ok(check_pattern(p, 4 * GPU_PAGE, 77), "data intact after the refused changes");

	/* fork does not copy it (VM_DONTCOPY). */
	pid = fork();
	if (pid == 0)
		_exit(msync(p, GPU_PAGE, MS_ASYNC) == -1 && errno == ENOMEM ? 0 : 1);
	ok(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "a forked child does not have the mapping");

	/* mremap of the whole mapping moves it: the allocation follows. */
	hole = mmap(NULL, 6 * GPU_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	q = (char *)(((uintptr_t)hole + GPU_PAGE - 1) & ~(GPU_PAGE - 1));
	r = mremap(p, 4 * GPU_PAGE, 4 * GPU_PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, q);
	ok(r == q, "mremap the whole mapping to %p", (void *)q);
	ok(gs_info(fd, h, &inf) == 0 && inf.addr == (uintptr_t)q, "INFO reports the new address");
	ok(check_pattern(q, 4 * GPU_PAGE, 77), "data visible at the new address");
	ok(dbg_get("live_vmas") == 1, "still exactly one mapping");
	r = mremap(q, 4 * GPU_PAGE, 4 * GPU_PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
	ok(r == MAP_FAILED && errno == EINVAL, "mremap MREMAP_DONTUNMAP: EINVAL");

	/* munmap detaches: the allocation lives on until freed. */
	ok(munmap(q, 4 * GPU_PAGE) == 0, "munmap the whole mapping");
	ok(gs_info(fd, h, &inf) == 0 && inf.addr == 0, "INFO: allocation alive, address 0");
	ok(dbg_get("live_allocs") == 1 && dbg_get("live_vmas") == 0, "counters: 1 allocation, 0 mappings");
	ok(gs_free(fd, h) == 0, "free the unmapped allocation");
	munmap(hole, 6 * GPU_PAGE);
	close(fd);
}

static void test_close(void)
{
	int fd = gs_open();
	uint64_t h;
	char *p = gs_alloc(fd, 2 * GPU_PAGE, &h);
	pid_t pid;
	int st;

	p[0] = 42;
	close(fd);
	ok(dbg_get("live_allocs") == 1 && p[0] == 42,
	   "close(fd) while mapped: the mapping keeps the file, allocation alive");
	munmap(p, 2 * GPU_PAGE);
	ok(dbg_get("live_allocs") == 0 && dbg_get("live_mem_bytes") == 0,
	   "the last munmap releases the file and frees the allocation");

	/* Process exit frees everything. */
	pid = fork();
	if (pid == 0) {
		int cfd = gs_open();

		gs_alloc(cfd, 8 * GPU_PAGE, NULL);
		gs_alloc(cfd, GPU_PAGE, NULL);
		_exit(dbg_get("live_allocs") == 2 ? 0 : 1);
	}
	ok(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "child made two allocations and exited");
	ok(dbg_get("live_allocs") == 0 && dbg_get("live_mem_bytes") == 0,
	   "exit freed both");
}

/* /dev/gpusim_mmap: every mmap of it allocates (for perftest's --mmap). */
static void test_mmapdev(void)
{
	int fd = open("/dev/gpusim_mmap", O_RDWR | O_CLOEXEC);
	char *p, *q;
	void *bad;
	int fails = 0;

	if (fd < 0)
		bail("cannot open /dev/gpusim_mmap: %s", strerror(errno));
	p = mmap(NULL, 3 * GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	q = mmap(NULL, GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ok(p != MAP_FAILED && q != MAP_FAILED && (uintptr_t)p % GPU_PAGE == 0 &&
	   (uintptr_t)q % GPU_PAGE == 0 && dbg_get("live_allocs") == 2,
	   "/dev/gpusim_mmap: two mmaps, two allocations at 64 KiB aligned addresses (%p, %p)", p, q);
	if (p == MAP_FAILED || q == MAP_FAILED)
		bail("mmap of /dev/gpusim_mmap: %s", strerror(errno));
	for (size_t i = 0; i < 3 * GPU_PAGE; i += 4096)
		p[i] = (char)(i >> 12);
	for (size_t i = 0; i < 3 * GPU_PAGE; i += 4096)
		fails += p[i] != (char)(i >> 12);
	ok(fails == 0, "the CPU reads back what it wrote");
	bad = mmap(NULL, GPU_PAGE + 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ok(bad == MAP_FAILED && errno == EINVAL, "a length that is no multiple of 64 KiB: EINVAL");
	bad = mmap(NULL, GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, GPU_PAGE);
	ok(bad == MAP_FAILED && errno == EINVAL, "an offset other than 0: EINVAL");
	bad = mmap((char *)p + 20 * GPU_PAGE + 4096, GPU_PAGE, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_FIXED, fd, 0);
	ok(bad == MAP_FAILED && errno == EINVAL, "MAP_FIXED at an address not 64 KiB aligned: EINVAL");
	ok(dbg_get("live_allocs") == 2, "the refused mmaps allocated nothing");
	ok(dbg_set("free_mmap_allocs", 1) == 0 && dbg_get("live_allocs") == 0,
	   "debugfs free_mmap_allocs frees both (the mappings stay until munmap)");
	munmap(p, 3 * GPU_PAGE);
	munmap(q, GPU_PAGE);
	p = mmap(NULL, 2 * GPU_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ok(p != MAP_FAILED && dbg_get("live_allocs") == 1, "a new mmap allocates again");
	if (p != MAP_FAILED)
		munmap(p, 2 * GPU_PAGE);
	close(fd);
	ok(dbg_get("live_allocs") == 0 && dbg_get("live_mem_bytes") == 0,
	   "closing the file (after the last munmap) frees what it allocated");
}

int main(void)
{
	gs_setup();
	test_mmapdev();
	test_basic();
	test_bad_args();
	test_mapping_changes();
	test_close();
	return gs_finish();
}
