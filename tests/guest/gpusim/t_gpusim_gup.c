// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_gup - gpusim memory behaves like device memory for the kernel's
 * page pinning: get_user_pages / pin_user_pages fail on it (VM_IO |
 * VM_PFNMAP), so ib_umem_get's pin_user_pages_fast fails and the
 * peer-memory path is taken. Each check is paired with the same operation
 * on ordinary memory, which must succeed (so the check can fail).
 */
#include "gpusim_test.h"
#include <sys/uio.h>

static void check_pair(const char *what, int on_normal, int on_gpusim, int err)
{
	ok(on_normal, "%s works on ordinary memory", what);
	ok(on_gpusim, "%s fails on gpusim memory (%s)", what, strerror(err));
}

int main(void)
{
	struct gpusim_tc_req q;
	char *normal, buf[4096];
	struct iovec local, remote;
	int fd, tc, pfd[2];
	ssize_t n1, n2;
	int e2;
	uint64_t h;
	char *p;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	p = gs_alloc(fd, 4 * GPU_PAGE, &h);
	normal = aligned_alloc(GPU_PAGE, 4 * GPU_PAGE);
	memset(normal, 1, 4 * GPU_PAGE);
	memset(p, 2, 4 * GPU_PAGE);

	/* process_vm_readv pins the remote pages (pin_user_pages_remote). */
	local.iov_base = buf;
	local.iov_len = sizeof(buf);
	remote.iov_base = normal;
	remote.iov_len = sizeof(buf);
	n1 = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
	if (n1 < 0 && errno == ENOSYS) {
		skip("process_vm_readv: not in this kernel (CONFIG_CROSS_MEMORY_ATTACH)");
	} else {
		remote.iov_base = p;
		n2 = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
		e2 = errno;
		check_pair("process_vm_readv", n1 == (ssize_t)sizeof(buf), n2 == -1 && e2 == EFAULT, e2);
	}

	/* /proc/self/mem goes through access_remote_vm (get_user_pages_remote). */
	pfd[0] = open("/proc/self/mem", O_RDONLY);
	if (pfd[0] < 0)
		bail("open /proc/self/mem: %s", strerror(errno));
	n1 = pread(pfd[0], buf, sizeof(buf), (off_t)(uintptr_t)normal);
	n2 = pread(pfd[0], buf, sizeof(buf), (off_t)(uintptr_t)p);
	e2 = errno;
	check_pair("reading /proc/self/mem", n1 == (ssize_t)sizeof(buf) && buf[0] == 1,
		   n2 == -1 && e2 == EIO, e2);
	close(pfd[0]);

	/* vmsplice without SPLICE_F_GIFT takes page references (GUP). */
	if (pipe(pfd))
		bail("pipe");
	local.iov_base = normal;
	local.iov_len = 4096;
	n1 = vmsplice(pfd[1], &local, 1, 0);
	local.iov_base = p;
	n2 = vmsplice(pfd[1], &local, 1, 0);
	e2 = errno;
	check_pair("vmsplice", n1 == 4096, n2 == -1 && e2 == EFAULT, e2);
	close(pfd[0]);
	close(pfd[1]);

	/* pin_user_pages_fast from a kernel module, as ib_umem_get does. */
	memset(&q, 0, sizeof(q));
	q.va = (uintptr_t)normal;
	n1 = tc_cmd(tc, GPUSIM_TC_GUP, &q) == 0 && q.ret == 1;
	memset(&q, 0, sizeof(q));
	q.va = (uintptr_t)p;
	n2 = tc_cmd(tc, GPUSIM_TC_GUP, &q) == 0 && q.ret == -EFAULT;
	check_pair("pin_user_pages_fast(FOLL_WRITE)", n1, n2, -q.ret);

	/* The CPU itself can use it, including atomics. */
	__atomic_fetch_add((int *)p, 5, __ATOMIC_SEQ_CST);
	ok(*(int *)p == 0x02020202 + 5, "CPU atomics work on gpusim memory");

	free(normal);
	close(tc);
	munmap(p, 4 * GPU_PAGE);
	gs_free(fd, h);
	close(fd);
	return gs_finish();
}
