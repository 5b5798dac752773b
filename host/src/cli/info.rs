//! `hexlora info`: what this build is and which kernel runs each family of
//! products on this CPU (the same detection the products use).
use hexlora::ops::bf16_matmul::Kernel;
use hexlora::ops::matmul::unpacked_tiles_name;

/// Prints the version, target, CPU features seen and the kernels chosen.
pub fn run() -> anyhow::Result<()> {
    println!("hexlora {}", env!("CARGO_PKG_VERSION"));
    println!("target: {}-{}", std::env::consts::ARCH, std::env::consts::OS);
    println!("cpu features: {}", features().join(" "));
    println!("frozen products, bf16 weights: {}", Kernel::detect().name());
    println!("frozen products, f32 weights: {}", hexlora::ops::cpu_projection::f32_products_name());
    println!(
        "decoding's products (up to {} rows, straight from Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks or f32): {} lanes",
        hexlora::ops::cpu_projection::FEW_TOKENS,
        hexlora::ops::quant_matvec::Build::detect().name()
    );
    println!("LoRA branch and attention products: {} tiles", unpacked_tiles_name());
    println!("row kernels (exp, softmax, RMSNorm, RoPE, SwiGLU): {}", hexlora::ops::activation::SimdBuild::detect().name());
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
        check!("avx2", "fma", "f16c", "avx512f", "avx512bf16");
        // CPUID and the kernel's grant of the tile state (std's detection
        // of AMX is not stable)
        if hexlora::ops::bf16_matmul::amx_available() {
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
