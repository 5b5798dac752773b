//! SIGINT / SIGTERM: the first one asks the run to stop after the current
//! optimizer step (which then commits, so a restart resumes from it), the
//! current projection of the start-up planner, or the current user of an
//! evaluation; a second SIGINT kills the process at once (Ctrl-C twice),
//! which is safe too because commits are atomic. Every long command
//! installs the handlers ([`StopRequest::install`]); deep loops ask
//! [`requested`].
use crate::{Error, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The handlers installed in this process (signals are process-wide, so
/// deep code such as the planner asks here instead of threading a handle).
static INSTALLED: OnceLock<StopRequest> = OnceLock::new();

/// Which signal asked this process to stop, if handlers are installed.
pub fn requested() -> Option<&'static str> {
    INSTALLED.get().and_then(StopRequest::requested)
}

/// Set by SIGINT or SIGTERM.
#[derive(Clone)]
pub struct StopRequest {
    int: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

impl StopRequest {
    /// Installs the handlers for this process (once; later calls share them).
    pub fn install() -> Result<Self> {
        if let Some(s) = INSTALLED.get() {
            return Ok(s.clone());
        }
        let (int, term) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let err = |e: std::io::Error| Error::invalid("signal handlers", e.to_string());
        // Order matters: the conditional exit sees the flag before this
        // SIGINT sets it, so only a second SIGINT exits immediately.
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, int.clone()).map_err(err)?;
        signal_hook::flag::register(SIGINT, int.clone()).map_err(err)?;
        signal_hook::flag::register(SIGTERM, term.clone()).map_err(err)?;
        let s = StopRequest { int, term };
        let _ = INSTALLED.set(s.clone());
        Ok(s)
    }

    /// Which signal asked to stop, if any.
    pub fn requested(&self) -> Option<&'static str> {
        if self.term.load(Ordering::SeqCst) {
            Some("SIGTERM")
        } else if self.int.load(Ordering::SeqCst) {
            Some("SIGINT")
        } else {
            None
        }
    }
}
