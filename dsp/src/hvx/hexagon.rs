//! HVX tile shuffles (128-byte vectors, integer permutes only: qemu-hexagon
//! 7.2 executes these, it has no HVX float).
use super::{Tile, TRANSPOSE_STAGES};
use core::arch::hexagon::v128::{q6_v_hi_w, q6_v_lo_w, q6_vh_vshuff_vh, q6_w_vshuff_vvr, HvxVector};

/// The tile as 16 vectors. Tiles live at 128-byte aligned VTCM offsets (the
/// arena aligns every allocation, tiles are 2048 bytes), checked here.
fn vectors(t: &mut Tile) -> *mut HvxVector {
    let p = t.as_mut_ptr() as *mut HvxVector;
    assert!(p as usize % 128 == 0, "HVX tile not 128-byte aligned");
    p
}

/// Applies one `(vector bit a, halfword bit b)` exchange to all 8 pairs.
///
/// # Safety
/// `v` points to 16 aligned vectors.
#[target_feature(enable = "hvxv66,hvx-length128b")]
unsafe fn exchange(v: *mut HvxVector, a: u32, b: u32) {
    for p in 0..16usize {
        if p & (1 << a) == 0 {
            let q = p | 1 << a;
            let pair = q6_w_vshuff_vvr(*v.add(q), *v.add(p), 2 << b);
            *v.add(p) = q6_v_lo_w(pair);
            *v.add(q) = q6_v_hi_w(pair);
        }
    }
}

/// `(r, c)` -> `(c, r)`.
pub fn transpose(t: &mut Tile) {
    let v = vectors(t);
    for &(a, b) in &TRANSPOSE_STAGES {
        // SAFETY: `v` is 16 aligned vectors of `t`; the target has HVX v66.
        unsafe { exchange(v, a, b) };
    }
}

/// Row-major `(i, j)` -> weight layout: `vshuffh` on every vector.
pub fn weight_from_cols(t: &mut Tile) {
    let v = vectors(t);
    for k in 0..16 {
        // SAFETY: as above.
        unsafe { *v.add(k) = q6_vh_vshuff_vh(*v.add(k)) };
    }
}

/// Row-major `(j, i)` -> weight layout.
pub fn weight_from_rows(t: &mut Tile) {
    transpose(t);
    weight_from_cols(t);
}
