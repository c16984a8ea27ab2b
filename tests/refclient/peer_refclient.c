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
 * callback invalidates the mapping through the core. gpusim's GPU pages
 * are host RAM (pfn_valid(), with struct pages; a real GPU's are not), so
 * this client maps them itself with the DMA API.
 *
 * DMA. dma_map() maps the pages for the device the core names (an HCA's
 * PCI function; NULL is refused with -EINVAL) into a table of the
 * client's own, and hands the core a separate table holding a copy of the
 * resulting DMA entries. The core trims and restores entries of the table
 * it was given; the client unmaps from its own, so an unmapping never
 * depends on what state the core left the shared table in. The table
 * handed to the core is freed only when the context dies (after
 * release()): with PEER_MEM_INVALIDATE_UNMAPS the core may still restore
 * entries in it and call dma_unmap()/put_pages() with it after the
 * client's own invalidation returned (OFED's deregistration order).
 *
 *  - cpu_pages=1 (default): the memory is ordinary RAM with struct pages;
 *    dma_map_sgtable() of one entry per client page. The core's table
 *    has the pages in its CPU view (orig_nents entries) and the mapped,
 *    possibly merged, DMA entries (nents).
 *  - cpu_pages=0 (refmem only): memory the kernel does not manage as
 *    pages, like a device BAR or a carve-out: the pages are marked
 *    PageReserved, each client page is mapped by its physical address
 *    with dma_map_resource(), and the core's table carries no page
 *    pointers at all (sg_set_page(sg, NULL, ...), as nvidia-peermem
 *    fills its table); only its DMA view means anything.
 *
 * Module parameters: source, name, invalidate, unmaps
 * (PEER_MEM_INVALIDATE_UNMAPS through the extended registration), page_kb
 * (client page size), cpu_pages (above), twin (register a second client of
 * the same name after the first; see twin_* below).
 *
 * debugfs peer_refclient/: live_allocs, live_mem_bytes (refmem memory not
 * yet freed), live_pins, live_maps (all 0 when nothing is in use),
 * last_ticket, last_nents (the DMA entries the last dma_map() reported),
 * invalidate_ticket (write a ticket: the client calls the core's
 * invalidate with it), last_invalidate_ret, invalidate_done (how many of
 * the client's calls of the core's invalidate have returned, with the
 * client's own unmapping after them when unmaps=1), race_invalidate
 * (write 1: the next get_pages() starts an invalidation of its mapping
 * from a work item and waits 100 ms before returning, so the invalidation
 * reaches the core before the driver activated its notifier; write 2: the
 * same from a SCHED_FIFO thread bound to the CPU that called get_pages(),
 * so that it runs as soon as the core unlocks the mapping and before the
 * core's thread goes on), invalidate_in_unmap (unmaps=1; write 1: the
 * next dma_unmap() first has a work item invalidate that mapping and waits
 * for it, i.e. an invalidation between the core's stop and its unmapping),
 * late_core_calls (dma_unmap()/put_pages() calls the core made for a
 * mapping after the client's invalidate call for it had returned),
 * late_restores (mappings whose table the core rewrote after that point),
 * bad_entry (write N: the next dma_map() hands the core a bus address
 * nobody mapped for DMA entry N; reads -1 when disarmed), bad_offset and
 * bad_len (where that entry lies in the mapping), acquire_ret (what a
 * claiming acquire() returns, default 1), decline (write 1: acquire()
 * writes a marker into *client_context and returns 0), acquire_calls,
 * ctx_on_entry (*client_context as the last acquire() found it), and for
 * twin=1 twin_acquire_calls, twin_claims, twin_ctx_on_entry.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/kthread.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/scatterlist.h>
#include <linux/sched.h>
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
MODULE_PARM_DESC(cpu_pages, "1: RAM with struct pages, mapped with dma_map_sgtable; 0 (refmem only): reserved memory mapped by physical address with dma_map_resource, no page pointers in the table (default 1)");

static bool twin;
module_param(twin, bool, 0444);
MODULE_PARM_DESC(twin, "also register a second client of the same name, after the first (default 0)");

/* Where bad_entry points an entry: no IOVA the DMA API hands out (< 4 GiB first). */
#define REF_BAD_BUS 0x7f0000000000ULL
/* What decline leaves in *client_context. */
#define REF_DECLINE_MARK ((void *)0x7265666c64636cUL)

static unsigned long psize;		/* client page size in bytes */
static unsigned int porder;		/* its page order */

/* One registration with the core: the client, or its twin. */
struct ref_reg {
	struct ref_peer_client_ex client;
	void *handle;
	ref_invalidate_fn invalidate;
	atomic_t acquire_calls;
	atomic_t claims;
	u64 ctx_on_entry;
};
static struct ref_reg regs[2];		/* [0] the client, [1] its twin */
static struct dentry *dbg_dir;

/* Protects ref_pins and every alloc's dead/freed/npins/mappers. */
static DEFINE_MUTEX(ref_lock);
static LIST_HEAD(ref_pins);		/* every pinning ref_ctx */
static atomic_t live_allocs = ATOMIC_INIT(0);
static atomic_t live_pins = ATOMIC_INIT(0);
static atomic_t live_maps = ATOMIC_INIT(0);
static atomic_long_t live_mem_bytes = ATOMIC_LONG_INIT(0);
static u64 last_ticket = ~0ULL;
static atomic_t last_nents = ATOMIC_INIT(0);
static int last_invalidate_ret;
static atomic_t invalidate_done = ATOMIC_INIT(0);	/* core invalidate calls returned */
static atomic_t race_armed = ATOMIC_INIT(0);
static atomic_t inval_in_unmap = ATOMIC_INIT(0);
static atomic_t late_core_calls = ATOMIC_INIT(0);
static atomic_t late_restores = ATOMIC_INIT(0);
static atomic_t bad_entry = ATOMIC_INIT(-1);
static u64 bad_offset, bad_len;
static atomic_t acquire_ret = ATOMIC_INIT(1);
static atomic_t decline = ATOMIC_INIT(0);
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

/* Entry 0 and entry nents-1 of the core's table, as the client last saw them. */
struct ref_sg_snap {
	dma_addr_t addr[2];
	unsigned int dma_len[2], len[2];
};

/*
 * struct ref_ctx - one acquire()d range
 *
 * Invariants: @ref counts the core (acquire() until release()), any free
 * path working on it, and (source=gpusim, @pin_ref) a pin whose free
 * callback may still come. @pinned, @mapped and the tables change under
 * @lock; while @pinned the context is on ref_pins and counted in
 * @alloc->npins. @map (or @res) is the client's own DMA mapping, live while
 * @mapped; @core is the table handed to the core, allocated from a
 * successful dma_map() until the context dies.
 */
struct ref_ctx {
	struct kref ref;
	struct mutex lock;
	struct ref_reg *reg;		/* the registration that claimed it */
	struct ref_alloc *alloc;
	unsigned long addr;
	size_t size;
	unsigned long first, count;	/* chunk range */
	unsigned long chunk;		/* bytes per chunk */
	u64 ticket;
	bool pinned;
	bool mapped;
	struct device *dma_dev;
	struct sg_table map;		/* cpu_pages=1: our mapped table */
	dma_addr_t *res;		/* cpu_pages=0: dma_map_resource() addresses */
	struct sg_table core;		/* the table the core got */
	bool inval_returned;		/* our invalidate call for it returned */
	bool snapped;			/* @snap taken at that point */
	bool restore_seen;		/* counted in late_restores */
	struct ref_sg_snap snap;
	/* source=gpusim */
	u64 va, len;			/* the 64 KiB-aligned pinned range */
	struct ref_p2p_page_table *pt;
	bool pin_ref;			/* the pin holds a reference on us */
	pid_t pin_tgid;			/* the process that pinned it (gpusim) */
	/*
	 * put_pages came from another process or a kernel thread (an
	 * invalidation from the race thread): NVIDIA's driver ignores a put of
	 * a pin with a free callback there, so release() makes it (or the free
	 * callback takes the table).
	 */
	bool put_deferred;
	bool cb_started;		/* gpusim's free callback began */
	struct task_struct *cb_task;	/* the thread running it */
	struct list_head pin_node;
	struct list_head free_node;	/* on a free path's private list */
	struct work_struct race_work;	/* see race_invalidate */
	struct work_struct unmap_work;	/* see invalidate_in_unmap */
};

static void ref_chunk_free(struct page *page)
{
	unsigned long i;

	if (!cpu_pages)
		for (i = 0; i < (1UL << porder); i++)
			ClearPageReserved(page + i);
	__free_pages(page, porder);
	atomic_long_sub(psize, &live_mem_bytes);
}

static void ref_alloc_free_pages(struct ref_alloc *a)
{
	unsigned long i;

	lockdep_assert_held(&ref_lock);
	if (a->freed)
		return;
	for (i = 0; i < a->nchunks; i++)
		if (a->chunks[i])
			ref_chunk_free(a->chunks[i]);
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

	/* Only now: the core may use its table until release(). */
	if (c->core.sgl)
		sg_free_table(&c->core);
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

/* Undo our own DMA mapping of the context (c->lock held). */
static void ref_unmap_locked(struct ref_ctx *c)
{
	unsigned long i;

	lockdep_assert_held(&c->lock);
	if (!c->mapped)
		return;
	if (c->res) {
		for (i = 0; i < c->count; i++)
			dma_unmap_resource(c->dma_dev, c->res[i], c->chunk,
					   DMA_BIDIRECTIONAL, 0);
		kvfree(c->res);
		c->res = NULL;
	} else {
		dma_unmap_sgtable(c->dma_dev, &c->map, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&c->map);
		memset(&c->map, 0, sizeof(c->map));
	}
	c->mapped = false;
	atomic_dec(&live_maps);
}

/*
 * Give up the pin of a context (c->lock held, c->pinned). Returns true if
 * the caller must drop the pin's reference on the context.
 */
static bool ref_unpin_locked(struct ref_ctx *c)
{
	bool drop = false;

	lockdep_assert_held(&c->lock);
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
	} else if (use_gpusim && !c->cb_started && c->cb_task != current &&
		   current->tgid != c->pin_tgid) {
		c->put_deferred = true;
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

/* Entry 0 and entry nents-1 of the core's table (c->lock held). */
static void ref_snap_take(struct ref_ctx *c, struct ref_sg_snap *s)
{
	struct scatterlist *sg;
	unsigned int i, last = c->core.nents - 1;

	memset(s, 0, sizeof(*s));
	for_each_sg(c->core.sgl, sg, c->core.nents, i) {
		int k = i == 0 ? 0 : 1;

		if (i != 0 && i != last)
			continue;
		s->addr[k] = sg_dma_address(sg);
		s->dma_len[k] = sg_dma_len(sg);
		s->len[k] = sg->length;
		if (i == 0 && last == 0) {
			s->addr[1] = s->addr[0];
			s->dma_len[1] = s->dma_len[0];
			s->len[1] = s->len[0];
		}
	}
}

/*
 * The core uses the context after our invalidate call for it returned
 * (c->lock held): count the call, and whether the core rewrote its table
 * since that moment (it restores trimmed entries).
 */
static void ref_note_late(struct ref_ctx *c, bool call)
{
	struct ref_sg_snap now;

	lockdep_assert_held(&c->lock);
	if (!c->inval_returned)
		return;
	if (call)
		atomic_inc(&late_core_calls);
	if (!c->snapped || c->restore_seen || !c->core.sgl)
		return;
	ref_snap_take(c, &now);
	if (memcmp(&now, &c->snap, sizeof(now))) {
		c->restore_seen = true;
		atomic_inc(&late_restores);
	}
}

/* Unmap and unpin the context, if nobody did yet (client-side unmap). */
static void ref_ctx_unmap_put(struct ref_ctx *c)
{
	bool drop = false;

	mutex_lock(&c->lock);
	ref_unmap_locked(c);
	if (c->pinned)
		drop = ref_unpin_locked(c);
	mutex_unlock(&c->lock);
	if (drop)
		kref_put(&c->ref, ref_ctx_release);
}

/*
 * Invalidate one pinned context through the core. No lock of ours may be
 * held: the core's invalidate may call our dma_unmap/put_pages. With
 * PEER_MEM_INVALIDATE_UNMAPS the pages are ours to unmap and put after it;
 * the table the core got stays allocated (see ref_ctx_release()).
 */
static void ref_invalidate_ctx(struct ref_ctx *c)
{
	last_invalidate_ret = c->reg->invalidate(c->reg->handle, c->ticket);
	mutex_lock(&c->lock);
	c->inval_returned = true;
	if (c->core.sgl && !c->snapped) {
		ref_snap_take(c, &c->snap);
		c->snapped = true;
	}
	mutex_unlock(&c->lock);
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

static int ref_race_thread(void *data)
{
	struct ref_ctx *c = data;

	ref_invalidate_ctx(c);
	kref_put(&c->ref, ref_ctx_release);
	module_put_and_kthread_exit(0);
}

/*
 * Called at the end of a successful get_pages(): if armed, start an
 * invalidation of this mapping from another thread and give it time to
 * reach the core, which must hold it until the driver's mapping is live.
 */
static void ref_maybe_race(struct ref_ctx *c)
{
	struct task_struct *t;
	int mode;

	if (!invalidate)
		return;
	mode = atomic_xchg(&race_armed, 0);
	if (!mode)
		return;
	kref_get(&c->ref);
	if (mode == 2) {
		/* A real-time thread on this CPU: first to run at each wakeup. */
		__module_get(THIS_MODULE);
		t = kthread_create(ref_race_thread, c, "refclient-race");
		if (IS_ERR(t)) {
			module_put(THIS_MODULE);
			pr_err("cannot start the race thread (%ld); invalidating from a work item\n",
			       PTR_ERR(t));
		} else {
			kthread_bind(t, raw_smp_processor_id());
			sched_set_fifo(t);
			wake_up_process(t);
			msleep(100);
			return;
		}
	}
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
	unsigned long i, j;
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
		/* Not the kernel's pages any more: a carve-out, as far as DMA goes. */
		if (!cpu_pages)
			for (j = 0; j < (1UL << porder); j++)
				SetPageReserved(a->chunks[i] + j);
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

static struct ref_ctx *ref_ctx_new(struct ref_reg *reg, unsigned long addr,
				   size_t size)
{
	struct ref_ctx *c = kzalloc(sizeof(*c), GFP_KERNEL);

	if (!c)
		return NULL;
	kref_init(&c->ref);
	mutex_init(&c->lock);
	c->reg = reg;
	c->addr = addr;
	c->size = size;
	return c;
}

static void gs_probe_cb(void *data)
{
}

/* Is the range gpusim memory of the calling process? Pin and unpin it. */
static int gs_acquire(struct ref_reg *reg, unsigned long addr, size_t size,
		      void **ctx)
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

	c = ref_ctx_new(reg, addr, size);
	if (!c)
		return -ENOMEM;
	c->va = va;
	c->len = end - va;
	c->chunk = GS_PAGE;
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

static int ref_do_acquire(struct ref_reg *reg, unsigned long addr,
			  size_t size, void **ctx)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct ref_alloc *a = NULL;
	struct ref_ctx *c;
	int ret;

	/* OFED leaves garbage here (the rig a poison value): note it. */
	WRITE_ONCE(reg->ctx_on_entry, (u64)(uintptr_t)*ctx);
	atomic_inc(&reg->acquire_calls);
	if (!mm || !size || addr + size < addr)
		return 0;
	if (reg == &regs[0] && atomic_read(&decline)) {
		*ctx = REF_DECLINE_MARK;
		return 0;
	}
	if (use_gpusim) {
		ret = gs_acquire(reg, addr, size, ctx);
	} else {
		mmap_read_lock(mm);
		vma = vma_lookup(mm, addr);
		if (vma && vma->vm_ops == &ref_vm_ops &&
		    addr + size <= vma->vm_end) {
			a = vma->vm_private_data;
			kref_get(&a->ref);
		}
		mmap_read_unlock(mm);
		if (!a)
			return 0;

		c = ref_ctx_new(reg, addr, size);
		if (!c) {
			kref_put(&a->ref, ref_alloc_release);
			return -ENOMEM;
		}
		c->alloc = a;
		c->chunk = psize;
		c->first = (ALIGN_DOWN(addr, psize) - a->start) / psize;
		c->count = (ALIGN(addr + size, psize) -
			    ALIGN_DOWN(addr, psize)) / psize;
		*ctx = c;
		ret = 1;
	}
	if (ret <= 0)
		return ret;
	atomic_inc(&reg->claims);
	/* Any positive value claims (OFED); acquire_ret tests that. */
	return reg == &regs[0] ? atomic_read(&acquire_ret) : 1;
}

static int ref_acquire(unsigned long addr, size_t size, void *legacy1,
		       char *legacy2, void **ctx)
{
	return ref_do_acquire(&regs[0], addr, size, ctx);
}

static int ref_twin_acquire(unsigned long addr, size_t size, void *legacy1,
			    char *legacy2, void **ctx)
{
	return ref_do_acquire(&regs[1], addr, size, ctx);
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
	c->pin_tgid = current->tgid;
	if (!REF_P2P_PAGE_TABLE_OK(pt->version) ||
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

/* The page of chunk i of the context (c->lock held, pinned). */
static struct page *ref_chunk_page(struct ref_ctx *c, unsigned long i)
{
	if (use_gpusim)
		return pfn_to_page(c->pt->pages[i]->physical_address >>
				   PAGE_SHIFT);
	return c->alloc->chunks[c->first + i];
}

/*
 * Our own DMA mapping of the context's chunks for @dev (c->lock held):
 * c->map (cpu_pages=1) or c->res (cpu_pages=0).
 */
static int ref_map_own(struct ref_ctx *c, struct device *dev)
{
	unsigned long i;
	struct scatterlist *sg;
	int ret;

	if (!cpu_pages) {
		c->res = kvcalloc(c->count, sizeof(*c->res), GFP_KERNEL);
		if (!c->res)
			return -ENOMEM;
		for (i = 0; i < c->count; i++) {
			c->res[i] = dma_map_resource(dev,
					page_to_phys(ref_chunk_page(c, i)),
					c->chunk, DMA_BIDIRECTIONAL, 0);
			if (dma_mapping_error(dev, c->res[i])) {
				while (i--)
					dma_unmap_resource(dev, c->res[i],
							   c->chunk,
							   DMA_BIDIRECTIONAL, 0);
				kvfree(c->res);
				c->res = NULL;
				return -EIO;
			}
		}
		return 0;
	}
	ret = sg_alloc_table(&c->map, c->count, GFP_KERNEL);
	if (ret)
		return ret;
	for_each_sg(c->map.sgl, sg, c->count, i)
		sg_set_page(sg, ref_chunk_page(c, i), c->chunk, 0);
	ret = dma_map_sgtable(dev, &c->map, DMA_BIDIRECTIONAL, 0);
	if (ret) {
		sg_free_table(&c->map);
		memset(&c->map, 0, sizeof(c->map));
	}
	return ret;
}

/*
 * The table for the core (c->lock held, mapped): the CPU view of our own
 * table (pages, or none for cpu_pages=0) and a copy of its DMA entries,
 * with entry bad_entry pointing nowhere if armed.
 */
static int ref_fill_core(struct ref_ctx *c)
{
	struct scatterlist *sg, *src = c->map.sgl;
	int bad = atomic_xchg(&bad_entry, -1);
	unsigned int used = 1;
	u64 off = 0, src_off = 0;
	unsigned int i;
	int ret;

	ret = sg_alloc_table(&c->core, c->count, GFP_KERNEL);
	if (ret)
		return ret;
	for_each_sg(c->core.sgl, sg, c->count, i)
		sg_set_page(sg, c->res ? NULL : ref_chunk_page(c, i), c->chunk,
			    0);
	/*
	 * One DMA entry per chunk, whatever the DMA API merged (the device
	 * allows 2 GiB segments): a reference client keeps it simple, and
	 * bad_entry always has an entry to spoil.
	 */
	for_each_sg(c->core.sgl, sg, c->count, i) {
		if (c->res) {
			sg_dma_address(sg) = c->res[i];
		} else {
			while (src_off >= sg_dma_len(src)) {
				if (used++ >= c->map.nents) {
					sg_free_table(&c->core);
					return -EINVAL;
				}
				src = sg_next(src);
				src_off = 0;
			}
			sg_dma_address(sg) = sg_dma_address(src) + src_off;
			src_off += c->chunk;
		}
		sg_dma_len(sg) = c->chunk;
		if (i == bad) {
			bad_offset = off;
			bad_len = sg_dma_len(sg);
			sg_dma_address(sg) = REF_BAD_BUS + off;
			pr_info("bad_entry: DMA entry %u ([%#llx, +%#llx) of the mapping) handed out as bus address %#llx, which nobody mapped\n",
				i, off, bad_len, REF_BAD_BUS + off);
		}
		off += sg_dma_len(sg);
	}
	c->core.nents = c->count;
	return 0;
}

static int ref_dma_map(struct sg_table *sgt, void *ctx, struct device *dev,
		       int legacy_dmasync, int *nmap)
{
	struct ref_ctx *c = ctx;
	unsigned long i;
	int ret;

	/* The core names the HCA's DMA device; a NULL one is a core bug. */
	if (!dev)
		return -EINVAL;

	mutex_lock(&c->lock);
	if (!c->pinned || c->mapped || c->core.sgl || (use_gpusim && !c->pt)) {
		ret = -EINVAL;
		goto out;
	}
	if (use_gpusim) {
		/* gpusim's GPU pages are RAM; a real GPU's BAR pages are not. */
		for (i = 0; i < c->count; i++) {
			unsigned long pfn = c->pt->pages[i]->physical_address >>
					    PAGE_SHIFT;

			if (!pfn_valid(pfn)) {
				ret = -EOPNOTSUPP;
				goto out;
			}
		}
	}
	ret = ref_map_own(c, dev);
	if (ret)
		goto out;
	c->dma_dev = dev;
	c->mapped = true;
	atomic_inc(&live_maps);
	ret = ref_fill_core(c);
	if (ret) {
		ref_unmap_locked(c);
		goto out;
	}
	*sgt = c->core;
	*nmap = c->core.nents;	/* nmap points at sgt->nents (OFED) */
	atomic_set(&last_nents, c->core.nents);
out:
	mutex_unlock(&c->lock);
	return ret;
}

/* invalidate_in_unmap: an invalidation that comes after the core's stop. */
static void ref_unmap_work(struct work_struct *work)
{
	struct ref_ctx *c = container_of(work, struct ref_ctx, unmap_work);

	ref_invalidate_ctx(c);
}

static int ref_dma_unmap(struct sg_table *sgt, void *ctx, struct device *dev)
{
	struct ref_ctx *c = ctx;

	mutex_lock(&c->lock);
	ref_note_late(c, true);
	mutex_unlock(&c->lock);
	/*
	 * Only where the core calls us without the mapping lock
	 * (PEER_MEM_INVALIDATE_UNMAPS at deregistration): an invalidation
	 * now takes the lock at once, returns, and we unmap by ourselves.
	 */
	if (unmaps && atomic_xchg(&inval_in_unmap, 0)) {
		INIT_WORK(&c->unmap_work, ref_unmap_work);
		queue_work(ref_wq, &c->unmap_work);
		flush_work(&c->unmap_work);
	}
	mutex_lock(&c->lock);
	if (sgt->sgl != c->core.sgl)
		pr_err("dma_unmap got a table we did not fill\n");
	if (dev != c->dma_dev && c->mapped)
		pr_err("dma_unmap for another device than dma_map\n");
	ref_unmap_locked(c);
	mutex_unlock(&c->lock);
	return 0;
}

static void ref_put_pages(struct sg_table *sgt, void *ctx)
{
	struct ref_ctx *c = ctx;
	bool drop = false;

	mutex_lock(&c->lock);
	ref_note_late(c, true);
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
	struct ref_p2p_page_table *pt = NULL;
	bool drop = false;

	/* A put deferred to the pinning process (put_deferred), no lock held. */
	mutex_lock(&c->lock);
	if (c->put_deferred && c->pt && !c->cb_started && current->tgid == c->pin_tgid)
		pt = c->pt;
	c->put_deferred = false;
	mutex_unlock(&c->lock);
	if (pt && !p2p_put_pages(0, 0, c->va, pt)) {
		mutex_lock(&c->lock);
		if (c->pt == pt) {
			c->pt = NULL;
			drop = c->pin_ref;
			c->pin_ref = false;
		}
		mutex_unlock(&c->lock);
	}
	if (drop)
		kref_put(&c->ref, ref_ctx_release);

	mutex_lock(&c->lock);
	ref_note_late(c, false);
	if (c->mapped || c->pinned)
		pr_err("release before dma_unmap/put_pages\n");
	mutex_unlock(&c->lock);
	kref_put(&c->ref, ref_ctx_release);
}

/* ---- debugfs ---- */

static int ref_atomic_get(void *data, u64 *val)
{
	*val = (u64)(s64)atomic_read(data);
	return 0;
}

static int ref_atomic_set(void *data, u64 val)
{
	atomic_set(data, (int)val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE_SIGNED(ref_atomic_fops, ref_atomic_get, NULL,
				"%lld\n");
DEFINE_DEBUGFS_ATTRIBUTE_SIGNED(ref_atomic_rw_fops, ref_atomic_get,
				ref_atomic_set, "%lld\n");

static int ref_long_get(void *data, u64 *val)
{
	*val = atomic_long_read(data);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_long_fops, ref_long_get, NULL, "%llu\n");

static int ref_u64_get(void *data, u64 *val)
{
	*val = READ_ONCE(*(u64 *)data);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_u64_fops, ref_u64_get, NULL, "%llu\n");
DEFINE_DEBUGFS_ATTRIBUTE(ref_x64_fops, ref_u64_get, NULL, "0x%016llx\n");

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

	if (!regs[0].invalidate)
		return -EOPNOTSUPP;
	mutex_lock(&ref_lock);
	list_for_each_entry(c, &ref_pins, pin_node) {
		if (c->reg == &regs[0] && c->ticket == val) {
			found = c;
			kref_get(&c->ref);
			break;
		}
	}
	mutex_unlock(&ref_lock);
	if (!found) {
		last_invalidate_ret = regs[0].invalidate(regs[0].handle, val);
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
	if (!regs[0].invalidate)
		return -EOPNOTSUPP;
	if (val > 2)
		return -EINVAL;
	atomic_set(&race_armed, val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_race_fops, NULL, ref_race_set, "%llu\n");

static int ref_inval_in_unmap_set(void *data, u64 val)
{
	if (!unmaps)
		return -EOPNOTSUPP;	/* dma_unmap runs under the mapping lock */
	atomic_set(&inval_in_unmap, !!val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(ref_inval_in_unmap_fops, NULL,
			 ref_inval_in_unmap_set, "%llu\n");

static int ref_acquire_ret_set(void *data, u64 val)
{
	if (val < 1 || val > INT_MAX)
		return -EINVAL;
	atomic_set(&acquire_ret, val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE_SIGNED(ref_acquire_ret_fops, ref_atomic_get,
				ref_acquire_ret_set, "%lld\n");

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

static void ref_reg_init(struct ref_reg *r,
			 int (*acquire)(unsigned long, size_t, void *, char *,
					void **))
{
	struct ref_peer_client *cl = &r->client.client;

	strscpy(cl->name, name, REF_NAME_LEN);
	strscpy(cl->version, "1.0", REF_VERSION_LEN);
	cl->acquire = acquire;
	cl->get_pages = ref_get_pages;
	cl->dma_map = ref_dma_map;
	cl->dma_unmap = ref_dma_unmap;
	cl->put_pages = ref_put_pages;
	cl->get_page_size = ref_get_page_size;
	cl->release = ref_release;
	if (unmaps) {
		cl->version[REF_VERSION_LEN - 1] = 1;
		r->client.ex_size = sizeof(r->client);
		r->client.flags = REF_FLAG_INVALIDATE_UNMAPS;
	}
	r->ctx_on_entry = 0;
}

/* Register @r; 0, or -EBUSY if the core refused it. */
static int ref_reg_register(struct ref_reg *r, const char *what)
{
	r->handle = ib_register_peer_memory_client(&r->client.client,
						   invalidate ? &r->invalidate : NULL);
	if (!r->handle) {
		pr_err("the RDMA core refused the registration of %s %s; see the peer_mem messages above\n",
		       what, name);
		return -EBUSY;
	}
	if (invalidate && !r->invalidate) {
		pr_err("the core did not hand out its invalidate function to %s %s\n",
		       what, name);
		ib_unregister_peer_memory_client(r->handle);
		r->handle = NULL;
		return -EINVAL;
	}
	return 0;
}

static void ref_debugfs_add(void)
{
	static const struct {
		const char *name;
		umode_t mode;
		void *data;
		const struct file_operations *fops;
	} files[] = {
		{ "live_allocs", 0444, &live_allocs, &ref_atomic_fops },
		{ "live_pins", 0444, &live_pins, &ref_atomic_fops },
		{ "live_maps", 0444, &live_maps, &ref_atomic_fops },
		{ "live_mem_bytes", 0444, &live_mem_bytes, &ref_long_fops },
		{ "last_ticket", 0444, &last_ticket, &ref_u64_fops },
		{ "last_nents", 0444, &last_nents, &ref_atomic_fops },
		{ "last_invalidate_ret", 0444, NULL, &ref_last_ret_fops },
		{ "invalidate_done", 0444, &invalidate_done, &ref_atomic_fops },
		{ "invalidate_ticket", 0200, NULL, &ref_invalidate_fops },
		{ "race_invalidate", 0200, NULL, &ref_race_fops },
		{ "invalidate_in_unmap", 0200, NULL, &ref_inval_in_unmap_fops },
		{ "late_core_calls", 0444, &late_core_calls, &ref_atomic_fops },
		{ "late_restores", 0444, &late_restores, &ref_atomic_fops },
		{ "bad_entry", 0600, &bad_entry, &ref_atomic_rw_fops },
		{ "bad_offset", 0444, &bad_offset, &ref_u64_fops },
		{ "bad_len", 0444, &bad_len, &ref_u64_fops },
		{ "acquire_ret", 0600, &acquire_ret, &ref_acquire_ret_fops },
		{ "decline", 0600, &decline, &ref_atomic_rw_fops },
		{ "acquire_calls", 0444, &regs[0].acquire_calls, &ref_atomic_fops },
		{ "ctx_on_entry", 0444, &regs[0].ctx_on_entry, &ref_x64_fops },
		{ "twin_acquire_calls", 0444, &regs[1].acquire_calls, &ref_atomic_fops },
		{ "twin_claims", 0444, &regs[1].claims, &ref_atomic_fops },
		{ "twin_ctx_on_entry", 0444, &regs[1].ctx_on_entry, &ref_x64_fops },
	};
	int i;

	dbg_dir = debugfs_create_dir("peer_refclient", NULL);
	for (i = 0; i < ARRAY_SIZE(files); i++)
		debugfs_create_file_unsafe(files[i].name, files[i].mode,
					   dbg_dir, files[i].data,
					   files[i].fops);
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
	if (use_gpusim && !cpu_pages) {
		pr_err("cpu_pages=0 needs source=refmem (gpusim's pages are the kernel's RAM)\n");
		return -EINVAL;
	}
	if (use_gpusim) {
		ret = gs_resolve();
		if (ret)
			return ret;
	}

	ref_reg_init(&regs[0], ref_acquire);
	ref_reg_init(&regs[1], ref_twin_acquire);

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
	ret = ref_reg_register(&regs[0], "client");
	if (ret)
		goto err_misc;
	if (twin) {
		ret = ref_reg_register(&regs[1], "the second client named");
		if (ret)
			goto err_reg;
	}

	ref_debugfs_add();
	pr_info("registered as %s%s (source=%s invalidate=%d unmaps=%d page=%lu KiB cpu_pages=%d)\n",
		name, twin ? " twice" : "", source, invalidate, unmaps,
		(use_gpusim ? GS_PAGE : psize) / 1024, cpu_pages);
	return 0;

err_reg:
	ib_unregister_peer_memory_client(regs[0].handle);
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
	if (regs[1].handle)
		ib_unregister_peer_memory_client(regs[1].handle);
	ib_unregister_peer_memory_client(regs[0].handle);
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
