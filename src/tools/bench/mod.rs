//! `memwall bench`: prefill and decode speed per device configuration, in the manner of
//! llama-bench, with what the memory wall predicts next to it.
//!
//! For each configuration (a `--device` item), from a cold start of that configuration:
//! 1. the model is loaded (`Model::load`, GPU upload and pipeline creation included), a session
//!    made, and a synthetic prompt of `n_prompt` ids evaluated: the time from the start of the
//!    load to the first token is `ttft_ms`;
//! 2. `n_gen` tokens are decoded one at a time (`Session::eval_argmax`, each step fed a
//!    pseudo-random id rather than the last one's argmax, as llama-bench's generation test
//!    feeds random ids: a random model's greedy output repeats one token, which would route
//!    every step of a mixture of experts to the same experts): together with step 1 this is
//!    the warm-up repetition, not counted;
//! 3. `reps` repetitions each reset the session, prefill the prompt (timed: prefill tokens/s)
//!    and decode `n_gen` tokens (timed: decode tokens/s). Every timed step ends with a token id
//!    read back, so the device is synchronized before the clock stops.
//!
//! Decode moves, per token, every weight matrix once ([`Model::weight_bytes_per_token`]) plus
//! the KV cache read at the mean context (K and V, f32, every layer); `achieved_gbs` is that
//! times the mean decode tokens/s, and `fraction_of_probe` divides it by the device's measured
//! read bandwidth ([`bandwidth`]).
//!
//! # JSON schema (`memwall bench --json`, `schema` = `"memwall.bench/1"`)
//!
//! ```text
//! {
//!   "schema": "memwall.bench/1",
//!   "model": { "path": str, "arch": str, "n_layer": int, "n_embd": int, "n_vocab": int,
//!              "file_bytes": int, "weight_bytes_per_token": int, "kv_bytes_per_position": int },
//!   "n_prompt": int, "n_gen": int, "reps": int,
//!   "configs": [ {
//!     "device": str,                 // the --device item, as given
//!     "device_name": str,            // "cpu" or "gpu:<adapter> (<backend>)"
//!     "placement": str,              // decode placement, e.g. "c|ccGG|G" (+ " (streamed)")
//!     "threads": int | null,         // CPU worker threads (null on a GPU)
//!     "load_ms": float, "ttft_ms": float,
//!     "prefill_tps": Stat, "decode_tps": Stat,
//!     "mean_ctx": float,             // mean KV positions read per decoded token
//!     "bytes_per_token": { "weights": int, "kv": int, "total": int },
//!     "achieved_gbs": float,         // bytes_per_token.total * decode_tps.mean / 1e9
//!     "memory": { "peak_rss_bytes": int | null, "mapped_weight_bytes": int,
//!                 "kv_bytes": int, "gpu_weight_bytes": int | null,
//!                 "gpu_session_bytes": int | null, "gpu_total_bytes": int | null },
//!     "probe": Probe | null,
//!     "fraction_of_probe": float | null,  // achieved_gbs / probe.read_gbs
//!     "vs_cpu": { "prefill": float, "decode": float } | null,
//!                                    // mean t/s over the run's `cpu` configuration's
//!     "storage": Storage | null,     // with a memory plan (streamed blocks' reads)
//!     "experts": { "hit_rate": float, "read_bytes_per_token": float,
//!                  "read_s_per_token": float, "wait_s_per_token": float,
//!                  "compute_s_per_token": float, "misses_per_token": float,
//!                  "read_ahead_per_token": float, "read_ahead_used": float,
//!                  "held": int, "held_bytes": int, "capacity_bytes": int } | null,
//!                                    // an expert cache, over the timed decode runs
//!     "speculative": Spec | null     // with --draft-model or --draft-lookup
//!   } ]
//! }
//! Stat  = { "mean": float, "sd": float, "median": float, "min": float, "max": float,
//!           "samples": [float] }          // sd: sample standard deviation (0 for one sample)
//! Probe = { "device": str, "read_gbs": float, "triad_gbs": float | null, "bytes": int,
//!           "runs": int, "threads": int | null, "method": str }
//! Spec  = { "drafter": str, "draft_max": int, "prompt_tokens": int, "tokens": int,
//!           "plain_tps": Stat, "draft_tps": Stat, "speedup": float, "passes": int,
//!           "drafted": int, "accepted": int, "acceptance": float, "tokens_per_pass": float,
//!           "same_ids": bool, "draft_planned_bytes": int | null,
//!           "plain_read_bytes_per_token": float | null,
//!           "draft_read_bytes_per_token": float | null }
//! ```
//!
//! With a drafter, each configuration also runs greedy generations of `n_gen` tokens after a
//! text prompt, `reps` plain and `reps` with drafts ([`speculative`]); a draft model loads
//! before the model and shares its memory budget.
//!
//! `memwall bench --bandwidth --json` prints `{"schema": "memwall.bench/1", "probes": [Probe]}`.
//! GB/s are 1e9 bytes per second. `peak_rss_bytes` is the process's VmHWM, reset at the start of
//! each configuration where the kernel allows it (`/proc/self/clear_refs`), so it covers that
//! configuration's load and runs; it includes the pages of the weight map that were touched.
//! `gpu_session_bytes` counts the buffers the session allocated (KV cache, scratch,
//! activations, readback staging, uniform ring); `gpu_weight_bytes` the resident weights.

pub mod bandwidth;
pub mod flops;
pub mod kernels;
pub mod plot;
pub mod report;
pub mod requant;
pub mod results;
pub mod speculative;
pub mod synth;
pub mod upcycle;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::{DeviceChoice, LoadOptions, Model, Session};
use crate::error::{Error, Result};
use bandwidth::ProbeResult;
pub use results::{
    BenchReport, BytesPerToken, ConfigResult, ExpertResult, Memory, ModelSummary, SpecResult,
    SpeedRatio, Stat, StorageResult,
};
pub use speculative::{BenchDraft, DraftSource};

/// The `schema` field of the JSON output.
pub const SCHEMA: &str = "memwall.bench/1";

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Prompt tokens (`-p`).
    pub n_prompt: usize,
    /// Decoded tokens per repetition (`-n`).
    pub n_gen: usize,
    /// Timed repetitions after the warm-up (`-r`).
    pub reps: usize,
    /// CPU worker threads (None: every core).
    pub threads: Option<usize>,
    /// Run the bandwidth probe of each configuration's device.
    pub probe: bool,
    /// Bytes per probe array (CPU) or buffer (GPU, capped by the binding limit).
    pub probe_bytes: u64,
    /// Timed probe runs (the best counts).
    pub probe_runs: usize,
    /// f32 matmul activations (see `LoadOptions::f32_activations`).
    pub f32_activations: bool,
    /// `--no-repack` (see `LoadOptions::no_repack`).
    pub no_repack: bool,
    /// `--cache-type-k` / `--cache-type-v` (see `LoadOptions`).
    pub cache_type_k: Option<crate::kv_type::KvType>,
    pub cache_type_v: Option<crate::kv_type::KvType>,
    /// Seed of the synthetic prompt.
    pub seed: u64,
    /// `--mem-budget` (see `LoadOptions::mem_budget`; `None`: the detected limit's).
    pub mem_budget: Option<u64>,
    /// `--stream-io` (see `LoadOptions::stream_io`).
    pub stream_io: Option<crate::memory::IoMode>,
    /// Speculative decoding measured beside plain decoding (`--draft-model`,
    /// `--draft-lookup`).
    pub draft: Option<BenchDraft>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            n_prompt: 128,
            n_gen: 64,
            reps: 5,
            threads: None,
            probe: true,
            probe_bytes: 256 << 20,
            probe_runs: 5,
            f32_activations: false,
            no_repack: false,
            cache_type_k: None,
            cache_type_v: None,
            seed: 0x006d_656d_7761_6c6c,
            mem_budget: None,
            stream_io: None,
            draft: None,
        }
    }
}

/// Parses a comma list of devices (`cpu,gpu`), each item as `DeviceChoice::parse` accepts.
pub fn parse_devices(list: &str) -> Result<Vec<(String, DeviceChoice)>> {
    let items: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "no device in {list:?} (e.g. cpu,gpu)"
        )));
    }
    items
        .into_iter()
        .map(|s| {
            let (dev, _) = placement_opts(s)?;
            Ok((s.to_string(), DeviceChoice::parse(dev)?))
        })
        .collect()
}

/// (`ngl`, `resident`) of a configuration item.
pub type PlacementOpts = (Option<usize>, Option<usize>);

/// A configuration item's placement options: `DEVICE[:ngl=N][:resident=N]`. `ngl=N` runs the
/// last N blocks and the head on the GPU and the rest on the CPU (`--gpu-layers`);
/// `resident=N` keeps only the last N blocks' weights on the GPU and streams the others
/// (every block runs there). Returns the device part and (ngl, resident).
pub fn placement_opts(item: &str) -> Result<(&str, PlacementOpts)> {
    let mut parts = item.split(':');
    let dev = parts.next().unwrap_or("").trim();
    let (mut ngl, mut resident) = (None, None);
    for opt in parts {
        let bad = || {
            Error::InvalidArgument(format!(
                "{item:?}: {opt:?} is not ngl=N or resident=N (e.g. gpu:ngl=15, gpu:resident=2)"
            ))
        };
        let (k, v) = opt.split_once('=').ok_or_else(bad)?;
        let n: usize = v.trim().parse().map_err(|_| bad())?;
        match k.trim() {
            "ngl" => ngl = Some(n),
            "resident" => resident = Some(n),
            _ => return Err(bad()),
        }
    }
    if ngl.is_some() && resident.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{item:?}: ngl and resident are alternatives"
        )));
    }
    Ok((dev, (ngl, resident)))
}

/// `n` pseudo-random token ids below `n_vocab`, the same for a given seed (llama-bench also
/// benchmarks on random ids: speed does not depend on which tokens they are).
pub fn synthetic_prompt(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab.max(1) as u64) as u32
        })
        .collect()
}

/// The engine's CPU thread count for `threads` (what rayon's default pool takes).
pub fn engine_threads(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// A field of /proc/self/status in bytes (e.g. `VmHWM`), when the system has one.
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak RSS (VmHWM) to the current RSS where Linux allows it.
fn reset_peak_rss() {
    // Best effort: an old kernel or a sandbox without /proc leaves the process-wide peak.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Decodes `n` tokens one at a time after `first`, each step's argmax read back and then
/// replaced by the next pseudo-random id of run `run` (each run its own ids, so a repetition
/// does not find the experts the previous one routed to already cached).
fn decode(s: &mut Session, first: u32, n: usize, n_vocab: usize, run: u64) -> Result<()> {
    let seed = (run + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(first);
    let ids = synthetic_prompt(n, n_vocab, seed);
    let mut tok = first;
    for &next in &ids {
        s.eval_argmax(&[tok])?;
        tok = next;
    }
    Ok(())
}

fn check_options(o: &BenchOptions) -> Result<()> {
    if o.n_prompt == 0 || o.n_gen == 0 || o.reps == 0 {
        return Err(Error::InvalidArgument(format!(
            "bench needs at least 1 prompt token, 1 generated token and 1 repetition (got -p \
             {} -n {} -r {})",
            o.n_prompt, o.n_gen, o.reps
        )));
    }
    Ok(())
}

/// Benchmarks the model at `path` on each of `devices`, calling `on_config` as each finishes.
pub fn run_bench(
    path: &Path,
    o: &BenchOptions,
    devices: &[(String, DeviceChoice)],
    mut on_config: impl FnMut(&ConfigResult),
) -> Result<BenchReport> {
    check_options(o)?;
    let mut configs = Vec::with_capacity(devices.len());
    let mut summary = None;
    for (item, choice) in devices {
        let (c, m) = run_config(path, o, item, choice)?;
        on_config(&c);
        configs.push(c);
        summary.get_or_insert(m);
    }
    let model =
        summary.ok_or_else(|| Error::InvalidArgument("bench needs at least one device".into()))?;
    results::fill_vs_cpu(&mut configs);
    Ok(BenchReport {
        schema: SCHEMA,
        model,
        n_prompt: o.n_prompt,
        n_gen: o.n_gen,
        reps: o.reps,
        configs,
    })
}

fn run_config(
    path: &Path,
    o: &BenchOptions,
    item: &str,
    choice: &DeviceChoice,
) -> Result<(ConfigResult, ModelSummary)> {
    reset_peak_rss();
    let (_, (gpu_layers, resident)) = placement_opts(item)?;
    let resident = match resident {
        Some(n) => {
            let g = crate::gguf::Gguf::open(path)?;
            let n_layer = crate::config::Config::from_gguf(&g)?.n_layer;
            let mut p = crate::ground::Placement::gpu_layers(n, n_layer);
            p.embed = crate::ground::Device::Gpu;
            p.head = crate::ground::Device::Gpu;
            Some(p)
        }
        None => None,
    };
    let mut opts = LoadOptions {
        threads: o.threads,
        device: choice.clone(),
        f32_activations: o.f32_activations,
        no_repack: o.no_repack,
        cache_type_k: o.cache_type_k,
        cache_type_v: o.cache_type_v,
        gpu_layers,
        gpu: crate::gpu::GpuLoadOptions {
            resident,
            ..Default::default()
        },
        // The plan (GPU budget, CPU residency) is for the context the runs use (the drafted
        // runs' text prompt has at most a token per byte, and a BOS).
        n_ctx: o.n_gen
            + o.draft
                .as_ref()
                .map_or(o.n_prompt, |d| o.n_prompt.max(d.prompt.len() + 2)),
        mem_budget: o.mem_budget,
        stream_io: o.stream_io,
        ..Default::default()
    };
    // A draft model loads first (not counted in the model's load time) and keeps its share
    // of the budget.
    let draft = match &o.draft {
        Some(d) => speculative::load_draft(d, &opts)?,
        None => None,
    };
    opts.mem_held = draft.as_ref().and_then(Model::planned_bytes).unwrap_or(0);
    let t0 = Instant::now();
    let model = Arc::new(Model::load(path, &opts)?);
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cfg = model.config().clone();
    let n_ctx = o.n_prompt + o.n_gen;
    let mut s = model.session_with_ctx(n_ctx)?;
    let prompt = synthetic_prompt(o.n_prompt, cfg.n_vocab, o.seed);
    let first = s.eval_argmax(&prompt)?;
    let ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
    decode(&mut s, first, o.n_gen, cfg.n_vocab, 0)?;

    let (mut pp, mut tg) = (Vec::with_capacity(o.reps), Vec::with_capacity(o.reps));
    // Reader counters over the timed decode runs only.
    let (mut read_bytes, mut read_s, mut wait_s) = (0u64, 0.0f64, 0.0f64);
    // Expert cache counters over the timed decode runs, and their time.
    let mut experts: Option<crate::memory::experts::ExpertStats> = None;
    let mut decode_s = 0.0f64;
    for run in 1..=o.reps as u64 {
        s.reset();
        let t = Instant::now();
        let first = s.eval_argmax(&prompt)?;
        pp.push(o.n_prompt as f64 / t.elapsed().as_secs_f64().max(1e-12));
        let before = s.exec().stream_stats();
        let x0 = model.expert_stats();
        let t = Instant::now();
        decode(&mut s, first, o.n_gen, cfg.n_vocab, run)?;
        let secs = t.elapsed().as_secs_f64();
        decode_s += secs;
        tg.push(o.n_gen as f64 / secs.max(1e-12));
        if let (Some(a), Some(b)) = (x0, model.expert_stats()) {
            let d = b.since(&a);
            experts = Some(match experts {
                None => d,
                Some(e) => crate::memory::experts::ExpertStats {
                    hits: e.hits + d.hits,
                    misses: e.misses + d.misses,
                    bytes_read: e.bytes_read + d.bytes_read,
                    read_s: e.read_s + d.read_s,
                    wait_s: e.wait_s + d.wait_s,
                    read_ahead: e.read_ahead + d.read_ahead,
                    read_ahead_used: e.read_ahead_used + d.read_ahead_used,
                    ..d
                },
            });
        }
        if let (Some(a), Some(b)) = (before, s.exec().stream_stats()) {
            read_bytes += b.bytes_read - a.bytes_read;
            read_s += b.read_s - a.read_s;
            wait_s += b.wait_s - a.wait_s;
        }
    }
    let (prefill_tps, decode_tps) = (Stat::new(pp), Stat::new(tg));

    let kv_per_pos = 2 * cfg.n_layer as u64 * cfg.kv_dim() as u64 * 4;
    // Decode step i (0-based) evaluates position n_prompt + i and reads n_prompt + i + 1
    // positions of K and V: the mean over the steps.
    let mean_ctx = o.n_prompt as f64 + (o.n_gen as f64 + 1.0) / 2.0;
    let weights = model.weight_bytes_per_token();
    let kv = (kv_per_pos as f64 * mean_ctx).round() as u64;
    let bytes_per_token = BytesPerToken {
        weights,
        kv,
        total: weights + kv,
    };
    let achieved_gbs = bytes_per_token.total as f64 * decode_tps.mean / 1e9;

    let gpu = model.gpu().cloned();
    let gpu_session = s.gpu_backend().map(|b| b.allocated_bytes());
    let gpu_weights = gpu.as_ref().map(|g| g.weight_bytes);
    let memory = Memory {
        peak_rss_bytes: proc_status_bytes("VmHWM"),
        mapped_weight_bytes: model.gguf().tensors().iter().map(|t| t.n_bytes).sum(),
        kv_bytes: kv_per_pos * n_ctx as u64,
        gpu_weight_bytes: gpu_weights,
        gpu_session_bytes: gpu_session,
        gpu_total_bytes: gpu_weights.zip(gpu_session).map(|(w, s)| w + s),
    };
    let storage = model.memory().map(|m| {
        let r = &m.residency;
        let tokens = (o.reps * o.n_gen) as f64;
        let read_gbps = if read_s > 0.0 {
            read_bytes as f64 / read_s / 1e9
        } else {
            0.0
        };
        let floor = (r.streamed_bytes > 0 && read_gbps > 0.0)
            .then(|| read_gbps * 1e9 / r.streamed_bytes as f64);
        let limit = crate::memory::detect_limit();
        let peak = crate::memory::measured_peak(limit.as_ref());
        StorageResult {
            budget_bytes: m.budget_bytes,
            limit_source: m.limit_source,
            resident_bytes: r.resident_bytes,
            resident_blocks: r.resident.iter().filter(|&&x| x).count(),
            streamed_blocks: r.resident.iter().filter(|&&x| !x).count(),
            streamed_bytes_per_token: r.streamed_bytes,
            read_bytes_per_token: read_bytes as f64 / tokens,
            read_gbps,
            wait_s_per_token: wait_s / tokens,
            storage_floor_tps: floor,
            floor_fraction: floor.map(|f| decode_tps.mean / f),
            slots: r.slots,
            io_mode: m.io_mode,
            peak_bytes: peak.map(|p| p.bytes),
            peak_source: peak.map(|p| p.source),
        }
    });
    let experts = experts.map(|x| {
        let tokens = (o.reps * o.n_gen).max(1) as f64;
        ExpertResult {
            hit_rate: x.hit_rate(),
            read_bytes_per_token: x.bytes_read as f64 / tokens,
            read_s_per_token: x.read_s / tokens,
            wait_s_per_token: x.wait_s / tokens,
            compute_s_per_token: (decode_s - x.wait_s).max(0.0) / tokens,
            misses_per_token: x.misses as f64 / tokens,
            read_ahead_per_token: x.read_ahead as f64 / tokens,
            read_ahead_used: if x.read_ahead == 0 {
                0.0
            } else {
                x.read_ahead_used as f64 / x.read_ahead as f64
            },
            held: x.held,
            held_bytes: x.held_bytes,
            capacity_bytes: x.capacity_bytes,
        }
    });
    let device_name = s.backend_name();
    let streamed = s.gpu_backend().and_then(|b| b.stream_stats()).is_some();
    let placement = s.exec().placement().decode.compact();
    // The plan holds one session's KV cache: the drafted runs' session comes after this one.
    drop(s);
    let spec = match &o.draft {
        Some(d) => Some(speculative::measure(
            &model,
            d,
            draft.as_ref(),
            o.n_gen,
            o.reps,
        )?),
        None => None,
    };
    let threads = gpu.is_none().then(|| engine_threads(o.threads));
    let probe = if !o.probe {
        None
    } else if let Some(g) = &gpu {
        Some(bandwidth::gpu_probe(
            &g.ctx,
            &g.kernels,
            o.probe_bytes,
            o.probe_runs,
        )?)
    } else {
        Some(bandwidth::cpu_probe(
            o.probe_bytes,
            engine_threads(o.threads),
            o.probe_runs,
        )?)
    };
    let fraction_of_probe = probe.as_ref().map(|p| achieved_gbs / p.read_gbs.max(1e-12));
    let summary = ModelSummary {
        path: path.display().to_string(),
        arch: cfg.arch.clone(),
        n_layer: cfg.n_layer,
        n_embd: cfg.n_embd,
        n_vocab: cfg.n_vocab,
        file_bytes: model.gguf().file_len(),
        weight_bytes_per_token: weights,
        kv_bytes_per_position: kv_per_pos,
    };
    let result = ConfigResult {
        device: item.to_string(),
        device_name,
        placement: if streamed {
            format!("{placement} (streamed)")
        } else {
            placement
        },
        threads,
        load_ms,
        ttft_ms,
        prefill_tps,
        decode_tps,
        mean_ctx,
        bytes_per_token,
        achieved_gbs,
        memory,
        probe,
        fraction_of_probe,
        storage,
        experts,
        speculative: spec,
        vs_cpu: None,
    };
    Ok((result, summary))
}

/// The bandwidth probes alone (`memwall bench --bandwidth`): one per device item (`auto`
/// probes the GPU `auto` would pick, else the CPU).
pub fn run_probes(
    o: &BenchOptions,
    devices: &[(String, DeviceChoice)],
) -> Result<Vec<ProbeResult>> {
    let mut out = Vec::with_capacity(devices.len());
    for (_, choice) in devices {
        let sel = match choice {
            DeviceChoice::Cpu => None,
            DeviceChoice::Gpu(sel) => Some(sel.clone()),
            DeviceChoice::Auto => crate::gpu::list_adapters()
                .iter()
                .find(|r| {
                    matches!(
                        r.device_type.as_str(),
                        "DiscreteGpu" | "IntegratedGpu" | "VirtualGpu"
                    )
                })
                .map(|r| crate::gpu::DeviceSelector::Index(r.index)),
        };
        out.push(match sel {
            None => bandwidth::cpu_probe(o.probe_bytes, engine_threads(o.threads), o.probe_runs)?,
            Some(sel) => {
                let ctx = crate::gpu::GpuContext::new(&sel)?;
                let ks = crate::gpu::Kernels::new(&ctx)?;
                bandwidth::gpu_probe(&ctx, &ks, o.probe_bytes, o.probe_runs)?
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ids_are_valid_and_reproducible() {
        let a = synthetic_prompt(500, 77, 9);
        assert!(a.iter().all(|&t| t < 77));
        assert_eq!(a, synthetic_prompt(500, 77, 9));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 50);
    }

    #[test]
    fn device_lists_parse() {
        let d = parse_devices("cpu, gpu").unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].1, DeviceChoice::Cpu);
        assert!(matches!(d[1].1, DeviceChoice::Gpu(_)));
        assert!(parse_devices(" , ").is_err());
        let d = parse_devices("gpu:ngl=15,gpu:resident=2").unwrap();
        assert_eq!(placement_opts(&d[0].0).unwrap().1, (Some(15), None));
        assert_eq!(placement_opts(&d[1].0).unwrap().1, (None, Some(2)));
        assert!(parse_devices("gpu:ngl=x").is_err());
        assert!(parse_devices("gpu:foo=1").is_err());
        assert!(parse_devices("gpu:ngl=1:resident=2").is_err());
    }
}
