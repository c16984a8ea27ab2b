// SPDX-License-Identifier: GPL-2.0
/*
 * pfnmap_exporter - the rig's stand-in for a data-acquisition driver: it
 * owns a contiguous RAM ring the page allocator does not manage and maps
 * it to user space with remap_pfn_range() (VM_IO | VM_PFNMAP), as FPGA and
 * frame-grabber drivers map a memmap=/reserved-memory region. peermem's
 * PFN-map source (docs/module.md, "PFN-mapped memory") is tested on it.
 *
 * The rig kernel has no CMA and no CONFIG_CONTIG_ALLOC, and the boot
 * command line of scripts/vm.sh carries no memmap=: the buffer is built
 * from high-order page allocations (4 MiB pieces, each physically
 * contiguous) with PageReserved set on every page, which is what a
 * memmap=/reserved-memory region looks like to the rest of the kernel
 * (pfn_valid, PageReserved, never freed to the page allocator while the
 * driver has it). Without PFNMAP_RESERVED the pages stay ordinary kernel
 * pages: what a driver maps from a kmalloc/alloc_pages buffer, which a
 * PFN-map client must refuse (it cannot tell who frees them).
 *
 * Like a correct driver it zaps every user mapping (unmap_mapping_range)
 * before the memory changes hands (PFNMAP_IOC_REALLOC, _FREE), so the
 * kernel's MMU notifiers see the change first. See pfnmap_uapi.h for the
 * commands. One buffer at a time, serialized by a mutex.
 */
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "pfnmap_uapi.h"

/* A buffer (pfnmap_uapi.h); one copy (READ/WRITE) or window at most PFNMAP_IO_MAX. */
#define PFNMAP_MAX_LEN (1ULL << 30)
#define PFNMAP_IO_MAX (64ULL << 20)
/* 4 MiB pieces: the largest order the buddy allocator hands out on x86-64. */
#define PFNMAP_CHUNK_ORDER min(MAX_PAGE_ORDER, 10)
#define PFNMAP_CHUNK_BYTES (PAGE_SIZE << PFNMAP_CHUNK_ORDER)

struct pfnmap_chunk {
	struct page *page;
	unsigned int order;
};

struct pfnmap_buf {
	u64 len;
	u32 flags;
	u32 nchunks;
	struct pfnmap_chunk chunks[];
};

static DEFINE_MUTEX(pfnmap_lock);
static struct pfnmap_buf *pfnmap_cur, *pfnmap_old;
static struct address_space *pfnmap_mapping;	/* of the device inode, once opened */
static u32 pfnmap_zaps;
static struct pfnmap_window pfnmap_win;	/* PFNMAP_IOC_WINDOW; len 0: none */

/* PFNMAP_IOC_HOG (pfnmap_uapi.h) */
struct pfnmap_hog_item {
	struct work_struct work;
	struct list_head node;
};

static DEFINE_MUTEX(pfnmap_hog_lock);	/* the list, the queue, release */
static LIST_HEAD(pfnmap_hogs);
static struct workqueue_struct *pfnmap_hog_wq;
static DECLARE_WAIT_QUEUE_HEAD(pfnmap_hog_wait);
static bool pfnmap_hog_go;
static atomic_t pfnmap_hog_running = ATOMIC_INIT(0);

static void pfnmap_hog_fn(struct work_struct *work)
{
	atomic_inc(&pfnmap_hog_running);
	wait_event(pfnmap_hog_wait, READ_ONCE(pfnmap_hog_go));
	atomic_dec(&pfnmap_hog_running);
}

/* Releases every hog and waits until none runs; pfnmap_hog_lock held. */
static void pfnmap_hog_release(void)
{
	struct pfnmap_hog_item *h, *tmp;

	if (!pfnmap_hog_wq)
		return;
	WRITE_ONCE(pfnmap_hog_go, true);
	wake_up_all(&pfnmap_hog_wait);
	flush_workqueue(pfnmap_hog_wq);
	list_for_each_entry_safe(h, tmp, &pfnmap_hogs, node) {
		list_del(&h->node);
		kfree(h);
	}
	WRITE_ONCE(pfnmap_hog_go, false);
}

static long pfnmap_hog(struct pfnmap_hog __user *argp)
{
	struct pfnmap_hog_item *h;
	struct pfnmap_hog hog;
	u32 n = 0, i;
	long ret = 0;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (copy_from_user(&hog, argp, sizeof(hog)))
		return -EFAULT;
	mutex_lock(&pfnmap_hog_lock);
	if (hog.release)
		pfnmap_hog_release();
	list_for_each_entry(h, &pfnmap_hogs, node)
		n++;
	if (hog.add > PFNMAP_HOG_MAX - n) {
		ret = -EINVAL;
		goto out;
	}
	if (hog.add && !pfnmap_hog_wq) {
		/* Unbound, default attributes, no rescuer. */
		pfnmap_hog_wq = alloc_workqueue("pfnmap_hog", WQ_UNBOUND, 0);
		if (!pfnmap_hog_wq) {
			ret = -ENOMEM;
			goto out;
		}
	}
	for (i = 0; i < hog.add; i++) {
		h = kzalloc(sizeof(*h), GFP_KERNEL);
		if (!h) {
			ret = -ENOMEM;
			break;
		}
		INIT_WORK(&h->work, pfnmap_hog_fn);
		list_add(&h->node, &pfnmap_hogs);
		queue_work(pfnmap_hog_wq, &h->work);
		n++;
	}
	hog.queued = n;
	hog.running = atomic_read(&pfnmap_hog_running);
	if (!ret && copy_to_user(argp, &hog, sizeof(hog)))
		ret = -EFAULT;
out:
	mutex_unlock(&pfnmap_hog_lock);
	return ret;
}

static void pfnmap_buf_free(struct pfnmap_buf *b)
{
	u32 i;

	if (!b)
		return;
	for (i = 0; i < b->nchunks; i++) {
		struct page *p = b->chunks[i].page;
		unsigned long n = 1UL << b->chunks[i].order, j;

		if (b->flags & PFNMAP_RESERVED)
			for (j = 0; j < n; j++)
				ClearPageReserved(p + j);
		__free_pages(p, b->chunks[i].order);
	}
	kfree(b);
}

static struct pfnmap_buf *pfnmap_buf_alloc(u64 len, u32 flags, u8 fill)
{
	u32 n = DIV_ROUND_UP(len, PFNMAP_CHUNK_BYTES), i;
	struct pfnmap_buf *b;
	u64 left = len;

	b = kzalloc(struct_size(b, chunks, n), GFP_KERNEL);
	if (!b)
		return NULL;
	b->len = len;
	b->flags = flags;
	for (i = 0; i < n; i++) {
		unsigned int order = get_order(min_t(u64, left, PFNMAP_CHUNK_BYTES));
		unsigned long j;
		struct page *p;

		p = alloc_pages(GFP_KERNEL | __GFP_NOWARN, order);
		if (!p)
			goto fail;
		b->chunks[i].page = p;
		b->chunks[i].order = order;
		b->nchunks = i + 1;
		memset(page_address(p), fill, PAGE_SIZE << order);
		if (flags & PFNMAP_RESERVED)
			for (j = 0; j < (1UL << order); j++)
				SetPageReserved(p + j);
		left -= min_t(u64, left, PAGE_SIZE << order);
	}
	return b;
fail:
	pfnmap_buf_free(b);
	return NULL;
}

/* The kernel address of byte off of b (the buffer's CPU view). */
static u8 *pfnmap_buf_addr(struct pfnmap_buf *b, u64 off, u64 *room)
{
	u32 i = off / PFNMAP_CHUNK_BYTES;
	u64 in = off % PFNMAP_CHUNK_BYTES;

	*room = (PAGE_SIZE << b->chunks[i].order) - in;
	return (u8 *)page_address(b->chunks[i].page) + in;
}

static void pfnmap_zap(void)
{
	/* Every user mapping of the device, as a driver does before reuse. */
	if (pfnmap_mapping)
		unmap_mapping_range(pfnmap_mapping, 0, 0, 1);
	pfnmap_zaps++;
}

/* PFNMAP_REPEAT_OFFSET, PFNMAP_SCATTER_OFFSET (pfnmap_uapi.h); under pfnmap_lock. */
static int pfnmap_mmap_alias(struct vm_area_struct *vma, bool scatter)
{
	unsigned long addr = vma->vm_start, end = vma->vm_end;
	struct pfnmap_buf *b = pfnmap_cur;
	int ret = 0;

	if (!b || end - addr > PFNMAP_ALIAS_MAX || !(vma->vm_flags & VM_SHARED) ||
	    (scatter && b->len < 3 * PAGE_SIZE))
		return -EINVAL;
	if (scatter) {
		unsigned long pfn = page_to_pfn(b->chunks[0].page), i;

		/* Same chunk: pages 0 and 2 of the buffer are pfn and pfn + 2. */
		if (b->chunks[0].order < 2)
			return -EINVAL;
		for (i = 0; addr < end && !ret; i++, addr += PAGE_SIZE) {
			ret = remap_pfn_range(vma, addr, pfn + 2 * (i % 2), PAGE_SIZE,
					      vma->vm_page_prot);
			if (!(i % 4096))
				cond_resched();
		}
		return ret;
	}
	while (addr < end && !ret) {
		u32 i;

		for (i = 0; i < b->nchunks && addr < end && !ret; i++) {
			unsigned long n = min_t(unsigned long, PAGE_SIZE << b->chunks[i].order,
						end - addr);

			ret = remap_pfn_range(vma, addr, page_to_pfn(b->chunks[i].page), n,
					      vma->vm_page_prot);
			addr += n;
		}
		cond_resched();
	}
	return ret;
}

static int pfnmap_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start, addr = vma->vm_start;
	struct pfnmap_buf *b;
	int ret = 0;
	u32 i;

	if (vma->vm_pgoff == PFNMAP_WINDOW_OFFSET >> PAGE_SHIFT) {
		mutex_lock(&pfnmap_lock);
		if (!pfnmap_win.len || len != pfnmap_win.len)
			ret = -EINVAL;
		else
			ret = io_remap_pfn_range(vma, addr, PHYS_PFN(pfnmap_win.phys), len,
						 pgprot_noncached(vma->vm_page_prot));
		mutex_unlock(&pfnmap_lock);
		return ret;
	}
	if (vma->vm_pgoff == PFNMAP_REPEAT_OFFSET >> PAGE_SHIFT ||
	    vma->vm_pgoff == PFNMAP_SCATTER_OFFSET >> PAGE_SHIFT) {
		mutex_lock(&pfnmap_lock);
		ret = pfnmap_mmap_alias(vma, vma->vm_pgoff == PFNMAP_SCATTER_OFFSET >> PAGE_SHIFT);
		mutex_unlock(&pfnmap_lock);
		return ret;
	}
	if (vma->vm_pgoff)
		return -EINVAL;
	mutex_lock(&pfnmap_lock);
	b = pfnmap_cur;
	/* The whole buffer or its beginning (as perftest's --mmap maps its own size). */
	if (!b || len > b->len) {
		ret = b ? -EINVAL : -ENOMEM;
		goto out;
	}
	for (i = 0; i < b->nchunks && !ret && addr < vma->vm_end; i++) {
		unsigned long n = min_t(unsigned long, PAGE_SIZE << b->chunks[i].order,
					vma->vm_end - addr);

		ret = remap_pfn_range(vma, addr, page_to_pfn(b->chunks[i].page), n,
				      vma->vm_page_prot);
		addr += n;
	}
out:
	mutex_unlock(&pfnmap_lock);
	return ret;
}

static int pfnmap_open(struct inode *inode, struct file *file)
{
	mutex_lock(&pfnmap_lock);
	pfnmap_mapping = file->f_mapping;
	mutex_unlock(&pfnmap_lock);
	return 0;
}

/*
 * User memory is copied outside pfnmap_lock (through a bounce buffer):
 * mmap() takes the lock under the mmap lock, a fault would take them the
 * other way round.
 */
static long pfnmap_rw(struct pfnmap_rw __user *argp, bool write)
{
	struct pfnmap_rw a;
	struct pfnmap_buf *b;
	u64 off, left;
	long ret = 0;
	u8 *bounce;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	if (!a.len || a.len > PFNMAP_IO_MAX)
		return -EINVAL;
	bounce = kvmalloc(a.len, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;
	if (write && copy_from_user(bounce, u64_to_user_ptr(a.uaddr), a.len)) {
		ret = -EFAULT;
		goto free;
	}
	mutex_lock(&pfnmap_lock);
	b = a.old ? pfnmap_old : pfnmap_cur;
	if (!b || a.off > b->len || a.len > b->len - a.off) {
		ret = b ? -EINVAL : -ENOENT;
		goto unlock;
	}
	for (off = 0, left = a.len; left; ) {
		u64 room, n;
		u8 *k = pfnmap_buf_addr(b, a.off + off, &room);

		n = min(room, left);
		if (write)
			memcpy(k, bounce + off, n);
		else
			memcpy(bounce + off, k, n);
		off += n;
		left -= n;
	}
unlock:
	mutex_unlock(&pfnmap_lock);
	if (!ret && !write && copy_to_user(u64_to_user_ptr(a.uaddr), bounce, a.len))
		ret = -EFAULT;
free:
	kvfree(bounce);
	return ret;
}

static long pfnmap_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *argp = (void __user *)arg;
	struct pfnmap_alloc al;
	struct pfnmap_info info;
	struct pfnmap_window win;
	struct pfnmap_buf *b;
	long ret = 0;

	switch (cmd) {
	case PFNMAP_IOC_ALLOC:
		if (copy_from_user(&al, argp, sizeof(al)))
			return -EFAULT;
		if (!al.len || al.len > PFNMAP_MAX_LEN || !PAGE_ALIGNED(al.len) ||
		    (al.flags & ~PFNMAP_RESERVED))
			return -EINVAL;
		mutex_lock(&pfnmap_lock);
		if (pfnmap_cur) {
			ret = -EBUSY;
		} else {
			pfnmap_cur = pfnmap_buf_alloc(al.len, al.flags, 0);
			if (!pfnmap_cur)
				ret = -ENOMEM;
			else
				al.chunks = pfnmap_cur->nchunks;
		}
		mutex_unlock(&pfnmap_lock);
		if (!ret && copy_to_user(argp, &al, sizeof(al)))
			ret = -EFAULT;
		return ret;
	case PFNMAP_IOC_REALLOC:
		mutex_lock(&pfnmap_lock);
		if (!pfnmap_cur) {
			ret = -ENOENT;
		} else {
			b = pfnmap_buf_alloc(pfnmap_cur->len, pfnmap_cur->flags, 0x5a);
			if (!b) {
				ret = -ENOMEM;
			} else {
				/* First the mappings go, then the memory moves. */
				pfnmap_zap();
				pfnmap_buf_free(pfnmap_old);
				pfnmap_old = pfnmap_cur;
				pfnmap_cur = b;
			}
		}
		mutex_unlock(&pfnmap_lock);
		return ret;
	case PFNMAP_IOC_ZAP:
		mutex_lock(&pfnmap_lock);
		pfnmap_zap();
		mutex_unlock(&pfnmap_lock);
		return 0;
	case PFNMAP_IOC_FREE:
		mutex_lock(&pfnmap_lock);
		pfnmap_zap();
		pfnmap_buf_free(pfnmap_cur);
		pfnmap_buf_free(pfnmap_old);
		pfnmap_cur = pfnmap_old = NULL;
		mutex_unlock(&pfnmap_lock);
		return 0;
	case PFNMAP_IOC_READ:
	case PFNMAP_IOC_WRITE:
		return pfnmap_rw(argp, cmd == PFNMAP_IOC_WRITE);
	case PFNMAP_IOC_INFO:
		memset(&info, 0, sizeof(info));
		mutex_lock(&pfnmap_lock);
		if (pfnmap_cur) {
			info.len = pfnmap_cur->len;
			info.chunks = pfnmap_cur->nchunks;
			info.first_phys = page_to_phys(pfnmap_cur->chunks[0].page);
		}
		if (pfnmap_old)
			info.old_len = pfnmap_old->len;
		info.zaps = pfnmap_zaps;
		mutex_unlock(&pfnmap_lock);
		return copy_to_user(argp, &info, sizeof(info)) ? -EFAULT : 0;
	case PFNMAP_IOC_WINDOW:
		if (!capable(CAP_SYS_RAWIO))
			return -EPERM;
		if (copy_from_user(&win, argp, sizeof(win)))
			return -EFAULT;
		if (!win.len || win.len > PFNMAP_IO_MAX || !PAGE_ALIGNED(win.len) ||
		    !PAGE_ALIGNED(win.phys) || win.phys + win.len < win.phys)
			return -EINVAL;
		mutex_lock(&pfnmap_lock);
		pfnmap_win = win;
		mutex_unlock(&pfnmap_lock);
		return 0;
	case PFNMAP_IOC_HOG:
		return pfnmap_hog(argp);
	}
	return -ENOTTY;
}

static const struct file_operations pfnmap_fops = {
	.owner = THIS_MODULE,
	.open = pfnmap_open,
	.mmap = pfnmap_mmap,
	.unlocked_ioctl = pfnmap_ioctl,
};

static struct miscdevice pfnmap_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "pfnmap_exporter",
	.fops = &pfnmap_fops,
	.mode = 0666,
};

static int __init pfnmap_init(void)
{
	return misc_register(&pfnmap_dev);
}

static void __exit pfnmap_exit(void)
{
	misc_deregister(&pfnmap_dev);
	mutex_lock(&pfnmap_hog_lock);
	pfnmap_hog_release();
	mutex_unlock(&pfnmap_hog_lock);
	if (pfnmap_hog_wq)
		destroy_workqueue(pfnmap_hog_wq);
	/* No file is open any more, so no mapping is left to zap. */
	pfnmap_buf_free(pfnmap_cur);
	pfnmap_buf_free(pfnmap_old);
}

module_init(pfnmap_init);
module_exit(pfnmap_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("peermem rig: reserved-RAM ring exported with remap_pfn_range (test fixture)");
