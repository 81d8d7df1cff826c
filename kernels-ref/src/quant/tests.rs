use super::kquants::{q3k_scales, scale_min_k4};
use super::*;
use crate::testutil::Rng;

const ONE: u16 = 0x3c00; // f16 1.0
const HALF: u16 = 0x3800; // f16 0.5
const MINUS_TWO: u16 = 0xc000; // f16 -2.0

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn deq(ty: GgmlType, b: &[u8]) -> Vec<f32> {
    let n = b.len() / ty.type_size() * ty.block_size();
    dequantize_vec(ty, b, n).unwrap()
}

#[test]
fn block_sizes_match_ggml_type_sizes() {
    fn check<B: Block>(ty: GgmlType) {
        assert_eq!(B::SIZE, ty.type_size(), "{ty}");
        assert_eq!(B::SIZE, std::mem::size_of::<B>(), "{ty}");
        assert_eq!(B::QK, ty.block_size(), "{ty}");
    }
    check::<BlockQ4_0>(GgmlType::Q4_0);
    check::<BlockQ4_1>(GgmlType::Q4_1);
    check::<BlockQ5_0>(GgmlType::Q5_0);
    check::<BlockQ5_1>(GgmlType::Q5_1);
    check::<BlockQ8_0>(GgmlType::Q8_0);
    check::<BlockQ2K>(GgmlType::Q2_K);
    check::<BlockQ3K>(GgmlType::Q3_K);
    check::<BlockQ4K>(GgmlType::Q4_K);
    check::<BlockQ5K>(GgmlType::Q5_K);
    check::<BlockQ6K>(GgmlType::Q6_K);
    check::<BlockTq1_0>(GgmlType::TQ1_0);
    check::<BlockTq2_0>(GgmlType::TQ2_0);
    check::<BlockIq4Nl>(GgmlType::IQ4_NL);
}

#[test]
fn float_formats_by_hand() {
    // 1.0, -2.0 in f16; 1.0 = 0x3f80 and -0.5 = 0xbf00 in bf16.
    assert_eq!(
        deq(GgmlType::F16, &[0x00, 0x3c, 0x00, 0xc0]),
        vec![1.0, -2.0]
    );
    assert_eq!(
        deq(GgmlType::BF16, &[0x80, 0x3f, 0x00, 0xbf]),
        vec![1.0, -0.5]
    );
    let f = [1.5f32.to_le_bytes(), (-3.25f32).to_le_bytes()].concat();
    assert_eq!(deq(GgmlType::F32, &f), vec![1.5, -3.25]);
    // bf16 rounding: exact ties go to the even mantissa, above-tie rounds up.
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    // NaN stays NaN (quiet), infinities stay infinities.
    assert!(bf16_to_f32(f32_to_bf16(f32::from_bits(0x7f80_0001))).is_nan());
    assert_eq!(bf16_to_f32(f32_to_bf16(f32::INFINITY)), f32::INFINITY);
}

#[test]
fn q8_0_by_hand() {
    let mut b = vec![0u8; 34];
    put16(&mut b, 0, HALF);
    b[2] = (-3i8) as u8;
    b[3] = 5;
    b[33] = 127;
    let y = deq(GgmlType::Q8_0, &b);
    assert_eq!((y[0], y[1], y[2], y[31]), (-1.5, 2.5, 0.0, 63.5));
}

#[test]
fn q4_0_and_iq4_nl_nibble_order() {
    let mut b = vec![0u8; 18];
    put16(&mut b, 0, HALF);
    b[2] = 0x1f; // element 0 = 15, element 16 = 1
    b[2 + 15] = 0x80; // element 15 = 0, element 31 = 8
    let y = deq(GgmlType::Q4_0, &b);
    assert_eq!(
        (y[0], y[16], y[15], y[31], y[1]),
        (3.5, -3.5, -4.0, 0.0, -4.0)
    );
    let y = deq(GgmlType::IQ4_NL, &b);
    assert_eq!(
        (y[0], y[16], y[15], y[31], y[1]),
        (56.5, -52.0, -63.5, 0.5, -63.5)
    );
}

#[test]
fn q4_1_by_hand() {
    let mut b = vec![0u8; 20];
    put16(&mut b, 0, ONE);
    put16(&mut b, 2, MINUS_TWO);
    b[4 + 3] = 0x52; // element 3 = 2, element 19 = 5
    let y = deq(GgmlType::Q4_1, &b);
    assert_eq!((y[3], y[19], y[0]), (0.0, 3.0, -2.0));
}

#[test]
fn q5_by_hand() {
    // qh bit 0 and bit 17 set; element 17 has low nibble 0x3 (high nibble of qs[1]).
    let mut b = vec![0u8; 22];
    put16(&mut b, 0, ONE);
    b[2..6].copy_from_slice(&((1u32 << 0) | (1u32 << 17)).to_le_bytes());
    b[6 + 1] = 0x30;
    let y = deq(GgmlType::Q5_0, &b);
    assert_eq!((y[0], y[17], y[1], y[16]), (0.0, 3.0, -16.0, -16.0));

    let mut b = vec![0u8; 24];
    put16(&mut b, 0, HALF);
    put16(&mut b, 2, ONE);
    b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    b[8 + 15] = 0xf0; // element 31 = 15 | 16 = 31
    let y = deq(GgmlType::Q5_1, &b);
    assert_eq!((y[31], y[15], y[0]), (16.5, 1.0, 1.0));
}

#[test]
fn q2_k_by_hand() {
    let mut b = vec![0u8; 84];
    b[0] = 0x21; // sub-block 0: scale 1, min 2
    b[2] = 0x13; // sub-block 2: scale 3, min 1
    b[4] = 0x02; // sub-block 4: scale 2, min 0
    b[6] = 0x10; // sub-block 6: scale 0, min 1
    b[8] = 0x01; // sub-block 8: scale 1, min 0
    b[16] = 0b11_10_01_00; // elements 0, 32, 64, 96 = 0, 1, 2, 3
    b[16 + 32] = 0x03; // element 128 = 3
    put16(&mut b, 80, ONE);
    put16(&mut b, 82, HALF);
    let y = deq(GgmlType::Q2_K, &b);
    assert_eq!(
        (y[0], y[1], y[32], y[64], y[96], y[128]),
        (-1.0, -1.0, 2.5, 4.0, -0.5, 3.0)
    );
}

#[test]
fn q3_k_scale_unpacking_and_values() {
    // Scale j: low nibble from byte j % 8 (nibble j / 8), high 2 bits from byte 8 + j % 4
    // (field j / 4). Give every scale a distinct 6-bit value and pack it by that rule.
    let want: Vec<u8> = (0..16u8).map(|j| (j * 7 + 3) & 63).collect();
    let mut s = [0u8; 12];
    for (j, &v) in want.iter().enumerate() {
        s[j % 8] |= (v & 0x0f) << (4 * (j / 8));
        s[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
    }
    assert_eq!(q3k_scales(&s).to_vec(), want);

    let mut b = vec![0u8; 110];
    b[96] = 0x01; // scale 0 low nibble 1
    b[96 + 8] = 0x02; // scale 0 high bits 2 -> 33 -> +1
    b[96 + 9] = 0x30; // scale 9 high bits 3 (field 9 / 4 = 2), scale 1 high bits 0
    b[96 + 1] = 0x50; // scale 9 low nibble 5 -> 53 -> +21; scale 1 -> 0 -> -32
    b[32] = 0x03; // element 0 low bits 3
    b[0] = 0x01; // hmask[0] bit 0: element 0 high bit set (no -4)
    b[32 + 48] = 0x02; // element 144 (half 1, l 16) low bits 2
    b[16] = 0x10; // hmask[16] bit 4: element 144 high bit set; bit 0 clear for element 16
    put16(&mut b, 108, ONE);
    let y = deq(GgmlType::Q3_K, &b);
    assert_eq!((y[0], y[1], y[16], y[144]), (3.0, -4.0, 128.0, 42.0));
}

#[test]
fn q4_k_q5_k_by_hand() {
    let mut q = [0u8; 12];
    q[0] = 0x02; // sc0 = 2
    q[4] = 0x03; // m0 = 3
    q[1] = 0xc0; // sc1 = 0, top bits 3 go to sc5
    q[5] = 0x40; // m1 = 0, top bits 1 go to m5
    q[9] = 0x21; // sc5 low nibble 1, m5 low nibble 2
    assert_eq!(scale_min_k4(0, &q), (2, 3));
    assert_eq!(scale_min_k4(1, &q), (0, 0));
    assert_eq!(scale_min_k4(5, &q), (49, 18));

    let mut b = vec![0u8; 144];
    put16(&mut b, 0, ONE);
    put16(&mut b, 2, HALF);
    b[4..16].copy_from_slice(&q);
    b[16] = 0x07; // element 0 = 7 (sub 0); element 32 = 0 (sub 1)
    b[16 + 69] = 0xa0; // element 165 (chunk 2, high nibble, l 5) = 10 (sub 5)
    let y = deq(GgmlType::Q4_K, &b);
    assert_eq!((y[0], y[32], y[165], y[5]), (12.5, 0.0, 481.0, -1.5));

    let mut b = vec![0u8; 176];
    put16(&mut b, 0, ONE);
    put16(&mut b, 2, HALF);
    b[4..16].copy_from_slice(&q);
    b[16] = 0x01; // qh[0] bit 0: element 0 gets +16
    b[16 + 5] = 0x20; // qh[5] bit 5: element 165 (sub 5) gets +16
    b[48] = 0x07;
    b[48 + 69] = 0xa0;
    let y = deq(GgmlType::Q5_K, &b);
    assert_eq!((y[0], y[165], y[37]), (44.5, 1265.0, 0.0));
}

#[test]
fn q6_k_by_hand() {
    let mut b = vec![0u8; 210];
    b[5] = 0x90; // element 69 low bits 9 (high nibble of ql[5])
    b[128 + 5] = 0x20; // element 69 high bits 2 (field 2 of qh[5])
    b[192 + 4] = (-2i8) as u8; // scale of elements 64..80
    b[192] = 1; // scale of elements 0..16
    b[72] = 0x30; // element 200: ql[64 + 8] high nibble 3
    b[128 + 40] = 0x30; // element 200: field 2 of qh[32 + 8] = 3
    b[192 + 12] = 3;
    b[104] = 0x50; // element 232: ql[64 + 32 + 8] high nibble 5, qh field 3 = 0
    b[192 + 14] = 1;
    put16(&mut b, 208, ONE);
    let y = deq(GgmlType::Q6_K, &b);
    assert_eq!((y[69], y[0], y[200], y[232]), (-18.0, -32.0, 57.0, -27.0));
}

#[test]
fn ternary_by_hand() {
    let mut b = vec![0u8; 66];
    b[0] = 0b10_00_01_10; // elements 0, 32, 64, 96 = 1, 0, -1, 1
    b[32] = 0x01; // element 128 = 0
    put16(&mut b, 64, HALF);
    let y = deq(GgmlType::TQ2_0, &b);
    assert_eq!(
        (y[0], y[32], y[64], y[96], y[128], y[1]),
        (0.5, 0.0, -0.5, 0.5, 0.0, -0.5)
    );

    // Digits 2,1,0,1,2 -> v = 194 -> ceil(194 * 256 / 243) = 205.
    let mut b = vec![0u8; 54];
    b[0] = 205;
    b[48] = 205; // qh[0]: elements 240, 244, 248, 252
    put16(&mut b, 52, ONE);
    let y = deq(GgmlType::TQ1_0, &b);
    assert_eq!(
        (y[0], y[32], y[64], y[96], y[128]),
        (1.0, 0.0, -1.0, 0.0, 1.0)
    );
    assert_eq!((y[240], y[244], y[248], y[252]), (1.0, 0.0, -1.0, 0.0));
    assert_eq!(y[1], -1.0); // byte 0 is all digits 0, which is -1
}

#[test]
fn tq1_0_packing_covers_every_digit_combination() {
    for v in 0..243u16 {
        let digits: Vec<u8> = (0..5)
            .rev()
            .map(|k| ((v / 3u16.pow(k)) % 3) as u8)
            .collect();
        let mut x = vec![0.0f32; 256];
        // Put the 5 digits of this combination at elements 0, 32, 64, 96, 128 (byte 0) and
        // the first 4 at 240, 244, 248, 252 (qh byte 0); the rest stay at 0 (digit 1).
        for (n, &t) in digits.iter().enumerate() {
            x[32 * n] = f32::from(t) - 1.0;
            if n < 4 {
                x[240 + 4 * n] = f32::from(t) - 1.0;
            }
        }
        x[1] = 1.0; // keep amax = 1 even for an all-zero combination
        let y = dequantize_vec(
            GgmlType::TQ1_0,
            &quantize(GgmlType::TQ1_0, &x).unwrap(),
            256,
        )
        .unwrap();
        assert_eq!(y, x, "digits {digits:?}");
    }
}

/// Largest |x - y| over a slice.
fn max_err(x: &[f32], y: &[f32]) -> f32 {
    x.iter()
        .zip(y)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
}

#[test]
fn quantizers_round_trip_within_their_step() {
    let mut rng = Rng::new(7);
    let x = rng.weights(32 * 256);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let q = quantize(ty, &x).unwrap();
        assert_eq!(q.len(), ty.type_size() * x.len() / 32);
        let y = dequantize_vec(ty, &q, x.len()).unwrap();
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (lo, hi) = xb
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            // One quantization step (half a step of rounding, but the symmetric 4/5-bit
            // formats clip the far end by one step), plus the f16 rounding of the scale and
            // min (relative 2^-11 of the largest value they produce).
            let step = match ty {
                GgmlType::Q8_0 => amax / 127.0 * 0.5,
                GgmlType::Q4_0 => amax / 8.0,
                GgmlType::Q5_0 => amax / 16.0,
                GgmlType::Q4_1 => (hi - lo) / 15.0 * 0.5,
                _ => (hi - lo) / 31.0 * 0.5,
            };
            let bound = step * 1.0001 + (amax + lo.abs()) * 2f32.powi(-10);
            let e = max_err(xb, yb);
            assert!(e <= bound, "{ty}: block error {e} > {bound}");
        }
        // Quantizing the dequantized values again gives the same bytes.
        assert_eq!(quantize(ty, &y).unwrap(), q, "{ty} is not idempotent");
    }
}

#[test]
fn float_quantizers_round_trip_exactly_representable_values() {
    let mut rng = Rng::new(8);
    let x = rng.weights(1000);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let y = dequantize_vec(ty, &quantize(ty, &x).unwrap(), x.len()).unwrap();
        let z = dequantize_vec(ty, &quantize(ty, &y).unwrap(), x.len()).unwrap();
        assert_eq!(y, z, "{ty}");
        let rel = match ty {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => 2f32.powi(-11),
            _ => 2f32.powi(-8),
        };
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= a.abs() * rel, "{ty}: {a} -> {b}");
        }
    }
}

#[test]
fn all_zero_blocks_quantize_to_zero() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
    ] {
        let x = vec![0.0f32; 256];
        let y = dequantize_vec(ty, &quantize(ty, &x).unwrap(), 256).unwrap();
        assert_eq!(y, x, "{ty}");
    }
}

#[test]
fn ternary_quantizers_round_to_nearest_third() {
    let mut rng = Rng::new(9);
    let x = rng.weights(512);
    for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0] {
        let y = dequantize_vec(ty, &quantize(ty, &x).unwrap(), 512).unwrap();
        for (xb, yb) in x.chunks(256).zip(y.chunks(256)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = f16_to_f32(f32_to_f16(amax));
            for (&a, &b) in xb.iter().zip(yb) {
                let want = (a / amax).round() * d;
                assert_eq!(b, want, "{ty}: {a}");
            }
        }
    }
}

#[test]
fn bad_lengths_and_types_are_errors() {
    let mut out = vec![0.0f32; 32];
    assert_eq!(
        dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out),
        Err(RefError::BadLength {
            ty: GgmlType::Q4_0,
            n_elements: 32,
            n_bytes: 17
        })
    );
    let mut out = vec![0.0f32; 33];
    assert!(matches!(
        dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out),
        Err(RefError::BadLength { .. })
    ));
    assert_eq!(
        dequantize_vec(GgmlType::IQ2_XXS, &[0u8; 66], 256),
        Err(RefError::Unsupported(GgmlType::IQ2_XXS))
    );
    assert!(matches!(
        dequantize_vec(GgmlType::Q8_0, &[0u8; 34], usize::MAX),
        Err(RefError::BadLength { .. })
    ));
    assert_eq!(
        quantize(GgmlType::Q4_K, &[0.0; 256]),
        Err(RefError::Unsupported(GgmlType::Q4_K))
    );
    assert!(matches!(
        quantize(GgmlType::Q8_0, &[0.0; 31]),
        Err(RefError::PartialBlock {
            ty: GgmlType::Q8_0,
            n_elements: 31
        })
    ));
    // Every type is_supported lists is dequantized (no Unsupported for them).
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_supported()) {
        let n = ty.block_size() * 2;
        let bytes = vec![0u8; ty.type_size() * 2];
        assert!(dequantize_vec(ty, &bytes, n).is_ok(), "{ty}");
    }
    let e = RefError::BadLength {
        ty: GgmlType::Q4_0,
        n_elements: 3,
        n_bytes: 5,
    };
    assert!(e
        .to_string()
        .contains("5 bytes cannot hold 3 elements of type Q4_0"));
}

#[test]
fn k_quants_random_bytes_decode_finite() {
    // Random quants under sane f16 scales must decode to finite values bounded by the scales.
    let mut rng = Rng::new(10);
    for (ty, d_offsets) in [
        (GgmlType::Q2_K, vec![80, 82]),
        (GgmlType::Q3_K, vec![108]),
        (GgmlType::Q4_K, vec![0, 2]),
        (GgmlType::Q5_K, vec![0, 2]),
        (GgmlType::Q6_K, vec![208]),
    ] {
        let mut b = rng.bytes(ty.type_size() * 4);
        for blk in b.chunks_mut(ty.type_size()) {
            for &off in &d_offsets {
                put16(blk, off, 0x2000); // 2^-7
            }
        }
        let y = deq(ty, &b);
        // Largest |scale * q| + |min| any of these formats can make, times d = 2^-7.
        let bound = (63.0 * 63.0 + 63.0 * 31.0) / 128.0;
        assert!(y.iter().all(|v| v.is_finite() && v.abs() <= bound), "{ty}");
    }
}
