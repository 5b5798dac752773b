//! The FastRPC transport end to end, off a phone: `hexlora grad --device
//! dsp-fastrpc` through `dsp/fastrpc-standin` (a native libcdsprpc.so
//! stand-in serving the skel built with the device's HAP paths, named by
//! `HEXLORA_FASTRPC_LIB`; `ci/fastrpc-standin.sh` builds it) gives the same
//! bits as `--device dsp` (the firmware crate in-process) on the Llama and
//! Qwen3.5 fixtures: rpcmem + fastrpc_mmap + the skel's map method, the
//! remote_arg layout of every call and the skel's exported entry points all
//! line up. What only a phone checks is listed in that crate's docs.
use std::path::{Path, PathBuf};

use crate::support;

/// The stand-in library, or None (skipped; a failure under CI, where
/// ci/test.sh sets it).
fn standin() -> Option<PathBuf> {
    let why = match std::env::var_os("HEXLORA_FASTRPC_LIB").map(PathBuf::from) {
        None => "HEXLORA_FASTRPC_LIB is not set".to_string(),
        Some(p) if !p.is_file() => format!("HEXLORA_FASTRPC_LIB={} does not exist", p.display()),
        Some(p) => return Some(p),
    };
    support::skip(&format!("{why} (ci/test.sh builds the stand-in with ci/fastrpc-standin.sh and sets it)"));
    None
}

fn grad(arch: &str, backend: &str, precision: &str, out_dir: &Path) -> Vec<u8> {
    let out = out_dir.join(format!("{arch}-{backend}-{precision}.safetensors"));
    let run = support::grad_command(arch, &out).args(["--device", backend, "--precision", precision]).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "hexlora grad --device {backend} on {arch} failed:\n{text}");
    if precision == "f16" {
        // FP16 holds every shape (Q8_0 refuses the fixtures' widths 48 and
        // 80, which the router then keeps on the CPU on both transports).
        assert!(text.contains(", 0 on the CPU"), "{arch} {backend}: not every projection was resident:\n{text}");
    }
    std::fs::read(&out).unwrap()
}

fn check(arch: &str) {
    if standin().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for precision in ["f16", "default"] {
        let dsp = grad(arch, "dsp", precision, tmp.path());
        let fastrpc = grad(arch, "dsp-fastrpc", precision, tmp.path());
        assert!(dsp == fastrpc, "{arch} {precision}: dsp-fastrpc differs from dsp");
    }
}

#[test]
fn llama_fastrpc_gradients_equal_in_process_bit_for_bit() {
    check("llama");
}

#[test]
fn qwen35_fastrpc_gradients_equal_in_process_bit_for_bit() {
    check("qwen35");
}

/// Without the library the transport says so and names it.
#[test]
fn missing_fastrpc_library_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let run = support::grad_command("llama", &tmp.path().join("out.safetensors"))
        .args(["--device", "dsp-fastrpc"])
        .env("HEXLORA_FASTRPC_LIB", tmp.path().join("libcdsprpc.so"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(err.contains("libcdsprpc.so") && err.contains("cannot load"), "{err}");
}
