//! Gradients of the tape checked against central finite differences of an
//! independent f64 implementation of the same function.
use super::{SegmentFn, Tape, Var};
use crate::lora::branch::Dropout;
use crate::projection::{Direction, Projection, ProjectionInfo, ProjectionKind};
use crate::tensor::Tensor;
use crate::Result;
use std::sync::Arc;

/// A plain f32 dense weight behind the projection interface (test double
/// with real arithmetic).
pub(crate) struct DenseProjection {
    pub info: ProjectionInfo,
    pub w: Vec<f32>,
}

impl DenseProjection {
    pub fn new(name: &str, out_f: usize, in_f: usize, seed: u64) -> Arc<dyn Projection> {
        let w = pseudo_random(out_f * in_f, seed, 0.5);
        let info = ProjectionInfo { name: name.into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
        Arc::new(DenseProjection { info, w })
    }
}

impl Projection for DenseProjection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }
    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.info.check_io(dir, input, tokens, out)?;
        let (o, i) = (self.info.out_features, self.info.in_features);
        match dir {
            Direction::Forward => crate::ops::matmul::matmul_bt(out, input, &self.w, (tokens, i, o), 1.0, false),
            Direction::InputGrad => crate::ops::matmul::matmul(out, input, &self.w, (tokens, o, i), 1.0, false),
        }
        Ok(())
    }
}

pub(crate) fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (crate::base::counter_rng::uniform(seed, i as u64) * 2.0 - 1.0) * scale).collect()
}

/// `max |got - want| / max |want|` (per-tensor max-normalised error).
pub(crate) fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs())).max(1e-12);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((*g as f64 - w).abs())) / scale
}

fn mm_bt(x: &[f64], w: &[f32], t: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0f64; t * o];
    for r in 0..t {
        for c in 0..o {
            y[r * o + c] = (0..i).map(|k| x[r * i + k] * w[c * i + k] as f64).sum();
        }
    }
    y
}

fn ce_f64(logits: &[f64], targets: &[i64], v: usize, denom: f64) -> f64 {
    let mut total = 0.0;
    for (r, &t) in targets.iter().enumerate() {
        if t < 0 {
            continue;
        }
        let row = &logits[r * v..(r + 1) * v];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        total += lse - row[t as usize];
    }
    total / denom
}

struct Setup {
    t: usize,
    d: usize,
    r: usize,
    v: usize,
    proj: Arc<dyn Projection>,
    head: Arc<dyn Projection>,
    x: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    targets: Vec<i64>,
    scaling: f32,
    dropout: Option<Dropout>,
}

fn setup(dropout: Option<Dropout>) -> Setup {
    let (t, d, r, v) = (5, 12, 3, 17);
    Setup {
        t,
        d,
        r,
        v,
        proj: DenseProjection::new("p", d, d, 1),
        head: DenseProjection::new("head", v, d, 2),
        x: pseudo_random(t * d, 3, 1.0),
        a: pseudo_random(r * d, 4, 0.4),
        b: pseudo_random(d * r, 5, 0.4),
        targets: vec![3, -100, 16, 0, 7],
        scaling: 2.0,
        dropout,
    }
}

/// f64 reference: `loss = CE(head(x + proj(x) + s * drop(x) A^T B^T))`.
fn reference_loss(s: &Setup, x: &[f64], a: &[f64], b: &[f64]) -> f64 {
    let (t, d, r) = (s.t, s.d, s.r);
    let w: &DenseProjection = unsafe_downcast(&s.proj);
    let xd: Vec<f64> = match s.dropout {
        Some(dr) => x
            .iter()
            .enumerate()
            .map(|(i, v)| if crate::base::counter_rng::uniform(dr.seed, i as u64) >= dr.p { v / (1.0 - dr.p as f64) } else { 0.0 })
            .collect(),
        None => x.to_vec(),
    };
    let base = mm_bt(x, &w.w, t, d, d);
    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
    let xa = mm_bt(&xd, &a32, t, d, r);
    let mut h = vec![0f64; t * d];
    for row in 0..t {
        for c in 0..d {
            let lora: f64 = (0..r).map(|k| xa[row * r + k] * b[c * r + k]).sum();
            h[row * d + c] = x[row * d + c] + base[row * d + c] + s.scaling as f64 * lora;
        }
    }
    let head: &DenseProjection = unsafe_downcast(&s.head);
    let logits = mm_bt(&h, &head.w, t, d, s.v);
    ce_f64(&logits, &s.targets, s.v, 4.0)
}

/// The test projections are all `DenseProjection`s; reach their weights.
fn unsafe_downcast(p: &Arc<dyn Projection>) -> &DenseProjection {
    // SAFETY: only called on projections built by `DenseProjection::new`.
    unsafe { &*(Arc::as_ptr(p) as *const DenseProjection) }
}

/// Central differences of the f64 reference w.r.t. one of x / a / b
/// (`which` = 0, 1, 2); `a` enters through f32 so perturb in f64 space of
/// `a` is not representable: for it the reference uses f64 directly.
fn fd_grad(s: &Setup, which: usize) -> Vec<f64> {
    let base: [Vec<f64>; 3] = [&s.x, &s.a, &s.b].map(|v| v.iter().map(|&x| x as f64).collect());
    let eps = 1e-6;
    (0..base[which].len())
        .map(|i| {
            let mut p = base.clone();
            p[which][i] += eps;
            let up = reference_loss_a64(s, &p);
            p[which][i] -= 2.0 * eps;
            let down = reference_loss_a64(s, &p);
            (up - down) / (2.0 * eps)
        })
        .collect()
}

fn reference_loss_a64(s: &Setup, p: &[Vec<f64>; 3]) -> f64 {
    // Same as `reference_loss` but with A kept in f64 (for differentiating A).
    let (t, d, r) = (s.t, s.d, s.r);
    let mut xa = vec![0f64; t * r];
    let xd: Vec<f64> = match s.dropout {
        Some(dr) => p[0]
            .iter()
            .enumerate()
            .map(|(i, v)| if crate::base::counter_rng::uniform(dr.seed, i as u64) >= dr.p { v / (1.0 - dr.p as f64) } else { 0.0 })
            .collect(),
        None => p[0].clone(),
    };
    for row in 0..t {
        for k in 0..r {
            xa[row * r + k] = (0..d).map(|c| xd[row * d + c] * p[1][k * d + c]).sum();
        }
    }
    let w = unsafe_downcast(&s.proj);
    let base = mm_bt(&p[0], &w.w, t, d, d);
    let mut h = vec![0f64; t * d];
    for row in 0..t {
        for c in 0..d {
            let lora: f64 = (0..r).map(|k| xa[row * r + k] * p[2][c * r + k]).sum();
            h[row * d + c] = p[0][row * d + c] + base[row * d + c] + s.scaling as f64 * lora;
        }
    }
    let logits = mm_bt(&h, &unsafe_downcast(&s.head).w, t, d, s.v);
    ce_f64(&logits, &s.targets, s.v, 4.0)
}

fn tape_grads(s: &Setup, recompute: bool) -> (f32, Vec<Tensor>) {
    let mut tape = Tape::new();
    let x = tape.param(Tensor::from_vec(&[s.t, s.d], s.x.clone()).unwrap());
    let a = tape.param(Tensor::from_vec(&[s.r, s.d], s.a.clone()).unwrap());
    let b = tape.param(Tensor::from_vec(&[s.d, s.r], s.b.clone()).unwrap());
    let (proj, scaling, dropout) = (s.proj.clone(), s.scaling, s.dropout);
    let layer: SegmentFn = Arc::new(move |tape: &mut Tape, x: Var, p: &[Var]| {
        let y = tape.projection(x, &proj)?;
        let y = tape.lora_add(y, x, p[0], p[1], scaling, dropout)?;
        tape.add(x, y)
    });
    let h = tape.segment(&layer, x, &[a, b], recompute).unwrap();
    let loss = tape.head_loss(h, &s.head, &s.targets, 4.0, 2, None).unwrap();
    tape.backward(loss).unwrap();
    let l = tape.value(loss).data[0];
    (l, [x, a, b].map(|v| tape.grad(v).unwrap().clone()).to_vec())
}

#[test]
fn projection_lora_residual_head_match_finite_differences() {
    for dropout in [None, Some(Dropout { p: 0.3, seed: 99 })] {
        let s = setup(dropout);
        let (loss, grads) = tape_grads(&s, false);
        let p = [&s.x, &s.a, &s.b].map(|v| v.iter().map(|&x| x as f64).collect());
        let want_loss = reference_loss_a64(&s, &p);
        assert!(((loss as f64) - want_loss).abs() < 1e-5 * want_loss.abs(), "{loss} vs {want_loss}");
        assert!((reference_loss(&s, &p[0], &p[1], &p[2]) - want_loss).abs() < 1e-9);
        for (which, g) in grads.iter().enumerate() {
            let err = rel_err(&g.data, &fd_grad(&s, which));
            assert!(err < 1e-4, "grad {which} (dropout {dropout:?}): rel err {err}");
        }
    }
}

#[test]
fn recomputed_segment_gives_bit_identical_gradients() {
    let s = setup(Some(Dropout { p: 0.25, seed: 5 }));
    let (l1, g1) = tape_grads(&s, false);
    let (l2, g2) = tape_grads(&s, true);
    assert_eq!(l1.to_bits(), l2.to_bits());
    for (a, b) in g1.iter().zip(&g2) {
        assert!(a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

#[test]
fn head_logits_are_returned_for_every_row_and_bad_targets_are_errors() {
    let s = setup(None);
    let mut tape = Tape::new();
    let x = tape.constant(Tensor::from_vec(&[s.t, s.d], s.x.clone()).unwrap());
    let mut logits = Vec::new();
    tape.head_loss(x, &s.head, &s.targets, 1.0, 3, Some(&mut logits)).unwrap();
    let want = mm_bt(&s.x.iter().map(|&v| v as f64).collect::<Vec<_>>(), &unsafe_downcast(&s.head).w, s.t, s.d, s.v);
    assert!(rel_err(&logits, &want) < 1e-6);
    let err = tape.head_loss(x, &s.head, &[0, 1, 2, 3, 17], 1.0, 3, None).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let wrong = Tensor::zeros(&[2, 7]);
    let y = tape.constant(wrong);
    assert!(tape.projection(y, &s.proj).is_err());
}

#[test]
fn gradients_reach_lora_factors_produced_by_other_nodes() {
    // A and B as outputs of nodes (here: sums of two parameters each, as a
    // hypernetwork's heads would produce them) still get their gradients.
    let s = setup(None);
    let mut tape = Tape::new();
    let x = tape.constant(Tensor::from_vec(&[s.t, s.d], s.x.clone()).unwrap());
    let half = |v: &[f32]| v.iter().map(|x| x * 0.5).collect::<Vec<_>>();
    let a1 = tape.param(Tensor::from_vec(&[s.r, s.d], half(&s.a)).unwrap());
    let a2 = tape.param(Tensor::from_vec(&[s.r, s.d], half(&s.a)).unwrap());
    let b1 = tape.param(Tensor::from_vec(&[s.d, s.r], half(&s.b)).unwrap());
    let b2 = tape.param(Tensor::from_vec(&[s.d, s.r], half(&s.b)).unwrap());
    let a = tape.add(a1, a2).unwrap();
    let b = tape.add(b1, b2).unwrap();
    let y = tape.projection(x, &s.proj).unwrap();
    let y = tape.lora_add(y, x, a, b, s.scaling, None).unwrap();
    let h = tape.add(x, y).unwrap();
    let loss = tape.head_loss(h, &s.head, &s.targets, 4.0, 8, None).unwrap();
    tape.backward(loss).unwrap();
    let (_, direct) = tape_grads(&s, false);
    for (v, want) in [(a1, &direct[1]), (a2, &direct[1]), (b1, &direct[2]), (b2, &direct[2])] {
        let g = tape.grad(v).unwrap();
        let want: Vec<f64> = want.data.iter().map(|&x| x as f64).collect();
        assert!(rel_err(&g.data, &want) < 1e-6);
    }
}
