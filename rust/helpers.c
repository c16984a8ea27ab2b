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

#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/err.h>
#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/wait_bit.h>
#include <linux/xarray.h>

#include "peermem_ffi.h"

MODULE_VERSION(PEERMEM_VERSION);
MODULE_AUTHOR("The peermem authors");

/* ---- Module parameters */

/*
 * nv_mem: the name nvidia-peermem registers, which NCCL looks for
 * (/sys/kernel/mm/memory_peers/nv_mem/version) to decide that GPUDirect
 * RDMA works. It also keeps nvidia-peermem and peermem from both loading.
 */
static char peer_name[IB_PEER_MEMORY_NAME_MAX] = "nv_mem";
module_param_string(peer_name, peer_name, sizeof(peer_name), 0444);
MODULE_PARM_DESC(peer_name,
		 "Name to register with the peer-memory core: 1-63 characters of A-Z a-z 0-9 _ . - (default \"nv_mem\", the name of nvidia-peermem, which NCCL looks for)");

static bool enable_invalidate = true;
module_param(enable_invalidate, bool, 0444);
MODULE_PARM_DESC(enable_invalidate,
		 "Register as an invalidating client, so that freeing GPU memory revokes RDMA access to it (default Y). N: pin persistently, like NVIDIA's non-invalidating client; freed GPU memory then stays allocated until its registrations are gone");

const char *peermem_param_peer_name(void)
{
	return peer_name;
}

bool peermem_param_enable_invalidate(void)
{
	return enable_invalidate;
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

void peermem_sg_set_ram(struct scatterlist *sg, u64 phys, unsigned int len)
{
	struct page *page = pfn_to_page(PHYS_PFN(phys));

	sg_set_page(sg, page, len, 0);
	sg_dma_address(sg) = (u64)(uintptr_t)page_address(page);
	sg_dma_len(sg) = len;
}

bool peermem_phys_is_ram(u64 phys, u64 len)
{
	unsigned long pfn = PHYS_PFN(phys);
	unsigned long last;

	if (!len || !PAGE_ALIGNED(phys) || !PAGE_ALIGNED(len) ||
	    phys + len < phys)
		return false;
	last = PHYS_PFN(phys + len - 1);
	/* The first and last page of a run stand for the run (its chunks are RAM). */
	if (!pfn_valid(pfn) || !pfn_valid(last))
		return false;
	return !PageHighMem(pfn_to_page(pfn)) && !PageHighMem(pfn_to_page(last));
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

/* ---- Registration objects alive */

static atomic_t peermem_objects = ATOMIC_INIT(0);

void peermem_objects_inc(void)
{
	atomic_inc(&peermem_objects);
}

void peermem_objects_dec(void)
{
	if (atomic_dec_and_test(&peermem_objects))
		wake_up_var(&peermem_objects);
}

void peermem_objects_wait(void)
{
	while (!wait_var_event_timeout(&peermem_objects,
				       !atomic_read(&peermem_objects), 10 * HZ))
		pr_info("unloading: waiting for %d registration object(s) still referenced by GPU free callbacks in flight\n",
			atomic_read(&peermem_objects));
}

/* ---- Free-callback references */

/*
 * id -> the free callback's reference (an Arc<Registration> raw pointer).
 * Ids come from a 64-bit counter and are never reused, so a callback that
 * arrives late with an id whose entry is gone can never find another
 * registration's entry. Whoever erases an entry owns its reference.
 */
static DEFINE_XARRAY(peermem_cbrefs);
static atomic64_t peermem_cbref_last = ATOMIC64_INIT(0);

int peermem_cbref_insert(const void *ref, u64 *id)
{
	u64 n;
	int ret;

	if (!ref || !id || ((uintptr_t)ref & 3))
		return -EINVAL;
	n = atomic64_inc_return(&peermem_cbref_last);
	/* Only reachable where unsigned long is 32 bits, after 4 G pins. */
	if (n > ULONG_MAX)
		return -EOVERFLOW;
	ret = xa_insert(&peermem_cbrefs, (unsigned long)n, (void *)ref,
			GFP_KERNEL);
	if (ret)
		return ret;
	*id = n;
	return 0;
}

const void *peermem_cbref_take(u64 id)
{
	if (!id || id > ULONG_MAX)
		return NULL;
	return xa_erase(&peermem_cbrefs, (unsigned long)id);
}

u64 peermem_cbrefs_left(void)
{
	unsigned long index;
	void *entry;
	u64 n = 0;

	xa_for_each(&peermem_cbrefs, index, entry)
		n++;
	return n;
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

void peermem_debugfs_add_counter(const char *name, const void *counter)
{
	if (!peermem_dir)
		return;
	/*
	 * debugfs keeps the pointer as the file's private data and hands it
	 * back to peermem_counter_get(); the file is read-only, so the cast
	 * away from const is never written through.
	 */
	debugfs_create_file_unsafe(name, 0444, peermem_dir, (void *)counter,
				   &peermem_counter_fops);
}

void peermem_debugfs_add_knob(const char *name, u32 *value)
{
	if (!peermem_dir)
		return;
	debugfs_create_u32(name, 0600, peermem_dir, value);
}

void peermem_msleep(unsigned int ms)
{
	msleep(ms);
}

void peermem_debugfs_remove(void)
{
	/* Waits for readers that are inside peermem_counter_get(). */
	debugfs_remove(peermem_dir);
	peermem_dir = NULL;
}
