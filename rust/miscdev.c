// SPDX-License-Identifier: GPL-2.0
/*
 * What the revocation event channel (/dev/peermem) cannot have in Rust:
 * its module parameters and one-line wrappers of static inline functions
 * and macros (include/peermem_miscdev.h).
 * The device, its file operations and the decisions are in
 * rust/kapi/miscdev.rs, rust/kapi/mm.rs and rust/client/events.rs.
 */
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/cred.h>

#include "peermem_ffi.h"

bool peermem_param_events = true;
module_param_named(events, peermem_param_events, bool, 0444);
MODULE_PARM_DESC(events,
		 "Create /dev/peermem, through which a process learns which of its GPU memory registrations peermem revoked and why (a generation counter page and an event queue, docs/module.md \"Revocation events\"; default Y). N: no device; revocations cost nothing extra either way while no process has it open");

unsigned int peermem_param_event_queue_len = 256;
module_param_named(event_queue_len, peermem_param_event_queue_len, uint, 0444);
MODULE_PARM_DESC(event_queue_len,
		 "Records the event queue of each open /dev/peermem holds before it overflows (the reader then gets one overflow record and must flush its whole registration cache); 2-65536, default 256 (96 bytes each, allocated at open)");

unsigned int peermem_param_event_files_per_user = 1024;
module_param_named(event_files_per_user, peermem_param_event_files_per_user, uint, 0444);
MODULE_PARM_DESC(event_files_per_user,
		 "Open /dev/peermem files one user may hold at once (each holds its queue and a page of kernel memory, charged to the opener's memory cgroup); one more open fails with EMFILE. 1-65536, default 1024");

void peermem_poll_wait(struct file *file, struct wait_queue_head *wq, poll_table *pt)
{
	poll_wait(file, wq, pt);
}

unsigned long peermem_get_zeroed_page(gfp_t gfp)
{
	return get_zeroed_page(gfp);
}

struct page *peermem_virt_to_page(void *addr)
{
	return virt_to_page(addr);
}

void peermem_vm_flags_mod(struct vm_area_struct *vma, unsigned long set, unsigned long clear)
{
	vm_flags_mod(vma, set, clear);
}

void peermem_mmgrab(struct mm_struct *mm)
{
	mmgrab(mm);
}

void peermem_mmdrop(struct mm_struct *mm)
{
	mmdrop(mm);
}

u32 peermem_current_uid(void)
{
	return from_kuid_munged(&init_user_ns, current_uid());
}
