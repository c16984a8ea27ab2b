// SPDX-License-Identifier: GPL-2.0

//! Scatter-gather tables that carry only a DMA view (bus address and
//! length per entry, no pages). Upstream counterpart: `kernel::scatterlist`
//! (6.18), which 6.12 lacks; the C glue allocates and fills the entries.

use super::{raw, result_of};
use kernel::error::{code, Result};

/// A scatter-gather table this module allocated (the core gets a shallow
/// copy of the `struct sg_table`, sharing the entries: [`SgView`]).
///
/// # Invariants
///
/// `0` was filled by `sg_alloc_table` (or is zeroed) and is freed on drop.
pub(crate) struct SgTable(kernel::bindings::sg_table);

// SAFETY: plain memory owned by this object.
unsafe impl Send for SgTable {}

/// The `struct sg_table` handed to the core: the entries of an [`SgTable`],
/// all of them mapped. Valid while that table is.
pub(crate) struct SgView(kernel::bindings::sg_table);

impl SgView {
    /// The C structure, to copy into the core's `struct sg_table`.
    pub(super) fn raw(&self) -> kernel::bindings::sg_table {
        self.0
    }
}

impl SgTable {
    /// A table of `nents` zeroed entries; `EINVAL` for none.
    pub(crate) fn new(nents: u32) -> Result<Self> {
        if nents == 0 {
            return Err(code::EINVAL);
        }
        // SAFETY: all-zero is the empty `struct sg_table`.
        let mut t = Self(unsafe { core::mem::zeroed() });
        // SAFETY: `t.0` is a valid, empty table to fill.
        let ret = unsafe {
            kernel::bindings::sg_alloc_table(&mut t.0, nents, kernel::bindings::GFP_KERNEL)
        };
        if let Err(e) = result_of(ret) {
            // `sg_alloc_table` freed what it allocated: leave the table
            // empty for the drop.
            // SAFETY: all-zero is the empty `struct sg_table`.
            t.0 = unsafe { core::mem::zeroed() };
            return Err(e);
        }
        Ok(t)
    }

    /// Number of entries.
    pub(crate) fn nents(&self) -> u32 {
        // Allocated entries (`orig_nents`); all of them are mapped.
        let t = &self.0;
        t.orig_nents
    }

    /// Address of the first entry (identifies the table).
    pub(crate) fn sgl_addr(&self) -> usize {
        self.0.sgl as usize
    }

    /// What the core gets: the same entries, `nents` entries mapped.
    pub(crate) fn view(&self) -> SgView {
        SgView(kernel::bindings::sg_table {
            sgl: self.0.sgl,
            nents: self.0.orig_nents,
            orig_nents: self.0.orig_nents,
        })
    }

    /// A cursor over the entries, to fill them in order.
    pub(crate) fn cursor(&mut self) -> SgCursor<'_> {
        SgCursor {
            next: self.0.sgl,
            _table: core::marker::PhantomData,
        }
    }
}

impl Drop for SgTable {
    fn drop(&mut self) {
        if !self.0.sgl.is_null() {
            // SAFETY: allocated by `sg_alloc_table` (type invariant: a
            // zeroed table has no `sgl`); not used after this.
            unsafe { kernel::bindings::sg_free_table(&mut self.0) };
        }
    }
}

/// Fills the entries of an [`SgTable`] one after the other.
pub(crate) struct SgCursor<'a> {
    next: *mut kernel::bindings::scatterlist,
    _table: core::marker::PhantomData<&'a mut SgTable>,
}

impl SgCursor<'_> {
    fn advance(&mut self) -> Result<*mut kernel::bindings::scatterlist> {
        let sg = self.next;
        if sg.is_null() {
            return Err(code::EINVAL);
        }
        // SAFETY: `sg` is an entry of the table this cursor borrows.
        self.next = unsafe { raw::peermem_sg_next(sg) };
        Ok(sg)
    }

    /// Next entry: DMA address and length only (no page). `EINVAL` past the end.
    pub(crate) fn set_dma(&mut self, addr: u64, len: u32) -> Result {
        let sg = self.advance()?;
        // SAFETY: `sg` is an entry of the borrowed table.
        unsafe { raw::peermem_sg_set_dma(sg, addr, len) };
        Ok(())
    }
}
