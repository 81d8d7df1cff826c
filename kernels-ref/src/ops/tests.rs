use super::*;
use crate::quant::{dequantize_vec, quantize};
use crate::testutil::Rng;
use crate::{GgmlType, RefError};

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn matvec_f32_by_hand() {
    // W = [[1, 2, 3], [4, 5, 6]], x = [1, 0, -1] -> y = [-2, -2]
    let w = quantize(GgmlType::F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let mut y = [f32::NAN; 2];
    matvec(GgmlType::F32, &w, 2, 3, &[1.0, 0.0, -1.0], &mut y).unwrap();
    assert_eq!(y, [-2.0, -2.0]);
}

fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    if crate::quant::can_quantize(ty) {
        return quantize(ty, &rng.weights(rows * cols)).unwrap();
    }
    // Formats without a quantizer: random bytes with every f16 field set to a small scale.
    let mut b = rng.bytes(ty.row_bytes((rows * cols) as u64).unwrap() as usize);
    let offs: &[usize] = match ty {
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ4_NL => &[0],
        _ => &[],
    };
    for blk in b.chunks_mut(ty.type_size()) {
        for &o in offs {
            blk[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    b
}

#[test]
fn matvec_and_matmul_equal_dequantize_then_dot() {
    let mut rng = Rng::new(1);
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_supported()) {
        let (rows, cols, n) = (5, 2 * 256, 3);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let wf = dequantize_vec(ty, &w, rows * cols).unwrap(); // [rows, cols]
        let x = rng.weights(n * cols); // [n, cols]
        let mut y = vec![f32::NAN; n * rows]; // [n, rows]
        matmul(ty, &w, rows, cols, &x, n, &mut y).unwrap();
        for t in 0..n {
            let mut yv = vec![f32::NAN; rows];
            matvec(ty, &w, rows, cols, &x[t * cols..(t + 1) * cols], &mut yv).unwrap();
            for r in 0..rows {
                let mut want = 0.0f64;
                for c in 0..cols {
                    want += f64::from(wf[r * cols + c]) * f64::from(x[t * cols + c]);
                }
                assert_eq!(yv[r], want as f32, "{ty} matvec row {r}");
                assert_eq!(y[t * rows + r], want as f32, "{ty} matmul ({t}, {r})");
            }
        }
    }
}

#[test]
fn matvec_rejects_bad_shapes() {
    let w = quantize(GgmlType::Q8_0, &[0.5; 64]).unwrap(); // [2, 32]
    let mut y = [0.0; 2];
    assert!(matches!(
        matvec(GgmlType::Q8_0, &w, 2, 32, &[0.0; 31], &mut y),
        Err(RefError::ShapeMismatch { what: "x", .. })
    ));
    assert!(matches!(
        matvec(GgmlType::Q8_0, &w, 3, 32, &[0.0; 32], &mut [0.0; 3]),
        Err(RefError::BadLength { .. })
    ));
    assert!(matches!(
        matvec(GgmlType::Q8_0, &w, 2, 32, &[0.0; 32], &mut [0.0; 1]),
        Err(RefError::ShapeMismatch { what: "y", .. })
    ));
    assert!(matches!(
        matvec(GgmlType::Q8_0, &w, 4, 16, &[0.0; 16], &mut [0.0; 4]),
        Err(RefError::BadLength { .. })
    ));
    assert!(matches!(
        matmul(GgmlType::Q8_0, &w, 2, 32, &[0.0; 64], 3, &mut [0.0; 6]),
        Err(RefError::ShapeMismatch { what: "x", .. })
    ));
    assert!(matches!(
        matvec(GgmlType::MXFP4, &[0; 17], 1, 32, &[0.0; 32], &mut [0.0; 1]),
        Err(RefError::Unsupported(GgmlType::MXFP4))
    ));
}

#[test]
fn embedding_picks_rows() {
    let mut rng = Rng::new(2);
    let table = rng.weights(4 * 64); // [4, 64]
    let q = quantize(GgmlType::Q8_0, &table).unwrap();
    let all = dequantize_vec(GgmlType::Q8_0, &q, 4 * 64).unwrap();
    let mut out = vec![f32::NAN; 64];
    embedding(GgmlType::Q8_0, &q, 64, 2, &mut out).unwrap();
    assert_eq!(out, all[128..192].to_vec());
    assert_eq!(
        embedding(GgmlType::Q8_0, &q, 64, 4, &mut out),
        Err(RefError::RowOutOfRange { row: 4, n_rows: 4 })
    );
    assert!(matches!(
        embedding(GgmlType::Q8_0, &q[..100], 64, 0, &mut out),
        Err(RefError::BadLength { .. })
    ));
    assert!(matches!(
        embedding(GgmlType::Q8_0, &q, 64, 0, &mut out[..32]),
        Err(RefError::ShapeMismatch { .. })
    ));
}

#[test]
fn rms_norm_by_hand() {
    // Row [3, 4]: mean of squares 12.5, so out = [3, 4] / sqrt(12.5) * [1, 2].
    let mut out = [0.0f32; 4];
    rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 0.0, &mut out);
    let r = 12.5f64.sqrt();
    assert_eq!(out[0], (3.0 / r) as f32);
    assert_eq!(out[1], (8.0 / r) as f32);
    // An all-zero row with eps > 0 stays zero (no NaN).
    rms_norm(&[0.0, 0.0], &[1.0, 1.0], 1e-5, &mut out[..2]);
    assert_eq!(&out[..2], &[0.0, 0.0]);
    // eps enters under the root: [1, 1] with eps 3 -> 1 / sqrt(1 + 3) = 0.5.
    rms_norm(&[1.0, 1.0], &[1.0, 1.0], 3.0, &mut out[..2]);
    assert_eq!(&out[..2], &[0.5, 0.5]);
}

#[test]
#[should_panic(expected = "rms_norm")]
fn rms_norm_panics_on_shape_mismatch() {
    rms_norm(&[1.0, 2.0, 3.0], &[1.0, 1.0], 0.0, &mut [0.0; 3]);
}

#[test]
fn rope_by_hand_and_properties() {
    // One head of dim 4, n_rot 2, pos 1: theta_0 = 1 rad on (0, 1); dims 2, 3 untouched.
    let mut x = [1.0f32, 0.0, 5.0, 6.0];
    rope(&mut x, 1, 4, 1, &Rotation::new(2, 10000.0, false));
    assert_eq!(x, [1f64.cos() as f32, 1f64.sin() as f32, 5.0, 6.0]);

    // n_rot 4, pos 3, base 100: pair 1 turns by 3 * 100^(-2/4) = 0.3 rad.
    let mut x = [0.0f32, 0.0, 2.0, 0.0];
    rope(&mut x, 1, 4, 3, &Rotation::new(4, 100.0, false));
    assert!(close(x[2], (2.0 * 0.3f64.cos()) as f32, 1e-6));
    assert!(close(x[3], (2.0 * 0.3f64.sin()) as f32, 1e-6));
    // Same with neox pairs: pair 1 is dims (1, 3).
    let mut x = [0.0f32, 2.0, 0.0, 0.0];
    rope(&mut x, 1, 4, 3, &Rotation::new(4, 100.0, true));
    assert!(close(x[1], (2.0 * 0.3f64.cos()) as f32, 1e-6));
    assert!(close(x[3], (2.0 * 0.3f64.sin()) as f32, 1e-6));
    // freq_scale 0.5 at pos 6 is pos 3 unscaled.
    let mut y = [0.0f32, 2.0, 0.0, 0.0];
    rope(&mut y, 1, 4, 6, &Rotation::new(4, 100.0, true).scaled(0.5));
    assert_eq!(x, y);

    let mut rng = Rng::new(3);
    let (n_heads, hd) = (3, 64);
    let x0 = rng.weights(n_heads * hd);
    for neox in [false, true] {
        // Position 0 is the identity.
        let mut x = x0.clone();
        rope(&mut x, n_heads, hd, 0, &Rotation::new(hd, 10000.0, neox));
        assert_eq!(x, x0);
        // Rotations preserve each head's norm, and compose: rope(a) then rope(b) = rope(a+b).
        let mut a = x0.clone();
        rope(&mut a, n_heads, hd, 17, &Rotation::new(48, 10000.0, neox));
        rope(&mut a, n_heads, hd, 25, &Rotation::new(48, 10000.0, neox));
        let mut b = x0.clone();
        rope(&mut b, n_heads, hd, 42, &Rotation::new(48, 10000.0, neox));
        for h in 0..n_heads {
            let n0: f32 = x0[h * hd..(h + 1) * hd].iter().map(|v| v * v).sum();
            let n1: f32 = b[h * hd..(h + 1) * hd].iter().map(|v| v * v).sum();
            assert!(close(n1, n0, 1e-5));
        }
        for (p, q) in a.iter().zip(&b) {
            assert!(close(*p, *q, 1e-5), "{p} vs {q}");
        }
        // Dims past n_rot are untouched.
        assert_eq!(b[48..64], x0[48..64]);
    }
}

#[test]
fn softmax_properties() {
    let mut x = [0.0f32, 2f32.ln()];
    softmax(&mut x);
    assert!(close(x[0], 1.0 / 3.0, 1e-7) && close(x[1], 2.0 / 3.0, 1e-7));
    // Large values do not overflow.
    let mut x = [1000.0f32, 1000.0, f32::NEG_INFINITY];
    softmax(&mut x);
    assert_eq!(x, [0.5, 0.5, 0.0]);
    let mut rng = Rng::new(4);
    let mut x = rng.weights(1000);
    softmax(&mut x);
    let s: f64 = x.iter().map(|&v| f64::from(v)).sum();
    assert!((s - 1.0).abs() < 1e-6, "sum {s}");
    assert!(x.iter().all(|&v| v >= 0.0));
    let mut empty: [f32; 0] = [];
    softmax(&mut empty);
}

#[test]
fn silu_swiglu_add_by_hand() {
    assert_eq!(silu(0.0), 0.0);
    assert!(close(silu(1.0), 0.731_058_6, 1e-7));
    assert!(close(silu(-1.0), -0.268_941_42, 1e-7));
    assert_eq!(silu(100.0), 100.0);
    assert!(silu(-200.0).abs() < 1e-40);
    let mut out = [0.0f32; 2];
    swiglu(&[1.0, 0.0], &[2.0, 5.0], &mut out);
    assert!(close(out[0], 2.0 * 0.731_058_6, 1e-7) && out[1] == 0.0);
    add(&[1.0, 2.0], &[0.5, -2.0], &mut out);
    assert_eq!(out, [1.5, 0.0]);
}

#[test]
fn gelu_geglu_softcap_by_hand() {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) at x = 1, -1, 3.
    assert_eq!(gelu_tanh(0.0), 0.0);
    assert!(close(gelu_tanh(1.0), 0.841_192, 1e-6));
    assert!(close(gelu_tanh(-1.0), -0.158_808, 1e-6));
    assert!(close(gelu_tanh(3.0), 2.996_363_8, 1e-6));
    assert_eq!(gelu_tanh(50.0), 50.0);
    // The far negative tail stays a tiny negative number, not a cancelled 0.
    let t = gelu_tanh(-10.0);
    assert!(t < 0.0 && t > -1e-30, "{t}");
    let mut out = [0.0f32; 2];
    geglu(&[1.0, -1.0], &[2.0, 3.0], &mut out);
    assert!(close(out[0], 2.0 * 0.841_192, 1e-6) && close(out[1], 3.0 * -0.158_808, 1e-6));
    let mut x = [0.0f32, 10.0, -1000.0, 1.0];
    softcap(&mut x, 30.0);
    assert_eq!(x[0], 0.0);
    assert!(close(x[1], 30.0 * (1.0f32 / 3.0).tanh(), 1e-6));
    assert!(close(x[2], -30.0, 1e-6));
    assert!(close(x[3], 0.999_63, 1e-5));
}

#[test]
fn attention_window_sees_the_last_keys_only() {
    let mut rng = Rng::new(7);
    let (n_head, n_kv_head, hd, n_kv) = (2, 1, 4, 9);
    let q = rng.weights(4 * n_head * hd); // 4 queries at positions 5..=8
    let k = rng.weights(n_kv * n_kv_head * hd);
    let v = rng.weights(n_kv * n_kv_head * hd);
    let run = |k: &[f32], v: &[f32], window| {
        let mut out = vec![f32::NAN; q.len()];
        let s = AttnScores::new(0.5).window(window);
        attention(&q, k, v, 4, n_kv, n_head, n_kv_head, hd, 5, s, &mut out);
        out
    };
    // A window as long as the context changes nothing.
    let full = run(&k, &v, None);
    assert_eq!(run(&k, &v, Some(9)), full);
    // A window of 1: each query returns its own position's value.
    let own = run(&k, &v, Some(1));
    for i in 0..4 {
        for h in 0..n_head {
            let o = &own[(i * n_head + h) * hd..][..hd];
            assert_eq!(o, &v[(5 + i) * hd..(6 + i) * hd]);
        }
    }
    // A window of 3: keys before position p - 2 do not matter to the query at p.
    let w3 = run(&k, &v, Some(3));
    let (mut k2, mut v2) = (k.clone(), v.clone());
    for t in k2[..5 * hd].iter_mut().chain(v2[..5 * hd].iter_mut()) {
        *t = 100.0;
    }
    // Query 2 (position 7) sees 5, 6, 7 only; query 0 (position 5) sees 3, 4 as well.
    let w3b = run(&k2, &v2, Some(3));
    assert_eq!(w3[2 * n_head * hd..], w3b[2 * n_head * hd..]);
    assert_ne!(w3[..n_head * hd], w3b[..n_head * hd]);
    assert_ne!(w3, full);
}

#[test]
fn attention_with_one_key_returns_v() {
    let mut rng = Rng::new(5);
    let (n_head, n_kv_head, hd) = (4, 2, 8);
    let q = rng.weights(n_head * hd);
    let k = rng.weights(n_kv_head * hd);
    let v = rng.weights(n_kv_head * hd);
    let mut out = vec![f32::NAN; n_head * hd];
    let s = AttnScores::new(0.35);
    attention(&q, &k, &v, 1, 1, n_head, n_kv_head, hd, 0, s, &mut out);
    // Heads 0, 1 use kv head 0; heads 2, 3 use kv head 1.
    for h in 0..n_head {
        assert_eq!(out[h * hd..(h + 1) * hd], v[(h / 2) * hd..(h / 2 + 1) * hd]);
    }
}

#[test]
fn attention_is_causal_and_matches_softmax_by_hand() {
    let mut rng = Rng::new(6);
    let (n_head, n_kv_head, hd, n_kv) = (2, 1, 4, 5);
    let q = rng.weights(3 * n_head * hd); // 3 queries at positions 2, 3, 4
    let k = rng.weights(n_kv * n_kv_head * hd);
    let v = rng.weights(n_kv * n_kv_head * hd);
    let scale = 0.5f32;
    let sc = AttnScores::new(scale);
    let mut out = vec![f32::NAN; q.len()];
    attention(&q, &k, &v, 3, n_kv, n_head, n_kv_head, hd, 2, sc, &mut out);

    // By hand with the public softmax: query i, head h sees keys 0..=2+i.
    for i in 0..3 {
        for h in 0..n_head {
            let qv = &q[(i * n_head + h) * hd..][..hd];
            let mut s: Vec<f32> = (0..=2 + i)
                .map(|j| dot_f64(qv, &k[j * hd..(j + 1) * hd]) as f32 * scale)
                .collect();
            softmax(&mut s);
            for d in 0..hd {
                let want: f32 = (0..=2 + i).map(|j| s[j] * v[j * hd + d]).sum();
                let got = out[(i * n_head + h) * hd + d];
                assert!(close(got, want, 1e-5), "q{i} h{h} d{d}: {got} vs {want}");
            }
        }
    }

    // Changing keys/values after position 2 must not change query 0 (position 2).
    let mut k2 = k.clone();
    let mut v2 = v.clone();
    for t in k2[3 * hd..].iter_mut().chain(v2[3 * hd..].iter_mut()) {
        *t = 100.0;
    }
    let mut out2 = vec![f32::NAN; q.len()];
    attention(
        &q, &k2, &v2, 3, n_kv, n_head, n_kv_head, hd, 2, sc, &mut out2,
    );
    assert_eq!(out[..n_head * hd], out2[..n_head * hd]);
    assert_ne!(out[n_head * hd..], out2[n_head * hd..]);

    // Processing the queries one at a time gives the same result.
    for i in 0..3 {
        let mut one = vec![f32::NAN; n_head * hd];
        let qi = &q[i * n_head * hd..(i + 1) * n_head * hd];
        attention(
            qi,
            &k[..(3 + i) * hd],
            &v[..(3 + i) * hd],
            1,
            3 + i,
            n_head,
            n_kv_head,
            hd,
            2 + i,
            sc,
            &mut one,
        );
        assert_eq!(one, out[i * n_head * hd..(i + 1) * n_head * hd]);
    }
}

#[test]
#[should_panic(expected = "has no key")]
fn attention_panics_when_a_query_has_no_key() {
    let mut out = [0.0f32; 2];
    let s = AttnScores::new(1.0);
    attention(
        &[0.0; 2], &[0.0; 2], &[0.0; 2], 1, 1, 1, 1, 2, 1, s, &mut out,
    );
}

#[test]
fn soft_capped_scores_match_softmax_by_hand() {
    let mut rng = Rng::new(8);
    let (n_head, hd, n_kv) = (1, 8, 6);
    let q = rng.weights(hd).iter().map(|v| v * 8.0).collect::<Vec<_>>();
    let k = rng.weights(n_kv * hd);
    let v = rng.weights(n_kv * hd);
    let (scale, cap) = (0.9f32, 0.75f32);
    let mut out = vec![f32::NAN; hd];
    let s = AttnScores::new(scale).softcap(Some(cap));
    attention(&q, &k, &v, 1, n_kv, n_head, 1, hd, n_kv - 1, s, &mut out);
    let mut p: Vec<f32> = (0..n_kv)
        .map(|j| {
            let s = dot_f64(&q, &k[j * hd..(j + 1) * hd]) as f32 * scale;
            cap * (s / cap).tanh()
        })
        .collect();
    assert!(p.iter().all(|s| s.abs() <= cap), "capped at {cap}");
    softmax(&mut p);
    for d in 0..hd {
        let want: f32 = (0..n_kv).map(|j| p[j] * v[j * hd + d]).sum();
        assert!(close(out[d], want, 1e-5), "d{d}: {} vs {want}", out[d]);
    }
    let mut plain = vec![f32::NAN; hd];
    let s = AttnScores::new(scale);
    attention(&q, &k, &v, 1, n_kv, n_head, 1, hd, n_kv - 1, s, &mut plain);
    assert_ne!(out, plain, "the cap bends these scores");
}
