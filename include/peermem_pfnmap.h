/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_pfnmap.h - what the Rust side of peermem's PFN-map page source
 * (docs/module.md, "PFN-mapped memory") calls in C. Included by
 * peermem_ffi.h, so scripts/bindgen.sh generates its Rust side.
 *
 * Exported kernel functions are called from Rust directly (the
 * bindgen-kernel lines below), wrapped in rust/kapi/ (pfnmap.rs: the walk
 * of a range's page tables; iomem.rs: the firmware's memory map; pci.rs:
 * PCI devices, their BARs, peer-to-peer reach; dma.rs: dma_map_resource;
 * kvmem.rs: accounted arrays). rust/pfnmap_glue.c holds the two module
 * parameters and one-line wrappers of static inline functions and macros.
 * Every decision (the walk, runs, what memory is served, how a BAR is
 * mapped) is in rust/client/source/pfnwalk.rs.
 *
 * bindgen-kernel: fn follow_pfnmap_start follow_pfnmap_end find_vma_intersection
 * bindgen-kernel: fn walk_iomem_res_desc pci_get_device pci_dev_put pci_read_config_word
 * bindgen-kernel: fn dma_map_resource dma_unmap_resource kvfree
 * bindgen-kernel: type follow_pfnmap_args dma_data_direction
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_PFNMAP_H
#define PEERMEM_INCLUDE_PEERMEM_PFNMAP_H

#include <linux/dma-mapping.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/types.h>

/* The pfnmap and pfnmap_ram_only module parameters (read-only once loaded). */
extern bool peermem_pfnmap_on;
extern bool peermem_pfnmap_ram_only;

/* Kernel constants that are macros bindgen cannot evaluate, as values. */
enum peermem_pfn_const {
	PEERMEM_VM_WRITE = VM_WRITE,
	PEERMEM_VM_SHARED = VM_SHARED,
	PEERMEM_VM_MAYWRITE = VM_MAYWRITE,
	PEERMEM_VM_PFNMAP = VM_PFNMAP,
	PEERMEM_IORESOURCE_MEM = IORESOURCE_MEM,
	PEERMEM_IORESOURCE_SYSTEM_RAM = IORESOURCE_SYSTEM_RAM,
	PEERMEM_IORES_DESC_NONE = IORES_DESC_NONE,
	PEERMEM_IORES_DESC_RESERVED = IORES_DESC_RESERVED,
	PEERMEM_PCI_STD_NUM_BARS = PCI_STD_NUM_BARS,
	PEERMEM_PCI_ACS_CTRL = PCI_ACS_CTRL,
	PEERMEM_PCI_ACS_REDIRECT = PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC,
};

/* current->mm: peermem_current_mm() (peermem_ffi.h). */
/* mmap_read_lock_killable(), mmap_read_unlock(). */
int peermem_mmap_read_lock_killable(struct mm_struct *mm);
void peermem_mmap_read_unlock(struct mm_struct *mm);
/* vma->vm_flags, vma->vm_end. */
unsigned long peermem_vma_flags(const struct vm_area_struct *vma);
unsigned long peermem_vma_end(const struct vm_area_struct *vma);
/* fatal_signal_pending(current), cond_resched(). */
bool peermem_fatal_signal_pending(void);
void peermem_cond_resched(void);
/* is_zero_pfn(); pfn_to_page() if pfn_valid(), else NULL. */
bool peermem_is_zero_pfn(unsigned long pfn);
struct page *peermem_pfn_page(unsigned long pfn);
/* is_zone_device_page(), PageReserved(). */
bool peermem_page_zone_device(struct page *page);
bool peermem_page_reserved(struct page *page);
/* &dev->resource[bar], &dev->dev, dev->acs_cap (6.12's kernel crate has no pci_dev layout). */
struct resource *peermem_pci_resource(struct pci_dev *dev, int bar);
struct device *peermem_pci_device(struct pci_dev *dev);
u16 peermem_pci_acs_cap(const struct pci_dev *dev);
/* pci_upstream_bridge(), pci_bus_address(), pci_p2pdma_distance(). */
struct pci_dev *peermem_pci_upstream_bridge(struct pci_dev *dev);
u64 peermem_pci_bus_address(struct pci_dev *dev, int bar);
int peermem_pci_p2pdma_distance(struct pci_dev *provider, struct device *client, bool verbose);
/* __ratelimit() of the verbose pci_p2pdma_distance() (once a minute). */
bool peermem_p2pdma_verbose_ratelimit(void);
/* dma_mapping_error() (DMA-API debug wants it called). */
int peermem_dma_mapping_error(struct device *dev, u64 addr);
/* kvmalloc(size, GFP_KERNEL_ACCOUNT): the caller's memory cgroup pays. */
void *peermem_kvmalloc_account(size_t size);

#endif /* PEERMEM_INCLUDE_PEERMEM_PFNMAP_H */
