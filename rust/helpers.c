// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of the peermem module: module metadata and parameters, the
 * debugfs directory, scatterlists, DMA-device queries and a few static
 * inlines. These are kernel interfaces whose Rust abstractions differ
 * between the kernels peermem builds on (6.12 LTS has neither Rust module
 * parameters nor Rust debugfs, nor scatterlist or PCI abstractions), so
 * they live here, behind the small API declared in include/peermem_ffi.h.
 * The logic stays in Rust.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
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
static char peer_name[IB_PEER_MEMORY_NAME_MAX] = "nv_mem";
module_param_string(peer_name, peer_name, sizeof(peer_name), 0444);
MODULE_PARM_DESC(peer_name,
		 "Name of the invalidating client; the non-invalidating one is this name followed by _nc. 1-63 characters of A-Z a-z 0-9 _ . - (at most 60 with enable_nc=Y). Default \"nv_mem\" (and \"nv_mem_nc\"), the names of nvidia-peermem's clients");

static bool enable_invalidate = true;
module_param(enable_invalidate, bool, 0444);
MODULE_PARM_DESC(enable_invalidate,
		 "Register the invalidating client (peer_name), which the core asks first for memory registrations, so that freeing GPU memory revokes RDMA access to it (default Y). N: leave it out; memory registrations on GPU memory then go to the non-invalidating client, pinned persistently: freed GPU memory stays allocated until they are gone");

static bool enable_nc = true;
module_param(enable_nc, bool, 0444);
MODULE_PARM_DESC(enable_nc,
		 "Register the non-invalidating client (peer_name followed by _nc), which pins persistently and is the only client the core asks for memory it cannot invalidate: queue buffers and doorbell pages of the RDMA driver (default Y). N: leave it out; those then cannot be in GPU memory");

static bool mmu_notifier = true;
module_param(mmu_notifier, bool, 0444);
MODULE_PARM_DESC(mmu_notifier,
		 "Revoke a registration when the registering process unmaps or moves its address range (munmap, mremap), through an mmu interval notifier, as with freed GPU memory (default Y; only with enable_invalidate=Y). N: a registration keeps serving the GPU memory it pinned whatever the address means afterwards, as nvidia-peermem does");

/*
 * NVIDIA's nvidia-peermem parameters, accepted so that a host whose
 * /etc/modprobe.d sets them keeps loading (the drop-in takes NVIDIA's
 * module name); rust/client/params.rs checks them and says what peermem
 * does with each (docs/module.md).
 */
static int peerdirect_support;
module_param(peerdirect_support, int, 0444);
MODULE_PARM_DESC(peerdirect_support,
		 "nvidia-peermem's: 0 (default) registers the invalidating client as an extended client with PEER_MEM_INVALIDATE_UNMAPS, as peermem always does; 1 asks for the MLNX_OFED 4.9 legacy client, which peermem does not provide (it logs this and registers the extended client); other values fail the load");

static int persistent_api_support = -1;
module_param(persistent_api_support, int, 0444);
MODULE_PARM_DESC(persistent_api_support,
		 "nvidia-peermem's: -1 (default, not set) or 0: peermem's clients as enable_invalidate and enable_nc say (nv_mem invalidating, nv_mem_nc persistent, as nvidia-peermem with 0); 1: nvidia-peermem registers only a persistent nv_mem, peermem logs that it keeps its invalidating nv_mem (load with enable_invalidate=0 for persistent pins only); other values fail the load");

int peermem_param_peerdirect_support(void)
{
	return peerdirect_support;
}

int peermem_param_persistent_api_support(void)
{
	return persistent_api_support;
}

const char *peermem_param_peer_name(void)
{
	return peer_name;
}

bool peermem_param_enable_invalidate(void)
{
	return enable_invalidate;
}

bool peermem_param_enable_nc(void)
{
	return enable_nc;
}

bool peermem_param_mmu_notifier(void)
{
	return mmu_notifier;
}

static unsigned int watch_cache = 32;
module_param(watch_cache, uint, 0444);
MODULE_PARM_DESC(watch_cache,
		 "Deregistered ranges whose watch pin (the GPU driver's pin of the range's first 64 KiB page with a free callback, not the persistent one that keeps memory) peermem keeps, so that registering the same range again in the same process pins once instead of twice (default 32, at most 64; 0: none). A cached pin keeps no GPU memory from being freed: freeing it, unmapping the range or unloading drops the entry");

static unsigned int watch_cache_mib = 256;
module_param(watch_cache_mib, uint, 0444);
MODULE_PARM_DESC(watch_cache_mib,
		 "At most this many MiB of BAR1 held by cached watch pins, 64 KiB each (default 256, at most 1048576; 0: no cache). A pin that fails while the process has pins cached gives them back and tries once more");

unsigned long peermem_mm_current_key(void)
{
	if (current->flags & PF_KTHREAD)
		return 0;
	return (unsigned long)current->mm;
}

int peermem_current_tgid(void)
{
	return current->tgid;
}

unsigned int peermem_param_watch_cache(void)
{
	return watch_cache;
}

unsigned int peermem_param_watch_cache_mib(void)
{
	return watch_cache_mib;
}

/* ---- Scatter-gather tables */

int peermem_sgt_alloc(struct sg_table *sgt, unsigned int nents)
{
	return sg_alloc_table(sgt, nents, GFP_KERNEL);
}

void peermem_sgt_free(struct sg_table *sgt)
{
	if (sgt->sgl)
		sg_free_table(sgt);
	memset(sgt, 0, sizeof(*sgt));
}

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

bool peermem_range_mm_is_current(const void *range)
{
	return current->mm == ((const struct mmu_notifier_range *)range)->mm;
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

/* ---- Free-callback references: the registry's lock (rust/kapi/cbref.rs) */

static DEFINE_SPINLOCK(peermem_cbrefs_spin);

void peermem_cbrefs_lock(void)
{
	spin_lock(&peermem_cbrefs_spin);
}

void peermem_cbrefs_unlock(void)
{
	spin_unlock(&peermem_cbrefs_spin);
}

/* ---- debugfs */

static struct dentry *peermem_dir;
static peermem_counter_read_t peermem_counter_read;

static int peermem_counter_get(void *counter, u64 *val)
{
	*val = peermem_counter_read(counter);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(peermem_counter_fops, peermem_counter_get, NULL,
			 "%llu\n");

int peermem_debugfs_create(peermem_counter_read_t read)
{
	struct dentry *dir;

	if (!read)
		return -EINVAL;
	dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	if (IS_ERR(dir))
		return PTR_ERR(dir);
	peermem_counter_read = read;
	peermem_dir = dir;
	return 0;
}

void *peermem_debugfs_subdir(const char *name)
{
	struct dentry *dir;

	if (!peermem_dir)
		return NULL;
	dir = debugfs_create_dir(name, peermem_dir);
	return IS_ERR(dir) ? NULL : dir;
}

void peermem_debugfs_add_counter(void *dir, const char *name, const void *counter)
{
	if (!peermem_dir)
		return;
	/*
	 * debugfs keeps the pointer as the file's private data and hands it
	 * back to peermem_counter_get(); the file is read-only, so the cast
	 * away from const is never written through.
	 */
	debugfs_create_file_unsafe(name, 0444, dir ?: peermem_dir,
				   (void *)counter, &peermem_counter_fops);
}

void peermem_debugfs_add_knob(const char *name, u32 *value)
{
	if (!peermem_dir)
		return;
	debugfs_create_u32(name, 0600, peermem_dir, value);
}

/* What the write means is Rust's (rust/kapi/debugfs.rs). */
static ssize_t peermem_action_write(struct file *file, const char __user *buf,
				    size_t len, loff_t *ppos)
{
	peermem_action_write_t write = file->private_data;

	return write((const char __force *)buf, len);
}

static const struct file_operations peermem_action_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = peermem_action_write,
	.llseek = noop_llseek,
};

void peermem_debugfs_add_action(const char *name, peermem_action_write_t write)
{
	if (!peermem_dir)
		return;
	/* Removal waits for writers inside the call (debugfs' file proxy). */
	debugfs_create_file(name, 0200, peermem_dir, write, &peermem_action_fops);
}

void peermem_debugfs_add_hex(const char *name, u32 *value)
{
	if (!peermem_dir)
		return;
	/* 0x%08x, read whole (a u32 load); only peermem writes the value. */
	debugfs_create_x32(name, 0444, peermem_dir, value);
}

void peermem_msleep(unsigned int ms)
{
	msleep(ms);
}

void peermem_debugfs_remove(void)
{
	/*
	 * Removes the subdirectories too, and waits for readers that are
	 * inside peermem_counter_get().
	 */
	debugfs_remove(peermem_dir);
	peermem_dir = NULL;
}
