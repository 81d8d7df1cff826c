//! `memwall selftest`: the library check covers every kernel variant the adapter can run and
//! passes, and the built binary prints a row per variant and exits 0.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the GL path). With no adapter these
//! tests FAIL: a GPU test must never pass silently.

mod common;
mod gpu_support;

use std::collections::HashSet;
use std::process::Command;

use gpu_support::context;
use memwall::gpu::health::selftest::{names, run_selftest, SelftestRow};
use memwall::gpu::{GpuContext, KernelKey};

/// Whether the adapter's kernel sets take the prefill lanes attention: CPU-like with
/// subgroups of 8 or more (lavapipe).
fn takes_lanes(ctx: &GpuContext) -> bool {
    ctx.has_subgroups() && ctx.info.device_type == "Cpu" && ctx.info.subgroup_min_size >= 8
}

/// What the adapter can run and its kernel sets launch, decided here from its features (not
/// by the selftest's own filter, which is what is under test).
fn expected(ctx: &GpuContext) -> HashSet<(String, String)> {
    KernelKey::all()
        .iter()
        .filter(|k| {
            (!k.uses_subgroups() || ctx.has_subgroups())
                && (!k.uses_f16() || ctx.has_f16())
                && k.min_subgroup_size() <= ctx.info.subgroup_min_size
                && (!matches!(k, KernelKey::AttentionPrefillLanes { .. }) || takes_lanes(ctx))
        })
        .map(names)
        .collect()
}

fn memwall(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn selftest_covers_every_runnable_variant_and_passes() {
    let ctx = context();
    let rows = run_selftest(&ctx).unwrap();
    for r in &rows {
        eprintln!(
            "{:10} {:16} err {:.3e} tol {:.3e} {}",
            r.kernel, r.variant, r.max_err, r.tol, r.pass
        );
    }
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.kernel.clone(), r.variant.clone()))
        .collect();
    let set: HashSet<_> = got.iter().cloned().collect();
    assert_eq!(set.len(), got.len(), "a variant ran twice: {got:?}");
    assert_eq!(set, expected(&ctx));
    // Both reductions where the adapter has subgroups, and both weight decodings where it has
    // f16, so the filter is not trivially empty.
    let wg = got.iter().filter(|(_, v)| v.contains("workgroup")).count();
    let sg = got.iter().filter(|(_, v)| v.contains("subgroup")).count();
    assert!(wg > 0);
    assert_eq!(sg > 0, ctx.has_subgroups());
    let h = got.iter().filter(|(_, v)| v.ends_with(" f16")).count();
    assert_eq!(h > 0, ctx.has_f16());
    // The lanes attention is tested where it is chosen (lavapipe), and only there.
    let lanes = got
        .iter()
        .filter(|(k, _)| k == "attention_prefill_lanes")
        .count();
    assert_eq!(lanes > 0, takes_lanes(&ctx));
    let failed: Vec<&SelftestRow> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "failing variants: {failed:?}");
}

#[test]
fn cli_prints_a_passing_row_per_variant() {
    let ctx = context();
    let out = memwall(&["selftest"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "exit {:?}", out.status);
    let want = expected(&ctx);
    let lines: Vec<&str> = stdout.lines().collect();
    for (kernel, variant) in &want {
        let n = lines
            .iter()
            .filter(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // kernel, variant words, max error, tolerance, result
                cols.len() >= 5
                    && cols[0] == kernel
                    && cols[1..cols.len() - 3].join(" ") == *variant
                    && cols[cols.len() - 1] == "pass"
            })
            .count();
        assert_eq!(n, 1, "row {kernel} {variant}");
    }
    assert!(stdout.contains(&format!("{} variants, {0} passed, 0 failed", want.len())));
}

#[test]
fn cli_json_lists_every_variant() {
    let ctx = context();
    let out = memwall(&["selftest", "--device", "auto", "--json"]);
    assert!(out.status.success(), "exit {:?}", out.status);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let got: HashSet<(String, String)> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["pass"], serde_json::Value::Bool(true), "{r}");
            assert!(r["max_err"].as_f64().unwrap() <= r["tol"].as_f64().unwrap());
            (
                r["kernel"].as_str().unwrap().to_string(),
                r["variant"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(got.len(), rows.len());
    assert_eq!(got, expected(&ctx));
}

#[test]
fn cli_refuses_cpu_and_missing_adapters() {
    let _ = context();
    let out = memwall(&["selftest", "--device", "cpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU driver"), "{err}");
    let out = memwall(&["selftest", "--device", "9999"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no adapter"), "{err}");
}
