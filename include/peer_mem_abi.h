/* SPDX-License-Identifier: GPL-2.0 */
/*
 * peer_mem_abi.h - the peer-memory client interface of MLNX_OFED/DOCA-OFED
 * ib_core, as seen from a client module.
 *
 * This is peermem's own declaration of that binary interface. Every name,
 * type, size, offset and constant here must equal the ones in the
 * peer_mem.h that NVIDIA ships with nvidia-peermem (Linux-OpenIB licensed);
 * tests/host/abi/run.sh compares the two and fails on any difference.
 * The semantics described in the comments are the ones peermem relies on;
 * see docs/architecture.md and the project's peer-memory reference notes.
 *
 * Usable from kernel C and from bindgen: only fixed-layout structs,
 * function-pointer members and plain constants.
 */
#ifndef PEERMEM_INCLUDE_PEER_MEM_ABI_H
#define PEERMEM_INCLUDE_PEER_MEM_ABI_H

#include <linux/types.h>
#include <linux/scatterlist.h>

struct device;

/* Sizes of the two fixed character arrays at the head of a client. */
#define IB_PEER_MEMORY_NAME_MAX 64
#define IB_PEER_MEMORY_VER_MAX 16

/*
 * Defined when core_context is passed as a u64 (older cores used a
 * pointer). Its value is a u32 ticket handed out by the core, so nothing
 * is lost on either representation.
 */
#define PEER_MEM_U64_CORE_CONTEXT

/*
 * struct peer_memory_client - what a client hands to the core.
 *
 * @name:    NUL-terminated client name; it names the client's sysfs
 *           directory in OFED's memory_peers tree.
 * @version: NUL-terminated version string. The last byte doubles as a
 *           marker: when it is non-zero this struct is the first member of
 *           a struct peer_memory_client_ex (so the string itself can hold
 *           at most IB_PEER_MEMORY_VER_MAX - 2 characters).
 *
 * The callbacks, in the order the core uses them for one user range:
 *
 * @acquire:   asked whether [addr, addr + size) belongs to this client.
 *             The two middle arguments are legacy and always NULL. Return
 *             1 and store a per-range context in *client_context to claim
 *             the range; 0 (or a negative errno) to decline. Only a claim
 *             is ever followed by release().
 * @get_pages: pin the range (raw, unaligned addr/size as the user gave
 *             them). write is always 1 (it means nothing). force is 1
 *             when the umem is read-only (the core passes !writable: a
 *             registration with none of the access flags that
 *             ib_access_writable() counts, LOCAL_WRITE, REMOTE_WRITE,
 *             REMOTE_ATOMIC, MW_BIND), 0 when the device may write to the
 *             memory; so force != 0 means read-only, and a read-only
 *             mapping may serve only such a registration. The sg_table
 *             argument is legacy and NULL. core_context is
 *             the core's ticket for this mapping: pass it back to the
 *             invalidate function the core returned at registration. From
 *             here on an invalidation may arrive. 0 or -errno; on success
 *             put_pages() follows eventually.
 * @dma_map:   fill the sg_table with DMA addresses usable by dma_device;
 *             every entry starts and ends on at least a PAGE_SIZE boundary
 *             (entries may be any multiple of PAGE_SIZE), so the range is
 *             widened to that alignment. dmasync is legacy (0). Store the
 *             number of mapped entries in *nmap. 0 or -errno; on failure
 *             the sg_table must be left untouched or valid.
 * @dma_unmap: undo dma_map for dma_device; must return 0. The core does
 *             not touch the sg_table afterwards.
 * @put_pages: unpin what get_pages pinned and free the sg_table contents.
 * @get_page_size: the client's page size for this context. The core calls
 *             it without a NULL check, so it must always be provided; a
 *             value above PAGE_SIZE makes the core trim the first and last
 *             entries to the requested range.
 * @release:   undo acquire, after all pages are unmapped and put.
 */
struct peer_memory_client {
	char name[IB_PEER_MEMORY_NAME_MAX];
	char version[IB_PEER_MEMORY_VER_MAX];
	int (*acquire)(unsigned long addr, size_t size, void *legacy_private,
		       char *legacy_name, void **client_context);
	int (*get_pages)(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *legacy_sg, void *client_context,
			 u64 core_context);
	int (*dma_map)(struct sg_table *sgt, void *client_context,
		       struct device *dma_device, int legacy_dmasync,
		       int *nmap);
	int (*dma_unmap)(struct sg_table *sgt, void *client_context,
			 struct device *dma_device);
	void (*put_pages)(struct sg_table *sgt, void *client_context);
	unsigned long (*get_page_size)(void *client_context);
	void (*release)(void *client_context);
};

/*
 * Flags of struct peer_memory_client_ex.
 *
 * PEER_MEM_INVALIDATE_UNMAPS: on invalidation the core only fences the
 * hardware and marks the mapping dead; it never calls dma_unmap/put_pages
 * for it afterwards. The client unmaps and unpins by itself once the
 * core's invalidate function has returned.
 */
enum {
	PEER_MEM_INVALIDATE_UNMAPS = 1 << 0,
};

/*
 * struct peer_memory_client_ex - extended registration.
 *
 * Registered by passing &ex->client with client.version[15] != 0.
 * @ex_size: sizeof(struct peer_memory_client_ex) as the client knows it;
 *           the core requires it to cover @flags.
 * @flags:   PEER_MEM_* bits.
 */
struct peer_memory_client_ex {
	struct peer_memory_client client;
	size_t ex_size;
	u32 flags;
};

/*
 * The core's invalidate entry point, returned through the second argument
 * of ib_register_peer_memory_client(). Call it with the registration
 * handle and the core_context given to get_pages() when the memory behind
 * a mapping goes away. An unknown or stale core_context is ignored. It may
 * sleep, and it must not be called with a lock held that get_pages() or
 * dma_map() can wait for.
 */
typedef int (*invalidate_peer_memory)(void *reg_handle, u64 core_context);

/*
 * Register a client. If invalidate_callback is non-NULL the client is an
 * invalidating one and the core stores its invalidate function there.
 * Returns an opaque handle, or NULL on failure.
 */
void *ib_register_peer_memory_client(const struct peer_memory_client *client,
				     invalidate_peer_memory *invalidate_callback);

/* Unregister; sleeps until no mapping uses the client any more. */
void ib_unregister_peer_memory_client(void *reg_handle);

#endif /* PEERMEM_INCLUDE_PEER_MEM_ABI_H */
