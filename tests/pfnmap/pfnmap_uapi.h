/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pfnmap_uapi.h - the interface of tests/pfnmap/pfnmap_exporter.ko, the
 * rig's stand-in for a data-acquisition driver that exports a reserved RAM
 * ring to user space with remap_pfn_range() (docs/testing.md).
 *
 * /dev/pfnmap_exporter holds one buffer at a time (the module is a test
 * fixture: one test uses it at a time). mmap() of the device at offset 0
 * maps the whole buffer, or its beginning for a shorter length (VM_IO | VM_PFNMAP, shared or private, read-only
 * if the file was opened O_RDONLY or PROT_READ is asked).
 */
#ifndef PFNMAP_UAPI_H
#define PFNMAP_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define PFNMAP_DEV "/dev/pfnmap_exporter"

/* PFNMAP_IOC_ALLOC flags */
/*
 * Reserved RAM: every page is marked PageReserved, the stand-in for RAM
 * reserved at boot (memmap=, a reserved-memory region) that the page
 * allocator does not manage. Without the flag the pages are ordinary
 * kernel pages, which a correct client must refuse.
 */
#define PFNMAP_RESERVED 0x1

struct pfnmap_alloc {
	__u64 len;	/* in: bytes, a multiple of 4 KiB, at most 1 GiB */
	__u32 flags;	/* in: PFNMAP_RESERVED */
	__u32 chunks;	/* out: physically contiguous pieces (4 MiB each at most) */
};

/* Copy between the exporter's CPU view of a buffer and user memory (64 MiB at most). */
struct pfnmap_rw {
	__u64 off;	/* byte offset in the buffer */
	__u64 len;
	__u64 uaddr;	/* user buffer */
	__u32 old;	/* 1: the buffer PFNMAP_IOC_REALLOC retired */
	__u32 pad;
};

struct pfnmap_info {
	__u64 len;		/* current buffer; 0 if none */
	__u64 old_len;		/* retired buffer; 0 if none */
	__u64 first_phys;	/* physical address of the current buffer's first byte */
	__u32 chunks;
	__u32 zaps;		/* unmap_mapping_range() calls so far */
};

/*
 * A physical window that is not the exporter's buffer, as a driver maps its
 * device's BAR (io_remap_pfn_range, uncached): PFNMAP_IOC_WINDOW sets it,
 * mmap() at offset PFNMAP_WINDOW_OFFSET maps it (length = the window's).
 * Root only. Nothing of it is read or written by the exporter; it exists so
 * tests can offer device memory and firmware holes to a PFN-map client.
 */
struct pfnmap_window {
	__u64 phys;	/* page aligned */
	__u64 len;	/* a multiple of 4 KiB, at most 64 MiB */
};
#define PFNMAP_WINDOW_OFFSET (1ULL << 32)

/*
 * Aliases of the current buffer, for tests of large ranges with little
 * memory (a 2 GiB rig guest has no 1 GiB ring to spare): mmap() at
 * PFNMAP_REPEAT_OFFSET maps the buffer over and over (the mapping's length
 * a multiple of 4 KiB, at most PFNMAP_ALIAS_MAX): one physical run per
 * contiguous piece of each repetition. At PFNMAP_SCATTER_OFFSET, page i of
 * the mapping is the buffer's page 2 * (i % 2) (the buffer must have 3
 * pages): no two neighbouring pages physically contiguous, one run per
 * page. Shared mappings only.
 */
#define PFNMAP_REPEAT_OFFSET (2ULL << 32)
#define PFNMAP_SCATTER_OFFSET (3ULL << 32)
#define PFNMAP_ALIAS_MAX (4ULL << 30)

/* Allocate the buffer (EBUSY if one exists: free it first). */
#define PFNMAP_IOC_ALLOC	_IOWR('P', 1, struct pfnmap_alloc)
/*
 * "Reallocate", as a driver does on a reconfiguration: zap every user
 * mapping of the device (unmap_mapping_range), then move to a new buffer of
 * the same size and flags, filled with 0x5a. The old buffer is retired, not
 * freed, so a test can check that nothing wrote to it afterwards; a second
 * realloc or PFNMAP_IOC_FREE frees it.
 */
#define PFNMAP_IOC_REALLOC	_IO('P', 2)
/* Zap every user mapping only (unmap_mapping_range), keep the buffer. */
#define PFNMAP_IOC_ZAP		_IO('P', 3)
/* Zap, then free the current and the retired buffer. */
#define PFNMAP_IOC_FREE		_IO('P', 4)
#define PFNMAP_IOC_READ		_IOW('P', 5, struct pfnmap_rw)
#define PFNMAP_IOC_WRITE	_IOW('P', 6, struct pfnmap_rw)
#define PFNMAP_IOC_INFO		_IOR('P', 7, struct pfnmap_info)
#define PFNMAP_IOC_WINDOW	_IOW('P', 8, struct pfnmap_window)

/*
 * Occupy workers of the kernel's default unbound worker pool (the pool of
 * every WQ_UNBOUND work queue with default attributes, peermem's too):
 * each hog is a work item on an unbound queue without a rescuer that
 * sleeps until released, so it holds one worker. With the pool unable to
 * make new workers (no free PID), a queued item then waits for a worker,
 * and only a queue with a rescuer (WQ_MEM_RECLAIM) makes progress.
 * Root only; at most PFNMAP_HOG_MAX hogs at a time.
 */
#define PFNMAP_HOG_MAX 256
struct pfnmap_hog {
	__u32 add;	/* in: hogs to queue now */
	__u32 release;	/* in: 1: release every hog and wait until they are gone (first) */
	__u32 running;	/* out: hogs sleeping in a worker */
	__u32 queued;	/* out: hogs queued and not yet released */
};
#define PFNMAP_IOC_HOG		_IOWR('P', 9, struct pfnmap_hog)

#endif /* PFNMAP_UAPI_H */
