//! The C header `dsp/include/hexlora.h`, through bindgen, against the Rust
//! side of the ABI. Compiled only when ci/bindgen-check.sh provides the
//! generated bindings (`HEXLORA_H_BINDINGS`).
#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code)]
mod c {
    include!(concat!(env!("OUT_DIR"), "/hexlora_h.rs"));
}

use super::abi::*;
use super::{METHOD_CALL, METHOD_CLOSE, METHOD_OPEN, RESPONSE_BUF_BYTES};
use core::mem::{align_of, offset_of, size_of};
use hexlora_proto::protocol::MAX_MESSAGE_BYTES;

#[test]
fn c_header_types_have_the_rust_layout() {
    assert_eq!((size_of::<c::remote_arg>(), align_of::<c::remote_arg>()), (size_of::<RemoteArg>(), align_of::<RemoteArg>()));
    assert_eq!(size_of::<c::remote_buf>(), size_of::<RemoteBuf>());
    assert_eq!(offset_of!(c::remote_buf, nLen), offset_of!(RemoteBuf, len));
    assert_eq!(size_of::<c::remote_dma_handle>(), size_of::<RemoteDmaHandle>());
}

#[test]
fn c_header_constants_match() {
    assert_eq!(c::HEXLORA_METHOD_OPEN, METHOD_OPEN);
    assert_eq!(c::HEXLORA_METHOD_CLOSE, METHOD_CLOSE);
    assert_eq!(c::HEXLORA_METHOD_CALL, METHOD_CALL);
    assert_eq!(c::HEXLORA_MAX_MESSAGE_BYTES as usize, MAX_MESSAGE_BYTES);
    assert_eq!(c::HEXLORA_RESPONSE_BUF_BYTES as usize, RESPONSE_BUF_BYTES);
    assert_eq!(c::HEXLORA_AEE_SUCCESS as i32, AEE_SUCCESS);
    assert_eq!(c::HEXLORA_AEE_ENOMEMORY as i32, AEE_ENOMEMORY);
    assert_eq!(c::HEXLORA_AEE_EBADPARM as i32, AEE_EBADPARM);
    assert_eq!(c::HEXLORA_AEE_EUNSUPPORTED as i32, AEE_EUNSUPPORTED);
}
