/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * gpusim_testclient.h - user-space interface of /dev/gpusim_testclient, a
 * small kernel-side nvidia_p2p client used by the gpusim tests: it lets a
 * test process pin its own gpusim memory (nvidia_p2p_get_pages in the
 * process's context), DMA-map it for a real PCI device, unpin it, and see
 * whether and how often the free callback ran.
 *
 * Every command takes a struct gpusim_tc_req; the ioctl itself returns 0
 * when the command could be carried out (or an errno such as ENOENT for an
 * unknown registration id), and @ret carries the return value of the
 * nvidia_p2p_* call it made.
 *
 * The DMA peer is the PCI device named by the module parameter peer= (e.g.
 * peer=0000:00:04.0, the rig's RDMA DMA device), by default the first PCI
 * device with a DMA mask. GET with GPUSIM_TC_MAP and FORGET with
 * GPUSIM_TC_UNMAP pin + map and unmap + unpin in one call each: what a
 * client does for one registration, with nothing in between (the floor of
 * scripts/bench.sh).
 */
#ifndef GPUSIM_TESTCLIENT_H
#define GPUSIM_TESTCLIENT_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* @flags for GPUSIM_TC_GET */
#define GPUSIM_TC_PERSISTENT	0x0001	/* nvidia_p2p_get_pages_persistent */
#define GPUSIM_TC_NULL_CB	0x0002	/* pass a NULL free_callback */
#define GPUSIM_TC_NULL_DATA	0x0004	/* pass NULL callback data */
#define GPUSIM_TC_TOKEN		0x0008	/* pass p2p_token = 1 */
#define GPUSIM_TC_BAD_FLAGS	0x0010	/* persistent: pass flags = 1 */
#define GPUSIM_TC_MAP		0x0020	/* then nvidia_p2p_dma_map_pages for the
					 * DMA peer in the same call (@ret: the
					 * first call that failed; a failed map
					 * puts the pages again) */
#define GPUSIM_TC_HOLD_LOCK	0x0080	/* hold the file's lock, which the free
					 * callback takes, across get_pages: a
					 * lock-order cycle with the RM lock */
/* what the free callback does (GET flags) */
#define GPUSIM_TC_CB_UNMAP	0x0100	/* dma_unmap_pages + free_dma_mapping */
#define GPUSIM_TC_CB_PUT	0x0200	/* try nvidia_p2p_put_pages (must fail) */
#define GPUSIM_TC_PFLAGS	0x8000	/* persistent GET and PUT: pass @p_flags
					 * as the flags argument */
/* @flags for GPUSIM_TC_DMA_MAP */
#define GPUSIM_TC_NULL_PEER	0x1000	/* pass a NULL pci_dev */
#define GPUSIM_TC_BOGUS_PEER	0x2000	/* pass to_pci_dev(NULL) (DMA_MAP only) */
#define GPUSIM_TC_FAKE_PEER	0x4000	/* pass a zeroed pci_dev with a DMA mask
					 * that is not on the PCI bus (DMA_MAP only) */

struct gpusim_tc_req {
	__u64 va;		/* in: GET, GUP, READ/WRITE offset base */
	__u64 len;		/* in: GET, GUP, READ/WRITE */
	__u64 buf;		/* in: READ/WRITE user buffer */
	__u64 off;		/* in: READ/WRITE offset into the pinned range */
	__u64 phys0;		/* out: physical address of page 0 */
	__u64 dma0;		/* out: DMA address of page 0 */
	__u32 id;		/* in/out: registration */
	__u32 flags;		/* in */
	__s32 ret;		/* out: return of the nvidia_p2p_* call */
	__u32 entries;		/* out: page table entries */
	__u32 page_size;	/* out: page table page_size (enum) */
	__u32 version_ok;	/* out: NVIDIA_P2P_*_VERSION_COMPATIBLE */
	__u32 callbacks;	/* out: free callbacks seen */
	__u32 pinned;		/* out: still pinned (not put, no callback) */
	__u32 runs;		/* out: physically contiguous runs (GET) */
	__u32 dma_entries;	/* out: DMA mapping entries */
	__u32 dma_runs;		/* out: DMA-contiguous runs */
	__s32 cb_ret;		/* out: what the callback's extra call returned */
	__u32 cb_delay_ms;	/* in: GET: the callback sleeps this long */
	__u32 dma_segs;		/* out: DMA-contiguous runs split where the DMA
				 * peer's max segment size or segment boundary
				 * requires: the fewest scatter entries a
				 * client can hand that device */
	__u32 pt_version;	/* out: the page table's version word */
	__u32 pt_flags;		/* out: its flags (read only from a version
				 * 2.x table, which has them; else 0) */
	__u32 pt_bytes;		/* out: ksize() of the page table's
				 * allocation (32: a version-1.2 table with no
				 * room for flags) */
	__u32 p_flags;		/* in: GPUSIM_TC_PFLAGS */
	__s32 ret2;		/* out: RSYNC */
	__s32 ret3;		/* out: RSYNC */
};

#define GPUSIM_TC_MAGIC 'g'
#define GPUSIM_TC_GET		_IOWR(GPUSIM_TC_MAGIC, 1, struct gpusim_tc_req)
#define GPUSIM_TC_PUT		_IOWR(GPUSIM_TC_MAGIC, 2, struct gpusim_tc_req)
#define GPUSIM_TC_DMA_MAP	_IOWR(GPUSIM_TC_MAGIC, 3, struct gpusim_tc_req)
#define GPUSIM_TC_DMA_UNMAP	_IOWR(GPUSIM_TC_MAGIC, 4, struct gpusim_tc_req)
#define GPUSIM_TC_STATUS	_IOWR(GPUSIM_TC_MAGIC, 5, struct gpusim_tc_req)
/* copy @len bytes at @off of the pinned range to/from @buf through the
 * kernel's linear map of page->physical_address (gpusim memory is RAM) */
#define GPUSIM_TC_READ		_IOWR(GPUSIM_TC_MAGIC, 6, struct gpusim_tc_req)
#define GPUSIM_TC_WRITE		_IOWR(GPUSIM_TC_MAGIC, 7, struct gpusim_tc_req)
/* pin_user_pages_fast(@va, FOLL_WRITE) on one page: @ret is its result */
#define GPUSIM_TC_GUP		_IOWR(GPUSIM_TC_MAGIC, 8, struct gpusim_tc_req)
/* forget a registration (puts it first if still pinned; with @flags
 * GPUSIM_TC_UNMAP, nvidia_p2p_dma_unmap_pages its DMA mapping before that,
 * as a client does, instead of leaving it for gpusim to reap) */
#define GPUSIM_TC_FORGET	_IOWR(GPUSIM_TC_MAGIC, 9, struct gpusim_tc_req)
/* nvidia_p2p_get_rsync_registers(&info) in @ret (a success is put again),
 * nvidia_p2p_get_rsync_registers(NULL) in @ret2, and
 * nvidia_p2p_register_rsync_driver() of a valid driver in @ret3
 * (unregistered again on success) */
#define GPUSIM_TC_RSYNC		_IOWR(GPUSIM_TC_MAGIC, 10, struct gpusim_tc_req)
/* @flags for GPUSIM_TC_FORGET */
#define GPUSIM_TC_UNMAP		0x0040

#endif /* GPUSIM_TESTCLIENT_H */
