//! From a host file descriptor to the DSP address of its persistent
//! mapping: how the skel's `map` method finds the session's weights.
//!
//! On a device the host allocates the weights with rpcmem, maps them once
//! with `fastrpc_mmap(domain, fd, addr, 0, len, FASTRPC_MAP_FD)`, and calls
//! `map(fd, len)`; the DSP side looks the fd up with `HAP_mmap_get` (and
//! drops its reference with `HAP_mmap_put` when the session closes). Those
//! two symbols are resolved by the DSP's loader; the skel link leaves them
//! undefined. `HAP_mmap_get` returns no length, so offset and length are the
//! host's word there: a host that lies faults its own protection domain
//! only.
//!
//! The FastRPC stand-in (`dsp/fastrpc-standin`, feature `hap`) builds this
//! same device path natively and defines the two symbols itself.
//!
//! Everywhere else (native tests, the in-process transport, the simulator)
//! a small table plays the DSP's part:
//! whoever maps memory [`register`]s `(fd, pointer, length)`, and `get`
//! checks the requested range against the registered one.
use super::abi::{RemoteBuf, AEE_EBADPARM};

/// The DSP address of `len` bytes at `offset` in `fd`'s mapping; `Err` is
/// an `AEE_*` code.
pub fn get(fd: i32, offset: usize, len: usize) -> Result<RemoteBuf, i32> {
    imp::get(fd, offset, len)
}

/// Drops the reference [`get`] took.
pub fn put(fd: i32) {
    imp::put(fd)
}

#[cfg(hexlora_hap)]
mod imp {
    use super::{RemoteBuf, AEE_EBADPARM};
    use core::ffi::c_void;

    extern "C" {
        // HAP_mem.h: int HAP_mmap_get(int fd, void **vaddr, uint64 *paddr);
        fn HAP_mmap_get(fd: i32, vaddr: *mut *mut c_void, paddr: *mut u64) -> i32;
        // HAP_mem.h: int HAP_mmap_put(int fd);
        fn HAP_mmap_put(fd: i32) -> i32;
    }

    pub fn get(fd: i32, offset: usize, len: usize) -> Result<RemoteBuf, i32> {
        let (mut vaddr, mut paddr) = (core::ptr::null_mut::<c_void>(), 0u64);
        // SAFETY: both out-pointers are valid locals.
        let code = unsafe { HAP_mmap_get(fd, &mut vaddr, &mut paddr) };
        match code {
            0 if !vaddr.is_null() && (vaddr as usize).checked_add(offset).and_then(|a| a.checked_add(len)).is_some() => {
                Ok(RemoteBuf { pv: vaddr.cast::<u8>().wrapping_add(offset).cast(), len })
            }
            0 => Err(AEE_EBADPARM),
            code => Err(code),
        }
    }

    pub fn put(fd: i32) {
        // SAFETY: plain call; an unknown fd is an error code, ignored here
        // (the session is closing either way).
        unsafe { HAP_mmap_put(fd) };
    }
}

#[cfg(not(hexlora_hap))]
mod imp {
    use super::{RemoteBuf, AEE_EBADPARM};
    use spinning_top::Spinlock;

    /// `(fd, address, length)` of every registered mapping.
    static TABLE: Spinlock<heapless::Vec<(i32, usize, usize), 64>> = Spinlock::new(heapless::Vec::new());

    pub fn get(fd: i32, offset: usize, len: usize) -> Result<RemoteBuf, i32> {
        let table = TABLE.lock();
        match table.iter().find(|e| e.0 == fd) {
            Some(&(_, addr, mapped)) if offset.checked_add(len).is_some_and(|end| end <= mapped) => {
                Ok(RemoteBuf { pv: (addr + offset) as *mut _, len })
            }
            _ => Err(AEE_EBADPARM),
        }
    }

    pub fn put(_fd: i32) {}

    pub fn register(fd: i32, addr: usize, len: usize) -> bool {
        let mut table = TABLE.lock();
        table.retain(|e| e.0 != fd);
        table.push((fd, addr, len)).is_ok()
    }

    pub fn unregister(fd: i32) {
        TABLE.lock().retain(|e| e.0 != fd);
    }
}

/// Registers `len` bytes at `addr` as the mapping of `fd` (replacing an
/// earlier one); `false` when the table is full, and always on builds over
/// the HAP runtime, where the host's `fastrpc_mmap` does this.
///
/// # Safety
/// The memory must stay valid for reads until [`unregister`] and until every
/// session that mapped it has closed.
pub unsafe fn register(fd: i32, addr: *const u8, len: usize) -> bool {
    #[cfg(not(hexlora_hap))]
    return imp::register(fd, addr as usize, len);
    #[cfg(hexlora_hap)]
    {
        let _ = (fd, addr, len);
        false
    }
}

/// Forgets `fd`'s mapping (`fastrpc_munmap`); nothing on HAP builds.
pub fn unregister(fd: i32) {
    #[cfg(not(hexlora_hap))]
    imp::unregister(fd);
    #[cfg(hexlora_hap)]
    let _ = fd;
}
