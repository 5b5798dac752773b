//! Panics on a device: log, then abort the protection domain through the
//! QuRT C library's `abort`, so the FastRPC framework reports the failure
//! to the host instead of a DSP thread spinning forever.

extern "C" {
    fn abort() -> !;
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    defmt::error!("firmware panic");
    // SAFETY: abort takes no arguments and does not return.
    unsafe { abort() }
}
