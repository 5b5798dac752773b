//! A software DMA engine: a real descriptor queue that copies bytes.
//!
//! Pushing only queues; each [`DmaEngine::poll`] completes one descriptor
//! (the engine "makes progress" when the core looks at it) and
//! [`DmaEngine::wait`] completes everything up to the ticket. Completion is in
//! push order, like one UDMA channel.
use super::{Desc2d, DescState, DmaEngine, Ticket};
use heapless::Deque;

/// Descriptors the queue holds before `push` says it is full.
pub const QUEUE_DEPTH: usize = 64;

/// The software engine.
pub struct SoftwareDma {
    queue: Deque<Desc2d, QUEUE_DEPTH>,
    /// Tickets below this are done.
    done_below: u64,
    /// Ticket the next push gets.
    next: u64,
    /// Descriptors completed since creation.
    pub completed: u64,
}

impl Default for SoftwareDma {
    fn default() -> Self {
        SoftwareDma::new()
    }
}

impl SoftwareDma {
    /// An idle engine.
    pub const fn new() -> SoftwareDma {
        SoftwareDma { queue: Deque::new(), done_below: 0, next: 0, completed: 0 }
    }

    /// Descriptors queued and not yet done.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Completes the oldest queued descriptor, if any.
    fn step(&mut self) {
        let Some(d) = self.queue.pop_front() else { return };
        for row in 0..d.roi_height as usize {
            // SAFETY: the pusher promised both regions stay valid and
            // untouched until completion (see `DmaEngine::push`).
            unsafe {
                let src = d.src.add(row * d.src_stride as usize);
                let dst = d.dst.add(row * d.dst_stride as usize);
                core::ptr::copy(src, dst, d.roi_width as usize);
            }
        }
        self.done_below += 1;
        self.completed += 1;
    }
}

impl DmaEngine for SoftwareDma {
    unsafe fn push(&mut self, d: Desc2d) -> Option<Ticket> {
        self.queue.push_back(d).ok()?;
        let t = Ticket(self.next);
        self.next += 1;
        Some(t)
    }

    fn poll(&mut self, t: Ticket) -> DescState {
        if t.0 >= self.done_below {
            self.step();
        }
        if t.0 < self.done_below {
            DescState::Done
        } else {
            DescState::Pending
        }
    }

    fn wait(&mut self, t: Ticket) {
        while t.0 >= self.done_below && !self.queue.is_empty() {
            self.step();
        }
    }

    fn wait_all(&mut self) {
        while !self.queue.is_empty() {
            self.step();
        }
    }
}
