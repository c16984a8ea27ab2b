/* SPDX-License-Identifier: GPL-2.0 */
/* Enumeration stand-in for <linux/mm.h>; see types.h beside it. */
#include <linux/types.h>
struct scatterlist;
struct sg_table;
struct device;
struct pci_dev;
struct page;
