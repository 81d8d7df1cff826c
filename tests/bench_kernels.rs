//! `memwall bench-kernels --smoke` end to end on the default adapter (lavapipe in CI; the GL
//! line of scripts/test.sh runs it on llvmpipe): the JSON schema field by field, the derived
//! figures recomputed, every correctness check passing, the timing source consistent with the
//! adapter's TIMESTAMP_QUERY (and `--wall-clock` forcing the fallback), a positive compute
//! roof; the fault hook must make every check fail and the command exit non-zero; the roofline
//! SVG is well-formed with one point per result and both roofs. FAILS (never skips) without an
//! adapter.

mod common;

use common::json::{int, memwall, num, text};
use serde_json::Value;

/// Checks the minimal XML structure: one root `<svg>` element, every tag closed in order.
/// Returns the number of `<circle class="point"` elements.
fn check_svg(svg: &str) -> usize {
    assert!(svg.starts_with("<svg"), "SVG starts with {:?}", &svg[..20]);
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    let mut closed_root = false;
    while let Some(i) = rest.find('<') {
        assert!(!closed_root, "content after the root element");
        let end = rest[i..].find('>').expect("unterminated tag") + i;
        let tag = &rest[i + 1..end];
        assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().expect("closing tag without an open one");
            assert_eq!(open, name.trim(), "mismatched closing tag");
            closed_root = stack.is_empty();
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().expect("tag name").to_string();
            stack.push(name);
        }
        rest = &rest[end + 1..];
    }
    assert!(stack.is_empty() && closed_root, "unclosed: {stack:?}");
    // Text outside tags must not carry a raw '&' that is not an entity.
    for (i, _) in svg.match_indices('&') {
        let ent = &svg[i..svg[i..].find(';').map_or(svg.len(), |e| i + e + 1)];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;"].contains(&ent),
            "bad entity {ent}"
        );
    }
    svg.matches(r#"<circle class="point""#).count()
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("memwall-bk-{}-{name}", std::process::id()))
}

#[test]
fn smoke_json_schema_checks_and_plot() {
    let svg_path = tmp("roofline.svg");
    let o = memwall(&[
        "bench-kernels",
        "--smoke",
        "--json",
        "--plot",
        svg_path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench-kernels failed: {stderr}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(text(&v, "schema"), "memwall.bench-kernels/2");
    assert!(!text(&v, "clock").is_empty());
    assert_eq!(int(&v, "reps"), 2);
    let n_prefill = int(&v, "prefill_tokens");
    let adapters = v["adapters"].as_array().expect("adapters");
    assert_eq!(adapters.len(), 1, "--device auto: one adapter");
    let mut n_results = 0;
    for a in adapters {
        for key in ["name", "backend", "driver", "driver_info", "device_type"] {
            text(a, key);
        }
        let probe = num(a, "probe_gbps");
        assert!(probe > 0.0 && probe.is_finite());
        let peak = num(a, "peak_gflops");
        assert!(peak > 0.0 && peak.is_finite(), "compute roof {peak}");
        // Timestamps exactly where the adapter has them (a stamp pair read back unusable
        // would demote a result to the wall clock, never the other way).
        let stamps = a["timestamp_query"].as_bool().expect("timestamp_query");
        let timing = text(a, "timing");
        assert_eq!(
            timing,
            if stamps {
                "gpu-timestamps"
            } else {
                "wall-clock"
            },
            "adapter timing vs TIMESTAMP_QUERY"
        );
        let results = a["results"].as_array().expect("results");
        let mut variants = std::collections::BTreeSet::new();
        let mut formats = std::collections::BTreeSet::new();
        for r in results {
            let variant = text(r, "variant");
            variants.insert(variant.split(' ').next().unwrap().to_string());
            formats.insert(text(r, "format").to_string());
            let (rows, cols, n) = (int(r, "rows"), int(r, "cols"), int(r, "n"));
            assert!(
                [(37, 256), (64, 512)].contains(&(rows, cols)),
                "smoke shape {rows}x{cols}"
            );
            let want_n = if variant.starts_with("matmul") {
                n_prefill
            } else {
                1
            };
            assert_eq!(n, want_n, "{variant}");
            assert_eq!(int(r, "flops"), 2 * rows * cols * n);
            let bytes = int(r, "bytes");
            // At least the activations in and out, at most f32 weights plus them (x2 for the
            // 8-bit path's codes).
            assert!(
                bytes >= 4 * (rows + cols) * n && bytes <= 4 * rows * cols + 12 * (rows + cols) * n
            );
            let us = num(r, "median_us");
            assert!(us > 0.0 && us.is_finite());
            assert!(int(r, "launches") >= 1);
            let rt = text(r, "timing");
            assert!(
                rt == timing || rt == "wall-clock",
                "result timed by {rt} on an adapter timed by {timing}"
            );
            let gbps = bytes as f64 / us / 1e3;
            assert!((num(r, "gbps") - gbps).abs() <= 1e-9 * gbps);
            let gflops = (2 * rows * cols * n) as f64 / us / 1e3;
            assert!((num(r, "gflops") - gflops).abs() <= 1e-9 * gflops);
            assert!((num(r, "frac_bw") - gbps / probe).abs() <= 1e-9 * gbps / probe);
            let err = num(r, "max_err");
            let tol = num(r, "tol");
            assert!(err.is_finite() && tol > 0.0 && err <= tol, "{r}");
            assert_eq!(r["ok"], Value::Bool(true), "correctness check failed: {r}");
            n_results += 1;
        }
        for k in ["matvec", "matvec_q8", "matmul", "matmul_q8_rows"] {
            assert!(variants.contains(k), "no {k} variant: {variants:?}");
        }
        for f in ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16"] {
            assert!(formats.contains(f), "no {f} result: {formats:?}");
        }
        assert!(a["skipped"].is_array());
    }
    let svg = std::fs::read_to_string(&svg_path).expect("--plot wrote the SVG");
    assert_eq!(check_svg(&svg), n_results, "one point per result");
    assert!(
        svg.contains(r#"class="roof bandwidth""#),
        "a bandwidth roof line"
    );
    assert!(
        svg.contains(r#"class="roof compute""#),
        "a compute roof line"
    );
    let _ = std::fs::remove_file(&svg_path);
}

/// The correctness column can fail: with every reference perturbed, every row says FAIL and
/// the command exits non-zero.
#[test]
fn smoke_detects_wrong_results() {
    let o = memwall(&[
        "bench-kernels",
        "--smoke",
        "--json",
        "--formats",
        "q4_0,f16",
        "--inject-fault",
    ]);
    assert!(!o.status.success(), "a failed check must exit non-zero");
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    let results = v["adapters"][0]["results"].as_array().expect("results");
    assert!(!results.is_empty());
    for r in results {
        assert_eq!(r["ok"], Value::Bool(false), "{r}");
        assert!(num(r, "max_err") > num(r, "tol"), "{r}");
    }
}

/// `--wall-clock` forces the fallback clock on every adapter and result, and the figures stay
/// plausible (a positive time, the check passing).
#[test]
fn smoke_wall_clock_fallback() {
    let o = memwall(&[
        "bench-kernels",
        "--smoke",
        "--json",
        "--formats",
        "q8_0",
        "--wall-clock",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench-kernels failed: {stderr}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    let a = &v["adapters"][0];
    assert_eq!(text(a, "timing"), "wall-clock");
    assert!(num(a, "peak_gflops") > 0.0);
    let results = a["results"].as_array().expect("results");
    assert!(!results.is_empty());
    for r in results {
        assert_eq!(text(r, "timing"), "wall-clock", "{r}");
        assert!(num(r, "median_us") > 0.0);
        assert_eq!(r["ok"], Value::Bool(true), "{r}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    for args in [
        &["bench-kernels", "--shapes", "13b"][..],
        &["bench-kernels", "--formats", "q5_0"],
    ] {
        let o = memwall(args);
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("13b") || e.contains("q5_0"), "{e}");
    }
}
