/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_miscdev.h - the C glue of the revocation event channel
 * (rust/miscdev.c): a misc character device whose file operations call
 * back into Rust, the shared generation page, the owner address space of
 * a registration or an open file, and the one global spinlock the event
 * queues live under. Included by peermem_ffi.h (bindgen reads it from
 * there). kernel::miscdevice exists only from 6.13 on and changes fast;
 * these are the few calls peermem needs, on 6.12 and 7.x alike.
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_MISCDEV_H
#define PEERMEM_INCLUDE_PEERMEM_MISCDEV_H

#include <linux/types.h>

#include "uapi/peermem.h"

/* ---- Module parameters of the event channel (read-only once loaded) */

/* The events parameter: create /dev/peermem. */
bool peermem_param_events(void);
/* The event_queue_len parameter: records per open file (checked in Rust). */
unsigned int peermem_param_event_queue_len(void);
/* The event_files_per_user parameter: open files per user (checked in Rust). */
unsigned int peermem_param_event_files_per_user(void);

/* ---- A misc character device */

/*
 * The callbacks of a device's open files; obj is what open returned (an
 * Arc raw pointer), valid until release returned.
 *  - open: in the opener's context; the new file's object or ERR_PTR.
 *  - release: the last close; consumes obj's reference.
 *  - read: copy whole records to the user buffer buf of len bytes; the
 *    bytes copied, -EAGAIN if nothing is queued, or -errno. Never sleeps
 *    waiting: the glue waits on waitq (below) until readable.
 *  - readable: something can be read (or read would fail at once).
 *  - waitq: the wait queue woken when readable may have become true,
 *    valid as long as obj.
 *  - mmap: map the file into vma (in the mapper's context); 0 or -errno.
 */
struct peermem_misc_ops {
	const void *(*open)(void);
	void (*release)(const void *obj);
	ssize_t (*read)(const void *obj, char *buf, size_t len);
	bool (*readable)(const void *obj);
	struct wait_queue_head *(*waitq)(const void *obj);
	int (*mmap)(const void *obj, struct vm_area_struct *vma);
};

struct peermem_miscdev;

/*
 * Register /dev/NAME (a dynamic misc minor, mode 0666) with the file
 * operations ops (static: valid until deregistered). The device or an
 * ERR_PTR (e.g. -EBUSY: the name is taken, -ENOMEM). Open files hold a
 * reference to the module, so it cannot unload while one is open.
 */
struct peermem_miscdev *peermem_misc_register(const char *name,
					      const struct peermem_misc_ops *ops);
/* Remove the device node; no open can start after. Open files keep working. */
void peermem_misc_deregister(struct peermem_miscdev *dev);

/* ---- Wait queues */

/* A new wait queue head (GFP_KERNEL_ACCOUNT: the opener's memcg) or NULL. */
struct wait_queue_head *peermem_waitq_alloc(void);
void peermem_waitq_free(struct wait_queue_head *wq);
/* wake_up_interruptible_poll(wq, EPOLLIN | EPOLLRDNORM): any context. */
void peermem_waitq_wake(struct wait_queue_head *wq);

/* ---- User memory */

/* copy_to_user(to, from, n): bytes NOT copied. May fault and sleep. */
size_t peermem_copy_to_user(char *to, const void *from, size_t n);

/* ---- Shared pages */

/* A zeroed page (GFP_KERNEL_ACCOUNT: the caller's memcg): its kernel address, or NULL. */
void *peermem_page_zalloc(void);
/* Drop our reference; mappings made by peermem_vma_map_page keep theirs. */
void peermem_page_free(void *page);
/*
 * Map the page at kernel address page into vma read-only: vma must cover
 * exactly one page at file offset 0 (else -EINVAL) and not be writable
 * (-EPERM); VM_MAYWRITE is cleared (a later mprotect(PROT_WRITE) fails
 * with EACCES) and the mapping is neither copied on fork nor expanded
 * nor dumped. 0 or vm_insert_page's error.
 */
int peermem_vma_map_page(struct vm_area_struct *vma, void *page);

/* ---- Address spaces */

/*
 * A counted reference (mmgrab: the struct, not the address space) to the
 * caller's mm, or NULL for a kernel thread. Release with peermem_mm_drop()
 * (any context). While held, no other mm can have the same address.
 */
struct mm_struct *peermem_mm_grab_current(void);
void peermem_mm_drop(struct mm_struct *mm);
/* mm is the caller's address space. */
bool peermem_mm_is_current(const struct mm_struct *mm);

/* ---- Users */

/*
 * The caller's real user id as the initial user namespace sees it (a
 * per-user limit's key; overflowuid if unmapped).
 */
u32 peermem_current_uid(void);

/* ---- The global event lock (a spinlock, never held across a sleep) */

void peermem_events_lock(void);
void peermem_events_unlock(void);

#endif /* PEERMEM_INCLUDE_PEERMEM_MISCDEV_H */
