/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_pfnmap.h - the C glue of peermem's PFN-map page source
 * (rust/pfnmap_glue.c; docs/module.md, "PFN-mapped memory"). Included by
 * peermem_ffi.h, so scripts/bindgen.sh generates its Rust side.
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_PFNMAP_H
#define PEERMEM_INCLUDE_PEERMEM_PFNMAP_H

#include <linux/types.h>

/* The pfnmap module parameter (serve PFN-mapped memory; default N). */
bool peermem_param_pfnmap(void);

/* A run of physically contiguous bytes, page aligned. */
struct peermem_pfn_run {
	u64 phys;
	u64 len;
};

/* Why peermem_pfn_resolve() refused a range (0: it did not). */
enum peermem_pfn_refusal {
	PEERMEM_PFN_OK = 0,
	PEERMEM_PFN_NO_VMA,		/* an address with no mapping */
	PEERMEM_PFN_NOT_PFNMAP,		/* a mapping without VM_PFNMAP */
	PEERMEM_PFN_PRIVATE,		/* a copy-on-write (private, writable) mapping */
	PEERMEM_PFN_NOT_PRESENT,	/* no page-table entry (not faulted in) */
	PEERMEM_PFN_MANAGED_RAM,	/* RAM the page allocator manages */
	PEERMEM_PFN_NOT_RAM,		/* device memory (no P2P path, see the docs) */
	PEERMEM_PFN_ZERO_PAGE,		/* the shared zero page */
};

/*
 * Under the calling process's mmap lock (read), check that every page of
 * [start, start + len) (page aligned, len > 0) is mapped by a VM_PFNMAP
 * mapping that is not copy-on-write and read its PFN with follow_pfnmap_start/end; every
 * PFN must be RAM the kernel does not manage (PageReserved, or outside the
 * memory map but System RAM in the resource tree). On success *runs is an
 * array of *nruns runs in address order (free with peermem_pfn_free()) and
 * *writable says whether every page is mapped writable (VMA and PTE).
 * A refused range returns 0 with *runs NULL, *why and *where (the first
 * address refused) set. Errors: -EINVAL (no user address space, bad
 * range), -ENOMEM, -EINTR (fatal signal while waiting for the mmap lock).
 */
int peermem_pfn_resolve(u64 start, u64 len, struct peermem_pfn_run **runs,
			u32 *nruns, bool *writable, u32 *why, u64 *where);

/* Free an array from peermem_pfn_resolve() or peermem_pfn_dma_map(). */
void peermem_pfn_free(void *p);

/*
 * Map each run for pdev's DMA (dma_map_resource, one call per run;
 * DMA_BIDIRECTIONAL if writable, else DMA_TO_DEVICE): *dma is an array of
 * nruns bus addresses, one per run. writable: the device may write. 0, -ENOMEM, or -EIO if a run could not
 * be mapped (nothing is left mapped then).
 */
int peermem_pfn_dma_map(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			u32 nruns, bool writable, u64 **dma);

/* Undo peermem_pfn_dma_map() (same arguments) and free dma. */
void peermem_pfn_dma_unmap(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			   u32 nruns, bool writable, u64 *dma);

#endif /* PEERMEM_INCLUDE_PEERMEM_PFNMAP_H */
