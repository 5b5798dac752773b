//! `libcdsprpc_standin.so`: the calls hexlora's FastRPC transport
//! (`host/src/npu/transport/fastrpc.rs`) makes of the device's
//! `libcdsprpc.so`, served in-process by the skel (`dsp/skel`) linked in.
//! FOR TESTS ONLY: it checks the host transport, the skel's exported ABI and
//! the IDL's argument layout together, off a phone.
//!
//! What it does the way FastRPC does:
//! - `rpcmem_alloc` memory has an fd; `fastrpc_mmap(.., FASTRPC_MAP_FD)`
//!   maps it persistently and the skel finds it with `HAP_mmap_get(fd)`,
//!   which this library defines (the skel is built with the device's HAP
//!   paths: feature `hap`), as it does the `HAP_compute_res_*` VTCM calls;
//! - `remote_handle64_open` checks the URI (library, symbol, domain) and
//!   calls the skel's `hexlora_open`; `remote_handle64_invoke` calls its
//!   `hexlora_skel_handle_invoke`;
//! - buffers inside an rpcmem allocation pass zero-copy; any other buffer
//!   is copied (in-bufs into fresh memory, out-bufs back after the call),
//!   so the skel cannot depend on seeing the host's own pointers.
//!
//! What only a phone can check: the signed or unsigned protection domain
//! and its loader (`dlopen` of the skel on the DSP, symbol resolution of the
//! HAP imports), cache maintenance of the mapped buffers, SMMU mappings,
//! real VTCM, and FastRPC's error codes and timeouts.
#![allow(clippy::missing_safety_doc)]

use hexlora_dsp::skel::abi::{RemoteArg, RemoteBuf, Scalars, AEE_EBADPARM, AEE_ENOMEMORY, AEE_SUCCESS};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

/// The only skel this stand-in serves, and how FastRPC would name it.
const SKEL_LIBRARY: &str = "libhexlora_skel.so";
const SKEL_SYMBOL: &str = "hexlora_skel_handle_invoke";
/// `FASTRPC_MAP_FD` (remote.h).
const FASTRPC_MAP_FD: c_int = 2;
/// `CDSP_DOMAIN_ID` (remote.h).
const CDSP_DOMAIN_ID: c_int = 3;
/// An error FastRPC returns for a URI it cannot load (`AEE_ENOSUCHMOD`-like).
const AEE_ENOSUCH: c_int = 39;

#[derive(Default)]
struct State {
    /// rpcmem allocations: (fd, address, layout).
    allocations: Vec<(c_int, usize, Layout)>,
    /// fastrpc_mmap'd fds: (fd, address, length).
    mappings: Vec<(c_int, usize, usize)>,
    /// VTCM handed out: (context id, address, layout).
    vtcm: Vec<(u32, usize, Layout)>,
    /// Open handles: (remote handle, the skel's handle).
    handles: Vec<(u64, u64)>,
    next_fd: c_int,
    next_id: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(|| State { next_fd: 100, next_id: 0x5a00, ..State::default() }))
}

#[no_mangle]
pub extern "C" fn rpcmem_init() {}

#[no_mangle]
pub extern "C" fn rpcmem_deinit() {}

/// Page-aligned zeroed memory with an fd of its own.
#[no_mangle]
pub unsafe extern "C" fn rpcmem_alloc(_heapid: c_int, _flags: u32, size: c_int) -> *mut c_void {
    let Some(layout) = usize::try_from(size).ok().filter(|&s| s > 0).and_then(|s| Layout::from_size_align(s, 4096).ok()) else {
        return std::ptr::null_mut();
    };
    let p = alloc_zeroed(layout);
    if !p.is_null() {
        with_state(|s| {
            s.next_fd += 1;
            s.allocations.push((s.next_fd, p as usize, layout));
        });
    }
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn rpcmem_free(po: *mut c_void) {
    let found = with_state(|s| {
        let i = s.allocations.iter().position(|a| a.1 == po as usize)?;
        Some(s.allocations.swap_remove(i))
    });
    if let Some((_, addr, layout)) = found {
        dealloc(addr as *mut u8, layout);
    }
}

#[no_mangle]
pub extern "C" fn rpcmem_to_fd(po: *mut c_void) -> c_int {
    with_state(|s| s.allocations.iter().find(|a| a.1 == po as usize).map_or(-1, |a| a.0))
}

/// Persistent mapping of `length` bytes of `fd` at `addr` (offset into the
/// allocation `offset`); only `FASTRPC_MAP_FD` on the compute DSP.
#[no_mangle]
pub extern "C" fn fastrpc_mmap(domain: c_int, fd: c_int, addr: *mut c_void, offset: c_int, length: usize, flags: c_int) -> c_int {
    if domain != CDSP_DOMAIN_ID || flags != FASTRPC_MAP_FD || offset < 0 {
        return AEE_EBADPARM;
    }
    with_state(|s| {
        let Some(&(_, base, layout)) = s.allocations.iter().find(|a| a.0 == fd) else {
            return AEE_EBADPARM;
        };
        let inside = addr as usize == base + offset as usize && (offset as usize).checked_add(length).is_some_and(|e| e <= layout.size());
        if !inside || s.mappings.iter().any(|m| m.0 == fd) {
            return AEE_EBADPARM;
        }
        s.mappings.push((fd, addr as usize, length));
        AEE_SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn fastrpc_munmap(domain: c_int, fd: c_int, _addr: *mut c_void, _length: usize) -> c_int {
    with_state(|s| match s.mappings.iter().position(|m| m.0 == fd) {
        Some(i) if domain == CDSP_DOMAIN_ID => {
            s.mappings.swap_remove(i);
            AEE_SUCCESS
        }
        _ => AEE_EBADPARM,
    })
}

/// The DSP side of a `FASTRPC_MAP_FD` mapping (HAP_mem.h), which the skel
/// imports.
#[no_mangle]
pub unsafe extern "C" fn HAP_mmap_get(fd: c_int, vaddr: *mut *mut c_void, paddr: *mut u64) -> c_int {
    let Some(addr) = with_state(|s| s.mappings.iter().find(|m| m.0 == fd).map(|m| m.1)) else {
        return AEE_EBADPARM;
    };
    if vaddr.is_null() {
        return AEE_EBADPARM;
    }
    vaddr.write(addr as *mut c_void);
    if !paddr.is_null() {
        paddr.write(addr as u64);
    }
    AEE_SUCCESS
}

#[no_mangle]
pub extern "C" fn HAP_mmap_put(fd: c_int) -> c_int {
    with_state(|s| if s.mappings.iter().any(|m| m.0 == fd) { AEE_SUCCESS } else { AEE_EBADPARM })
}

/// `compute_res_attr_t`: [0] VTCM bytes asked, [1] the acquired address.
#[repr(C, align(8))]
pub struct Attr([u64; 8]);

#[no_mangle]
pub unsafe extern "C" fn HAP_compute_res_attr_init(attr: *mut Attr) -> c_int {
    if attr.is_null() {
        return AEE_EBADPARM;
    }
    attr.write(Attr([0; 8]));
    AEE_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn HAP_compute_res_attr_set_vtcm_param(attr: *mut Attr, vtcm_size: u32, _single_page: u8) -> c_int {
    if attr.is_null() {
        return AEE_EBADPARM;
    }
    (*attr).0[0] = vtcm_size as u64;
    AEE_SUCCESS
}

/// The device's VTCM is 8 MiB: a larger request is refused (context 0).
#[no_mangle]
pub unsafe extern "C" fn HAP_compute_res_acquire(attr: *mut Attr, _timeout_us: u32) -> u32 {
    const DEVICE_VTCM: u64 = 8 << 20;
    let size = if attr.is_null() { 0 } else { (*attr).0[0] };
    let Some(layout) = Some(size).filter(|&s| s > 0 && s <= DEVICE_VTCM).and_then(|s| Layout::from_size_align(s as usize, 4096).ok()) else {
        return 0;
    };
    let p = alloc_zeroed(layout);
    if p.is_null() {
        return 0;
    }
    (*attr).0[1] = p as u64;
    with_state(|s| {
        s.next_id += 1;
        let id = s.next_id as u32;
        s.vtcm.push((id, p as usize, layout));
        id
    })
}

#[no_mangle]
pub unsafe extern "C" fn HAP_compute_res_attr_get_vtcm_ptr(attr: *mut Attr) -> *mut c_void {
    if attr.is_null() {
        return std::ptr::null_mut();
    }
    (*attr).0[1] as *mut c_void
}

#[no_mangle]
pub unsafe extern "C" fn HAP_compute_res_release(context_id: u32) -> c_int {
    let found = with_state(|s| {
        let i = s.vtcm.iter().position(|v| v.0 == context_id)?;
        Some(s.vtcm.swap_remove(i))
    });
    match found {
        Some((_, addr, layout)) => {
            dealloc(addr as *mut u8, layout);
            AEE_SUCCESS
        }
        None => AEE_EBADPARM,
    }
}

/// `file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=cdsp`:
/// the library and symbol must be the skel's, the domain the compute DSP.
fn uri_names_the_skel(uri: &str) -> bool {
    let Some(rest) = uri.strip_prefix("file:///") else { return false };
    let (lib, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parts = query.split('&');
    lib == SKEL_LIBRARY && parts.next() == Some(SKEL_SYMBOL) && query.split('&').any(|p| p == "_dom=cdsp")
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_open(name: *const c_char, handle: *mut u64) -> c_int {
    if name.is_null() || handle.is_null() {
        return AEE_EBADPARM;
    }
    let uri = CStr::from_ptr(name);
    if !uri.to_str().is_ok_and(uri_names_the_skel) {
        return AEE_ENOSUCH;
    }
    let mut skel_handle = 0u64;
    let code = hexlora_skel::hexlora_open(uri.as_ptr(), &mut skel_handle);
    if code != AEE_SUCCESS {
        return code;
    }
    let remote = with_state(|s| {
        s.next_id += 1;
        s.handles.push((s.next_id, skel_handle));
        s.next_id
    });
    handle.write(remote);
    AEE_SUCCESS
}

#[no_mangle]
pub extern "C" fn remote_handle64_close(handle: u64) -> c_int {
    let skel = with_state(|s| {
        let i = s.handles.iter().position(|h| h.0 == handle)?;
        Some(s.handles.swap_remove(i).1)
    });
    match skel {
        Some(h) => hexlora_skel::hexlora_close(h),
        None => AEE_EBADPARM,
    }
}

/// Whether `b` lies inside one rpcmem allocation (passed zero-copy).
fn in_rpcmem(s: &State, b: &RemoteBuf) -> bool {
    let start = b.pv as usize;
    s.allocations.iter().any(|&(_, base, l)| start >= base && start.checked_add(b.len).is_some_and(|end| end <= base + l.size()))
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_invoke(handle: u64, scalars: u32, args: *mut RemoteArg) -> c_int {
    let Some(skel) = with_state(|s| s.handles.iter().find(|h| h.0 == handle).map(|h| h.1)) else {
        return AEE_EBADPARM;
    };
    let sc = Scalars(scalars);
    let (ins, outs) = (sc.in_bufs(), sc.out_bufs());
    if sc.in_handles() + sc.out_handles() > 0 || (args.is_null() && ins + outs > 0) {
        return AEE_EBADPARM;
    }
    let host: Vec<RemoteArg> = if ins + outs == 0 { Vec::new() } else { std::slice::from_raw_parts(args, ins + outs).to_vec() };
    // Buffers outside rpcmem get DSP-side copies, as FastRPC makes them.
    let mut copies: Vec<Option<Vec<u8>>> = Vec::new();
    let mut dsp: Vec<RemoteArg> = Vec::new();
    for (i, a) in host.iter().enumerate() {
        let b = a.buf;
        if b.len > 0 && b.pv.is_null() {
            return AEE_EBADPARM;
        }
        if b.len == 0 || with_state(|s| in_rpcmem(s, &b)) {
            copies.push(None);
            dsp.push(*a);
            continue;
        }
        let mut copy = Vec::new();
        if copy.try_reserve_exact(b.len).is_err() {
            return AEE_ENOMEMORY;
        }
        copy.resize(b.len, 0u8);
        if i < ins {
            copy.copy_from_slice(std::slice::from_raw_parts(b.pv as *const u8, b.len));
        }
        dsp.push(RemoteArg { buf: RemoteBuf { pv: copy.as_mut_ptr().cast(), len: b.len } });
        copies.push(Some(copy));
    }
    let code = hexlora_skel::hexlora_skel_handle_invoke(skel, scalars, if dsp.is_empty() { std::ptr::null_mut() } else { dsp.as_mut_ptr() });
    for (i, copy) in copies.iter().enumerate().skip(ins) {
        if let (Some(c), true) = (copy, code == AEE_SUCCESS) {
            std::ptr::copy_nonoverlapping(c.as_ptr(), host[i].buf.pv as *mut u8, c.len());
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::uri_names_the_skel;

    #[test]
    fn only_the_skels_uri_opens() {
        assert!(uri_names_the_skel("file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=cdsp"));
        assert!(!uri_names_the_skel("file:///libother_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=cdsp"));
        assert!(!uri_names_the_skel("file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=adsp"));
        assert!(!uri_names_the_skel("libhexlora_skel.so"));
    }
}
