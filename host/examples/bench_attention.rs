//! Speed of attention and SwiGLU on SmolLM2-135M's shapes (one layer, 256
//! tokens, 9 heads over 3, head_dim 64): forward and backward, with the
//! f32 and the bf16 products, best of 50 runs; no assertions. The kernels
//! before blocking and the vector exp (commit c1f5ecf) measured 3.25 / 4.04
//! ms (attention fwd / bwd) and 1.09 / 1.29 ms (SwiGLU) against 0.71 / 1.61
//! and 0.19 / 0.23 ms in one run, 2 threads, loaded machine (commit
//! 49d46cc..c5984a2).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_attention
//! ```
use hexlora::bench_support::{best_ms, cpu_name};
use hexlora::ops::attention::{attention_backward_with, attention_forward_with, AttnDims, BackwardInputs, Products};
use hexlora::ops::swiglu::{swiglu_backward, swiglu_forward};

fn main() {
    hexlora::runtime::allocator::keep_freed_memory();
    let d = AttnDims { q_len: 256, kv_len: 256, n_head: 9, n_kv_head: 3, head_dim: 64, causal: true };
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<f32>>();
    let (q, k, v, dout) = (wave(256 * 576, 0.61), wave(256 * 192, 0.23), wave(256 * 192, 0.11), wave(256 * 576, 0.37));
    let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; 256 * 9]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let scale = 0.125;
    println!("cpu: {}", cpu_name());
    println!("threads {}", rayon::current_num_threads());
    let reps = 50;
    for products in [Products::F32, Products::Bf16] {
        let new_f = best_ms(reps, || attention_forward_with(products, &mut out, &mut lse, &q, &k, &v, d, scale));
        let new_b = best_ms(reps, || attention_backward_with(products, (&mut dq, &mut dk, &mut dv), BackwardInputs { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse, d, scale, window: None }));
        println!("attention ({products:?}) 256 tok  fwd {new_f:.3} ms  bwd {new_b:.3} ms");
        println!("  x30 layers fwd+bwd: {:.1} ms", 30.0 * (new_f + new_b));
    }

    let n = 256 * 1536;
    let (gate, up, dy) = (wave(n, 0.013).iter().map(|x| x * 6.0).collect::<Vec<_>>(), wave(n, 0.07), wave(n, 0.03));
    let (mut y, mut dg, mut du) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let new_f = best_ms(reps, || swiglu_forward(&mut y, &gate, &up));
    let new_b = best_ms(reps, || swiglu_backward(&mut dg, &mut du, &dy, &gate, &up));
    println!("swiglu 256x1536    fwd {new_f:.3} ms  bwd {new_b:.3} ms");
    println!("  x30 layers fwd+bwd: {:.1} ms", 30.0 * (new_f + new_b));
}
