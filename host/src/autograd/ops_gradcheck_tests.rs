//! Every differentiable node's backward against central finite differences
//! of its forward (whose values the ops' own tests check against f64):
//! `L = sum(y * r)` for a fixed random `r`, so `dL/dy = r`.
use super::gradcheck_tests::pseudo_random;
use super::{Tape, Var};
use crate::ops::attention::AttnDims;
use crate::ops::rmsnorm::NormWeight;
use crate::tensor::Tensor;
use std::sync::Arc;

fn check(name: &str, inputs: &[Tensor], build: impl Fn(&mut Tape, &[Var]) -> Var) {
    let run = |ins: &[Tensor]| {
        let mut tape = Tape::new();
        let vars: Vec<Var> = ins.iter().map(|t| tape.param(t.clone())).collect();
        let y = build(&mut tape, &vars);
        (tape, vars, y)
    };
    let (mut tape, vars, y) = run(inputs);
    let r = Tensor { shape: tape.value(y).shape.clone(), data: pseudo_random(tape.value(y).len(), 77, 1.0) };
    tape.backward_with(y, r.clone()).unwrap();
    let loss = |ins: &[Tensor]| {
        let (tape, _, y) = run(ins);
        tape.value(y).data.iter().zip(&r.data).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
    };
    let eps = 1e-2f32;
    for (k, v) in vars.iter().enumerate() {
        let got = tape.grad(*v).unwrap_or_else(|| panic!("{name}: no grad for input {k}"));
        let mut want = vec![0f64; inputs[k].len()];
        for (i, w) in want.iter_mut().enumerate() {
            let mut ins = inputs.to_vec();
            ins[k].data[i] += eps;
            let up = loss(&ins);
            ins[k].data[i] -= 2.0 * eps;
            let down = loss(&ins);
            *w = (up - down) / (2.0 * eps as f64);
        }
        let err = super::gradcheck_tests::rel_err(&got.data, &want);
        assert!(err < 2e-3, "{name} input {k}: rel err {err}");
    }
}

fn t(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    Tensor::from_vec(shape, pseudo_random(shape.iter().product(), seed, scale)).unwrap()
}

#[test]
fn rmsnorm_both_conventions() {
    for kind in [NormWeight::Plain, NormWeight::OnePlus] {
        let w = Arc::new(pseudo_random(6, 3, 1.0));
        check("rmsnorm", &[t(&[4, 6], 1, 2.0)], |tape, v| tape.rms_norm(v[0], &w, kind, 1e-6).unwrap());
    }
}

#[test]
fn swiglu() {
    check("swiglu", &[t(&[3, 5], 1, 3.0), t(&[3, 5], 2, 1.0)], |tape, v| tape.swiglu(v[0], v[1]).unwrap());
}

#[test]
fn geglu() {
    check("geglu", &[t(&[3, 5], 1, 3.0), t(&[3, 5], 2, 1.0)], |tape, v| tape.geglu(v[0], v[1]).unwrap());
}

#[test]
fn rope_with_partial_rotary() {
    let positions = Arc::new(vec![0, 1, 5, 9]);
    let inv_freq = Arc::new(vec![1.0, 0.3]);
    check("rope", &[t(&[4, 2 * 6], 1, 1.0)], |tape, v| tape.rope(v[0], &positions, 2, 6, &inv_freq).unwrap());
}

#[test]
fn attention_gqa_causal_and_bidirectional_over_two_sequences() {
    for causal in [true, false] {
        let dims = AttnDims { q_len: 5, kv_len: 5, n_head: 4, n_kv_head: 2, head_dim: 3, causal };
        let inputs = [t(&[10, 12], 1, 1.5), t(&[10, 6], 2, 1.5), t(&[10, 6], 3, 1.0)];
        check("attention", &inputs, |tape, v| tape.attention(v[0], v[1], v[2], dims, 0.6, crate::ops::attention::Products::F32).unwrap());
    }
}

#[test]
fn sliding_window_attention_over_two_sequences() {
    let dims = AttnDims { q_len: 5, kv_len: 5, n_head: 4, n_kv_head: 2, head_dim: 3, causal: true };
    let inputs = [t(&[10, 12], 1, 1.5), t(&[10, 6], 2, 1.5), t(&[10, 6], 3, 1.0)];
    // (A window of 1 makes dq exactly zero, which a relative check cannot
    // measure; ops::attention's directional-derivative test covers it.)
    for window in [2, 4] {
        let f = |tape: &mut Tape, v: &[Var]| tape.attention_window(v[0], v[1], v[2], dims, 0.6, crate::ops::attention::Products::F32, Some(window)).unwrap();
        check("sliding-window attention", &inputs, f);
    }
}
