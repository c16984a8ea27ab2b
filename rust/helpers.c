// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of the peermem module: module metadata and parameters, and the
 * debugfs directory. These are kernel interfaces whose Rust abstractions
 * differ between the kernels peermem builds on (6.12 LTS has neither Rust
 * module parameters nor Rust debugfs), so they live here, behind the small
 * API declared in include/peermem_ffi.h. The logic stays in Rust.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/err.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

#include "peermem_ffi.h"

MODULE_VERSION(PEERMEM_VERSION);
MODULE_AUTHOR("The peermem authors");

/* ---- Module parameters */

static char peer_name[IB_PEER_MEMORY_NAME_MAX] = "peermem";
module_param_string(peer_name, peer_name, sizeof(peer_name), 0444);
MODULE_PARM_DESC(peer_name,
		 "Name to register with the peer-memory core: 1-63 characters of A-Z a-z 0-9 _ . - (default \"peermem\"). Checked at load; not used yet, as this version does not register with the core.");

static bool enable_invalidate = true;
module_param(enable_invalidate, bool, 0444);
MODULE_PARM_DESC(enable_invalidate,
		 "Register as an invalidating client, so that freeing GPU memory revokes RDMA access to it (default Y). Not used yet, as this version does not register with the core.");

const char *peermem_param_peer_name(void)
{
	return peer_name;
}

bool peermem_param_enable_invalidate(void)
{
	return enable_invalidate;
}

/* ---- debugfs */

static struct dentry *peermem_dir;
static peermem_counter_read_t peermem_counter_read;

static int peermem_counter_get(void *counter, u64 *val)
{
	*val = peermem_counter_read(counter);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(peermem_counter_fops, peermem_counter_get, NULL,
			 "%llu\n");

int peermem_debugfs_create(peermem_counter_read_t read)
{
	struct dentry *dir;

	if (!read)
		return -EINVAL;
	dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	if (IS_ERR(dir))
		return PTR_ERR(dir);
	peermem_counter_read = read;
	peermem_dir = dir;
	return 0;
}

void peermem_debugfs_add_counter(const char *name, const void *counter)
{
	if (!peermem_dir)
		return;
	/*
	 * debugfs keeps the pointer as the file's private data and hands it
	 * back to peermem_counter_get(); the file is read-only, so the cast
	 * away from const is never written through.
	 */
	debugfs_create_file_unsafe(name, 0444, peermem_dir, (void *)counter,
				   &peermem_counter_fops);
}

void peermem_debugfs_remove(void)
{
	/* Waits for readers that are inside peermem_counter_get(). */
	debugfs_remove(peermem_dir);
	peermem_dir = NULL;
}
