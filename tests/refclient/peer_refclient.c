// SPDX-License-Identifier: GPL-2.0
/*
 * peer_refclient - a minimal reference peer-memory client.
 *
 * It follows only the reference description of the MLNX peer-memory ABI
 * (see refclient_abi.h) and pins its memory in get_pages(), the way the C
 * clients of that API do. The rig uses it to test the peer-memory core
 * independently of peermem.
 *
 * Memory sources (parameter source): "refmem", its own, or "gpusim", the
 * emulated GPU through the nvidia_p2p_* API (see below).
 *
 * refmem: /dev/peer_refmem. mmap() of it (offset 0, length a
 * multiple of the client page size, at an address aligned to it) maps
 * fresh zeroed host memory with remap_pfn_range(), so the range is
 * VM_IO | VM_PFNMAP: pin_user_pages() fails on it, as on device memory,
 * and the RDMA core asks the peer clients. munmap() (or process exit)
 * frees the memory:
 *  - invalidate=1: a work item invalidates every mapping of it through the
 *    core, then frees the pages (not from the vma close itself: that runs
 *    under mmap_lock, and the core holds a umem's mapping lock across
 *    get_pages(), which for other clients takes mmap_lock);
 *  - invalidate=0: mappings keep the pages until the core puts them.
 *
 * gpusim: acquire() probes the range by pinning and unpinning it with
 * nvidia_p2p_get_pages(), as nvidia-peermem does; get_pages() pins it
 * (nvidia_p2p_get_pages_persistent() when invalidate=0); gpusim's free
 * callback invalidates the mapping through the core. Only devices without
 * a DMA device (rxe) are served: the GPU pages' physical addresses must be
 * host RAM with struct pages (gpusim's are; a real GPU's are not).
 *
 * Module parameters: source, invalidate, unmaps (PEER_MEM_INVALIDATE_UNMAPS
 * through the extended registration), page_kb (client page size),
 * cpu_pages (0: behave like a discrete GPU whose memory has no struct
 * pages, so dma_map() for a device without a DMA device fails).
 *
 * debugfs peer_refclient/: live_allocs, live_mem_bytes (refmem memory not
 * yet freed), live_pins, live_maps (all 0 when nothing is in use),
 * last_ticket, invalidate_ticket (write a ticket: the client calls the
 * core's invalidate with it), last_invalidate_ret, invalidate_done (how many
 * of the client's calls of the core's invalidate have returned, with the
 * client's own unmapping after them when unmaps=1),
 * race_invalidate (write 1: the next get_pages() starts an invalidation of
 * its mapping from a work item and waits 100 ms before returning, so the
 * invalidation reaches the core before the driver activated its notifier).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/scatterlist.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "refclient_abi.h"

static char *source = "refmem";
module_param(source, charp, 0444);
MODULE_PARM_DESC(source, "memory source: refmem (/dev/peer_refmem) or gpusim (nvidia_p2p_* API) (default refmem)");

static char *name = "refclient";
module_param(name, charp, 0444);
MODULE_PARM_DESC(name, "client name registered with the core (default refclient)");

static bool invalidate = true;
module_param(invalidate, bool, 0444);
MODULE_PARM_DESC(invalidate, "register with an invalidate callback and invalidate on free (default 1)");

static bool unmaps;
module_param(unmaps, bool, 0444);
MODULE_PARM_DESC(unmaps, "set PEER_MEM_INVALIDATE_UNMAPS: unmap and put pages itself after invalidating (default 0)");

static uint page_kb = 64;
module_param(page_kb, uint, 0444);
MODULE_PARM_DESC(page_kb, "client page size in KiB, power of two, 4..2048 (default 64)");

static bool cpu_pages = true;
module_param(cpu_pages, bool, 0444);
MODULE_PARM_DESC(cpu_pages, "memory has CPU-addressable pages; 0 makes dma_map fail for virtual-DMA devices like rxe (default 1)");

static unsigned long psize;		/* client page size in bytes */
static unsigned int porder;		/* its page order */
static struct ref_peer_client_ex client;
static void *reg_handle;
static ref_invalidate_fn core_invalidate;
static struct dentry *dbg_dir;

/* Protects ref_pins and every alloc's dead/freed/npins/mappers. */
static DEFINE_MUTEX(ref_lock);
static LIST_HEAD(ref_pins);		/* every pinning ref_ctx */
static atomic_t live_allocs = ATOMIC_INIT(0);
static atomic_t live_pins = ATOMIC_INIT(0);
static atomic_t live_maps = ATOMIC_INIT(0);
static atomic_long_t live_mem_bytes = ATOMIC_LONG_INIT(0);
static u64 last_ticket = ~0ULL;
static int last_invalidate_ret;
static atomic_t invalidate_done = ATOMIC_INIT(0);	/* core invalidate calls returned */
static atomic_t race_armed = ATOMIC_INIT(0);
static struct workqueue_struct *ref_wq;

/* source=gpusim: the nvidia_p2p_* entry points, from symbol_get. */
#define GS_PAGE 0x10000UL
static bool use_gpusim;
static ref_p2p_get_pages_fn p2p_get_pages;
static ref_p2p_put_pages_fn p2p_put_pages;
static ref_p2p_get_persistent_fn p2p_get_persistent;
static ref_p2p_put_persistent_fn p2p_put_persistent;
static int gs_probe_token;

/*
 * struct ref_alloc - one mmap() of /dev/peer_refmem
 *
 * Invariants: @ref counts the mapping VMAs plus each context that acquired
 * the range. @chunks hold host pages while !@freed; they are freed when the
 * allocation is @dead (unmapped) and no context pins it (@npins).
 */
struct ref_alloc {
	struct kref ref;
	unsigned long start;
	unsigned long nchunks;
	struct page **chunks;
	int mappers;
	bool dead;
	bool freed;
	unsigned long npins;
	struct work_struct free_work;
};

/*
 * struct ref_ctx - one acquire()d range
 *
 * Invariants: @ref counts the core (acquire() until release()), any free
 * path working on it, and (source=gpusim, @pin_ref) a pin whose free
 * callback may still come. @pinned and @mapped change under @lock; while
 * @pinned the context is on ref_pins and counted in @alloc->npins.
 */
struct ref_ctx {
	struct kref ref;
	struct mutex lock;
	struct ref_alloc *alloc;
	unsigned long addr;
	size_t size;
	unsigned long first, count;	/* chunk range */
	u64 ticket;
	bool pinned;
	bool mapped;
	bool cpu_mapped;		/* mapped for a virtual-DMA device */
	struct device *dma_dev;
	/* source=gpusim */
	u64 va, len;			/* the 64 KiB-aligned pinned range */
	struct ref_p2p_page_table *pt;
	bool pin_ref;			/* the pin holds a reference on us */
	bool cb_started;		/* gpusim's free callback began */
	struct task_struct *cb_task;	/* the thread running it */
	struct sg_table sgt;		/* our copy of the table we filled */
	struct list_head pin_node;
	struct list_head free_node;	/* on a free path's private list */
	struct work_struct race_work;	/* see race_invalidate */
};

static void ref_alloc_free_pages(struct ref_alloc *a)
{
	unsigned long i;

	lockdep_assert_held(&ref_lock);
	if (a->freed)
		return;
	for (i = 0; i < a->nchunks; i++) {
		if (a->chunks[i]) {
			__free_pages(a->chunks[i], porder);
			atomic_long_sub(psize, &live_mem_bytes);
		}
	}
	a->freed = true;
}

static void ref_alloc_release(struct kref *kref)
{
	struct ref_alloc *a = container_of(kref, struct ref_alloc, ref);

	mutex_lock(&ref_lock);
	ref_alloc_free_pages(a);
	mutex_unlock(&ref_lock);
	kvfree(a->chunks);
	kfree(a);
	atomic_dec(&live_allocs);
}

static void ref_ctx_release(struct kref *kref)
{
	struct ref_ctx *c = container_of(kref, struct ref_ctx, ref);

	if (c->alloc)
		kref_put(&c->alloc->ref, ref_alloc_release);
	mutex_destroy(&c->lock);
	kfree(c);
}

/* ---- the memory source ---- */

static void ref_vma_open(struct vm_area_struct *vma)
{
	struct ref_alloc *a = vma->vm_private_data;

	mutex_lock(&ref_lock);
	a->mappers++;
	mutex_unlock(&ref_lock);
	kref_get(&a->ref);
}

/*
 * Give up the pin of a context (c->lock held, c->pinned). Returns true if
 * the caller must drop the pin's reference on the context.
 */
static bool ref_unpin_locked(struct ref_ctx *c)
{
	bool drop = false;

	lockdep_assert_held(&c->lock);
	if (c->sgt.sgl)
		sg_free_table(&c->sgt);
	memset(&c->sgt, 0, sizeof(c->sgt));
	mutex_lock(&ref_lock);
	list_del(&c->pin_node);
	if (c->alloc) {
		c->alloc->npins--;
		/* The last pin of a dead allocation frees it. */
		if (c->alloc->dead && !c->alloc->npins)
			ref_alloc_free_pages(c->alloc);
	}
	mutex_unlock(&ref_lock);
	c->pinned = false;
	atomic_dec(&live_pins);

	if (use_gpusim && !invalidate) {
		p2p_put_persistent(c->va, c->pt, 0);
		c->pt = NULL;
	} else if (use_gpusim && !c->cb_started && c->cb_task != current) {
		/*
		 * If gpusim started the free callback meanwhile, this fails
		 * and the page table is gpusim's; the callback drops the pin
		 * reference when it is done.
		 */
		if (!p2p_put_pages(0, 0, c->va, c->pt)) {
			c->pt = NULL;
			drop = c->pin_ref;
			c->pin_ref = false;
		}
	}
	return drop;
}

/* Unmap and unpin the context, if nobody did yet (client-side unmap). */
static void ref_ctx_unmap_put(struct ref_ctx *c)
{
	bool drop = false;

	mutex_lock(&c->lock);
	if (c->mapped) {
		if (!c->cpu_mapped)
			dma_unmap_sgtable(c->dma_dev, &c->sgt,
					  DMA_BIDIRECTIONAL, 0);
		c->mapped = false;
		atomic_dec(&live_maps);
	}
	if (c->pinned)
		drop = ref_unpin_locked(c);
	mutex_unlock(&c->lock);
	if (drop)
		kref_put(&c->ref, ref_ctx_release);
}

/*
 * Invalidate one pinned context through the core. No lock of ours may be
 * held: the core's invalidate may call our dma_unmap/put_pages. With
 * PEER_MEM_INVALIDATE_UNMAPS the pages are ours to unmap and put after it.
 */
static void ref_invalidate_ctx(struct ref_ctx *c)
{
	last_invalidate_ret = core_invalidate(reg_handle, c->ticket);
	if (unmaps)
		ref_ctx_unmap_put(c);
	atomic_inc(&invalidate_done);
}

/* race_invalidate: invalidate a mapping while the core is still building it. */
static void ref_race_work(struct work_struct *work)
{
	struct ref_ctx *c = container_of(work, struct ref_ctx, race_work);

	ref_invalidate_ctx(c);
	kref_put(&c->ref, ref_ctx_release);
}

/*
 * Called at the end of a successful get_pages(): if armed, start an
 * invalidation of this mapping from another thread and give it time to
 * reach the core, which must hold it until the driver's mapping is live.
 */
static void ref_maybe_race(struct ref_ctx *c)
{
	if (!invalidate || !atomic_xchg(&race_armed, 0))
		return;
	kref_get(&c->ref);
	INIT_WORK(&c->race_work, ref_race_work);
	queue_work(ref_wq, &c->race_work);
	msleep(100);
}

/* Invalidate every pin of a dead allocation, then free its pages. */
static void ref_free_work(struct work_struct *work)
{
	struct ref_alloc *a = container_of(work, struct ref_alloc, free_work);
	struct ref_ctx *c, *tmp;
	LIST_HEAD(victims);

	mutex_lock(&ref_lock);
	list_for_each_entry(c, &ref_pins, pin_node) {
		if (c->alloc != a)
			continue;
		kref_get(&c->ref);
		list_add_tail(&c->free_node, &victims);
	}
	mutex_unlock(&ref_lock);

	/* No lock of ours held: the core's invalidate may call into us. */
	list_for_each_entry_safe(c, tmp, &victims, free_node) {
		ref_invalidate_ctx(c);
		list_del(&c->free_node);
		kref_put(&c->ref, ref_ctx_release);
	}

	mutex_lock(&ref_lock);
	if (!a->npins)
		ref_alloc_free_pages(a);
	else
		pr_err("allocation at %#lx still pinned after invalidation; the core did not put its pages\n",
		       a->start);
	mutex_unlock(&ref_lock);
	kref_put(&a->ref, ref_alloc_release);
}

static void ref_vma_close(struct vm_area_struct *vma)
{
	struct ref_alloc *a = vma->vm_private_data;

	mutex_lock(&ref_lock);
	if (--a->mappers) {
		mutex_unlock(&ref_lock);
		kref_put(&a->ref, ref_alloc_release);
		return;
	}
	a->dead = true;
	if (invalidate && a->npins) {
		/* The work item inherits the mapping's reference. */
		mutex_unlock(&ref_lock);
		queue_work(ref_wq, &a->free_work);
		return;
	}
	/* Unpinned pages go now; pinned ones with their last put_pages. */
	if (!a->npins)
		ref_alloc_free_pages(a);
	mutex_unlock(&ref_lock);
	kref_put(&a->ref, ref_alloc_release);
}

static int ref_vma_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

static int ref_vma_mremap(struct vm_area_struct *vma)
{
	return -EINVAL;
}

static const struct vm_operations_struct ref_vm_ops = {
	.open = ref_vma_open,
	.close = ref_vma_close,
	.may_split = ref_vma_may_split,
	.mremap = ref_vma_mremap,
};

static int ref_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	struct ref_alloc *a;
	unsigned long i;
	int ret;

	if (vma->vm_pgoff || !IS_ALIGNED(vma->vm_start, psize) ||
	    !IS_ALIGNED(len, psize))
		return -EINVAL;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	kref_init(&a->ref);
	INIT_WORK(&a->free_work, ref_free_work);
	a->start = vma->vm_start;
	a->nchunks = len / psize;
	a->mappers = 1;
	atomic_inc(&live_allocs);
	a->chunks = kvcalloc(a->nchunks, sizeof(*a->chunks), GFP_KERNEL);
	if (!a->chunks) {
		ret = -ENOMEM;
		goto err;
	}
	for (i = 0; i < a->nchunks; i++) {
		a->chunks[i] = alloc_pages(GFP_KERNEL | __GFP_ZERO |
					   __GFP_NOWARN, porder);
		if (!a->chunks[i]) {
			ret = -ENOMEM;
			goto err;
		}
		atomic_long_add(psize, &live_mem_bytes);
	}
	vm_flags_set(vma, VM_DONTCOPY | VM_DONTEXPAND);
	for (i = 0; i < a->nchunks; i++) {
		ret = remap_pfn_range(vma, vma->vm_start + i * psize,
				      page_to_pfn(a->chunks[i]), psize,
				      vma->vm_page_prot);
		if (ret)
			goto err;
	}
	vma->vm_private_data = a;
	vma->vm_ops = &ref_vm_ops;
	return 0;
err:
	kref_put(&a->ref, ref_alloc_release);
	return ret;
}

static const struct file_operations ref_fops = {
	.owner = THIS_MODULE,
	.mmap = ref_mmap,
};

static struct miscdevice ref_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "peer_refmem",
	.fops = &ref_fops,
	.mode = 0666,
};

/* ---- the peer-memory client ---- */

static struct ref_ctx *ref_ctx_new(unsigned long addr, size_t size)
{
	struct ref_ctx *c = kzalloc(sizeof(*c), GFP_KERNEL);

	if (!c)
		return NULL;
	kref_init(&c->ref);
	mutex_init(&c->lock);
	c->addr = addr;
	c->size = size;
	return c;
}

static void gs_probe_cb(void *data)
{
}

/* Is the range gpusim memory of the calling process? Pin and unpin it. */
static int gs_acquire(unsigned long addr, size_t size, void **ctx)
{
	struct ref_p2p_page_table *pt = NULL;
	struct ref_ctx *c;
	u64 va, end;

	if (addr + size > ULONG_MAX - GS_PAGE)
		return 0;
	va = ALIGN_DOWN(addr, GS_PAGE);
	end = ALIGN(addr + size, GS_PAGE);
	if (p2p_get_pages(0, 0, va, end - va, &pt, gs_probe_cb,
			  &gs_probe_token))
		return 0;
	p2p_put_pages(0, 0, va, pt);

	c = ref_ctx_new(addr, size);
	if (!c)
		return -ENOMEM;
	c->va = va;
	c->len = end - va;
	*ctx = c;
	return 1;
}

/* gpusim frees memory we pin: invalidate through the core. No lock held. */
static void gs_free_cb(void *data)
{
	struct ref_ctx *c = data;
	bool pinned, drop;

	mutex_lock(&c->lock);
	c->cb_started = true;
	c->cb_task = current;
	pinned = c->pinned;
	mutex_unlock(&c->lock);

	if (pinned)
		ref_invalidate_ctx(c);

	mutex_lock(&c->lock);
	c->cb_task = NULL;
	c->pt = NULL;			/* gpusim frees it after we return */
	drop = c->pin_ref;
	c->pin_ref = false;
	mutex_unlock(&c->lock);
	if (drop)
		kref_put(&c->ref, ref_ctx_release);
}

static int ref_acquire(unsigned long addr, size_t size, void *legacy1,
		       char *legacy2, void **ctx)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct ref_alloc *a = NULL;
	struct ref_ctx *c;

	if (!mm || !size || addr + size < addr)
		return 0;
	if (use_gpusim)
		return gs_acquire(addr, size, ctx);
	mmap_read_lock(mm);
	vma = vma_lookup(mm, addr);
	if (vma && vma->vm_ops == &ref_vm_ops && addr + size <= vma->vm_end) {
		a = vma->vm_private_data;
		kref_get(&a->ref);
	}
	mmap_read_unlock(mm);
	if (!a)
		return 0;

	c = ref_ctx_new(addr, size);
	if (!c) {
		kref_put(&a->ref, ref_alloc_release);
		return -ENOMEM;
	}
	c->alloc = a;
	c->first = (ALIGN_DOWN(addr, psize) - a->start) / psize;
	c->count = (ALIGN(addr + size, psize) - ALIGN_DOWN(addr, psize)) / psize;
	*ctx = c;
	return 1;
}

static int gs_get_pages(struct ref_ctx *c, u64 core_context)
{
	struct ref_p2p_page_table *pt = NULL;
	int ret;

	mutex_lock(&c->lock);
	if (c->pinned || c->cb_started) {
		ret = -EBUSY;
		goto out;
	}
	c->ticket = core_context;	/* before the callback can come */
	if (invalidate)
		ret = p2p_get_pages(0, 0, c->va, c->len, &pt, gs_free_cb, c);
	else
		ret = p2p_get_persistent(c->va, c->len, &pt, 0);
	if (ret)
		goto out;
	if (!REF_P2P_VERSION_OK(pt->version, REF_P2P_PAGE_TABLE_VERSION) ||
	    pt->page_size != REF_P2P_PAGE_SIZE_64KB ||
	    pt->entries != c->len / GS_PAGE) {
		pr_err("gpusim page table version %#x, page size %u, %u entries: not what this client understands\n",
		       pt->version, pt->page_size, pt->entries);
		if (invalidate)
			p2p_put_pages(0, 0, c->va, pt);
		else
			p2p_put_persistent(c->va, pt, 0);
		ret = -EINVAL;
		goto out;
	}
	c->pt = pt;
	c->first = 0;
	c->count = pt->entries;
	if (invalidate) {
		kref_get(&c->ref);
		c->pin_ref = true;
	}
	mutex_lock(&ref_lock);
	list_add_tail(&c->pin_node, &ref_pins);
	mutex_unlock(&ref_lock);
	c->pinned = true;
	last_ticket = core_context;
	atomic_inc(&live_pins);
out:
	mutex_unlock(&c->lock);
	if (!ret)
		ref_maybe_race(c);
	return ret;
}

static int ref_get_pages(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *legacy_sgt, void *ctx,
			 u64 core_context)
{
	struct ref_ctx *c = ctx;
	int ret = 0;

	if (addr != c->addr || size != c->size)
		return -EINVAL;
	if (use_gpusim)
		return gs_get_pages(c, core_context);
	mutex_lock(&c->lock);
	mutex_lock(&ref_lock);
	if (c->alloc->dead || c->alloc->freed) {
		ret = -EFAULT;
	} else if (c->pinned) {
		ret = -EBUSY;
	} else {
		list_add_tail(&c->pin_node, &ref_pins);
		c->alloc->npins++;
		c->pinned = true;
		c->ticket = core_context;
		last_ticket = core_context;
		atomic_inc(&live_pins);
	}
	mutex_unlock(&ref_lock);
	mutex_unlock(&c->lock);
	if (!ret)
		ref_maybe_race(c);
	return ret;
}

static int ref_dma_map(struct sg_table *sgt, void *ctx, struct device *dev,
		       int legacy_dmasync, int *nmap)
{
	struct ref_ctx *c = ctx;
	struct scatterlist *sg;
	unsigned long i;
	int ret;

	/* A virtual-DMA device (rxe) reads the pages with the CPU. */
	if (!dev && !cpu_pages)
		return -EOPNOTSUPP;
	/* This client maps gpusim memory only for such devices. */
	if (dev && use_gpusim)
		return -EOPNOTSUPP;

	mutex_lock(&c->lock);
	if (!c->pinned || c->mapped || (use_gpusim && !c->pt)) {
		ret = -EINVAL;
		goto out;
	}
	if (use_gpusim) {
		for (i = 0; i < c->count; i++) {
			unsigned long pfn = c->pt->pages[i]->physical_address >>
					    PAGE_SHIFT;

			if (!pfn_valid(pfn)) {
				ret = -EOPNOTSUPP;
				goto out;
			}
		}
	}
	ret = sg_alloc_table(&c->sgt, c->count, GFP_KERNEL);
	if (ret)
		goto out;
	for_each_sg(c->sgt.sgl, sg, c->count, i) {
		struct page *page = use_gpusim ?
			pfn_to_page(c->pt->pages[i]->physical_address >> PAGE_SHIFT) :
			c->alloc->chunks[c->first + i];

		sg_set_page(sg, page, psize, 0);
		if (!dev) {
			sg_dma_address(sg) = (u64)(uintptr_t)page_address(page);
			sg_dma_len(sg) = psize;
		}
	}
	if (dev) {
		ret = dma_map_sgtable(dev, &c->sgt, DMA_BIDIRECTIONAL, 0);
		if (ret) {
			sg_free_table(&c->sgt);
			goto out;
		}
	}
	c->dma_dev = dev;
	c->cpu_mapped = !dev;
	c->mapped = true;
	atomic_inc(&live_maps);
	*sgt = c->sgt;
	*nmap = c->sgt.nents;
out:
	mutex_unlock(&c->lock);
	return ret;
}

static int ref_dma_unmap(struct sg_table *sgt, void *ctx, struct device *dev)
{
	struct ref_ctx *c = ctx;

	mutex_lock(&c->lock);
	if (c->mapped) {
		if (sgt->sgl != c->sgt.sgl)
			pr_err("dma_unmap got a table we did not fill\n");
		if (!c->cpu_mapped)
			dma_unmap_sgtable(c->dma_dev, &c->sgt,
					  DMA_BIDIRECTIONAL, 0);
		c->mapped = false;
		atomic_dec(&live_maps);
	}
	mutex_unlock(&c->lock);
	return 0;
}

static void ref_put_pages(struct sg_table *sgt, void *ctx)
{
	struct ref_ctx *c = ctx;
	bool drop = false;

	mutex_lock(&c->lock);
	if (c->pinned) {
		/* Unmapped by dma_unmap, or dma_map never succeeded. */
		if (c->mapped)
			pr_err("put_pages before dma_unmap\n");
		drop = ref_unpin_locked(c);
	}
	mutex_unlock(&c->lock);
	if (drop)
		kref_put(&c->ref, ref_ctx_release);
}

static unsigned long ref_get_page_size(void *ctx)
{
	return use_gpusim ? GS_PAGE : psize;
}

static void ref_release(void *ctx)
{
	struct ref_ctx *c = ctx;

	mutex_lock(&c->lock);
	if (c->mapped || c->pinned)
		pr_err("release before dma_unmap/put_pages\n");
	mutex_unlock(&c->lock);
	kref_put(&c->ref, ref_ctx_release);
}

/* ---- debugfs ---- */

static int ref_atomic_get(void *data, u64 *val)
{
	*val = atomic_read(data);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_atomic_fops, ref_atomic_get, NULL, "%llu\n");

static int ref_long_get(void *data, u64 *val)
{
	*val = atomic_long_read(data);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_long_fops, ref_long_get, NULL, "%llu\n");

static int ref_last_ticket_get(void *data, u64 *val)
{
	*val = READ_ONCE(last_ticket);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_last_ticket_fops, ref_last_ticket_get, NULL,
			 "%llu\n");

static int ref_last_ret_get(void *data, u64 *val)
{
	*val = (u64)(s64)READ_ONCE(last_invalidate_ret);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_last_ret_fops, ref_last_ret_get, NULL, "%lld\n");

/* Invalidate a ticket by hand: a live one like a free would, or a stale one. */
static int ref_invalidate_set(void *data, u64 val)
{
	struct ref_ctx *c, *found = NULL;

	if (!core_invalidate)
		return -EOPNOTSUPP;
	mutex_lock(&ref_lock);
	list_for_each_entry(c, &ref_pins, pin_node) {
		if (c->ticket == val) {
			found = c;
			kref_get(&c->ref);
			break;
		}
	}
	mutex_unlock(&ref_lock);
	if (!found) {
		last_invalidate_ret = core_invalidate(reg_handle, val);
		atomic_inc(&invalidate_done);
		return 0;
	}
	ref_invalidate_ctx(found);
	kref_put(&found->ref, ref_ctx_release);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_invalidate_fops, NULL, ref_invalidate_set,
			 "%llu\n");

static int ref_race_set(void *data, u64 val)
{
	if (!core_invalidate)
		return -EOPNOTSUPP;
	atomic_set(&race_armed, !!val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_race_fops, NULL, ref_race_set, "%llu\n");

static const char * const gs_symbols[] = {
	"nvidia_p2p_get_pages", "nvidia_p2p_put_pages",
	"nvidia_p2p_get_pages_persistent", "nvidia_p2p_put_pages_persistent",
};

static void gs_release_symbols(void)
{
	void **slots[] = {
		(void **)&p2p_get_pages, (void **)&p2p_put_pages,
		(void **)&p2p_get_persistent, (void **)&p2p_put_persistent,
	};
	int i;

	for (i = 0; i < ARRAY_SIZE(gs_symbols); i++) {
		if (*slots[i])
			__symbol_put(gs_symbols[i]);
		*slots[i] = NULL;
	}
}

/* The nvidia_p2p_* exports are GPL-only: symbol_get() finds them. */
static int gs_resolve(void)
{
	void **slots[] = {
		(void **)&p2p_get_pages, (void **)&p2p_put_pages,
		(void **)&p2p_get_persistent, (void **)&p2p_put_persistent,
	};
	int i;

	for (i = 0; i < ARRAY_SIZE(gs_symbols); i++) {
		*slots[i] = __symbol_get(gs_symbols[i]);
		if (!*slots[i]) {
			pr_err("source=gpusim: %s is not exported; load gpusim.ko (tests/gpusim) first\n",
			       gs_symbols[i]);
			gs_release_symbols();
			return -ENOENT;
		}
	}
	return 0;
}

static int __init ref_init(void)
{
	int ret;

	if (page_kb < 4 || page_kb > 2048 || !is_power_of_2(page_kb) ||
	    page_kb * 1024UL < PAGE_SIZE) {
		pr_err("page_kb=%u: use a power of two between %lu and 2048\n",
		       page_kb, PAGE_SIZE / 1024);
		return -EINVAL;
	}
	if (unmaps && !invalidate) {
		pr_err("unmaps=1 needs invalidate=1\n");
		return -EINVAL;
	}
	if (strlen(name) >= REF_NAME_LEN) {
		pr_err("name is longer than %d characters\n", REF_NAME_LEN - 1);
		return -EINVAL;
	}
	psize = page_kb * 1024UL;
	porder = get_order(psize);
	if (!strcmp(source, "gpusim")) {
		use_gpusim = true;
	} else if (strcmp(source, "refmem")) {
		pr_err("source=%s: use refmem or gpusim\n", source);
		return -EINVAL;
	}
	if (use_gpusim) {
		ret = gs_resolve();
		if (ret)
			return ret;
	}

	strscpy(client.client.name, name, REF_NAME_LEN);
	strscpy(client.client.version, "1.0", REF_VERSION_LEN);
	client.client.acquire = ref_acquire;
	client.client.get_pages = ref_get_pages;
	client.client.dma_map = ref_dma_map;
	client.client.dma_unmap = ref_dma_unmap;
	client.client.put_pages = ref_put_pages;
	client.client.get_page_size = ref_get_page_size;
	client.client.release = ref_release;
	if (unmaps) {
		client.client.version[REF_VERSION_LEN - 1] = 1;
		client.ex_size = sizeof(client);
		client.flags = REF_FLAG_INVALIDATE_UNMAPS;
	}

	ref_wq = alloc_workqueue("peer_refclient", WQ_UNBOUND, 0);
	if (!ref_wq) {
		ret = -ENOMEM;
		goto err_symbols;
	}
	if (!use_gpusim) {
		ret = misc_register(&ref_misc);
		if (ret) {
			pr_err("cannot register /dev/peer_refmem (%d)\n", ret);
			goto err_wq;
		}
	}
	reg_handle = ib_register_peer_memory_client(&client.client,
						    invalidate ? &core_invalidate : NULL);
	if (!reg_handle) {
		pr_err("the RDMA core refused the registration; see the peer_mem messages above\n");
		ret = -EINVAL;
		goto err_misc;
	}
	if (invalidate && !core_invalidate) {
		pr_err("the core did not hand out its invalidate function\n");
		ib_unregister_peer_memory_client(reg_handle);
		ret = -EINVAL;
		goto err_misc;
	}

	dbg_dir = debugfs_create_dir("peer_refclient", NULL);
	debugfs_create_file_unsafe("live_allocs", 0444, dbg_dir, &live_allocs,
				   &ref_atomic_fops);
	debugfs_create_file_unsafe("live_pins", 0444, dbg_dir, &live_pins,
				   &ref_atomic_fops);
	debugfs_create_file_unsafe("live_maps", 0444, dbg_dir, &live_maps,
				   &ref_atomic_fops);
	debugfs_create_file_unsafe("live_mem_bytes", 0444, dbg_dir,
				   &live_mem_bytes, &ref_long_fops);
	debugfs_create_file_unsafe("last_ticket", 0444, dbg_dir, NULL,
				   &ref_last_ticket_fops);
	debugfs_create_file_unsafe("last_invalidate_ret", 0444, dbg_dir, NULL,
				   &ref_last_ret_fops);
	debugfs_create_file_unsafe("invalidate_done", 0444, dbg_dir,
				   &invalidate_done, &ref_atomic_fops);
	debugfs_create_file_unsafe("invalidate_ticket", 0200, dbg_dir, NULL,
				   &ref_invalidate_fops);
	debugfs_create_file_unsafe("race_invalidate", 0200, dbg_dir, NULL,
				   &ref_race_fops);
	pr_info("registered as %s (source=%s invalidate=%d unmaps=%d page=%lu KiB cpu_pages=%d)\n",
		name, source, invalidate, unmaps,
		(use_gpusim ? GS_PAGE : psize) / 1024, cpu_pages);
	return 0;

err_misc:
	if (!use_gpusim)
		misc_deregister(&ref_misc);
err_wq:
	destroy_workqueue(ref_wq);
err_symbols:
	if (use_gpusim)
		gs_release_symbols();
	return ret;
}

static void __exit ref_exit(void)
{
	debugfs_remove_recursive(dbg_dir);
	if (!use_gpusim)
		misc_deregister(&ref_misc);
	/* Frees still in flight call the core: finish them first. */
	destroy_workqueue(ref_wq);
	/* Waits until every registration using our memory is released. */
	ib_unregister_peer_memory_client(reg_handle);
	if (use_gpusim)
		gs_release_symbols();
	if (atomic_read(&live_allocs) || atomic_read(&live_pins) ||
	    atomic_read(&live_maps) || atomic_long_read(&live_mem_bytes))
		pr_err("leaked: %d allocations, %d pins, %d mappings\n",
		       atomic_read(&live_allocs), atomic_read(&live_pins),
		       atomic_read(&live_maps));
}

module_init(ref_init);
module_exit(ref_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Reference peer-memory client for testing the RDMA peer-memory core");
MODULE_AUTHOR("peermem project");
