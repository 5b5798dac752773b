//! Speed of the SmolLM2-135M vocabulary head with its cross-entropy (tied
//! 49152 x 576 bf16, in 4096-, 2048- and 1024-wide slices) over 256 rows,
//! forward and backward, and of its slices' products alone; milliseconds,
//! best of 5, no assertions.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_head
//! ```
use hexlora::bench_support::{best_ms, cpu_name};
use hexlora::ops::cpu_projection::Bf16Projection;
use hexlora::ops::bf16_matmul::Bf16Matrix;
use hexlora::ops::cross_entropy::{head_forward_backward, VOCAB_SLICE};
use hexlora::projection::{Direction, Projection, ProjectionInfo, ProjectionKind};
use std::sync::Arc;

fn main() {
    let (vocab, hidden, rows) = (49152, 576, 256);
    let w: Vec<f32> = (0..vocab * hidden).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4).collect();
    let table = Arc::new(Bf16Matrix::from_f32(&w, vocab, hidden));
    let x: Vec<f32> = (0..rows * hidden).map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.05).collect();
    let tg: Vec<i64> = (0..rows).map(|r| (r * 193 % vocab) as i64).collect();
    let best = |f: &mut dyn FnMut()| best_ms(5, f);
    println!("cpu: {}, {} rayon threads", cpu_name(), rayon::current_num_threads());
    for width in [VOCAB_SLICE, 2048, 1024] {
        let head: Vec<Arc<dyn Projection>> = (0..vocab / width)
            .map(|i| {
                let info = ProjectionInfo { name: "lm_head".into(), kind: ProjectionKind::Mlp, out_features: width, in_features: hidden };
                Arc::new(Bf16Projection::window(info, table.clone(), i * width).unwrap()) as Arc<dyn Projection>
            })
            .collect();
        let whole = best(&mut || {
            head_forward_backward(&head, &x, rows, &tg, rows as f32, 256, true, None).unwrap();
        });
        let (mut lg, mut dx) = (vec![0f32; rows * width], vec![0f32; rows * hidden]);
        let products = best(&mut || {
            for s in &head {
                s.apply(Direction::Forward, &x, rows, &mut lg).unwrap();
                s.apply(Direction::InputGrad, &lg, rows, &mut dx).unwrap();
            }
        });
        println!("head {rows} rows, {width}-wide slices: forward+backward {whole:.1} ms, its {} + {} products alone {products:.1} ms", head.len(), head.len());
    }
}
