//! `memwall selftest`: the driver check an app runs on first start. Every kernel variant the
//! adapter can run (workgroup-memory reductions always, `subgroupAdd` ones with `SUBGROUP`,
//! native-f16 ones with `SHADER_F16`) runs on seeded random inputs with outliers and odd sizes
//! into NaN-poisoned outputs, and is compared with kernels-ref under a tolerance derived from
//! the precision and the reduction length.
//!
//! Adding a kernel: give [`check_key`]'s `match` an arm calling a check fn in [`checks`] (the
//! match has no wildcard arm, so a new [`KernelKey`] variant does not compile until it is
//! covered). A check fn builds its inputs, runs the launch through [`prepare`] (which refuses a
//! launch whose key is not the one under test) and feeds each result to a [`Worst`].

pub(crate) mod checks;
pub use checks::rope_tolerance;
mod checks_attention;
mod checks_fused;
mod checks_moe;
mod checks_prefill;
mod checks_probe;
pub(crate) mod checks_q8;

use std::collections::HashSet;
use std::fmt::Write;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::health::layouts::AdapterFacts;
use crate::gpu::kernels::{self, Dispatch, KernelOptions, Kernels, Launch};
use crate::gpu::registry::KernelKey;

/// f32 unit roundoff (round to nearest).
pub(crate) const U: f64 = 1.0 / (1u64 << 24) as f64;

/// NaN guard elements appended to every output buffer: they must survive the kernel.
pub(crate) const GUARDS: usize = 3;

/// One kernel variant's result, as `memwall selftest` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SelftestRow {
    /// The op, e.g. `matvec`.
    pub kernel: String,
    /// The variant, e.g. `q4_0 subgroup` (see [`names`]).
    pub variant: String,
    /// Error of the element closest to its tolerance, over every case the check ran (NaN or
    /// infinity for an unwritten element or an overwritten guard).
    pub max_err: f64,
    /// That element's tolerance.
    pub tol: f64,
    pub pass: bool,
}

/// Whether `ctx`'s device has the features (and subgroup size) `key` needs.
pub fn runnable(ctx: &GpuContext, key: &KernelKey) -> bool {
    (!key.uses_subgroups() || ctx.has_subgroups())
        && (!key.uses_f16() || ctx.has_f16())
        && key.min_subgroup_size() <= ctx.info.subgroup_min_size
}

/// Every variant of [`KernelKey::all`] `ctx` can run and its kernel sets launch
/// ([`AdapterFacts::launches`]), in that order.
pub fn runnable_keys(ctx: &GpuContext) -> Vec<KernelKey> {
    let facts = AdapterFacts::of(ctx);
    KernelKey::all()
        .into_iter()
        .filter(|k| runnable(ctx, k) && facts.launches(facts.subgroups, k))
        .collect()
}

/// The (kernel, variant) names of `key`'s row: the op, then the weight format, the
/// reduction ("workgroup" or "subgroup") and "f16" (native-f16 weight decoding) where the key
/// has them ("-" when it has none).
pub fn names(key: &KernelKey) -> (String, String) {
    let reduction = if key.uses_subgroups() {
        "subgroup"
    } else {
        "workgroup"
    };
    let h = if key.uses_f16() { " f16" } else { "" };
    let fmt = |ty: crate::gpu::WeightFormat| ty.ggml().name().to_lowercase();
    let (kernel, variant) = match *key {
        KernelKey::Matvec { ty, .. } => ("matvec", format!("{} {reduction}{h}", fmt(ty))),
        KernelKey::RmsNorm { .. } => ("rmsnorm", reduction.to_string()),
        KernelKey::Softmax { .. } => ("softmax", reduction.to_string()),
        KernelKey::Rope => ("rope", "-".into()),
        KernelKey::Swiglu => ("swiglu", "-".into()),
        KernelKey::Add => ("add", "-".into()),
        KernelKey::Argmax => ("argmax", "-".into()),
        KernelKey::Embedding { ty, .. } => ("embedding", format!("{}{h}", fmt(ty))),
        KernelKey::Matmul { ty } => ("matmul", fmt(ty)),
        KernelKey::MatvecRows { ty } => ("matvec_rows", fmt(ty)),
        KernelKey::QuantizeAct => ("quantize_act", "-".into()),
        KernelKey::MatvecQ8Rows { ty } => ("matvec_q8_rows", fmt(ty)),
        KernelKey::MatvecQ8 { ty, .. } => ("matvec_q8", format!("{} {reduction}", fmt(ty))),
        KernelKey::MatvecQ8Out { ty, out, .. } => (
            "matvec_q8_out",
            format!("{} {} {reduction}", out.name(), fmt(ty)),
        ),
        KernelKey::MatvecQ8RowsOut { ty, out } => {
            ("matvec_q8_rows_out", format!("{} {}", out.name(), fmt(ty)))
        }
        KernelKey::MatmulQ8Rows { ty, out, .. } => (
            "matmul_q8_rows",
            match out {
                Some(o) => format!("{} {} {reduction}", o.name(), fmt(ty)),
                None => format!("{} {reduction}", fmt(ty)),
            },
        ),
        KernelKey::RmsNormQuant { .. } => ("rmsnorm_quant", reduction.to_string()),
        KernelKey::SwigluQuant => ("swiglu_quant", "-".into()),
        KernelKey::AddBias => ("add_bias", "-".into()),
        KernelKey::KvStore { ty } => ("kv_store", ty.name().into()),
        KernelKey::AttentionSplit { kv, .. } => {
            ("attention_split", format!("{reduction} {}", kv.signature()))
        }
        KernelKey::AttentionCombine { .. } => ("attention_combine", reduction.to_string()),
        KernelKey::AttentionPrefill { kv } => ("attention_prefill", kv.signature()),
        KernelKey::AttentionPrefillLanes { kv } => ("attention_prefill_lanes", kv.signature()),
        KernelKey::BandwidthProbe => ("bandwidth_probe", "-".into()),
        KernelKey::MoeRoute => ("moe_route", "-".into()),
        KernelKey::MatvecExperts { ty, q8 } => (
            if q8 {
                "matvec_experts_q8"
            } else {
                "matvec_experts"
            },
            fmt(ty),
        ),
        KernelKey::MoeCombine => ("moe_combine", "-".into()),
    };
    (kernel.to_string(), variant)
}

/// The worst element over a check's cases, judged by error / tolerance.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Worst {
    ratio: f64,
    err: f64,
    tol: f64,
    /// Whether any element was added.
    seen: bool,
}

impl Worst {
    pub(crate) fn new() -> Worst {
        Worst {
            ratio: 0.0,
            err: 0.0,
            tol: 0.0,
            seen: false,
        }
    }

    /// One element: |got - want| against `tol`. NaN (an unwritten element) is infinitely bad;
    /// a zero tolerance demands an exact result.
    pub(crate) fn add(&mut self, got: f64, want: f64, tol: f64) {
        let err = if got == want { 0.0 } else { (got - want).abs() };
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else if err == 0.0 {
            0.0
        } else if tol == 0.0 {
            f64::INFINITY
        } else {
            err / tol
        };
        if !self.seen || ratio > self.ratio || (ratio == self.ratio && err > self.err) {
            *self = Worst {
                ratio,
                err,
                tol,
                seen: true,
            };
        }
    }

    /// Every element of `got` against `want`, element `i` with tolerance `tol(i)`.
    pub(crate) fn add_all(&mut self, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f64) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            self.add(f64::from(g), f64::from(w), tol(i));
        }
        if got.len() != want.len() {
            self.fail();
        }
    }

    /// Something no tolerance covers (an overwritten guard element).
    pub(crate) fn fail(&mut self) {
        self.ratio = f64::INFINITY;
        self.err = f64::INFINITY;
        self.seen = true;
    }

    fn row(&self, key: &KernelKey) -> SelftestRow {
        let (kernel, variant) = names(key);
        SelftestRow {
            kernel,
            variant,
            max_err: self.err,
            tol: self.tol,
            // A check that compared nothing proves nothing.
            pass: self.seen && self.ratio <= 1.0,
        }
    }
}

/// Creates `launch`'s dispatch, refusing one for another kernel than `key` (so a row always
/// names the variant that actually ran).
pub(crate) fn prepare(
    ctx: &GpuContext,
    ks: &Kernels,
    launch: Launch<'_>,
    key: KernelKey,
) -> Result<Dispatch> {
    if launch.key != key {
        return Err(Error::Gpu(format!(
            "selftest of {} built a launch of {}",
            key.label(),
            launch.key.label()
        )));
    }
    ks.prepare(ctx, launch)
}

/// An f32 buffer holding `v` followed by [`GUARDS`] NaNs.
pub(crate) fn poisoned(ctx: &GpuContext, label: &str, v: &[f32]) -> Result<wgpu::Buffer> {
    let mut p = v.to_vec();
    p.extend([f32::NAN; GUARDS]);
    kernels::upload_f32(ctx, label, &p)
}

/// Runs `d`, reads `n` results of `buf` and its guards; an overwritten guard fails `w`.
pub(crate) fn run_read(
    ctx: &GpuContext,
    d: &Dispatch,
    buf: &wgpu::Buffer,
    n: usize,
    w: &mut Worst,
) -> Result<Vec<f32>> {
    kernels::run(ctx, &[d])?;
    read_guarded(ctx, buf, n, w)
}

/// The grid limit for a check's small-grid case, from its launches planned under the
/// device's limit: the smallest `g` with `g * g` covering the largest launch's workgroups,
/// so that launch becomes a 2-D dispatch (with surplus workgroups on its last line unless
/// its count is a square). An error when no launch has the 3 workgroups that takes: a
/// small-grid case that stays 1-D would prove nothing about the 2-D path.
pub(crate) fn small_grid(launches: &[Launch<'_>]) -> Result<u32> {
    let most = launches
        .iter()
        .map(|l| u64::from(l.groups.0) * u64::from(l.groups.1))
        .max()
        .unwrap_or(0);
    if most < 3 {
        return Err(Error::Gpu(format!(
            "selftest small-grid case has {most} workgroups, too few for a 2-D dispatch"
        )));
    }
    let mut g = 1u64;
    while g * g < most {
        g += 1;
    }
    u32::try_from(g).map_err(|_| Error::Gpu(format!("{most} workgroups")))
}

/// Reads `n` results of `buf` and its guards; an overwritten guard fails `w`.
pub(crate) fn read_guarded(
    ctx: &GpuContext,
    buf: &wgpu::Buffer,
    n: usize,
    w: &mut Worst,
) -> Result<Vec<f32>> {
    let mut got = kernels::read_f32(ctx, buf, n + GUARDS)?;
    if !got[n..].iter().all(|v| v.is_nan()) {
        w.fail();
    }
    got.truncate(n);
    Ok(got)
}

/// xorshift64*, seeded: the same inputs on every run and machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly normal values scaled by `scale`; every 97th is a 50x outlier (activation
    /// outliers are real, and they stress the tolerances).
    pub(crate) fn values(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (self.uniform() + self.uniform() + self.uniform() - 1.5) * scale;
                (if i % 97 == 13 { v * 50.0 } else { v }) as f32
            })
            .collect()
    }
}

/// The options of the [`Kernels`] set that launches `key`.
fn options(key: &KernelKey) -> KernelOptions {
    KernelOptions {
        subgroup: key.uses_subgroups(),
        f16: key.uses_f16(),
    }
}

/// Runs `key`'s check. One arm per kernel, no wildcard: a new variant must be added here.
fn check_key(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    match key {
        KernelKey::Matvec { ty, .. } => {
            ks.matvec_rows = false;
            checks::matvec(ctx, ks, key, ty)
        }
        KernelKey::RmsNorm { .. } => checks::rms_norm(ctx, ks, key),
        KernelKey::Softmax { .. } => checks::softmax(ctx, ks, key),
        KernelKey::Rope => checks::rope(ctx, ks, key),
        KernelKey::Swiglu => checks::swiglu(ctx, ks, key),
        KernelKey::Add => checks::add(ctx, ks, key),
        KernelKey::Argmax => checks::argmax(ctx, ks, key),
        KernelKey::Embedding { ty, .. } => checks::embedding(ctx, ks, key, ty),
        KernelKey::Matmul { ty } => checks_prefill::matmul(ctx, ks, key, ty),
        KernelKey::AddBias => checks_prefill::add_bias(ctx, ks, key),
        KernelKey::KvStore { ty } => checks_attention::kv_store(ctx, ks, key, ty),
        // The split path is one pair of launches (split, then combine over its scratch):
        // neither half has an oracle of its own, so both rows run and judge the pair (the
        // combine row with the f32 caches; the split rows per cache type pair).
        KernelKey::AttentionSplit { subgroup, kv } => {
            checks_attention::split_pair(ctx, ks, key, KernelKey::AttentionCombine { subgroup }, kv)
        }
        KernelKey::AttentionCombine { subgroup } => checks_attention::split_pair(
            ctx,
            ks,
            KernelKey::AttentionSplit {
                subgroup,
                kv: crate::kv_type::KvTypes::F32,
            },
            key,
            crate::kv_type::KvTypes::F32,
        ),
        // The tiled prefill is asked for by its path (also where the set takes the lanes
        // variant); the lanes variant is only checked where its set chooses it
        // (runnable_keys), and `prepare` refuses a launch of the other one.
        KernelKey::AttentionPrefill { kv } => checks_attention::prefill(ctx, ks, key, kv),
        KernelKey::AttentionPrefillLanes { kv } => {
            checks_attention::prefill_lanes(ctx, ks, key, kv)
        }
        // The row layouts and the 8-bit path are chosen per launch by `Kernels` fields: set
        // them for the variant under test (run_selftest restores the defaults).
        KernelKey::MatvecRows { ty } => {
            ks.matvec_rows = true;
            checks::matvec(ctx, ks, key, ty)
        }
        KernelKey::QuantizeAct => checks_q8::quantize_act(ctx, ks, key),
        KernelKey::MatvecQ8 { ty, .. } => checks_q8::matvec_q8(ctx, ks, key, ty, false, None),
        KernelKey::MatvecQ8Rows { ty } => checks_q8::matvec_q8(ctx, ks, key, ty, true, None),
        KernelKey::MatvecQ8Out { ty, out, .. } => {
            checks_q8::matvec_q8(ctx, ks, key, ty, false, Some(out))
        }
        KernelKey::MatvecQ8RowsOut { ty, out } => {
            checks_q8::matvec_q8(ctx, ks, key, ty, true, Some(out))
        }
        KernelKey::MatmulQ8Rows { ty, out, .. } => {
            checks_q8::matvec_q8(ctx, ks, key, ty, true, out)
        }
        KernelKey::RmsNormQuant { .. } => checks_fused::rms_norm_quant(ctx, ks, key),
        KernelKey::SwigluQuant => checks_fused::swiglu_quant(ctx, ks, key),
        KernelKey::BandwidthProbe => checks_probe::bandwidth_probe(ctx, ks, key),
        KernelKey::MoeRoute => checks_moe::moe_route(ctx, ks, key),
        KernelKey::MatvecExperts { ty, q8 } => checks_moe::matvec_experts(ctx, ks, key, ty, q8),
        KernelKey::MoeCombine => checks_moe::moe_combine(ctx, ks, key),
    }
}

/// Runs single variants' checks, compiling each [`KernelOptions`] set once, when first needed.
pub struct Runner<'c> {
    ctx: &'c GpuContext,
}

impl<'c> Runner<'c> {
    pub fn new(ctx: &'c GpuContext) -> Runner<'c> {
        Runner { ctx }
    }

    /// `key`'s row. A GPU error (compilation, validation, device loss) is an `Err` naming the
    /// kernel.
    pub fn check(&mut self, key: KernelKey) -> Result<SelftestRow> {
        // Each check compiles its pipelines afresh and drops them after: a driver that
        // JIT-compiles (llvmpipe) holds each pipeline's machine code until it is destroyed, and
        // keeping every variant's would hold ~1 GB at a first start, whatever the memory budget.
        let mut ks = Kernels::with_health_for(self.ctx, options(&key), &HashSet::new(), |_| false)?;
        let w = check_key(self.ctx, &mut ks, key).map_err(|e| match e {
            // A lost device or exhausted memory says nothing about the kernel: the caller
            // tells them apart from a kernel's own failure.
            e @ (Error::DeviceLost { .. } | Error::OutOfMemory { .. }) => e,
            e => Error::Gpu(format!("selftest {}: {e}", key.label())),
        })?;
        Ok(w.row(&key))
    }
}

/// Checks every kernel variant `ctx` can run against kernels-ref, one row per variant (in
/// [`KernelKey::all`]'s order). A kernel that computes wrong values gives a failing row; a
/// GPU error (compilation, validation, device loss) is an `Err` naming the kernel.
pub fn run_selftest(ctx: &GpuContext) -> Result<Vec<SelftestRow>> {
    let mut runner = Runner::new(ctx);
    runnable_keys(ctx)
        .into_iter()
        .map(|key| runner.check(key))
        .collect()
}

/// `rows` as the table `memwall selftest` prints.
pub fn table(rows: &[SelftestRow]) -> String {
    let mut s = String::new();
    let kw = rows
        .iter()
        .map(|r| r.kernel.len())
        .chain([6])
        .max()
        .unwrap_or(6);
    let vw = rows
        .iter()
        .map(|r| r.variant.len())
        .chain([7])
        .max()
        .unwrap_or(7);
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "{:kw$}  {:vw$}  {:>10}  {:>10}  result",
        "kernel", "variant", "max error", "tolerance"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:kw$}  {:vw$}  {:>10.3e}  {:>10.3e}  {}",
            r.kernel,
            r.variant,
            r.max_err,
            r.tol,
            if r.pass { "pass" } else { "FAIL" }
        );
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    let _ = writeln!(
        s,
        "{} variants, {} passed, {failed} failed",
        rows.len(),
        rows.len() - failed
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_keeps_the_element_closest_to_failing() {
        let mut w = Worst::new();
        w.add(1.0, 1.0, 0.0);
        assert!(w.ratio == 0.0);
        w.add(1.5, 1.0, 1.0);
        w.add(1.1, 1.0, 0.01);
        assert!((w.err - 0.1).abs() < 1e-12 && w.tol == 0.01 && w.ratio > 1.0);
        let mut w = Worst::new();
        w.add(f64::NAN, 1.0, 1e9);
        assert!(w.ratio.is_infinite() && !w.row(&KernelKey::Add).pass);
        let mut w = Worst::new();
        w.add(2.0, 1.0, 0.0);
        assert!(!w.row(&KernelKey::Add).pass);
        let mut w = Worst::new();
        w.add_all(&[1.0, 2.0], &[1.0, 2.0], |_| 0.0);
        assert!(w.row(&KernelKey::Add).pass);
        w.fail();
        assert!(!w.row(&KernelKey::Add).pass);
    }

    #[test]
    fn small_grid_makes_the_largest_launch_2d() {
        let launch = |groups| Launch::new(KernelKey::Add, &[0u32; 4], &[], 2, groups);
        for most in [3u32, 4, 5, 40, 1000] {
            let g = small_grid(&[launch((1, 1)), launch((most, 1))]).unwrap();
            let (x, y) = kernels::grid(most, g).unwrap();
            assert!(y > 1 && x * y >= most, "{most}: {g}");
        }
        // Planned launches may already be 2-D: their total counts.
        assert_eq!(small_grid(&[launch((7, 6))]).unwrap(), 7);
        assert!(small_grid(&[launch((2, 1))]).is_err());
        assert!(small_grid(&[]).is_err());
    }

    #[test]
    fn names_are_distinct() {
        let all = KernelKey::all();
        let set: std::collections::HashSet<_> = all.iter().map(names).collect();
        assert_eq!(set.len(), all.len());
    }

    #[test]
    fn table_marks_failures() {
        let row = |pass| SelftestRow {
            kernel: "add".into(),
            variant: "-".into(),
            max_err: 0.0,
            tol: 0.0,
            pass,
        };
        let t = table(&[row(true), row(false)]);
        assert!(t.contains("pass") && t.contains("FAIL") && t.contains("1 failed"));
    }
}
