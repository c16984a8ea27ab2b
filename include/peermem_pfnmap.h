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

struct pci_dev;

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
	PEERMEM_PFN_BAR_RAM_ONLY,	/* a PCI BAR, and pfnmap_ram_only=Y */
	PEERMEM_PFN_MIXED,		/* RAM and a BAR, or two BARs, in one range */
};

/*
 * What one peermem_pfn_resolve() call did, for the counters of the PFN-map
 * source (/sys/kernel/debug/peermem/pfn/walk_*) and its test knob.
 */
struct peermem_pfn_walk {
	u32 delay_ms;	/* in: test knob, sleep this long every PEERMEM_PFN_WALK_BATCH pages */
	bool probe;	/* in: check every mapping of the range, but read its first page only */
	u64 pages;	/* out: pages read (follow_pfnmap_start/end) */
	u64 lookups;	/* out: lookups in the firmware's resource map (/proc/iomem) */
	bool killed;	/* out: stopped for a fatal signal (-EINTR) */
	bool over_limit;	/* out: more than PEERMEM_PFN_MAX_RUNS runs (-ENOMEM) */
};

/* Pages between two sleeps of the test knob (16 MiB). */
#define PEERMEM_PFN_WALK_BATCH 4096

/*
 * The most runs one range may have: the array is at most 4 MiB
 * (docs/module.md, "PFN-mapped memory", Limits), e.g. 1 GiB of pages no
 * two of which are physically contiguous.
 */
#define PEERMEM_PFN_MAX_RUNS 262144

/* How peermem_pfn_dma_map() mapped the runs of a PCI BAR for the device. */
enum peermem_p2p_how {
	PEERMEM_P2P_RESOURCE = 0,	/* dma_map_resource (RAM; a BAR through the host bridge) */
	PEERMEM_P2P_BUS_ADDR,		/* the BAR's bus addresses, through a common switch */
};

/*
 * Under the calling process's mmap lock (read), check that every page of
 * [start, start + len) (page aligned, len > 0) is mapped by a VM_PFNMAP
 * mapping that is not copy-on-write and read its PFN with
 * follow_pfnmap_start/end (with walk->probe: the mappings, and the first
 * page only). Pages whose PFNs follow each other form runs, each
 * classified once. Every PFN must be RAM the kernel does not manage
 * (PageReserved, or outside the memory map but System RAM in the resource
 * tree), or, unless pfnmap_ram_only=Y, every PFN must lie in one memory BAR
 * of one PCI device: then *bar_dev is that device, with a reference (drop it
 * with peermem_pfn_put_dev()), and *bar the BAR's index; for RAM *bar_dev is
 * NULL. On success *runs is an array of *nruns runs in address order (free
 * with peermem_pfn_free()) and *writable says whether every page is mapped
 * writable (VMA and PTE). A refused range returns 0 with *runs and
 * *bar_dev NULL, *why and *where (the first address refused) set. Errors:
 * -EINVAL (no user address space, bad range), -ENOMEM (also: more than
 * PEERMEM_PFN_MAX_RUNS runs, walk->over_limit), -EINTR (a fatal signal,
 * while waiting for the mmap lock or during the walk: walk->killed). The
 * walk yields between pages (cond_resched). *walk says what it did.
 */
int peermem_pfn_resolve(u64 start, u64 len, struct peermem_pfn_walk *walk,
			struct peermem_pfn_run **runs,
			u32 *nruns, bool *writable, u32 *why, u64 *where,
			struct pci_dev **bar_dev, int *bar);

/* Drop the reference peermem_pfn_resolve() took on a BAR's device. */
void peermem_pfn_put_dev(struct pci_dev *dev);

/* Free an array from peermem_pfn_resolve() or peermem_pfn_dma_map(). */
void peermem_pfn_free(void *p);

/*
 * Map each run for pdev's DMA: *dma is an array of nruns bus addresses, one
 * per run. RAM (bar_dev NULL) is mapped with dma_map_resource
 * (DMA_BIDIRECTIONAL if writable, else DMA_TO_DEVICE). A BAR of bar_dev
 * (index bar) only if pci_p2pdma_distance() says pdev can reach it
 * peer-to-peer: through a switch both sit below, with no port between them
 * redirecting peer requests upstream (ACS), by the BAR's bus addresses
 * (*how PEERMEM_P2P_BUS_ADDR, nothing mapped); through a host bridge the
 * kernel knows to route peer-to-peer, with dma_map_resource (*how
 * PEERMEM_P2P_RESOURCE). Returns 0, -ENOMEM, -EIO if a run could not be
 * mapped, or -EOPNOTSUPP if pdev cannot reach the BAR peer-to-peer (the
 * kernel then logs why, rate-limited); nothing is left mapped on error.
 */
int peermem_pfn_dma_map(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			u32 nruns, bool writable, struct pci_dev *bar_dev, int bar,
			u64 **dma, u32 *how);

/* Undo peermem_pfn_dma_map() (same arguments, its *how) and free dma. */
void peermem_pfn_dma_unmap(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			   u32 nruns, bool writable, u32 how, u64 *dma);

#endif /* PEERMEM_INCLUDE_PEERMEM_PFNMAP_H */
