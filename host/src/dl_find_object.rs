//! `_dl_find_object` for the static musl binary (`ci/build-aarch64.sh
//! --static`). Its unwinder is gcc's `libgcc_eh` (Debian has no LLVM
//! libunwind for musl), which since gcc 12 finds a frame's unwind tables
//! through this glibc 2.35 call; musl lacks it. This is the same lookup
//! over `dl_iterate_phdr`, which musl has, static binaries included: the
//! loaded object whose segments hold `pc`, and its `PT_GNU_EH_FRAME`.
//! Not a module of the library: a symbol in an rlib is pulled in only when
//! something before it needs that object, so each crate that links a
//! static musl binary includes this file itself (`main.rs`, the library's
//! own unit tests in `lib.rs`, the integration suite's `main.rs`).
use std::ffi::{c_int, c_void};

/// glibc's `struct dl_find_object` (aarch64 has no `dlfo_eh_dbase`).
#[repr(C)]
pub struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 7],
}

/// # Safety
/// `result` points to a writable `DlFindObject` (libgcc's caller).
#[no_mangle]
pub unsafe extern "C" fn _dl_find_object(pc: *mut c_void, result: *mut DlFindObject) -> c_int {
    let mut search = (pc as usize, result, false);
    // SAFETY: the callback reads the phdr array dl_iterate_phdr hands it.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
    if search.2 {
        0
    } else {
        -1
    }
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is `_dl_find_object`'s search; `info` is valid for the call.
    let (search, info) = unsafe { (&mut *data.cast::<(usize, *mut DlFindObject, bool)>(), &*info) };
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    let (mut start, mut end, mut eh) = (usize::MAX, 0usize, None);
    for ph in phdrs {
        let (lo, hi) = (base + ph.p_vaddr as usize, base + (ph.p_vaddr + ph.p_memsz) as usize);
        if ph.p_type == libc::PT_LOAD {
            (start, end) = (start.min(lo), end.max(hi));
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            eh = Some(lo);
        }
    }
    if !(start..end).contains(&search.0) {
        return 0;
    }
    let Some(eh) = eh else { return 0 };
    // SAFETY: the caller's buffer.
    unsafe {
        let out = &mut *search.1;
        (out.flags, out.map_start, out.map_end, out.link_map) = (0, start as *mut c_void, end as *mut c_void, std::ptr::null_mut());
        out.eh_frame = eh as *mut c_void;
    }
    search.2 = true;
    1
}
