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
 * into the same module: module parameter variables and one-line wrappers
 * of static inline functions and macros, which have no symbol Rust could
 * call. Exported kernel functions that 6.12's kernel::bindings lacks are
 * named on `bindgen-kernel:` lines (scripts/bindgen.sh) and called from
 * Rust directly.
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_FFI_H
#define PEERMEM_INCLUDE_PEERMEM_FFI_H

#include <linux/types.h>
#include <linux/completion.h>
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/workqueue.h>

#include "peer_mem_abi.h"
#include "nv_p2p_abi.h"
#include "peermem_miscdev.h"
#include "peermem_pfnmap.h"
#include "peermem_proc.h"

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

/*
 * ---- Module parameters (rust/helpers.c defines them; read-only once the
 * module is loaded: the loader stores them before module init, and every
 * one is 0444, so nothing writes them afterwards).
 */

/* peer_name: a NUL-terminated string (the loader always leaves a NUL). */
extern char peermem_peer_name[IB_PEER_MEMORY_NAME_MAX];
/* nvidia-peermem's peerdirect_support (default 0). */
extern int peermem_peerdirect_support;
/* nvidia-peermem's persistent_api_support (-1: not given). */
extern int peermem_persistent_api_support;
/* enable_invalidate (register the invalidating client). */
extern bool peermem_enable_invalidate;
/* enable_nc (register the non-invalidating client). */
extern bool peermem_enable_nc;
/* mmu_notifier. */
extern bool peermem_mmu_notifier;
/* watch_cache (cached watch pins, entries; checked by Rust). */
extern unsigned int peermem_watch_cache;
/* watch_cache_mib (cached watch pins, MiB; checked by Rust). */
extern unsigned int peermem_watch_cache_mib;

/*
 * The calling thread's thread group id (current->tgid, the global pid of
 * its process): NVIDIA's driver's identity of "the calling process".
 */
int peermem_current_tgid(void);

/* ---- Scatter-gather tables (what dma_map() hands to the core) */

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
/* current->mm (NULL in a kernel thread that borrows none). */
struct mm_struct *peermem_current_mm(void);
bool peermem_current_kthread(void);
bool peermem_current_compat(void);	/* in_compat_syscall() */
long peermem_current_syscall_nr(void);

/* ---- The C layout of what Rust reads or builds (rust/kapi/layout.rs) */

extern const unsigned long peermem_c_layout[];
extern const unsigned long peermem_c_layout_len;

/* ---- debugfs: /sys/kernel/debug/peermem/ (rust/kapi/debugfs.rs) */

/*
 * The kernel's debugfs and simple_attr functions (6.12's kernel::bindings
 * lacks debugfs), and msleep:
 * bindgen-kernel: fn debugfs_create_dir debugfs_create_file_unsafe debugfs_remove
 * bindgen-kernel: fn debugfs_create_u32 debugfs_create_x32 debugfs_attr_read debugfs_attr_write
 * bindgen-kernel: fn simple_attr_open simple_attr_release simple_open noop_llseek msleep
 */
/* debugfs_create_file() (a _Generic macro from 6.13 on). */
struct dentry *peermem_debugfs_create_file(const char *name, umode_t mode, struct dentry *parent,
					   void *data, const struct file_operations *fops);

#endif /* PEERMEM_INCLUDE_PEERMEM_FFI_H */
