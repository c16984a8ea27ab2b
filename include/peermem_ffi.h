/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_ffi.h - everything peermem's Rust code sees of C.
 *
 * scripts/bindgen.sh runs bindgen on this file (with the kernel's own
 * bindgen and clang flags) and writes rust/ffi_generated.rs, which
 * rust/ffi.rs includes. Only items declared in this directory's headers
 * are generated; kernel types they mention (struct sg_table, struct
 * device, u64, ...) resolve to the kernel crate's `kernel::bindings`.
 *
 * The helpers declared below live in rust/helpers.c, a C object linked
 * into the same module: module parameters, debugfs, scatterlists, DMA
 * device queries and static inlines, i.e. the kernel interfaces whose Rust
 * abstractions differ between the kernels we support (6.12 LTS and 7.x)
 * or do not exist on some of them.
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_FFI_H
#define PEERMEM_INCLUDE_PEERMEM_FFI_H

#include <linux/types.h>
#include <linux/completion.h>
#include <linux/workqueue.h>

#include "peer_mem_abi.h"
#include "nv_p2p_abi.h"
#include "peermem_miscdev.h"
#include "peermem_pfnmap.h"

/*
 * peermem's version: MODULE_VERSION and the version string of the
 * peer-memory client (at most IB_PEER_MEMORY_VER_MAX - 2 characters, see
 * peer_mem_abi.h).
 */
#define PEERMEM_VERSION "0.3.0"
/*
 * The build's identity (modinfo's `build`, the load line): `git describe`
 * of the checkout it was built from, the BUILD_ID file of a DKMS/package
 * source tree, or "unknown" (Kbuild decides, rust/helpers.c holds it).
 */
#define PEERMEM_BUILD_LEN 64
extern const char peermem_build[PEERMEM_BUILD_LEN];

/* ---- Module parameters (read-only once the module is loaded) */

/*
 * The peer_name parameter: a buffer of IB_PEER_MEMORY_NAME_MAX bytes
 * holding a NUL-terminated string. The module loader has stored it before
 * module init runs and nothing changes it afterwards (0444), so the pointer
 * is valid and the contents stable until the module unloads.
 */
const char *peermem_param_peer_name(void);

/* nvidia-peermem's peerdirect_support parameter (default 0). */
int peermem_param_peerdirect_support(void);

/* nvidia-peermem's persistent_api_support parameter (-1: not given). */
int peermem_param_persistent_api_support(void);

/* The enable_invalidate parameter (register the invalidating client). */
bool peermem_param_enable_invalidate(void);

/* The enable_nc parameter (register the non-invalidating client). */
bool peermem_param_enable_nc(void);

/* The mmu_notifier parameter. */
bool peermem_param_mmu_notifier(void);

/* The watch_cache parameter (cached watch pins, entries; checked by Rust). */
unsigned int peermem_param_watch_cache(void);

/* The watch_cache_mib parameter (cached watch pins, MiB; checked by Rust). */
unsigned int peermem_param_watch_cache_mib(void);

/*
 * The calling process's address space as a key (its mm_struct's address),
 * 0 in a kernel thread. Only compared, never dereferenced.
 */
unsigned long peermem_mm_current_key(void);

/*
 * The calling thread's thread group id (current->tgid, the global pid of
 * its process): NVIDIA's driver's identity of "the calling process".
 */
int peermem_current_tgid(void);

/* ---- Scatter-gather tables (what dma_map() hands to the core) */

/*
 * Allocate a table of nents entries (GFP_KERNEL), chained if needed, every
 * entry zeroed and the last one marked as the end. 0 or -ENOMEM (then the
 * table is left zeroed). Free it with peermem_sgt_free().
 */
int peermem_sgt_alloc(struct sg_table *sgt, unsigned int nents);

/* Free a table from peermem_sgt_alloc() and zero it; NULL sgl: nothing. */
void peermem_sgt_free(struct sg_table *sgt);

/* The entry after sg (following chain links), or NULL after the last one. */
struct scatterlist *peermem_sg_next(struct scatterlist *sg);

/*
 * A DMA-only entry: no page, length and DMA length len, DMA address
 * dma_addr (a bus address of the device dma_map() was called for).
 */
void peermem_sg_set_dma(struct scatterlist *sg, u64 dma_addr, unsigned int len);

/* ---- DMA devices */

/* dev as a PCI device, or NULL if it is not one. */
struct pci_dev *peermem_to_pci_dev(struct device *dev);

/* The device's scatter-gather segment limits (dma_get_max_seg_size, _seg_boundary). */
unsigned int peermem_dma_max_seg_size(struct device *dev);
u64 peermem_dma_seg_boundary(struct device *dev);

/* Log (rate-limited) that dev is not a PCI device, so no GPU P2P DMA. */
void peermem_report_not_pci(struct device *dev);

/* ---- Messages */

/* pr_warn_ratelimited("peermem: %s\n", msg). */
void peermem_warn_ratelimited(const char *msg);

/* ---- Waits and work items (one-line wrappers of macros and inlines) */

/*
 * wait_var_event_timeout(var, !*var, secs * HZ): sleep until *var is 0
 * (woken by wake_up_var(var)); false if secs passed first.
 */
bool peermem_wait_var_zero(int *var, unsigned int secs);
/* alloc_workqueue("%s", flags, 0, name) (a macro from 6.10 on). */
struct workqueue_struct *peermem_alloc_workqueue(const char *name, unsigned int flags);
/* INIT_WORK(work, func). */
void peermem_init_work(struct work_struct *work, work_func_t func);
/* init_completion(c). */
void peermem_init_completion(struct completion *c);

/* ---- Readings for the mmu notifier's policy (rust/kapi/mmu_notifier.rs) */

/* System-call numbers of this architecture (native calls). */
extern const long peermem_nr_mremap;
extern const long peermem_nr_ioctl;
/* range: a struct mmu_notifier_range. mm_users != 0. */
bool peermem_range_mm_alive(const void *range);
/* current->mm == range->mm. */
bool peermem_range_mm_is_current(const void *range);
bool peermem_current_kthread(void);
bool peermem_current_compat(void);	/* in_compat_syscall() */
long peermem_current_syscall_nr(void);

/* ---- Free-callback references (rust/kapi/cbref.rs): the registry's spinlock */

void peermem_cbrefs_lock(void);
void peermem_cbrefs_unlock(void);

/* ---- debugfs: /sys/kernel/debug/peermem/ */

/*
 * Reads the current value of one counter. Called from debugfs file reads
 * with the counter pointer given to peermem_debugfs_add_counter().
 */
typedef u64 (*peermem_counter_read_t)(const void *counter);

/*
 * Create the directory /sys/kernel/debug/peermem and remember read for its
 * counter files. Returns 0, or -errno when debugfs is unavailable (then
 * the add/remove calls below do nothing; peermem works without it).
 * Call once, from module init, before any other peermem_debugfs_* call.
 */
int peermem_debugfs_create(peermem_counter_read_t read);

/*
 * Create the subdirectory NAME of /sys/kernel/debug/peermem (removed with
 * it) and return a handle for peermem_debugfs_add_counter(), or NULL if
 * it cannot be created.
 */
void *peermem_debugfs_subdir(const char *name);

/*
 * Add the read-only file NAME (a NUL-terminated string that must stay
 * valid until peermem_debugfs_remove()) showing read(counter) in decimal,
 * in dir (a handle from peermem_debugfs_subdir()) or, for NULL, in the
 * directory itself. counter must stay valid until peermem_debugfs_remove()
 * has returned.
 */
void peermem_debugfs_add_counter(void *dir, const char *name, const void *counter);

/*
 * Add the root-only read-write file NAME (as above) showing and setting
 * *value in decimal; value must stay valid until peermem_debugfs_remove().
 */
void peermem_debugfs_add_knob(const char *name, u32 *value);

/*
 * A write to an action file (see peermem_debugfs_add_action()): buf is the
 * user's buffer (__user), len its length; returns len or -errno.
 */
typedef ssize_t (*peermem_action_write_t)(const char *buf, size_t len);

/*
 * Add the root-only write-only file NAME (as above): a write() is handed to
 * write (process context, no lock held), which decides what it does.
 * write must stay valid until peermem_debugfs_remove() returned.
 */
void peermem_debugfs_add_action(const char *name, peermem_action_write_t write);

/*
 * Add the read-only file NAME (as above) showing *value in hexadecimal
 * (0x%08x); value must stay valid until peermem_debugfs_remove().
 */
void peermem_debugfs_add_hex(const char *name, u32 *value);

/* msleep(ms). */
void peermem_msleep(unsigned int ms);

/*
 * Remove the directory and its files. When it returns, no file read is
 * running or can start, so the counters and names may go away.
 */
void peermem_debugfs_remove(void);

#endif /* PEERMEM_INCLUDE_PEERMEM_FFI_H */
