//! Build-time settings of the firmware crate:
//! - Hexagon builds: point the linker at linker/ and check that the
//!   generation feature matches the HVX target feature of the build;
//! - `HEXLORA_H_BINDINGS` (set by ci/bindgen-check.sh): the bindgen output
//!   of dsp/include/hexlora.h, checked against the Rust ABI by a test;
//! - feature `sdk`: bindings over the Hexagon SDK headers, which needs
//!   `HEXAGON_SDK_ROOT`.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (cargo feature, HVX target feature its build must enable).
const GENERATIONS: [(&str, &str); 5] =
    [("sim", "hvxv73"), ("v68", "hvxv68"), ("v73", "hvxv73"), ("v75", "hvxv75"), ("v79", "hvxv79")];

/// SDK headers the `sdk` feature binds.
const SDK_HEADERS: [&str; 4] = ["remote.h", "rpcmem.h", "dspqueue.h", "HAP_compute_res.h"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../linker");
    println!("cargo:rustc-check-cfg=cfg(hexlora_h_bindings)");
    println!("cargo:rustc-check-cfg=cfg(hexlora_hap)");
    // The HAP runtime calls are external symbols on a device skel, and
    // natively with feature `hap` (the FastRPC stand-in defines them).
    let hexagon = env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("hexagon");
    let feature = |f: &str| env::var(format!("CARGO_FEATURE_{f}")).is_ok();
    if (hexagon && !feature("SIM")) || feature("HAP") {
        println!("cargo:rustc-cfg=hexlora_hap");
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    c_header_bindings(&out_dir);
    if env::var("CARGO_FEATURE_SDK").is_ok() {
        sdk_bindings(&out_dir);
    }
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("hexagon") {
        hexagon_link_and_generation();
    }
}

fn hexagon_link_and_generation() {
    let linker_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../linker");
    println!("cargo:rustc-link-search={}", linker_dir.display());
    println!("cargo:rustc-link-arg-bins=-Thexagon-sim.x");
    println!("cargo:rustc-link-arg-bins=-znorelro");
    let target_features = env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| target_features.split(',').any(|t| t == f);
    for (feature, hvx) in GENERATIONS {
        let enabled = env::var(format!("CARGO_FEATURE_{}", feature.to_uppercase())).is_ok();
        if enabled && !has(hvx) {
            panic!(
                "feature `{feature}` needs RUSTFLAGS with `-C target-feature=+{hvx}`; \
                 use ci/sim-test.sh or ci/build-skel.sh, which set it"
            );
        }
    }
}

fn c_header_bindings(out_dir: &Path) {
    println!("cargo:rerun-if-env-changed=HEXLORA_H_BINDINGS");
    if let Some(path) = env::var_os("HEXLORA_H_BINDINGS") {
        println!("cargo:rerun-if-changed={}", Path::new(&path).display());
        std::fs::copy(&path, out_dir.join("hexlora_h.rs"))
            .unwrap_or_else(|e| panic!("HEXLORA_H_BINDINGS={}: {e}", Path::new(&path).display()));
        println!("cargo:rustc-cfg=hexlora_h_bindings");
    }
}

fn sdk_bindings(out_dir: &Path) {
    println!("cargo:rerun-if-env-changed=HEXAGON_SDK_ROOT");
    let Some(root) = env::var_os("HEXAGON_SDK_ROOT").map(PathBuf::from) else {
        panic!(
            "feature `sdk` binds the Hexagon SDK headers ({}), but HEXAGON_SDK_ROOT is not set. \
             The Hexagon SDK is not installed on this machine; build without `--features sdk`, \
             or set HEXAGON_SDK_ROOT to an SDK installation.",
            SDK_HEADERS.join(", ")
        );
    };
    let wrapper = out_dir.join("sdk_headers.h");
    let includes: String = SDK_HEADERS.iter().map(|h| format!("#include \"{h}\"\n")).collect();
    std::fs::write(&wrapper, includes).unwrap();
    let inc = ["incs", "incs/stddef", "ipc/fastrpc/rpcmem/inc", "ipc/fastrpc/remote/ship/android_aarch64"];
    let status = Command::new("bindgen")
        .arg(&wrapper)
        .arg("-o")
        .arg(out_dir.join("sdk.rs"))
        .args(["--use-core", "--no-layout-tests", "--"])
        .args(inc.iter().map(|d| format!("-I{}", root.join(d).display())))
        .status()
        .unwrap_or_else(|e| panic!("feature `sdk`: cannot run bindgen ({e}); run toolchain/install.sh"));
    assert!(status.success(), "feature `sdk`: bindgen failed on the SDK headers under {}", root.display());
}
