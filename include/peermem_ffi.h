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

/* ---- Registration objects alive (module unload waits for none) */

void peermem_objects_inc(void);
void peermem_objects_dec(void);
/*
 * Sleep until no registration object is alive (a free callback may still
 * be finishing after the core released everything); every 10 s say how
 * many are left.
 */
void peermem_objects_wait(void);

/* ---- Deferred calls: one work item per owner, on peermem's work queue */

/*
 * A work item an owner embeds (by pointer) to run fn(ref) later, in process
 * context with no lock held, on the work queue peermem_watch_setup() made.
 * Queued at most once in its life (rust/kapi/work.rs sees to it).
 * Queueing never sleeps, never allocates: callable from a GPU driver's
 * free callback under its locks.
 */
struct peermem_work;
typedef void (*peermem_work_fn_t)(const void *ref);
/* A new work item that will call fn; NULL if out of memory. */
struct peermem_work *peermem_work_alloc(peermem_work_fn_t fn);
/*
 * Queues w, never queued before (the Rust owner keeps it to once), to call
 * fn(ref) (ref: a reference the call consumes). The work queue must exist
 * until the call ran: it is torn down at unload only after every owner was
 * released (see peermem_watch_teardown()).
 */
void peermem_work_queue(struct peermem_work *w, const void *ref);
/* Frees w: never queued, or its call has begun (it may free w itself). */
void peermem_work_free(struct peermem_work *w);

/* ---- Address-space watches: an mmu interval notifier per registration */

/*
 * A watch on a registration's address range in the registering process.
 * When the range is unmapped (munmap, mremap moving it, MAP_FIXED over
 * it; not at process exit) it takes a new reference with hold(reg), once
 * per watch, and hands it to changed() from a work item (process context,
 * no lock held). The registration must stay alive from
 * peermem_watch_start() until peermem_watch_stop() has returned: the
 * notifier may call hold(reg) until then.
 */
struct peermem_watch;
typedef void (*peermem_watch_changed_t)(const void *ref);
/*
 * The interval notifier's invalidate(), forwarded as is: the policy (which
 * invalidation revokes, what it is reported as, when a call that may not
 * block goes ahead) is Rust's. range: the struct mmu_notifier_range.
 */
typedef bool (*peermem_watch_invalidate_t)(struct peermem_watch *w,
					   const void *range,
					   unsigned long cur_seq);

/* Once at load, before any watch: the callbacks and the work queue (-ENOMEM). */
int peermem_watch_setup(peermem_watch_changed_t changed,
			peermem_watch_invalidate_t invalidate);
/*
 * Revocation events: how a watch fired. PEERMEM_WATCH_UNMAPPED (munmap,
 * mmap(MAP_FIXED) over the range, any other unmap) or PEERMEM_WATCH_MOVED
 * (the unmapping thread is in mremap); a blocking watch (which fires on
 * every invalidation) also PEERMEM_WATCH_EXITING (the address space is
 * being torn down), PEERMEM_WATCH_PROTECTED (mprotect) and
 * PEERMEM_WATCH_ZAPPED (anything else: the driver that mapped the range
 * zapped it, unmap_mapping_range).
 */
enum peermem_watch_how {
	PEERMEM_WATCH_UNMAPPED = 0,
	PEERMEM_WATCH_MOVED = 1,
	PEERMEM_WATCH_EXITING = 2,
	PEERMEM_WATCH_PROTECTED = 3,
	PEERMEM_WATCH_ZAPPED = 4,
};
/* enum mmu_notifier_event's values (helpers.c asserts they are the kernel's). */
enum peermem_mmu_event {
	PEERMEM_MMU_UNMAP = 0,
	PEERMEM_MMU_CLEAR = 1,
	PEERMEM_MMU_PROTECTION_VMA = 2,
	PEERMEM_MMU_PROTECTION_PAGE = 3,
	PEERMEM_MMU_SOFT_DIRTY = 4,
	PEERMEM_MMU_RELEASE = 5,
};
/* System-call numbers of this architecture (native calls). */
extern const long peermem_nr_mremap;
extern const long peermem_nr_ioctl;
/* Readings for the invalidate policy (one-line wrappers of inlines). */
unsigned int peermem_range_event(const void *range);
bool peermem_range_mm_alive(const void *range);	/* mm_users != 0 */
bool peermem_range_blockable(const void *range);
bool peermem_range_mm_is_current(const void *range);
bool peermem_current_kthread(void);
bool peermem_current_compat(void);	/* in_compat_syscall() */
long peermem_current_syscall_nr(void);
/* Watch state for the invalidate policy. */
bool peermem_watch_is_blocking(struct peermem_watch *w);
const void *peermem_watch_owner(struct peermem_watch *w);
void peermem_watch_set_seq(struct peermem_watch *w, unsigned long cur_seq);
bool peermem_watch_test_and_set_fired(struct peermem_watch *w);
/* A blocking watch's work item returned (completion_done()). */
bool peermem_watch_revoke_done(struct peermem_watch *w);
/* Queue the work item that calls changed(ref). */
void peermem_watch_queue(struct peermem_watch *w, const void *ref);
/* Wait until a blocking watch's work item returned. */
void peermem_watch_wait_revoked(struct peermem_watch *w);
/* At unload, after every watch was stopped: runs the queued work items. */
void peermem_watch_teardown(void);
/*
 * A watch, not started: NULL if out of memory (or without
 * CONFIG_MMU_NOTIFIER). Free it with peermem_watch_free().
 */
struct peermem_watch *peermem_watch_alloc(void);
/*
 * Start watching [start, start + len) of the calling process for reg: 0 or
 * -errno (-EBUSY if started already). Start and stop of one watch are
 * serialized (the watch's mutex), so they may be called concurrently.
 */
int peermem_watch_start(struct peermem_watch *w, const void *reg, u64 start, u64 len);
/*
 * Stop watching; sleeps until no notifier call for it runs. Idempotent.
 * A work item already queued still runs (it holds its own reference).
 */
void peermem_watch_stop(struct peermem_watch *w);
/* Stop and free. The queued work item, if any, must have run. */
void peermem_watch_free(struct peermem_watch *w);
/*
 * PFN-map source: make w a blocking watch (before peermem_watch_start):
 * it fires on every invalidation of its range, also at process exit, and
 * the notifier call returns only after changed() returned (rust/helpers.c).
 */
void peermem_watch_set_blocking(struct peermem_watch *w);
/*
 * mmu_interval_read_begin() on a started watch: false if it is not
 * started. peermem_watch_read_retry(): mmu_interval_read_retry().
 */
bool peermem_watch_read_begin(struct peermem_watch *w, unsigned long *seq);
bool peermem_watch_read_retry(struct peermem_watch *w, unsigned long seq);
/*
 * Whether the watch has fired (its work item was queued; once per watch).
 * Set by the notifier before the unmapping call returns to the process.
 */
bool peermem_watch_has_fired(struct peermem_watch *w);

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
