//! memwall::cpu element-wise ops and attention against kernels-ref (f64 inside, rounded once).

mod common;

use common::{random_weights, Rng};
use kernels_ref::{AttnScores, Rotation};
use memwall::cpu;
use memwall::GgmlType;

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn assert_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            g.is_finite() && err <= rel * scale,
            "{what}[{i}]: got {g}, want {w}, err {err:e} > {:e}",
            rel * scale
        );
    }
}

#[test]
fn rms_norm_rows() {
    let mut rng = Rng::new(1);
    let (rows, n) = (3, 75);
    let x = rng.activations(rows * n);
    let g: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let mut out = vec![f32::NAN; rows * n];
    cpu::rms_norm(&x, &g, 1e-5, &mut out).unwrap();
    let mut want = vec![0f32; rows * n];
    kernels_ref::rms_norm(&x, &g, 1e-5, &mut want);
    let want = wide(&want);
    // Each output is x·scale·g with scale from a 75-term f32 sum: a few 1e-7 relative.
    assert_close(&out, &want, 2e-6, "rms_norm");
    assert!(cpu::rms_norm(&x, &g, 1e-5, &mut out[1..]).is_err());
}

#[test]
fn rope_normal_and_neox_with_partial_rotation() {
    let mut rng = Rng::new(2);
    let (nh, hd, n_tok, pos0) = (3, 16, 4, 1000);
    for neox in [false, true] {
        for (n_rot, fs) in [(16, 1.0), (8, 1.0), (16, 0.25)] {
            let x = rng.activations(n_tok * nh * hd);
            let mut got = x.clone();
            let r = Rotation::new(n_rot, 10000.0, neox).scaled(fs);
            cpu::rope_tokens(&mut got, n_tok, nh, hd, pos0, &r).unwrap();
            for t in 0..n_tok {
                let xt = &x[t * nh * hd..(t + 1) * nh * hd];
                let mut want = xt.to_vec();
                kernels_ref::rope(&mut want, nh, hd, pos0 + t, &r);
                let want = wide(&want);
                let g = &got[t * nh * hd..(t + 1) * nh * hd];
                // Angles up to ~1000 rad rounded to f32 cos/sin: ~1e-7 relative per term.
                assert_close(
                    g,
                    &want,
                    1e-6,
                    &format!("rope neox={neox} n_rot={n_rot} t={t}"),
                );
            }
            let mut one = x[..nh * hd].to_vec();
            cpu::rope(&mut one, nh, hd, pos0, &r).unwrap();
            assert_eq!(
                one,
                got[..nh * hd],
                "rope == rope_tokens for the first token"
            );
        }
    }
}

/// Llama 3's frequency factors as llama.cpp's converter computes them (conversion/llama.py,
/// rope_type "llama3": factor 8, low 1, high 4, original context 8192), for `n_rot` dims.
fn llama3_factors(n_rot: usize, base: f64) -> Vec<f32> {
    let (factor, low, high, old) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / n_rot as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

#[test]
fn rope_with_llama3_frequency_factors() {
    let mut rng = Rng::new(5);
    let (nh, hd, n_tok, pos0, base) = (2, 64, 3, 5000, 500000.0f32);
    let ff = llama3_factors(hd, base as f64);
    // Every branch of the converter's formula is present: unscaled, fully scaled, smoothed.
    assert!(ff.contains(&1.0) && ff.contains(&8.0));
    assert!(ff.iter().any(|&f| f > 1.0 && f < 8.0), "{ff:?}");
    for neox in [false, true] {
        let plain_r = Rotation::new(hd, base, neox);
        let r = plain_r.with_factors(Some(&ff));
        let x = rng.activations(n_tok * nh * hd);
        let mut got = x.clone();
        let mut cache = cpu::RopeCache::default();
        cpu::rope_tokens_cached(&mut cache, &mut got, n_tok, nh, hd, pos0, &r).unwrap();
        let mut plain = x.clone();
        cpu::rope_tokens(&mut plain, n_tok, nh, hd, pos0, &plain_r).unwrap();
        assert_ne!(got, plain, "the factors change the low-frequency pairs");
        for t in 0..n_tok {
            let mut want = x[t * nh * hd..(t + 1) * nh * hd].to_vec();
            kernels_ref::rope(&mut want, nh, hd, pos0 + t, &r);
            let g = &got[t * nh * hd..(t + 1) * nh * hd];
            assert_close(
                g,
                &wide(&want),
                1e-6,
                &format!("llama3 rope neox={neox} t={t}"),
            );
        }
        // A context shift by -delta with the same factors lands on the rotation at pos0 - delta.
        let delta = 1234;
        let mut shifted = got.clone();
        cpu::rope_shift(&mut shifted, n_tok, nh, hd, -delta, &r).unwrap();
        let mut direct = x.clone();
        let p = pos0 - delta as usize;
        cpu::rope_tokens(&mut direct, n_tok, nh, hd, p, &r).unwrap();
        assert_close(
            &shifted,
            &wide(&direct),
            1e-5,
            "shifted = rotated at the new position",
        );
    }
    let mut x = rng.activations(nh * hd);
    let short = Rotation::new(hd, base, false).with_factors(Some(&ff[1..]));
    let mut cache = cpu::RopeCache::default();
    let r = cpu::rope_tokens_cached(&mut cache, &mut x, 1, nh, hd, 0, &short);
    assert!(r.is_err(), "a factor list of the wrong length is an error");
}

/// Phi-3's rotation: 96 of 128 dims rotated (partial rotary), per-pair LongRoPE factors, and
/// the attention factor multiplying the rotated values only; a context shift afterwards moves
/// the angle without scaling twice.
#[test]
fn rope_with_longrope_factors_and_attention_factor() {
    let mut rng = Rng::new(6);
    let (nh, hd, n_rot, n_tok, pos0, base, mscale) = (3, 128, 96, 4, 700, 10000.0f32, 1.1902);
    let ff: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.7).collect();
    let x = rng.activations(n_tok * nh * hd);
    for neox in [false, true] {
        let r = Rotation {
            mscale,
            ..Rotation::new(n_rot, base, neox).with_factors(Some(&ff))
        };
        let rotate = |p0: usize| {
            let mut y = x.clone();
            cpu::rope_tokens(&mut y, n_tok, nh, hd, p0, &r).unwrap();
            y
        };
        let got = rotate(pos0);
        for t in 0..n_tok {
            let mut want = x[t * nh * hd..(t + 1) * nh * hd].to_vec();
            kernels_ref::rope(&mut want, nh, hd, pos0 + t, &r);
            let g = &got[t * nh * hd..(t + 1) * nh * hd];
            assert_close(
                g,
                &wide(&want),
                1e-6,
                &format!("longrope neox={neox} t={t}"),
            );
            // The dims past n_rot are untouched by both.
            for h in 0..nh {
                let (a, b) = (h * hd + n_rot, (h + 1) * hd);
                assert_eq!(g[a..b], x[t * nh * hd + a..t * nh * hd + b]);
            }
        }
        let mut shifted = got.clone();
        let delta = 300;
        cpu::rope_shift(&mut shifted, n_tok, nh, hd, -delta, &r).unwrap();
        let direct = rotate(pos0 - delta as usize);
        assert_close(&shifted, &wide(&direct), 1e-5, "shift keeps the scale");
    }
}

#[test]
fn softmax_swiglu_add() {
    let mut rng = Rng::new(3);
    let mut x = rng.activations(37);
    let mut want = x.clone();
    kernels_ref::softmax(&mut want);
    let want = wide(&want);
    cpu::softmax(&mut x);
    assert_close(&x, &want, 1e-6, "softmax");

    let g = rng.activations(41);
    let u = rng.activations(41);
    let mut out = vec![f32::NAN; 41];
    cpu::swiglu(&g, &u, &mut out).unwrap();
    let mut want = vec![0f32; 41];
    kernels_ref::swiglu(&g, &u, &mut want);
    let want = wide(&want);
    assert_close(&out, &want, 1e-6, "swiglu");
    cpu::add(&g, &u, &mut out).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| a as f64 + b as f64)
        .collect();
    assert_close(&out, &want, 1e-7, "add");
    assert!(cpu::add(&g, &u[1..], &mut out).is_err());
}

#[test]
fn embedding_rows_match_dequant() {
    let mut rng = Rng::new(4);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::Q3_K,
    ] {
        let (rows, n) = (5, 512);
        let data = random_weights(&mut rng, ty, rows, n);
        for r in [0, 3, 4] {
            let mut out = vec![f32::NAN; n];
            cpu::embedding(ty, &data, n, r, &mut out).unwrap();
            let mut want = vec![0f32; n];
            kernels_ref::embedding(ty, &data, n, r, &mut want).unwrap();
            let want = wide(&want);
            assert_close(&out, &want, 1e-6, &format!("embedding {ty} row {r}"));
        }
        let mut out = vec![0f32; n];
        assert!(
            cpu::embedding(ty, &data, n, rows, &mut out).is_err(),
            "row past the end"
        );
    }
}

#[test]
fn causal_gqa_attention_prefill_and_decode() {
    let mut rng = Rng::new(5);
    let (n_head, n_kv_head, hd) = (6, 2, 24);
    // (n_q, q_pos0, capacity): a prefill big enough to go parallel, a decode step, and a chunk
    // after earlier tokens; the cache has spare capacity past n_kv.
    // Each also with a sliding window shorter than the context.
    for (n_q, q_pos0, cap, window) in [
        (40, 0, 50, None),
        (1, 77, 90, None),
        (5, 11, 16, None),
        (40, 0, 50, Some(7)),
        (1, 77, 90, Some(30)),
        (5, 11, 16, Some(1)),
    ] {
        let n_kv = q_pos0 + n_q;
        let q = rng.activations(n_q * n_head * hd);
        let k = rng.activations(cap * n_kv_head * hd);
        let v = rng.activations(cap * n_kv_head * hd);
        let sc = AttnScores::new(1.0 / (hd as f32).sqrt()).window(window);
        let mut out = vec![f32::NAN; q.len()];
        cpu::attention(
            &q, &k, &v, n_q, n_kv, n_head, n_kv_head, hd, q_pos0, sc, &mut out,
        )
        .unwrap();
        let kv = n_kv * n_kv_head * hd; // kernels-ref takes exactly [n_kv, n_kv_head, hd]
        let mut want = vec![0f32; q.len()];
        kernels_ref::attention(
            &q,
            &k[..kv],
            &v[..kv],
            n_q,
            n_kv,
            n_head,
            n_kv_head,
            hd,
            q_pos0,
            sc,
            &mut want,
        );
        let want = wide(&want);
        // Outliers make scores up to ~1e3: exp of an f32 score rounded to ~1e-4 absolute
        // moves a weight by ~1e-4 relative, so the output by ~1e-4 of max|v|.
        assert_close(
            &out,
            &want,
            2e-4,
            &format!("attention n_q={n_q} q_pos0={q_pos0} window={window:?}"),
        );
    }
    let mut out = vec![0f32; 24];
    let q = vec![0f32; 24];
    let kv = vec![0f32; 2 * 24];
    assert!(
        cpu::attention(
            &q,
            &kv,
            &kv,
            1,
            3,
            1,
            1,
            24,
            2,
            AttnScores::new(1.0),
            &mut out
        )
        .is_err(),
        "k too short"
    );
}
