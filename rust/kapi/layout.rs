// SPDX-License-Identifier: GPL-2.0

//! The layout of the kernel structures Rust reads or builds, checked
//! against the C compiler's at load. Rust reaches them through bindgen's
//! bindings (`kernel::bindings` and ours), which are right only if bindgen
//! saw the structures as the kernel's C compiler laid them out; on the
//! rig's debug kernel `kernel::bindings`' `task_struct` was not (its `mm`
//! 48 bytes early), which is why `current->mm` is read in C. A module
//! whose bindings place a field elsewhere than the kernel does would read
//! and write the wrong memory, so peermem refuses to load instead, naming
//! the field. Upstream counterpart: none (bindgen's layout tests, which the
//! kernel's build turns off, check bindgen against itself, not against C).

use super::raw;
use core::mem::{offset_of, size_of, MaybeUninit};
use kernel::bindings;
use kernel::prelude::*;

/// The offset of a field reached through anonymous unions (bindgen's
/// `__bindgen_anon_N`), which `offset_of!` cannot name on every toolchain
/// the supported kernels build with.
macro_rules! field_offset {
    ($t:ty, $($f:tt).+) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: `addr_of!` of a field projection of a pointer to (uninit)
        // storage of the type computes an address without reading memory.
        let f = unsafe { core::ptr::addr_of!((*base).$($f).+) };
        f as usize - base as usize
    }};
}

/// What Rust's bindings say, in the order of `peermem_c_layout`
/// (`rust/helpers.c`): one name and value per C entry.
fn rust_layout() -> [(&'static str, usize); 40] {
    use bindings::{
        file, file_operations as fops, mmu_interval_notifier as mni,
        mmu_interval_notifier_ops as mniops, mmu_notifier_range as range, resource, sg_table,
        vm_area_struct as vma,
    };
    [
        ("file.private_data", offset_of!(file, private_data)),
        ("file.f_flags", offset_of!(file, f_flags)),
        ("sizeof file_operations", size_of::<fops>()),
        ("file_operations.owner", offset_of!(fops, owner)),
        ("file_operations.open", offset_of!(fops, open)),
        ("file_operations.release", offset_of!(fops, release)),
        ("file_operations.read", offset_of!(fops, read)),
        ("file_operations.write", offset_of!(fops, write)),
        ("file_operations.poll", offset_of!(fops, poll)),
        ("file_operations.mmap", offset_of!(fops, mmap)),
        ("file_operations.llseek", offset_of!(fops, llseek)),
        (
            "vm_area_struct.vm_start",
            field_offset!(vma, __bindgen_anon_1.__bindgen_anon_1.vm_start),
        ),
        (
            "vm_area_struct.vm_end",
            field_offset!(vma, __bindgen_anon_1.__bindgen_anon_1.vm_end),
        ),
        ("vm_area_struct.vm_pgoff", offset_of!(vma, vm_pgoff)),
        (
            "vm_area_struct.vm_flags",
            field_offset!(vma, __bindgen_anon_2.vm_flags),
        ),
        ("mmu_notifier_range.event", offset_of!(range, event)),
        ("mmu_notifier_range.flags", offset_of!(range, flags)),
        ("mmu_notifier_range.mm", offset_of!(range, mm)),
        ("sizeof mmu_interval_notifier", size_of::<mni>()),
        (
            "mmu_interval_notifier.invalidate_seq",
            offset_of!(mni, invalidate_seq),
        ),
        ("sizeof mmu_interval_notifier_ops", size_of::<mniops>()),
        (
            "mmu_interval_notifier_ops.invalidate",
            offset_of!(mniops, invalidate),
        ),
        ("resource.start", offset_of!(resource, start)),
        ("resource.end", offset_of!(resource, end)),
        ("resource.flags", offset_of!(resource, flags)),
        ("sizeof sg_table", size_of::<sg_table>()),
        ("sg_table.sgl", offset_of!(sg_table, sgl)),
        ("sg_table.nents", offset_of!(sg_table, nents)),
        ("sg_table.orig_nents", offset_of!(sg_table, orig_nents)),
        ("sizeof miscdevice", size_of::<raw::miscdevice>()),
        ("miscdevice.minor", offset_of!(raw::miscdevice, minor)),
        ("miscdevice.name", offset_of!(raw::miscdevice, name)),
        ("miscdevice.fops", offset_of!(raw::miscdevice, fops)),
        ("miscdevice.mode", offset_of!(raw::miscdevice, mode)),
        ("sizeof work_struct", size_of::<bindings::work_struct>()),
        ("sizeof completion", size_of::<bindings::completion>()),
        (
            "sizeof wait_queue_head",
            size_of::<bindings::wait_queue_head>(),
        ),
        (
            "sizeof wait_queue_entry",
            size_of::<bindings::wait_queue_entry>(),
        ),
        ("sizeof spinlock_t", size_of::<bindings::spinlock_t>()),
        (
            "sizeof lock_class_key",
            size_of::<bindings::lock_class_key>(),
        ),
    ]
}

// `c_ulong` is `u64` on 6.12 and `usize` from 6.13 on.
#[allow(clippy::unnecessary_cast)]
/// Compares the bindings' layout with the C compiler's; `ENOEXEC` (the
/// module does not fit this kernel) with a line naming the first field
/// that differs.
pub(crate) fn check() -> Result {
    let rust = rust_layout();
    // SAFETY: a constant defined in `rust/helpers.c`, never written.
    let len = unsafe { raw::peermem_c_layout_len } as usize;
    if len != rust.len() {
        pr_err!(
            "this build's layout table has {} entries in C and {} in Rust: a broken build; rebuild peermem from one source tree\n",
            len,
            rust.len()
        );
        return Err(ENOEXEC);
    }
    // SAFETY: `peermem_c_layout` is a constant array of `len` entries
    // (`peermem_c_layout_len` is its `ARRAY_SIZE`), never written.
    let c = unsafe { core::slice::from_raw_parts(raw::peermem_c_layout.as_ptr(), len) };
    for (&cv, &(name, rv)) in c.iter().zip(rust.iter()) {
        if cv as usize != rv {
            pr_err!(
                "this build's Rust bindings place {} at {} where the kernel's C headers have {}: it would read and write the wrong memory, so it does not load. Rebuild peermem against this kernel's own headers and Rust metadata (linux-headers and linux-lib-rust of the running kernel; scripts/doctor.sh checks them)\n",
                name,
                rv,
                cv
            );
            return Err(ENOEXEC);
        }
    }
    Ok(())
}
