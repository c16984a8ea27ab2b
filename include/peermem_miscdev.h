/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_miscdev.h - what the revocation event channel (/dev/peermem)
 * takes from C: its module parameters (C definitions, macros), one-line wrappers of the static inline functions and macros it
 * needs (rust/miscdev.c), and the exported kernel items that
 * kernel::bindings lacks on 6.12. The file operations, the misc device,
 * waiting and waking, user copies and the mapping are in
 * rust/kapi/miscdev.rs and rust/kapi/mm.rs. Included by peermem_ffi.h.
 *
 * bindgen-kernel: type miscdevice
 * bindgen-kernel: fn misc_register misc_deregister
 * bindgen-kernel: var MISC_DYNAMIC_MINOR
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_MISCDEV_H
#define PEERMEM_INCLUDE_PEERMEM_MISCDEV_H

#include <linux/types.h>
#include <linux/miscdevice.h>

#include "uapi/peermem.h"

struct file;
struct mm_struct;
struct page;
struct poll_table_struct;
struct vm_area_struct;
struct wait_queue_head;

/* ---- Module parameters of the event channel (read-only once loaded) */

/* events: create /dev/peermem. */
extern bool peermem_param_events;
/* event_queue_len: records per open file (checked in Rust). */
extern unsigned int peermem_param_event_queue_len;
/* event_files_per_user: open files per user (checked in Rust). */
extern unsigned int peermem_param_event_files_per_user;

/* ---- Wrappers of static inline functions and macros */

/* poll_wait(file, wq, pt). */
void peermem_poll_wait(struct file *file, struct wait_queue_head *wq,
		       struct poll_table_struct *pt);
/* get_zeroed_page(gfp): a page's kernel address or 0. */
unsigned long peermem_get_zeroed_page(gfp_t gfp);
/* virt_to_page(addr). */
struct page *peermem_virt_to_page(void *addr);
/* vm_flags_mod(vma, set, clear) (the mm's write lock held). */
void peermem_vm_flags_mod(struct vm_area_struct *vma, unsigned long set,
			  unsigned long clear);
/* mmgrab(mm), mmdrop(mm). */
void peermem_mmgrab(struct mm_struct *mm);
void peermem_mmdrop(struct mm_struct *mm);
/*
 * current->mm and whether current is a kernel thread: peermem_current_mm()
 * and peermem_current_kthread() (peermem_ffi.h, rust/helpers.c). Not read
 * from Rust: bindgen's struct task_struct (kernel::bindings) has mm at 936
 * where C has it at 984 on the rig's 7.3 debug kernel (its size 5184 for
 * 5248), so its field offsets cannot be trusted.
 */
/* from_kuid_munged(&init_user_ns, current_uid()). */
u32 peermem_current_uid(void);

#endif /* PEERMEM_INCLUDE_PEERMEM_MISCDEV_H */
