// SPDX-License-Identifier: GPL-2.0

//! BAR1: the PCI aperture through which a peer (the HCA) reaches GPU
//! memory, as NVIDIA's resource manager (RM) hands it to third-party P2P
//! pins (open-gpu-kernel-modules 595.45.04,
//! `src/nvidia/src/kernel/gpu/bus/p2p.c`; docs/gpusim.md, "BAR1"):
//!
//! - Each pin is mapped through the **extents** of its RM client's record of
//!   the allocation (`RmThirdPartyP2PBAR1GetPages`): a part of the range
//!   inside an existing extent reuses it (`_reuseThirdPartyP2PMappingExtent`,
//!   a reference more), a part outside gets a new extent up to the next one
//!   (`_createThirdPartyP2PMappingExtent`, `kbusMapFbAperture_HAL`). An
//!   extent goes when its last pin does (`RmThirdPartyP2PMappingFree`).
//! - **Clients**: a non-persistent pin maps through the pinning process's
//!   client; every persistent pin through RM's one internal client
//!   (`RmP2PGetPagesPersistent`, `_createOrReuseVidmemInfoPersistent`), so
//!   a persistent and a non-persistent pin of the same memory hold BAR1
//!   twice.
//! - **Space**: a new extent needs, in its client, the mapped bytes plus the
//!   extent plus `CLI_THIRD_PARTY_P2P_BAR1_RESERVE` (36 MiB) within the BAR1
//!   size (`_isSpaceAvailableForBar1P2PMapping`, per subdevice's
//!   `P2PfbMappedBytes`), else `NV_ERR_INSUFFICIENT_RESOURCES` (`-ENOMEM`).
//!   With a **dynamic** BAR1 every extent also takes its length of the one
//!   aperture all clients share (`kbusMapFbAperture_HAL`), and one that does
//!   not fit fails too (`-ENOMEM`); with a **static** BAR1 (Turing and later
//!   when BAR1 covers all of FB: `kbusIsStaticBar1Supported_TU102`), the
//!   mapping is the static one and takes no aperture.
//!
//! Kept under `STATE` (`state.rs`), with the pins.

use crate::knobs::{self, *};
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::atomic::Relaxed;

/// `CLI_THIRD_PARTY_P2P_BAR1_RESERVE` (g_third_party_p2p_nvoc.h).
pub(crate) const RESERVE: u64 = 36 << 20;

/// Which RM client a pin maps through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// The pinning process's (non-persistent pins), by thread group id.
    Process(c_int),
    /// RM's internal client (persistent pins).
    Internal,
}

/// One extent: `[start, start + len)` of an allocation (offsets), mapped
/// for `refs` pins of one client.
struct Extent {
    start: u64,
    len: u64,
    refs: u32,
}

/// One client's extents of one allocation, sorted by `start`, disjoint.
struct Record {
    client: Client,
    alloc: u64,
    extents: KVec<Extent>,
}

/// What a pin took: its client, allocation and the starts of the extents
/// it holds a reference to (in `Bar1`, to be given back by [`Bar1::unmap`]).
pub(crate) struct Mapping {
    client: Client,
    alloc: u64,
    extents: KVec<u64>,
}

/// The emulated BAR1.
pub(crate) struct Bar1 {
    records: KVec<Record>,
    /// Bytes mapped per client (RM's `P2PfbMappedBytes`).
    mapped: KVec<(Client, u64)>,
}

impl Bar1 {
    pub(crate) const fn new() -> Self {
        Self {
            records: KVec::new(),
            mapped: KVec::new(),
        }
    }

    fn mapped_of(&self, client: Client) -> u64 {
        self.mapped
            .iter()
            .find(|(c, _)| *c == client)
            .map_or(0, |&(_, b)| b)
    }

    fn add_mapped(&mut self, client: Client, bytes: u64) -> Result {
        if let Some(e) = self.mapped.iter_mut().find(|(c, _)| *c == client) {
            e.1 += bytes;
            return Ok(());
        }
        self.mapped.push((client, bytes), GFP_KERNEL)?;
        Ok(())
    }

    fn sub_mapped(&mut self, client: Client, bytes: u64) {
        if let Some(i) = self.mapped.iter().position(|(c, _)| *c == client) {
            self.mapped[i].1 -= bytes;
            if self.mapped[i].1 == 0 {
                let _ = self.mapped.remove(i);
            }
        }
    }

    fn record(&mut self, client: Client, alloc: u64) -> Result<usize> {
        if let Some(i) = self
            .records
            .iter()
            .position(|r| r.client == client && r.alloc == alloc)
        {
            return Ok(i);
        }
        self.records.push(
            Record {
                client,
                alloc,
                extents: KVec::new(),
            },
            GFP_KERNEL,
        )?;
        Ok(self.records.len() - 1)
    }

    /// Maps `[off, off + len)` of allocation `alloc` for a pin of `client`:
    /// reuses the client's extents that cover parts of it and makes new ones
    /// for the rest, if there is room (`ENOMEM` otherwise, nothing taken).
    pub(crate) fn map(
        &mut self,
        client: Client,
        alloc: u64,
        off: u64,
        len: u64,
    ) -> Result<Mapping> {
        let ri = self.record(client, alloc)?;
        // The plan: (start, len, new) for each piece of the range.
        let mut plan: KVec<(u64, u64, bool)> = KVec::new();
        let mut new_bytes = 0u64;
        {
            let ext = &self.records[ri].extents;
            let end = off + len;
            let mut a = off;
            while a < end {
                if let Some(e) = ext.iter().find(|e| a >= e.start && a < e.start + e.len) {
                    plan.push((e.start, e.len, false), GFP_KERNEL)?;
                    a = (e.start + e.len).min(end);
                } else {
                    let next = ext
                        .iter()
                        .filter(|e| e.start > a)
                        .map(|e| e.start)
                        .min()
                        .unwrap_or(end)
                        .min(end);
                    plan.push((a, next - a, true), GFP_KERNEL)?;
                    new_bytes += next - a;
                    a = next;
                }
            }
        }
        if new_bytes != 0 && !self.room_for(client, new_bytes) {
            knobs::BAR1_REFUSALS.add(1, Relaxed);
            self.drop_empty(ri);
            return Err(ENOMEM);
        }
        let mut starts = KVec::with_capacity(plan.len(), GFP_KERNEL)?;
        // Reserve room for the new extents before anything changes.
        let news = plan.iter().filter(|p| p.2).count();
        self.records[ri].extents.reserve(news, GFP_KERNEL)?;
        self.mapped.reserve(1, GFP_KERNEL)?;
        for &(start, elen, new) in plan.iter() {
            let ext = &mut self.records[ri].extents;
            if new {
                let at = ext
                    .iter()
                    .position(|e| e.start > start)
                    .unwrap_or(ext.len());
                ext.insert_within_capacity(
                    at,
                    Extent {
                        start,
                        len: elen,
                        refs: 1,
                    },
                )
                .map_err(|_| ENOMEM)?;
            } else if let Some(e) = ext.iter_mut().find(|e| e.start == start) {
                e.refs += 1;
            }
            starts.push(start, GFP_KERNEL)?;
        }
        if new_bytes != 0 {
            self.add_mapped(client, new_bytes)?;
            BAR1_MAPPED.add(new_bytes, Relaxed);
            if client == Client::Internal {
                BAR1_INTERNAL.add(new_bytes, Relaxed);
            }
        }
        Ok(Mapping {
            client,
            alloc,
            extents: starts,
        })
    }

    /// Gives back what a pin took ([`Bar1::map`]).
    pub(crate) fn unmap(&mut self, m: &Mapping) {
        let Some(ri) = self
            .records
            .iter()
            .position(|r| r.client == m.client && r.alloc == m.alloc)
        else {
            return;
        };
        let mut freed = 0u64;
        for &start in m.extents.iter() {
            let ext = &mut self.records[ri].extents;
            if let Some(i) = ext.iter().position(|e| e.start == start) {
                ext[i].refs -= 1;
                if ext[i].refs == 0 {
                    freed += ext[i].len;
                    let _ = ext.remove(i);
                }
            }
        }
        if freed != 0 {
            self.sub_mapped(m.client, freed);
            knobs::dec(&BAR1_MAPPED, freed);
            if m.client == Client::Internal {
                knobs::dec(&BAR1_INTERNAL, freed);
            }
        }
        self.drop_empty(ri);
    }

    fn drop_empty(&mut self, ri: usize) {
        if self.records[ri].extents.is_empty() {
            let _ = self.records.remove(ri);
        }
    }

    /// Whether `bytes` more can be mapped for `client`.
    fn room_for(&self, client: Client, bytes: u64) -> bool {
        let size = size_bytes();
        let client_ok = size
            .checked_sub(self.mapped_of(client))
            .is_some_and(|free| free >= RESERVE + bytes);
        // Every client's extents share the one aperture when it is dynamic.
        let aperture_ok = !dynamic()
            || size
                .checked_sub(BAR1_MAPPED.load(Relaxed))
                .is_some_and(|free| free >= bytes);
        client_ok && aperture_ok
    }
}

/// The BAR1 size in bytes (`bar1_mib`).
pub(crate) fn size_bytes() -> u64 {
    BAR1_MIB.load(Relaxed) << 20
}

/// Whether BAR1 is mapped dynamically: `bar1_mode` 2, or 0 (auto, as RM
/// chooses) with a BAR1 smaller than the framebuffer (`fb_mib`); static
/// (`bar1_mode` 1, or auto with BAR1 covering FB) takes no aperture.
pub(crate) fn dynamic() -> bool {
    match BAR1_MODE.load(Relaxed) {
        1 => false,
        2 => true,
        _ => BAR1_MIB.load(Relaxed) < FB_MIB.load(Relaxed),
    }
}
