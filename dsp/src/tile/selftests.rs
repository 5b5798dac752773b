//! Tile engine self-tests: the software engine against an f64 product of
//! the logical matrices, with the operands placed by the layout formulas.
use super::software::SoftwareTiles;
use super::{AccTile, TileEngine};
use crate::hvx::{Tile, TILE_ELEMS};
use crate::kernels::testbed::Rng;
use crate::selftest::TestResult;
use crate::{check, check_eq};
use half::f16;

fn engine_matches_f64_product() -> TestResult {
    let mut rng = Rng(31);
    let a: [f16; TILE_ELEMS] = core::array::from_fn(|_| f16::from_f32(rng.unit() * 8.0)); // (m, i)
    let b: [f16; TILE_ELEMS] = core::array::from_fn(|_| f16::from_f32(rng.unit())); // (i, j)
    let act: Tile = a;
    let mut weight: Tile = [f16::ZERO; TILE_ELEMS];
    for i in 0..32 {
        for j in 0..32 {
            weight[(i / 2) * 64 + j * 2 + i % 2] = b[i * 32 + j];
        }
    }
    let mut acc: AccTile = [1.0; TILE_ELEMS];
    let mut e = SoftwareTiles::new();
    e.mac(&mut acc, &act, &weight);
    e.mac(&mut acc, &act, &weight);
    check_eq!(e.tiles(), 2);
    for m in 0..32 {
        for j in 0..32 {
            let mut s = 1.0f64;
            let mut mag = 1.0f64;
            for i in 0..32 {
                let p = a[m * 32 + i].to_f64() * b[i * 32 + j].to_f64();
                s += 2.0 * p;
                mag += 2.0 * p.abs();
            }
            let got = acc[m * 32 + j] as f64;
            check!((got - s).abs() <= mag * 64.0 * f32::EPSILON as f64, "({m},{j}) {got} vs {s}");
        }
    }
    Ok(())
}

/// Products of f16 values are exact in f32: a single product per output
/// (one-hot activation) reproduces it bit for bit, even at the f16 extremes.
fn single_products_are_exact() -> TestResult {
    let mut act: Tile = [f16::ZERO; TILE_ELEMS];
    let mut weight: Tile = [f16::ZERO; TILE_ELEMS];
    let vals = [f16::MAX, f16::from_bits(1), f16::from_f32(-3.140625), f16::MIN_POSITIVE];
    for m in 0..32 {
        act[m * 32 + m] = vals[m % 4];
    }
    for i in 0..32 {
        for j in 0..32 {
            weight[(i / 2) * 64 + j * 2 + i % 2] = vals[(i + j) % 4];
        }
    }
    let mut acc: AccTile = [0.0; TILE_ELEMS];
    SoftwareTiles::new().mac(&mut acc, &act, &weight);
    for m in 0..32 {
        for j in 0..32 {
            let expected = vals[m % 4].to_f64() * vals[(m + j) % 4].to_f64();
            check_eq!(acc[m * 32 + j] as f64, expected);
        }
    }
    Ok(())
}

crate::selftests!(engine_matches_f64_product, single_products_are_exact);
