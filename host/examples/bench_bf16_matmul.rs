//! Speed of the bf16 products on SmolLM2-135M's shapes, 256 tokens
//! (x86-64: the AMX and VDPBF16PS kernels beside the portable one). Prints
//! GFLOP/s and times, no assertions; each figure is the best of several
//! rounds (the machine is shared: the minimum is the least disturbed run).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_bf16_matmul [-- NAME...]
//! ```
//! NAME is any of (default: all):
//! - `smollm2_shapes`: forward and input gradient of each projection, each
//!   round cycling through enough copies of the weight that it is not in
//!   L2, as in a training step;
//! - `tile_loop_in_l1`: the AMX tile loop alone on one thread with both
//!   operands in L1, the ceiling;
//! - `forward_parts`: where one AMX forward's time goes (one thread);
//! - `avx2_tile_in_l1`: the AVX2 4x16 tile alone on one thread with both
//!   operands in L1, the ceiling of the portable kernel on CPUs without
//!   AMX (8 FMAs per step, so this is the FMA units' peak less the loop's
//!   overhead).
const NAMES: [&str; 4] = ["smollm2_shapes", "tile_loop_in_l1", "forward_parts", "avx2_tile_in_l1"];

fn main() {
    let names = hexlora::bench_support::selected(&NAMES);
    println!("cpu: {}", hexlora::bench_support::cpu_name());
    #[cfg(target_arch = "x86_64")]
    for name in &names {
        match name.as_str() {
            "smollm2_shapes" => x86::smollm2_shapes(),
            "tile_loop_in_l1" => x86::tile_loop_in_l1(),
            "forward_parts" => x86::forward_parts(),
            _ => x86::avx2_tile_in_l1(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("these benchmarks time the x86-64 kernels; nothing to run here ({})", names.join(" "));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use hexlora::ops::bf16_matmul::{amx_available, forward, input_grad, kernel_bench, Bf16Matrix, Kernel, Rows};
    use std::time::Instant;

    /// `(out, in)` of the projections: q/o, k/v, gate/up, down, and a
    /// 4096-row slice of the vocabulary head.
    const SHAPES: [(usize, usize); 5] = [(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 576)];
    const TOKENS: usize = 256;
    const ROUNDS: usize = 40;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Copies of an `n x k` weight, > 16 MB of them per round.
    fn weight_copies(n: usize, k: usize) -> Vec<Bf16Matrix> {
        (0..(16 << 20) / (2 * n * k) + 1).map(|c| Bf16Matrix::from_f32(&values(n * k, c as u32 + 1), n, k)).collect()
    }

    /// Fastest single product over `ROUNDS` rounds of one product per copy.
    fn best_seconds(copies: &[Bf16Matrix], mut run: impl FnMut(Rows<'_>)) -> f64 {
        let mut best = f64::INFINITY;
        for _ in 0..ROUNDS {
            for m in copies {
                let t = Instant::now();
                run(Rows { matrix: m, first: 0, len: m.rows() });
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        best
    }

    pub fn smollm2_shapes() {
        let kernel = Kernel::detect();
        println!("kernel {kernel:?}, {} rayon threads, {TOKENS} tokens", rayon::current_num_threads());
        // seconds per shape and direction
        let mut times = Vec::new();
        for &(n, k) in &SHAPES {
            let copies = weight_copies(n, k);
            let x = values(TOKENS * k, 99);
            let dy = values(TOKENS * n, 98);
            let (mut y, mut dx) = (vec![0f32; TOKENS * n], vec![0f32; TOKENS * k]);
            let flop = 2.0 * (TOKENS * n * k) as f64;
            let fwd = best_seconds(&copies, |w| forward(kernel, &mut y, &x, TOKENS, w));
            let bwd = best_seconds(&copies, |w| input_grad(kernel, &mut dx, &dy, TOKENS, w));
            times.push([fwd, bwd]);
            println!(
                "{TOKENS}x{k}->{n}: forward {:7.1} us {:6.0} GFLOP/s | input grad {:7.1} us {:6.0} GFLOP/s",
                fwd * 1e6,
                flop / fwd * 1e-9,
                bwd * 1e6,
                flop / bwd * 1e-9
            );
        }
        // one layer: q, k, v, o, gate, up, down (SHAPES order: q/o, k/v, gate/up, down)
        let layer = |d: usize| 2.0 * (times[0][d] + times[1][d] + times[2][d]) + times[3][d];
        println!("one layer (q k v o gate up down): forward {:.0} us, input grad {:.0} us", layer(0) * 1e6, layer(1) * 1e6);
    }

    /// Operands start on a 64-byte boundary (rows that cross cache lines load
    /// ~10x slower, which is why the kernel's buffers are aligned).
    pub fn tile_loop_in_l1() {
        if !amx_available() {
            return println!("tile_loop_in_l1: no AMX-BF16 on this CPU/OS");
        }
        for (kp, reps) in [(256, 20_000), (4096, 1250), (16384, 312)] {
            println!("kp {kp}: A and B {} KB each", 2 * 16 * kp * 2 / 1024);
            let (a_buf, p_buf) = (vec![0x3f80u16; 2 * 16 * kp + 32], vec![0x3f80u16; 2 * 16 * kp + 32]);
            let aligned = |b: &[u16]| b.as_ptr().align_offset(64).min(32);
            let (a, panel) = (&a_buf[aligned(&a_buf)..], &p_buf[aligned(&p_buf)..]);
            for (mode, what) in ["loads + products", "products only", "loads only"].iter().enumerate() {
                let best = hexlora::bench_support::best_ms(5, || kernel_bench::amx_tile_loop(a, panel, kp, reps, mode as u32)) * 1e-3;
                let flop = 2.0 * (32 * 32 * kp * reps) as f64;
                println!("tile loop, operands in L1, {what}: {:.0} GFLOP/s per thread ({:.1} ns per step of 4 loads / 4 products)", flop / best * 1e-9, best / (reps * kp / 32) as f64 * 1e9);
            }
        }
    }

    pub fn forward_parts() {
        if !amx_available() {
            return println!("forward_parts: no AMX-BF16 on this CPU/OS");
        }
        for &(n, k) in &SHAPES {
            let copies = weight_copies(n, k);
            let x = values(TOKENS * k, 99);
            let mut best = [f64::INFINITY; 3];
            for _ in 0..ROUNDS {
                for m in &copies {
                    let t = kernel_bench::amx_forward_parts(&x, TOKENS, m);
                    best.iter_mut().zip(t).for_each(|(b, t)| *b = b.min(t));
                }
            }
            println!("{TOKENS}x{k}->{n}: round {:.1} us, prep {:.1} us, whole forward {:.1} us", best[0] * 1e6, best[1] * 1e6, best[2] * 1e6);
        }
    }

    pub fn avx2_tile_in_l1() {
        let (k, reps) = (256, 20_000);
        let Some(mut tile) = kernel_bench::Avx2Tile::new(k) else {
            return println!("avx2_tile_in_l1: no AVX2+FMA on this CPU");
        };
        let best = hexlora::bench_support::best_ms(5, || tile.run(reps)) * 1e-3;
        let flop = 2.0 * (64 * k * reps) as f64;
        println!("AVX2 4x16 tile, operands in L1: {:.1} GFLOP/s per thread", flop / best * 1e-9);
    }
}
