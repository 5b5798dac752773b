//! The roofline of decoding: how fast this machine reads memory with the
//! rayon pool (1 GiB summed as u64 words, best of 5 passes), and how fast
//! the decoding kernel reads a quantized weight too large for the caches
//! (Q4_1 rows of SmolLM2's width, ~180 MB, one token). Decoding reads every
//! weight once a token, so its speed is bounded by the first figure;
//! `ci/bench-generate.sh` prints both beside the measured tok/s.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_decode_roofline
//! ```
use hexlora::bench_support::{best_ms, cpu_name};
use hexlora::model::source::DType;
use hexlora::ops::quant_matvec::{matvec, Build, StoredRows};
use rayon::prelude::*;

fn main() {
    println!("cpu: {}, {} rayon threads", cpu_name(), rayon::current_num_threads());
    let words: Vec<u64> = (0..(1u64 << 27)).collect(); // 1 GiB
    let mut sink = 0u64;
    let ms = best_ms(5, &mut || {
        sink = sink.wrapping_add(words.par_chunks(1 << 16).map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w))).reduce(|| 0, u64::wrapping_add));
    });
    let bytes = (words.len() * 8) as f64;
    println!("memory read: {:.1} GB/s (1 GiB, best of 5; checksum {})", bytes / ms / 1e6, sink % 7);
    drop(words);

    let (rows, cols) = (1536 * 200, 576);
    let row_bytes = DType::Q4_1.bytes_for(cols).unwrap();
    let mut blocks = vec![0u8; rows * row_bytes];
    for (i, b) in blocks.iter_mut().enumerate() {
        *b = (i * 2654435761 >> 7) as u8;
    }
    for blk in blocks.chunks_exact_mut(20) {
        blk[..2].copy_from_slice(&0x2000u16.to_le_bytes()); // d = 2^-7 as f16
        blk[2..4].copy_from_slice(&0xa000u16.to_le_bytes()); // m = -2^-7
    }
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.01).sin()).collect();
    let mut y = vec![0.0f32; rows];
    let ms = best_ms(5, &mut || matvec(&mut y, &x, 1, StoredRows::Blocks(DType::Q4_1, &blocks), (rows, cols)));
    println!(
        "decoding kernel ({} lanes), Q4_1 {}x{} ({:.0} MB), one token: {:.1} GB/s of weights, {:.1} GFLOP/s",
        Build::detect().name(),
        rows,
        cols,
        blocks.len() as f64 / 1e6,
        blocks.len() as f64 / ms / 1e6,
        2.0 * (rows * cols) as f64 / ms / 1e6
    );
}
