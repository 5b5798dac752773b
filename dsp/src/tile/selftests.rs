//! Tile engine self-tests, with the operands placed by the layout formulas:
//! every engine (software, the HVX float engine over the instruction models,
//! and this build's [`DeviceTiles`]) against an f64 product of the logical
//! matrices and hand-derived cases of the documented summation order, and
//! the engines against each other bit for bit. On a Hexagon v68+ build
//! `DeviceTiles` is the HVX float engine on the real instructions, so the
//! same suite checks the instructions against their models wherever that
//! build runs; here it is compiled, never run.
use super::hvx_float::HvxFloatTiles;
use super::hvx_model::Model;
use super::software::SoftwareTiles;
use super::{AccTile, DeviceTiles, TileEngine};
use crate::hvx::{Tile, TILE_ELEMS};
use crate::kernels::testbed::Rng;
use crate::selftest::TestResult;
use crate::{check, check_eq};
use alloc::boxed::Box;
use alloc::vec::Vec;
use half::f16;

/// One of each engine, with its name for messages.
fn engines() -> Vec<(&'static str, Box<dyn TileEngine>)> {
    alloc::vec![
        ("software", Box::new(SoftwareTiles::new()) as Box<dyn TileEngine>),
        ("hvx-float/model", Box::new(HvxFloatTiles::<Model>::new())),
        ("device", Box::new(DeviceTiles::new())),
    ]
}

/// Places a row-major `(i, j)` matrix in the weight layout.
fn weight_tile(b: &[f16; TILE_ELEMS]) -> Tile {
    let mut weight: Tile = [f16::ZERO; TILE_ELEMS];
    for i in 0..32 {
        for j in 0..32 {
            weight[(i / 2) * 64 + j * 2 + i % 2] = b[i * 32 + j];
        }
    }
    weight
}

/// A random FP16 value from a mix of kinds: ordinary, subnormal, large
/// (32768..65504), and zeros of both signs.
fn mixed_value(rng: &mut Rng) -> f16 {
    let sign = if rng.next_u64() & 1 == 0 { 0 } else { 0x8000 };
    match rng.next_u64() % 8 {
        0 => f16::from_bits(sign | (1 + rng.next_u64() % 0x3ff) as u16),
        1 => f16::from_bits(sign | (0x7800 + rng.next_u64() % 0x400) as u16),
        2 => f16::from_bits(sign),
        _ => f16::from_f32(rng.unit() * 4.0),
    }
}

/// Every engine, two accumulations, against the f64 product.
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
    for (name, mut e) in engines() {
        let mut acc: AccTile = [1.0; TILE_ELEMS];
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
                check!((got - s).abs() <= mag * 64.0 * f32::EPSILON as f64, "{name} ({m},{j}) {got} vs {s}");
            }
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
    for (name, mut e) in engines() {
        let mut acc: AccTile = [0.0; TILE_ELEMS];
        e.mac(&mut acc, &act, &weight);
        for m in 0..32 {
            for j in 0..32 {
                let expected = vals[m % 4].to_f64() * vals[(m + j) % 4].to_f64();
                check!(acc[m * 32 + j] as f64 == expected, "{name} ({m},{j}): {} vs {expected}", acc[m * 32 + j]);
            }
        }
    }
    Ok(())
}

/// Every engine on tiles mixing subnormal, large, zero and ordinary FP16
/// values, against the f64 product. The documented order rounds each output
/// at most 17 times (16 chain adds, then the final add), each time by at
/// most half an ulp of a partial sum bounded by `|acc| + sum |p|`, so the
/// error stays below `17 * 2^-24 * (|acc| + sum |p|)`.
fn engines_match_f64_on_mixed_values() -> TestResult {
    let mut rng = Rng(77);
    for _round in 0..3 {
        let a: Tile = core::array::from_fn(|_| mixed_value(&mut rng));
        let b: [f16; TILE_ELEMS] = core::array::from_fn(|_| mixed_value(&mut rng));
        let acc0: AccTile = core::array::from_fn(|_| rng.unit() * 1e3);
        let weight = weight_tile(&b);
        for (name, mut e) in engines() {
            let mut acc = acc0;
            e.mac(&mut acc, &a, &weight);
            for m in 0..32 {
                for j in 0..32 {
                    let mut s = acc0[m * 32 + j] as f64;
                    let mut mag = s.abs();
                    for i in 0..32 {
                        let p = a[m * 32 + i].to_f64() * b[i * 32 + j].to_f64();
                        s += p;
                        mag += p.abs();
                    }
                    let got = acc[m * 32 + j] as f64;
                    let bound = mag * 17.0 * f64::from(f32::EPSILON) / 2.0;
                    check!((got - s).abs() <= bound, "{name} ({m},{j}): {got} vs {s} (bound {bound})");
                }
            }
        }
    }
    Ok(())
}

/// All engines give the same bits, over several accumulations into one tile
/// (as the kernels do), on mixed values.
fn engines_are_bit_identical() -> TestResult {
    let mut rng = Rng(5);
    let tiles: Vec<(Tile, Tile)> = (0..4)
        .map(|_| {
            let a: Tile = core::array::from_fn(|_| mixed_value(&mut rng));
            let b: [f16; TILE_ELEMS] = core::array::from_fn(|_| mixed_value(&mut rng));
            (a, weight_tile(&b))
        })
        .collect();
    let mut reference: Option<AccTile> = None;
    for (name, mut e) in engines() {
        let mut acc: AccTile = [0.0; TILE_ELEMS];
        for (a, w) in &tiles {
            e.mac(&mut acc, a, w);
        }
        check_eq!(e.tiles(), tiles.len() as u64);
        match &reference {
            None => reference = Some(acc),
            Some(r) => {
                let bad = (0..TILE_ELEMS).find(|&k| acc[k].to_bits() != r[k].to_bits());
                check!(bad.is_none(), "{name} differs from software at {bad:?}");
            }
        }
    }
    Ok(())
}

/// The documented order, on a case worked out by hand: accumulator 1.0,
/// all 32 products 2^-24. Summed left to right, every `1 + 2^-24` is a tie
/// that rounds to even (1.0), giving 1.0. In the documented order the even
/// chain stays 1.0, the odd chain is exactly 16 * 2^-24 = 2^-20, and the
/// final add gives 1 + 2^-20, which is representable: that must be the
/// result, bit for bit.
fn summation_order_is_the_documented_one() -> TestResult {
    let act: Tile = [f16::ONE; TILE_ELEMS];
    let weight: Tile = [f16::from_bits(0x0001); TILE_ELEMS]; // 2^-24 at every (i, j)
    let expected = 1.0 + 1.0 / (1u32 << 20) as f32;
    for (name, mut e) in engines() {
        let mut acc: AccTile = [1.0; TILE_ELEMS];
        e.mac(&mut acc, &act, &weight);
        check!(acc.iter().all(|x| x.to_bits() == expected.to_bits()), "{name}: {} vs {expected}", acc[0]);
    }
    Ok(())
}

/// The sign of zero follows the order too: on an accumulator of -0, the
/// even chain of -0 products stays -0, the odd chain starts at +0 and stays
/// +0, and `-0 + +0 = +0`. Left to right it would stay -0.
fn zero_signs_follow_the_order() -> TestResult {
    let act: Tile = [f16::NEG_ZERO; TILE_ELEMS];
    let weight: Tile = [f16::ONE; TILE_ELEMS];
    for (name, mut e) in engines() {
        let mut acc: AccTile = [-0.0; TILE_ELEMS];
        e.mac(&mut acc, &act, &weight);
        check!(acc.iter().all(|x| x.to_bits() == 0), "{name}: {:#x}", acc[0].to_bits());
    }
    Ok(())
}

/// Hexagon v68+ builds must run the HVX float engine (a missing target
/// feature would silently select the software one).
fn device_tiles_are_the_hvx_float_engine_on_v68_builds() -> TestResult {
    let v68 = cfg!(all(target_arch = "hexagon", target_feature = "hvxv68", target_feature = "hvx-ieee-fp"));
    check_eq!(super::DEVICE_TILES, if v68 { "hvx-float" } else { "software" });
    Ok(())
}

crate::selftests!(
    engine_matches_f64_product,
    single_products_are_exact,
    engines_match_f64_on_mixed_values,
    engines_are_bit_identical,
    summation_order_is_the_documented_one,
    zero_signs_follow_the_order,
    device_tiles_are_the_hvx_float_engine_on_v68_builds,
);
