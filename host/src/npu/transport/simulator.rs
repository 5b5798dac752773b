//! The firmware built for Hexagon (`dsp/src/bin/sim_service.rs`) running
//! under `qemu-hexagon -cpu v73` (qemu 10) as a child process. The mailbox and the
//! shared buffers live in a `/dev/shm` file that both processes map
//! (qemu-user maps guest memory onto host memory, so the mapping is truly
//! shared); the child polls the mailbox with short sleeps.
//!
//! The child is `qemu-hexagon -cpu v73 SERVICE_ELF SHM_FILE BYTES`. A child
//! that exits is seen at once; one that hangs is seen by the timeout; both
//! are killed and replaced by [`Transport::restart`].
use super::{queue, Fault, Layout, Region, Transport, TransportKind};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The CPU qemu-hexagon emulates: the simulator build's target
/// (toolchain/hexagon-env.sh; qemu-user 10 from bookworm-backports).
pub const SIM_CPU: &str = "v73";

/// The environment variable naming the Hexagon service ELF.
pub const SERVICE_ENV: &str = "HEXLORA_SIM_SERVICE";

/// qemu-hexagon starting a small ELF takes well under a second; allow for a
/// loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where to find the pieces.
#[derive(Clone, Debug)]
pub struct SimulatorConfig {
    /// The Hexagon service ELF (ci/sim-test.sh builds it).
    pub service: PathBuf,
    /// The emulator binary.
    pub qemu: PathBuf,
    /// Directory of the shared file (`/dev/shm`).
    pub shm_dir: PathBuf,
}

/// The simulator transport.
pub struct Simulator {
    config: SimulatorConfig,
    region: Region,
    path: PathBuf,
    _file: File,
    child: Option<Child>,
}

impl Simulator {
    /// Creates the shared file, maps it and starts the child.
    pub fn new(layout: Layout, config: SimulatorConfig) -> Result<Simulator> {
        if !config.service.is_file() {
            return Err(Error::Npu(format!(
                "the Hexagon service ELF {} does not exist: build it with ci/sim-test.sh (or set {SERVICE_ENV})",
                config.service.display()
            )));
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("hexlora-npu-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = config.shm_dir.join(name);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).map_err(|e| Error::io(&path, e))?;
        let region = Region::file(&file, &path, layout)?;
        let mut t = Simulator { config, region, path, _file: file, child: None };
        t.start()?;
        Ok(t)
    }

    fn start(&mut self) -> Result<()> {
        queue::init(&mut self.region)?;
        let child = Command::new(&self.config.qemu)
            .args(["-cpu", SIM_CPU])
            .arg(&self.config.service)
            .arg(&self.path)
            .arg(self.region.layout().total.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| Error::Npu(format!("cannot run {}: {e} (Debian package qemu-user)", self.config.qemu.display())))?;
        self.child = Some(child);
        let child = &mut self.child;
        queue::wait_ready(&mut self.region, START_TIMEOUT, &mut || exited(child))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The qemu child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The shared file.
    pub fn shm_path(&self) -> &Path {
        &self.path
    }
}

/// Why the qemu child ended, in words: qemu aborts (SIGABRT) on an
/// instruction it does not implement, which is not a crash of the firmware
/// (its panics exit 101).
fn exit_reason(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if status.signal() == Some(6) || status.code() == Some(134) {
        return format!("qemu-hexagon aborted ({status}): an instruction qemu does not implement (HVX float, user DMA), not a firmware crash");
    }
    if status.code() == Some(101) {
        return format!("the firmware panicked under qemu-hexagon ({status}; its message is on qemu's stderr)");
    }
    format!("qemu-hexagon exited ({status})")
}

fn exited(child: &mut Option<Child>) -> Option<String> {
    match child.as_mut().map(Child::try_wait) {
        Some(Ok(None)) => None,
        Some(Ok(Some(status))) => Some(exit_reason(status)),
        Some(Err(e)) => Some(format!("cannot query qemu-hexagon: {e}")),
        None => Some("no qemu-hexagon child".into()),
    }
}

impl Transport for Simulator {
    fn kind(&self) -> TransportKind {
        TransportKind::Simulator
    }

    fn region(&mut self) -> &mut Region {
        &mut self.region
    }

    fn post(&mut self, request: &[u8]) -> std::result::Result<(), Fault> {
        queue::post(&mut self.region, request)
    }

    fn wait(&mut self, timeout: Duration) -> std::result::Result<Vec<u8>, Fault> {
        let child = &mut self.child;
        queue::wait(&mut self.region, timeout, &mut || exited(child))
    }

    fn restart(&mut self) -> Result<()> {
        self.kill();
        self.start()
    }

    fn service_pid(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        queue::header(&mut self.region).stop();
        if let Some(c) = self.child.as_mut() {
            for _ in 0..200 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.kill();
        let _ = std::fs::remove_file(&self.path);
    }
}
