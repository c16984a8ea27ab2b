// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of peermem's PFN-map page source (docs/module.md, "PFN-mapped
 * memory"): the module parameter, the PFN walk under the mmap lock
 * (follow_pfnmap_start/end, 6.12+) and the DMA mapping of the runs
 * (dma_map_resource). The decisions stay in Rust (rust/client/pfnmap.rs,
 * rust/kapi/pfnmap.rs); see include/peermem_pfnmap.h for the contract.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-mapping.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "peermem_ffi.h"

static bool pfnmap;
module_param(pfnmap, bool, 0444);
MODULE_PARM_DESC(pfnmap,
		 "Serve memory registrations on PFN-mapped memory (mmap of a driver that uses remap_pfn_range: VM_PFNMAP) when it is RAM the kernel does not manage (reserved at boot, PageReserved), revoking the registration through the core when the mapping changes (default N: the driver that exports the memory must zap user mappings before it reuses the memory, see docs/module.md; needs mmu_notifier=Y and enable_invalidate=Y)");

bool peermem_param_pfnmap(void)
{
	return pfnmap;
}

void peermem_pfn_free(void *p)
{
	kvfree(p);
}

/* Whether the firmware's memory map (/proc/iomem) says the page is RAM. */
static bool peermem_pfn_firmware_ram(unsigned long pfn, bool reserved_too)
{
	if (region_intersects(PFN_PHYS(pfn), PAGE_SIZE, IORESOURCE_SYSTEM_RAM,
			      IORES_DESC_NONE) == REGION_INTERSECTS)
		return true;
	/* memmap=nn$ss, no-map reserved-memory: "Reserved", not System RAM. */
	return reserved_too &&
	       region_intersects(PFN_PHYS(pfn), PAGE_SIZE, IORESOURCE_MEM,
				 IORES_DESC_RESERVED) == REGION_INTERSECTS;
}

/* Whether the page at pfn is RAM that no kernel allocator hands out. */
static u32 peermem_pfn_classify(unsigned long pfn)
{
	if (is_zero_pfn(pfn))
		return PEERMEM_PFN_ZERO_PAGE;
	if (pfn_valid(pfn)) {
		if (!PageReserved(pfn_to_page(pfn)))
			return PEERMEM_PFN_MANAGED_RAM;
		/*
		 * Holes inside the kernel's memory map have reserved struct
		 * pages too, device memory among them (the legacy VGA window
		 * at 0xa0000, a BAR that shares a memory section with RAM):
		 * RAM only where the firmware's map says RAM or reserved.
		 */
		return peermem_pfn_firmware_ram(pfn, true) ? PEERMEM_PFN_OK :
							     PEERMEM_PFN_NOT_RAM;
	}
	/*
	 * Outside the memory map: only System RAM (a "Reserved" range there
	 * may as well be a chipset's MMIO).
	 */
	return peermem_pfn_firmware_ram(pfn, false) ? PEERMEM_PFN_OK : PEERMEM_PFN_NOT_RAM;
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

int peermem_pfn_resolve(u64 start, u64 len, struct peermem_pfn_run **runs,
			u32 *nruns, bool *writable, u32 *why, u64 *where)
{
	struct mm_struct *mm = current->mm;
	struct peermem_pfn_run *r = NULL;
	u64 addr = start, end;
	u32 n = 0, cap = 0;
	int ret = 0;

	*runs = NULL;
	*nruns = 0;
	*writable = true;
	*why = PEERMEM_PFN_OK;
	*where = 0;
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
			*why = peermem_pfn_classify(pfn);
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
		return ret;
	}
	*runs = r;
	*nruns = n;
	return 0;
}

int peermem_pfn_dma_map(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			u32 nruns, bool writable, u64 **dma)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u64 *d;
	u32 i;

	*dma = NULL;
	d = kvmalloc_array(nruns, sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
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
			   u32 nruns, bool writable, u64 *dma)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u32 i;

	for (i = 0; i < nruns; i++)
		dma_unmap_resource(&pdev->dev, dma[i], runs[i].len, dir, 0);
	kvfree(dma);
}
