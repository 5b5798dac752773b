//! Benchmark (not a test): what the projection kernels cost on the
//! projection shapes of Qwen3.5-4B, Qwen3-4B and Llama-3.2-3B.
//!
//! Part 1, the model: for every projection, direction and token bucket
//! (128..4096) with 8 MiB of VTCM: VTCM bytes used, W window size and count,
//! whether the tokens stay resident or are re-streamed per window, DMA bytes
//! per direction (W exactly once, the input once or once per window, the
//! output once), tile products, and modelled time at 4.65 TFLOPS of HMX FP16
//! and an assumed DDR bandwidth.
//!
//! Part 1b, the HVX float tile engine modelled (never measured: no device
//! here): packets per tile product from the engine's instruction schedule
//! (`hexlora_dsp::tile::hvx_float::schedule`) under a stated packing
//! assumption, GFLOP/s per HVX context at assumed clocks, and the layer
//! totals of Part 1 recomputed with that rate beside HMX's.
//!
//! Part 2, measured: throughput of the real kernels (software DMA and tile
//! engines) on this machine, with the W and input bytes their DMA engine
//! actually moved, tokens resident (8 MiB) and re-streamed (small VTCM).
//!
//! Run: `cargo run --release -p hexlora-dsp --example kernel_plan`
//! (`-- --quick` skips part 2).
use hexlora_dsp::kernels::testbed::{fp16_weight, q8_weight, Bench, Rng};
use hexlora_dsp::kernels::{Direction, Plan, Precision, ResidentWeight};
use hexlora_dsp::vtcm::DEFAULT_VTCM_BYTES;
use std::time::Instant;

/// HMX FP16 throughput measured on Snapdragon 8 Elite (mission, "P1").
const HMX_TFLOPS: f64 = 4.65;
/// Assumed DDR bandwidth available to the NPU's DMA (LPDDR5X phones peak
/// near 77-85 GB/s; we take a conservative sustained figure).
const DDR_GBPS: f64 = 60.0;
const BUCKETS: [usize; 6] = [128, 256, 512, 1024, 2048, 4096];

struct Proj {
    name: &'static str,
    rows: usize,
    cols: usize,
    precision: Precision,
}

const fn p(name: &'static str, rows: usize, cols: usize, precision: Precision) -> Proj {
    Proj { name, rows, cols, precision }
}

use Precision::{Fp16, Q8_0};

/// Per-layer projections, `W (rows = out, cols = in)`. Precision policy from
/// the mission: recurrent (Gated DeltaNet) FP16, attention and MLP Q8_0.
fn models() -> Vec<(&'static str, Vec<Proj>)> {
    vec![
        (
            // hidden 2560, MLP 9216; gated attention 16 q heads x 256 (q_proj
            // emits query and gate), 4 kv heads; GDN 16 key / 32 value heads
            // x 128. Taken from the Qwen3.5 config defaults: check against the
            // model's config.json before relying on them.
            "Qwen3.5-4B",
            vec![
                p("attn.q_proj(+gate)", 8192, 2560, Q8_0),
                p("attn.k_proj", 1024, 2560, Q8_0),
                p("attn.v_proj", 1024, 2560, Q8_0),
                p("attn.o_proj", 2560, 4096, Q8_0),
                p("gdn.in_proj_qkv", 8192, 2560, Fp16),
                p("gdn.in_proj_z", 4096, 2560, Fp16),
                p("gdn.in_proj_b", 32, 2560, Fp16),
                p("gdn.in_proj_a", 32, 2560, Fp16),
                p("gdn.out_proj", 2560, 4096, Fp16),
                p("mlp.gate_proj", 9216, 2560, Q8_0),
                p("mlp.up_proj", 9216, 2560, Q8_0),
                p("mlp.down_proj", 2560, 9216, Q8_0),
            ],
        ),
        (
            "Qwen3-4B",
            vec![
                p("attn.q_proj", 4096, 2560, Q8_0),
                p("attn.k_proj", 1024, 2560, Q8_0),
                p("attn.v_proj", 1024, 2560, Q8_0),
                p("attn.o_proj", 2560, 4096, Q8_0),
                p("mlp.gate_proj", 9728, 2560, Q8_0),
                p("mlp.up_proj", 9728, 2560, Q8_0),
                p("mlp.down_proj", 2560, 9728, Q8_0),
            ],
        ),
        (
            "Llama-3.2-3B",
            vec![
                p("attn.q_proj", 3072, 3072, Q8_0),
                p("attn.k_proj", 1024, 3072, Q8_0),
                p("attn.v_proj", 1024, 3072, Q8_0),
                p("attn.o_proj", 3072, 3072, Q8_0),
                p("mlp.gate_proj", 8192, 3072, Q8_0),
                p("mlp.up_proj", 8192, 3072, Q8_0),
                p("mlp.down_proj", 3072, 8192, Q8_0),
            ],
        ),
    ]
}

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn dir_name(dir: Direction) -> &'static str {
    if dir == Direction::Forward {
        "fwd"
    } else {
        "igrad"
    }
}

fn plan_table() {
    println!("# Part 1: modelled cost, VTCM {} MiB, HMX {HMX_TFLOPS} TFLOPS FP16, DDR {DDR_GBPS} GB/s (assumed)", DEFAULT_VTCM_BYTES >> 20);
    println!("# W windows stream in the outer loop: W_reads = W bytes DMA'd / W bytes = 1 per direction.");
    println!("# tokens: `res` = resident in VTCM (input DMA'd once), `str` = re-streamed once per window.");
    println!("# time = max(compute, dma) (double-buffered).");
    println!(
        "{:<13} {:<19} {:<4} {:<5} {:>5} {:>8} {:>7} {:>4} {:>3} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "model", "projection", "prec", "dir", "T", "VTCM_KiB", "win_KiB", "wins", "tok", "W_reads", "W_MiB", "in_MiB", "out_MiB", "tiles", "hmx_ms", "dma_ms", "model_ms"
    );
    let mut max_reads = 0.0f64;
    for (model, projs) in models() {
        let mut totals = vec![(0.0f64, 0.0f64); BUCKETS.len()];
        for proj in &projs {
            for (bi, &t) in BUCKETS.iter().enumerate() {
                for dir in [Direction::Forward, Direction::InputGrad] {
                    let plan = match Plan::new(proj.precision, dir, proj.rows, proj.cols, t, DEFAULT_VTCM_BYTES) {
                        Ok(plan) => plan,
                        Err(e) => {
                            println!("{model:<13} {:<19} {t:>5} {dir:?}: {e:?}", proj.name);
                            continue;
                        }
                    };
                    let (hmx, dma) = plan.modelled_seconds(HMX_TFLOPS, DDR_GBPS);
                    let time = hmx.max(dma);
                    totals[bi].0 += time;
                    totals[bi].1 += plan.flops();
                    let w_reads = plan.weight_dma_bytes() as f64 / plan.weight_bytes() as f64;
                    max_reads = max_reads.max(w_reads);
                    println!(
                        "{model:<13} {:<19} {:<4} {:<5} {t:>5} {:>8.0} {:>7.0} {:>4} {:>3} {:>7.2} {:>8.2} {:>8.2} {:>8.2} {:>8} {:>8.3} {:>8.3} {:>8.3}",
                        proj.name,
                        if proj.precision == Fp16 { "fp16" } else { "q8_0" },
                        dir_name(dir),
                        plan.vtcm_bytes() as f64 / 1024.0,
                        plan.window_bytes() as f64 / 1024.0,
                        plan.windows,
                        if plan.tokens_resident { "res" } else { "str" },
                        w_reads,
                        mib(plan.weight_dma_bytes()),
                        mib(plan.dma_input_bytes()),
                        mib(plan.dma_out_bytes()),
                        plan.tile_products(),
                        hmx * 1e3,
                        dma * 1e3,
                        time * 1e3,
                    );
                }
            }
        }
        for (bi, &t) in BUCKETS.iter().enumerate() {
            let (time, flops) = totals[bi];
            println!(
                "# {model}: one layer, all projections, fwd + input-grad, T={t}: {:.2} ms modelled, {:.2} effective TFLOPS",
                time * 1e3,
                flops / time / 1e12
            );
        }
    }
    println!("# largest W_reads over all shapes and buckets: {max_reads:.2}");
    println!("# Note: where tokens are re-streamed (`str`), the f32 input crosses DMA once per window; for");
    println!("# wide reductions at large T (e.g. d=9728, T=4096) that traffic exceeds W's and DMA nears compute.");
}

/// Assumed cDSP clocks for the HVX model (not a measured or documented
/// figure for any one phone: Hexagon NPUs run around 1 GHz, give or take).
const HVX_CLOCKS_GHZ: [f64; 2] = [1.0, 1.5];
/// Assumed HVX contexts working in parallel (one per hardware thread that
/// holds an HVX unit; the number varies by chip and is not checked here).
const HVX_CONTEXTS: f64 = 4.0;

/// Packets per tile product under the packing assumption: each packet holds
/// at most two multiply-resource units (a `vmpyacc` of class CVI_VX_DV takes
/// both; a `vsplat`, class CVI_VX_LATE, and a `vadd`, CVI_VX, one each, per
/// their classes in hexagon_protos.h), one vector load and one vector store;
/// scalar loads of the activation pairs and loop control ride in slots 0/1,
/// and a software-pipelined loop reaches the resource bound. Returns
/// (packets, description of the binding resource).
fn hvx_packets_per_tile() -> (f64, &'static str) {
    use hexlora_dsp::tile::hvx_float::schedule as s;
    let mpy_units = (2 * s::VMPYACCS + s::SPLATS + s::VADDS) as f64;
    let loads = (s::WEIGHT_LOADS + s::ACC_LOADS) as f64;
    let stores = s::ACC_STORES as f64;
    let packets = (mpy_units / 2.0).max(loads).max(stores);
    (packets, if packets == mpy_units / 2.0 { "the two multiply units" } else { "vector loads/stores" })
}

fn hvx_float_model() {
    use hexlora_dsp::tile::hvx_float::schedule as s;
    let (packets, bound) = hvx_packets_per_tile();
    let flops = s::FLOPS as f64;
    println!("\n# Part 1b: HVX float tile engine, MODELLED (no device here; nothing below is measured)");
    println!(
        "# schedule per 32x32x32 tile: {} vmpyacc (Vxx.sf+=vmpy(Vu.hf,Vv.hf)), {} vsplat, {} vadd.sf, {} + {} vector loads, {} stores",
        s::VMPYACCS, s::SPLATS, s::VADDS, s::WEIGHT_LOADS, s::ACC_LOADS, s::ACC_STORES
    );
    println!("# packing assumption: <= 2 multiply-resource units (vmpyacc = 2, vsplat = 1, vadd = 1), 1 vector load, 1 store per packet;");
    println!("# one packet per cycle per HVX context (an upper bound), clocks assumed {HVX_CLOCKS_GHZ:?} GHz, {HVX_CONTEXTS} contexts assumed");
    println!("# packets per tile: {packets:.0} (bound by {bound}); {:.1} FLOP per packet (vmpyacc alone: 128)", flops / packets);
    println!("# (the compiled v73 loop, counted statically by ci/hvx-float-check.sh, may hold more packets than this bound)");
    for ghz in HVX_CLOCKS_GHZ {
        let per_context = flops / packets * ghz;
        println!(
            "# at {ghz:.1} GHz: {per_context:.1} GFLOP/s per HVX context, {:.2} TFLOPS on {HVX_CONTEXTS} contexts (HMX: {HMX_TFLOPS} TFLOPS)",
            per_context * HVX_CONTEXTS / 1e3
        );
    }
    let ghz = HVX_CLOCKS_GHZ[0];
    let hvx_tflops = flops / packets * ghz * HVX_CONTEXTS / 1e3;
    println!("# one layer, all projections, fwd + input-grad, modelled ms: HMX vs HVX float ({ghz:.1} GHz, {HVX_CONTEXTS} contexts), time = max(compute, dma)");
    println!("{:<13} {:>5} {:>9} {:>9} {:>6}", "model", "T", "hmx_ms", "hvx_ms", "ratio");
    for (model, projs) in models() {
        for &t in &BUCKETS {
            let (mut hmx_total, mut hvx_total) = (0.0f64, 0.0f64);
            for proj in &projs {
                for dir in [Direction::Forward, Direction::InputGrad] {
                    let Ok(plan) = Plan::new(proj.precision, dir, proj.rows, proj.cols, t, DEFAULT_VTCM_BYTES) else { continue };
                    let (hmx, dma) = plan.modelled_seconds(HMX_TFLOPS, DDR_GBPS);
                    let (hvx, _) = plan.modelled_seconds(hvx_tflops, DDR_GBPS);
                    hmx_total += hmx.max(dma);
                    hvx_total += hvx.max(dma);
                }
            }
            println!("{model:<13} {t:>5} {:>9.2} {:>9.2} {:>6.1}", hmx_total * 1e3, hvx_total * 1e3, hvx_total / hmx_total);
        }
    }
}

fn measure() {
    println!("\n# Part 2: measured on this machine (software DMA + software tile engine, one core)");
    println!("# W_reads and in_passes are the bytes the software DMA engine moved, divided by W / input bytes.");
    println!(
        "{:<26} {:<4} {:<5} {:>5} {:>9} {:>5} {:>9} {:>10} {:>7} {:>9} {:>7}",
        "shape (rows x cols)", "prec", "dir", "T", "VTCM_KiB", "tok", "seconds", "GFLOP/s", "W_reads", "in_passes", "retried"
    );
    let (rows, cols, t) = (4096, 2560, 128); // Qwen3-4B q_proj
    let mut rng = Rng(1);
    let w16 = fp16_weight(&mut rng, rows, cols, 0.05);
    let wq = q8_weight(&mut rng, rows, cols, 0.05);
    // 8 MiB keeps 128 tokens resident; 1 MiB cannot hold all four token
    // blocks next to a window, so the tokens are re-streamed for every window.
    for vtcm in [DEFAULT_VTCM_BYTES, 1 << 20] {
        let mut bench = Bench::new(vtcm);
        for (name, w, w_bytes) in [
            ("fp16", ResidentWeight::fp16(&w16, rows, cols).unwrap(), w16.len() * 2),
            ("q8_0", ResidentWeight::q8_0(&wq, rows, cols).unwrap(), wq.len()),
        ] {
            for dir in [Direction::Forward, Direction::InputGrad] {
                let d = if dir == Direction::Forward { cols } else { rows };
                let plan = Plan::new(w.precision(), dir, rows, cols, t, vtcm).unwrap();
                let x = Rng(2).vec(t * d, 1.0);
                let start = Instant::now();
                let (_, stats) = bench.run(&w, dir, t, &x).unwrap();
                let secs = start.elapsed().as_secs_f64();
                let flops = 2.0 * (t * rows * cols) as f64;
                println!(
                    "{:<26} {name:<4} {:<5} {t:>5} {:>9} {:>5} {secs:>9.3} {:>10.2} {:>7.2} {:>9.2} {:>7}",
                    format!("Qwen3-4B q_proj {rows}x{cols}"),
                    dir_name(dir),
                    vtcm >> 10,
                    if plan.tokens_resident { "res" } else { "str" },
                    flops / secs / 1e9,
                    stats.dma_weight_bytes as f64 / w_bytes as f64,
                    stats.dma_input_bytes as f64 / (t * d * 4) as f64,
                    stats.rows_retried
                );
            }
        }
    }
}

fn main() {
    plan_table();
    hvx_float_model();
    if !std::env::args().any(|a| a == "--quick") {
        measure();
    }
}
