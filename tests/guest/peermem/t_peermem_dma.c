// SPDX-License-Identifier: GPL-2.0
/*
 * peermem's path for a real DMA device (a PCI HCA): the rig core's test
 * hook debugfs peer_memory/<client>/dma_test runs acquire, get_pages,
 * dma_map(&pdev->dev), get_page_size, the core's checks, dma_unmap,
 * put_pages and release for a range of this process, with a PCI device of
 * the guest as DMA device. peermem then maps through
 * nvidia_p2p_dma_map_pages and coalesces within the device's segment
 * limits. Skipped when the kernel has no dma_test hook.
 */
#include <dirent.h>

#include "peermem_test.h"

#define LEN (1024 * 1024UL)
#define NPAGES (LEN / GPU_PAGE)

static char hook[256];

struct hook_res {
	long long ret, nmap, orig_nents, page_size, dma_bytes;
};

/* Run the hook on [addr, +len) for dev: the write's result (count or -errno). */
static long run_hook(uint64_t addr, uint64_t len, const char *dev, struct hook_res *r)
{
	char line[256];
	FILE *f;
	long n;
	int fd;

	fd = open(hook, O_RDWR);
	if (fd < 0)
		return -errno;
	snprintf(line, sizeof(line), "%#llx %llu %s", (unsigned long long)addr,
		 (unsigned long long)len, dev);
	n = write(fd, line, strlen(line));
	if (n < 0)
		n = -errno;
	close(fd);
	memset(r, 0xff, sizeof(*r));
	f = fopen(hook, "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
		sscanf(line, "ret=%lld nmap=%lld orig_nents=%lld page_size=%lld dma_bytes=%lld",
		       &r->ret, &r->nmap, &r->orig_nents, &r->page_size, &r->dma_bytes);
	}
	return n;
}

/* The first PCI device with a DMA mask (as the gpusim test client picks). */
static int find_pci(char *name, size_t len, int *has_driver)
{
	struct dirent **list;
	char path[512];
	int n, i, found = -1;

	n = scandir("/sys/bus/pci/devices", &list, NULL, alphasort);
	for (i = 0; i < n; i++) {
		if (found < 0 && list[i]->d_name[0] != '.' &&
		    read_ll("/sys/bus/pci/devices/%s/dma_mask_bits", list[i]->d_name) > 0) {
			snprintf(name, len, "%.*s", (int)len - 1, list[i]->d_name);
			snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", list[i]->d_name);
			*has_driver = access(path, F_OK) == 0;
			found = i;
		}
		free(list[i]);
	}
	if (n >= 0)
		free(list);
	return found < 0 ? -1 : 0;
}

int main(void)
{
	struct hook_res r;
	struct gmem g;
	char dev[64];
	long long u0, c0, m0, um0, d0;
	int fd, has_driver = 0;
	long n;

	rxe_up();
	load_modules(NULL);
	snprintf(hook, sizeof(hook), "/sys/kernel/debug/peer_memory/%s/dma_test", pm_name);
	if (access(hook, F_OK) != 0) {
		skip("the real-DMA-device path: this kernel's peer-memory core has no dma_test hook");
		pm_rmmod();
		return finish();
	}
	if (find_pci(dev, sizeof(dev), &has_driver))
		bail("no PCI device with a DMA mask in the guest");
	diag("DMA device %s (%s)", dev, has_driver ? "has a driver" : "no driver: the PCI core's 64 KiB segment limit");
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim");

	/* One physically contiguous megabyte. */
	gs_knob("contig_bytes", "0");
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	u0 = pm("sg_entries_uncoalesced");
	c0 = pm("sg_entries_coalesced");
	m0 = gs("calls/dma_map_pages");
	um0 = gs("calls/dma_unmap_pages");
	n = run_hook((uintptr_t)g.p, LEN, dev, &r);
	ok(n > 0 && r.ret == 0, "dma_test on 1 MiB of gpusim memory for %s succeeds (write %ld, ret %lld)", dev, n, r.ret);
	ok(gs("calls/dma_map_pages") == m0 + 1 && gs("calls/dma_unmap_pages") == um0 + 1,
	   "peermem mapped and unmapped it with nvidia_p2p_dma_map_pages/_unmap_pages once");
	ok(r.page_size == (long long)GPU_PAGE && r.dma_bytes == (long long)LEN,
	   "page size 64 KiB, %lld DMA bytes", r.dma_bytes);
	ok(r.nmap == r.orig_nents && pm("sg_entries_coalesced") - c0 == r.orig_nents &&
	   pm("sg_entries_uncoalesced") - u0 == (long long)NPAGES,
	   "%lld entries for %lu contiguous pages (counters agree)", r.orig_nents, NPAGES);
	if (has_driver)
		ok(r.orig_nents >= 1 && r.orig_nents <= (long long)NPAGES,
		   "entries within the device's limits (its driver may have raised them)");
	else
		ok(r.orig_nents == (long long)NPAGES,
		   "entries honour the device's 64 KiB maximum segment (PCI default): one per page");
	ok(pm_idle() && gs("live_dma_mappings") == 0 && gs("live_pins") == 0,
	   "nothing pinned or mapped afterwards");

	/* An unaligned sub-range. */
	{
		uint64_t a = (uintptr_t)g.p + 70000, l = 100000;
		long long want = (long long)(((a + l + 4095) & ~4095ULL) - (a & ~4095ULL));

		n = run_hook(a, l, dev, &r);
		ok(n > 0 && r.ret == 0 && r.dma_bytes == want && r.nmap >= 1 && r.nmap <= 2,
		   "an unaligned sub-range maps its %lld page-aligned bytes in %lld entries (ret %lld)",
		   want, r.nmap, r.ret);
	}

	/* Injected failure of nvidia_p2p_dma_map_pages. */
	gs_knob("fail/dma_map_pages", "1");
	d0 = pm("errors");
	n = run_hook((uintptr_t)g.p, LEN, dev, &r);
	ok(n == -ENOMEM && r.ret == -ENOMEM && pm("errors") > d0,
	   "fail/dma_map_pages: the mapping fails with the driver's errno (%ld)", n);
	ok(pm_idle() && gs("live_pins") == 0 && gs("live_dma_mappings") == 0,
	   "fail/dma_map_pages: nothing left pinned or mapped");

	/* Not GPU memory: peermem declines. */
	{
		uint8_t *hbuf = aligned_alloc(4096, LEN);

		memset(hbuf, 1, LEN);
		d0 = pm("registrations_declined");
		n = run_hook((uintptr_t)hbuf, LEN, dev, &r);
		ok(n < 0 && pm("registrations_declined") == d0 + 1 && pm_idle(),
		   "host memory: peermem declines it (write %ld)", n);
		free(hbuf);
	}

	/* Freed GPU memory: declined too. */
	gmem_free(fd, &g);
	n = run_hook((uintptr_t)g.p, LEN, dev, &r);
	ok(n < 0 && pm_idle(), "freed GPU memory: declined (write %ld)", n);
	gmem_drop(&g);

	close(fd);
	gs_knob("contig_bytes", "65536");
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	ok(pm_rmmod() == 0, "rmmod peermem");
	return finish();
}
