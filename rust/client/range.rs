// SPDX-License-Identifier: GPL-2.0

//! GPU-page arithmetic: user ranges, the 64 KiB pages that cover them, and
//! coalescing per-page bus addresses into as few scatter-list segments as
//! the DMA device allows.
//!
//! Pure functions on integers, no kernel calls: everything here is covered
//! by KUnit tests at the bottom of the file.

// A few accessors are only used by the tests, which are compiled only on
// kernels with Rust KUnit support.
#![cfg_attr(not(peermem_kunit), allow(dead_code))]

use kernel::error::{code, Error};

/// log2 of the GPU page size.
pub(crate) const GPU_PAGE_SHIFT: u32 = 16;
/// The GPU page size of `nvidia_p2p_get_pages` (`NVIDIA_P2P_PAGE_SIZE_64KB`).
pub(crate) const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;
const GPU_PAGE_MASK: u64 = GPU_PAGE_SIZE - 1;

/// The longest range peermem accepts: 1 TiB.
///
/// More than any GPU's memory today, and it bounds the page count at 2^24 + 1
/// (so page-table entry counts always fit a `u32` and per-page arrays stay
/// allocatable).
pub(crate) const MAX_RANGE_LEN: u64 = 1 << 40;

/// Why a user range was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeError {
    /// Zero length.
    Empty,
    /// The range, or the GPU pages covering it, would run past the end of the
    /// 64-bit address space.
    Wraps,
    /// Longer than [`MAX_RANGE_LEN`].
    TooLarge,
}

impl From<RangeError> for Error {
    /// `EINVAL` for an empty range, `EOVERFLOW` for one that wraps around,
    /// `E2BIG` for one that is too long.
    fn from(e: RangeError) -> Error {
        match e {
            RangeError::Empty => code::EINVAL,
            RangeError::Wraps => crate::kapi::eoverflow(),
            RangeError::TooLarge => code::E2BIG,
        }
    }
}

/// A user range `[addr, addr + len)` and the span of whole GPU pages covering it.
///
/// # Invariants
///
/// `0 < len <= MAX_RANGE_LEN`, and the GPU-page-aligned end of the range,
/// `round_up(addr + len, GPU_PAGE_SIZE)`, is at most `u64::MAX` (so no
/// computation below overflows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuRange {
    addr: u64,
    len: u64,
}

impl GpuRange {
    /// Checks a user range `(addr, len)`, which may be unaligned.
    pub(crate) fn new(addr: u64, len: u64) -> Result<Self, RangeError> {
        if len == 0 {
            return Err(RangeError::Empty);
        }
        if len > MAX_RANGE_LEN {
            return Err(RangeError::TooLarge);
        }
        let end = addr.checked_add(len).ok_or(RangeError::Wraps)?;
        // The aligned end must be representable too.
        end.checked_add(GPU_PAGE_MASK).ok_or(RangeError::Wraps)?;
        // INVARIANT: checked just above.
        Ok(Self { addr, len })
    }

    /// The first byte of the range, as given.
    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// The length of the range, as given.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// One past the last byte of the range.
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        // No overflow: type invariant.
        self.addr + self.len
    }

    /// Start of the first GPU page: `addr` rounded down to 64 KiB.
    #[inline]
    pub(crate) fn aligned_start(&self) -> u64 {
        self.addr & !GPU_PAGE_MASK
    }

    /// End of the last GPU page (exclusive): `addr + len` rounded up to 64 KiB.
    #[inline]
    pub(crate) fn aligned_end(&self) -> u64 {
        // No overflow: type invariant.
        (self.end() + GPU_PAGE_MASK) & !GPU_PAGE_MASK
    }

    /// Length of the GPU-page span, a multiple of 64 KiB.
    #[inline]
    pub(crate) fn aligned_len(&self) -> u64 {
        self.aligned_end() - self.aligned_start()
    }

    /// Number of GPU pages the range touches.
    #[inline]
    pub(crate) fn page_count(&self) -> u32 {
        // At most MAX_RANGE_LEN / GPU_PAGE_SIZE + 1 = 2^24 + 1: fits.
        (self.aligned_len() >> GPU_PAGE_SHIFT) as u32
    }

    /// Offset of `addr` within its GPU page.
    #[inline]
    pub(crate) fn offset_in_first_page(&self) -> u64 {
        self.addr & GPU_PAGE_MASK
    }
}

/// A run of contiguous bus addresses: one scatter-list entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First bus address.
    pub(crate) addr: u64,
    /// Length in bytes, a multiple of the page size.
    pub(crate) len: u32,
}

/// Why a coalescing request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CoalesceError {
    /// Page size zero or not a power of two.
    BadPageSize,
    /// Maximum segment length below one page.
    MaxLenBelowPage,
    /// Segment boundary mask not of the form `2^k - 1` with `2^k >= page size`.
    BadBoundary,
    /// A page address not aligned to the page size, or whose page would end
    /// past the end of the address space.
    BadPage(u64),
}

impl From<CoalesceError> for Error {
    /// `EINVAL`: all of these are caller bugs or bogus data from a driver.
    fn from(_: CoalesceError) -> Error {
        code::EINVAL
    }
}

/// What a DMA device allows in one scatter-list segment.
///
/// # Invariants
///
/// `page_size` is a power of two; `page_size <= max_len` and `max_len` is a
/// multiple of `page_size`; `boundary_mask + 1` is a power of two at least
/// `page_size`, or `boundary_mask == u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentLimits {
    page_size: u64,
    max_len: u64,
    boundary_mask: u64,
}

impl SegmentLimits {
    /// Limits for pages of `page_size` bytes, segments of at most `max_len`
    /// bytes (`dma_get_max_seg_size()`, rounded down to whole pages) that
    /// never cross an address that is a multiple of `boundary_mask + 1`
    /// (`dma_get_seg_boundary()`; `u64::MAX` for none).
    pub(crate) fn new(
        page_size: u64,
        max_len: u32,
        boundary_mask: u64,
    ) -> Result<Self, CoalesceError> {
        if !page_size.is_power_of_two() {
            return Err(CoalesceError::BadPageSize);
        }
        let max_len = u64::from(max_len) & !(page_size - 1);
        if max_len == 0 {
            return Err(CoalesceError::MaxLenBelowPage);
        }
        if boundary_mask != u64::MAX
            && (!(boundary_mask + 1).is_power_of_two() || boundary_mask < page_size - 1)
        {
            return Err(CoalesceError::BadBoundary);
        }
        // INVARIANT: checked above; `max_len` is non-zero and rounded down
        // to a multiple of `page_size`, so it is at least `page_size`.
        Ok(Self {
            page_size,
            max_len,
            boundary_mask,
        })
    }

    /// The page size.
    #[inline]
    pub(crate) fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The largest segment length, a multiple of the page size.
    #[inline]
    pub(crate) fn max_len(&self) -> u64 {
        self.max_len
    }

    #[inline]
    fn check_page(&self, page: u64) -> Result<(), CoalesceError> {
        if page & (self.page_size - 1) != 0 || page.checked_add(self.page_size - 1).is_none() {
            return Err(CoalesceError::BadPage(page));
        }
        Ok(())
    }

    /// Whether a segment `[start, start + len)` can take the page at `page` as its next one.
    #[inline]
    fn can_extend(&self, start: u64, len: u64, page: u64) -> bool {
        let Some(last_byte) = page.checked_add(self.page_size - 1) else {
            return false;
        };
        start.checked_add(len) == Some(page)
            && len + self.page_size <= self.max_len
            && (start & !self.boundary_mask) == (last_byte & !self.boundary_mask)
    }
}

/// Checks every page address and counts the segments [`coalesce`] will produce.
///
/// Call it first: it sizes the scatter list and refuses bad input.
pub(crate) fn count_segments(
    pages: impl Iterator<Item = u64>,
    limits: &SegmentLimits,
) -> Result<usize, CoalesceError> {
    let mut count = 0usize;
    let mut cur: Option<(u64, u64)> = None;
    for page in pages {
        limits.check_page(page)?;
        cur = match cur {
            Some((start, len)) if limits.can_extend(start, len, page) => {
                Some((start, len + limits.page_size))
            }
            _ => {
                count += 1;
                Some((page, limits.page_size))
            }
        };
    }
    Ok(count)
}

/// The segments for `pages` (bus addresses of equally sized pages, in order):
/// consecutive pages merge while they are contiguous and the limits allow.
///
/// Pages should have passed [`count_segments`]; an invalid page is never
/// merged with another, it does not panic.
pub(crate) fn coalesce<I: Iterator<Item = u64>>(pages: I, limits: SegmentLimits) -> Coalesce<I> {
    Coalesce {
        pages,
        limits,
        pending: None,
    }
}

/// Iterator returned by [`coalesce`].
pub(crate) struct Coalesce<I> {
    pages: I,
    limits: SegmentLimits,
    pending: Option<u64>,
}

impl<I: Iterator<Item = u64>> Iterator for Coalesce<I> {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        let start = self.pending.take().or_else(|| self.pages.next())?;
        let mut len = self.limits.page_size;
        for page in self.pages.by_ref() {
            if self.limits.can_extend(start, len, page) {
                len += self.limits.page_size;
            } else {
                self.pending = Some(page);
                break;
            }
        }
        // `len <= max_len <= u32::MAX` (type invariant of `SegmentLimits`).
        Some(Segment {
            addr: start,
            len: len as u32,
        })
    }
}

/// The segments for `extents` (bus address and length of contiguous
/// pieces, each a whole number of pages, in order): exactly what
/// [`coalesce`] makes of their pages, in time linear in extents and
/// segments rather than pages (a PFN range of one run may be a TiB).
/// `None` if an extent is not page aligned or runs past the top of the
/// address space.
pub(crate) fn coalesce_extents<I: Iterator<Item = (u64, u64)>>(
    extents: I,
    limits: SegmentLimits,
) -> CoalesceExtents<I> {
    CoalesceExtents {
        extents,
        limits,
        pending: None,
        bad: Bad::No,
    }
}

/// Iterator returned by [`coalesce_extents`].
pub(crate) struct CoalesceExtents<I> {
    extents: I,
    limits: SegmentLimits,
    /// The part of an extent not in a segment yet.
    pending: Option<(u64, u64)>,
    /// An invalid extent was met: `None` is yielded next (once), then the
    /// iteration ends.
    bad: Bad,
}

/// Whether [`CoalesceExtents`] met an invalid extent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bad {
    No,
    /// Met while extending a segment: say so after that segment.
    ToReport,
    Reported,
}

impl<I: Iterator<Item = (u64, u64)>> CoalesceExtents<I> {
    /// The next extent of non-zero length, or `Some(None)` for an invalid one.
    fn next_extent(&mut self) -> Option<Option<(u64, u64)>> {
        if let Some(e) = self.pending.take() {
            return Some(Some(e));
        }
        loop {
            let (addr, len) = self.extents.next()?;
            if len == 0 {
                continue;
            }
            let ps = self.limits.page_size;
            if addr & (ps - 1) != 0 || len & (ps - 1) != 0 || addr.checked_add(len - 1).is_none() {
                return Some(None);
            }
            return Some(Some((addr, len)));
        }
    }

    /// The bytes a segment starting at `start` may hold (length and boundary).
    fn room(&self, start: u64) -> u64 {
        // The next multiple of `boundary_mask + 1` above `start`; none
        // (`checked_add` fails) in the top block or without a boundary.
        let to_boundary = (start | self.limits.boundary_mask)
            .checked_add(1)
            .map_or(u64::MAX, |b| b - start);
        self.limits.max_len.min(to_boundary)
    }
}

impl<I: Iterator<Item = (u64, u64)>> Iterator for CoalesceExtents<I> {
    type Item = Option<Segment>;

    fn next(&mut self) -> Option<Option<Segment>> {
        match self.bad {
            Bad::No => {}
            Bad::ToReport => {
                self.bad = Bad::Reported;
                return Some(None);
            }
            Bad::Reported => return None,
        }
        let Some((mut addr, mut left)) = self.next_extent()? else {
            self.bad = Bad::Reported;
            return Some(None);
        };
        let start = addr;
        let room = self.room(start);
        let mut len = 0u64;
        loop {
            let take = left.min(room - len);
            len += take;
            // Used only while `left != 0`: no wrap then.
            addr = addr.wrapping_add(take);
            left -= take;
            if left != 0 {
                self.pending = Some((addr, left));
                break;
            }
            match self.next_extent() {
                None => break,
                Some(None) => {
                    self.bad = Bad::ToReport;
                    break;
                }
                Some(Some((a, l))) if start.checked_add(len) == Some(a) && len < room => {
                    addr = a;
                    left = l;
                }
                Some(Some(e)) => {
                    self.pending = Some(e);
                    break;
                }
            }
        }
        // `len <= max_len <= u32::MAX` (type invariant of `SegmentLimits`).
        Some(Some(Segment {
            addr: start,
            len: len as u32,
        }))
    }
}

#[cfg(peermem_kunit)]
#[::kernel::macros::kunit_tests(peermem_range)]
mod tests {
    use super::*;
    use kernel::prelude::*;

    const P: u64 = GPU_PAGE_SIZE;

    /// Page count computed independently of `GpuRange`: last page index minus first, plus one.
    fn expected_pages(addr: u64, len: u64) -> u64 {
        ((addr + len - 1) >> 16) - (addr >> 16) + 1
    }

    #[test]
    fn aligned_single_page() -> Result {
        let r = GpuRange::new(0x10000, P)?;
        assert_eq!(r.aligned_start(), 0x10000);
        assert_eq!(r.aligned_end(), 0x20000);
        assert_eq!(r.aligned_len(), P);
        assert_eq!(r.page_count(), 1);
        assert_eq!(r.offset_in_first_page(), 0);
        assert_eq!(r.end(), 0x20000);
        Ok(())
    }

    #[test]
    fn unaligned_inside_one_page() -> Result {
        let r = GpuRange::new(0x10001, 10)?;
        assert_eq!(r.aligned_start(), 0x10000);
        assert_eq!(r.aligned_end(), 0x20000);
        assert_eq!(r.page_count(), 1);
        assert_eq!(r.offset_in_first_page(), 1);
        assert_eq!(r.addr(), 0x10001);
        assert_eq!(r.len(), 10);
        Ok(())
    }

    #[test]
    fn crossing_a_page_boundary_by_one_byte() -> Result {
        let r = GpuRange::new(0x1ffff, 2)?;
        assert_eq!(r.aligned_start(), 0x10000);
        assert_eq!(r.aligned_end(), 0x30000);
        assert_eq!(r.page_count(), 2);
        assert_eq!(r.offset_in_first_page(), 0xffff);
        // One byte less stays in one page.
        let r = GpuRange::new(0x1ffff, 1)?;
        assert_eq!(r.page_count(), 1);
        assert_eq!(r.aligned_end(), 0x20000);
        // An aligned range one byte longer than a page needs two.
        let r = GpuRange::new(0x20000, P + 1)?;
        assert_eq!(r.page_count(), 2);
        Ok(())
    }

    #[test]
    fn starts_at_zero() -> Result {
        let r = GpuRange::new(0, 1)?;
        assert_eq!(r.aligned_start(), 0);
        assert_eq!(r.aligned_end(), P);
        assert_eq!(r.page_count(), 1);
        Ok(())
    }

    #[test]
    fn multi_page_aligned_and_unaligned() -> Result {
        let r = GpuRange::new(0x100000, 5 * P)?;
        assert_eq!(r.page_count(), 5);
        assert_eq!(r.aligned_len(), 5 * P);
        let r = GpuRange::new(0x100000 + 100, 5 * P)?;
        assert_eq!(r.page_count(), 6);
        assert_eq!(r.aligned_start(), 0x100000);
        assert_eq!(r.aligned_end(), 0x100000 + 6 * P);
        let r = GpuRange::new(0x100000 + 100, 5 * P - 100)?;
        assert_eq!(r.page_count(), 5);
        Ok(())
    }

    #[test]
    fn zero_length_is_refused() {
        assert_eq!(GpuRange::new(0x10000, 0), Err(RangeError::Empty));
        assert_eq!(GpuRange::new(0, 0), Err(RangeError::Empty));
        assert_eq!(GpuRange::new(u64::MAX, 0), Err(RangeError::Empty));
    }

    #[test]
    fn wrap_around_is_refused() {
        assert_eq!(GpuRange::new(u64::MAX, 1), Err(RangeError::Wraps));
        assert_eq!(GpuRange::new(u64::MAX, 2), Err(RangeError::Wraps));
        // End exactly at 2^64.
        assert_eq!(GpuRange::new(u64::MAX - 9, 10), Err(RangeError::Wraps));
        // The range fits, but its last GPU page would end at 2^64.
        assert_eq!(GpuRange::new(u64::MAX - 10, 5), Err(RangeError::Wraps));
        assert_eq!(
            GpuRange::new(0xffff_ffff_ffff_0000, 1),
            Err(RangeError::Wraps)
        );
        // Small length, start near the top.
        assert_eq!(
            GpuRange::new(u64::MAX - 0x100, 0x200),
            Err(RangeError::Wraps)
        );
        // A huge address plus a valid length.
        assert_eq!(
            GpuRange::new(u64::MAX - MAX_RANGE_LEN + 1, MAX_RANGE_LEN),
            Err(RangeError::Wraps)
        );
    }

    #[test]
    fn highest_usable_page() -> Result {
        // The last GPU page whose end is representable.
        let r = GpuRange::new(0xffff_ffff_fffe_0000, P)?;
        assert_eq!(r.aligned_end(), 0xffff_ffff_ffff_0000);
        assert_eq!(r.page_count(), 1);
        let r = GpuRange::new(0xffff_ffff_fffe_ffff, 1)?;
        assert_eq!(r.page_count(), 1);
        assert_eq!(r.offset_in_first_page(), 0xffff);
        assert_eq!(
            GpuRange::new(0xffff_ffff_fffe_ffff, 2),
            Err(RangeError::Wraps)
        );
        Ok(())
    }

    #[test]
    fn absurd_sizes_are_refused() -> Result {
        assert_eq!(
            GpuRange::new(0, MAX_RANGE_LEN + 1),
            Err(RangeError::TooLarge)
        );
        assert_eq!(GpuRange::new(0, u64::MAX), Err(RangeError::TooLarge));
        assert_eq!(GpuRange::new(u64::MAX, u64::MAX), Err(RangeError::TooLarge));
        let r = GpuRange::new(0, MAX_RANGE_LEN)?;
        assert_eq!(r.page_count(), 1 << 24);
        // Unaligned at the limit: one more page, still counted right.
        let r = GpuRange::new(1, MAX_RANGE_LEN)?;
        assert_eq!(r.page_count(), (1 << 24) + 1);
        Ok(())
    }

    #[test]
    fn errors_map_to_errnos() {
        assert_eq!(Error::from(RangeError::Empty).to_errno(), -22);
        assert_eq!(Error::from(RangeError::Wraps).to_errno(), -75);
        assert_eq!(Error::from(RangeError::TooLarge).to_errno(), -7);
        assert_eq!(Error::from(CoalesceError::BadPageSize).to_errno(), -22);
    }

    #[test]
    fn grid_of_ranges_keeps_all_invariants() {
        let addrs = [
            0u64,
            1,
            0xfff,
            0x1000,
            0xffff,
            0x10000,
            0x10001,
            0x1ffff,
            0x7fff_ffff_0000,
            0x7fff_ffff_ffff,
            0xdead_beef,
            0xffff_ffff_fffd_0001,
        ];
        let lens = [
            1u64,
            2,
            0xffff,
            0x10000,
            0x10001,
            0x1ffff,
            0x20000,
            3 * P - 1,
            1 << 30,
            12345,
        ];
        let mut checked = 0;
        for &addr in addrs.iter() {
            for &len in lens.iter() {
                let Ok(r) = GpuRange::new(addr, len) else {
                    // Only a range running into the top page may be refused here.
                    assert!(addr
                        .checked_add(len)
                        .is_none_or(|e| e > 0xffff_ffff_ffff_0000));
                    continue;
                };
                checked += 1;
                assert!(r.aligned_start() <= addr);
                assert_eq!(r.aligned_start() % P, 0);
                assert!(addr - r.aligned_start() < P);
                assert!(r.aligned_end() >= addr + len);
                assert_eq!(r.aligned_end() % P, 0);
                assert!(r.aligned_end() - (addr + len) < P);
                assert_eq!(u64::from(r.page_count()), expected_pages(addr, len));
                assert_eq!(u64::from(r.page_count()) * P, r.aligned_len());
                assert_eq!(r.offset_in_first_page(), addr - r.aligned_start());
            }
        }
        // Guard against a grid that silently tests nothing.
        assert!(checked > 100);
    }

    fn limits(max_len: u32, mask: u64) -> Result<SegmentLimits, CoalesceError> {
        SegmentLimits::new(P, max_len, mask)
    }

    /// Collects up to 8 segments into an array (no allocation in tests).
    fn segs<I: Iterator<Item = u64>>(pages: I, l: SegmentLimits) -> (usize, [Segment; 8]) {
        let mut out = [Segment { addr: 0, len: 0 }; 8];
        let mut n = 0;
        for s in coalesce(pages, l) {
            if n < out.len() {
                out[n] = s;
            }
            n += 1;
        }
        (n, out)
    }

    #[test]
    fn coalesce_empty_and_single() -> Result {
        let l = limits(u32::MAX, u64::MAX)?;
        assert_eq!(count_segments([].into_iter(), &l), Ok(0));
        assert_eq!(coalesce([].into_iter(), l).count(), 0);
        let (n, s) = segs([0x40000u64].into_iter(), l);
        assert_eq!(n, 1);
        assert_eq!(
            s[0],
            Segment {
                addr: 0x40000,
                len: 0x10000
            }
        );
        Ok(())
    }

    #[test]
    fn coalesce_contiguous_gaps_and_reversed() -> Result {
        let l = limits(u32::MAX, u64::MAX)?;
        let contiguous = [0x100000u64, 0x110000, 0x120000, 0x130000];
        assert_eq!(count_segments(contiguous.into_iter(), &l), Ok(1));
        let (n, s) = segs(contiguous.into_iter(), l);
        assert_eq!(n, 1);
        assert_eq!(
            s[0],
            Segment {
                addr: 0x100000,
                len: 0x40000
            }
        );

        let gaps = [0x100000u64, 0x120000, 0x140000];
        assert_eq!(count_segments(gaps.into_iter(), &l), Ok(3));
        let (n, s) = segs(gaps.into_iter(), l);
        assert_eq!(n, 3);
        assert_eq!(
            s[2],
            Segment {
                addr: 0x140000,
                len: 0x10000
            }
        );

        // Descending neighbours are not contiguous in bus-address order.
        let reversed = [0x130000u64, 0x120000, 0x110000];
        assert_eq!(count_segments(reversed.into_iter(), &l), Ok(3));
        // The same page twice is not contiguous either.
        assert_eq!(count_segments([0x10000u64, 0x10000].into_iter(), &l), Ok(2));
        Ok(())
    }

    #[test]
    fn coalesce_mixed_runs() -> Result {
        let l = limits(u32::MAX, u64::MAX)?;
        let a = 0x1_0000_0000u64;
        let b = 0x2_0000_0000u64;
        let pages = [a, a + P, b, b + P, b + 2 * P, 0x50000];
        assert_eq!(count_segments(pages.into_iter(), &l), Ok(3));
        let (n, s) = segs(pages.into_iter(), l);
        assert_eq!(n, 3);
        assert_eq!(
            s[0],
            Segment {
                addr: a,
                len: 0x20000
            }
        );
        assert_eq!(
            s[1],
            Segment {
                addr: b,
                len: 0x30000
            }
        );
        assert_eq!(
            s[2],
            Segment {
                addr: 0x50000,
                len: 0x10000
            }
        );
        Ok(())
    }

    #[test]
    fn coalesce_respects_max_segment_length() -> Result {
        let pages = [0u64, P, 2 * P, 3 * P, 4 * P];
        let l = limits(0x20000, u64::MAX)?;
        let (n, s) = segs(pages.into_iter(), l);
        assert_eq!(n, 3);
        assert_eq!(
            s[0],
            Segment {
                addr: 0,
                len: 0x20000
            }
        );
        assert_eq!(
            s[1],
            Segment {
                addr: 2 * P,
                len: 0x20000
            }
        );
        assert_eq!(
            s[2],
            Segment {
                addr: 4 * P,
                len: 0x10000
            }
        );
        assert_eq!(count_segments(pages.into_iter(), &l), Ok(3));
        // A limit that is not a whole number of pages is rounded down: 200 KiB -> 3 pages.
        let l = limits(200 * 1024, u64::MAX)?;
        assert_eq!(l.max_len(), 3 * P);
        assert_eq!(l.page_size(), P);
        let (n, s) = segs(pages.into_iter(), l);
        assert_eq!(n, 2);
        assert_eq!(s[0].len, 0x30000);
        assert_eq!(
            s[1],
            Segment {
                addr: 3 * P,
                len: 0x20000
            }
        );
        // Exactly one page per segment.
        assert_eq!(
            count_segments(pages.into_iter(), &limits(0x10000, u64::MAX)?),
            Ok(5)
        );
        Ok(())
    }

    #[test]
    fn coalesce_never_crosses_the_segment_boundary() -> Result {
        // Contiguous pages straddling 4 GiB, with a 4 GiB boundary.
        let pages = [0xfffe_0000u64, 0xffff_0000, 0x1_0000_0000, 0x1_0001_0000];
        let l = limits(u32::MAX, 0xffff_ffff)?;
        let (n, s) = segs(pages.into_iter(), l);
        assert_eq!(n, 2);
        assert_eq!(
            s[0],
            Segment {
                addr: 0xfffe_0000,
                len: 0x20000
            }
        );
        assert_eq!(
            s[1],
            Segment {
                addr: 0x1_0000_0000,
                len: 0x20000
            }
        );
        // Without a boundary they merge.
        assert_eq!(
            count_segments(pages.into_iter(), &limits(u32::MAX, u64::MAX)?),
            Ok(1)
        );
        // A boundary equal to the page size allows no merging at all.
        assert_eq!(
            count_segments(pages.into_iter(), &limits(u32::MAX, P - 1)?),
            Ok(4)
        );
        Ok(())
    }

    #[test]
    fn coalesce_at_the_u32_length_limit() -> Result {
        // 70000 contiguous pages from 0: segments of 65535 pages (4 GiB - 64 KiB).
        let n = 70000u64;
        let l = limits(u32::MAX, u64::MAX)?;
        assert_eq!(l.max_len(), 0xffff_0000);
        let (count, s) = segs((0..n).map(|i| i * P), l);
        assert_eq!(count, 2);
        assert_eq!(
            s[0],
            Segment {
                addr: 0,
                len: 0xffff_0000
            }
        );
        assert_eq!(
            s[1],
            Segment {
                addr: 0xffff_0000,
                len: ((n - 65535) * P) as u32
            }
        );
        // With a 4 GiB boundary the second segment ends at 4 GiB after one page.
        let l = limits(u32::MAX, 0xffff_ffff)?;
        let (count, s) = segs((0..n).map(|i| i * P), l);
        assert_eq!(count, 3);
        assert_eq!(
            s[1],
            Segment {
                addr: 0xffff_0000,
                len: 0x10000
            }
        );
        assert_eq!(
            s[2],
            Segment {
                addr: 0x1_0000_0000,
                len: ((n - 65536) * P) as u32
            }
        );
        assert_eq!(count_segments((0..n).map(|i| i * P), &l), Ok(3));
        Ok(())
    }

    #[test]
    fn coalesce_reproduces_its_input() -> Result {
        // Pseudo-random runs (fixed LCG seed): expanding the segments back
        // into pages must give exactly the input sequence, and every segment
        // must respect the limits.
        fn page(i: u64) -> u64 {
            let mut x = 0x1234_5678u64;
            let mut addr = 0x10_0000_0000u64;
            let mut k = 0;
            while k < i {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // About one break in four: jump ahead by 1..16 pages.
                addr += if (x >> 60) < 4 {
                    ((x >> 56) & 0xf) * P + 2 * P
                } else {
                    P
                };
                k += 1;
            }
            addr
        }
        let total = 300u64;
        let l = limits(0x80000, 0xff_ffff)?;
        let counted = count_segments((0..total).map(page), &l)?;
        let mut next = 0u64;
        let mut produced = 0usize;
        let mut mismatches = 0u32;
        for s in coalesce((0..total).map(page), l) {
            produced += 1;
            assert!(s.len > 0 && u64::from(s.len) % P == 0 && u64::from(s.len) <= l.max_len());
            assert_eq!(
                s.addr & !0xff_ffff,
                (s.addr + u64::from(s.len) - 1) & !0xff_ffff
            );
            let mut off = 0u64;
            while off < u64::from(s.len) {
                if page(next) != s.addr + off {
                    mismatches += 1;
                }
                next += 1;
                off += P;
            }
        }
        assert_eq!(mismatches, 0);
        assert_eq!(next, total);
        assert_eq!(produced, counted);
        // The generator must actually produce both merges and breaks.
        assert!(counted > 10 && counted < 290);
        Ok(())
    }

    #[test]
    fn coalesce_refuses_bad_limits_and_pages() -> Result {
        assert_eq!(
            SegmentLimits::new(0, u32::MAX, u64::MAX),
            Err(CoalesceError::BadPageSize)
        );
        assert_eq!(
            SegmentLimits::new(3 * 4096, u32::MAX, u64::MAX),
            Err(CoalesceError::BadPageSize)
        );
        assert_eq!(
            SegmentLimits::new(P, 0xffff, u64::MAX),
            Err(CoalesceError::MaxLenBelowPage)
        );
        assert_eq!(
            SegmentLimits::new(P, 0, u64::MAX),
            Err(CoalesceError::MaxLenBelowPage)
        );
        assert_eq!(
            SegmentLimits::new(P, u32::MAX, 0x1233),
            Err(CoalesceError::BadBoundary)
        );
        assert_eq!(
            SegmentLimits::new(P, u32::MAX, 0xfff),
            Err(CoalesceError::BadBoundary)
        );
        assert_eq!(
            SegmentLimits::new(P, u32::MAX, 0),
            Err(CoalesceError::BadBoundary)
        );
        assert!(SegmentLimits::new(4096, 4096, 0xfff).is_ok());
        let l = limits(u32::MAX, u64::MAX)?;
        assert_eq!(
            count_segments([0x10000u64, 0x20001].into_iter(), &l),
            Err(CoalesceError::BadPage(0x20001))
        );
        let top = 0xffff_ffff_ffff_0000u64;
        assert_eq!(count_segments([top - P, top].into_iter(), &l), Ok(1));
        assert_eq!(
            count_segments([u64::MAX].into_iter(), &l),
            Err(CoalesceError::BadPage(u64::MAX))
        );
        // Unchecked bad pages still do not panic and are never merged.
        assert_eq!(coalesce([u64::MAX, 0].into_iter(), l).count(), 2);
        Ok(())
    }

    #[test]
    fn coalesce_extents_is_coalesce_of_the_pages() -> Result {
        // Pseudo-random extents (fixed LCG seed) of 1..40 pages, about half
        // of them contiguous with the one before: the segments must be
        // exactly those of the per-page coalescing, for several limits.
        fn extent(i: u64) -> (u64, u64) {
            let mut x = 0x9e37_79b9u64;
            let mut addr = 0x10_0000_0000u64 - 7 * P;
            let mut len = P;
            let mut k = 0;
            while k <= i {
                addr += len;
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if (x >> 63) == 1 {
                    addr += ((x >> 50) & 0x7) * P + P;
                }
                len = ((x >> 40) % 40 + 1) * P;
                k += 1;
            }
            (addr, len)
        }
        let n = 200u64;
        let pages = || {
            (0..n).flat_map(move |i| {
                let (a, l) = extent(i);
                (0..l / P).map(move |j| a + j * P)
            })
        };
        for l in [
            limits(u32::MAX, u64::MAX)?,
            limits(0x80000, 0xff_ffff)?,
            limits(0x10000, u64::MAX)?,
            limits(0x40000, 0x3_ffff)?,
        ] {
            let mut a = coalesce(pages(), l);
            let mut b = coalesce_extents((0..n).map(extent), l);
            let mut count = 0;
            loop {
                match (a.next(), b.next()) {
                    (None, None) => break,
                    (Some(x), Some(Some(y))) => assert_eq!(x, y),
                    _ => panic!("the two coalescings differ in length"),
                }
                count += 1;
            }
            assert!(count > 10);
        }
        // A TiB in one extent: 2^40 / 2 GiB segments, without a page loop.
        let l = SegmentLimits::new(4096, 0x8000_0000, u64::MAX)?;
        assert_eq!(
            coalesce_extents([(1u64 << 40, 1u64 << 40)].into_iter(), l).count(),
            512
        );
        // Bad extents end the iteration with `None`.
        let l = limits(u32::MAX, u64::MAX)?;
        let mut it = coalesce_extents([(0x10000u64, P), (0x20001, P)].into_iter(), l);
        assert_eq!(
            it.next(),
            Some(Some(Segment {
                addr: 0x10000,
                len: P as u32
            }))
        );
        assert_eq!(it.next(), Some(None));
        assert_eq!(it.next(), None);
        assert_eq!(
            coalesce_extents([(u64::MAX - P + 1, 2 * P)].into_iter(), l).next(),
            Some(None)
        );
        Ok(())
    }
}
