//! `libhexlora_skel.so`: the library the FastRPC framework loads into the
//! DSP's user protection domain. It exports the skel entry point and the
//! `hexlora.idl` interface functions (see `dsp/include/hexlora.h`); all
//! logic lives in `hexlora_dsp::skel`, tested natively and in the simulator.
#![cfg_attr(target_arch = "hexagon", no_std)]
#![deny(missing_docs)]

use core::ffi::{c_char, CStr};
use hexlora_dsp::service::ProjectionService;
use hexlora_dsp::skel::{self, RemoteArg, Sessions};
use spinning_top::Spinlock;

/// Sessions served by this library: the projection service, which is
/// `Send` (its DMA engine lives per request, its VTCM region is owned
/// memory), so the table can be a static shared by the FastRPC threads.
static SESSIONS: Spinlock<Sessions<ProjectionService, 4>> = Spinlock::new(Sessions::new());

/// FastRPC entry point.
///
/// # Safety
/// Called by the FastRPC framework with `args` holding the arguments
/// `scalars` describes.
#[no_mangle]
pub unsafe extern "C" fn hexlora_skel_handle_invoke(handle: u64, scalars: u32, args: *mut RemoteArg) -> i32 {
    skel::invoke(&SESSIONS, handle, scalars, args)
}

/// `hexlora_open` of the IDL interface: a new session for `uri`.
///
/// # Safety
/// `uri` is a NUL-terminated string and `handle` writable, or null (which
/// is refused).
#[no_mangle]
pub unsafe extern "C" fn hexlora_open(uri: *const c_char, handle: *mut u64) -> i32 {
    if uri.is_null() || handle.is_null() {
        return skel::abi::AEE_EBADPARM;
    }
    match skel::open_session(&SESSIONS, CStr::from_ptr(uri).to_bytes()) {
        Ok(h) => {
            handle.write(h);
            skel::abi::AEE_SUCCESS
        }
        Err(code) => code,
    }
}

/// `hexlora_close` of the IDL interface.
#[no_mangle]
pub extern "C" fn hexlora_close(handle: u64) -> i32 {
    skel::close_session(&SESSIONS, handle)
}
