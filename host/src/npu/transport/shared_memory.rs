//! The service on a thread of its own, requests and responses through the
//! dspqueue-like mailbox at the start of an anonymous shared mapping, data
//! in the mapping's buffers: the same memory protocol as the simulator, but
//! the native firmware crate serves it. This is the transport that overlaps
//! CPU work with an op in flight natively.
use super::{queue, Fault, Layout, Region, Transport, TransportKind};
use crate::{Error, Result};
use hexlora_dsp::service::mailbox::{self, Exit};
use hexlora_dsp::service::ProjectionService;
use std::mem::ManuallyDrop;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a new service thread may take to report READY.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The shared-memory transport.
pub struct SharedMemory {
    /// Dropped by hand: leaked if the service thread hangs (see Drop).
    region: ManuallyDrop<Region>,
    service: Option<JoinHandle<Exit>>,
    /// Hung threads replaced by a restart; they may still wake up.
    abandoned: Vec<JoinHandle<Exit>>,
}

impl SharedMemory {
    /// Maps the region and starts the service thread.
    pub fn new(layout: Layout) -> Result<SharedMemory> {
        let mut t = SharedMemory { region: ManuallyDrop::new(Region::anonymous(layout)?), service: None, abandoned: Vec::new() };
        t.start()?;
        Ok(t)
    }

    fn start(&mut self) -> Result<()> {
        queue::init(&mut self.region)?;
        let base = self.region.base() as usize;
        let len = self.region.layout().total;
        let handle = std::thread::Builder::new()
            .name("npu-service".into())
            .spawn(move || {
                let mut idle = |_: u32| {
                    std::thread::sleep(Duration::from_micros(10));
                    true
                };
                // SAFETY: the region outlives the thread (Drop stops and
                // joins it, or leaks the mapping if it hangs) and the host
                // follows the mailbox protocol.
                unsafe { mailbox::serve::<ProjectionService>(base as *mut u8, len, &mut idle) }
            })
            .map_err(|e| Error::Npu(format!("cannot start the service thread: {e}")))?;
        self.service = Some(handle);
        let service = &self.service;
        queue::wait_ready(&mut self.region, START_TIMEOUT, &mut || finished(service))
    }
}

fn finished(service: &Option<JoinHandle<Exit>>) -> Option<String> {
    match service {
        Some(h) if !h.is_finished() => None,
        Some(_) => Some("the service thread ended (panicked or left the mailbox)".into()),
        None => Some("no service thread".into()),
    }
}

impl Transport for SharedMemory {
    fn kind(&self) -> TransportKind {
        TransportKind::SharedMemory
    }

    fn region(&mut self) -> &mut Region {
        &mut self.region
    }

    fn post(&mut self, request: &[u8]) -> std::result::Result<(), Fault> {
        queue::post(&mut self.region, request)
    }

    fn wait(&mut self, timeout: Duration) -> std::result::Result<Vec<u8>, Fault> {
        let service = &self.service;
        queue::wait(&mut self.region, timeout, &mut || finished(service))
    }

    /// A thread cannot be killed: a hung one is superseded (the new
    /// generation makes it leave without writing once it wakes) and
    /// detached.
    fn restart(&mut self) -> Result<()> {
        queue::header(&mut self.region).stop();
        if let Some(h) = self.service.take() {
            if h.is_finished() {
                let _ = h.join();
            } else {
                self.abandoned.push(h);
            }
        }
        self.start()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        queue::header(&mut self.region).stop();
        let threads: Vec<_> = self.service.take().into_iter().chain(self.abandoned.drain(..)).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while threads.iter().any(|h| !h.is_finished()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A hung thread still holds the base pointer: then the mapping is
        // leaked rather than unmapped under it.
        if threads.iter().all(JoinHandle::is_finished) {
            threads.into_iter().for_each(|h| drop(h.join()));
            // SAFETY: dropped once, and every other user has ended.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        }
    }
}
