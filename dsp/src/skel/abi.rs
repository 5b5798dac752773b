//! The FastRPC calling convention, as `remote.h` defines it.
//!
//! The host-side stub of `hexlora.idl` calls
//! `hexlora_skel_handle_invoke(handle, scalars, args)`: `scalars` packs the
//! method number and how many input buffers, output buffers, input handles
//! and output handles `args` holds, in that order.
use core::ffi::c_void;

/// `remote_buf`: a buffer passed with the call (zero-copy when the host
/// allocated it with rpcmem).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RemoteBuf {
    /// Start of the buffer, mapped into the DSP's address space.
    pub pv: *mut c_void,
    /// Length in bytes.
    pub len: usize,
}

/// `remote_dma_handle`: an ION/dmabuf file descriptor and offset.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RemoteDmaHandle {
    /// File descriptor.
    pub fd: i32,
    /// Offset into it.
    pub offset: u32,
}

/// `remote_arg`: one argument of an invocation.
#[repr(C)]
#[derive(Clone, Copy)]
pub union RemoteArg {
    /// A buffer (input or output).
    pub buf: RemoteBuf,
    /// A 32-bit handle.
    pub h: u32,
    /// A 64-bit handle.
    pub h64: u64,
    /// A DMA handle.
    pub dma: RemoteDmaHandle,
}

/// The packed `scalars` word (`REMOTE_SCALARS_MAKEX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scalars(pub u32);

impl Scalars {
    /// `REMOTE_SCALARS_MAKE(method, in_bufs, out_bufs)`.
    pub const fn make(method: u32, in_bufs: u32, out_bufs: u32) -> Scalars {
        Scalars::make_x(0, method, in_bufs, out_bufs, 0, 0)
    }

    /// `REMOTE_SCALARS_MAKEX(attr, method, in, out, in_handles, out_handles)`.
    pub const fn make_x(attr: u32, method: u32, ins: u32, outs: u32, in_h: u32, out_h: u32) -> Scalars {
        Scalars(
            ((attr & 0x7) << 29)
                | ((method & 0x1f) << 24)
                | ((ins & 0xff) << 16)
                | ((outs & 0xff) << 8)
                | ((in_h & 0x0f) << 4)
                | (out_h & 0x0f),
        )
    }

    /// `REMOTE_SCALARS_METHOD`.
    pub const fn method(self) -> u32 {
        (self.0 >> 24) & 0x1f
    }
    /// `REMOTE_SCALARS_INBUFS`.
    pub const fn in_bufs(self) -> usize {
        ((self.0 >> 16) & 0xff) as usize
    }
    /// `REMOTE_SCALARS_OUTBUFS`.
    pub const fn out_bufs(self) -> usize {
        ((self.0 >> 8) & 0xff) as usize
    }
    /// `REMOTE_SCALARS_INHANDLES`.
    pub const fn in_handles(self) -> usize {
        ((self.0 >> 4) & 0x0f) as usize
    }
    /// `REMOTE_SCALARS_OUTHANDLES`.
    pub const fn out_handles(self) -> usize {
        (self.0 & 0x0f) as usize
    }
    /// Total `remote_arg` entries the call carries.
    pub const fn total(self) -> usize {
        self.in_bufs() + self.out_bufs() + self.in_handles() + self.out_handles()
    }
}

/// `AEE_SUCCESS`.
pub const AEE_SUCCESS: i32 = 0;
/// `AEE_ENOMEMORY`: no free session slot.
pub const AEE_ENOMEMORY: i32 = 2;
/// `AEE_EBADPARM`: wrong argument counts, short buffers, unknown handle.
pub const AEE_EBADPARM: i32 = 14;
/// `AEE_EUNSUPPORTED`: unknown method.
pub const AEE_EUNSUPPORTED: i32 = 20;
