//! A defmt message logged by firmware running under qemu-hexagon is decoded
//! on the host.
//!
//! Needs qemu-hexagon (toolchain/install.sh) and the simulator firmware ELF
//! (`HEXLORA_FIRMWARE_ELF`). ci/test.sh builds the ELF (as ci/sim-test.sh
//! does) after its workspace run and then runs this test with it set.
//! Without qemu-hexagon the test skips, a failure under CI; without the
//! ELF it skips, under CI too.
use hexlora::npu::firmware_log::{parse_ring_dump, FirmwareLog};
use std::path::PathBuf;
use std::process::Command;

use crate::support;

fn firmware_elf() -> Option<PathBuf> {
    if Command::new("qemu-hexagon").arg("--version").output().is_err() {
        support::skip("qemu-hexagon not found (Debian package qemu-user; toolchain/install.sh)");
        return None;
    }
    match std::env::var_os("HEXLORA_FIRMWARE_ELF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            support::skip_allowed_in_ci(
                "HEXLORA_FIRMWARE_ELF is not set",
                "ci/test.sh's workspace run comes before the ELF is built; its own run of this test sets it",
            );
            None
        }
    }
}

#[test]
fn firmware_defmt_message_is_decoded_on_the_host() {
    let Some(elf) = firmware_elf() else { return };
    // Only the defmt self-test: it logs "selftest log frame: {=u32} + {=u32}".
    let out = Command::new("qemu-hexagon")
        .args(["-cpu", hexlora::npu::transport::simulator::SIM_CPU])
        .arg(&elf)
        .args(["defmt_logger", "--dump-log"])
        .output()
        .expect("qemu-hexagon runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "firmware failed:\n{stdout}");
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");

    let ring = parse_ring_dump(&stdout).unwrap();
    let lines = FirmwareLog::from_elf(&elf).unwrap().decode(&ring).unwrap();
    for line in &lines {
        println!("firmware {}: {}", line.level.as_deref().unwrap_or("PRINT"), line.message);
    }
    assert!(
        lines.iter().any(|l| l.level.as_deref() == Some("INFO") && l.message == "selftest log frame: 40 + 2"),
        "decoded: {lines:?}"
    );
}

#[test]
fn log_bytes_from_another_build_are_an_error_not_a_panic() {
    let Some(elf) = firmware_elf() else { return };
    let log = FirmwareLog::from_elf(&elf).unwrap();
    // A frame naming string index 0x7fff, which this build does not have.
    let result = log.decode(&[0x03, 0xff, 0x7f, 0x00]);
    assert!(result.is_err(), "{result:?}");
}
