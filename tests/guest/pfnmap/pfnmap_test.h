/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pfnmap_test.h - helpers of the tests of peermem's PFN-map source: the
 * rig's exporter (tests/pfnmap/pfnmap_exporter.ko, a stand-in for a
 * data-acquisition driver mapping reserved RAM with remap_pfn_range) and
 * the source's counters in /sys/kernel/debug/peermem/pfn/.
 */
#ifndef PFNMAP_TEST_H
#define PFNMAP_TEST_H

#include <dirent.h>

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

/* A memory BAR of the rig's PCI devices (scripts/vm.sh: ivshmem's BAR 2). */
struct rig_bar {
	char dev[32];		/* PCI address */
	char port[32];		/* the downstream port above it ("" if none) */
	uint64_t phys, len;
	uint8_t *cpu;		/* its sysfs resource mapping, if a test maps it */
};

/* The PCI address of the directory a sysfs path is in ("" at the top). */
static void pci_parent_of(const char *path, char *out, size_t n)
{
	char tmp[512], *s;

	snprintf(tmp, sizeof(tmp), "%s", path);
	s = strrchr(tmp, '/');
	out[0] = 0;
	if (!s)
		return;
	*s = 0;
	s = strrchr(tmp, '/');
	if (s && strchr(s + 1, ':'))
		snprintf(out, n, "%s", s + 1);
}

static int pci_read_hex(const char *dev, const char *file, unsigned long *v)
{
	char path[256], line[64];

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", dev, file);
	if (read_line(path, line, sizeof(line)))
		return -1;
	*v = strtoul(line, NULL, 16);
	return 0;
}

/* BAR 2 of b->dev (ivshmem's shared memory): 0 or -1. */
static int pci_bar2(struct rig_bar *b)
{
	char path[256];
	unsigned long long st, en, fl;
	FILE *f;
	int i, found = 0;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource", b->dev);
	f = fopen(path, "r");
	if (!f)
		return -1;
	for (i = 0; i < 3 && fscanf(f, "%llx %llx %llx", &st, &en, &fl) == 3; i++)
		if (i == 2 && en > st) {
			b->phys = st;
			b->len = en - st + 1;
			found = 1;
		}
	fclose(f);
	return found ? 0 : -1;
}

/*
 * The rig's two ivshmem devices (1af4:1110): *sw below the same PCIe switch
 * as the DMA device ($PEERMEM_DMA_DEVICE), *rc elsewhere (the root
 * complex); dma_port gets the DMA device's port. 0, or -1 if either is
 * missing.
 */
static int rig_ivshmem(struct rig_bar *sw, struct rig_bar *rc, char *dma_port, size_t n)
{
	const char *dma = getenv("PEERMEM_DMA_DEVICE");
	char dpath[512], sw_up[512], path[600], real[512];
	struct dirent *de;
	DIR *d;

	memset(sw, 0, sizeof(*sw));
	memset(rc, 0, sizeof(*rc));
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", dma ? dma : "");
	if (!dma || !*dma || !realpath(path, dpath))
		return -1;
	pci_parent_of(dpath, dma_port, n);
	/* The switch's upstream port: the directory above the DMA device's port. */
	snprintf(sw_up, sizeof(sw_up), "%s", dpath);
	*strrchr(sw_up, '/') = 0;
	*strrchr(sw_up, '/') = 0;
	d = opendir("/sys/bus/pci/devices");
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		unsigned long ven, dev;
		struct rig_bar *b;

		if (de->d_name[0] == '.' || pci_read_hex(de->d_name, "vendor", &ven) ||
		    pci_read_hex(de->d_name, "device", &dev) || ven != 0x1af4 || dev != 0x1110)
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", de->d_name);
		if (!realpath(path, real))
			continue;
		b = !strncmp(real, sw_up, strlen(sw_up)) && real[strlen(sw_up)] == '/' ? sw : rc;
		snprintf(b->dev, sizeof(b->dev), "%.31s", de->d_name);
		pci_parent_of(real, b->port, sizeof(b->port));
		if (pci_bar2(b))
			b->dev[0] = 0;
	}
	closedir(d);
	return sw->dev[0] && rc->dev[0] ? 0 : -1;
}

#endif /* PFNMAP_TEST_H */
