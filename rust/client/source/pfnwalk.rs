// SPDX-License-Identifier: GPL-2.0

//! What the PFN-map source serves, and how it maps it (docs/module.md,
//! "PFN-mapped memory"): the walk of a range's pages under the mmap lock
//! ([`PfnRuns::resolve`]), their runs, what memory a run is (reserved RAM
//! by the struct page and the firmware's map, which PCI BAR holds it) and
//! why a range is refused, and the DMA mapping of the runs
//! ([`PfnRuns::dma_map`]: `dma_map_resource`, or a BAR's bus addresses
//! when the RDMA device reaches it through a switch). The kernel's
//! concepts (the walk, the resource tree, PCI devices, DMA) are in
//! `kapi/pfnmap.rs`, `iomem.rs`, `pci.rs`, `dma.rs`; [`super::pfn`] counts
//! and reports.

use crate::kapi::delay;
use crate::kapi::device::PciDev;
use crate::kapi::dma::{Direction, PhysRun, ResourceMappings};
use crate::kapi::iomem::{self, Region};
use crate::kapi::kvmem::KvArray;
use crate::kapi::pci::{self, DevRef};
use crate::kapi::pfnmap::{self, MmReadGuard, PageKind, PAGE_SIZE};
use crate::kapi::sched;
use kernel::prelude::*;

/// Why a range is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An address with no mapping.
    NoMapping,
    /// A mapping that is not `VM_PFNMAP` (ordinary memory, which the core
    /// pins itself, or a mixed map).
    NotPfnmap,
    /// A copy-on-write mapping (private and writable).
    CopyOnWrite,
    /// No page-table entry yet (a driver that maps on fault).
    NotPresent,
    /// RAM the page allocator manages (not reserved): whoever mapped it may
    /// free it to the allocator; peermem cannot tell.
    ManagedRam,
    /// Device memory that is no PCI device's memory BAR (other MMIO, a
    /// firmware hole): not served, see docs/module.md.
    NotRam,
    /// The shared zero page.
    ZeroPage,
    /// A PCI BAR, and the `pfnmap_ram_only` parameter is on.
    BarRamOnly,
    /// RAM and a BAR, or two BARs, in one range.
    Mixed,
}

impl Refusal {
    /// What to tell the user (a kernel-log line).
    pub(crate) fn message(self) -> &'static core::ffi::CStr {
        match self {
            Self::NoMapping => c"pfnmap: an address of the range is not mapped; not served",
            Self::NotPfnmap => c"pfnmap: the range is not entirely a VM_PFNMAP mapping; not served",
            Self::CopyOnWrite => c"pfnmap: the PFN mapping is private and writable (copy on write); not served: map it MAP_SHARED",
            Self::NotPresent => c"pfnmap: a page of the PFN mapping is not mapped yet (the driver maps on fault); not served: touch every page first",
            Self::ManagedRam => c"pfnmap: the PFN mapping maps RAM the page allocator manages (not reserved), which its driver may free behind the mapping; not served",
            Self::NotRam => c"pfnmap: the PFN mapping maps device memory that is no PCI device's memory BAR, which peermem does not serve (docs/module.md, PFN-mapped memory); not served",
            Self::ZeroPage => c"pfnmap: the PFN mapping maps the shared zero page; not served",
            Self::BarRamOnly => c"pfnmap: the PFN mapping maps a PCI BAR and pfnmap_ram_only=Y; not served: load peermem with pfnmap_ram_only=N to serve BARs the RDMA device reaches peer-to-peer",
            Self::Mixed => c"pfnmap: the range maps RAM and a PCI BAR, or two BARs; not served: register each part on its own",
        }
    }
}

/// What [`PfnRuns::resolve`] found when it did not resolve the range.
pub(crate) enum Unresolved {
    /// Not memory this source serves: why, and the first address refused.
    Refused(Refusal, u64),
    /// An error (`EINVAL`, `ENOMEM`, `EINTR`).
    Failed(Error),
}

/// Pages between two sleeps of the walk's test knob (16 MiB).
const WALK_BATCH: u64 = 4096;

/// The most runs one range may have: the array is at most 4 MiB
/// (docs/module.md, "PFN-mapped memory", Limits), e.g. 1 GiB of pages no
/// two of which are physically contiguous.
pub(crate) const MAX_RUNS: usize = 262_144;

const _: () = assert!(MAX_RUNS * core::mem::size_of::<PhysRun>() == 4 << 20);

/// Runs the array has room for at first; it doubles up to [`MAX_RUNS`].
const FIRST_RUNS: usize = 16;

/// What one [`PfnRuns::resolve`] did, for the counters of the PFN-map
/// source (/sys/kernel/debug/peermem/pfn/walk_*), and its test knob.
pub(crate) struct Walk {
    /// In: test knob, sleep this long every [`WALK_BATCH`] pages.
    pub(crate) delay_ms: u32,
    /// In: check every mapping of the range, but read its first page only.
    probe: bool,
    /// Out: pages read (`follow_pfnmap_start/end`).
    pub(crate) pages: u64,
    /// Out: lookups in the firmware's resource map (/proc/iomem).
    pub(crate) lookups: u64,
    /// Out: stopped for a fatal signal (`EINTR`).
    pub(crate) killed: bool,
    /// Out: more than [`MAX_RUNS`] runs (`ENOMEM`).
    pub(crate) over_limit: bool,
}

impl Walk {
    /// A walk with the delay knob at `delay_ms` and nothing done yet.
    pub(crate) fn new(delay_ms: u32) -> Self {
        Self {
            delay_ms,
            probe: false,
            pages: 0,
            lookups: 0,
            killed: false,
            over_limit: false,
        }
    }
}

/// A PCI device (with a reference) and the index of its memory BAR.
type Bar = (DevRef, u32);

/// The physical runs behind a user range, in address order.
///
/// # Invariants
///
/// `runs` is not empty; the runs are RAM (`bar` is `None`) or all in `bar`.
pub(crate) struct PfnRuns {
    runs: KvArray<PhysRun>,
    writable: bool,
    bar: Option<Bar>,
}

/// The state of one walk: the runs so far, the last run's kind, the BAR
/// the range's runs are in, what the firmware's map said.
struct Ctx<'w> {
    walk: &'w mut Walk,
    runs: KvArray<PhysRun>,
    /// The last run's page kind (a run has one).
    kind: PageKind,
    /// The user address of the last run's first page.
    run_addr: u64,
    bar: Option<Bar>,
    /// A stretch `[lo, hi)` the firmware's map says is RAM, from an
    /// earlier lookup: `[0]` System RAM, `[1]` System RAM or "Reserved".
    fw: [(u64, u64); 2],
}

/// Whether memory BAR `bar` of `dev` holds `[phys, phys + len)` whole.
fn bar_holds(dev: &pci::Device, bar: u32, phys: u64, len: u64) -> bool {
    dev.mem_bar(bar).is_some_and(|(start, end)| {
        end > start && phys >= start && phys.wrapping_add(len).wrapping_sub(1) <= end
    })
}

impl Ctx<'_> {
    /// The end of the stretch from `pos` that resources of `region` cover
    /// (one lookup, counted).
    fn covered(&mut self, region: Region, pos: u64) -> u64 {
        self.walk.lookups += 1;
        iomem::covered_end(region, pos)
    }

    /// Whether the firmware's memory map (/proc/iomem) says all of `r` is
    /// System RAM, or with `reserved_too` System RAM or "Reserved"
    /// (`memmap=nn$ss`, a no-map reserved-memory region). A lookup costs
    /// far more than a page-table entry: the last answer is kept.
    fn firmware_ram(&mut self, r: PhysRun, reserved_too: bool) -> bool {
        let i = usize::from(reserved_too);
        let (phys, end) = (r.phys, r.phys.wrapping_add(r.len));
        if phys >= self.fw[i].0 && end <= self.fw[i].1 {
            return true;
        }
        let mut pos = phys;
        while pos < end {
            let mut next = self.covered(Region::SystemRam, pos);
            if reserved_too && next < end {
                next = next.max(self.covered(Region::Reserved, pos));
            }
            if next == pos {
                return false;
            }
            pos = next;
        }
        self.fw[i] = (phys, pos);
        true
    }

    /// What run `r`, which is not RAM, may still be: in the BAR the
    /// range's earlier runs are in, or, for the first run, in any PCI
    /// device's memory BAR, which then becomes the range's.
    fn classify_bar(&mut self, r: PhysRun) -> core::result::Result<(), Refusal> {
        if let Some((dev, bar)) = &self.bar {
            if bar_holds(dev, *bar, r.phys, r.len) {
                return Ok(());
            }
        }
        let mut bar = 0;
        let found = DevRef::find(|d| {
            match (0..pci::NUM_BARS).find(|&i| bar_holds(d, i, r.phys, PAGE_SIZE)) {
                Some(i) => {
                    bar = i;
                    true
                }
                None => false,
            }
        });
        let Some(dev) = found else {
            return Err(Refusal::NotRam);
        };
        // Past the BAR's end, or after other runs: more than one BAR or kind.
        let ram_only = pfnmap::param_ram_only();
        if ram_only
            || self.bar.is_some()
            || self.runs.len() > 1
            || !bar_holds(&dev, bar, r.phys, r.len)
        {
            return Err(if ram_only {
                Refusal::BarRamOnly
            } else {
                Refusal::Mixed
            });
        }
        self.bar = Some((dev, bar));
        Ok(())
    }

    /// Whether the last run is served: `Ok`, or why not.
    fn classify_run(&mut self) -> core::result::Result<(), Refusal> {
        let Some(&r) = self.runs.as_slice().last() else {
            return Ok(());
        };
        let ram = match self.kind {
            PageKind::Zero => return Err(Refusal::ZeroPage),
            PageKind::Managed => return Err(Refusal::ManagedRam),
            // Holes inside the kernel's memory map have reserved struct
            // pages too, device memory among them (the legacy VGA window
            // at 0xa0000, a BAR that shares a memory section with RAM):
            // RAM only where the firmware's map says RAM or reserved.
            PageKind::Reserved => self.firmware_ram(r, true),
            // Outside the memory map: only System RAM (a "Reserved" range
            // there may as well be a chipset's MMIO).
            PageKind::NoMemmap => self.firmware_ram(r, false),
            PageKind::Device => false,
        };
        // A range is all RAM or all one BAR.
        if !ram {
            return self.classify_bar(r);
        }
        match self.bar {
            Some(_) => Err(Refusal::Mixed),
            None => Ok(()),
        }
    }

    /// Adds the page at `addr` (PFN `pfn`) to the runs: it extends the
    /// last run, or that run is classified (refused: why and where) and a
    /// new one begins. `ENOMEM`: out of memory, or the list would pass
    /// [`MAX_RUNS`] runs (`over_limit`).
    fn add(&mut self, addr: u64, pfn: usize) -> Result<Option<(Refusal, u64)>> {
        let kind = PageKind::of(pfn);
        let phys = pfnmap::pfn_phys(pfn);
        let kind_before = self.kind;
        if let Some(last) = self.runs.as_mut_slice().last_mut() {
            if kind == kind_before
                && kind != PageKind::Zero
                && last.phys.wrapping_add(last.len) == phys
            {
                last.len += PAGE_SIZE;
                return Ok(None);
            }
            if let Err(why) = self.classify_run() {
                return Ok(Some((why, self.run_addr)));
            }
        }
        if self.runs.len() == MAX_RUNS {
            self.walk.over_limit = true;
            return Err(ENOMEM);
        }
        if self.runs.len() == self.runs.capacity() {
            let cap = match self.runs.capacity() {
                0 => FIRST_RUNS,
                n => n * 2,
            };
            // Made for the registering process: its memory cgroup pays.
            self.runs.grow_to(cap.min(MAX_RUNS))?;
        }
        self.runs
            .push_within_capacity(PhysRun {
                phys,
                len: PAGE_SIZE,
            })
            .map_err(|_| ENOMEM)?;
        self.kind = kind;
        self.run_addr = addr;
        Ok(None)
    }

    /// The walk of `[start, end)` under `mm`'s lock: every page's PFN is
    /// read, neighbouring pages of one kind whose PFNs follow each other
    /// make one run, and what the memory is (RAM by the firmware's map,
    /// which PCI BAR) is decided once per run, not per page. `Ok(Some)`:
    /// refused, why and where.
    fn walk_range(
        &mut self,
        mm: &MmReadGuard,
        start: u64,
        end: u64,
        writable: &mut bool,
    ) -> Result<Option<(Refusal, u64)>> {
        let mut addr = start;
        while addr < end {
            let Some(vma) = mm.vma(addr) else {
                return Ok(Some((Refusal::NoMapping, addr)));
            };
            if !vma.is_pfnmap() {
                return Ok(Some((Refusal::NotPfnmap, addr)));
            }
            // A copy-on-write mapping may get anonymous copies of its
            // pages, which reclaim and migration handle.
            if vma.is_cow() {
                return Ok(Some((Refusal::CopyOnWrite, addr)));
            }
            if !vma.is_writable() {
                *writable = false;
            }
            let vend = end.min(vma.end());
            // A probe reads the first page only; the mappings all.
            if self.walk.probe && self.walk.pages != 0 {
                addr = vend;
            }
            while addr < vend {
                let Some((pfn, pte_writable)) = vma.follow_pfn(addr) else {
                    return Ok(Some((Refusal::NotPresent, addr)));
                };
                if !pte_writable {
                    *writable = false;
                }
                self.walk.pages += 1;
                if let Some(refused) = self.add(addr, pfn)? {
                    return Ok(Some(refused));
                }
                if self.walk.probe {
                    break;
                }
                // A range may be a TiB: yield between pages (the mmap
                // lock is a sleeping lock, no spinlock is held here), and
                // stop for a fatal signal.
                if sched::fatal_signal_pending() {
                    self.walk.killed = true;
                    return Err(EINTR);
                }
                sched::cond_resched();
                if self.walk.delay_ms != 0 && self.walk.pages % WALK_BATCH == 0 {
                    delay::msleep(self.walk.delay_ms);
                }
                addr += PAGE_SIZE;
            }
            if self.walk.probe {
                addr = vend;
            }
        }
        // The last run.
        if let Err(why) = self.classify_run() {
            return Ok(Some((why, self.run_addr)));
        }
        Ok(None)
    }
}

/// How [`PfnRuns::dma_map`] maps the runs of a PCI BAR for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum P2pHow {
    /// `dma_map_resource` (RAM; a BAR through the host bridge).
    Resource,
    /// The BAR's bus addresses, through a common switch.
    BusAddr,
}

/// How `client` reaches a BAR of `provider` peer-to-peer: `EOPNOTSUPP` if
/// `pci_p2pdma_distance` says it cannot (then again verbose, rate-limited:
/// the kernel says why and what to change), else [`P2pHow::BusAddr`] when
/// both sit below a common bridge and no port on the way redirects peer
/// requests (the switch routes the bus address to the BAR, no IOMMU on the
/// way), else [`P2pHow::Resource`] (through a host bridge the kernel
/// allows: mapped like any resource, through the IOMMU if there is one).
/// The kernel's `pci_p2pdma_map_type` cannot answer this for a BAR whose
/// driver did not set up P2PDMA itself, which is every BAR a PFN map can
/// show us; this follows the same rules (`calc_map_type_and_dist` in
/// drivers/pci/p2pdma.c).
fn p2p_how(provider: &pci::Device, client: &pci::Device) -> Result<P2pHow> {
    if provider.p2pdma_distance(client, false) < 0 {
        if pci::p2pdma_verbose_ratelimit() {
            provider.p2pdma_distance(client, true);
        }
        return Err(crate::kapi::eopnotsupp());
    }
    let mut redirect = false;
    let mut a = Some(provider);
    let common = loop {
        let Some(pa) = a else {
            return Ok(P2pHow::Resource);
        };
        if pa.acs_redirects() {
            redirect = true;
        }
        let mut b = Some(client);
        while let Some(pb) = b {
            if pa == pb {
                break;
            }
            b = pb.upstream_bridge();
        }
        if b.is_some() {
            break pa;
        }
        a = pa.upstream_bridge();
    };
    let mut b = Some(client);
    while let Some(pb) = b {
        if pb == common {
            break;
        }
        if pb.acs_redirects() {
            redirect = true;
        }
        b = pb.upstream_bridge();
    }
    Ok(if redirect {
        P2pHow::Resource
    } else {
        P2pHow::BusAddr
    })
}

impl PfnRuns {
    /// Reads the PFNs of `[start, start + len)` (page aligned, `len > 0`)
    /// of the calling process under its mmap lock: the whole range must be
    /// `VM_PFNMAP` mappings that are not copy-on-write, of RAM the kernel
    /// does not manage (`PageReserved`, or outside the memory map but
    /// System RAM in the resource tree) or (unless `pfnmap_ram_only`) of
    /// one memory BAR of one PCI device. What it returns is valid only as
    /// long as nothing invalidated the range since (the caller's watch
    /// says). `walk` gets what the walk did. Errors: `EINVAL` (no user
    /// address space, bad range), `ENOMEM` (also: more than [`MAX_RUNS`]
    /// runs, `walk.over_limit`), `EINTR` (a fatal signal, while waiting
    /// for the mmap lock or during the walk: `walk.killed`).
    pub(crate) fn resolve(
        start: u64,
        len: u64,
        walk: &mut Walk,
    ) -> core::result::Result<Self, Unresolved> {
        walk.pages = 0;
        walk.lookups = 0;
        walk.killed = false;
        walk.over_limit = false;
        let end = match start.checked_add(len) {
            Some(end) if len != 0 && start % PAGE_SIZE == 0 && len % PAGE_SIZE == 0 => end,
            _ => return Err(Unresolved::Failed(EINVAL)),
        };
        let mm = MmReadGuard::lock_current().map_err(Unresolved::Failed)?;
        let mut c = Ctx {
            walk,
            runs: KvArray::new(),
            kind: PageKind::Zero,
            run_addr: 0,
            bar: None,
            fw: [(0, 0); 2],
        };
        let mut writable = true;
        let walked = c.walk_range(&mm, start, end, &mut writable);
        drop(mm);
        match walked {
            Err(e) => Err(Unresolved::Failed(e)),
            Ok(Some((why, at))) => Err(Unresolved::Refused(why, at)),
            Ok(None) if c.runs.is_empty() => Err(Unresolved::Failed(EINVAL)),
            // INVARIANT: runs, all RAM or all in `bar` (`classify_run`).
            Ok(None) => Ok(Self {
                runs: c.runs,
                writable,
                bar: c.bar,
            }),
        }
    }

    /// The checks of [`PfnRuns::resolve`] on every mapping of the range,
    /// but on its first page only (cheap whatever the range's length):
    /// `Ok` if the range looks like this source's memory.
    pub(crate) fn probe(start: u64, len: u64) -> core::result::Result<(), Unresolved> {
        let mut walk = Walk::new(0);
        walk.probe = true;
        Self::resolve(start, len, &mut walk).map(drop)
    }

    /// The runs.
    pub(crate) fn runs(&self) -> &[PhysRun] {
        self.runs.as_slice()
    }

    /// Whether every page is mapped writable (mapping and page-table entry).
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Bytes in all runs.
    pub(crate) fn bytes(&self) -> u64 {
        self.runs().iter().map(|r| r.len).sum()
    }

    /// Maps every run for `dev`'s DMA (device writes allowed if
    /// `device_writes`): RAM with `dma_map_resource`; a BAR only if `dev`
    /// reaches it peer-to-peer (else `EOPNOTSUPP`), by bus address through
    /// a switch or with `dma_map_resource` through a host bridge.
    /// `ENOMEM`, or `EIO` if a run could not be mapped; nothing is left
    /// mapped on error, and the runs come back.
    pub(crate) fn dma_map(
        self,
        dev: &PciDev,
        device_writes: bool,
    ) -> core::result::Result<PfnMapping, (Self, Error)> {
        let dir = if device_writes {
            Direction::Bidirectional
        } else {
            Direction::ToDevice
        };
        let how = match &self.bar {
            Some((bar_dev, _)) => match p2p_how(bar_dev, dev.pci()) {
                Ok(how) => how,
                Err(e) => return Err((self, e)),
            },
            None => P2pHow::Resource,
        };
        let Self {
            runs,
            writable,
            bar,
        } = self;
        let dma = match (&bar, how) {
            (Some((bar_dev, index)), P2pHow::BusAddr) => {
                // In the registering process (the core's dma_map): its cgroup pays.
                let Ok(mut addrs) = KvArray::with_capacity(runs.len()) else {
                    return Err((
                        Self {
                            runs,
                            writable,
                            bar,
                        },
                        ENOMEM,
                    ));
                };
                // pci_p2pdma_bus_addr_map(): the BAR's CPU-to-bus offset.
                let off = bar_dev
                    .bus_address(*index)
                    .wrapping_sub(bar_dev.resource_start(*index));
                for r in runs.as_slice() {
                    // Room for one per run.
                    let _ = addrs.push_within_capacity(r.phys.wrapping_add(off));
                }
                Dma::BusAddr { runs, addrs }
            }
            _ => match ResourceMappings::map(dev, runs, dir) {
                Ok(m) => Dma::Resource(m),
                Err((runs, e)) => {
                    return Err((
                        Self {
                            runs,
                            writable,
                            bar,
                        },
                        e,
                    ))
                }
            },
        };
        Ok(PfnMapping { dma, writable, bar })
    }
}

/// The runs of a [`PfnMapping`] and their bus addresses.
enum Dma {
    /// Mapped with `dma_map_resource`; unmapped on drop.
    Resource(ResourceMappings),
    /// A BAR's bus addresses (through a switch): nothing to unmap.
    BusAddr {
        runs: KvArray<PhysRun>,
        addrs: KvArray<u64>,
    },
}

/// [`PfnRuns`] mapped for a device's DMA; unmapped on drop.
pub(crate) struct PfnMapping {
    dma: Dma,
    writable: bool,
    bar: Option<Bar>,
}

impl PfnMapping {
    /// The bus address and length of every run, in order.
    pub(crate) fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (runs, addrs) = match &self.dma {
            Dma::Resource(m) => (m.runs(), m.addrs()),
            Dma::BusAddr { runs, addrs } => (runs.as_slice(), addrs.as_slice()),
        };
        runs.iter().zip(addrs.iter()).map(|(r, &d)| (d, r.len))
    }

    /// Whether the device reaches the memory by the BAR's bus addresses
    /// (through a PCIe switch, not through the IOMMU).
    pub(crate) fn by_bus_addr(&self) -> bool {
        matches!(self.dma, Dma::BusAddr { .. })
    }

    /// Whether the memory is a PCI device's BAR.
    pub(crate) fn is_bar(&self) -> bool {
        self.bar.is_some()
    }

    /// Undoes the mapping; the runs come back.
    pub(crate) fn unmap(self) -> PfnRuns {
        let runs = match self.dma {
            Dma::Resource(m) => m.unmap(),
            Dma::BusAddr { runs, .. } => runs,
        };
        // INVARIANT: the runs of a `PfnRuns`, with its BAR.
        PfnRuns {
            runs,
            writable: self.writable,
            bar: self.bar,
        }
    }
}
