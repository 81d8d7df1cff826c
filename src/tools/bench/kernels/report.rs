//! The report of `memwall bench-kernels` (its JSON is the `memwall.bench-kernels/2` schema in
//! the parent module's docs) and its terminal table.

use std::fmt::Write;

/// The whole run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelsReport {
    pub schema: String,
    /// How the times were taken.
    pub clock: String,
    /// Timed submissions per result.
    pub reps: usize,
    /// Tokens of the matmul rows.
    pub prefill_tokens: usize,
    pub adapters: Vec<AdapterReport>,
}

/// One adapter's results, keyed for side-by-side comparison by name, backend and driver.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub device_type: String,
    /// Whether the adapter has TIMESTAMP_QUERY.
    pub timestamp_query: bool,
    /// The kernels' clock here: `gpu-timestamps` or `wall-clock`.
    pub timing: String,
    /// Measured read bandwidth (GB/s, 1e9 bytes/s): the roof `frac_bw` divides by.
    pub probe_gbps: f64,
    /// Measured f32 fma throughput (GFLOP/s): the compute roof.
    pub peak_gflops: f64,
    pub results: Vec<KernelResult>,
    pub skipped: Vec<Skipped>,
}

/// One variant x format x shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelResult {
    /// e.g. `matvec subgroup f16`, `matvec_q8_rows`, `matmul`.
    pub variant: String,
    /// ggml name, e.g. `Q4_0`.
    pub format: String,
    pub rows: usize,
    pub cols: usize,
    /// Tokens per call (1 for the matvecs).
    pub n: usize,
    /// Median time per call, microseconds.
    pub median_us: f64,
    /// Calls per timed submission.
    pub launches: usize,
    /// The clock of `median_us`: `gpu-timestamps` or `wall-clock`.
    pub timing: String,
    /// Bytes moved per call (weights + activations in and out).
    pub bytes: u64,
    /// 2 rows cols n.
    pub flops: u64,
    pub gbps: f64,
    pub gflops: f64,
    /// gbps / the adapter's probe_gbps.
    pub frac_bw: f64,
    /// |got - exact| of the checked element closest to its tolerance (largest error /
    /// tolerance, as `memwall selftest` reports; None: an output was NaN).
    pub max_err: Option<f64>,
    /// That element's tolerance: `ok` means every element is within its own.
    pub tol: f64,
    pub ok: bool,
}

/// A format x shape not run, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Skipped {
    pub format: String,
    pub rows: usize,
    pub cols: usize,
    pub reason: String,
}

impl KernelsReport {
    /// Results whose correctness check failed.
    pub fn failures(&self) -> usize {
        self.adapters
            .iter()
            .flat_map(|a| &a.results)
            .filter(|r| !r.ok)
            .count()
    }
}

/// One result as a progress line.
pub fn line(r: &KernelResult) -> String {
    format!(
        "{:<22} {:<5} [{} x {}] x{}: {:.1} us ({}), {:.2} GB/s ({:.0}% of probe), {:.2} GFLOP/s, {}",
        r.variant,
        r.format,
        r.rows,
        r.cols,
        r.n,
        r.median_us,
        r.timing,
        r.gbps,
        r.frac_bw * 100.0,
        r.gflops,
        if r.ok { "ok" } else { "FAIL" }
    )
}

/// The terminal table: one block per adapter.
pub fn table(rep: &KernelsReport) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(s, "clock: {}; {} repetitions", rep.clock, rep.reps);
    for a in &rep.adapters {
        let _ = writeln!(
            s,
            "\n{} ({}, {} {}): read probe {:.2} GB/s; compute roof {:.1} GFLOP/s; timed by {}",
            a.name, a.backend, a.driver, a.driver_info, a.probe_gbps, a.peak_gflops, a.timing
        );
        let _ = writeln!(
            s,
            "{:<22} {:<5} {:>13} {:>3} {:>11} {:<5} {:>8} {:>9} {:>7} {:>10} {:>10}  check",
            "variant",
            "fmt",
            "rows x cols",
            "n",
            "median us",
            "clock",
            "GB/s",
            "GFLOP/s",
            "of bw",
            "max err",
            "tol"
        );
        for r in &a.results {
            let _ = writeln!(
                s,
                "{:<22} {:<5} {:>13} {:>3} {:>11.1} {:<5} {:>8.2} {:>9.2} {:>6.0}% {:>10} {:>10.2e}  {}",
                r.variant,
                r.format,
                format!("{}x{}", r.rows, r.cols),
                r.n,
                r.median_us,
                if r.timing == super::timing::GPU_TIMESTAMPS {
                    "gpu"
                } else {
                    "wall"
                },
                r.gbps,
                r.gflops,
                r.frac_bw * 100.0,
                r.max_err.map_or("NaN".into(), |e| format!("{e:.2e}")),
                r.tol,
                if r.ok { "ok" } else { "FAIL" }
            );
        }
        for k in &a.skipped {
            let _ = writeln!(
                s,
                "skipped {} [{} x {}]: {}",
                k.format, k.rows, k.cols, k.reason
            );
        }
    }
    let _ = writeln!(s, "\n{} correctness failures", rep.failures());
    s
}
