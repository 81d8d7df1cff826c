//! Safe GPU start-up: the selftest on first use of an adapter, its on-disk record, and the
//! routing around kernel variants that fail it (forced here with the test hook) or are on the
//! known-bad list. Output must stay what the CPU computes.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the GL path). With no adapter these
//! tests FAIL: a GPU test must never pass silently.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::kv::{greedy, random_ids, synth_model};
use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::gpu::{DeviceSelector, HealthOptions, KnownBad};
use memwall::ground::Device;
use memwall::kv_type::KvType;

const N_LAYER: usize = 2;
const SEED: u64 = 7;
const N_GEN: usize = 12;

/// A fresh cache directory for one test.
fn cache_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("gpu-startup")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The test model, written once (tests run in parallel and `synth_model` writes in place).
fn model_path() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| synth_model(N_LAYER, SEED)).clone()
}

fn load(device: DeviceChoice, health: HealthOptions) -> Model {
    let path = model_path();
    let opts = LoadOptions {
        device,
        // f32 caches on both devices, so the CPU and GPU runs hold the same cache.
        cache_type_k: Some(KvType::F32),
        cache_type_v: Some(KvType::F32),
        health,
        ..Default::default()
    };
    Model::load(&path, &opts).unwrap_or_else(|e| panic!("load {path:?}: {e}"))
}

fn gpu(health: HealthOptions) -> Model {
    let m = load(DeviceChoice::Gpu(DeviceSelector::Auto), health);
    assert!(m.gpu().is_some(), "{}", m.device_name());
    m
}

fn ids(m: &Model) -> Vec<u32> {
    let n_vocab = m.config().n_vocab;
    let mut s = m.session_with_ctx(64).unwrap();
    greedy(&mut s, &random_ids(9, n_vocab, 3), N_GEN).generated_ids
}

/// What the CPU path generates (the reference every routed GPU run must match).
fn cpu_ids() -> Vec<u32> {
    ids(&load(DeviceChoice::Cpu, HealthOptions::default()))
}

fn forcing(dir: &Path, labels: &[&str]) -> HealthOptions {
    HealthOptions {
        cache_dir: Some(dir.to_path_buf()),
        force_fail: labels.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn record_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("selftest-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_failing_variant_is_replaced_by_its_fallback() {
    let dir = cache_dir("fallback");
    let want = cpu_ids();
    let plain = gpu(forcing(&dir, &[]));
    assert!(plain.gpu().unwrap().health.unusable.is_empty());
    assert_eq!(ids(&plain), want, "unforced GPU run");
    // The subgroup reduction where the adapter has one (its fallback is the workgroup one);
    // else the embedding lookup (no fallback: the lookup runs on the CPU).
    let has_sg = plain.gpu().unwrap().ctx.has_subgroups();
    let label = if has_sg {
        "rmsnorm_sg"
    } else {
        "embedding_q8_0"
    };
    drop(plain);
    let m = gpu(forcing(&dir, &[label]));
    let h = &m.gpu().unwrap().health;
    assert_eq!(h.unusable, vec![label.to_string()], "{h:?}");
    assert!(h.notes.iter().any(|n| n.contains(label)), "{h:?}");
    let p = &m.placement().decode;
    if has_sg {
        assert!(h.unavailable.is_empty(), "{h:?}");
        assert!(
            h.notes.iter().any(|n| n.contains("using rmsnorm instead")),
            "{h:?}"
        );
        assert!(p.layers.iter().all(|&d| d == Device::Gpu) && p.embed == Device::Gpu);
    } else {
        assert_eq!(p.embed, Device::Cpu);
        assert!(p.layers.iter().all(|&d| d == Device::Gpu));
    }
    assert_eq!(ids(&m), want, "with {label} failed");
    // The forced failure is not written to the record: the next plain load uses the variant.
    let again = gpu(forcing(&dir, &[]));
    assert!(again.gpu().unwrap().health.unusable.is_empty());
}

#[test]
fn an_operation_without_working_variant_runs_on_the_cpu() {
    let dir = cache_dir("cpu");
    let want = cpu_ids();
    // Prefill attention has a single variant: the blocks (and, conservatively, the head: it
    // shares the generic kernels) move to the CPU; the embedding lookup stays on the GPU.
    let m = gpu(forcing(&dir, &["attention_prefill"]));
    let h = &m.gpu().unwrap().health;
    assert_eq!(
        h.unavailable,
        vec!["attention_prefill".to_string()],
        "{h:?}"
    );
    let p = &m.placement().decode;
    assert!(p.layers.iter().all(|&d| d == Device::Cpu), "{p:?}");
    assert_eq!(p.embed, Device::Gpu);
    assert!(
        h.notes.iter().any(|n| n.contains("run on the CPU")),
        "{h:?}"
    );
    assert_eq!(ids(&m), want, "attention routed to the CPU");
    drop(m);
    // Every kernel that multiplies by a Q8_0 matrix, in both matvec layouts (the synthetic
    // model is Q8_0 throughout): the stages decoding it move, the lookup (its own kernel)
    // stays.
    let m = gpu(forcing(&dir, &["matmul_q8*", "matvec_q8*"]));
    let p = &m.placement().decode;
    assert!(p.layers.iter().all(|&d| d == Device::Cpu) && p.head == Device::Cpu);
    assert_eq!(p.embed, Device::Gpu);
    assert_eq!(ids(&m), want, "Q8_0 matrices routed to the CPU");
    drop(m);
    // A failing kernel of the layout this adapter never launches is not even checked: it
    // moves nothing.
    let rows = gpu(forcing(&dir, &[])).gpu().unwrap().kernels.matvec_rows;
    let unused: &[&str] = if rows {
        &["matmul_q8_0", "matvec_q8_q8_0*"]
    } else {
        &["matmul_q8_rows*", "matvec_q8_rows*"]
    };
    let m = gpu(forcing(&dir, unused));
    let h = &m.gpu().unwrap().health;
    assert!(h.unavailable.is_empty(), "{h:?}");
    let p = &m.placement().decode;
    assert!(p.layers.iter().all(|&d| d == Device::Gpu), "{p:?}");
}

#[test]
fn known_bad_variants_are_not_run() {
    let dir = cache_dir("known-bad");
    let want = cpu_ids();
    let probe = gpu(HealthOptions {
        no_cache: true,
        ..Default::default()
    });
    let info = probe.gpu().unwrap().ctx.info.clone();
    drop(probe);
    let entry = |variant: &str| KnownBad {
        vendor: Some(info.vendor),
        driver: Some(info.driver.clone()),
        min_version: None,
        max_version: None,
        variant: variant.into(),
        reason: "test entry".into(),
    };
    let m = gpu(HealthOptions {
        cache_dir: Some(dir.clone()),
        known_bad: vec![entry("attention_prefill"), entry("kv_store")],
        ..Default::default()
    });
    let h = &m.gpu().unwrap().health;
    assert!(h.notes.iter().any(|n| n.contains("known bad")), "{h:?}");
    assert_eq!(h.unusable, vec!["attention_prefill", "kv_store"], "{h:?}");
    assert!(m
        .placement()
        .decode
        .layers
        .iter()
        .all(|&d| d == Device::Cpu));
    // Not run: the record has no row for them.
    let files = record_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(!text.contains("\"attention_prefill\""), "{text}");
    assert_eq!(ids(&m), want);
    // An entry for another vendor changes nothing.
    let other = KnownBad {
        vendor: Some(info.vendor.wrapping_add(1)),
        ..entry("attention_prefill")
    };
    let m = gpu(HealthOptions {
        cache_dir: Some(dir.clone()),
        known_bad: vec![other],
        ..Default::default()
    });
    assert!(m.gpu().unwrap().health.unusable.is_empty());
}

#[test]
fn the_record_is_written_reused_and_survives_corruption() {
    let dir = cache_dir("record");
    let opts = forcing(&dir, &[]);
    let first = gpu(opts.clone());
    let h = first.gpu().unwrap().health.clone();
    assert!(h.tested > 0, "{h:?}");
    drop(first);
    let files = record_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(h.record.as_deref(), Some(files[0].as_path()));
    // The second load reads the record and runs nothing.
    let second = gpu(opts.clone());
    assert_eq!(second.gpu().unwrap().health.tested, 0);
    drop(second);
    // A record for another adapter or kernel version (its fingerprint) is re-tested.
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fp = v["fingerprint"].as_str().unwrap().to_string();
    std::fs::write(&files[0], text.replace(&fp, "0000000000000000")).unwrap();
    let third = gpu(opts.clone());
    assert_eq!(third.gpu().unwrap().health.tested, h.tested);
    drop(third);
    // A corrupt record: a warning, a re-test, a good record again.
    std::fs::write(&files[0], b"{\"format\": 1, \"fingerp").unwrap();
    let fourth = gpu(opts.clone());
    assert_eq!(fourth.gpu().unwrap().health.tested, h.tested);
    drop(fourth);
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(again["fingerprint"].as_str(), Some(fp.as_str()));
    assert_eq!(gpu(opts).gpu().unwrap().health.tested, 0);
}

#[test]
fn the_pipeline_cache_is_written_reused_and_survives_corruption() {
    let dir = cache_dir("pipelines");
    let opts = forcing(&dir, &[]);
    let first = gpu(opts.clone());
    let g = first.gpu().unwrap();
    let vulkan = g.ctx.info.backend == "Vulkan";
    let h = g.health.clone();
    drop(first);
    let Some(path) = h.pipeline_cache.clone() else {
        // Only Vulkan has driver pipeline caches in wgpu; elsewhere nothing is written.
        assert!(!vulkan, "no pipeline cache on a Vulkan adapter: {h:?}");
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(files.len(), 1, "only the selftest record: {files:?}");
        return;
    };
    assert_eq!(
        h.pipeline_cache_loaded_bytes, 0,
        "a fresh directory starts cold"
    );
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 24, "{path:?}: {size} bytes");
    let second = gpu(opts.clone());
    let h2 = second.gpu().unwrap().health.clone();
    assert!(h2.pipeline_cache_loaded_bytes > 0, "{h2:?}");
    let want = ids(&second);
    drop(second);
    // Damaged: refused before the driver sees it, a cold start, a good file again.
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0x5a;
    bytes.truncate(n - 7);
    std::fs::write(&path, &bytes).unwrap();
    let third = gpu(opts.clone());
    assert_eq!(third.gpu().unwrap().health.pipeline_cache_loaded_bytes, 0);
    assert_eq!(ids(&third), want);
    drop(third);
    assert!(gpu(opts).gpu().unwrap().health.pipeline_cache_loaded_bytes > 0);
}

/// A device lost while the start-up selftest runs is no verdict on the kernels: the load
/// falls back to the CPU (reported), and the record keeps no failure that would disable a
/// variant on the next start.
#[test]
fn a_device_lost_during_the_selftest_records_no_failure() {
    let dir = cache_dir("lost");
    let faults = Arc::new(memwall::gpu::GpuFaults::default());
    faults.lose_device_after_submits(1);
    let mut opts = LoadOptions {
        device: DeviceChoice::Gpu(DeviceSelector::Auto),
        cache_type_k: Some(KvType::F32),
        cache_type_v: Some(KvType::F32),
        health: HealthOptions {
            cache_dir: Some(dir.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    opts.gpu.faults = Some(faults.clone());
    let m = Model::load(model_path(), &opts).expect("falls back, not an error");
    assert!(faults.device_lost(), "the hook fired during the start");
    assert!(m.gpu().is_none(), "{}", m.device_name());
    assert!(m.load_fallback().is_some(), "the fallback is reported");
    for f in record_files(&dir) {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(!text.contains("\"pass\": false"), "{}: {text}", f.display());
    }
    assert_eq!(ids(&m), cpu_ids());
}
