//! Portable tile shuffles: plain index arithmetic, the reference the HVX
//! version must match byte for byte.
use super::{Tile, TILE_ELEMS};
use crate::tile::weight_index;

/// `(r, c)` -> `(c, r)`.
pub fn transpose(t: &mut Tile) {
    for r in 0..32 {
        for c in r + 1..32 {
            t.swap(r * 32 + c, c * 32 + r);
        }
    }
}

/// Row-major `(i, j)` (rows along the reduction index) -> weight layout.
pub fn weight_from_cols(t: &mut Tile) {
    let src = *t;
    for i in 0..32 {
        for j in 0..32 {
            t[weight_index(i, j)] = src[i * 32 + j];
        }
    }
    debug_assert_eq!(src.len(), TILE_ELEMS);
}

/// Row-major `(j, i)` (rows along the output index) -> weight layout.
pub fn weight_from_rows(t: &mut Tile) {
    transpose(t);
    weight_from_cols(t);
}
