/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nv_p2p_abi.h - the NVIDIA GPU peer-to-peer page-table interface exported
 * by nvidia.ko (550 to 595 driver series), as seen from a third-party module.
 *
 * peermem's own declaration of that binary interface. By default it is the
 * 550 interface: every name, type, size, offset and constant equals those
 * of the nv-p2p.h shipped with the 550.163.01 open kernel modules, and
 * tests/host/abi/run.sh compares them and fails on any difference. What
 * later drivers changed (see "Page-table layouts" below) is declared here
 * too; those names, and the layout with PEERMEM_NV_P2P_PAGE_TABLE_MAJOR
 * set to 2, are checked against the facts in tests/host/abi/nv_p2p_newer.tsv.
 * tests/gpusim implements the same interface for the test rig.
 *
 * The exported functions are GPL-only. Usable from kernel C and bindgen.
 */
#ifndef PEERMEM_INCLUDE_NV_P2P_ABI_H
#define PEERMEM_INCLUDE_NV_P2P_ABI_H

#include <linux/types.h>

struct pci_dev;

/*
 * Versioning. Every structure the driver allocates for a client starts
 * with a u32 version: high half = major, low half = minor. A client built
 * against version v accepts a structure p when the majors are equal and
 * p's minor is at least v's minor.
 */
#define NVIDIA_P2P_MAJOR_VERSION_MASK 0xffff0000
#define NVIDIA_P2P_MINOR_VERSION_MASK 0x0000ffff

#define NVIDIA_P2P_MAJOR_VERSION(v) \
	(((v) & NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16)
#define NVIDIA_P2P_MINOR_VERSION(v) \
	(((v) & NVIDIA_P2P_MINOR_VERSION_MASK))

/* p: pointer to a versioned structure; v: the version compiled against. */
#define NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION((p)->version) == NVIDIA_P2P_MAJOR_VERSION(v))
#define NVIDIA_P2P_VERSION_COMPATIBLE(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) && \
	 (NVIDIA_P2P_MINOR_VERSION((p)->version) >= NVIDIA_P2P_MINOR_VERSION(v)))

/* ---- Legacy mailbox interface (Tesla/Fermi era; the 550 driver refuses it) */

enum {
	NVIDIA_P2P_ARCHITECTURE_TESLA = 0,
	NVIDIA_P2P_ARCHITECTURE_FERMI,
	NVIDIA_P2P_ARCHITECTURE_CURRENT = NVIDIA_P2P_ARCHITECTURE_FERMI
};

#define NVIDIA_P2P_PARAMS_VERSION 0x00010001

enum {
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_GPU = 0,
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_THIRD_PARTY_DEVICE,
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_MAX =
		NVIDIA_P2P_PARAMS_ADDRESS_INDEX_THIRD_PARTY_DEVICE
};

/* Length in bytes of the GPU UUID a page table points to. */
#define NVIDIA_P2P_GPU_UUID_LEN 16

typedef struct nvidia_p2p_params {
	u32 version;
	u32 architecture;
	union nvidia_p2p_mailbox_addresses {
		struct {
			u64 wmb_addr;
			u64 wmb_data;
			u64 rreq_addr;
			u64 rcomp_addr;
			u64 reserved[2];
		} fermi;
	} addresses[NVIDIA_P2P_PARAMS_ADDRESS_INDEX_MAX + 1];
} nvidia_p2p_params_t;

/* Defined when nvidia_p2p_{get,put}_pages_persistent() exist. */
#define NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API

/* Both unsupported by the 550 driver (they fail). */
int nvidia_p2p_init_mapping(u64 p2p_token, struct nvidia_p2p_params *params,
			    void (*destroy_callback)(void *data), void *data);
int nvidia_p2p_destroy_mapping(u64 p2p_token);

/* ---- Page tables */

/* Value of nvidia_p2p_page_table.page_size (GPU pages are 64 KiB). */
enum nvidia_p2p_page_size_type {
	NVIDIA_P2P_PAGE_SIZE_4KB = 0,
	NVIDIA_P2P_PAGE_SIZE_64KB,
	NVIDIA_P2P_PAGE_SIZE_128KB,
	NVIDIA_P2P_PAGE_SIZE_COUNT
};

/*
 * One GPU page: its physical (BAR) address; the register block is a
 * legacy leftover.
 */
typedef struct nvidia_p2p_page {
	u64 physical_address;
	union nvidia_p2p_request_registers {
		struct {
			u32 wreqmb_h;
			u32 rreqmb_h;
			u32 rreqmb_0;
			u32 reserved[3];
		} fermi;
	} registers;
} nvidia_p2p_page_t;

/*
 * Page-table layouts. The driver fills in the version of the layout it
 * allocated; the two that exist:
 *
 *  v1.2 (0x00010002): drivers 550 to 575. Five fields, 32 bytes on a
 *       64-bit kernel.
 *  v2.0 (0x00020000): drivers from 580.65.06 on. The same five fields at
 *       the same offsets, then a u32 `flags` (at byte 32, 40 bytes in all).
 *       Only the new field changed, yet the major went up, so the
 *       compatibility rule above makes a client built for one major refuse
 *       tables of the other. peermem accepts both (rust/kapi/nvidia_p2p.rs).
 *
 * PEERMEM_NV_P2P_PAGE_TABLE_MAJOR picks the layout this header declares as
 * struct nvidia_p2p_page_table and the NVIDIA_P2P_PAGE_TABLE_VERSION it
 * names: 1 (the default, the 550 header's view) or 2 (the 580+ view). A
 * client that reads tables of both majors keeps the default and reads
 * `flags` only from a table whose major is 2, at
 * NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET: a v1.2 table ends before it.
 */
#define NVIDIA_P2P_PAGE_TABLE_VERSION_V1 0x00010002
#define NVIDIA_P2P_PAGE_TABLE_VERSION_V2 0x00020000
#define NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET 32
#define NVIDIA_P2P_PAGE_TABLE_V2_SIZE 40

/*
 * Bits of `flags` (v2.0 tables). CPU_CACHEABLE: the pages are GPU memory
 * the CPU may cache, i.e. a cache-coherent GPU (NVLink-C2C, Grace Hopper)
 * whose pages the driver addresses by their system physical address; on a
 * PCIe GPU (BAR1 addresses) the bit is clear. See docs/module.md for what
 * it means for a mapping by a NIC.
 */
#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE 0x1

#ifndef PEERMEM_NV_P2P_PAGE_TABLE_MAJOR
#define PEERMEM_NV_P2P_PAGE_TABLE_MAJOR 1
#endif

#if PEERMEM_NV_P2P_PAGE_TABLE_MAJOR == 2
#define NVIDIA_P2P_PAGE_TABLE_VERSION 0x00020000
#elif PEERMEM_NV_P2P_PAGE_TABLE_MAJOR == 1
#define NVIDIA_P2P_PAGE_TABLE_VERSION 0x00010002
#else
#error "PEERMEM_NV_P2P_PAGE_TABLE_MAJOR must be 1 or 2"
#endif
#define NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_PAGE_TABLE_VERSION)

/*
 * Allocated and owned by the driver.
 * @page_size: an enum nvidia_p2p_page_size_type value.
 * @pages:     @entries pointers, one per GPU page, in address order.
 * @gpu_uuid:  NVIDIA_P2P_GPU_UUID_LEN bytes identifying the GPU.
 * @flags:     NVIDIA_P2P_PAGE_TABLE_FLAGS_* bits. Exists only in tables
 *             whose major is 2 (driver 580 and later), and is declared
 *             only with PEERMEM_NV_P2P_PAGE_TABLE_MAJOR 2.
 */
typedef struct nvidia_p2p_page_table {
	u32 version;
	u32 page_size;
	struct nvidia_p2p_page **pages;
	u32 entries;
	u8 *gpu_uuid;
#if PEERMEM_NV_P2P_PAGE_TABLE_MAJOR == 2
	u32 flags;
#endif
} nvidia_p2p_page_table_t;

/*
 * Pin the GPU memory behind [virtual_address, virtual_address + length)
 * of the calling process (both 64 KiB aligned; only cudaMalloc-style
 * memory qualifies) and return its page table. p2p_token and va_space are
 * legacy and 0. When the memory is freed while still pinned, the driver
 * calls free_callback(data) (data must be non-NULL) and frees the page
 * table right after it returns. May sleep. 0, -EINVAL, -ENOTSUPP,
 * -ENOMEM or -EIO.
 */
int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 u64 length, struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);

/*
 * flags of nvidia_p2p_get_pages_persistent(), declared by drivers from
 * 570.86.15 on. FORCE_BAR1_MAPPING asks for BAR1 addresses on a coherent
 * GPU; such a table cannot be mapped with nvidia_p2p_dma_map_pages().
 * peermem always passes NVIDIA_P2P_FLAGS_DEFAULT.
 */
#define NVIDIA_P2P_FLAGS_DEFAULT 0
#define NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING 1

/*
 * Like nvidia_p2p_get_pages() without a free callback: the memory stays
 * until nvidia_p2p_put_pages_persistent(). flags must be 0 before 570;
 * from 570 on, bit 0 is FORCE_BAR1_MAPPING and other bits are ignored.
 */
int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table,
				    u32 flags);

/* ---- DMA mappings for a peer PCI device */

#define NVIDIA_P2P_DMA_MAPPING_VERSION 0x00020003
#define NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_DMA_MAPPING_VERSION)

/*
 * @dma_addresses: @entries bus addresses, one per page of the page table,
 *                 valid for DMA by @pci_dev.
 * @private:       the driver's own.
 */
typedef struct nvidia_p2p_dma_mapping {
	u32 version;
	enum nvidia_p2p_page_size_type page_size_type;
	u32 entries;
	u64 *dma_addresses;
	void *private;
	struct pci_dev *pci_dev;
} nvidia_p2p_dma_mapping_t;

/* Map a page table for DMA by peer. 0, -EINVAL, -ENOTSUPP or -EIO. */
int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping);

/* Undo nvidia_p2p_dma_map_pages(); the mapping is gone afterwards. */
int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping);

/*
 * Unpin pages from nvidia_p2p_get_pages() (token and va_space 0). Fails
 * once the free callback has run or is running. May sleep.
 */
int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table);

/* Unpin pages from nvidia_p2p_get_pages_persistent(); flags must be 0. */
int nvidia_p2p_put_pages_persistent(u64 virtual_address,
				    struct nvidia_p2p_page_table *page_table,
				    u32 flags);

/*
 * For use inside a free callback. Both do nothing in the 550 driver (the
 * driver frees the objects itself) and return 0, or -EINVAL.
 */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping);

/* ---- NVLink rsync (IBM NPU systems only) */

#define NVIDIA_P2P_RSYNC_DRIVER_VERSION 0x00010001
#define NVIDIA_P2P_RSYNC_DRIVER_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_RSYNC_DRIVER_VERSION)

typedef struct nvidia_p2p_rsync_driver {
	u32 version;
	int (*get_relaxed_ordering_mode)(int *mode, void *data);
	void (*put_relaxed_ordering_mode)(int mode, void *data);
	void (*wait_for_rsync)(struct pci_dev *gpu, void *data);
} nvidia_p2p_rsync_driver_t;

/* 0, -EINVAL or -EBUSY. */
int nvidia_p2p_register_rsync_driver(nvidia_p2p_rsync_driver_t *driver,
				     void *data);
void nvidia_p2p_unregister_rsync_driver(nvidia_p2p_rsync_driver_t *driver,
					void *data);

#define NVIDIA_P2P_RSYNC_REG_INFO_VERSION 0x00020001
#define NVIDIA_P2P_RSYNC_REG_INFO_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_RSYNC_REG_INFO_VERSION)

typedef struct nvidia_p2p_rsync_reg {
	void *ptr;
	size_t size;
	struct pci_dev *ibmnpu;
	struct pci_dev *gpu;
	u32 cluster_id;
	u32 socket_id;
} nvidia_p2p_rsync_reg_t;

typedef struct nvidia_p2p_rsync_reg_info {
	u32 version;
	nvidia_p2p_rsync_reg_t *regs;
	size_t entries;
} nvidia_p2p_rsync_reg_info_t;

/* Allocates *reg_info; free it with nvidia_p2p_put_rsync_registers(). */
int nvidia_p2p_get_rsync_registers(nvidia_p2p_rsync_reg_info_t **reg_info);
void nvidia_p2p_put_rsync_registers(nvidia_p2p_rsync_reg_info_t *reg_info);

#endif /* PEERMEM_INCLUDE_NV_P2P_ABI_H */
