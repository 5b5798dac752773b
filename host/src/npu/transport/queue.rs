//! The host side of the mailbox queue (`hexlora_dsp::service::mailbox`),
//! shared by the shared-memory and simulator transports: initialise the
//! header for a new service instance, post, and wait with a timeout while
//! watching that the service is still alive.
use super::{Fault, Region};
use crate::{Error, Result};
use hexlora_dsp::service::mailbox::{state, Header};
use std::time::{Duration, Instant};

/// Says whether the service is alive; `Some(why)` when it is gone.
pub type Liveness<'a> = &'a mut dyn FnMut() -> Option<String>;

/// The header of `region`.
pub fn header(region: &mut Region) -> &Header {
    // SAFETY: every region starts with HEADER_BYTES of page-aligned mapping
    // (Layout), alive as long as `region`.
    unsafe { Header::at(region.base()) }
}

/// Writes a fresh header (new generation) for the next service instance.
pub fn init(region: &mut Region) -> Result<()> {
    let layout = region.layout();
    let table = layout.table().ok_or_else(|| Error::Npu(format!("shared region of {} bytes is beyond the DSP's 4 GiB", layout.total)))?;
    header(region).init(layout.total as u32, table);
    Ok(())
}

/// Waits until the freshly started service reports READY.
pub fn wait_ready(region: &mut Region, timeout: Duration, alive: Liveness<'_>) -> Result<()> {
    let started = Instant::now();
    let mut spins = 0;
    loop {
        match header(region).state() {
            state::READY => return Ok(()),
            state::FAILED => return Err(Error::Npu("the service refused the shared region's header or could not open its session".into())),
            _ => {}
        }
        if let Some(why) = alive() {
            return Err(Error::Npu(format!("the service exited while starting: {why}")));
        }
        if started.elapsed() > timeout {
            return Err(Error::Npu(format!("the service did not start within {timeout:?}")));
        }
        backoff(&mut spins);
    }
}

/// Posts request bytes.
pub fn post(region: &mut Region, request: &[u8]) -> std::result::Result<(), Fault> {
    let h = header(region);
    match h.state() {
        state::READY | state::RESPONSE => {}
        s => return Err(Fault::Transport(format!("mailbox not ready for a request (state {s})"))),
    }
    if h.post(request) {
        Ok(())
    } else {
        Err(Fault::Transport(format!("a {}-byte request does not fit the mailbox slot", request.len())))
    }
}

/// Waits for the response to the posted request.
pub fn wait(region: &mut Region, timeout: Duration, alive: Liveness<'_>) -> std::result::Result<Vec<u8>, Fault> {
    let started = Instant::now();
    let mut spins = 0;
    loop {
        if let Some(bytes) = header(region).response() {
            return Ok(bytes.to_vec());
        }
        // Checking liveness costs a system call: not on every spin.
        if spins % 64 == 63 {
            if let Some(why) = alive() {
                return Err(Fault::Crashed(why));
            }
            if started.elapsed() > timeout {
                return Err(Fault::TimedOut(timeout));
            }
        }
        backoff(&mut spins);
    }
}

/// Spin briefly (the answer to a small op comes fast), then yield, then
/// sleep, so a long op does not burn a core the CPU side needs.
pub fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    match *spins {
        0..=63 => std::hint::spin_loop(),
        64..=1023 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(20)),
    }
}
