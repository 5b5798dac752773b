//! Property tests (native only): tiling, chunking and rescaling invariants
//! over random shapes and values.
use super::testbed::{first_violation, fp16_weight, q8_weight, reference, Bench, Rng};
use super::{Direction, Plan, Precision, ResidentWeight};
use crate::dma::software::SoftwareDma;
use crate::dma::{push_copy, Copy2d, DmaEngine};
use crate::hvx::portable;
use half::f16;
use hexlora_proto::rescale::{row_exponent, scale_pow2};
use proptest::prelude::*;

fn dir(forward: bool) -> Direction {
    if forward {
        Direction::Forward
    } else {
        Direction::InputGrad
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any shape (padding everywhere), either direction, either precision,
    /// with VTCM so small that one token block and 1-3 stripes fit: every
    /// output element within the f64 bound, every byte of W DMA'd exactly
    /// once, the input once per window, and the VTCM used never above the
    /// plan or the capacity.
    #[test]
    fn tiled_ops_match_reference_and_stream_w_exactly_once(
        rows in 1usize..96, cols32 in 1usize..4, extra in 0usize..31, tokens in 1usize..100,
        stripes in 1usize..4, forward in any::<bool>(), q8 in any::<bool>(), seed in any::<u64>(),
    ) {
        let cols = if q8 { cols32 * 32 } else { cols32 * 32 - extra.min(cols32 * 32 - 1) };
        let mut rng = Rng(seed);
        // |w| < 0.05 keeps every partial sum under 4096 * 0.05 * 96 < 60000:
        // no retries, so passes and traffic follow the plan exactly.
        let w16 = fp16_weight(&mut rng, rows, cols, 0.05);
        let wq = if q8 { q8_weight(&mut rng, rows, cols, 0.05) } else { Vec::new() };
        let w = if q8 { ResidentWeight::q8_0(&wq, rows, cols) } else { ResidentWeight::fp16(&w16, rows, cols) }.unwrap();
        let d = if forward { cols } else { rows };
        let x = rng.vec(tokens * d, 4.0);
        let probe = Plan::new(w.precision(), dir(forward), rows, cols, tokens, 1 << 30).unwrap();
        let capacity = probe.fixed_bytes() + probe.block_bytes() + stripes * probe.stripe_bytes()
            + super::plan::VTCM_BUFFERS * 128;
        let plan = Plan::new(w.precision(), dir(forward), rows, cols, tokens, capacity).unwrap();
        prop_assert!(plan.window_stripes <= stripes);
        // Streams tokens unless one group holds them all (ob <= stripes can
        // leave room for more blocks).
        prop_assert!(plan.tokens_resident || plan.group_blocks * 32 < tokens);
        let (got, stats) = Bench::new(capacity).run(&w, dir(forward), tokens, &x).unwrap();
        let (y, bound) = reference(&w, dir(forward), tokens, &x);
        prop_assert!(first_violation(&got, &y, &bound).is_none(), "{:?}", first_violation(&got, &y, &bound));
        prop_assert_eq!(stats.rows_retried, 0);
        prop_assert_eq!(stats.weight_passes, 1);
        let w_bytes = if q8 { wq.len() } else { w16.len() * 2 };
        prop_assert_eq!(stats.dma_weight_bytes as usize, w_bytes);
        prop_assert_eq!(plan.weight_dma_bytes(), w_bytes);
        prop_assert_eq!(stats.dma_input_bytes as usize, plan.input_passes() * tokens * d * 4);
        prop_assert_eq!(stats.dma_output_bytes as usize, plan.dma_out_bytes());
        prop_assert_eq!(stats.tile_products as usize, plan.tile_products());
        prop_assert!(stats.vtcm_bytes <= plan.vtcm_bytes() && plan.vtcm_bytes() <= capacity);
    }

    /// Windows cover every stripe with none empty, token groups are never
    /// empty, `tokens_resident` says whether the groups hold every token,
    /// and the plan fits the capacity whenever it succeeds.
    #[test]
    fn plans_fit_their_capacity(
        rows in 1usize..20000, cols in 1usize..20000, tokens in 1usize..5000,
        capacity in 1usize..(16 << 20), forward in any::<bool>(), q8 in any::<bool>(),
    ) {
        let cols = if q8 { cols.div_ceil(32) * 32 } else { cols };
        let p = if q8 { Precision::Q8_0 } else { Precision::Fp16 };
        if let Ok(plan) = Plan::new(p, dir(forward), rows, cols, tokens, capacity) {
            prop_assert!(plan.window_stripes >= 1 && plan.group_blocks >= 1);
            prop_assert!(plan.windows * plan.window_stripes >= plan.ob);
            prop_assert!((plan.windows - 1) * plan.window_stripes < plan.ob);
            prop_assert!(plan.group_blocks <= tokens.div_ceil(32));
            prop_assert_eq!(plan.tokens_resident, plan.group_blocks * 32 >= tokens);
            prop_assert!(plan.vtcm_bytes() <= capacity);
        }
    }

    /// Any finite non-zero row maximum, subnormals included, lands in
    /// [2^11, 2^12) exactly, and scaling back restores it bit for bit.
    #[test]
    fn row_scaling_targets_2_pow_12_exactly(bits in 1u32..0x7f80_0000) {
        let max = f32::from_bits(bits);
        let k = row_exponent(max);
        let scaled = scale_pow2(max, k);
        prop_assert!((2048.0..4096.0).contains(&scaled));
        prop_assert_eq!(scale_pow2(scaled, -k).to_bits(), max.to_bits());
    }

    /// 2-D copies of any geometry, including strides past 16 bits, move
    /// exactly the ROI bytes through the software engine.
    #[test]
    fn split_copies_move_exactly_the_roi(
        width in 1usize..300, height in 1usize..6, src_pad in 0usize..70_000, dst_pad in 0usize..300,
    ) {
        let (src_stride, dst_stride) = (width + src_pad, width + dst_pad);
        let src: Vec<u8> = (0..src_stride * height).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; dst_stride * height];
        let mut dma = SoftwareDma::new();
        let mut bytes = 0;
        let c = Copy2d { src: src.as_ptr(), dst: dst.as_mut_ptr(), width, height, src_stride, dst_stride };
        // SAFETY: both vectors outlive wait_all.
        unsafe { push_copy(&mut dma, c, &mut bytes) };
        dma.wait_all();
        prop_assert_eq!(bytes as usize, width * height);
        for r in 0..height {
            for col in 0..dst_stride {
                let want = if col < width { src[r * src_stride + col] } else { 0 };
                prop_assert_eq!(dst[r * dst_stride + col], want);
            }
        }
    }

    /// Transposing twice is the identity; weight_from_rows of a block equals
    /// weight_from_cols of its transpose.
    #[test]
    fn shuffles_compose(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let t: [f16; 1024] = core::array::from_fn(|_| f16::from_bits(rng.next_u64() as u16));
        let mut a = t;
        portable::transpose(&mut a);
        portable::transpose(&mut a);
        prop_assert!(a.iter().zip(&t).all(|(x, y)| x.to_bits() == y.to_bits()));
        let (mut b, mut c) = (t, t);
        portable::weight_from_rows(&mut b);
        portable::transpose(&mut c);
        portable::weight_from_cols(&mut c);
        prop_assert!(b.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
