//! Hexagon builds: point the linker at linker/ and check that the generation
//! feature matches the `-C target-cpu` the build was started with.
use std::env;
use std::path::PathBuf;

/// (cargo feature, HVX target feature its build must enable).
const GENERATIONS: [(&str, &str); 5] =
    [("sim", "hvxv66"), ("v68", "hvxv68"), ("v73", "hvxv73"), ("v75", "hvxv75"), ("v79", "hvxv79")];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../linker");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("hexagon") {
        return;
    }
    let linker_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../linker");
    println!("cargo:rustc-link-search={}", linker_dir.display());
    println!("cargo:rustc-link-arg-bins=-Thexagon-sim.x");
    println!("cargo:rustc-link-arg-bins=-znorelro");
    let target_features = env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| target_features.split(',').any(|t| t == f);
    for (feature, cpu_feature) in GENERATIONS {
        let enabled = env::var(format!("CARGO_FEATURE_{}", feature.to_uppercase())).is_ok();
        if enabled && !has(cpu_feature) {
            panic!(
                "feature `{feature}` needs RUSTFLAGS with `-C target-feature=+{cpu_feature}`; \
                 use ci/sim-test.sh or ci/build-skel.sh, which set it"
            );
        }
    }
}
