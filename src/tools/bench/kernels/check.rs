//! The correctness column of `memwall bench-kernels`: every result against kernels-ref's
//! dequantization and an f64 matvec, under a tolerance derived the way the kernel tests derive
//! theirs (src/gpu/health/selftest/checks*.rs), so a row is "ok" exactly when the selftest's rule
//! would pass it.

use crate::cpu::act::QAct;
use crate::error::{Error, Result};
use crate::gpu::health::selftest::checks::{f16_weight_err, oracle};
use crate::gpu::health::selftest::U;
use crate::gpu::registry::{KernelKey, WeightFormat};

/// f16 unit roundoff relative to the value (10 fraction bits): native-f16 weights may be up
/// to this much larger, as in the selftest's matvec bound.
const F16_ULP: f64 = 1.0 / (1u32 << 10) as f64;

/// The exact products of one weight matrix with a few activation rows, and the per-row sums
/// the tolerances are made of. Computed once per (format, shape) and shared by its variants.
pub struct Reference {
    /// Token rows of `x` that have a reference (0 always: the matvec's input).
    pub tokens: Vec<usize>,
    /// Per checked token: `[rows]` exact (f64) `sum_c w[r][c] x[t][c]` of the dequantized
    /// weights.
    pub want: Vec<Vec<f64>>,
    /// Per checked token: `[rows]` `sum_c |w x|`.
    pub abs: Vec<Vec<f64>>,
    /// Token 0, `[rows]`: `sum_c e_f16(w) |x|`, the native-f16 decoding error bound (None for
    /// formats without an f16 variant).
    pub f16_dec: Option<Vec<f64>>,
    /// Per checked token, `[rows]`, formats with the integer path: (`S`, `Q`) with
    /// `S = sum_c (|w| + 2|c_blk|) (|x| + d_x)` (the selftest's matvec_q8 rounding bound) and
    /// `Q = sum_c |w| d_x / 2` (the activation quantization error: `|x - d_x q| <= d_x / 2`).
    pub q8: Option<Vec<(Vec<f64>, Vec<f64>)>>,
}

impl Reference {
    /// The reference for `data` (`[rows, cols]` in `ty`, ggml layout) and `x`
    /// (`[n, cols]` f32), checking tokens 0 and `n - 1`.
    pub fn new(
        ty: WeightFormat,
        data: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        n: usize,
    ) -> Result<Reference> {
        if n == 0 || x.len() != n * cols {
            return Err(Error::InvalidArgument(format!(
                "reference of [{rows}, {cols}] with {} activations for {n} tokens",
                x.len()
            )));
        }
        // [rows * cols] f32 weights as kernels-ref decodes them.
        let wd = oracle(kernels_ref::dequantize_vec(ty.ggml(), data, rows * cols))?;
        let mut tokens = vec![0];
        if n > 1 {
            tokens.push(n - 1);
        }
        let (mut want, mut abs) = (Vec::new(), Vec::new());
        for &t in &tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            let (w, a): (Vec<f64>, Vec<f64>) = wd
                .chunks_exact(cols)
                .map(|row| {
                    row.iter().zip(xt).fold((0.0, 0.0), |(s, a), (&w, &v)| {
                        let p = f64::from(w) * f64::from(v);
                        (s + p, a + p.abs())
                    })
                })
                .unzip();
            want.push(w);
            abs.push(a);
        }
        let x0 = &x[..cols];
        let f16_dec = if ty.has_f16_variant() {
            let key = KernelKey::Matvec {
                ty,
                subgroup: false,
                f16: true,
            };
            let we = f16_weight_err(&key, ty, data, &wd, cols); // [rows * cols]
            Some(
                we.chunks_exact(cols)
                    .map(|row| {
                        row.iter()
                            .zip(x0)
                            .map(|(e, &v)| e * f64::from(v).abs())
                            .sum()
                    })
                    .collect(),
            )
        } else {
            None
        };
        let q8 = if ty.has_q8_path() && cols.is_multiple_of(32) {
            let bounds = |xt: &[f32]| {
                let mut qa = QAct::default();
                qa.quantize_scalar(xt, 1, cols);
                let (mut s, mut q) = (vec![0.0; rows], vec![0.0; rows]);
                for r in 0..rows {
                    for c in 0..cols {
                        let dx = f64::from(qa.d[c / 32]);
                        let w = f64::from(wd[r * cols + c]).abs();
                        let off = crate::gpu::health::selftest::checks_q8::block_offset(
                            ty,
                            data,
                            (r * cols + c) / 32,
                        );
                        s[r] += (w + 2.0 * off) * (f64::from(xt[c]).abs() + dx);
                        q[r] += w * dx / 2.0;
                    }
                }
                (s, q)
            };
            Some(
                tokens
                    .iter()
                    .map(|&t| bounds(&x[t * cols..(t + 1) * cols]))
                    .collect(),
            )
        } else {
            None
        };
        Ok(Reference {
            tokens,
            want,
            abs,
            f16_dec,
            q8,
        })
    }

    /// The tolerance of row `r` of checked token `i` for a result of `key` (a matvec-family
    /// or matmul key; `cols` the reduction length):
    /// - f32 activations: `(cols + 2) u sum|w x|` (Higham's gamma for any summation order,
    ///   plus the products' and the result's roundings), widened by the f16 weights' error
    ///   for a native-f16 decoder (as the selftest's matvec check);
    /// - 8-bit activations: the selftest's integer-path rounding bound `2 (cols/32 + 8) u S`
    ///   plus the activation quantization error `sum |w| d_x / 2` (the reference here is the
    ///   exact product of the unquantized activations).
    pub fn tol(&self, key: &KernelKey, i: usize, r: usize, cols: usize) -> f64 {
        let abs = self.abs[i][r];
        let base = (cols as f64 + 2.0) * U * abs;
        let t = match key {
            KernelKey::Matvec { f16: true, .. } => {
                base * (1.0 + 2.0 * F16_ULP) + self.f16_dec.as_ref().map_or(f64::INFINITY, |d| d[r])
            }
            KernelKey::MatvecQ8 { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatmulQ8Rows { .. } => match self.q8.as_ref().and_then(|b| b.get(i)) {
                Some((s, q)) => 2.0 * ((cols / 32) as f64 + 8.0) * U * s[r] + q[r],
                None => f64::INFINITY,
            },
            _ => base,
        };
        t + f64::MIN_POSITIVE
    }
}

/// The verdict of one result, judged as the selftest judges (its `Worst`): the element
/// closest to its tolerance (largest error / tolerance), its error and tolerance, and whether
/// every element is within its own tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// That element's |got - want| (NaN for an unwritten element).
    pub max_err: f64,
    pub tol: f64,
    pub ok: bool,
}

/// Judges `got` (one `[rows]` output per checked token) against `want` under `tol(i, r)`. A
/// NaN or missing element fails; a comparison of nothing fails (it would prove nothing).
pub fn judge(got: &[Vec<f32>], want: &[Vec<f64>], tol: impl Fn(usize, usize) -> f64) -> Verdict {
    let mut v = Verdict {
        max_err: 0.0,
        tol: 0.0,
        ok: !got.is_empty() && got.len() == want.len(),
    };
    let mut worst_ratio = -1.0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.len() != w.len() || g.is_empty() {
            v.ok = false;
        }
        for (r, (&g, &w)) in g.iter().zip(w).enumerate() {
            let err = (f64::from(g) - w).abs();
            let t = tol(i, r);
            // NaN compares false: it must fail, not pass.
            let ratio = if err <= t {
                err / t
            } else {
                v.ok = false;
                if err.is_nan() {
                    f64::INFINITY
                } else {
                    err / t
                }
            };
            if ratio > worst_ratio {
                worst_ratio = ratio;
                v.max_err = err;
                v.tol = t;
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::health::selftest::Rng;

    #[test]
    fn judge_passes_within_and_fails_outside_the_tolerance() {
        let want = vec![vec![1.0, -2.0], vec![0.5, 0.0]];
        let exact: Vec<Vec<f32>> = want
            .iter()
            .map(|r| r.iter().map(|&v| v as f32).collect())
            .collect();
        assert!(judge(&exact, &want, |_, _| 1e-12).ok);
        let mut off = exact.clone();
        off[1][0] += 0.01;
        let v = judge(&off, &want, |_, _| 1e-3);
        assert!(
            !v.ok && (v.max_err - 0.01).abs() < 1e-6 && v.tol == 1e-3,
            "{v:?}"
        );
        assert!(judge(&off, &want, |_, _| 0.1).ok);
        off[0][1] = f32::NAN;
        assert!(!judge(&off, &want, |_, _| 1e9).ok);
        assert!(!judge(&[], &[], |_, _| 1.0).ok);
        assert!(!judge(&exact[..1], &want, |_, _| 1.0).ok);
    }

    /// The reference's f32 tolerance accepts the CPU's own f32 matvec of the same weights and
    /// rejects it after one weight is perturbed by far more than the bound.
    #[test]
    fn reference_accepts_an_f32_matvec_and_catches_a_wrong_one() {
        let (rows, cols) = (9, 256);
        for ty in [WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::Q4_K] {
            let data = crate::gpu::health::selftest::checks::weights(ty, rows, cols, 7).unwrap();
            let x = Rng(3).values(2 * cols, 2.0);
            let r = Reference::new(ty, &data, rows, cols, &x, 2).unwrap();
            let mut got = Vec::new();
            for &t in &r.tokens {
                let mut y = vec![0f32; rows];
                kernels_ref::matvec(
                    ty.ggml(),
                    &data,
                    rows,
                    cols,
                    &x[t * cols..(t + 1) * cols],
                    &mut y,
                )
                .unwrap();
                got.push(y);
            }
            let key = KernelKey::Matmul { ty };
            let tol = |i, row| r.tol(&key, i, row, cols);
            assert!(judge(&got, &r.want, tol).ok, "{ty:?}");
            got[1][4] += (r.abs[1][4] * 1e-3) as f32;
            assert!(!judge(&got, &r.want, tol).ok, "{ty:?}");
        }
    }
}
