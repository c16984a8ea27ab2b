/* SPDX-License-Identifier: GPL-2.0 */
/*
 * gpusim_glue.h - C helpers of gpusim_glue.c called from Rust (glue.rs
 * declares the same prototypes), and the Rust callbacks it calls (dev.rs).
 */
#ifndef GPUSIM_GLUE_H
#define GPUSIM_GLUE_H

#include <linux/types.h>

struct file;
struct pci_dev;
struct vm_area_struct;

int gpusim_vma_install(struct vm_area_struct *vma, void *priv,
		       const u64 *chunk_phys, size_t nchunks,
		       size_t chunk_bytes, size_t size);
unsigned long gpusim_map_user(struct file *file, unsigned long hint,
			      unsigned long size, unsigned long pgoff);
size_t gpusim_max_chunk_bytes(void);
void *gpusim_chunk_alloc(size_t bytes, u64 *phys);
void gpusim_chunk_free(void *virt, size_t bytes);
void *gpusim_phys_to_virt(u64 phys);
bool gpusim_pci_dma_peer_ok(struct pci_dev *pdev);
int gpusim_dma_map(struct pci_dev *pdev, u64 phys, size_t len, u64 *dma);
void gpusim_dma_unmap(struct pci_dev *pdev, u64 dma, size_t len);
unsigned int gpusim_branch_param(void);

/* Implemented in Rust (dev.rs). */
u64 gpusim_rs_mmapdev_open(void);
void gpusim_rs_mmapdev_release(u64 id);
int gpusim_rs_mmapdev_mmap(u64 id, struct vm_area_struct *vma);
int gpusim_mmapdev_register(void);
void gpusim_mmapdev_deregister(void);
void gpusim_rs_vma_open(void *priv);
void gpusim_rs_vma_close(void *priv, struct vm_area_struct *vma);
void gpusim_rs_vma_moved(void *priv, struct vm_area_struct *vma,
			 unsigned long start);

#endif /* GPUSIM_GLUE_H */
