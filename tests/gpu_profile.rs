//! The recorder's per-kernel profile (`MEMWALL_GPU_PROFILE=1`): every launch is submitted and
//! waited for alone, an empty submit + wait is sampled beside each, and the report gives it
//! apart (with each kernel's figure net of it) without counting it as a kernel. The launches
//! must still compute what they compute unprofiled.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the GL path). With no adapter this
//! test FAILS: a GPU test must never pass silently.

mod common;
mod gpu_support;

use std::collections::HashMap;

use gpu_support::context;
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::recorder::Recorder;
use memwall::gpu::KernelKey;

#[test]
fn profile_counts_each_kernel_and_reports_the_round_trip_apart() {
    let ctx = context();
    let ks = Kernels::with_options(&ctx, false).unwrap();
    let n = 96;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32 + 1.0).collect();
    // x: [n] f32, accumulates y: [n] f32 three times.
    let x = kernels::upload_f32(&ctx, "x", &a).unwrap();
    let y = kernels::upload_f32(&ctx, "y", &b).unwrap();
    let mut rec = Recorder::new(&ctx).unwrap();
    rec.profile = Some(HashMap::new());
    for _ in 0..3 {
        let l = ks.elementwise_launch(KernelKey::Add, &x, &y, n).unwrap();
        rec.record(&ctx, &ks, l).unwrap();
    }
    rec.flush(&ctx).unwrap();
    let got = kernels::read_f32(&ctx, &x, n).unwrap();
    for i in 0..n {
        assert_eq!(got[i], a[i] + b[i] + b[i] + b[i], "x[{i}]");
    }
    let report = rec.profile_report().expect("a profile");
    let mut lines = report.lines();
    let head = lines.next().unwrap();
    assert!(head.contains("empty submit + wait takes"), "{report}");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "one kernel, no round-trip row:\n{report}");
    let add = KernelKey::Add.label();
    let fields: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(fields[0], add, "{report}");
    assert_eq!(fields[1], "3", "three launches:\n{report}");
    assert!(rows[0].ends_with("net"), "{report}");
}
