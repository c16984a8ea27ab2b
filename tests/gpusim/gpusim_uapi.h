/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * gpusim_uapi.h - the user-space interface of /dev/gpusim, the emulated GPU
 * of the peermem test rig (tests/gpusim, documented in docs/gpusim.md).
 *
 * A process opens /dev/gpusim read-write and allocates "device memory" with
 * GPUSIM_IOC_ALLOC: the driver maps it into the caller's address space and
 * returns its virtual address, 64 KiB aligned, like cudaMalloc() under UVA.
 * The CPU can read and write it; get_user_pages()/pin_user_pages() fail on
 * it (VM_IO | VM_PFNMAP), exactly as on real device memory. Kernel modules
 * reach it through the nvidia_p2p_* functions gpusim exports.
 *
 * Usable from user space (include <linux/types.h> first or let this header
 * do it) and from kernel code.
 */
#ifndef GPUSIM_UAPI_H
#define GPUSIM_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* The emulated GPU page size: every pin is in units of this. */
#define GPUSIM_GPU_PAGE_SIZE 0x10000ULL

/*
 * GPUSIM_IOC_ALLOC
 * @size:        in: bytes, > 0; rounded up to a multiple of 64 KiB.
 * @addr:        in: 0 (gpusim picks a 64 KiB aligned address) or a 64 KiB
 *               aligned address to map at; it must be free (as with
 *               MAP_FIXED_NOREPLACE). out: the virtual address.
 * @handle:      out: names the allocation in GPUSIM_IOC_FREE/INFO.
 * @flags:       in: must be 0.
 * @chunk_bytes: out: size of each physically contiguous piece of the
 *               backing memory (the debugfs knob contig_bytes at the time
 *               of the call, capped to the allocation).
 *
 * Errors: EINVAL (size 0, flags, misaligned addr), ENOMEM (size above the
 * max_alloc_bytes knob, or out of memory), EEXIST (addr already mapped),
 * EFAULT (bad argument pointer), EACCES (file not opened read-write).
 */
struct gpusim_alloc {
	__u64 size;
	__u64 addr;
	__u64 handle;
	__u32 flags;
	__u32 chunk_bytes;
};

/*
 * GPUSIM_IOC_FREE: free an allocation of this open file. Every
 * non-persistent page table pinning it gets its free_callback first and
 * gpusim waits for the callbacks to return. The memory itself is returned
 * once nothing else holds it: persistent pins and the CPU mapping keep it
 * (the mapping stays readable until munmap). Errors: ENOENT (no such live
 * allocation on this file), EFAULT.
 */
struct gpusim_free {
	__u64 handle;
};

/*
 * GPUSIM_IOC_INFO: describe a live allocation of this open file.
 * @addr: out: its current virtual address, or 0 once it was munmap()ed.
 * @pins: out: page tables currently pinning it (persistent ones included).
 * Errors: ENOENT, EFAULT.
 */
struct gpusim_info {
	__u64 handle;
	__u64 addr;
	__u64 size;
	__u32 chunk_bytes;
	__u32 pins;
};

#define GPUSIM_IOC_MAGIC 'G'
#define GPUSIM_IOC_ALLOC _IOWR(GPUSIM_IOC_MAGIC, 0x01, struct gpusim_alloc)
#define GPUSIM_IOC_FREE  _IOW(GPUSIM_IOC_MAGIC, 0x02, struct gpusim_free)
#define GPUSIM_IOC_INFO  _IOWR(GPUSIM_IOC_MAGIC, 0x03, struct gpusim_info)

#endif /* GPUSIM_UAPI_H */
