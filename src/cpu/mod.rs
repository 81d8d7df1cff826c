//! Fast CPU kernels: the hot path of CPU inference.
//!
//! Matmuls follow ggml: the activations are quantized once per call to 8-bit chunks of 32 (see
//! `act`) and every quantized weight format is multiplied with integer dot products (AVX2 on
//! x86_64, a portable scalar path elsewhere, chosen at runtime). F32/F16/BF16 weights use f32 FMA.
//! Formats without an integer kernel are dequantized a row at a time by `kernels-ref`.
//!
//! Threads: output rows are split into chunks across rayon's pool. Each chunk loops over tiles
//! of `TILE` tokens and, inside, over its rows, so a row's bytes are unpacked once per tile and
//! the chunk's weights stay in L2 while all token tiles pass over them (prefill reads each
//! weight from memory about once, not once per token).

pub(crate) mod act;
mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_float;
mod formats;
mod ops;
mod scalar;

use rayon::prelude::*;

use crate::{Error, GgmlType, Result};
use act::QAct;

pub use attention::{attention, attention_kv, KvView};
pub use ops::{add, embedding, rms_norm, rope, rope_shift, rope_tokens, silu, softmax, swiglu};

/// Tokens per tile of the matmul kernels.
pub(crate) const TILE: usize = 8;

/// Below this many multiply-adds a matmul runs on the calling thread: ~15 µs of one core's work
/// (decode's 192x576 K/V projections), a few times what waking rayon's workers costs.
const PAR_MIN_MACS: usize = 128 * 1024;

/// Bytes of one row chunk's weights to keep in L2 while token tiles pass over it.
const CHUNK_BYTES: usize = 96 * 1024;

/// A borrowed weight matrix: `rows` rows (output features, ne1) of `cols` elements (ne0), ggml
/// layout, format `ty`.
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> WeightView<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements of `ty`.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        let rb = row_bytes(ty, cols)?;
        let need = rb
            .checked_mul(rows)
            .ok_or_else(|| Error::InvalidArgument(format!("{rows} rows of {rb} bytes overflow")))?;
        if data.len() != need {
            return Err(Error::InvalidArgument(format!(
                "{ty} weight of {rows}x{cols} needs {need} bytes, got {}",
                data.len()
            )));
        }
        Ok(WeightView {
            ty,
            data,
            rows,
            cols,
        })
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len().checked_div(self.rows).unwrap_or(0)
    }
}

fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize> {
    ty.row_bytes(cols as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{cols} columns is not a whole number of {ty} blocks of {}",
                ty.block_size()
            ))
        })
}

/// Reusable buffers for `matmul`, so the token loop allocates nothing once they have grown.
#[derive(Default)]
pub struct MatmulScratch {
    act: QAct,
    /// [rows, n_tokens] outputs before the transpose into y (prefill only).
    yt: Vec<f32>,
}

/// Which implementation to run. `matmul` picks the best one the CPU has; tests and benchmarks
/// pick one with `matmul_with` to compare the paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable code, any target.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
}

impl Isa {
    /// The fastest implementation this CPU supports.
    pub fn best() -> Isa {
        if Isa::Avx2.available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatFormat {
    F32,
    F16,
    Bf16,
}

/// Whether `matmul` has an integer or float kernel for `ty` (others go through kernels-ref's
/// dequantization, a row at a time).
pub fn has_fast_kernel(ty: GgmlType) -> bool {
    float_format(ty).is_some() || quant_kernel(ty, Isa::Scalar).is_some()
}

fn float_format(ty: GgmlType) -> Option<FloatFormat> {
    match ty {
        GgmlType::F32 => Some(FloatFormat::F32),
        GgmlType::F16 => Some(FloatFormat::F16),
        GgmlType::BF16 => Some(FloatFormat::Bf16),
        _ => None,
    }
}

/// (rows, row bytes, activations, t0, nt, out, out stride).
type QFn = fn(&[u8], usize, &QAct, usize, usize, &mut [f32], usize);
#[cfg(target_arch = "x86_64")]
type QFnUnsafe = unsafe fn(&[u8], usize, &QAct, usize, usize, &mut [f32], usize);

/// A quantized-rows kernel: out[r * stride + t] = rows[r] · act[t0 + t] for nt (1..=TILE)
/// tokens.
#[derive(Clone, Copy)]
enum QKernel {
    Scalar(QFn),
    #[cfg(target_arch = "x86_64")]
    Avx2(QFnUnsafe),
}

impl QKernel {
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn run(
        self,
        rows: &[u8],
        rb: usize,
        act: &QAct,
        t0: usize,
        nt: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        match self {
            QKernel::Scalar(k) => k(rows, rb, act, t0, nt, out, stride),
            // SAFETY: an Avx2 kernel is only built by quant_kernel(_, Isa::Avx2), which
            // matmul_with reaches only after Isa::Avx2.available() returned true.
            #[cfg(target_arch = "x86_64")]
            QKernel::Avx2(k) => unsafe { k(rows, rb, act, t0, nt, out, stride) },
        }
    }
}

fn quant_kernel(ty: GgmlType, isa: Isa) -> Option<QKernel> {
    macro_rules! pick {
        ($f:ty) => {{
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => QKernel::Avx2(avx2::dot_q::<$f>),
                _ => QKernel::Scalar(scalar::dot_q::<$f>),
            }
        }};
    }
    use formats as f;
    Some(match ty {
        GgmlType::Q4_0 => pick!(f::Q4_0),
        GgmlType::Q4_1 => pick!(f::Q4_1),
        GgmlType::Q5_0 => pick!(f::Q5_0),
        GgmlType::Q5_1 => pick!(f::Q5_1),
        GgmlType::Q8_0 => pick!(f::Q8_0),
        GgmlType::IQ4_NL => pick!(f::IQ4_NL),
        GgmlType::Q2_K => pick!(f::Q2_K),
        GgmlType::Q3_K => pick!(f::Q3_K),
        GgmlType::Q4_K => pick!(f::Q4_K),
        GgmlType::Q5_K => pick!(f::Q5_K),
        GgmlType::Q6_K => pick!(f::Q6_K),
        GgmlType::TQ2_0 => pick!(f::TQ2_0),
        _ => return None,
    })
}

/// y[t][r] = sum_c W[r][c] * x[t][c].  x: [n_tokens, cols] f32 row-major; y: [n_tokens, rows].
pub fn matmul(
    w: &WeightView,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    matmul_with(Isa::best(), w, x, n_tokens, y, scratch)
}

/// `matmul` on a chosen implementation (for tests and benchmarks).
pub fn matmul_with(
    isa: Isa,
    w: &WeightView,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    if !isa.available() {
        return Err(Error::InvalidArgument(format!(
            "{isa:?} kernels need CPU features this CPU lacks"
        )));
    }
    let rb = row_bytes(w.ty, w.cols)?;
    if w.data.len() != rb * w.rows {
        return Err(Error::InvalidArgument(format!(
            "weight data is {} bytes, {}x{} {} needs {}",
            w.data.len(),
            w.rows,
            w.cols,
            w.ty,
            rb * w.rows
        )));
    }
    if x.len() != n_tokens * w.cols || y.len() != n_tokens * w.rows {
        return Err(Error::InvalidArgument(format!(
            "matmul {}x{} over {n_tokens} tokens: x has {} values (want {}), y has {} (want {})",
            w.rows,
            w.cols,
            x.len(),
            n_tokens * w.cols,
            y.len(),
            n_tokens * w.rows
        )));
    }
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        // Empty sums; also keeps the zero-byte rows away from chunks_exact(0).
        y.fill(0.0);
        return Ok(());
    }
    let cols = w.cols;
    if let Some(k) = quant_kernel(w.ty, isa) {
        let act = &mut scratch.act;
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => act.quantize_avx2(x, n_tokens, cols),
            _ => act.quantize_scalar(x, n_tokens, cols),
        }
        let act = &scratch.act;
        run_rows(
            w,
            rb,
            n_tokens,
            y,
            &mut scratch.yt,
            || (),
            |_, rows, t0, nt, out| k.run(rows, rb, act, t0, nt, out, n_tokens),
        );
        return Ok(());
    }
    if let Some(ff) = float_format(w.ty) {
        run_rows(
            w,
            rb,
            n_tokens,
            y,
            &mut scratch.yt,
            || (),
            |_, rows, t0, nt, out| float_dot(isa, ff, rows, rb, x, cols, t0, nt, out, n_tokens),
        );
        return Ok(());
    }
    if !w.ty.is_supported() {
        return Err(Error::UnsupportedType {
            ty: w.ty,
            what: "CPU matmul".into(),
        });
    }
    // Slow path: dequantize each row with kernels-ref into a per-thread buffer, then f32 dot.
    let ty = w.ty;
    let failed = std::sync::atomic::AtomicBool::new(false);
    run_rows(
        w,
        rb,
        n_tokens,
        y,
        &mut scratch.yt,
        || vec![0f32; cols],
        |buf, rows, t0, nt, out| {
            for (r, row) in rows.chunks_exact(rb).enumerate() {
                let o = &mut out[r * n_tokens..];
                if ops::dequantize_ref(ty, row, buf).is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    o[..nt].fill(f32::NAN);
                    continue;
                }
                let bytes: &[u8] = bytemuck::cast_slice(buf.as_slice());
                float_dot(
                    isa,
                    FloatFormat::F32,
                    bytes,
                    4 * cols,
                    x,
                    cols,
                    t0,
                    nt,
                    o,
                    n_tokens,
                );
            }
        },
    );
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::UnsupportedType {
            ty,
            what: "CPU matmul (kernels-ref dequantization failed)".into(),
        });
    }
    Ok(())
}

#[inline]
#[allow(clippy::too_many_arguments)]
fn float_dot(
    isa: Isa,
    ff: FloatFormat,
    rows: &[u8],
    rb: usize,
    x: &[f32],
    cols: usize,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    stride: usize,
) {
    match isa {
        // SAFETY: matmul_with checked Isa::Avx2.available() before running any kernel.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_f(ff, rows, rb, x, cols, t0, nt, out, stride) },
        _ => scalar::dot_f(ff, rows, rb, x, cols, t0, nt, out, stride),
    }
}

/// Runs `k(state, rows, t0, nt, out)` over all rows and token tiles, rows split across threads.
/// `k` writes out[r * n_tokens + t] = rows[r] · x[t0 + t] for t < nt; `out` starts at the
/// tile's first token of the chunk's first row.
fn run_rows<S, I, K>(
    w: &WeightView,
    rb: usize,
    n_tokens: usize,
    y: &mut [f32],
    yt: &mut Vec<f32>,
    init: I,
    k: K,
) where
    I: Fn() -> S + Sync + Send,
    K: Fn(&mut S, &[u8], usize, usize, &mut [f32]) + Sync + Send,
{
    let rows = w.rows;
    // [rows, n_tokens]: for one token that is y's own layout.
    let out: &mut [f32] = if n_tokens == 1 {
        &mut *y
    } else {
        yt.clear();
        yt.resize(rows * n_tokens, 0.0);
        &mut yt[..]
    };
    let threads = rayon::current_num_threads().max(1);
    let mut chunk_rows = rows.div_ceil(threads * 4).max(4);
    if n_tokens > TILE {
        chunk_rows = chunk_rows.min((CHUNK_BYTES / rb.max(1)).max(4));
    }
    let work = |(ci, o): (usize, &mut [f32]), st: &mut S| {
        let r0 = ci * chunk_rows;
        let nr = o.len() / n_tokens;
        let rows = &w.data[r0 * rb..(r0 + nr) * rb];
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = TILE.min(n_tokens - t0);
            k(st, rows, t0, nt, &mut o[t0..]);
            t0 += nt;
        }
    };
    let small = rows * w.cols * n_tokens < PAR_MIN_MACS;
    if small || threads == 1 {
        let mut st = init();
        for item in out.chunks_mut(chunk_rows * n_tokens).enumerate() {
            work(item, &mut st);
        }
    } else {
        out.par_chunks_mut(chunk_rows * n_tokens)
            .enumerate()
            .for_each_init(&init, |st, item| work(item, st));
    }
    if n_tokens > 1 {
        for (r, src) in yt.chunks_exact(n_tokens).enumerate() {
            for (t, &v) in src.iter().enumerate() {
                y[t * rows + r] = v;
            }
        }
    }
}
