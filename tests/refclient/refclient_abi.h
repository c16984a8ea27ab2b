/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The peer-memory client interface as the reference client sees it.
 *
 * Declared here from the MLNX/NVIDIA reference description on purpose,
 * instead of including the rig kernel's <rdma/peer_mem.h>: the reference
 * client must be independent of the core it tests, so a layout mistake in
 * the core's header shows up as a failing client, not as an agreement
 * between two copies of the same mistake. The offsets are checked below.
 */
#ifndef REFCLIENT_ABI_H
#define REFCLIENT_ABI_H

#include <linux/build_bug.h>
#include <linux/stddef.h>
#include <linux/types.h>

struct device;
struct sg_table;

#define REF_NAME_LEN 64
#define REF_VERSION_LEN 16

struct ref_peer_client {
	char name[REF_NAME_LEN];
	char version[REF_VERSION_LEN];
	int (*acquire)(unsigned long addr, size_t size, void *legacy1,
		       char *legacy2, void **ctx);
	int (*get_pages)(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *legacy_sgt, void *ctx,
			 u64 core_context);
	int (*dma_map)(struct sg_table *sgt, void *ctx, struct device *dev,
		       int legacy_dmasync, int *nmap);
	int (*dma_unmap)(struct sg_table *sgt, void *ctx, struct device *dev);
	void (*put_pages)(struct sg_table *sgt, void *ctx);
	unsigned long (*get_page_size)(void *ctx);
	void (*release)(void *ctx);
};

/* Registered with version[15] != 0: the struct above is the first member. */
struct ref_peer_client_ex {
	struct ref_peer_client client;
	size_t ex_size;
	u32 flags;
};

#define REF_FLAG_INVALIDATE_UNMAPS 0x1

typedef int (*ref_invalidate_fn)(void *reg_handle, u64 core_context);

/* Exported by the core (non-GPL), names fixed by the ABI. */
void *ib_register_peer_memory_client(const struct ref_peer_client *client,
				     ref_invalidate_fn *invalidate);
void ib_unregister_peer_memory_client(void *reg_handle);

#ifdef CONFIG_64BIT
static_assert(offsetof(struct ref_peer_client, acquire) == 80);
static_assert(offsetof(struct ref_peer_client, release) == 128);
static_assert(sizeof(struct ref_peer_client) == 136);
static_assert(offsetof(struct ref_peer_client_ex, flags) == 144);
#endif

/*
 * The NVIDIA P2P page-table interface (nv-p2p.h, 550 series), the part the
 * gpusim source uses. Resolved at load time with symbol_get() (the real
 * exports are GPL-only), so the client loads without gpusim when it does
 * not use it.
 */
#define REF_P2P_PAGE_TABLE_VERSION 0x00010002	/* 550-575: layout 1.2 */
#define REF_P2P_PAGE_TABLE_VERSION_V2 0x00020000	/* 580+: 1.2 plus a trailing u32 flags */
#define REF_P2P_VERSION_OK(v, want) \
	(((v) >> 16) == ((want) >> 16) && ((v) & 0xffff) >= ((want) & 0xffff))
/* Either layout: the client reads only the fields both have. */
#define REF_P2P_PAGE_TABLE_OK(v) \
	(REF_P2P_VERSION_OK(v, REF_P2P_PAGE_TABLE_VERSION) || \
	 REF_P2P_VERSION_OK(v, REF_P2P_PAGE_TABLE_VERSION_V2))
#define REF_P2P_PAGE_SIZE_64KB 1

struct ref_p2p_page {
	u64 physical_address;
	u32 request_registers[6];
};

struct ref_p2p_page_table {
	u32 version;
	u32 page_size;
	struct ref_p2p_page **pages;
	u32 entries;
	u8 *gpu_uuid;
};

#ifdef CONFIG_64BIT
static_assert(sizeof(struct ref_p2p_page) == 32);
static_assert(offsetof(struct ref_p2p_page_table, entries) == 16);
static_assert(sizeof(struct ref_p2p_page_table) == 32);
#endif

typedef int (*ref_p2p_get_pages_fn)(u64 token, u32 va_space, u64 va, u64 len,
				    struct ref_p2p_page_table **pt,
				    void (*free_cb)(void *data), void *data);
typedef int (*ref_p2p_put_pages_fn)(u64 token, u32 va_space, u64 va,
				    struct ref_p2p_page_table *pt);
typedef int (*ref_p2p_get_persistent_fn)(u64 va, u64 len,
					 struct ref_p2p_page_table **pt,
					 u32 flags);
typedef int (*ref_p2p_put_persistent_fn)(u64 va,
					 struct ref_p2p_page_table *pt,
					 u32 flags);

#endif /* REFCLIENT_ABI_H */
