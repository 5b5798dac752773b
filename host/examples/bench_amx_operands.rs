//! Speed of the AMX operand pieces attention's bf16 products use
//! (`ops::bf16_matmul::operands`) on SmolLM2-135M's attention shapes (256
//! tokens, head_dim 64), one thread: packing each operand, then the two
//! products; microseconds, best of 200, no assertions. x86-64 with AMX-BF16
//! and AVX512-BF16 only.
//!
//! ```text
//! cargo run --release -p hexlora --example bench_amx_operands
//! ```
fn main() {
    println!("cpu: {}", hexlora::bench_support::cpu_name());
    #[cfg(target_arch = "x86_64")]
    x86::attention_shapes();
    #[cfg(not(target_arch = "x86_64"))]
    println!("the AMX operands are x86-64 only: nothing to run here");
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use hexlora::bench_support::best_ms;
    use hexlora::ops::bf16_matmul::operands::{available, product, ARows, BPanels, Lines};

    pub fn attention_shapes() {
        if !available() {
            return println!("no AMX-BF16 with AVX512-BF16 on this CPU/OS: nothing to run");
        }
        hexlora::runtime::allocator::keep_freed_memory();
        let wave = |n: usize| (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<f32>>();
        let (q, k, p) = (wave(256 * 576), wave(256 * 192), wave(64 * 256));
        let us = |f: &mut dyn FnMut()| best_ms(200, f) * 1e3;
        println!("q as A (256x64): {:.1} us", us(&mut || drop(ARows::from_rows(&q, (256, 64), 576))));
        println!("p^T as A (256x64): {:.1} us", us(&mut || drop(ARows::from_transposed(&p, (256, 64), 256))));
        println!("k^T as B (64x256): {:.1} us", us(&mut || drop(BPanels::from_transposed(&k, (256, 64), 192))));
        println!("k as B (256x64): {:.1} us", us(&mut || drop(BPanels::from_rows(&k, (256, 64), 192))));
        let (q_a, k_t, k_n, p_a) = (ARows::from_rows(&q, (256, 64), 576), BPanels::from_transposed(&k, (256, 64), 192), BPanels::from_rows(&k, (256, 64), 192), ARows::from_rows(&p, (64, 256), 256));
        let mut out_lines = Lines::zeros(64 * 256);
        let out = out_lines.as_mut_slice();
        let flop = 2.0 * 64.0 * 64.0 * 256.0;
        // SAFETY: `out` is 64 x 256.
        let s = us(&mut || unsafe { product((&q_a, 0, 0), (&k_t, 0, 0), (64, 256, 2), out.as_mut_ptr(), 256, 1.0) });
        println!("q k^T, 64x64 by 64x256: {s:.1} us ({:.0} GFLOP/s)", flop / s * 1e-3);
        // SAFETY: as above; the product writes 64 x 64 of it.
        let s = us(&mut || unsafe { product((&p_a, 0, 0), (&k_n, 0, 0), (64, 64, 8), out.as_mut_ptr(), 64, 1.0) });
        println!("p v, 64x256 by 256x64: {s:.1} us ({:.0} GFLOP/s)", flop / s * 1e-3);
    }
}
