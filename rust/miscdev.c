// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of peermem's revocation event channel (/dev/peermem): the misc
 * device and its file operations (trampolines into Rust through struct
 * peermem_misc_ops), the generation page and its read-only mapping, the
 * owner address space of registrations and open files, user copies, and
 * the global spinlock of the event queues. kernel::miscdevice exists only
 * from 6.13 on and changes between releases, so peermem keeps these few
 * calls here, behind include/peermem_miscdev.h, on 6.12 and 7.x alike.
 * The logic (who sees what, the queues) is in rust/client/events.rs.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/err.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/cred.h>
#include <linux/uidgid.h>
#include <linux/user_namespace.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "peermem_ffi.h"

/* ---- Module parameters */

static bool events = true;
module_param(events, bool, 0444);
MODULE_PARM_DESC(events,
		 "Create /dev/peermem, through which a process learns which of its GPU memory registrations peermem revoked and why (a generation counter page and an event queue, docs/module.md \"Revocation events\"; default Y). N: no device; revocations cost nothing extra either way while no process has it open");

static unsigned int event_queue_len = 256;
module_param(event_queue_len, uint, 0444);
MODULE_PARM_DESC(event_queue_len,
		 "Records the event queue of each open /dev/peermem holds before it overflows (the reader then gets one overflow record and must flush its whole registration cache); 2-65536, default 256 (96 bytes each, allocated at open)");

static unsigned int event_files_per_user = 1024;
module_param(event_files_per_user, uint, 0444);
MODULE_PARM_DESC(event_files_per_user,
		 "Open /dev/peermem files one user may hold at once (each holds its queue and a page of kernel memory, charged to the opener's memory cgroup); one more open fails with EMFILE. 1-65536, default 1024");

bool peermem_param_events(void)
{
	return events;
}

unsigned int peermem_param_event_queue_len(void)
{
	return event_queue_len;
}

unsigned int peermem_param_event_files_per_user(void)
{
	return event_files_per_user;
}

/* ---- The misc device */

struct peermem_miscdev {
	struct miscdevice misc;
	const struct peermem_misc_ops *ops;
};

/* What an open file's private_data points to. */
struct peermem_misc_file {
	const struct peermem_misc_ops *ops;
	const void *obj;
};

static int peermem_misc_open(struct inode *inode, struct file *file)
{
	/* misc_open() leaves the miscdevice in private_data. */
	struct peermem_miscdev *dev =
		container_of(file->private_data, struct peermem_miscdev, misc);
	struct peermem_misc_file *f;
	const void *obj;

	f = kzalloc(sizeof(*f), GFP_KERNEL_ACCOUNT);
	if (!f)
		return -ENOMEM;
	obj = dev->ops->open();
	if (IS_ERR(obj)) {
		kfree(f);
		return PTR_ERR(obj);
	}
	f->ops = dev->ops;
	f->obj = obj;
	file->private_data = f;
	/* No file position: read() consumes records, pread() is refused. */
	return stream_open(inode, file);
}

static int peermem_misc_release(struct inode *inode, struct file *file)
{
	struct peermem_misc_file *f = file->private_data;

	f->ops->release(f->obj);
	kfree(f);
	return 0;
}

static ssize_t peermem_misc_read(struct file *file, char __user *buf,
				 size_t len, loff_t *ppos)
{
	struct peermem_misc_file *f = file->private_data;
	ssize_t ret;

	for (;;) {
		ret = f->ops->read(f->obj, (char __force *)buf, len);
		if (ret != -EAGAIN || (file->f_flags & O_NONBLOCK))
			return ret;
		ret = wait_event_interruptible(*f->ops->waitq(f->obj),
					       f->ops->readable(f->obj));
		if (ret)
			return ret;
	}
}

static __poll_t peermem_misc_poll(struct file *file, poll_table *wait)
{
	struct peermem_misc_file *f = file->private_data;

	poll_wait(file, f->ops->waitq(f->obj), wait);
	return f->ops->readable(f->obj) ? EPOLLIN | EPOLLRDNORM : 0;
}

static int peermem_misc_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct peermem_misc_file *f = file->private_data;

	return f->ops->mmap(f->obj, vma);
}

static const struct file_operations peermem_misc_fops = {
	.owner = THIS_MODULE,
	.open = peermem_misc_open,
	.release = peermem_misc_release,
	.read = peermem_misc_read,
	.poll = peermem_misc_poll,
	.mmap = peermem_misc_mmap,
};

struct peermem_miscdev *peermem_misc_register(const char *name,
					      const struct peermem_misc_ops *ops)
{
	struct peermem_miscdev *dev;
	int ret;

	if (!name || !ops || !ops->open || !ops->release || !ops->read ||
	    !ops->readable || !ops->waitq || !ops->mmap)
		return ERR_PTR(-EINVAL);
	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return ERR_PTR(-ENOMEM);
	dev->ops = ops;
	dev->misc.minor = MISC_DYNAMIC_MINOR;
	dev->misc.name = name;
	dev->misc.fops = &peermem_misc_fops;
	dev->misc.mode = 0666;
	ret = misc_register(&dev->misc);
	if (ret) {
		kfree(dev);
		return ERR_PTR(ret);
	}
	return dev;
}

void peermem_misc_deregister(struct peermem_miscdev *dev)
{
	misc_deregister(&dev->misc);
	kfree(dev);
}

/* ---- Wait queues */

struct wait_queue_head *peermem_waitq_alloc(void)
{
	struct wait_queue_head *wq = kmalloc(sizeof(*wq), GFP_KERNEL_ACCOUNT);

	if (wq)
		init_waitqueue_head(wq);
	return wq;
}

void peermem_waitq_free(struct wait_queue_head *wq)
{
	kfree(wq);
}

void peermem_waitq_wake(struct wait_queue_head *wq)
{
	wake_up_interruptible_poll(wq, EPOLLIN | EPOLLRDNORM);
}

/* ---- User memory */

size_t peermem_copy_to_user(char *to, const void *from, size_t n)
{
	return copy_to_user((void __user __force *)to, from, n);
}

/* ---- Shared pages */

void *peermem_page_zalloc(void)
{
	return (void *)get_zeroed_page(GFP_KERNEL_ACCOUNT);
}

void peermem_page_free(void *page)
{
	free_page((unsigned long)page);
}

int peermem_vma_map_page(struct vm_area_struct *vma, void *page)
{
	if (vma->vm_end - vma->vm_start != PAGE_SIZE || vma->vm_pgoff)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	/*
	 * The page is the opener's alone. VM_DONTCOPY: fork() does not copy
	 * the mapping; VM_IO: madvise(MADV_DOFORK) cannot clear that (6.12
	 * refuses it only on VM_IO), and get_user_pages refuses the area, so
	 * neither /proc/pid/mem nor process_vm_readv reaches the page (the
	 * lockless pin_user_pages_fast still can, for the process itself: the
	 * PTE is an ordinary page's). VM_DONTEXPAND: mremap cannot grow it.
	 */
	vm_flags_mod(vma, VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP, VM_MAYWRITE);
	return vm_insert_page(vma, vma->vm_start, virt_to_page(page));
}

/* ---- Address spaces */

struct mm_struct *peermem_mm_grab_current(void)
{
	struct mm_struct *mm = current->mm;

	if (!mm || (current->flags & PF_KTHREAD))
		return NULL;
	mmgrab(mm);
	return mm;
}

void peermem_mm_drop(struct mm_struct *mm)
{
	mmdrop(mm);
}

bool peermem_mm_is_current(const struct mm_struct *mm)
{
	return !(current->flags & PF_KTHREAD) && current->mm == mm;
}

/* ---- Users */

u32 peermem_current_uid(void)
{
	return from_kuid_munged(&init_user_ns, current_uid());
}

/* ---- The global event lock */

static DEFINE_SPINLOCK(peermem_events_spinlock);

void peermem_events_lock(void)
{
	spin_lock(&peermem_events_spinlock);
}

void peermem_events_unlock(void)
{
	spin_unlock(&peermem_events_spinlock);
}
