//! HVX self-tests: the build's tile shuffles (the HVX ones under
//! qemu-hexagon) against the portable ones, byte for byte, on tiles whose
//! every element is distinct.
use super::{portable, Tile, TILE_ELEMS};
use crate::selftest::TestResult;
use crate::{check, check_eq};
use half::f16;

/// A 128-byte aligned tile, as tiles are in VTCM.
#[repr(C, align(128))]
struct Aligned(Tile);

fn numbered(seed: u16) -> Aligned {
    Aligned(core::array::from_fn(|i| f16::from_bits((i as u16).wrapping_mul(31).wrapping_add(seed))))
}

fn same_as_portable(build: fn(&mut Tile), reference: fn(&mut Tile)) -> TestResult {
    for seed in [1u16, 0x8000, 0x7bff] {
        let mut a = numbered(seed);
        let mut b = numbered(seed);
        build(&mut a.0);
        reference(&mut b.0);
        let bits = |t: &Tile| -> [u16; TILE_ELEMS] { core::array::from_fn(|i| t[i].to_bits()) };
        check!(bits(&a.0) == bits(&b.0), "{} differs from portable (seed {seed})", super::IMPLEMENTATION);
    }
    Ok(())
}

fn transpose_matches_portable() -> TestResult {
    same_as_portable(super::transpose, portable::transpose)
}

fn weight_from_cols_matches_portable() -> TestResult {
    same_as_portable(super::weight_from_cols, portable::weight_from_cols)
}

fn weight_from_rows_matches_portable() -> TestResult {
    same_as_portable(super::weight_from_rows, portable::weight_from_rows)
}

/// The portable shuffles against the layout formulas written out here.
fn portable_shuffles_follow_the_layouts() -> TestResult {
    let src = numbered(5);
    let mut t = numbered(5);
    portable::transpose(&mut t.0);
    for r in 0..32 {
        for c in 0..32 {
            check_eq!(t.0[c * 32 + r], src.0[r * 32 + c]);
        }
    }
    let mut t = numbered(5);
    portable::weight_from_cols(&mut t.0);
    for i in 0..32 {
        for j in 0..32 {
            check_eq!(t.0[(i / 2) * 64 + j * 2 + (i % 2)], src.0[i * 32 + j]);
        }
    }
    let mut t = numbered(5);
    portable::weight_from_rows(&mut t.0);
    for i in 0..32 {
        for j in 0..32 {
            check_eq!(t.0[(i / 2) * 64 + j * 2 + (i % 2)], src.0[j * 32 + i]);
        }
    }
    Ok(())
}

/// Hexagon builds must really run the HVX shuffles (a missing target
/// feature would silently select the portable code).
fn hexagon_builds_use_hvx() -> TestResult {
    let expected = if cfg!(target_arch = "hexagon") { "hvx" } else { "portable" };
    check_eq!(super::IMPLEMENTATION, expected);
    Ok(())
}

crate::selftests!(
    hexagon_builds_use_hvx,
    transpose_matches_portable,
    weight_from_cols_matches_portable,
    weight_from_rows_matches_portable,
    portable_shuffles_follow_the_layouts,
);
