// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of peermem's PFN-map page source (docs/module.md, "PFN-mapped
 * memory"): the module parameter, the PFN walk under the mmap lock
 * (follow_pfnmap_start/end, 6.12+), the lookup of a PCI BAR and its
 * peer-to-peer path (pci_p2pdma_distance) and the DMA mapping of the runs
 * (dma_map_resource, or a BAR's bus addresses). The decisions stay in Rust (rust/client/pfnmap.rs,
 * rust/kapi/pfnmap.rs); see include/peermem_pfnmap.h for the contract.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/ratelimit.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "peermem_ffi.h"

static bool pfnmap;
module_param(pfnmap, bool, 0444);
MODULE_PARM_DESC(pfnmap,
		 "Serve memory registrations on PFN-mapped memory (mmap of a driver that uses remap_pfn_range: VM_PFNMAP) when it is RAM the kernel does not manage (reserved at boot, PageReserved), revoking the registration through the core when the mapping changes (default N: the driver that exports the memory must zap user mappings before it reuses the memory, see docs/module.md; needs mmu_notifier=Y and enable_invalidate=Y)");

static bool pfnmap_ram_only;
module_param(pfnmap_ram_only, bool, 0444);
MODULE_PARM_DESC(pfnmap_ram_only,
		 "With pfnmap=Y, serve reserved RAM only, never a PCI device's memory BAR (default N: a BAR is served when the RDMA device can reach it peer-to-peer, as pci_p2pdma_distance says: both below one PCIe switch with no ACS redirect between them, or a host bridge the kernel knows to route peer-to-peer)");

bool peermem_param_pfnmap(void)
{
	return pfnmap;
}

void peermem_pfn_put_dev(struct pci_dev *dev)
{
	pci_dev_put(dev);
}

void peermem_pfn_free(void *p)
{
	kvfree(p);
}

/* Whether the firmware's memory map (/proc/iomem) says the page is RAM. */
static bool peermem_pfn_firmware_ram(unsigned long pfn, bool reserved_too,
				     struct peermem_pfn_walk *walk)
{
	walk->lookups++;
	if (region_intersects(PFN_PHYS(pfn), PAGE_SIZE, IORESOURCE_SYSTEM_RAM,
			      IORES_DESC_NONE) == REGION_INTERSECTS)
		return true;
	/* memmap=nn$ss, no-map reserved-memory: "Reserved", not System RAM. */
	if (!reserved_too)
		return false;
	walk->lookups++;
	return region_intersects(PFN_PHYS(pfn), PAGE_SIZE, IORESOURCE_MEM,
				 IORES_DESC_RESERVED) == REGION_INTERSECTS;
}

/* Whether the page at pfn is RAM that no kernel allocator hands out. */
static u32 peermem_pfn_classify(unsigned long pfn, struct peermem_pfn_walk *walk)
{
	if (is_zero_pfn(pfn))
		return PEERMEM_PFN_ZERO_PAGE;
	if (pfn_valid(pfn)) {
		struct page *page = pfn_to_page(pfn);

		/* A BAR's pages when its driver published it (P2PDMA). */
		if (is_zone_device_page(page))
			return PEERMEM_PFN_NOT_RAM;
		if (!PageReserved(page))
			return PEERMEM_PFN_MANAGED_RAM;
		/*
		 * Holes inside the kernel's memory map have reserved struct
		 * pages too, device memory among them (the legacy VGA window
		 * at 0xa0000, a BAR that shares a memory section with RAM):
		 * RAM only where the firmware's map says RAM or reserved.
		 */
		return peermem_pfn_firmware_ram(pfn, true, walk) ? PEERMEM_PFN_OK :
							     PEERMEM_PFN_NOT_RAM;
	}
	/*
	 * Outside the memory map: only System RAM (a "Reserved" range there
	 * may as well be a chipset's MMIO).
	 */
	return peermem_pfn_firmware_ram(pfn, false, walk) ? PEERMEM_PFN_OK : PEERMEM_PFN_NOT_RAM;
}

static int peermem_pfn_add(struct peermem_pfn_run **runs, u32 *n, u32 *cap,
			   u64 phys)
{
	struct peermem_pfn_run *r;

	if (*n && (*runs)[*n - 1].phys + (*runs)[*n - 1].len == phys) {
		(*runs)[*n - 1].len += PAGE_SIZE;
		return 0;
	}
	if (*n == *cap) {
		u32 cap2 = *cap ? *cap * 2 : 16;

		r = kvmalloc_array(cap2, sizeof(*r), GFP_KERNEL);
		if (!r)
			return -ENOMEM;
		if (*n)
			memcpy(r, *runs, *n * sizeof(*r));
		kvfree(*runs);
		*runs = r;
		*cap = cap2;
	}
	(*runs)[*n].phys = phys;
	(*runs)[*n].len = PAGE_SIZE;
	(*n)++;
	return 0;
}

/* Whether BAR @bar of @dev holds the page at @pfn whole. */
static bool peermem_bar_holds(struct pci_dev *dev, int bar, unsigned long pfn)
{
	const struct resource *r = &dev->resource[bar];

	return (r->flags & IORESOURCE_MEM) && r->end > r->start &&
	       PFN_PHYS(pfn) >= r->start && PFN_PHYS(pfn) + PAGE_SIZE - 1 <= r->end;
}

/* The PCI device (with a reference) and memory BAR holding pfn's page. */
static struct pci_dev *peermem_pfn_find_bar(unsigned long pfn, int *bar)
{
	struct pci_dev *dev = NULL;
	int i;

	while ((dev = pci_get_device(PCI_ANY_ID, PCI_ANY_ID, dev))) {
		for (i = 0; i < PCI_STD_NUM_BARS; i++) {
			if (peermem_bar_holds(dev, i, pfn)) {
				*bar = i;
				return dev;
			}
		}
	}
	return NULL;
}

/*
 * What a page that is not RAM may still be: a page of the BAR the range's
 * earlier pages are in (*dev, *bar), or, for the first page (first), of any
 * PCI device's memory BAR, which then becomes *dev, *bar.
 */
static u32 peermem_pfn_classify_bar(unsigned long pfn, bool first,
				    struct pci_dev **dev, int *bar)
{
	struct pci_dev *d;
	int b;

	if (*dev && peermem_bar_holds(*dev, *bar, pfn))
		return PEERMEM_PFN_OK;
	d = peermem_pfn_find_bar(pfn, &b);
	if (!d)
		return PEERMEM_PFN_NOT_RAM;
	if (pfnmap_ram_only || *dev || !first) {
		pci_dev_put(d);
		return pfnmap_ram_only ? PEERMEM_PFN_BAR_RAM_ONLY : PEERMEM_PFN_MIXED;
	}
	*dev = d;
	*bar = b;
	return PEERMEM_PFN_OK;
}

int peermem_pfn_resolve(u64 start, u64 len, struct peermem_pfn_walk *walk,
			struct peermem_pfn_run **runs,
			u32 *nruns, bool *writable, u32 *why, u64 *where,
			struct pci_dev **bar_dev, int *bar)
{
	struct mm_struct *mm = current->mm;
	struct peermem_pfn_run *r = NULL;
	u64 addr = start, end;
	u32 n = 0, cap = 0;
	int ret = 0;

	*runs = NULL;
	*nruns = 0;
	*bar_dev = NULL;
	*bar = 0;
	*writable = true;
	*why = PEERMEM_PFN_OK;
	*where = 0;
	walk->pages = 0;
	walk->lookups = 0;
	if (!mm || (current->flags & PF_KTHREAD) || !len ||
	    !PAGE_ALIGNED(start) || !PAGE_ALIGNED(len) ||
	    check_add_overflow(start, len, &end))
		return -EINVAL;
	if (mmap_read_lock_killable(mm))
		return -EINTR;
	while (addr < end && !*why) {
		struct vm_area_struct *vma = vma_lookup(mm, addr);
		u64 vend;

		*where = addr;
		if (!vma) {
			*why = PEERMEM_PFN_NO_VMA;
			break;
		}
		if (!(vma->vm_flags & VM_PFNMAP)) {
			*why = PEERMEM_PFN_NOT_PFNMAP;
			break;
		}
		/*
		 * A copy-on-write mapping may get anonymous copies of its
		 * pages, which reclaim and migration handle. (is_cow_mapping()
		 * on 6.12, vma_is_cow_mapping() on 7.x: the test is spelled out.)
		 */
		if ((vma->vm_flags & (VM_SHARED | VM_MAYWRITE)) == VM_MAYWRITE) {
			*why = PEERMEM_PFN_PRIVATE;
			break;
		}
		if (!(vma->vm_flags & VM_WRITE))
			*writable = false;
		vend = min_t(u64, end, vma->vm_end);
		for (; addr < vend; addr += PAGE_SIZE) {
			struct follow_pfnmap_args args = {
				.vma = vma,
				.address = addr,
			};
			unsigned long pfn;

			if (follow_pfnmap_start(&args)) {
				*why = PEERMEM_PFN_NOT_PRESENT;
				break;
			}
			pfn = args.pfn;
			if (!args.writable)
				*writable = false;
			follow_pfnmap_end(&args);
			walk->pages++;
			if (walk->delay_ms && !(walk->pages % PEERMEM_PFN_WALK_BATCH))
				msleep(walk->delay_ms);
			*why = peermem_pfn_classify(pfn, walk);
			/* A range is all RAM or all one BAR. */
			if (*why == PEERMEM_PFN_NOT_RAM)
				*why = peermem_pfn_classify_bar(pfn, !n, bar_dev, bar);
			else if (!*why && *bar_dev)
				*why = PEERMEM_PFN_MIXED;
			if (*why)
				break;
			ret = peermem_pfn_add(&r, &n, &cap, PFN_PHYS(pfn));
			if (ret)
				goto out;
		}
	}
out:
	mmap_read_unlock(mm);
	if (ret || *why) {
		kvfree(r);
		pci_dev_put(*bar_dev);
		*bar_dev = NULL;
		return ret;
	}
	*runs = r;
	*nruns = n;
	return 0;
}

/* Whether @port redirects peer requests upstream (ACS control, read now). */
static bool peermem_acs_redirects(struct pci_dev *port)
{
	u16 ctrl;

	if (!port->acs_cap)
		return false;
	pci_read_config_word(port, port->acs_cap + PCI_ACS_CTRL, &ctrl);
	return ctrl & (PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC);
}

/*
 * How @client reaches a BAR of @provider peer-to-peer: -EOPNOTSUPP if
 * pci_p2pdma_distance() says it cannot, else PEERMEM_P2P_BUS_ADDR when both
 * sit below a common bridge and no port on the way redirects peer requests
 * (the switch routes the bus address to the BAR, no IOMMU on the way), else
 * PEERMEM_P2P_RESOURCE (through a host bridge the kernel allows: mapped
 * like any resource, through the IOMMU if there is one). The kernel's
 * pci_p2pdma_map_type() cannot answer this for a BAR whose driver did not
 * set up P2PDMA itself, which is every BAR a PFN map can show us; this
 * follows the same rules (calc_map_type_and_dist in drivers/pci/p2pdma.c).
 */
static int peermem_p2pdma_map_type(struct pci_dev *provider, struct pci_dev *client)
{
	static DEFINE_RATELIMIT_STATE(rs, 60 * HZ, 1);
	struct pci_dev *a, *b;
	bool redirect = false;

	if (pci_p2pdma_distance(provider, &client->dev, false) < 0) {
		/* Again, verbose: the kernel says why and what to change. */
		if (__ratelimit(&rs))
			pci_p2pdma_distance(provider, &client->dev, true);
		return -EOPNOTSUPP;
	}
	for (a = provider; a; a = pci_upstream_bridge(a)) {
		if (peermem_acs_redirects(a))
			redirect = true;
		for (b = client; b; b = pci_upstream_bridge(b))
			if (a == b)
				goto common;
	}
	return PEERMEM_P2P_RESOURCE;
common:
	for (b = client; b != a; b = pci_upstream_bridge(b))
		if (peermem_acs_redirects(b))
			redirect = true;
	return redirect ? PEERMEM_P2P_RESOURCE : PEERMEM_P2P_BUS_ADDR;
}

int peermem_pfn_dma_map(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			u32 nruns, bool writable, struct pci_dev *bar_dev, int bar,
			u64 **dma, u32 *how)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u64 *d;
	u32 i;

	*dma = NULL;
	*how = PEERMEM_P2P_RESOURCE;
	if (bar_dev) {
		int t = peermem_p2pdma_map_type(bar_dev, pdev);

		if (t < 0)
			return t;
		*how = t;
	}
	d = kvmalloc_array(nruns, sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	if (*how == PEERMEM_P2P_BUS_ADDR) {
		/* pci_p2pdma_bus_addr_map(): the BAR's CPU-to-bus offset. */
		u64 off = pci_bus_address(bar_dev, bar) - pci_resource_start(bar_dev, bar);

		for (i = 0; i < nruns; i++)
			d[i] = runs[i].phys + off;
		*dma = d;
		return 0;
	}
	for (i = 0; i < nruns; i++) {
		/*
		 * dma_map_resource: no struct page is used (the memory may have
		 * none), and DMA-API debug accepts it for PageReserved RAM.
		 */
		dma_addr_t a = dma_map_resource(&pdev->dev, runs[i].phys,
						runs[i].len, dir, 0);

		if (dma_mapping_error(&pdev->dev, a)) {
			while (i--)
				dma_unmap_resource(&pdev->dev, d[i], runs[i].len, dir, 0);
			kvfree(d);
			return -EIO;
		}
		d[i] = a;
	}
	*dma = d;
	return 0;
}

void peermem_pfn_dma_unmap(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			   u32 nruns, bool writable, u32 how, u64 *dma)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u32 i;

	if (how != PEERMEM_P2P_BUS_ADDR)
		for (i = 0; i < nruns; i++)
			dma_unmap_resource(&pdev->dev, dma[i], runs[i].len, dir, 0);
	kvfree(dma);
}
