//! `memwall plan` and the memory accounting behind it: the 35B example checked by hand, the
//! test model's exact tensor bytes, the budget fit, and the command line in both forms.

mod common;

use std::process::{Command, Output};

use memwall::config::Config;
use memwall::gguf::Gguf;
use memwall::ground::{Device, Placement};
use memwall::plan::{account, fit, plan, MemoryModel};

fn memwall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .output()
        .expect("memwall binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "memwall failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("plan --json prints JSON")
}

const ARCH_35B: &[&str] = &[
    "plan",
    "--params",
    "35B",
    "--layers",
    "64",
    "--heads",
    "64",
    "--head-dim",
    "128",
    "--ctx",
    "4096",
    "--weight-bits",
    "4",
    "--kv-bits",
    "16",
    "--ram",
    "24G",
];

/// ARCH_35B with `key`'s value replaced.
fn replace<'a>(key: &str, val: &'a str) -> Vec<&'a str> {
    let mut v: Vec<&str> = ARCH_35B.to_vec();
    let i = v.iter().position(|a| *a == key).expect("key in ARCH_35B");
    v[i + 1] = val;
    v
}

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// K and V × layers × KV heads × head size × positions × bytes per element.
const KV_35B: u64 = 2 * 64 * 64 * 128 * 4096 * 2;
/// 35·10⁹ parameters × 4 bits / 8.
const WEIGHTS_35B: u64 = 35_000_000_000 * 4 / 8;

#[test]
fn cli_35b_table_by_hand() {
    assert_eq!(KV_35B, 8_589_934_592);
    assert_eq!(WEIGHTS_35B, 17_500_000_000);
    let o = memwall(&with(ARCH_35B, &["--kv-heads", "64"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("8.59 GB"), "{text}");
    assert!(text.contains("17.50 GB"), "{text}");
    assert!(text.contains(&format!("KV cache {KV_35B} B")), "{text}");
    assert!(text.contains(&format!("weights {WEIGHTS_35B} B")), "{text}");
    // 17.5 GB + 8.6 GB + scratch > 24 GiB = 25.77 GB; the KV cache alone fits, so blocks
    // that do not fit beside it stream from storage.
    assert!(
        text.contains("verdict: runs with blocks streamed from storage"),
        "{text}"
    );
    assert!(text.contains("stream from storage:"), "{text}");
}

#[test]
fn cli_35b_json_and_gqa() {
    let full = json(&memwall(&with(ARCH_35B, &["--json"])));
    assert_eq!(full["kv_bytes"], KV_35B);
    assert_eq!(full["weights_bytes"], WEIGHTS_35B);
    assert_eq!(full["ram_bytes"], 24u64 << 30);
    assert_eq!(full["fits"], false);
    let gqa = json(&memwall(&with(ARCH_35B, &["--kv-heads", "8", "--json"])));
    assert_eq!(gqa["kv_bytes"], KV_35B / 8);
    assert_eq!(gqa["kv_bytes"], 1_073_741_824u64);
    assert_eq!(gqa["weights_bytes"], WEIGHTS_35B);
    assert_eq!(gqa["fits"], true);
    assert_eq!(gqa["verdict"], "fits");
    // The table's rows add up: CPU needs weights + KV + scratch, all on the CPU.
    let rows = gqa["rows"].as_array().unwrap();
    let total = rows.iter().find(|r| r["name"] == "total").unwrap();
    let sum: u64 = rows
        .iter()
        .filter(|r| r["name"] != "total")
        .map(|r| r["cpu"].as_u64().unwrap())
        .sum();
    assert_eq!(total["cpu"].as_u64().unwrap(), sum);
    assert_eq!(gqa["ram_needed"], sum);
    assert_eq!(gqa["placement"].as_str().unwrap().len(), 64 + 4);
}

#[test]
fn cli_35b_gpu_budget() {
    let budget = 8u64 << 30;
    let r = json(&memwall(&with(
        ARCH_35B,
        &["--kv-heads", "8", "--gpu-mem-budget", "8G", "--json"],
    )));
    let gpu_peak = r["gpu"]["peak"].as_u64().unwrap();
    assert!(gpu_peak <= budget && gpu_peak > budget / 2, "{r}");
    let resident = r["resident_layers"].as_u64().unwrap();
    assert!(resident > 0 && resident < 64, "{r}");
    assert_eq!(resident + r["streamed_layers"].as_u64().unwrap(), 64);
    let placement = r["placement"].as_str().unwrap();
    assert_eq!(
        placement.matches('G').count() as u64,
        resident + 1,
        "{placement}"
    );
}

fn test_model() -> (Gguf, Config) {
    let g = Gguf::open(common::model_path()).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    (g, cfg)
}

#[test]
fn from_gguf_exact_tensor_bytes() {
    let (g, cfg) = test_model();
    let n_ctx = 4096;
    let m = MemoryModel::from_gguf(&g, &cfg, n_ctx, 32.0).unwrap();
    let file_total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(m.weights_total(), file_total);
    assert_eq!(
        m.other_bytes, 0,
        "every tensor of the test model belongs to a stage"
    );
    assert_eq!(
        m.embed_bytes,
        g.tensor("token_embd.weight").unwrap().n_bytes
    );
    assert!(m.tied_embeddings);
    assert_eq!(
        m.head_bytes,
        g.tensor("output_norm.weight").unwrap().n_bytes
    );
    let blk3: u64 = g
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.3."))
        .map(|t| t.n_bytes)
        .sum();
    assert_eq!(m.layer_weight_bytes[3], blk3);
    // K and V, f32: 2 · n_ctx · n_head_kv · head_dim · 4.
    let kv_dim = cfg.n_head_kv * cfg.head_dim;
    assert_eq!(m.kv_bytes_per_layer, (2 * n_ctx * kv_dim * 4) as u64);
    assert_eq!(m.kv_total(), m.kv_bytes_per_layer * cfg.n_layer as u64);
    // All on the CPU: every weight once, as mapped pages.
    let [cpu, gpu] = account(&m, &Placement::all(Device::Cpu, cfg.n_layer));
    assert_eq!(cpu.weights, file_total);
    assert_eq!(cpu.kv, m.kv_total());
    assert_eq!(gpu.peak, 0);
}

#[test]
fn fit_sweep_on_the_test_model() {
    let (g, cfg) = test_model();
    let m = MemoryModel::from_gguf(&g, &cfg, 2048, 32.0).unwrap();
    let all = account(&m, &Placement::all(Device::Gpu, cfg.n_layer))[1].peak;
    let mut last_bytes = 0;
    let mut last_layers = 0;
    let steps = 400u64;
    for i in 0..=steps + 10 {
        let budget = all * i / steps;
        let f = fit(&m, budget);
        assert!(f.gpu.peak <= budget, "budget {budget}: {:?}", f.gpu);
        assert_eq!(f.gpu, account(&m, &f.placement)[1]);
        let bytes = f.gpu.weights + f.gpu.kv;
        assert!(
            bytes >= last_bytes,
            "budget {budget}: {bytes} < {last_bytes}"
        );
        // Once the head is placed, more budget only adds blocks.
        if f.placement.head == Device::Gpu {
            assert!(f.resident_layers >= last_layers, "budget {budget}");
            last_layers = f.resident_layers;
        }
        last_bytes = bytes;
        assert!(f.placement.crossings() <= 2);
        assert_eq!(f.fits_all, budget >= all, "budget {budget}");
    }
    // plan() with the full budget: nothing on the CPU, nothing streams.
    let r = plan(&m, 8 << 30, Some(all));
    assert_eq!(r.placement, format!("G|{}|G", "G".repeat(cfg.n_layer)));
    assert_eq!(r.streamed_layers, 0);
    assert_eq!(r.cpu.peak, 0);
}

#[test]
fn cli_test_model() {
    let path = common::model_path();
    let p = path.to_str().unwrap();
    let o = memwall(&["plan", "-m", p, "--ram", "1G", "--gpu-mem-budget", "40M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "weights",
        "KV cache",
        "placement:",
        "streaming:",
        "verdict: fits",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let r = json(&memwall(&[
        "plan", "-m", p, "--ram", "1G", "--ctx", "1024", "--json",
    ]));
    let g = Gguf::open(&path).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let file_total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(r["weights_bytes"], file_total);
    assert_eq!(r["n_ctx"], 1024);
    // The default cache: f16 keys and values, 2 bytes each.
    let kv = 2 * 1024 * cfg.n_head_kv * cfg.head_dim * 2 * cfg.n_layer;
    assert_eq!(r["kv_bytes"], kv as u64);
    assert_eq!(r["gpu_budget_bytes"], serde_json::Value::Null);
    assert_eq!(r["placement"], format!("c|{}|c", "c".repeat(cfg.n_layer)));
    // --kv-bits 32 overrides the cache types: twice the f16 default.
    let h = json(&memwall(&[
        "plan",
        "-m",
        p,
        "--ram",
        "1G",
        "--ctx",
        "1024",
        "--kv-bits",
        "32",
        "--json",
    ]));
    assert_eq!(h["kv_bytes"], (kv * 2) as u64);
    // K q8_0 (34 bytes per 32 values), V q4_0 (18 bytes per 32).
    let q = json(&memwall(&[
        "plan",
        "-m",
        p,
        "--ram",
        "1G",
        "--ctx",
        "1024",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q4_0",
        "--json",
    ]));
    let row = cfg.n_head_kv * cfg.head_dim;
    let kv_q = 1024 * (row / 32 * 34 + row / 32 * 18) * cfg.n_layer;
    assert_eq!(q["kv_bytes"], kv_q as u64);
}

#[test]
fn cli_errors_exit_nonzero() {
    let model = common::model_path();
    let m = model.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["plan", "--layers", "4", "--ram", "1G"], "--heads"),
        (replace("--layers", "0"), "at least 1"),
        (with(ARCH_35B, &["--kv-heads", "7"]), "multiple"),
        (
            vec![
                "plan",
                "--layers",
                "2",
                "--heads",
                "2",
                "--head-dim",
                "64",
                "--ctx",
                "8",
                "--weight-bits",
                "4",
                "--ram",
                "8X",
            ],
            "\"8X\"",
        ),
        (with(ARCH_35B, &["--gpu-mem-budget", "lots"]), "\"lots\""),
        (replace("--params", "35Q"), "\"35Q\""),
        (
            vec!["plan", "-m", m, "--layers", "3", "--ram", "1G"],
            "--layers",
        ),
        (
            vec!["plan", "-m", "/nonexistent.gguf", "--ram", "1G"],
            "nonexistent",
        ),
        (
            vec!["plan", "-m", m, "--ram", "1G", "--ctx", "0"],
            "at least 1",
        ),
        (
            vec!["plan", "-m", m, "--ram", "1G", "--kv-bits", "0"],
            "bit width",
        ),
    ];
    for (args, want) in cases {
        let o = memwall(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {}", stdout(&o));
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn help_states_the_size_rule() {
    let o = memwall(&["plan", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("powers of 1024"), "{text}");
    assert!(text.contains("powers of 1000"), "{text}");
    assert!(stdout(&memwall(&["--help"])).contains("plan"));
}
