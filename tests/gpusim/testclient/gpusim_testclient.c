// SPDX-License-Identifier: GPL-2.0
/*
 * gpusim_testclient - a minimal third-party nvidia_p2p client, written
 * against include/nv_p2p_abi.h only and linked against gpusim through
 * KBUILD_EXTRA_SYMBOLS, as any unmodified client of the NVIDIA driver would
 * be. It exists so the gpusim tests can drive the kernel-side interface
 * from user space: see gpusim_testclient.h for the commands.
 *
 * Registrations belong to the open file. The free callback only marks its
 * registration (under the file's mutex) and never touches the page table
 * afterwards; on release, pinned registrations are put, and a put that
 * gpusim refuses because the free callback is pending is followed by
 * waiting for that callback, so the callback's data is never freed under it.
 *
 * Locking: the free callback runs under gpusim's RM lock (rm_lock=1, as in
 * NVIDIA's driver) and takes tc->lock, so tc->lock is never held across a
 * call that takes the RM lock (get_pages*, put_pages*, dma_map_pages); the
 * ioctls of one file are serialised by tc->op instead, which the callback
 * never takes. GPUSIM_TC_HOLD_LOCK breaks that rule on purpose.
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "../../../include/nv_p2p_abi.h"
#include "gpusim_testclient.h"

#define TC_GPU_PAGE (64ULL * 1024)

/*
 * The page table versions a client of each driver branch is built
 * against: 1.2 (550 to 575) and 2.0 (580 and later), whose table appends
 * a u32 flags. include/nv_p2p_abi.h declares only 1.2 for now, so 2.0 is
 * declared here, as the 1.2 table followed by its flags.
 */
#define TC_PT_VERSION_V1 0x00010002
#define TC_PT_VERSION_V2 0x00020000
struct tc_page_table_v2 {
	struct nvidia_p2p_page_table v1;
	u32 flags;
};
static_assert(sizeof(struct nvidia_p2p_page_table) == 32);
static_assert(offsetof(struct tc_page_table_v2, flags) == 32);
static_assert(sizeof(struct tc_page_table_v2) == 40);

static bool tc_pt_version_ok(const struct nvidia_p2p_page_table *pt)
{
	if (NVIDIA_P2P_MAJOR_VERSION(pt->version) == 2)
		return NVIDIA_P2P_VERSION_COMPATIBLE(pt, TC_PT_VERSION_V2);
	return NVIDIA_P2P_VERSION_COMPATIBLE(pt, TC_PT_VERSION_V1);
}

struct tc_file;

struct tc_reg {
	struct list_head node;
	struct tc_file *tc;
	u32 id;
	u32 flags;
	u64 va, len;
	/* Handed out by gpusim; only used while @pinned. */
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dma;
	/* The last mapping unmapped, kept (never dereferenced) so a test can
	 * try unmapping it again. */
	struct nvidia_p2p_dma_mapping *last_dma;
	bool persistent;
	bool pinned;
	unsigned int callbacks;
	int cb_ret;
	unsigned int cb_delay_ms;
	wait_queue_head_t wq;
};

struct tc_file {
	struct mutex op;	/* serialises the ioctls; never taken by callbacks */
	struct mutex lock;	/* protects the list and every registration */
	struct list_head regs;
	u32 next_id;
};

/* The PCI device used as DMA peer: peer=, else the first one with a DMA mask. */
static struct pci_dev *tc_peer;
static char *peer;
module_param(peer, charp, 0444);
MODULE_PARM_DESC(peer, "PCI name (e.g. 0000:00:04.0) of the device to DMA-map for; default: the first PCI device with a DMA mask");

/* Pointers that are no PCI device of this system, for GPUSIM_TC_*_PEER. */
#define TC_NOT_A_PEER (GPUSIM_TC_NULL_PEER | GPUSIM_TC_BOGUS_PEER | \
		       GPUSIM_TC_FAKE_PEER)
static u64 tc_fake_mask = DMA_BIT_MASK(64);
static struct pci_dev tc_fake_peer = {
	.dev = { .dma_mask = &tc_fake_mask },
};

/*
 * The pci_dev to pass for these flags: the real peer, NULL, what
 * to_pci_dev(NULL) yields (computed without dereferencing or offsetting a
 * NULL pointer in C), or a made-up device that only looks DMA capable.
 */
static struct pci_dev *tc_dma_peer(u32 flags)
{
	if (flags & GPUSIM_TC_NULL_PEER)
		return NULL;
	if (flags & GPUSIM_TC_BOGUS_PEER)
		return (struct pci_dev *)(0UL - offsetof(struct pci_dev, dev));
	if (flags & GPUSIM_TC_FAKE_PEER)
		return &tc_fake_peer;
	return tc_peer;
}

static struct tc_reg *tc_find(struct tc_file *tc, u32 id)
{
	struct tc_reg *r;

	list_for_each_entry(r, &tc->regs, node)
		if (r->id == id)
			return r;
	return NULL;
}

static void tc_free_callback(void *data)
{
	struct tc_reg *r = data;
	struct tc_file *tc = r->tc;

	if (r->cb_delay_ms)
		msleep(r->cb_delay_ms);
	mutex_lock(&tc->lock);
	if (r->flags & GPUSIM_TC_CB_UNMAP && r->dma) {
		r->cb_ret = nvidia_p2p_dma_unmap_pages(tc_peer, r->pt, r->dma);
		if (!r->cb_ret)
			r->cb_ret = nvidia_p2p_free_dma_mapping(r->dma);
	}
	if (r->flags & GPUSIM_TC_CB_PUT)
		r->cb_ret = nvidia_p2p_put_pages(0, 0, r->va, r->pt);
	nvidia_p2p_free_page_table(r->pt);
	/* gpusim frees the page table (and any DMA mapping) after we return. */
	r->dma = NULL;
	r->pinned = false;
	r->callbacks++;
	mutex_unlock(&tc->lock);
	wake_up_all(&r->wq);
}

static unsigned int tc_runs_pt(struct nvidia_p2p_page_table *pt)
{
	unsigned int i, runs = pt->entries ? 1 : 0;

	for (i = 1; i < pt->entries; i++)
		if (pt->pages[i]->physical_address !=
		    pt->pages[i - 1]->physical_address + TC_GPU_PAGE)
			runs++;
	return runs;
}

static unsigned int tc_runs_dma(struct nvidia_p2p_dma_mapping *m)
{
	unsigned int i, runs = m->entries ? 1 : 0;

	for (i = 1; i < m->entries; i++)
		if (m->dma_addresses[i] != m->dma_addresses[i - 1] + TC_GPU_PAGE)
			runs++;
	return runs;
}

/* DMA-contiguous runs, split at @dev's max segment size and boundary. */
static unsigned int tc_segs_dma(struct nvidia_p2p_dma_mapping *m, struct device *dev)
{
	u64 max = dma_get_max_seg_size(dev), mask = dma_get_seg_boundary(dev);
	u64 start = 0, len = 0;
	unsigned int i, segs = 0;

	for (i = 0; i < m->entries; i++) {
		u64 a = m->dma_addresses[i];

		if (len && a == start + len && len + TC_GPU_PAGE <= max &&
		    (start | mask) == ((a + TC_GPU_PAGE - 1) | mask)) {
			len += TC_GPU_PAGE;
			continue;
		}
		segs++;
		start = a;
		len = TC_GPU_PAGE;
	}
	return segs;
}

static void tc_fill(struct tc_reg *r, struct gpusim_tc_req *q)
{
	q->id = r->id;
	q->callbacks = r->callbacks;
	q->pinned = r->pinned;
	q->cb_ret = r->cb_ret;
	if (r->pinned) {
		q->entries = r->pt->entries;
		q->page_size = r->pt->page_size;
		q->version_ok = tc_pt_version_ok(r->pt);
		q->pt_version = r->pt->version;
		/* flags exist only in a version-2 table: never read them in a
		 * version-1 one (it is 32 bytes; KASAN would report it). */
		q->pt_flags = NVIDIA_P2P_MAJOR_VERSION(r->pt->version) == 2 ?
			((struct tc_page_table_v2 *)r->pt)->flags : 0;
		q->pt_bytes = ksize(r->pt);
		q->phys0 = r->pt->entries ? r->pt->pages[0]->physical_address : 0;
		q->runs = tc_runs_pt(r->pt);
		if (r->dma) {
			q->dma_entries = r->dma->entries;
			q->dma0 = r->dma->entries ? r->dma->dma_addresses[0] : 0;
			q->dma_runs = tc_runs_dma(r->dma);
			q->dma_segs = tc_peer ? tc_segs_dma(r->dma, &tc_peer->dev)
					      : q->dma_runs;
			q->version_ok &= NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(r->dma);
		}
	}
}

static int tc_put(struct tc_reg *r);

static long tc_get(struct tc_file *tc, struct gpusim_tc_req *q)
{
	struct tc_reg *r = kzalloc(sizeof(*r), GFP_KERNEL);

	if (!r)
		return -ENOMEM;
	r->tc = tc;
	r->flags = q->flags;
	r->va = q->va;
	r->len = q->len;
	r->cb_delay_ms = q->cb_delay_ms;
	r->persistent = q->flags & GPUSIM_TC_PERSISTENT;
	init_waitqueue_head(&r->wq);

	/*
	 * A callback can come as soon as get_pages registered it, before the
	 * registration is on the list: it only marks @r (under tc->lock).
	 * GPUSIM_TC_HOLD_LOCK holds tc->lock across get_pages, which the
	 * callback also takes: the lock-order cycle the RM lock exposes.
	 */
	mutex_lock(&tc->lock);
	r->id = tc->next_id++;
	if (!(q->flags & GPUSIM_TC_HOLD_LOCK))
		mutex_unlock(&tc->lock);
	if (r->persistent)
		q->ret = nvidia_p2p_get_pages_persistent(q->va, q->len, &r->pt,
			(q->flags & GPUSIM_TC_PFLAGS) ? q->p_flags :
			(q->flags & GPUSIM_TC_BAD_FLAGS) ? 1 : 0);
	else
		q->ret = nvidia_p2p_get_pages(
			(q->flags & GPUSIM_TC_TOKEN) ? 1 : 0, 0, q->va, q->len,
			&r->pt,
			(q->flags & GPUSIM_TC_NULL_CB) ? NULL : tc_free_callback,
			(q->flags & GPUSIM_TC_NULL_DATA) ? NULL : r);
	if (q->ret == 0 && !r->pt)
		q->ret = -EPROTO;	/* success must hand out a page table */
	if (q->ret != 0 && r->pt)
		q->ret = -EPROTO;	/* failure must leave it NULL */
	if (!(q->flags & GPUSIM_TC_HOLD_LOCK))
		mutex_lock(&tc->lock);
	if (q->ret) {
		mutex_unlock(&tc->lock);
		kfree(r);
		q->id = 0;
		return 0;
	}
	r->pinned = !r->callbacks;	/* its callback may have come already */
	if (q->flags & GPUSIM_TC_MAP) {
		struct nvidia_p2p_page_table *pt = r->pt;
		struct nvidia_p2p_dma_mapping *m = NULL;

		/* Not under tc->lock: dma_map_pages takes the RM lock. */
		mutex_unlock(&tc->lock);
		q->ret = tc_peer ? nvidia_p2p_dma_map_pages(tc_peer, pt, &m) : -ENODEV;
		if (q->ret == 0 && !m)
			q->ret = -EPROTO;
		mutex_lock(&tc->lock);
		if (q->ret == 0 && r->pinned)
			r->dma = m;
		else if (q->ret == 0)
			q->ret = -ESTALE;	/* the callback came: gpusim reaped @m */
		if (q->ret) {
			/* A failed map leaves nothing mapped: unpin again. */
			r->dma = NULL;
			mutex_unlock(&tc->lock);
			if (tc_put(r) == 0) {
				kfree(r);
				q->id = 0;
				return 0;
			}
			/* The free callback is pending: keep r for it (FORGET). */
			mutex_lock(&tc->lock);
		}
	}
	list_add_tail(&r->node, &tc->regs);
	tc_fill(r, q);
	mutex_unlock(&tc->lock);
	return 0;
}

/* Caller holds tc->op, not tc->lock. Calls put even on a registration that
 * is no longer pinned (with its stale page table pointer): gpusim must
 * refuse it, or answer 0 as the 550 driver does (stale_errno). */
static int tc_put_flags(struct tc_reg *r, u32 flags)
{
	struct tc_file *tc = r->tc;
	int ret;

	if (r->persistent)
		ret = nvidia_p2p_put_pages_persistent(r->va, r->pt, flags);
	else
		ret = nvidia_p2p_put_pages(0, 0, r->va, r->pt);
	mutex_lock(&tc->lock);
	if (ret == 0 && r->pinned) {
		r->pinned = false;
		r->dma = NULL;
	}
	mutex_unlock(&tc->lock);
	return ret;
}

static int tc_put(struct tc_reg *r)
{
	return tc_put_flags(r, 0);
}

static void tc_rsync_put_mode(int mode, void *data)
{
}

static int tc_rsync_get_mode(int *mode, void *data)
{
	*mode = 0;
	return 0;
}

static void tc_rsync_wait(struct pci_dev *gpu, void *data)
{
}

static nvidia_p2p_rsync_driver_t tc_rsync_driver = {
	.version = NVIDIA_P2P_RSYNC_DRIVER_VERSION,
	.get_relaxed_ordering_mode = tc_rsync_get_mode,
	.put_relaxed_ordering_mode = tc_rsync_put_mode,
	.wait_for_rsync = tc_rsync_wait,
};

static void tc_rsync(struct gpusim_tc_req *q)
{
	nvidia_p2p_rsync_reg_info_t *info = NULL;

	q->ret = nvidia_p2p_get_rsync_registers(&info);
	if (!q->ret)
		nvidia_p2p_put_rsync_registers(info);
	q->ret2 = nvidia_p2p_get_rsync_registers(NULL);
	q->ret3 = nvidia_p2p_register_rsync_driver(&tc_rsync_driver, NULL);
	if (!q->ret3)
		nvidia_p2p_unregister_rsync_driver(&tc_rsync_driver, NULL);
}

/*
 * Put if pinned (unmapping a live DMA mapping first if @unmap), then wait
 * until no free callback can still come.
 */
static void tc_retire(struct tc_file *tc, struct tc_reg *r, bool unmap)
{
	bool pinned;
	int ret = 0;

	/* dma_unmap_pages takes no RM lock: fine under tc->lock. */
	mutex_lock(&tc->lock);
	if (r->pinned && unmap && r->dma &&
	    nvidia_p2p_dma_unmap_pages(tc_peer, r->pt, r->dma) == 0)
		r->dma = NULL;
	pinned = r->pinned;
	mutex_unlock(&tc->lock);
	if (pinned)
		ret = tc_put(r);
	if (ret && !r->persistent &&
	    !wait_event_timeout(r->wq, READ_ONCE(r->callbacks) > 0, 30 * HZ))
		pr_err("gpusim_testclient: free callback of registration %u never came after put_pages returned %d\n",
		       r->id, ret);
}

static long tc_copy(struct tc_file *tc, struct gpusim_tc_req *q, bool write)
{
	struct tc_reg *r;
	u64 done = 0;
	long err = 0;

	mutex_lock(&tc->lock);
	r = tc_find(tc, q->id);
	if (!r) {
		err = -ENOENT;
		goto out;
	}
	if (!r->pinned || q->off > r->len || q->len > r->len - q->off) {
		err = -EINVAL;
		goto out;
	}
	while (done < q->len) {
		u64 pos = q->off + done;
		u64 in_page = pos % TC_GPU_PAGE;
		u64 n = min(q->len - done, TC_GPU_PAGE - in_page);
		void *k = phys_to_virt(r->pt->pages[pos / TC_GPU_PAGE]->physical_address + in_page);
		void __user *u = u64_to_user_ptr(q->buf + done);

		if (write ? copy_from_user(k, u, n) : copy_to_user(u, k, n)) {
			err = -EFAULT;
			goto out;
		}
		done += n;
	}
out:
	mutex_unlock(&tc->lock);
	return err;
}

static long tc_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct tc_file *tc = f->private_data;
	void __user *up = (void __user *)arg;
	struct gpusim_tc_req q;
	struct tc_reg *r;
	long err = 0;

	if (_IOC_TYPE(cmd) != GPUSIM_TC_MAGIC || _IOC_SIZE(cmd) != sizeof(q))
		return -ENOTTY;
	if (copy_from_user(&q, up, sizeof(q)))
		return -EFAULT;

	mutex_lock(&tc->op);
	switch (cmd) {
	case GPUSIM_TC_GET:
		err = tc_get(tc, &q);
		break;
	case GPUSIM_TC_PUT:
		mutex_lock(&tc->lock);
		r = tc_find(tc, q.id);
		mutex_unlock(&tc->lock);
		if (r) {
			q.ret = tc_put_flags(r, (q.flags & GPUSIM_TC_PFLAGS) ? q.p_flags : 0);
			mutex_lock(&tc->lock);
			tc_fill(r, &q);
			mutex_unlock(&tc->lock);
		} else {
			err = -ENOENT;
		}
		break;
	case GPUSIM_TC_DMA_MAP: {
		struct nvidia_p2p_page_table *pt = NULL;
		struct nvidia_p2p_dma_mapping *m = NULL;

		mutex_lock(&tc->lock);
		r = tc_find(tc, q.id);
		if (!r || !r->pinned)
			err = r ? -EINVAL : -ENOENT;
		else if (!tc_peer && !(q.flags & TC_NOT_A_PEER))
			err = -ENODEV;
		else
			pt = r->pt;
		mutex_unlock(&tc->lock);
		if (err)
			break;
		/* Not under tc->lock: dma_map_pages takes the RM lock. */
		q.ret = nvidia_p2p_dma_map_pages(tc_dma_peer(q.flags), pt, &m);
		if (q.ret == 0 && !m)
			q.ret = -EPROTO;
		if (q.ret != 0 && m)
			q.ret = -EPROTO;
		mutex_lock(&tc->lock);
		if (q.ret == 0 && r->pinned) {
			if (r->dma)	/* keep the newest; tests map once */
				nvidia_p2p_dma_unmap_pages(tc_peer, r->pt, r->dma);
			r->dma = m;
		} else if (q.ret == 0) {
			/* The callback came in between: gpusim reaped @m. */
			q.ret = -ESTALE;
		}
		tc_fill(r, &q);
		mutex_unlock(&tc->lock);
		break;
	}
	case GPUSIM_TC_DMA_UNMAP:
		mutex_lock(&tc->lock);
		r = tc_find(tc, q.id);
		if (!r) {
			err = -ENOENT;
		} else {
			/* Deliberately also on a stale mapping: gpusim must refuse. */
			struct nvidia_p2p_dma_mapping *m = r->dma ? r->dma : r->last_dma;

			q.ret = nvidia_p2p_dma_unmap_pages(
				(q.flags & GPUSIM_TC_NULL_PEER) ? NULL : tc_peer, r->pt, m);
			if (q.ret == 0 && r->pinned && r->dma) {
				r->last_dma = r->dma;
				r->dma = NULL;
			}
			tc_fill(r, &q);
		}
		mutex_unlock(&tc->lock);
		break;
	case GPUSIM_TC_STATUS:
		mutex_lock(&tc->lock);
		r = tc_find(tc, q.id);
		if (r)
			tc_fill(r, &q);
		else
			err = -ENOENT;
		mutex_unlock(&tc->lock);
		break;
	case GPUSIM_TC_READ:
	case GPUSIM_TC_WRITE:
		err = tc_copy(tc, &q, cmd == GPUSIM_TC_WRITE);
		break;
	case GPUSIM_TC_RSYNC:
		tc_rsync(&q);
		break;
	case GPUSIM_TC_GUP: {
		struct page *page;

		q.ret = pin_user_pages_fast(q.va, 1, FOLL_WRITE, &page);
		if (q.ret > 0)
			unpin_user_pages(&page, q.ret);
		break;
	}
	case GPUSIM_TC_FORGET:
		mutex_lock(&tc->lock);
		r = tc_find(tc, q.id);
		if (r)
			list_del(&r->node);
		mutex_unlock(&tc->lock);
		if (!r) {
			err = -ENOENT;
			break;
		}
		tc_retire(tc, r, q.flags & GPUSIM_TC_UNMAP);
		kfree(r);
		break;
	default:
		err = -ENOTTY;
		break;
	}
	mutex_unlock(&tc->op);
	if (err)
		return err;
	if (copy_to_user(up, &q, sizeof(q)))
		return -EFAULT;
	return 0;
}

static int tc_open(struct inode *inode, struct file *f)
{
	struct tc_file *tc = kzalloc(sizeof(*tc), GFP_KERNEL);

	if (!tc)
		return -ENOMEM;
	mutex_init(&tc->op);
	mutex_init(&tc->lock);
	INIT_LIST_HEAD(&tc->regs);
	tc->next_id = 1;
	f->private_data = tc;
	return 0;
}

static int tc_release(struct inode *inode, struct file *f)
{
	struct tc_file *tc = f->private_data;
	struct tc_reg *r, *tmp;

	list_for_each_entry_safe(r, tmp, &tc->regs, node) {
		list_del(&r->node);
		tc_retire(tc, r, false);
		kfree(r);
	}
	mutex_destroy(&tc->lock);
	mutex_destroy(&tc->op);
	kfree(tc);
	return 0;
}

static const struct file_operations tc_fops = {
	.owner = THIS_MODULE,
	.open = tc_open,
	.release = tc_release,
	.unlocked_ioctl = tc_ioctl,
};

static struct miscdevice tc_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpusim_testclient",
	.fops = &tc_fops,
};

static int __init tc_init(void)
{
	struct pci_dev *pdev = NULL;

	while ((pdev = pci_get_device(PCI_ANY_ID, PCI_ANY_ID, pdev))) {
		if (peer && *peer ? !strcmp(pci_name(pdev), peer) :
		    pdev->dev.dma_mask && *pdev->dev.dma_mask) {
			tc_peer = pci_dev_get(pdev);
			pci_dev_put(pdev);
			break;
		}
	}
	if (peer && *peer && !tc_peer) {
		pr_err("gpusim_testclient: no PCI device %s (peer=); give the name of one in /sys/bus/pci/devices\n",
		       peer);
		return -ENODEV;
	}
	if (tc_peer)
		pr_info("gpusim_testclient: DMA peer is %s (max segment %u bytes, boundary mask %#lx)\n",
			pci_name(tc_peer), dma_get_max_seg_size(&tc_peer->dev),
			dma_get_seg_boundary(&tc_peer->dev));
	else
		pr_info("gpusim_testclient: no PCI device with a DMA mask; DMA commands return ENODEV\n");
	return misc_register(&tc_misc);
}

static void __exit tc_exit(void)
{
	misc_deregister(&tc_misc);
	pci_dev_put(tc_peer);
}

module_init(tc_init);
module_exit(tc_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Test client of the nvidia_p2p_* interface for gpusim (peermem test rig)");
