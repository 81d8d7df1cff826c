//! memwall::cpu element-wise ops and attention against straightforward f64 versions.

mod common;

use common::{random_weights, refdq, Rng};
use memwall::cpu;
use memwall::GgmlType;

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
    let mut want = vec![0f64; rows * n];
    for r in 0..rows {
        let xr = &x[r * n..(r + 1) * n];
        let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            want[r * n + i] = xr[i] as f64 / (ms + 1e-5).sqrt() * g[i] as f64;
        }
    }
    // Each output is x·scale·g with scale from a 75-term f32 sum: a few 1e-7 relative.
    assert_close(&out, &want, 2e-6, "rms_norm");
    assert!(cpu::rms_norm(&x, &g, 1e-5, &mut out[1..]).is_err());
}

fn rope_f64(
    x: &[f32],
    n_heads: usize,
    hd: usize,
    n_rot: usize,
    pos: usize,
    base: f64,
    neox: bool,
) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for h in 0..n_heads {
        for i in 0..n_rot / 2 {
            let theta = pos as f64 * base.powf(-2.0 * i as f64 / n_rot as f64);
            let (a, b) = if neox {
                (i, i + n_rot / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (x[h * hd + a] as f64, x[h * hd + b] as f64);
            y[h * hd + a] = x0 * theta.cos() - x1 * theta.sin();
            y[h * hd + b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
    y
}

#[test]
fn rope_normal_and_neox_with_partial_rotation() {
    let mut rng = Rng::new(2);
    let (nh, hd, n_tok, pos0) = (3, 16, 4, 1000);
    for neox in [false, true] {
        for n_rot in [16, 8] {
            let x = rng.activations(n_tok * nh * hd);
            let mut got = x.clone();
            cpu::rope_tokens(&mut got, n_tok, nh, hd, n_rot, pos0, 10000.0, 1.0, neox).unwrap();
            for t in 0..n_tok {
                let xt = &x[t * nh * hd..(t + 1) * nh * hd];
                let want = rope_f64(xt, nh, hd, n_rot, pos0 + t, 10000.0, neox);
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
            cpu::rope(&mut one, nh, hd, n_rot, pos0, 10000.0, 1.0, neox).unwrap();
            assert_eq!(
                one,
                got[..nh * hd],
                "rope == rope_tokens for the first token"
            );
        }
    }
}

#[test]
fn softmax_swiglu_add() {
    let mut rng = Rng::new(3);
    let mut x = rng.activations(37);
    let m = x.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
    let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|v| v / s).collect();
    cpu::softmax(&mut x);
    assert_close(&x, &want, 1e-6, "softmax");

    let g = rng.activations(41);
    let u = rng.activations(41);
    let mut out = vec![f32::NAN; 41];
    cpu::swiglu(&g, &u, &mut out).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| a as f64 / (1.0 + (-(a as f64)).exp()) * b as f64)
        .collect();
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
        let all = refdq::dequant(ty, &data);
        for r in [0, 3, 4] {
            let mut out = vec![f32::NAN; n];
            cpu::embedding(ty, &data, n, r, &mut out).unwrap();
            let want: Vec<f64> = all[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
            assert_close(&out, &want, 1e-6, &format!("embedding {ty} row {r}"));
        }
        let mut out = vec![0f32; n];
        assert!(
            cpu::embedding(ty, &data, n, rows, &mut out).is_err(),
            "row past the end"
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_q: usize,
    n_head: usize,
    n_kv_head: usize,
    hd: usize,
    q_pos0: usize,
    scale: f32,
) -> Vec<f64> {
    let mut out = vec![0f64; n_q * n_head * hd];
    let group = n_head / n_kv_head;
    for i in 0..n_q {
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[(i * n_head + h) * hd..][..hd];
            let n = q_pos0 + i + 1;
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    let kj = &k[(j * n_kv_head + g) * hd..][..hd];
                    scale as f64
                        * qh.iter()
                            .zip(kj)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().fold(f64::MIN, |a, &b| a.max(b));
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                let vj = &v[(j * n_kv_head + g) * hd..][..hd];
                for d in 0..hd {
                    out[(i * n_head + h) * hd + d] += ej / z * vj[d] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn causal_gqa_attention_prefill_and_decode() {
    let mut rng = Rng::new(5);
    let (n_head, n_kv_head, hd) = (6, 2, 24);
    // (n_q, q_pos0, capacity): a prefill big enough to go parallel, a decode step, and a chunk
    // after earlier tokens; the cache has spare capacity past n_kv.
    for (n_q, q_pos0, cap) in [(40, 0, 50), (1, 77, 90), (5, 11, 16)] {
        let n_kv = q_pos0 + n_q;
        let q = rng.activations(n_q * n_head * hd);
        let k = rng.activations(cap * n_kv_head * hd);
        let v = rng.activations(cap * n_kv_head * hd);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![f32::NAN; q.len()];
        cpu::attention(
            &q, &k, &v, n_q, n_kv, n_head, n_kv_head, hd, q_pos0, scale, &mut out,
        )
        .unwrap();
        let want = attention_f64(&q, &k, &v, n_q, n_head, n_kv_head, hd, q_pos0, scale);
        // Outliers make scores up to ~1e3: exp of an f32 score rounded to ~1e-4 absolute
        // moves a weight by ~1e-4 relative, so the output by ~1e-4 of max|v|.
        assert_close(
            &out,
            &want,
            2e-4,
            &format!("attention n_q={n_q} q_pos0={q_pos0}"),
        );
    }
    let mut out = vec![0f32; 24];
    let q = vec![0f32; 24];
    let kv = vec![0f32; 2 * 24];
    assert!(
        cpu::attention(&q, &kv, &kv, 1, 3, 1, 1, 24, 2, 1.0, &mut out).is_err(),
        "k too short"
    );
}
