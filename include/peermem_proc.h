/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peermem_proc.h - the kernel's /proc file interface peermem's Rust code
 * calls directly (rust/kapi/procfs.rs): one read-only file whose text is
 * written at each read through a seq_file. Exported functions, the same
 * on every supported kernel (6.12-7.3), so no C glue:
 * bindgen-kernel: fn proc_create_single_data proc_remove seq_write
 * bindgen-kernel: type seq_file proc_dir_entry
 */
#ifndef PEERMEM_INCLUDE_PEERMEM_PROC_H
#define PEERMEM_INCLUDE_PEERMEM_PROC_H

#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#endif /* PEERMEM_INCLUDE_PEERMEM_PROC_H */
