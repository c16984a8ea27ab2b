// SPDX-License-Identifier: GPL-2.0

//! Arrays of plain values in kernel memory charged to the caller's memory
//! cgroup (`kvmalloc(GFP_KERNEL_ACCOUNT)`, `kvfree`): large ones come from
//! vmalloc. Upstream counterpart: `kernel::alloc::KVVec` (6.13), with
//! `GFP_KERNEL_ACCOUNT`; the C glue wraps `kvmalloc`, a macro.

use super::raw;
use core::ptr::NonNull;
use kernel::error::{code, Result};

/// A growable array of `T`s whose capacity the owner chooses (it never
/// grows by itself: [`KvArray::grow_to`]).
///
/// # Invariants
///
/// If `cap > 0`, `ptr` points to an allocation of `peermem_kvmalloc_account`
/// for `cap` `T`s, freed only by `drop`; else it dangles and is never
/// read. The first `len <= cap` elements are initialised.
pub(crate) struct KvArray<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
}

// SAFETY: the array owns its elements; sending it sends them.
unsafe impl<T: Copy + Send> Send for KvArray<T> {}
// SAFETY: `&KvArray` only reads the elements.
unsafe impl<T: Copy + Sync> Sync for KvArray<T> {}

impl<T: Copy> KvArray<T> {
    /// An empty array with no allocation.
    pub(crate) fn new() -> Self {
        // INVARIANT: `cap == 0`, nothing is read through `ptr`.
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
        }
    }

    /// An empty array with room for `cap` elements; `ENOMEM` if out of
    /// memory or the size overflows.
    pub(crate) fn with_capacity(cap: usize) -> Result<Self> {
        let mut a = Self::new();
        a.grow_to(cap)?;
        Ok(a)
    }

    /// Moves the elements to a new allocation for `cap` (more than the
    /// capacity) elements, freeing the old one; `ENOMEM` (the array is
    /// unchanged) if out of memory or the size overflows. `EINVAL` for a
    /// type the allocator does not align or with no size.
    pub(crate) fn grow_to(&mut self, cap: usize) -> Result {
        let size = core::mem::size_of::<T>();
        if size == 0 || core::mem::align_of::<T>() > 8 || cap <= self.cap {
            return Err(code::EINVAL);
        }
        let bytes = cap.checked_mul(size).ok_or(code::ENOMEM)?;
        // SAFETY: FFI call without preconditions.
        let p = unsafe { raw::peermem_kvmalloc_account(bytes) };
        // kvmalloc memory is aligned to at least 8 bytes (checked above).
        let p = NonNull::new(p.cast::<T>()).ok_or(code::ENOMEM)?;
        if self.len > 0 {
            // SAFETY: `len` initialised elements at `ptr` (type
            // invariant); the new allocation holds `cap > len` of them and
            // does not overlap the old one.
            unsafe { core::ptr::copy_nonoverlapping(self.ptr.as_ptr(), p.as_ptr(), self.len) };
        }
        self.free();
        // INVARIANT: a new allocation for `cap` elements, the first `len`
        // copied.
        self.ptr = p;
        self.cap = cap;
        Ok(())
    }

    /// Appends `v` if there is room, else gives it back.
    pub(crate) fn push_within_capacity(&mut self, v: T) -> core::result::Result<(), T> {
        if self.len == self.cap {
            return Err(v);
        }
        // SAFETY: `len < cap`: inside the allocation (type invariant).
        unsafe { self.ptr.as_ptr().add(self.len).write(v) };
        // INVARIANT: element `len` was just written.
        self.len += 1;
        Ok(())
    }

    /// Elements in the array.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements it has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// The elements.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements (type invariant; `ptr` is
        // dangling but aligned and non-null when `len == 0`).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, to change.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, borrowed mutably through `self`.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Frees the allocation (the caller then replaces or forgets `ptr`).
    fn free(&mut self) {
        if self.cap > 0 {
            // SAFETY: our allocation (type invariant), freed once: every
            // caller replaces `ptr` or drops `self` afterwards.
            unsafe { raw::kvfree(self.ptr.as_ptr().cast()) };
        }
    }
}

impl<T: Copy> Drop for KvArray<T> {
    fn drop(&mut self) {
        self.free();
    }
}
