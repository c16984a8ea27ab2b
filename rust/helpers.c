// SPDX-License-Identifier: GPL-2.0
/*
 * What Rust cannot express on every kernel peermem builds on (6.12-7.3):
 * module metadata, parameter definitions (read by rust/kapi/module_param.rs)
 * and one-line wrappers of static inlines and macros. Every decision and
 * object is Rust's, over bindgen's bindings (include/peermem_ffi.h).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/debugfs.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/scatterlist.h>
#include <linux/wait_bit.h>
#include <linux/workqueue.h>
#include <linux/compat.h>
#include <asm/syscall.h>
#include <asm/unistd.h>

#include "peermem_ffi.h"

MODULE_VERSION(PEERMEM_VERSION);
MODULE_INFO(build, PEERMEM_BUILD);
const char peermem_build[PEERMEM_BUILD_LEN] = PEERMEM_BUILD;
MODULE_AUTHOR("The peermem authors");

/* ---- Module parameters */

/*
 * nv_mem and nv_mem_nc: the names nvidia-peermem registers its two clients
 * under (NCCL looks for /sys/kernel/mm/memory_peers/nv_mem/version where
 * the core has that directory).
 */
char peermem_peer_name[IB_PEER_MEMORY_NAME_MAX] = "nv_mem";
module_param_string(peer_name, peermem_peer_name, sizeof(peermem_peer_name), 0444);
MODULE_PARM_DESC(peer_name,
		 "Name of the invalidating client; the non-invalidating one is this name followed by _nc. 1-63 characters of A-Z a-z 0-9 _ . - (at most 60 with enable_nc=Y). Default \"nv_mem\" (and \"nv_mem_nc\"), the names of nvidia-peermem's clients");

bool peermem_enable_invalidate = true;
module_param_named(enable_invalidate, peermem_enable_invalidate, bool, 0444);
MODULE_PARM_DESC(enable_invalidate,
		 "Register the invalidating client (peer_name), which the core asks first for memory registrations, so that freeing GPU memory revokes RDMA access to it (default Y). N: leave it out; memory registrations on GPU memory then go to the non-invalidating client, pinned persistently: freed GPU memory stays allocated until they are gone");

bool peermem_enable_nc = true;
module_param_named(enable_nc, peermem_enable_nc, bool, 0444);
MODULE_PARM_DESC(enable_nc,
		 "Register the non-invalidating client (peer_name followed by _nc), which pins persistently and is the only client the core asks for memory it cannot invalidate: queue buffers and doorbell pages of the RDMA driver (default Y). N: leave it out; those then cannot be in GPU memory");

bool peermem_mmu_notifier = true;
module_param_named(mmu_notifier, peermem_mmu_notifier, bool, 0444);
MODULE_PARM_DESC(mmu_notifier,
		 "Revoke a registration when the registering process unmaps or moves its address range (munmap, mremap), through an mmu interval notifier, as with freed GPU memory (default Y; only with enable_invalidate=Y). N: a registration keeps serving the GPU memory it pinned whatever the address means afterwards, as nvidia-peermem does");

/* nvidia-peermem's parameters, accepted and checked (rust/client/params.rs). */
int peermem_peerdirect_support;
module_param_named(peerdirect_support, peermem_peerdirect_support, int, 0444);
MODULE_PARM_DESC(peerdirect_support,
		 "nvidia-peermem's: 0 (default) registers the invalidating client as an extended client with PEER_MEM_INVALIDATE_UNMAPS, as peermem always does; 1 asks for the MLNX_OFED 4.9 legacy client, which peermem does not provide (it logs this and registers the extended client); other values fail the load");

int peermem_persistent_api_support = -1;
module_param_named(persistent_api_support, peermem_persistent_api_support, int, 0444);
MODULE_PARM_DESC(persistent_api_support,
		 "nvidia-peermem's: -1 (default, not set) or 0: peermem's clients as enable_invalidate and enable_nc say (nv_mem invalidating, nv_mem_nc persistent, as nvidia-peermem with 0); 1: nvidia-peermem registers only a persistent nv_mem, peermem logs that it keeps its invalidating nv_mem (load with enable_invalidate=0 for persistent pins only); other values fail the load");

unsigned int peermem_watch_cache = 32;
module_param_named(watch_cache, peermem_watch_cache, uint, 0444);
MODULE_PARM_DESC(watch_cache,
		 "Deregistered ranges whose watch pin (the GPU driver's pin of the range's first 64 KiB page with a free callback, not the persistent one that keeps memory) peermem keeps, so that registering the same range again in the same process pins once instead of twice (default 32, at most 64; 0: none). A cached pin keeps no GPU memory from being freed: freeing it, unmapping the range or unloading drops the entry");

unsigned int peermem_watch_cache_mib = 256;
module_param_named(watch_cache_mib, peermem_watch_cache_mib, uint, 0444);
MODULE_PARM_DESC(watch_cache_mib,
		 "At most this many MiB of BAR1 held by cached watch pins, 64 KiB each (default 256, at most 1048576; 0: no cache). A pin that fails while the process has pins cached gives them back and tries once more");

int peermem_current_tgid(void)
{
	return current->tgid;
}

/* ---- Scatter-gather tables */

struct scatterlist *peermem_sg_next(struct scatterlist *sg)
{
	return sg_next(sg);
}

void peermem_sg_set_dma(struct scatterlist *sg, u64 dma_addr, unsigned int len)
{
	sg_set_page(sg, NULL, len, 0);
	sg_dma_address(sg) = dma_addr;
	sg_dma_len(sg) = len;
}

/* ---- DMA devices */

struct pci_dev *peermem_to_pci_dev(struct device *dev)
{
	return dev && dev_is_pci(dev) ? to_pci_dev(dev) : NULL;
}

unsigned int peermem_dma_max_seg_size(struct device *dev)
{
	return dma_get_max_seg_size(dev);
}

u64 peermem_dma_seg_boundary(struct device *dev)
{
	return dma_get_seg_boundary(dev);
}

void peermem_report_not_pci(struct device *dev)
{
	dev_err_ratelimited(dev, "peermem: dma_map for a device that is not a PCI device; GPU peer-to-peer DMA needs a PCI RDMA adapter. The registration fails with EINVAL\n");
}

/* ---- Messages */

void peermem_warn_ratelimited(const char *msg)
{
	pr_warn_ratelimited("%s\n", msg);
}

/* ---- Waits and work items: macros and inlines (rust/kapi/object_count.rs, work.rs) */

bool peermem_wait_var_zero(int *var, unsigned int secs)
{
	return wait_var_event_timeout(var, !READ_ONCE(*var), secs * HZ);
}

struct workqueue_struct *peermem_alloc_workqueue(const char *name, unsigned int flags)
{
	return alloc_workqueue("%s", flags, 0, name);
}

void peermem_init_work(struct work_struct *work, work_func_t func)
{
	INIT_WORK(work, func);
}

void peermem_init_completion(struct completion *c)
{
	init_completion(c);
}

/* ---- Readings for the notifier's policy (rust/kapi/mmu_notifier.rs) */

const long peermem_nr_mremap = __NR_mremap;
const long peermem_nr_ioctl = __NR_ioctl;

bool peermem_range_mm_alive(const void *range)
{
	return atomic_read(&((const struct mmu_notifier_range *)range)->mm->mm_users);
}

struct mm_struct *peermem_current_mm(void)
{
	return current->mm;
}

bool peermem_current_kthread(void)
{
	return current->flags & PF_KTHREAD;
}

bool peermem_current_compat(void)
{
	return in_compat_syscall();
}

long peermem_current_syscall_nr(void)
{
	return syscall_get_nr(current, task_pt_regs(current));
}

/* ---- debugfs: rust/kapi/debugfs.rs builds the files' operations */

struct dentry *peermem_debugfs_create_file(const char *name, umode_t mode, struct dentry *parent,
					   void *data, const struct file_operations *fops)
{
	return debugfs_create_file(name, mode, parent, data, fops);
}

/* ---- The C layout of what Rust reads or builds (rust/kapi/layout.rs) */
#define PM_OFF(s, f) offsetof(struct s, f)
const unsigned long peermem_c_layout[] = {
	PM_OFF(file, private_data), PM_OFF(file, f_flags), sizeof(struct file_operations),
	PM_OFF(file_operations, owner), PM_OFF(file_operations, open),
	PM_OFF(file_operations, release), PM_OFF(file_operations, read),
	PM_OFF(file_operations, write), PM_OFF(file_operations, poll),
	PM_OFF(file_operations, mmap), PM_OFF(file_operations, llseek),
	PM_OFF(vm_area_struct, vm_start), PM_OFF(vm_area_struct, vm_end),
	PM_OFF(vm_area_struct, vm_pgoff), PM_OFF(vm_area_struct, vm_flags),
	PM_OFF(mmu_notifier_range, event), PM_OFF(mmu_notifier_range, flags),
	PM_OFF(mmu_notifier_range, mm), sizeof(struct mmu_interval_notifier),
	PM_OFF(mmu_interval_notifier, invalidate_seq), sizeof(struct mmu_interval_notifier_ops),
	PM_OFF(mmu_interval_notifier_ops, invalidate), PM_OFF(resource, start),
	PM_OFF(resource, end), PM_OFF(resource, flags), sizeof(struct sg_table),
	PM_OFF(sg_table, sgl), PM_OFF(sg_table, nents), PM_OFF(sg_table, orig_nents),
	sizeof(struct miscdevice), PM_OFF(miscdevice, minor), PM_OFF(miscdevice, name),
	PM_OFF(miscdevice, fops), PM_OFF(miscdevice, mode), sizeof(struct work_struct),
	sizeof(struct completion), sizeof(struct wait_queue_head), sizeof(struct wait_queue_entry),
	sizeof(spinlock_t), sizeof(struct lock_class_key),
};
const unsigned long peermem_c_layout_len = ARRAY_SIZE(peermem_c_layout);
