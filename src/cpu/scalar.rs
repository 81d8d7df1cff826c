//! Portable kernels: the reference-shaped fallback for CPUs without AVX2 (phones until a NEON
//! path exists) and the twin the AVX2 kernels are tested against.

use super::act::QAct;
use super::formats::{Chunk, Format};
use super::{FloatFormat, TILE};

/// out[r * stride + t] = rows[r] · x[t0 + t] for every row of `rb` bytes and `nt` (<= TILE)
/// tokens, weights in format `F`.
pub(crate) fn dot_q<F: Format>(
    rows: &[u8],
    rb: usize,
    act: &QAct,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    stride: usize,
) {
    for (r, row) in rows.chunks_exact(rb).enumerate() {
        dot_q_row::<F>(row, act, t0, &mut out[r * stride..r * stride + nt]);
    }
}

fn dot_q_row<F: Format>(row: &[u8], act: &QAct, t0: usize, out: &mut [f32]) {
    let nt = out.len().min(TILE);
    let mut acc = [0f32; TILE];
    let mut ch = Chunk::default();
    let cpb = F::BLOCK / 32;
    for (b, blk) in row.chunks_exact(F::BYTES).enumerate() {
        let p = F::params(blk);
        for c in 0..cpb {
            F::unpack(blk, &p, c, &mut ch);
            let ci = b * cpb + c;
            for (t, a) in acc.iter_mut().enumerate().take(nt) {
                let (qs, d, xs) = act.token(t0 + t);
                let q = &qs[ci * 32..ci * 32 + 32];
                let mut s = [0i32; 2];
                for (i, (&u, &qv)) in ch.u.iter().zip(q).enumerate() {
                    s[i / 16] += u as i32 * qv as i32;
                }
                let isum = ch.mul[0] * s[0] + ch.mul[1] * s[1];
                *a += ch.dw * d[ci] * isum as f32 + ch.c[0] * xs[2 * ci] + ch.c[1] * xs[2 * ci + 1];
            }
        }
    }
    out[..nt].copy_from_slice(&acc[..nt]);
}

/// Reads element `i` of a float-format row.
#[inline(always)]
pub(crate) fn float_at(fmt: FloatFormat, row: &[u8], i: usize) -> f32 {
    match fmt {
        FloatFormat::F32 => {
            f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
        }
        FloatFormat::F16 => super::formats::rd_f16(row, 2 * i),
        FloatFormat::Bf16 => {
            f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16)
        }
    }
}

/// out[r * stride + t] = rows[r] · x[t0 + t] in f32 for float-format rows of `rb` bytes;
/// x is [n_tokens, cols] f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_f(
    fmt: FloatFormat,
    rows: &[u8],
    rb: usize,
    x: &[f32],
    cols: usize,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    stride: usize,
) {
    for (r, row) in rows.chunks_exact(rb).enumerate() {
        dot_f_row(fmt, row, x, cols, t0, &mut out[r * stride..r * stride + nt]);
    }
}

fn dot_f_row(fmt: FloatFormat, row: &[u8], x: &[f32], cols: usize, t0: usize, out: &mut [f32]) {
    let nt = out.len().min(TILE);
    // Eight partial sums per token keep the dependency chains short on any target.
    let mut acc = [[0f32; 8]; TILE];
    for i in 0..cols {
        let w = float_at(fmt, row, i);
        for (t, a) in acc.iter_mut().enumerate().take(nt) {
            a[i % 8] += w * x[(t0 + t) * cols + i];
        }
    }
    for (o, a) in out.iter_mut().zip(&acc).take(nt) {
        *o = a.iter().sum();
    }
}
