//! HVX tile shuffles: FP16 row windows in VTCM -> the tile layouts the tile
//! engine consumes (see [`crate::tile`] for the layouts).
//!
//! Every function works in place on one 32x32 FP16 tile (2048 bytes = 16 HVX
//! vectors of 128 bytes, vector `v` holding rows `2v` and `2v+1`):
//!
//! - [`transpose`]: row-major `(r, c)` -> row-major `(c, r)`;
//! - [`weight_from_cols`]: a row-major block whose rows run along the
//!   reduction index `i` -> weight layout (`i/2`, `j`, `i%2`). One `vshuffh`
//!   per vector: the row-pair interleave;
//! - [`weight_from_rows`]: a row-major block whose rows run along the output
//!   index `j` -> weight layout; [`transpose`] then [`weight_from_cols`].
//!
//! Two implementations with identical results: `hexagon.rs` (HVX v66 integer
//! shuffles `vshuff(Vu,Vv,Rt)`/`vshuffh` from `core::arch::hexagon::v128`,
//! selected on Hexagon targets with 128-byte HVX) and `portable.rs` (index
//! arithmetic). The self-tests compare them byte for byte under qemu-hexagon.
//!
//! The transpose is a permutation of the 10 bits of the element index; a
//! `vshuff` with a one-bit `Rt` on a pair of vectors exchanges one
//! vector-number bit with one in-vector bit, so [`TRANSPOSE_STAGES`] lists the
//! seven such exchanges that turn `(r, c)` into `(c, r)`.
use half::f16;

pub mod portable;
#[cfg(all(target_arch = "hexagon", target_feature = "hvx-length128b"))]
pub mod hexagon;

/// Elements of a 32x32 tile.
pub const TILE_ELEMS: usize = 1024;

/// One 32x32 FP16 tile.
pub type Tile = [f16; TILE_ELEMS];

/// The transpose as exchanges `(vector-number bit, halfword-index bit)`:
/// bit `a` of the vector number (0..4) swaps with bit `b` of the in-vector
/// halfword index (0..6), via `vshuff` with `Rt = 2^(b+1)` bytes.
///
/// Element `(r, c)` starts at vector `r >> 1`, halfword `(r & 1) * 32 + c`.
/// The first four stages move `r4..r1` into the halfword bits and `c4..c1`
/// into the vector number; the last three exchange halfword bits 5 and 0
/// (`r0` and `c0`) through vector bit 0.
pub const TRANSPOSE_STAGES: [(u32, u32); 7] = [(3, 4), (2, 3), (1, 2), (0, 1), (0, 5), (0, 0), (0, 5)];

#[cfg(all(target_arch = "hexagon", target_feature = "hvx-length128b"))]
use hexagon as imp;
#[cfg(not(all(target_arch = "hexagon", target_feature = "hvx-length128b")))]
use portable as imp;

/// Transposes a tile in place.
pub fn transpose(t: &mut Tile) {
    imp::transpose(t)
}

/// Row-major block with rows along the reduction index -> weight layout.
pub fn weight_from_cols(t: &mut Tile) {
    imp::weight_from_cols(t)
}

/// Row-major block with rows along the output index -> weight layout.
pub fn weight_from_rows(t: &mut Tile) {
    imp::weight_from_rows(t)
}

/// Which implementation [`transpose`] and friends use on this build.
pub const IMPLEMENTATION: &str = if cfg!(all(target_arch = "hexagon", target_feature = "hvx-length128b")) {
    "hvx"
} else {
    "portable"
};

#[cfg(test)]
mod stage_model_tests {
    //! Executes [`TRANSPOSE_STAGES`] on a software model of the two HVX
    //! instructions (from their ISA pseudocode), so the stage plan is checked
    //! natively; under qemu the real instructions are checked by the
    //! self-tests.
    use super::*;

    type Vector = [u8; 128];

    /// `Vdd = vshuff(Vu, Vv, Rt)`: returns `(Vdd.v[0], Vdd.v[1])`.
    fn vshuff_vdd(vu: &Vector, vv: &Vector, rt: usize) -> (Vector, Vector) {
        let (mut v0, mut v1) = (*vv, *vu);
        let mut offset = 1;
        while offset < 128 {
            if rt & offset != 0 {
                for k in 0..128 {
                    if k & offset == 0 {
                        core::mem::swap(&mut v1[k], &mut v0[k + offset]);
                    }
                }
            }
            offset <<= 1;
        }
        (v0, v1)
    }

    /// `Vd.h = vshuff(Vu.h)`: low and high halves interleaved.
    fn vshuffh(v: &Vector) -> Vector {
        let mut out = [0u8; 128];
        for k in 0..32 {
            out[4 * k..4 * k + 2].copy_from_slice(&v[2 * k..2 * k + 2]);
            out[4 * k + 2..4 * k + 4].copy_from_slice(&v[64 + 2 * k..64 + 2 * k + 2]);
        }
        out
    }

    fn to_vectors(t: &Tile) -> [Vector; 16] {
        let mut v = [[0u8; 128]; 16];
        for (i, x) in t.iter().enumerate() {
            v[i / 64][(i % 64) * 2..(i % 64) * 2 + 2].copy_from_slice(&x.to_le_bytes());
        }
        v
    }

    fn from_vectors(v: &[Vector; 16]) -> Tile {
        let mut t = [f16::ZERO; TILE_ELEMS];
        for (i, x) in t.iter_mut().enumerate() {
            let b = &v[i / 64][(i % 64) * 2..(i % 64) * 2 + 2];
            *x = f16::from_le_bytes([b[0], b[1]]);
        }
        t
    }

    fn numbered() -> Tile {
        core::array::from_fn(|i| f16::from_bits(i as u16 + 1))
    }

    #[test]
    fn stage_plan_on_modelled_instructions_equals_portable_transpose() {
        let mut v = to_vectors(&numbered());
        for &(a, b) in &TRANSPOSE_STAGES {
            for p in 0..16 {
                if p & (1 << a) == 0 {
                    let q = p | 1 << a;
                    let (lo, hi) = vshuff_vdd(&v[q], &v[p], 2 << b);
                    v[p] = lo;
                    v[q] = hi;
                }
            }
        }
        let mut expected = numbered();
        portable::transpose(&mut expected);
        assert_eq!(from_vectors(&v), expected);
    }

    #[test]
    fn modelled_vshuffh_equals_portable_weight_from_cols() {
        let v = to_vectors(&numbered()).map(|x| vshuffh(&x));
        let mut expected = numbered();
        portable::weight_from_cols(&mut expected);
        assert_eq!(from_vectors(&v), expected);
    }
}

pub mod selftests;
