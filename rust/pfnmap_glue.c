// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of peermem's PFN-map page source (docs/module.md, "PFN-mapped
 * memory"): its two module parameters and one-line wrappers of the static
 * inline functions and macros Rust cannot call (include/peermem_pfnmap.h).
 * Nothing is decided here: the walk, the runs, what memory is served and
 * how a BAR is mapped are Rust (rust/client/source/pfnwalk.rs, over
 * rust/kapi/pfnmap.rs, iomem.rs, pci.rs, dma.rs, kvmem.rs).
 */
#include <linux/module.h>
#include <linux/pci-p2pdma.h>
#include <linux/ratelimit.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>

#include "peermem_ffi.h"

bool peermem_pfnmap_on;
module_param_named(pfnmap, peermem_pfnmap_on, bool, 0444);
MODULE_PARM_DESC(pfnmap,
		 "Serve memory registrations on PFN-mapped memory (mmap of a driver that uses remap_pfn_range: VM_PFNMAP) when it is RAM the kernel does not manage (reserved at boot, PageReserved), revoking the registration through the core when the mapping changes (default N: the driver that exports the memory must zap user mappings before it reuses the memory, see docs/module.md; needs mmu_notifier=Y and enable_invalidate=Y)");

bool peermem_pfnmap_ram_only;
module_param_named(pfnmap_ram_only, peermem_pfnmap_ram_only, bool, 0444);
MODULE_PARM_DESC(pfnmap_ram_only,
		 "With pfnmap=Y, serve reserved RAM only, never a PCI device's memory BAR (default N: a BAR is served when the RDMA device can reach it peer-to-peer, as pci_p2pdma_distance says: both below one PCIe switch with no ACS redirect between them, or a host bridge the kernel knows to route peer-to-peer)");

int peermem_mmap_read_lock_killable(struct mm_struct *mm)
{
	return mmap_read_lock_killable(mm);
}

void peermem_mmap_read_unlock(struct mm_struct *mm)
{
	mmap_read_unlock(mm);
}

unsigned long peermem_vma_flags(const struct vm_area_struct *vma)
{
	return vma->vm_flags;
}

unsigned long peermem_vma_end(const struct vm_area_struct *vma)
{
	return vma->vm_end;
}

bool peermem_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

void peermem_cond_resched(void)
{
	cond_resched();
}

bool peermem_is_zero_pfn(unsigned long pfn)
{
	return is_zero_pfn(pfn);
}

struct page *peermem_pfn_page(unsigned long pfn)
{
	return pfn_valid(pfn) ? pfn_to_page(pfn) : NULL;
}

bool peermem_page_zone_device(struct page *page)
{
	return is_zone_device_page(page);
}

bool peermem_page_reserved(struct page *page)
{
	return PageReserved(page);
}

struct resource *peermem_pci_resource(struct pci_dev *dev, int bar)
{
	return &dev->resource[bar];
}

struct device *peermem_pci_device(struct pci_dev *dev)
{
	return &dev->dev;
}

u16 peermem_pci_acs_cap(const struct pci_dev *dev)
{
	return dev->acs_cap;
}

struct pci_dev *peermem_pci_upstream_bridge(struct pci_dev *dev)
{
	return pci_upstream_bridge(dev);
}

u64 peermem_pci_bus_address(struct pci_dev *dev, int bar)
{
	return pci_bus_address(dev, bar);
}

int peermem_pci_p2pdma_distance(struct pci_dev *provider, struct device *client, bool verbose)
{
	return pci_p2pdma_distance(provider, client, verbose);
}

bool peermem_p2pdma_verbose_ratelimit(void)
{
	static DEFINE_RATELIMIT_STATE(rs, 60 * HZ, 1);

	return __ratelimit(&rs);
}

int peermem_dma_mapping_error(struct device *dev, u64 addr)
{
	return dma_mapping_error(dev, addr);
}

void *peermem_kvmalloc_account(size_t size)
{
	return kvmalloc(size, GFP_KERNEL_ACCOUNT);
}
