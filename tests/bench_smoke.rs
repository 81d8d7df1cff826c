//! `memwall bench` end to end in a short smoke mode: a tiny synthetic model written by
//! `memwall synth`, `-p 8 -n 4 -r 2`, on the CPU and on the GPU, with the JSON schema checked
//! field by field and the derived figures recomputed from the file. The GPU test FAILS when
//! no adapter opens (`memwall bench --device gpu` exits non-zero).

mod common;

use std::path::{Path, PathBuf};

use common::json::{int, memwall, num};
use memwall::gguf::Gguf;
use serde_json::Value;

/// A tiny Q4_0 model written by `memwall synth` into a fresh directory.
fn tiny_model(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memwall-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let p = path.to_str().unwrap();
    let o = memwall(&["synth", "-o", p, "--preset", "tiny", "--type", "q4_0"]);
    assert!(
        o.status.success(),
        "synth: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    path
}

/// `memwall bench` on the model at `model` with `-p prompt -n gen -r reps -d device`, then
/// `extra`: the argument list every test here starts from.
fn bench_args<'a>(
    model: &'a str,
    prompt: &'a str,
    gen: &'a str,
    reps: &'a str,
    device: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut v = vec![
        "bench", "-m", model, "-p", prompt, "-n", gen, "-r", reps, "--device", device,
    ];
    v.extend_from_slice(extra);
    v
}

fn check_stat(v: &Value, key: &str, reps: usize) -> f64 {
    let s = &v[key];
    let samples: Vec<f64> = s["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("{key}.samples missing"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(samples.len(), reps, "{key}: one sample per repetition");
    assert!(
        samples.iter().all(|&x| x > 0.0 && x.is_finite()),
        "{key}: {samples:?}"
    );
    let mean = samples.iter().sum::<f64>() / reps as f64;
    assert!((num(s, "mean") - mean).abs() <= 1e-9 * mean, "{key}.mean");
    let (min, max) = (num(s, "min"), num(s, "max"));
    assert!(min <= num(s, "median") && num(s, "median") <= max && num(s, "sd") >= 0.0);
    mean
}

/// Runs the smoke bench on `device` and checks every field of the report.
fn smoke(device: &str, path: &Path) {
    let p = path.to_str().unwrap();
    let o = memwall(&bench_args(
        p,
        "8",
        "4",
        "2",
        device,
        &["--probe-mib", "1", "--json"],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench --device {device} failed: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let r: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(r["schema"], "memwall.bench/1");
    assert_eq!(
        (int(&r, "n_prompt"), int(&r, "n_gen"), int(&r, "reps")),
        (8, 4, 2)
    );

    // The model summary, recomputed from the file.
    let g = Gguf::open(path).unwrap();
    let m = &r["model"];
    assert_eq!(m["arch"], "llama");
    assert_eq!(m["path"].as_str(), Some(p));
    let n_layer = g.get_u32("llama.block_count").unwrap() as u64;
    let n_embd = g.get_u32("llama.embedding_length").unwrap() as u64;
    let kv_dim = n_embd / g.get_u32("llama.attention.head_count").unwrap() as u64
        * g.get_u32("llama.attention.head_count_kv").unwrap() as u64;
    assert_eq!(int(m, "n_layer"), n_layer);
    assert_eq!(int(m, "n_embd"), n_embd);
    assert_eq!(int(m, "n_vocab"), 512);
    assert_eq!(int(m, "file_bytes"), std::fs::metadata(path).unwrap().len());
    // Tied embeddings: every 2-D tensor is read once per token.
    let weights: u64 = g
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2)
        .map(|t| t.n_bytes)
        .sum();
    assert_eq!(int(m, "weight_bytes_per_token"), weights);
    let kv_pos = 2 * n_layer * kv_dim * 4;
    assert_eq!(int(m, "kv_bytes_per_position"), kv_pos);

    let configs = r["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 1);
    let c = &configs[0];
    assert_eq!(c["device"], device);
    let name = c["device_name"].as_str().unwrap();
    assert!(name.starts_with(device), "{name}");
    let gpu = device == "gpu";
    assert_eq!(c["threads"].is_null(), gpu);
    assert!(num(c, "load_ms") > 0.0 && num(c, "ttft_ms") > num(c, "load_ms"));
    check_stat(c, "prefill_tps", 2);
    let decode = check_stat(c, "decode_tps", 2);
    // Decode step i reads 8 + i + 1 positions: mean 10.5.
    assert_eq!(num(c, "mean_ctx"), 10.5);
    let b = &c["bytes_per_token"];
    assert_eq!(int(b, "weights"), weights);
    assert_eq!(int(b, "kv"), (kv_pos as f64 * 10.5).round() as u64);
    assert_eq!(int(b, "total"), weights + int(b, "kv"));
    let achieved = num(c, "achieved_gbs");
    let want = int(b, "total") as f64 * decode / 1e9;
    assert!(
        (achieved - want).abs() <= 1e-9 * want,
        "{achieved} vs {want}"
    );

    let mem = &c["memory"];
    assert_eq!(
        int(mem, "mapped_weight_bytes"),
        g.tensors().iter().map(|t| t.n_bytes).sum::<u64>()
    );
    assert_eq!(int(mem, "kv_bytes"), kv_pos * 12);
    assert!(int(mem, "peak_rss_bytes") > 0);
    if gpu {
        let (w, s) = (int(mem, "gpu_weight_bytes"), int(mem, "gpu_session_bytes"));
        // The GPU holds at least the quantized weights and the KV cache.
        assert!(w >= weights && s >= kv_pos * 12, "{mem}");
        assert_eq!(int(mem, "gpu_total_bytes"), w + s);
    } else {
        for k in ["gpu_weight_bytes", "gpu_session_bytes", "gpu_total_bytes"] {
            assert!(mem[k].is_null(), "{k} on the CPU");
        }
    }

    let probe = &c["probe"];
    assert_eq!(probe["device"].as_str(), Some(name));
    let read = num(probe, "read_gbs");
    assert!(read > 0.0 && read.is_finite());
    assert_eq!(probe["triad_gbs"].is_null(), gpu);
    assert!(int(probe, "bytes") >= 1 << 20 && int(probe, "runs") >= 1);
    assert!(probe["method"].is_string());
    // One configuration: the CPU path is its own baseline; a lone GPU one has none.
    if gpu {
        assert!(c["vs_cpu"].is_null(), "{c}");
    } else {
        assert_eq!(
            c["vs_cpu"],
            serde_json::json!({"prefill": 1.0, "decode": 1.0})
        );
    }
    let f = num(c, "fraction_of_probe");
    assert!((f - achieved / read).abs() <= 1e-9 * f, "fraction {f}");
    // A tiny model and a 1 MiB probe both sit in caches, so the fraction is loose, but a
    // figure outside this range means a unit or byte-count error.
    assert!(f > 0.0 && f < 20.0, "fraction of probe {f}");
}

#[test]
fn bench_cpu_smoke() {
    let path = tiny_model("cpu");
    smoke("cpu", &path);
    // The table form prints one row per configuration (two here, from a comma list).
    let p = path.to_str().unwrap();
    let o = memwall(&bench_args(p, "4", "2", "1", "cpu,cpu", &["--no-probe"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| cpu ")).count(),
        2,
        "{table}"
    );
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

/// `--draft-lookup` and `--draft-model` (the model itself, drafting whatever its top
/// probability): the drafted greedy runs give the plain runs' ids, and the report's counters
/// agree with each other.
#[test]
fn bench_measures_speculative_decoding() {
    let path = tiny_model("spec");
    let p = path.to_str().unwrap();
    for drafter in [
        &["--draft-lookup"][..],
        &["--draft-model", p, "--draft-p-min", "0"],
    ] {
        let mut extra = vec!["--no-probe", "--json", "--draft-max", "4"];
        extra.extend_from_slice(drafter);
        let o = memwall(&bench_args(p, "4", "12", "2", "cpu", &extra));
        assert!(
            o.status.success(),
            "{drafter:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let sp = &r["configs"][0]["speculative"];
        let want = if drafter[0] == "--draft-lookup" {
            "lookup".to_string()
        } else {
            format!("model:{p}")
        };
        assert_eq!(sp["drafter"].as_str(), Some(want.as_str()), "{sp}");
        assert_eq!(sp["same_ids"].as_bool(), Some(true), "{drafter:?}: {sp}");
        assert_eq!(int(sp, "draft_max"), 4);
        assert!(
            int(sp, "prompt_tokens") > 0 && int(sp, "tokens") > 0,
            "{sp}"
        );
        let plain = check_stat(sp, "plain_tps", 2);
        let drafted = check_stat(sp, "draft_tps", 2);
        assert!((num(sp, "speedup") - drafted / plain).abs() <= 1e-9 * drafted / plain);
        let (passes, d, a) = (int(sp, "passes"), int(sp, "drafted"), int(sp, "accepted"));
        assert!(a <= d && d <= 4 * passes, "{sp}");
        if passes > 0 {
            let tpp = (a + passes) as f64 / passes as f64;
            assert!((num(sp, "tokens_per_pass") - tpp).abs() < 1e-9, "{sp}");
        }
        if drafter[0] == "--draft-model" {
            // The model drafting for itself: every draft is its own greedy choice.
            assert!(passes > 0 && a == d, "{sp}");
        }
    }
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

#[test]
fn bench_gpu_smoke() {
    let path = tiny_model("gpu");
    smoke("gpu", &path);
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

/// `-d cpu,gpu`: the GPU's speed over memwall's own CPU path, from the same run's means.
#[test]
fn gpu_speed_is_reported_against_the_cpu_path() {
    let path = tiny_model("vs-cpu");
    let p = path.to_str().unwrap();
    let args = bench_args(p, "4", "2", "1", "cpu,gpu", &["--no-probe"]);
    let o = memwall(&[&args[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    let (cpu, gpu) = (&r["configs"][0], &r["configs"][1]);
    for phase in ["prefill", "decode"] {
        let mean = |c: &Value| num(&c[format!("{phase}_tps")], "mean");
        assert_eq!(num(&cpu["vs_cpu"], phase), 1.0);
        let want = mean(gpu) / mean(cpu);
        let got = num(&gpu["vs_cpu"], phase);
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{phase}: {got} vs {want}"
        );
    }
    let o = memwall(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        table.matches("vs memwall's CPU path in this run").count(),
        1,
        "{table}"
    );
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

#[test]
fn bandwidth_probe_json() {
    let o = memwall(&[
        "bench",
        "--bandwidth",
        "-d",
        "cpu",
        "--probe-mib",
        "4",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    assert_eq!(r["schema"], "memwall.bench/1");
    let p = &r["probes"][0];
    assert_eq!(p["device"], "cpu");
    assert!(num(p, "read_gbs") > 0.0 && num(p, "triad_gbs") > 0.0);
    assert_eq!(int(p, "bytes"), 4 << 20);
}

#[test]
fn bad_arguments_are_refused() {
    let o = memwall(&["bench", "-m", "/nonexistent.gguf", "-p", "0", "-d", "cpu"]);
    assert!(!o.status.success());
    let o = memwall(&["bench", "--bandwidth", "-d", "cpu", "--probe-mib", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("probe"));
}
