//! `memwall bench-kernels`: every weight-matrix kernel variant x weight format x shape on each
//! adapter, timed, with the bytes it moves, its GB/s and GFLOP/s, the fraction of the adapter's
//! measured read bandwidth it reaches, and a correctness check against kernels-ref.
//!
//! Variants are those of [`KernelKey::all`] that multiply a weight matrix (named as the
//! selftest names them, [`crate::gpu::health::selftest::names`], minus the format): the f32-activation
//! matvec (`matvec workgroup|subgroup [f16]`, `matvec_rows` one row per invocation), the
//! 8-bit-activation decode path (`matvec_q8 workgroup|subgroup`, `matvec_q8_rows`, each timed
//! together with its `quantize_act`), and the prefill kernels over [`PREFILL_TOKENS`] tokens:
//! the tiled `matmul` and, on the 8-bit path, `matmul_q8_rows` (with its `quantize_act` of the
//! tokens; the CPU-like adapters' prefill matmul, plain-store output). A variant the adapter cannot run (no SUBGROUP, no SHADER_F16) is not listed.
//!
//! Timing ([`timing`]): each repetition records `k` back-to-back calls into one submission
//! (`k` sized after a warm-up so it lasts about [`timing::TARGET_SUBMIT_S`]); with
//! `TIMESTAMP_QUERY` its time is the GPU's between two timestamps around the calls (the
//! engine's [`crate::gpu::timing::GpuTimer`]), else the host's wall clock around submit and
//! wait. The median over the repetitions, divided by `k`, is the time per call; `timing` says
//! which clock (per adapter, and per result where a stamp pair read back unusable).
//!
//! Roofs: the read-bandwidth probe (`shaders/bandwidth.wgsl`, [`super::bandwidth`]) and the
//! compute probe (`shaders/flops.wgsl`, [`super::flops`]: f32 fma throughput), both measured
//! on each adapter before its kernels; `--plot` draws them as a roofline.
//!
//! Bytes moved per call: the weight buffers (quants + scales, as uploaded) plus the activations
//! read and the outputs written (quantize_act's f32 read and int8 + scales write included for
//! the 8-bit path); the tiled matmul counts its input and output once (the minimum traffic).
//! FLOPs: `2 rows cols n`.
//!
//! # JSON schema (`--json`, `schema` = `"memwall.bench-kernels/2"`)
//!
//! ```text
//! { "schema": "memwall.bench-kernels/2", "clock": str, "reps": int, "prefill_tokens": int,
//!   "adapters": [ {
//!     "name": str, "backend": str, "driver": str, "driver_info": str, "device_type": str,
//!     "timestamp_query": bool,          // the adapter has TIMESTAMP_QUERY
//!     "timing": "gpu-timestamps" | "wall-clock",  // the kernels' clock on this adapter
//!     "probe_gbps": float,              // the read-bandwidth probe (shaders/bandwidth.wgsl)
//!     "peak_gflops": float,             // the compute probe (shaders/flops.wgsl)
//!     "results": [ { "variant": str, "format": str, "rows": int, "cols": int, "n": int,
//!                    "median_us": float, "launches": int, "timing": str,
//!                    "bytes": int, "flops": int,
//!                    "gbps": float, "gflops": float, "frac_bw": float,
//!                    "max_err": float | null, "tol": float, "ok": bool } ],
//!     "skipped": [ { "format": str, "rows": int, "cols": int, "reason": str } ] } ] }
//! ```
//! `max_err` is null when an output was NaN. `launches` counts calls per timed submission.
//! A result's `timing` is its adapter's, or `wall-clock` where its stamps read back unusable.
//! (Schema 1 had no `timing`/`timestamp_query` and a null `compute_gflops`.)

pub mod check;
pub mod report;
pub mod timing;

use crate::error::{Error, Result};
use crate::gpu::device::{list_adapters, DeviceSelector, GpuContext};
use crate::gpu::health::selftest::{self, checks, Rng};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{self, GpuMatrix, KernelOptions, Kernels};
use crate::gpu::registry::{KernelKey, WeightFormat};
use crate::gpu::repack::repack;
use check::Reference;
pub use report::{AdapterReport, KernelResult, KernelsReport, Skipped};
use std::collections::HashMap;

/// The `schema` field of the JSON output.
pub const SCHEMA: &str = "memwall.bench-kernels/2";
/// Tokens of the prefill matmul rows.
pub const PREFILL_TOKENS: usize = 64;

/// Weight formats benchmarked, in this order.
pub const FORMATS: [WeightFormat; 6] = [
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q8_0,
    WeightFormat::Q4_K,
    WeightFormat::Q6_K,
    WeightFormat::F16,
];

/// `[rows, cols]` weight shapes of a `--shapes` item.
pub fn shapes(item: &str) -> Result<Vec<(usize, usize)>> {
    Ok(match item.trim() {
        // The test model (SmolLM2-135M): attention, FFN up/gate and down, the tied head.
        "test" => vec![(576, 576), (1536, 576), (576, 1536), (49152, 576)],
        // 7B-class (Llama-2-7B): attention/output, FFN up/gate.
        "7b" => vec![(4096, 4096), (11008, 4096)],
        // 35B-class (e.g. Llama-2-70B-like widths): attention/output, FFN up/gate.
        "35b" => vec![(8192, 8192), (28672, 8192)],
        // CI smoke: odd row counts, a K-quant-compatible width.
        "smoke" => vec![(37, 256), (64, 512)],
        "all" => ["test", "7b", "35b"]
            .iter()
            .map(|s| shapes(s))
            .collect::<Result<Vec<_>>>()?
            .concat(),
        other => {
            return Err(Error::InvalidArgument(format!(
                "--shapes {other:?}: expected test, 7b, 35b, all or smoke (comma list)"
            )))
        }
    })
}

/// What to run.
#[derive(Debug, Clone)]
pub struct KernelsOptions {
    /// `all` or a comma list of adapter selectors (`auto`, an index, a name substring).
    pub device: String,
    pub shapes: Vec<(usize, usize)>,
    /// Timed submissions per result (the median counts).
    pub reps: usize,
    pub formats: Vec<WeightFormat>,
    /// Bytes of the read-bandwidth probe's buffer (capped by the binding limit).
    pub probe_bytes: u64,
    /// Timed probe runs (the best counts).
    pub probe_runs: usize,
    /// Test hook: perturb the reference of every result, so every check must fail.
    pub fault: bool,
    /// Time by the host's wall clock even where the adapter has GPU timestamps.
    pub wall_clock: bool,
}

/// The adapters `device` names: every one for `all`, else each comma item's.
fn selectors(device: &str) -> Result<Vec<DeviceSelector>> {
    if device.trim().eq_ignore_ascii_case("all") {
        let n = list_adapters().len();
        if n == 0 {
            return Err(Error::Gpu("no GPU adapter found".into()));
        }
        return Ok((0..n).map(DeviceSelector::Index).collect());
    }
    device
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(DeviceSelector::parse)
        .collect()
}

/// The variant name of `key` when it multiplies a weight matrix (None otherwise): the
/// selftest's (kernel, variant) names without the format.
pub fn variant_name(key: &KernelKey) -> Option<String> {
    match key {
        KernelKey::Matvec { .. }
        | KernelKey::MatvecRows { .. }
        | KernelKey::MatvecQ8 { .. }
        | KernelKey::MatvecQ8Rows { .. }
        | KernelKey::MatmulQ8Rows { out: None, .. }
        | KernelKey::Matmul { .. } => {
            let (kernel, variant) = selftest::names(key);
            Some(match variant.split_once(' ') {
                Some((_, rest)) => format!("{kernel} {rest}"),
                None => kernel,
            })
        }
        _ => None,
    }
}

/// The weight format of a matrix-multiplying key.
fn key_format(key: &KernelKey) -> Option<WeightFormat> {
    match *key {
        KernelKey::Matvec { ty, .. }
        | KernelKey::MatvecRows { ty }
        | KernelKey::MatvecQ8 { ty, .. }
        | KernelKey::MatvecQ8Rows { ty }
        | KernelKey::MatmulQ8Rows { ty, out: None, .. }
        | KernelKey::Matmul { ty } => Some(ty),
        _ => None,
    }
}

/// Tokens `key` is timed over: [`PREFILL_TOKENS`] for the prefill matmuls, else 1.
fn prefill_tokens(key: &KernelKey) -> usize {
    if matches!(
        key,
        KernelKey::Matmul { .. } | KernelKey::MatmulQ8Rows { .. }
    ) {
        PREFILL_TOKENS
    } else {
        1
    }
}

/// Bytes of host memory the reference of a `[rows, cols]` shape needs at most (seeded values,
/// dequantized weights, the native-f16 error bounds): 16 per weight.
fn host_bytes(rows: usize, cols: usize) -> u64 {
    (rows as u64) * (cols as u64) * 16
}

/// MemAvailable from /proc/meminfo (None where it cannot be read).
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Per-adapter state: the context, its kernel sets (one per [`KernelOptions`], compiled on
/// first use) and the matrix-multiplying keys it can run.
struct Adapter {
    ctx: GpuContext,
    sets: HashMap<KernelOptions, Kernels>,
    keys: Vec<KernelKey>,
}

/// The kernel set that launches `key`.
fn kernel_set<'s>(
    ctx: &GpuContext,
    sets: &'s mut HashMap<KernelOptions, Kernels>,
    key: &KernelKey,
) -> Result<&'s mut Kernels> {
    let opts = KernelOptions {
        subgroup: key.uses_subgroups(),
        f16: key.uses_f16(),
    };
    match sets.entry(opts) {
        std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => {
            Ok(e.insert(Kernels::with_config(ctx, opts)?))
        }
    }
}

/// Runs the benchmark on every adapter `opts.device` names. `progress` gets each result and
/// skip as it happens (for a terminal).
pub fn run_kernels_bench(
    opts: &KernelsOptions,
    mut progress: impl FnMut(&str),
) -> Result<KernelsReport> {
    if opts.reps == 0 || opts.shapes.is_empty() || opts.formats.is_empty() {
        return Err(Error::InvalidArgument(
            "bench-kernels needs at least one repetition, shape and format".into(),
        ));
    }
    let mut adapters = Vec::new();
    for sel in selectors(&opts.device)? {
        let ctx = GpuContext::new(&sel)?;
        let keys: Vec<KernelKey> = selftest::runnable_keys(&ctx)
            .into_iter()
            .filter(|k| variant_name(k).is_some())
            .collect();
        let mut a = Adapter {
            ctx,
            sets: HashMap::new(),
            keys,
        };
        let probe = {
            let ctx = &a.ctx;
            let ks = Kernels::with_options(ctx, false)?;
            super::bandwidth::gpu_probe(ctx, &ks, opts.probe_bytes, opts.probe_runs)?
        };
        let peak = super::flops::gpu_flops(&a.ctx, opts.probe_runs)?;
        let timing = timing::source(&a.ctx, opts.wall_clock);
        let info = &a.ctx.info;
        progress(&format!(
            "{} ({}, {}): read probe {:.2} GB/s, compute probe {:.1} GFLOP/s; kernels timed by {timing}",
            info.name, info.backend, info.driver, probe.read_gbs, peak.gflops
        ));
        let mut rep = AdapterReport {
            name: info.name.clone(),
            backend: info.backend.clone(),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            device_type: info.device_type.clone(),
            timestamp_query: info.timestamp_query,
            timing: timing.into(),
            probe_gbps: probe.read_gbs,
            peak_gflops: peak.gflops,
            results: Vec::new(),
            skipped: Vec::new(),
        };
        for &ty in &opts.formats {
            for &(rows, cols) in &opts.shapes {
                let skip = |reason: String| Skipped {
                    format: ty.ggml().name().to_string(),
                    rows,
                    cols,
                    reason,
                };
                match bench_matrix(&mut a, opts, ty, rows, cols, probe.read_gbs, &mut progress) {
                    Ok(Ok(mut rs)) => rep.results.append(&mut rs),
                    Ok(Err(reason)) => {
                        progress(&format!(
                            "skip {} [{rows} x {cols}]: {reason}",
                            ty.ggml().name()
                        ));
                        rep.skipped.push(skip(reason));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        adapters.push(rep);
    }
    Ok(KernelsReport {
        schema: SCHEMA.into(),
        clock: format!(
            "k back-to-back calls in one submission (k sized to ~{} ms), median of the \
             repetitions / k; each repetition timed by GPU timestamps around the k calls \
             (timing = {}) or by the wall clock around the submission and its wait \
             (timing = {})",
            timing::TARGET_SUBMIT_S * 1e3,
            timing::GPU_TIMESTAMPS,
            timing::WALL_CLOCK
        ),
        reps: opts.reps,
        prefill_tokens: PREFILL_TOKENS,
        adapters,
    })
}

/// The results of every variant for one `[rows, cols]` matrix in `ty` on `a`, or the reason
/// the shape is skipped (`Ok(Err(reason))`). A GPU error other than an allocation failure is
/// an `Err`.
#[allow(clippy::too_many_arguments)]
fn bench_matrix(
    a: &mut Adapter,
    opts: &KernelsOptions,
    ty: WeightFormat,
    rows: usize,
    cols: usize,
    probe_gbps: f64,
    progress: &mut impl FnMut(&str),
) -> Result<std::result::Result<Vec<KernelResult>, String>> {
    let block = ty.ggml().block_size();
    if !cols.is_multiple_of(block) {
        return Ok(Err(format!(
            "{cols} columns are not whole {block}-column blocks"
        )));
    }
    let keys: Vec<KernelKey> = a
        .keys
        .iter()
        .filter(|k| key_format(k) == Some(ty))
        .copied()
        .collect();
    if keys.is_empty() {
        return Ok(Err("no kernel variant for this format".into()));
    }
    if let Some(avail) = mem_available() {
        if host_bytes(rows, cols) > avail / 2 {
            return Ok(Err(format!(
                "the reference needs ~{} MiB of host memory, {} MiB available",
                host_bytes(rows, cols) >> 20,
                avail >> 20
            )));
        }
    }
    let n = PREFILL_TOKENS;
    let data = checks::weights(ty, rows, cols, 0x6265_6e63_686b)?;
    let packed = repack(ty, &data, rows, cols)?;
    let limit = a.ctx.limits.max_storage_buffer_binding_size;
    let biggest = (packed.quants.len().max(packed.scales.len()) as u64) * 4;
    let act_bytes = (n * cols.max(rows)) as u64 * 4;
    if biggest > limit || act_bytes > limit {
        return Ok(Err(format!(
            "a {}-byte buffer exceeds max_storage_buffer_binding_size {limit} (the backend \
             splits such matrices by rows; this bench does not)",
            biggest.max(act_bytes)
        )));
    }
    // x: [n, cols] seeded activations with outliers; token 0 is the matvec's input.
    let x = Rng(0x0bec_0000 ^ cols as u64).values(n * cols, 2.0);
    let mut reference = Reference::new(ty, &data, rows, cols, &x, n)?;
    drop(data);
    if opts.fault {
        // Test hook: a reference off by far more than any tolerance in every row.
        for w in reference.want.iter_mut().flatten() {
            *w += 1.0 + w.abs();
        }
    }
    let ctx = &a.ctx;
    let upload = |label: &str, v: &[f32]| kernels::upload_f32(ctx, label, v);
    let m = match kernels::upload_matrix(ctx, &packed) {
        Ok(m) => m,
        Err(e) => return Ok(Err(format!("upload failed: {e}"))),
    };
    drop(packed);
    let xb = upload("x", &x)?; // [n, cols]
                               // [n, cols / 4] codes and [n, cols / 32] scales: the prefill matmul quantizes every token,
                               // the matvecs token 0.
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; qx_words(n, cols).max(1)])?;
    let qd = upload("qd", &vec![0.0; 4 * qd_vec4s(n, cols).max(1)])?;
    let weight_bytes = m.quants.size() + m.scales.as_ref().map_or(0, |s| s.size());
    let mut out = Vec::new();
    for key in keys {
        let (timed, got) = bench_variant(a, opts, &m, key, &xb, &qx, &qd, &reference)?;
        let secs = timed.secs;
        let tokens = prefill_tokens(&key);
        let act = (cols as u64 + rows as u64) * 4 * tokens as u64;
        let q8_extra = if matches!(
            key,
            KernelKey::MatvecQ8 { .. }
                | KernelKey::MatvecQ8Rows { .. }
                | KernelKey::MatmulQ8Rows { .. }
        ) {
            // quantize_act writes, and the matvec reads, int8 codes and 16-byte chunk scales.
            2 * (cols as u64 + qd_vec4s(1, cols) as u64 * 16) * tokens as u64
        } else {
            0
        };
        let bytes = weight_bytes + act + q8_extra;
        let flops = 2 * (rows as u64) * (cols as u64) * tokens as u64;
        let checked = &reference.want[..got.len()];
        let v = check::judge(&got, checked, |i, r| reference.tol(&key, i, r, cols));
        let res = KernelResult {
            variant: variant_name(&key).unwrap_or_default(),
            format: ty.ggml().name().to_string(),
            rows,
            cols,
            n: tokens,
            median_us: secs * 1e6,
            launches: timed.calls,
            timing: timed.timing.into(),
            bytes,
            flops,
            gbps: bytes as f64 / secs / 1e9,
            gflops: flops as f64 / secs / 1e9,
            frac_bw: bytes as f64 / secs / 1e9 / probe_gbps,
            max_err: if v.max_err.is_nan() {
                None
            } else {
                Some(v.max_err)
            },
            tol: v.tol,
            ok: v.ok,
        };
        progress(&report::line(&res));
        out.push(res);
    }
    Ok(Ok(out))
}

/// Times `key` on `m` and reads its outputs: (the time per call, one `[rows]` output per
/// checked token of `reference`).
#[allow(clippy::too_many_arguments)]
fn bench_variant(
    a: &mut Adapter,
    opts: &KernelsOptions,
    m: &GpuMatrix,
    key: KernelKey,
    xb: &wgpu::Buffer,
    qx: &wgpu::Buffer,
    qd: &wgpu::Buffer,
    reference: &Reference,
) -> Result<(timing::Timed, Vec<Vec<f32>>)> {
    let (rows, cols, n) = (m.rows, m.cols, PREFILL_TOKENS);
    let Adapter { ctx, sets, .. } = a;
    let ks = kernel_set(ctx, sets, &key)?;
    ks.matvec_rows = matches!(
        key,
        KernelKey::MatvecRows { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatmulQ8Rows { .. }
    );
    let ks: &Kernels = ks;
    let ctx: &GpuContext = ctx;
    // [n, rows] for the matmul (every token written), [rows] otherwise; NaN until written, so
    // a kernel that writes nothing fails its check.
    let written = prefill_tokens(&key);
    let yb = &kernels::upload_f32(ctx, "y", &vec![f32::NAN; written * rows])?;
    let mut launches = Vec::new();
    if matches!(
        key,
        KernelKey::MatvecQ8 { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatmulQ8Rows { .. }
    ) {
        launches.push(ks.quantize_act_launch(xb, qx, qd, written, cols)?);
    }
    let launch = match key {
        KernelKey::Matmul { .. } => ks.matmul_launch(m, xb, yb, n, rows, 0)?,
        KernelKey::MatvecQ8 { .. }
        | KernelKey::MatvecQ8Rows { .. }
        | KernelKey::MatmulQ8Rows { .. } => ks.matvec_q8_launch(m, qx, qd, yb, written, rows, 0)?,
        _ => ks.matvec_launch(m, xb, yb)?,
    };
    if launch.key != key {
        return Err(Error::Gpu(format!(
            "bench of {} built a launch of {}",
            key.label(),
            launch.key.label()
        )));
    }
    launches.push(launch);
    let timed = timing::time_calls(ctx, ks, &launches, opts.reps, opts.wall_clock)?;
    let y = kernels::read_f32(ctx, yb, written * rows)?;
    let got = reference
        .tokens
        .iter()
        .filter(|&&t| t < written)
        .map(|&t| y[t * rows..(t + 1) * rows].to_vec())
        .collect();
    Ok((timed, got))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_are_the_matrix_kernels_named_without_the_format() {
        let mut names = std::collections::BTreeSet::new();
        for key in KernelKey::all() {
            match variant_name(&key) {
                Some(v) => {
                    assert!(key_format(&key).is_some(), "{key:?}");
                    // The kernel, then only the reduction and "f16" (the format is a column).
                    let mut words = v.split(' ');
                    let kernel = words.next().unwrap_or("");
                    assert!(
                        [
                            "matvec",
                            "matvec_rows",
                            "matvec_q8",
                            "matvec_q8_rows",
                            "matmul",
                            "matmul_q8_rows"
                        ]
                        .contains(&kernel),
                        "{v}"
                    );
                    assert!(
                        words.all(|w| ["workgroup", "subgroup", "f16"].contains(&w)),
                        "{v}"
                    );
                    names.insert(v);
                }
                None => assert!(key_format(&key).is_none(), "{key:?}"),
            }
        }
        for v in [
            "matvec workgroup",
            "matvec subgroup f16",
            "matvec_rows",
            "matvec_q8 subgroup",
            "matvec_q8_rows",
            "matmul",
            "matmul_q8_rows workgroup",
            "matmul_q8_rows subgroup",
        ] {
            assert!(names.contains(v), "{v}: {names:?}");
        }
    }

    #[test]
    fn shape_lists() {
        assert_eq!(shapes("7b").unwrap(), vec![(4096, 4096), (11008, 4096)]);
        assert_eq!(shapes("all").unwrap().len(), 8);
        assert!(shapes("13b").is_err());
    }
}
