//! Fast CPU kernels: the hot path of CPU inference.
//!
//! Matmuls follow ggml: the activations are quantized once per call to 8-bit chunks of 32 (see
//! `act`) and every quantized weight format is multiplied with integer dot products (AVX2 on
//! x86_64, a portable scalar path elsewhere, chosen at runtime). F32/F16/BF16 weights use f32 FMA.
//! Formats without an integer kernel are dequantized a row at a time by `kernels-ref`.
//!
//! Threads: output rows are split into chunks across the engine's workers (`par`). Each chunk loops over tiles
//! of `TILE` tokens and, inside, over its rows, so a row's bytes are unpacked once per tile and
//! the chunk's weights stay in L2 while all token tiles pass over them (prefill reads each
//! weight from memory about once, not once per token).

pub(crate) mod act;
mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_float;
pub(crate) mod formats;
mod gemm;
pub use gemm::PackedWeight;
#[cfg(target_arch = "x86_64")]
mod gemm512;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
mod ops;
pub mod par;
mod scalar;

use crate::{Error, GgmlType, Result};
use act::QAct;
use gemm::{gemm_plan, run_gemm, Gemm};

pub use attention::{attention, attention_kv, KvView};
pub use ops::{
    add, embedding, gelu_tanh, glu_in_place, rms_norm, rope, rope_shift, rope_tokens,
    rope_tokens_cached, silu, softcap, softmax, swiglu, swiglu_in_place, RopeCache,
};

/// Tokens per tile of the matmul kernels.
pub(crate) const TILE: usize = 8;

/// Below this many multiply-adds a matmul runs on the calling thread: ~15 µs of one core's work
/// (decode's 192x576 K/V projections), a few times what starting a region on the workers costs.
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
    /// The same weight packed for the GEMM (`with_packed`), read instead of `data` there.
    packed: Option<&'a [u8]>,
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
            packed: None,
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
    /// `Avx2` plus AVX-VNNI: the integer dot products of formats without per-half multipliers
    /// (Q4_0, Q4_1, Q5_x, Q8_0, IQ4_NL, TQ2_0) in one `vpdpbusd` instead of two instructions.
    AvxVnni,
    /// `AvxVnni` plus AVX-512 F/BW/VNNI: Q4_0, Q4_1 and Q8_0 weights, and Q5_0, Q5_1, IQ4_NL and
    /// Q2_K..Q6_K weights packed at load, run a 16-row x 8-token register-blocked GEMM
    /// (`gemm512`, `lanes`) for every batch size; everything else as `AvxVnni`. (Without
    /// AVX-512, the packed formats run `lanes_avx2`'s 8-row x 4-token GEMM.)
    Avx512Vnni,
}

impl Isa {
    /// The fastest implementation this CPU supports.
    pub fn best() -> Isa {
        if Isa::Avx512Vnni.available() {
            Isa::Avx512Vnni
        } else if Isa::AvxVnni.available() {
            Isa::AvxVnni
        } else if Isa::Avx2.available() {
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
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::AvxVnni.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => false,
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
            // SAFETY: an Avx2 kernel is only built by quant_kernel(_, Isa::Avx2 | AvxVnni),
            // which matmul_with reaches only after isa.available() returned true (AvxVnni
            // implies Avx2).
            #[cfg(target_arch = "x86_64")]
            QKernel::Avx2(k) => unsafe { k(rows, rb, act, t0, nt, out, stride) },
        }
    }
}

/// Every weight's row kernel, or `None` if one has none (a float or slow-path format, or no
/// columns): such calls run one matmul per weight.
fn quant_kernels(isa: Isa, ws: &[WeightView]) -> Option<Vec<QKernel>> {
    ws.iter()
        .map(|w| quant_kernel(w.ty, isa).filter(|_| w.cols > 0))
        .collect()
}

fn quant_kernel(ty: GgmlType, isa: Isa) -> Option<QKernel> {
    macro_rules! pick {
        ($f:ty) => {{
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => QKernel::Avx2(avx2::plain::dot_q::<$f>),
                #[cfg(target_arch = "x86_64")]
                Isa::AvxVnni | Isa::Avx512Vnni => QKernel::Avx2(avx2::vnni::dot_q::<$f>),
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
        GgmlType::IQ4_XS => pick!(f::IQ4_XS),
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

/// Checks `isa` and one weight's shapes against x: [n_tokens, cols] and y: [n_tokens, rows];
/// returns the row bytes.
fn check_args(isa: Isa, w: &WeightView, x: &[f32], n_tokens: usize, y: &[f32]) -> Result<usize> {
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
    Ok(rb)
}

fn quantize_act(isa: Isa, act: &mut QAct, x: &[f32], n_tokens: usize, cols: usize) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => act.quantize_avx2(x, n_tokens, cols),
        _ => act.quantize_scalar(x, n_tokens, cols),
    }
}

/// ys[i]: [n_tokens, ws[i].rows] = x: [n_tokens, cols] · ws[i]ᵀ for weights that all take x
/// (Q/K/V, gate/up). Equal to one `matmul` per weight, but x is quantized once and all the
/// weights' rows run in one parallel region: decode pays one thread fork/join instead of one
/// per weight, and the small K/V matvecs no longer run alone on one thread.
pub fn matmul_many(
    ws: &[WeightView],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    matmul_many_with(Isa::best(), ws, x, n_tokens, ys, scratch)
}

/// `matmul_many` on a chosen implementation.
pub fn matmul_many_with(
    isa: Isa,
    ws: &[WeightView],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    if ws.len() != ys.len() {
        return Err(Error::InvalidArgument(format!(
            "matmul_many: {} weights but {} outputs",
            ws.len(),
            ys.len()
        )));
    }
    let parts = ws
        .iter()
        .zip(ys.iter())
        .map(|(w, y)| Ok((w, check_args(isa, w, x, n_tokens, y)?)))
        .collect::<Result<Vec<_>>>()?;
    let kernels = quant_kernels(isa, ws);
    // Float or slow-path weights, or empty rows: one matmul each.
    let Some(kernels) = kernels else {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul_with(isa, w, x, n_tokens, y, scratch)?;
        }
        return Ok(());
    };
    if n_tokens == 0 {
        return Ok(());
    }
    let cols = ws[0].cols;
    match gemm_plan(isa, ws, n_tokens) {
        Gemm::All => {
            quantize_act(isa, &mut scratch.act, x, n_tokens, cols);
            run_gemm(isa, &parts, n_tokens, ys, scratch);
            return Ok(());
        }
        Gemm::Mixed => {
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                matmul_with(isa, w, x, n_tokens, y, scratch)?;
            }
            return Ok(());
        }
        Gemm::No => {}
    }
    quantize_act(isa, &mut scratch.act, x, n_tokens, cols);
    let act = &scratch.act;
    run_rows(
        &parts,
        n_tokens,
        ys,
        &mut scratch.yt,
        || (),
        |_, pi, rows, t0, nt, out| kernels[pi].run(rows, parts[pi].1, act, t0, nt, out, n_tokens),
    );
    Ok(())
}

/// ys[i]: [ws[i].rows] = ws[i] · x[i] with x: [ws.len(), cols], each weight with its own
/// one-token input (a token's routed experts' down projections). Equal to one one-token
/// `matmul` per weight, bit for bit (each input row quantizes on its own either way), but the
/// inputs are quantized in one call and all the weights' rows run in one parallel region.
pub fn matmul_each(
    ws: &[WeightView],
    x: &[f32],
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    matmul_each_with(Isa::best(), ws, x, ys, scratch)
}

/// `matmul_each` on a chosen implementation.
pub fn matmul_each_with(
    isa: Isa,
    ws: &[WeightView],
    x: &[f32],
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) -> Result<()> {
    let n = ws.len();
    if ys.len() != n {
        return Err(Error::InvalidArgument(format!(
            "matmul_each: {n} weights but {} outputs",
            ys.len()
        )));
    }
    let Some(cols) = ws.first().map(|w| w.cols) else {
        return Ok(());
    };
    if ws.iter().any(|w| w.cols != cols) || x.len() != n * cols {
        return Err(Error::InvalidArgument(format!(
            "matmul_each: {n} weights of {cols} columns (all alike?) over {} inputs",
            x.len()
        )));
    }
    let parts = ws
        .iter()
        .zip(ys.iter())
        .enumerate()
        .map(|(i, (w, y))| Ok((w, check_args(isa, w, &x[i * cols..(i + 1) * cols], 1, y)?)))
        .collect::<Result<Vec<_>>>()?;
    // Weights a one-token matmul would send to the GEMM (on AVX-512) keep that path, so the
    // values stay those of `matmul`.
    let gemm = ws
        .iter()
        .any(|w| gemm_plan(isa, std::slice::from_ref(w), 1) != Gemm::No);
    let kernels = quant_kernels(isa, ws).filter(|_| !gemm);
    let Some(kernels) = kernels else {
        for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
            matmul_with(isa, w, &x[i * cols..(i + 1) * cols], 1, y, scratch)?;
        }
        return Ok(());
    };
    // The inputs as n "tokens" of one activation; weight i reads token i.
    quantize_act(isa, &mut scratch.act, x, n, cols);
    let act = &scratch.act;
    run_rows(
        &parts,
        1,
        ys,
        &mut scratch.yt,
        || (),
        |_, pi, rows, _, nt, out| kernels[pi].run(rows, parts[pi].1, act, pi, nt, out, 1),
    );
    Ok(())
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
    let rb = check_args(isa, w, x, n_tokens, y)?;
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        // Empty sums; also keeps the zero-byte rows away from chunks_exact(0).
        y.fill(0.0);
        return Ok(());
    }
    let cols = w.cols;
    let parts = [(w, rb)];
    // One weight is never `Gemm::Mixed`.
    if gemm_plan(isa, std::slice::from_ref(w), n_tokens) == Gemm::All {
        quantize_act(isa, &mut scratch.act, x, n_tokens, cols);
        run_gemm(isa, &parts, n_tokens, &mut [y], scratch);
        return Ok(());
    }
    if let Some(k) = quant_kernel(w.ty, isa) {
        quantize_act(isa, &mut scratch.act, x, n_tokens, cols);
        let act = &scratch.act;
        run_rows(
            &parts,
            n_tokens,
            &mut [y],
            &mut scratch.yt,
            || (),
            |_, _, rows, t0, nt, out| k.run(rows, rb, act, t0, nt, out, n_tokens),
        );
        return Ok(());
    }
    if let Some(ff) = float_format(w.ty) {
        run_rows(
            &parts,
            n_tokens,
            &mut [y],
            &mut scratch.yt,
            || (),
            |_, _, rows, t0, nt, out| float_dot(isa, ff, rows, rb, x, cols, t0, nt, out, n_tokens),
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
        &parts,
        n_tokens,
        &mut [y],
        &mut scratch.yt,
        || vec![0f32; cols],
        |buf, _, rows, t0, nt, out| {
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
        // SAFETY: matmul_with checked isa.available() (AvxVnni implies Avx2) before running
        // any kernel.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => unsafe {
            avx2::dot_f(ff, rows, rb, x, cols, t0, nt, out, stride)
        },
        _ => scalar::dot_f(ff, rows, rb, x, cols, t0, nt, out, stride),
    }
}

/// One weight of a `run_rows` call with its row bytes.
type Part<'a, 'b> = (&'a WeightView<'b>, usize);

/// Runs `k(state, part, rows, t0, nt, out)` over all rows of every part and all token tiles,
/// the rows of all parts split into chunks across threads in one parallel region (one rayon
/// fork/join per call, however many weights). `k` writes out[r * n_tokens + t] = rows[r] ·
/// x[t0 + t] for t < nt; `out` starts at the tile's first token of the chunk's first row.
/// ys[i]: [n_tokens, parts[i].rows].
fn run_rows<S, I, K>(
    parts: &[Part],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    yt: &mut Vec<f32>,
    init: I,
    k: K,
) where
    I: Fn() -> S + Sync + Send,
    K: Fn(&mut S, usize, &[u8], usize, usize, &mut [f32]) + Sync + Send,
{
    let total_rows: usize = parts.iter().map(|(w, _)| w.rows).sum();
    let macs: usize = parts.iter().map(|(w, _)| w.rows * w.cols).sum::<usize>() * n_tokens;
    // [rows, n_tokens] per part: for one token that is y's own layout.
    if n_tokens > 1 {
        yt.clear();
        yt.resize(total_rows * n_tokens, 0.0);
    }
    let threads = par::threads();
    let base_rows = total_rows.div_ceil(threads * 4).max(4);
    // (part, first row, out) per chunk; a few dozen entries.
    let mut jobs: Vec<(usize, usize, &mut [f32])> = Vec::new();
    let mut rest: &mut [f32] = &mut yt[..];
    for (pi, ((w, rb), y)) in parts.iter().zip(ys.iter_mut()).enumerate() {
        let mut chunk_rows = base_rows;
        if n_tokens > TILE {
            chunk_rows = chunk_rows.min((CHUNK_BYTES / rb.max(&1)).max(4));
        }
        let out: &mut [f32] = if n_tokens == 1 {
            &mut y[..]
        } else {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(w.rows * n_tokens);
            rest = tail;
            head
        };
        for (ci, o) in out.chunks_mut(chunk_rows * n_tokens).enumerate() {
            jobs.push((pi, ci * chunk_rows, o));
        }
    }
    let work = |(pi, r0, o): (usize, usize, &mut [f32]), st: &mut S| {
        let (w, rb) = parts[pi];
        let nr = o.len() / n_tokens;
        let rows = &w.data[r0 * rb..(r0 + nr) * rb];
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = TILE.min(n_tokens - t0);
            k(st, pi, rows, t0, nt, &mut o[t0..]);
            t0 += nt;
        }
    };
    if macs < PAR_MIN_MACS || threads == 1 {
        let mut st = init();
        for job in jobs {
            work(job, &mut st);
        }
    } else {
        par::for_each_item_init(jobs, &init, |st, job| work(job, st));
    }
    if n_tokens > 1 {
        let mut src_all: &[f32] = &yt[..];
        for ((w, _), y) in parts.iter().zip(ys.iter_mut()) {
            let (src, tail) = src_all.split_at(w.rows * n_tokens);
            src_all = tail;
            for (r, src) in src.chunks_exact(n_tokens).enumerate() {
                for (t, &v) in src.iter().enumerate() {
                    y[t * w.rows + r] = v;
                }
            }
        }
    }
}
