//! Speed of the LoRA branch (`lora::branch`) on SmolLM2-135M's seven
//! projections, 256 tokens, rank 16: best-of-30 milliseconds per call, no
//! assertions.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_lora_branch [-- NAME...]
//! ```
//! NAME is any of (default: all):
//! - `smollm2_shapes`: the branch's forward and backward next to the
//!   previous composition (four packed products through `ops::matmul`) in
//!   the same run;
//! - `smollm2_products`: its six products one at a time on the calling
//!   thread;
//! - `smollm2_fused_node`: the fused `proj+lora` node (bf16 frozen weight,
//!   the training default) against the bare projection node: the
//!   difference is what LoRA costs a training step, allocations and adds
//!   included.
use hexlora::autograd::Tape;
use hexlora::bench_support::{best_ms, cpu_name};
use hexlora::lora::branch::{backward, forward_into, transposed, Grads, Shapes};
use hexlora::ops::cpu_projection::Bf16Projection;
use hexlora::ops::matmul::{matmul, matmul_at, matmul_bt, matmul_unpacked};
use hexlora::projection::{Projection, ProjectionInfo, ProjectionKind};
use hexlora::tensor::Tensor;
use std::sync::Arc;
use std::time::Instant;

const NAMES: [&str; 3] = ["smollm2_shapes", "smollm2_products", "smollm2_fused_node"];

/// `(name, in, out)` of one layer's projections.
const SHAPES: [(&str, usize, usize); 7] =
    [("q", 576, 576), ("k", 576, 192), ("v", 576, 192), ("o", 576, 576), ("gate", 576, 1536), ("up", 576, 1536), ("down", 1536, 576)];
const TOKENS: usize = 256;
const RANK: usize = 16;
const ROUNDS: usize = 30;

fn main() {
    let names = hexlora::bench_support::selected(&NAMES);
    println!("cpu: {}", cpu_name());
    for name in &names {
        match name.as_str() {
            "smollm2_shapes" => smollm2_shapes(),
            "smollm2_products" => smollm2_products(),
            _ => smollm2_fused_node(),
        }
    }
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 - 0.5) * 0.2).collect()
}

/// The branch as it was: four packed products per pass.
fn old_forward(y: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, sh: Shapes) {
    matmul_bt(xa, x, a, (sh.tokens, sh.in_f, sh.rank), 1.0, false);
    matmul_bt(y, xa, b, (sh.tokens, sh.rank, sh.out_f), s, false);
}

#[allow(clippy::too_many_arguments)]
fn old_backward(g: &mut Grads, dxa: &mut [f32], dy: &[f32], x: &[f32], a: &[f32], b: &[f32], xa: &[f32], s: f32, sh: Shapes) {
    let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
    matmul_at(g.db.as_deref_mut().unwrap(), dy, xa, (out_f, t, r), s, false);
    matmul(dxa, dy, b, (t, out_f, r), s, false);
    matmul_at(g.da.as_deref_mut().unwrap(), dxa, x, (r, t, in_f), 1.0, false);
    matmul(g.dx.as_deref_mut().unwrap(), dxa, a, (t, r, in_f), 1.0, false);
}

fn best(f: impl FnMut()) -> f64 {
    best_ms(ROUNDS, f)
}

fn smollm2_shapes() {
    println!("{} threads, {TOKENS} tokens, rank {RANK}; ms per call, best of {ROUNDS}", rayon::current_num_threads());
    println!("{:>5} {:>9} {:>9} {:>9} {:>9} {:>7}", "proj", "fwd old", "fwd new", "bwd old", "bwd new", "GFLOP/s");
    let mut totals = [0.0; 4];
    for (name, in_f, out_f) in SHAPES {
        let sh = Shapes { tokens: TOKENS, in_f, rank: RANK, out_f };
        let (x, a, b, dy) = (values(TOKENS * in_f, 1), values(RANK * in_f, 2), values(out_f * RANK, 3), values(TOKENS * out_f, 4));
        let (mut y, mut xa, mut dxa) = (vec![0.0; TOKENS * out_f], vec![0.0; TOKENS * RANK], vec![0.0; TOKENS * RANK]);
        let mut g = Grads { dx: Some(vec![0.0; x.len()]), da: Some(vec![0.0; a.len()]), db: Some(vec![0.0; b.len()]) };
        let times = [
            best(|| old_forward(&mut y, &mut xa, &x, &a, &b, 2.0, sh)),
            best(|| forward_into(&mut y, &mut xa, &x, &a, &b, 2.0, None, sh)),
            best(|| old_backward(&mut g, &mut dxa, &dy, &x, &a, &b, &xa, 2.0, sh)),
            best(|| backward(&mut g, &dy, &x, &a, &b, &xa, 2.0, None, sh)),
        ];
        let flops = 2.0 * 3.0 * (TOKENS * RANK * (in_f + out_f)) as f64;
        println!(
            "{name:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7.1}",
            times[0],
            times[1],
            times[2],
            times[3],
            flops / (times[1] + times[3]) * 1e-6
        );
        totals.iter_mut().zip(times).for_each(|(t, v)| *t += v);
    }
    println!(
        "layer {:>9.3} {:>9.3} {:>9.3} {:>9.3}  (x30 layers: old {:.1} ms, new {:.1} ms per fwd+bwd)",
        totals[0],
        totals[1],
        totals[2],
        totals[3],
        30.0 * (totals[0] + totals[2]),
        30.0 * (totals[1] + totals[3])
    );
}

fn smollm2_products() {
    println!("calling thread, {TOKENS} tokens, rank {RANK}; ms per product (GFLOP/s), best of {ROUNDS}");
    println!("{:>5} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}", "proj", "xa=XA^T", "y=xaB^T", "dB=dY^Txa", "dxa=dYB", "dA=dxa^TX", "dX=dxaA");
    for (name, in_f, out_f) in SHAPES {
        let (t, r) = (TOKENS, RANK);
        let (x, a, b, dy) = (values(t * in_f, 1), values(r * in_f, 2), values(out_f * r, 3), values(t * out_f, 4));
        let (at, bt) = (transposed(&a, r, in_f), transposed(&b, out_f, r));
        let (mut y, mut xa, mut dxa) = (vec![0.0; t * out_f], vec![0.0; t * r], vec![0.0; t * r]);
        let (mut dx, mut da, mut db) = (vec![0.0; x.len()], vec![0.0; a.len()], vec![0.0; b.len()]);
        let cell = |ms: f64, macs: usize| format!("{ms:.3} ({:.0})", 2.0 * macs as f64 / ms * 1e-6);
        let cells = [
            cell(best(|| matmul_unpacked(&mut xa, &x, (in_f, 1), &at, (t, in_f, r), 1.0, false)), t * in_f * r),
            cell(best(|| matmul_unpacked(&mut y, &xa, (r, 1), &bt, (t, r, out_f), 2.0, false)), t * out_f * r),
            cell(best(|| matmul_unpacked(&mut db, &dy, (1, out_f), &xa, (out_f, t, r), 2.0, false)), t * out_f * r),
            cell(best(|| matmul_unpacked(&mut dxa, &dy, (out_f, 1), &b, (t, out_f, r), 2.0, false)), t * out_f * r),
            cell(best(|| matmul_unpacked(&mut da, &dxa, (1, r), &x, (r, t, in_f), 1.0, false)), t * in_f * r),
            cell(best(|| matmul_unpacked(&mut dx, &dxa, (r, 1), &a, (t, r, in_f), 1.0, false)), t * in_f * r),
        ];
        println!("{name:>5} {}", cells.map(|c| format!("{c:>14}")).join(" "));
    }
}

fn smollm2_fused_node() {
    println!("{} threads, {TOKENS} tokens, rank {RANK}; ms per node, best of {ROUNDS}", rayon::current_num_threads());
    println!("{:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "proj", "fwd bare", "fwd lora", "bwd bare", "bwd lora", "lora+");
    let mut extra = 0.0;
    for (name, in_f, out_f) in SHAPES {
        let info = ProjectionInfo { name: name.into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
        let proj: Arc<dyn Projection> = Arc::new(Bf16Projection::from_f32(info, &values(out_f * in_f, 5)).unwrap());
        let dy = Tensor::from_vec(&[TOKENS, out_f], values(TOKENS * out_f, 4)).unwrap();
        let (mut fwd, mut bwd) = ([f64::INFINITY; 2], [f64::INFINITY; 2]);
        for _ in 0..ROUNDS {
            for (lora, (fwd, bwd)) in [false, true].into_iter().zip(fwd.iter_mut().zip(bwd.iter_mut())) {
                let mut tape = Tape::new();
                let x = tape.param(Tensor::from_vec(&[TOKENS, in_f], values(TOKENS * in_f, 1)).unwrap());
                let a = tape.param(Tensor::from_vec(&[RANK, in_f], values(RANK * in_f, 2)).unwrap());
                let b = tape.param(Tensor::from_vec(&[out_f, RANK], values(out_f * RANK, 3)).unwrap());
                let t = Instant::now();
                let y = if lora { tape.projection_lora(x, &proj, a, b, 2.0, None).unwrap() } else { tape.projection(x, &proj).unwrap() };
                *fwd = fwd.min(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                tape.backward_with(y, dy.clone()).unwrap();
                *bwd = bwd.min(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!("{name:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", fwd[0], fwd[1], bwd[0], bwd[1], fwd[1] + bwd[1] - fwd[0] - bwd[0]);
        extra += fwd[1] + bwd[1] - fwd[0] - bwd[0];
    }
    println!("LoRA adds {extra:.3} ms per layer, {:.1} ms per 30 layers", 30.0 * extra);
}
