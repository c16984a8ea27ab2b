// SPDX-License-Identifier: GPL-2.0
/*
 * C glue of peermem's PFN-map page source (docs/module.md, "PFN-mapped
 * memory"): the module parameter, the PFN walk under the mmap lock
 * (follow_pfnmap_start/end, 6.12+), the lookup of a PCI BAR and its
 * peer-to-peer path (pci_p2pdma_distance) and the DMA mapping of the runs
 * (dma_map_resource, or a BAR's bus addresses). The walk classifies what
 * it finds here (firmware RAM, which BAR holds a run, the peer-to-peer map
 * type); what to do with a range is decided in Rust
 * (rust/client/source/pfn.rs, rust/kapi/pfnmap.rs); see
 * include/peermem_pfnmap.h for the contract.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/ratelimit.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sizes.h>
#include <linux/slab.h>

#include "peermem_ffi.h"

static bool pfnmap;
module_param(pfnmap, bool, 0444);
MODULE_PARM_DESC(pfnmap,
		 "Serve memory registrations on PFN-mapped memory (mmap of a driver that uses remap_pfn_range: VM_PFNMAP) when it is RAM the kernel does not manage (reserved at boot, PageReserved), revoking the registration through the core when the mapping changes (default N: the driver that exports the memory must zap user mappings before it reuses the memory, see docs/module.md; needs mmu_notifier=Y and enable_invalidate=Y)");

static bool pfnmap_ram_only;
module_param(pfnmap_ram_only, bool, 0444);
MODULE_PARM_DESC(pfnmap_ram_only,
		 "With pfnmap=Y, serve reserved RAM only, never a PCI device's memory BAR (default N: a BAR is served when the RDMA device can reach it peer-to-peer, as pci_p2pdma_distance says: both below one PCIe switch with no ACS redirect between them, or a host bridge the kernel knows to route peer-to-peer)");

bool peermem_param_pfnmap(void)
{
	return pfnmap;
}

void peermem_pfn_put_dev(struct pci_dev *dev)
{
	pci_dev_put(dev);
}

void peermem_pfn_free(void *p)
{
	kvfree(p);
}

/*
 * The walk of a range (peermem_pfn_resolve()): every page's PFN is read
 * (follow_pfnmap_start/end, the kernel's walk), neighbouring pages of one
 * kind whose PFNs follow each other make one run, and what the memory is
 * (RAM by the firmware's map, which PCI BAR) is decided once per run, not
 * per page: a lookup in the resource tree or the PCI device list costs far
 * more than reading a page-table entry.
 */
struct peermem_pfn_ctx {
	struct peermem_pfn_walk *walk;
	struct peermem_pfn_run *runs;
	u32 n, cap;
	u32 kind;		/* the last run's page kind (enum below) */
	u64 run_addr;		/* the user address of the last run's first page */
	struct pci_dev *bar_dev;	/* with a reference, once a run is a BAR */
	int bar;
	/*
	 * A stretch [lo, hi) the firmware's map says is RAM, from an earlier
	 * lookup: [0] System RAM, [1] System RAM or "Reserved".
	 */
	struct {
		u64 lo, hi;
	} fw[2];
};

static_assert(PEERMEM_PFN_MAX_RUNS * sizeof(struct peermem_pfn_run) == SZ_4M);

/* What a page is by its struct page alone (no lookup); a run has one kind. */
enum {
	PEERMEM_PAGE_RESERVED,	/* in the memory map, PageReserved */
	PEERMEM_PAGE_NO_MEMMAP,	/* outside the memory map (!pfn_valid) */
	PEERMEM_PAGE_ZERO,	/* the shared zero page */
	PEERMEM_PAGE_MANAGED,	/* RAM the page allocator manages */
	PEERMEM_PAGE_DEVICE,	/* ZONE_DEVICE: a BAR its driver published (P2PDMA) */
};

static u32 peermem_pfn_page_kind(unsigned long pfn)
{
	struct page *page;

	if (is_zero_pfn(pfn))
		return PEERMEM_PAGE_ZERO;
	if (!pfn_valid(pfn))
		return PEERMEM_PAGE_NO_MEMMAP;
	page = pfn_to_page(pfn);
	if (is_zone_device_page(page))
		return PEERMEM_PAGE_DEVICE;
	return PageReserved(page) ? PEERMEM_PAGE_RESERVED : PEERMEM_PAGE_MANAGED;
}

/* walk_iomem_res_desc() callback: extends *arg over a resource that starts by it. */
static int peermem_fw_extend(struct resource *res, void *arg)
{
	u64 *next = arg;

	if (res->start > *next)
		return 1;	/* a gap: stop */
	*next = max_t(u64, *next, res->end + 1);
	return 0;
}

/*
 * The end of the stretch from @pos on that resources of one kind (flags,
 * desc; nested or not) cover without a gap: @pos if none covers @pos.
 */
static u64 peermem_fw_covered(struct peermem_pfn_walk *walk, u64 pos,
			      unsigned long flags, unsigned long desc)
{
	u64 next = pos;

	walk->lookups++;
	walk_iomem_res_desc(desc, flags, pos, U64_MAX, &next, peermem_fw_extend);
	return next;
}

/*
 * Whether the firmware's memory map (/proc/iomem) says all of [phys, phys +
 * len) is System RAM, or with reserved_too System RAM or "Reserved"
 * (memmap=nn$ss, a no-map reserved-memory region).
 */
static bool peermem_pfn_firmware_ram(struct peermem_pfn_ctx *c, u64 phys, u64 len,
				     bool reserved_too)
{
	u64 pos = phys, end = phys + len;

	if (phys >= c->fw[reserved_too].lo && end <= c->fw[reserved_too].hi)
		return true;
	while (pos < end) {
		u64 next = peermem_fw_covered(c->walk, pos, IORESOURCE_SYSTEM_RAM,
					      IORES_DESC_NONE);

		if (reserved_too && next < end)
			next = max(next, peermem_fw_covered(c->walk, pos, IORESOURCE_MEM,
							    IORES_DESC_RESERVED));
		if (next == pos)
			return false;
		pos = next;
	}
	c->fw[reserved_too].lo = phys;
	c->fw[reserved_too].hi = pos;
	return true;
}

/* Whether BAR @bar of @dev holds [phys, phys + len) whole. */
static bool peermem_bar_holds(struct pci_dev *dev, int bar, u64 phys, u64 len)
{
	const struct resource *r = &dev->resource[bar];

	return (r->flags & IORESOURCE_MEM) && r->end > r->start &&
	       phys >= r->start && phys + len - 1 <= r->end;
}

/* The PCI device (with a reference) and memory BAR holding the page at phys. */
static struct pci_dev *peermem_pfn_find_bar(u64 phys, int *bar)
{
	struct pci_dev *dev = NULL;
	int i;

	while ((dev = pci_get_device(PCI_ANY_ID, PCI_ANY_ID, dev))) {
		for (i = 0; i < PCI_STD_NUM_BARS; i++) {
			if (peermem_bar_holds(dev, i, phys, PAGE_SIZE)) {
				*bar = i;
				return dev;
			}
		}
	}
	return NULL;
}

/*
 * What a run that is not RAM may still be: in the BAR the range's earlier
 * runs are in (c->bar_dev, c->bar), or, for the first run, in any PCI
 * device's memory BAR, which then becomes c->bar_dev, c->bar.
 */
static u32 peermem_pfn_classify_bar(struct peermem_pfn_ctx *c, const struct peermem_pfn_run *r)
{
	struct pci_dev *d;
	int b;

	if (c->bar_dev && peermem_bar_holds(c->bar_dev, c->bar, r->phys, r->len))
		return PEERMEM_PFN_OK;
	d = peermem_pfn_find_bar(r->phys, &b);
	if (!d)
		return PEERMEM_PFN_NOT_RAM;
	/* Past the BAR's end, or after other runs: more than one BAR or kind. */
	if (pfnmap_ram_only || c->bar_dev || c->n > 1 ||
	    !peermem_bar_holds(d, b, r->phys, r->len)) {
		pci_dev_put(d);
		return pfnmap_ram_only ? PEERMEM_PFN_BAR_RAM_ONLY : PEERMEM_PFN_MIXED;
	}
	c->bar_dev = d;
	c->bar = b;
	return PEERMEM_PFN_OK;
}

/* Whether the last run is served: 0, or why not. */
static u32 peermem_pfn_classify_run(struct peermem_pfn_ctx *c)
{
	const struct peermem_pfn_run *r = &c->runs[c->n - 1];
	u32 why;

	switch (c->kind) {
	case PEERMEM_PAGE_ZERO:
		return PEERMEM_PFN_ZERO_PAGE;
	case PEERMEM_PAGE_MANAGED:
		return PEERMEM_PFN_MANAGED_RAM;
	case PEERMEM_PAGE_RESERVED:
		/*
		 * Holes inside the kernel's memory map have reserved struct
		 * pages too, device memory among them (the legacy VGA window
		 * at 0xa0000, a BAR that shares a memory section with RAM):
		 * RAM only where the firmware's map says RAM or reserved.
		 */
		why = peermem_pfn_firmware_ram(c, r->phys, r->len, true) ?
			PEERMEM_PFN_OK : PEERMEM_PFN_NOT_RAM;
		break;
	case PEERMEM_PAGE_NO_MEMMAP:
		/*
		 * Outside the memory map: only System RAM (a "Reserved" range
		 * there may as well be a chipset's MMIO).
		 */
		why = peermem_pfn_firmware_ram(c, r->phys, r->len, false) ?
			PEERMEM_PFN_OK : PEERMEM_PFN_NOT_RAM;
		break;
	default:
		why = PEERMEM_PFN_NOT_RAM;
	}
	/* A range is all RAM or all one BAR. */
	if (why == PEERMEM_PFN_NOT_RAM)
		return peermem_pfn_classify_bar(c, r);
	return c->bar_dev ? PEERMEM_PFN_MIXED : why;
}

/*
 * Adds the page at @addr (PFN @pfn) to the runs: it extends the last run,
 * or that run is classified (*why, *where if refused) and a new one begins.
 * -ENOMEM: out of memory, or the list would pass PEERMEM_PFN_MAX_RUNS runs
 * (walk->over_limit).
 */
static int peermem_pfn_add(struct peermem_pfn_ctx *c, u64 addr, unsigned long pfn,
			   u32 *why, u64 *where)
{
	u32 kind = peermem_pfn_page_kind(pfn);
	u64 phys = PFN_PHYS(pfn);

	if (c->n) {
		struct peermem_pfn_run *last = &c->runs[c->n - 1];

		if (kind == c->kind && kind != PEERMEM_PAGE_ZERO &&
		    last->phys + last->len == phys) {
			last->len += PAGE_SIZE;
			return 0;
		}
		*why = peermem_pfn_classify_run(c);
		if (*why) {
			*where = c->run_addr;
			return 0;
		}
	}
	if (c->n == PEERMEM_PFN_MAX_RUNS) {
		c->walk->over_limit = true;
		return -ENOMEM;
	}
	if (c->n == c->cap) {
		u32 cap2 = min_t(u32, c->cap ? c->cap * 2 : 16, PEERMEM_PFN_MAX_RUNS);
		/* Made for the registering process: its memory cgroup pays. */
		struct peermem_pfn_run *r = kvmalloc_array(cap2, sizeof(*r),
							   GFP_KERNEL_ACCOUNT);

		if (!r)
			return -ENOMEM;
		if (c->n)
			memcpy(r, c->runs, c->n * sizeof(*r));
		kvfree(c->runs);
		c->runs = r;
		c->cap = cap2;
	}
	c->runs[c->n].phys = phys;
	c->runs[c->n].len = PAGE_SIZE;
	c->n++;
	c->kind = kind;
	c->run_addr = addr;
	return 0;
}

int peermem_pfn_resolve(u64 start, u64 len, struct peermem_pfn_walk *walk,
			struct peermem_pfn_run **runs,
			u32 *nruns, bool *writable, u32 *why, u64 *where,
			struct pci_dev **bar_dev, int *bar)
{
	struct peermem_pfn_ctx c = { .walk = walk };
	struct mm_struct *mm = current->mm;
	u64 addr = start, end;
	int ret = 0;

	*runs = NULL;
	*nruns = 0;
	*bar_dev = NULL;
	*bar = 0;
	*writable = true;
	*why = PEERMEM_PFN_OK;
	*where = 0;
	walk->pages = 0;
	walk->lookups = 0;
	walk->killed = false;
	walk->over_limit = false;
	if (!mm || (current->flags & PF_KTHREAD) || !len ||
	    !PAGE_ALIGNED(start) || !PAGE_ALIGNED(len) ||
	    check_add_overflow(start, len, &end))
		return -EINVAL;
	if (mmap_read_lock_killable(mm))
		return -EINTR;
	while (addr < end && !*why) {
		struct vm_area_struct *vma = vma_lookup(mm, addr);
		u64 vend;

		*where = addr;
		if (!vma) {
			*why = PEERMEM_PFN_NO_VMA;
			break;
		}
		if (!(vma->vm_flags & VM_PFNMAP)) {
			*why = PEERMEM_PFN_NOT_PFNMAP;
			break;
		}
		/*
		 * A copy-on-write mapping may get anonymous copies of its
		 * pages, which reclaim and migration handle. (is_cow_mapping()
		 * on 6.12, vma_is_cow_mapping() on 7.x: the test is spelled out.)
		 */
		if ((vma->vm_flags & (VM_SHARED | VM_MAYWRITE)) == VM_MAYWRITE) {
			*why = PEERMEM_PFN_PRIVATE;
			break;
		}
		if (!(vma->vm_flags & VM_WRITE))
			*writable = false;
		vend = min_t(u64, end, vma->vm_end);
		/* A probe reads the first page only; the mappings all. */
		if (walk->probe && walk->pages)
			addr = vend;
		for (; addr < vend; addr += PAGE_SIZE) {
			struct follow_pfnmap_args args = {
				.vma = vma,
				.address = addr,
			};
			unsigned long pfn;

			if (follow_pfnmap_start(&args)) {
				*why = PEERMEM_PFN_NOT_PRESENT;
				*where = addr;
				break;
			}
			pfn = args.pfn;
			if (!args.writable)
				*writable = false;
			follow_pfnmap_end(&args);
			walk->pages++;
			ret = peermem_pfn_add(&c, addr, pfn, why, where);
			if (ret)
				goto out;
			if (*why || walk->probe)
				break;
			/*
			 * A range may be a TiB: yield between pages (the mmap
			 * lock is a sleeping lock, no spinlock is held here),
			 * and stop for a fatal signal.
			 */
			if (fatal_signal_pending(current)) {
				walk->killed = true;
				ret = -EINTR;
				goto out;
			}
			cond_resched();
			if (walk->delay_ms && !(walk->pages % PEERMEM_PFN_WALK_BATCH))
				msleep(walk->delay_ms);
		}
		if (walk->probe)
			addr = vend;
	}
	/* The last run. */
	if (!*why && c.n) {
		*why = peermem_pfn_classify_run(&c);
		if (*why)
			*where = c.run_addr;
	}
out:
	mmap_read_unlock(mm);
	if (ret || *why) {
		kvfree(c.runs);
		pci_dev_put(c.bar_dev);
		return ret;
	}
	*runs = c.runs;
	*nruns = c.n;
	*bar_dev = c.bar_dev;
	*bar = c.bar;
	return 0;
}

/* Whether @port redirects peer requests upstream (ACS control, read now). */
static bool peermem_acs_redirects(struct pci_dev *port)
{
	u16 ctrl;

	if (!port->acs_cap)
		return false;
	pci_read_config_word(port, port->acs_cap + PCI_ACS_CTRL, &ctrl);
	return ctrl & (PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC);
}

/*
 * How @client reaches a BAR of @provider peer-to-peer: -EOPNOTSUPP if
 * pci_p2pdma_distance() says it cannot, else PEERMEM_P2P_BUS_ADDR when both
 * sit below a common bridge and no port on the way redirects peer requests
 * (the switch routes the bus address to the BAR, no IOMMU on the way), else
 * PEERMEM_P2P_RESOURCE (through a host bridge the kernel allows: mapped
 * like any resource, through the IOMMU if there is one). The kernel's
 * pci_p2pdma_map_type() cannot answer this for a BAR whose driver did not
 * set up P2PDMA itself, which is every BAR a PFN map can show us; this
 * follows the same rules (calc_map_type_and_dist in drivers/pci/p2pdma.c).
 */
static int peermem_p2pdma_map_type(struct pci_dev *provider, struct pci_dev *client)
{
	static DEFINE_RATELIMIT_STATE(rs, 60 * HZ, 1);
	struct pci_dev *a, *b;
	bool redirect = false;

	if (pci_p2pdma_distance(provider, &client->dev, false) < 0) {
		/* Again, verbose: the kernel says why and what to change. */
		if (__ratelimit(&rs))
			pci_p2pdma_distance(provider, &client->dev, true);
		return -EOPNOTSUPP;
	}
	for (a = provider; a; a = pci_upstream_bridge(a)) {
		if (peermem_acs_redirects(a))
			redirect = true;
		for (b = client; b; b = pci_upstream_bridge(b))
			if (a == b)
				goto common;
	}
	return PEERMEM_P2P_RESOURCE;
common:
	for (b = client; b != a; b = pci_upstream_bridge(b))
		if (peermem_acs_redirects(b))
			redirect = true;
	return redirect ? PEERMEM_P2P_RESOURCE : PEERMEM_P2P_BUS_ADDR;
}

int peermem_pfn_dma_map(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			u32 nruns, bool writable, struct pci_dev *bar_dev, int bar,
			u64 **dma, u32 *how)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u64 *d;
	u32 i;

	*dma = NULL;
	*how = PEERMEM_P2P_RESOURCE;
	if (bar_dev) {
		int t = peermem_p2pdma_map_type(bar_dev, pdev);

		if (t < 0)
			return t;
		*how = t;
	}
	/* In the registering process (the core's dma_map): its cgroup pays. */
	d = kvmalloc_array(nruns, sizeof(*d), GFP_KERNEL_ACCOUNT);
	if (!d)
		return -ENOMEM;
	if (*how == PEERMEM_P2P_BUS_ADDR) {
		/* pci_p2pdma_bus_addr_map(): the BAR's CPU-to-bus offset. */
		u64 off = pci_bus_address(bar_dev, bar) - pci_resource_start(bar_dev, bar);

		for (i = 0; i < nruns; i++)
			d[i] = runs[i].phys + off;
		*dma = d;
		return 0;
	}
	for (i = 0; i < nruns; i++) {
		/*
		 * dma_map_resource: no struct page is used (the memory may have
		 * none), and DMA-API debug accepts it for PageReserved RAM.
		 */
		dma_addr_t a = dma_map_resource(&pdev->dev, runs[i].phys,
						runs[i].len, dir, 0);

		if (dma_mapping_error(&pdev->dev, a)) {
			while (i--)
				dma_unmap_resource(&pdev->dev, d[i], runs[i].len, dir, 0);
			kvfree(d);
			return -EIO;
		}
		d[i] = a;
		/* Up to PEERMEM_PFN_MAX_RUNS runs. */
		cond_resched();
	}
	*dma = d;
	return 0;
}

void peermem_pfn_dma_unmap(struct pci_dev *pdev, const struct peermem_pfn_run *runs,
			   u32 nruns, bool writable, u32 how, u64 *dma)
{
	enum dma_data_direction dir = writable ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	u32 i;

	if (how != PEERMEM_P2P_BUS_ADDR)
		for (i = 0; i < nruns; i++) {
			dma_unmap_resource(&pdev->dev, dma[i], runs[i].len, dir, 0);
			/* Up to PEERMEM_PFN_MAX_RUNS runs; callers may sleep. */
			cond_resched();
		}
	kvfree(dma);
}
