/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pfnmap_test.h - helpers of the tests of peermem's PFN-map source: the
 * rig's exporter (tests/pfnmap/pfnmap_exporter.ko, a stand-in for a
 * data-acquisition driver mapping reserved RAM with remap_pfn_range) and
 * the source's counters in /sys/kernel/debug/peermem/pfn/.
 */
#ifndef PFNMAP_TEST_H
#define PFNMAP_TEST_H

#include "../peermem/peermem_test.h"
#include "../../pfnmap/pfnmap_uapi.h"

#define PMDBG_PFN PMDBG "pfn/"

/* A counter of the PFN-map source; -1 if unreadable. */
static long long pf(const char *counter)
{
	return pmc(PMDBG_PFN, counter);
}

static int pf_idle(void)
{
	return pmc_idle(PMDBG_PFN);
}

/*
 * Load the exporter (if needed): $PFNMAP_KO, else the build in
 * $PEERMEM_ROOT; bails out on failure.
 */
static void exporter_load(void)
{
	char ko[512];

	if (access("/sys/module/pfnmap_exporter", F_OK) == 0)
		return;
	if (getenv("PFNMAP_KO"))
		snprintf(ko, sizeof(ko), "%s", getenv("PFNMAP_KO"));
	else
		snprintf(ko, sizeof(ko), "%s/tests/pfnmap/pfnmap_exporter.ko", root_dir());
	if (access(ko, R_OK))
		bail("%s is missing: build it with make -C tests/pfnmap", ko);
	if (run("insmod %s", ko))
		bail("cannot load %s", ko);
}

/* An open of the exporter (O_RDWR or O_RDONLY); bails out on failure. */
static int exporter_open(int flags)
{
	int fd = open(PFNMAP_DEV, flags);

	if (fd < 0)
		bail("open %s: %s", PFNMAP_DEV, strerror(errno));
	return fd;
}

/* Allocate the exporter's buffer (after freeing any): 0 or -errno. */
static int exporter_alloc(int fd, uint64_t len, uint32_t flags, uint32_t *chunks)
{
	struct pfnmap_alloc a = { .len = len, .flags = flags };

	ioctl(fd, PFNMAP_IOC_FREE);
	if (ioctl(fd, PFNMAP_IOC_ALLOC, &a))
		return -errno;
	if (chunks)
		*chunks = a.chunks;
	return 0;
}

/* Copy through the exporter's CPU view: 0 or -errno. */
static int exporter_rw(int fd, int write, int old, uint64_t off, void *buf, uint64_t len)
{
	struct pfnmap_rw a = {
		.off = off, .len = len, .uaddr = (uintptr_t)buf, .old = old,
	};

	return ioctl(fd, write ? PFNMAP_IOC_WRITE : PFNMAP_IOC_READ, &a) ? -errno : 0;
}

/* Map the whole buffer: prot PROT_READ[|PROT_WRITE], flags MAP_SHARED/PRIVATE. */
static uint8_t *exporter_map(int fd, uint64_t len, int prot, int flags)
{
	void *p = mmap(NULL, len, prot, flags, fd, 0);

	return p == MAP_FAILED ? NULL : p;
}

#endif /* PFNMAP_TEST_H */
