//! `hexlora info`: what this build is and which kernel runs each family of
//! products on this CPU (the same detection the products use).
use crate::ops::bf16_matmul::Kernel;
use crate::ops::matmul::unpacked_tiles_name;

/// Prints the version, target, CPU features seen and the kernels chosen.
pub fn run() -> anyhow::Result<()> {
    println!("hexlora {}", env!("CARGO_PKG_VERSION"));
    println!("target: {}-{}", std::env::consts::ARCH, std::env::consts::OS);
    println!("cpu features: {}", features().join(" "));
    println!("frozen products, bf16 weights: {}", Kernel::detect().name());
    println!("frozen products, f32 weights: {}", f32_frozen());
    println!("LoRA branch and attention products: {} tiles", unpacked_tiles_name());
    println!("row kernels (exp, softmax, RMSNorm, RoPE, SwiGLU): {}", row_kernels());
    Ok(())
}

/// The features the kernels choose by, those this CPU has.
fn features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut seen = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($f:tt),*) => { $(if std::arch::is_x86_feature_detected!($f) { seen.push($f); })* };
        }
        check!("avx2", "fma", "avx512f", "avx512bf16");
        // CPUID and the kernel's grant of the tile state (std's detection
        // of AMX is not stable)
        if crate::ops::bf16_matmul::amx_available() {
            seen.push("amx-bf16");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! check {
            ($($f:tt),*) => { $(if std::arch::is_aarch64_feature_detected!($f) { seen.push($f); })* };
        }
        check!("neon", "fp16", "dotprod", "bf16", "i8mm", "sve", "sve2");
    }
    if seen.is_empty() {
        seen.push("(none the kernels use)");
    }
    seen
}

/// f32 frozen weights: `matrixmultiply` for many rows and `gemm` for few,
/// each with its own SIMD dispatch, except the packed AVX2 tiles on x86
/// without AVX-512 (`model::cpu_projection`).
fn f32_frozen() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("avx512f") && crate::ops::matmul::has_avx2_fma() {
        return "avx2-fma packed tiles (16+ rows), gemm (fewer)";
    }
    "matrixmultiply (16+ rows), gemm (fewer), their own SIMD dispatch"
}

/// The widest build of the `simd_fn!` row kernels this CPU runs.
fn row_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return "avx2";
        }
    }
    #[cfg(target_arch = "aarch64")]
    return "neon (the aarch64 base target)";
    #[allow(unreachable_code)]
    "portable"
}
