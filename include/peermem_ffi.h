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
 * into the same module: module parameters and debugfs glue, i.e. the
 * kernel interfaces whose Rust abstractions differ between the kernels we
 * support (6.12 LTS and 7.x) or do not exist on some of them.
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_FFI_H
#define PEERMEM_INCLUDE_PEERMEM_FFI_H

#include <linux/types.h>

#include "peer_mem_abi.h"
#include "nv_p2p_abi.h"

/*
 * peermem's version: MODULE_VERSION, and later the version string of the
 * peer-memory client (at most IB_PEER_MEMORY_VER_MAX - 2 characters, see
 * peer_mem_abi.h).
 */
#define PEERMEM_VERSION "0.1.0"

/* ---- Module parameters (read-only once the module is loaded) */

/*
 * The peer_name parameter: a buffer of IB_PEER_MEMORY_NAME_MAX bytes
 * holding a NUL-terminated string. The module loader has stored it before
 * module init runs and nothing changes it afterwards (0444), so the pointer
 * is valid and the contents stable until the module unloads.
 */
const char *peermem_param_peer_name(void);

/* The enable_invalidate parameter. */
bool peermem_param_enable_invalidate(void);

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
 * Add the read-only file NAME (a NUL-terminated string that must stay
 * valid until peermem_debugfs_remove()) showing read(counter) in decimal.
 * counter must stay valid until peermem_debugfs_remove() has returned.
 */
void peermem_debugfs_add_counter(const char *name, const void *counter);

/*
 * Remove the directory and its files. When it returns, no file read is
 * running or can start, so the counters and names may go away.
 */
void peermem_debugfs_remove(void);

#endif /* PEERMEM_INCLUDE_PEERMEM_FFI_H */
