// SPDX-License-Identifier: GPL-2.0
/*
 * gpusim_glue.c - the part of gpusim that Rust cannot express portably.
 *
 * - EXPORT_SYMBOL_GPL of the nvidia_p2p_* functions, which are defined in
 *   Rust (#[no_mangle] extern "C", gpusim_main.rs / p2p.rs);
 * - the module parameter branch= (the Rust module! parameters of the rig
 *   kernel have no sysfs file; branch.rs validates it);
 * - compile-time checks that the Rust structure layouts (abi.rs) equal the
 *   declarations of include/nv_p2p_abi.h;
 * - the vm_operations_struct of a device-memory mapping and the
 *   remap_pfn_range() that installs it;
 * - mapping an allocation into the caller's address space at a 64 KiB
 *   aligned address;
 * - /dev/gpusim_mmap, whose file operations forward to Rust (dev.rs) but
 *   for the 64 KiB aligned address of an mmap, which the kernel crate's
 *   misc device cannot choose;
 * - the static-inline DMA and page helpers.
 *
 * Everything here is small and stateless; the state lives in Rust.
 */
#include <linux/build_bug.h>
#include <linux/dma-mapping.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/mman.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/stddef.h>

#include "../../include/nv_p2p_abi.h"
#include "gpusim_glue.h"

#define GPUSIM_GPU_PAGE (64UL * 1024)

/* ---- Exports: the 550-series nvidia.ko P2P interface, all GPL-only. */

EXPORT_SYMBOL_GPL(nvidia_p2p_init_mapping);
EXPORT_SYMBOL_GPL(nvidia_p2p_destroy_mapping);
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages_persistent);
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages_persistent);
EXPORT_SYMBOL_GPL(nvidia_p2p_free_page_table);
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_map_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_unmap_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_free_dma_mapping);
EXPORT_SYMBOL_GPL(nvidia_p2p_register_rsync_driver);
EXPORT_SYMBOL_GPL(nvidia_p2p_unregister_rsync_driver);
EXPORT_SYMBOL_GPL(nvidia_p2p_get_rsync_registers);
EXPORT_SYMBOL_GPL(nvidia_p2p_put_rsync_registers);

/*
 * branch=: the NVIDIA driver branch gpusim emulates (550, 570, 580 or
 * 595). Read once by branch.rs at load, which refuses other values.
 */
static unsigned int branch = 595;
module_param(branch, uint, 0444);
MODULE_PARM_DESC(branch, "NVIDIA driver branch to emulate: 550, 570, 580 or 595 (default, the newest); see docs/gpusim.md");

unsigned int gpusim_branch_param(void)
{
	return branch;
}

/*
 * The Rust side (abi.rs) declares the same structures by hand and asserts
 * the same numbers; a mismatch between either side and the header stops
 * the build here.
 */
static_assert(sizeof(struct nvidia_p2p_page) == 32);
static_assert(offsetof(struct nvidia_p2p_page, physical_address) == 0);
static_assert(offsetof(struct nvidia_p2p_page, registers) == 8);
static_assert(sizeof(struct nvidia_p2p_page_table) == 32);
static_assert(offsetof(struct nvidia_p2p_page_table, version) == 0);
static_assert(offsetof(struct nvidia_p2p_page_table, page_size) == 4);
static_assert(offsetof(struct nvidia_p2p_page_table, pages) == 8);
static_assert(offsetof(struct nvidia_p2p_page_table, entries) == 16);
static_assert(offsetof(struct nvidia_p2p_page_table, gpu_uuid) == 24);
static_assert(sizeof(struct nvidia_p2p_dma_mapping) == 40);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, version) == 0);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, page_size_type) == 4);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, entries) == 8);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, dma_addresses) == 16);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, private) == 24);
static_assert(offsetof(struct nvidia_p2p_dma_mapping, pci_dev) == 32);
static_assert(sizeof(enum nvidia_p2p_page_size_type) == 4);
static_assert(sizeof(struct nvidia_p2p_rsync_driver) == 32);
static_assert(offsetof(struct nvidia_p2p_rsync_driver, get_relaxed_ordering_mode) == 8);
static_assert(offsetof(struct nvidia_p2p_rsync_driver, put_relaxed_ordering_mode) == 16);
static_assert(offsetof(struct nvidia_p2p_rsync_driver, wait_for_rsync) == 24);
static_assert(sizeof(struct nvidia_p2p_rsync_reg_info) == 24);
static_assert(NVIDIA_P2P_PAGE_TABLE_VERSION == 0x00010002);
static_assert(NVIDIA_P2P_DMA_MAPPING_VERSION == 0x00020003);
static_assert(NVIDIA_P2P_RSYNC_DRIVER_VERSION == 0x00010001);
static_assert(NVIDIA_P2P_PAGE_SIZE_64KB == 1);

/*
 * The version-2.0 page table of the 580+ drivers (abi.rs
 * NvP2pPageTableV2): include/nv_p2p_abi.h does not declare it yet, so it
 * is checked here as what it is, the version-1.2 table followed by a u32.
 */
struct gpusim_p2p_page_table_v2 {
	struct nvidia_p2p_page_table v1;
	u32 flags;
};
static_assert(sizeof(struct gpusim_p2p_page_table_v2) == 40);
static_assert(offsetof(struct gpusim_p2p_page_table_v2, flags) == 32);

/* ---- The mapping's life: vm_operations calling into Rust (dev.rs). */

static void gpusim_vm_open(struct vm_area_struct *vma)
{
	gpusim_rs_vma_open(vma->vm_private_data);
}

static void gpusim_vm_close(struct vm_area_struct *vma)
{
	gpusim_rs_vma_close(vma->vm_private_data, vma);
}

/* One allocation, one mapping: refuse partial munmap/mprotect/mremap. */
static int gpusim_vm_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

/* mremap() moved the whole mapping: the allocation follows it. */
static int gpusim_vm_mremap(struct vm_area_struct *vma)
{
	gpusim_rs_vma_moved(vma->vm_private_data, vma, vma->vm_start);
	return 0;
}

static const struct vm_operations_struct gpusim_vm_ops = {
	.open = gpusim_vm_open,
	.close = gpusim_vm_close,
	.may_split = gpusim_vm_may_split,
	.mremap = gpusim_vm_mremap,
};

/*
 * Map @nchunks physically contiguous chunks of @chunk_bytes (the last one
 * may be shorter: @size is the total) into @vma, which is being mmap()ed
 * and spans exactly @size bytes. On success the vma carries @priv and the
 * gpusim vm_ops (so close() will see @priv); on failure neither is set and
 * mmap() fails, which unmaps whatever was installed.
 */
int gpusim_vma_install(struct vm_area_struct *vma, void *priv,
		       const u64 *chunk_phys, size_t nchunks,
		       size_t chunk_bytes, size_t size)
{
	size_t i, off = 0;
	int ret;

	if (vma->vm_end - vma->vm_start != size)
		return -EINVAL;

	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP |
			  VM_DONTCOPY);
	for (i = 0; i < nchunks && off < size; i++) {
		size_t len = min(chunk_bytes, size - off);

		ret = remap_pfn_range(vma, vma->vm_start + off,
				      PHYS_PFN(chunk_phys[i]), len,
				      vma->vm_page_prot);
		if (ret)
			return ret;
		off += len;
	}
	if (off != size)
		return -EINVAL;
	vma->vm_private_data = priv;
	vma->vm_ops = &gpusim_vm_ops;
	return 0;
}

/*
 * Map @size bytes of @file at file offset @pgoff pages into current's
 * address space: at @hint if non-zero (it must be free), otherwise at a
 * 64 KiB aligned address found by reserving @size + 64 KiB and mapping
 * inside it. Returns the address, or a negative errno (IS_ERR_VALUE).
 * Must be called without any gpusim lock held: the mmap handler takes them.
 */
unsigned long gpusim_map_user(struct file *file, unsigned long hint,
			      unsigned long size, unsigned long pgoff)
{
	unsigned long resv, addr, ret, resv_len;

	if (pgoff > (ULONG_MAX >> PAGE_SHIFT))
		return -EINVAL;
	if (hint)
		return vm_mmap(file, hint, size, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_FIXED_NOREPLACE,
			       pgoff << PAGE_SHIFT);

	if (size > ULONG_MAX - GPUSIM_GPU_PAGE)
		return -ENOMEM;
	resv_len = size + GPUSIM_GPU_PAGE;
	resv = vm_mmap(NULL, 0, resv_len, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, 0);
	if (IS_ERR_VALUE(resv))
		return resv;
	addr = ALIGN(resv, GPUSIM_GPU_PAGE);
	ret = vm_mmap(file, addr, size, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_FIXED, pgoff << PAGE_SHIFT);
	if (IS_ERR_VALUE(ret)) {
		vm_munmap(resv, resv_len);
		return ret;
	}
	if (addr > resv)
		vm_munmap(resv, addr - resv);
	if (resv + resv_len > addr + size)
		vm_munmap(addr + size, resv + resv_len - (addr + size));
	return addr;
}

/*
 * ---- /dev/gpusim_mmap: each mmap() of it allocates emulated GPU memory of
 * the mapping's length (dev.rs, `gpusim_rs_mmapdev_mmap`), for programs
 * that can only map a file (perftest's --mmap). Its file id lives in
 * private_data.
 */
static int gpusim_mmapdev_open(struct inode *inode, struct file *file)
{
	file->private_data = (void *)(uintptr_t)gpusim_rs_mmapdev_open();
	return 0;
}

static int gpusim_mmapdev_release(struct inode *inode, struct file *file)
{
	gpusim_rs_mmapdev_release((u64)(uintptr_t)file->private_data);
	return 0;
}

static int gpusim_mmapdev_mmap(struct file *file, struct vm_area_struct *vma)
{
	return gpusim_rs_mmapdev_mmap((u64)(uintptr_t)file->private_data, vma);
}

/* A 64 KiB aligned address, as the GPU driver maps device memory. */
static unsigned long gpusim_mmapdev_area(struct file *file, unsigned long addr,
					 unsigned long len, unsigned long pgoff,
					 unsigned long flags)
{
	unsigned long a;

	if (flags & MAP_FIXED)
		return IS_ALIGNED(addr, GPUSIM_GPU_PAGE) ? addr : -EINVAL;
	if (len > ULONG_MAX - GPUSIM_GPU_PAGE)
		return -ENOMEM;
	a = mm_get_unmapped_area(NULL, 0, len + GPUSIM_GPU_PAGE, 0, flags);
	return IS_ERR_VALUE(a) ? a : ALIGN(a, GPUSIM_GPU_PAGE);
}

static const struct file_operations gpusim_mmapdev_fops = {
	.owner = THIS_MODULE,
	.open = gpusim_mmapdev_open,
	.release = gpusim_mmapdev_release,
	.mmap = gpusim_mmapdev_mmap,
	.get_unmapped_area = gpusim_mmapdev_area,
};

static struct miscdevice gpusim_mmapdev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpusim_mmap",
	.fops = &gpusim_mmapdev_fops,
	.mode = 0666,
};

int gpusim_mmapdev_register(void)
{
	return misc_register(&gpusim_mmapdev);
}

void gpusim_mmapdev_deregister(void)
{
	misc_deregister(&gpusim_mmapdev);
}

/* Largest physically contiguous chunk the page allocator hands out. */
size_t gpusim_max_chunk_bytes(void)
{
	return PAGE_SIZE << MAX_PAGE_ORDER;
}

/*
 * One physically contiguous, zeroed chunk of @bytes (a multiple of 64 KiB,
 * at most gpusim_max_chunk_bytes()). Returns its kernel address or NULL;
 * *phys receives its physical address.
 */
void *gpusim_chunk_alloc(size_t bytes, u64 *phys)
{
	void *p;

	if (!bytes || bytes > gpusim_max_chunk_bytes())
		return NULL;
	p = alloc_pages_exact(bytes, GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN |
					     __GFP_RETRY_MAYFAIL);
	if (p)
		*phys = virt_to_phys(p);
	return p;
}

void gpusim_chunk_free(void *virt, size_t bytes)
{
	free_pages_exact(virt, bytes);
}

/* Kernel address of host physical address @phys (gpusim memory is RAM). */
void *gpusim_phys_to_virt(u64 phys)
{
	return phys_to_virt(phys);
}

/*
 * Whether @pdev is a PCI device of this system that can do streaming DMA
 * (has a non-zero DMA mask). @pdev may be any pointer value: NULL, what
 * to_pci_dev(NULL) yields, a stale or made-up pointer. It is compared by
 * address with every device on the PCI bus, and dereferenced only if it
 * is one of them (for_each_pci_dev() holds a reference on the device it
 * is looking at, so the match stays valid while its DMA mask is read).
 */
bool gpusim_pci_dma_peer_ok(struct pci_dev *pdev)
{
	struct pci_dev *d = NULL;
	bool ok;

	if (!pdev)
		return false;
	for_each_pci_dev(d) {
		if (d != pdev)
			continue;
		ok = d->dev.dma_mask && *d->dev.dma_mask;
		pci_dev_put(d);
		return ok;
	}
	return false;
}

/*
 * Streaming-DMA map @len bytes of host RAM at @phys for @pdev through the
 * DMA API (so CONFIG_DMA_API_DEBUG tracks the mapping). 0 or -EIO.
 */
int gpusim_dma_map(struct pci_dev *pdev, u64 phys, size_t len, u64 *dma)
{
	dma_addr_t a;

	a = dma_map_page_attrs(&pdev->dev, pfn_to_page(PHYS_PFN(phys)),
			       offset_in_page(phys), len, DMA_BIDIRECTIONAL, 0);
	if (dma_mapping_error(&pdev->dev, a))
		return -EIO;
	*dma = a;
	return 0;
}

void gpusim_dma_unmap(struct pci_dev *pdev, u64 dma, size_t len)
{
	dma_unmap_page_attrs(&pdev->dev, dma, len, DMA_BIDIRECTIONAL, 0);
}

/*
 * The calling task's address space, with a reference (mmgrab) that keeps
 * the mm_struct (not its mappings) alive, or NULL for a kernel thread.
 * Read here in C: the Rust kernel crate's task_struct layout on the rig's
 * debug kernel put current()->mm at another offset (each thread of a
 * process saw a different "mm", a pointer into its own task_struct).
 */
struct mm_struct *gpusim_mm_get_current(void)
{
	struct mm_struct *mm = current->mm;

	if (mm)
		mmgrab(mm);
	return mm;
}

void gpusim_mm_put(struct mm_struct *mm)
{
	mmdrop(mm);
}

/*
 * The calling thread's thread group id, NVIDIA's identity of the calling
 * process (os_get_current_process() in kernel-open/nvidia/os-interface.c
 * returns current->tgid); a kernel thread is a process of its own.
 */
int gpusim_current_tgid(void)
{
	return current->tgid;
}

/* Identity of the calling task's address space (0 for a kernel thread). */
unsigned long gpusim_current_mm_id(void)
{
	return (unsigned long)current->mm;
}
