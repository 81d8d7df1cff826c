//! Helpers of the context-shift and prompt-cache tests: small synthetic models, sessions on a
//! device, greedy generation.

use std::path::PathBuf;

use memwall::engine::{DeviceChoice, Generation, LoadOptions, Model, Session};
use memwall::gpu::DeviceSelector;
use memwall::kv_type::KvTypes;
use memwall::sampler::SamplerParams;
use memwall::tools::bench::synth::{write_synth, Preset, SynthOptions};
use memwall::GgmlType;

/// Writes (once per process and name) a tiny random model of `n_layer` blocks whose weights
/// come from `seed`.
pub fn synth_model(n_layer: usize, seed: u64) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{n_layer}-{seed}-{}.gguf", std::process::id()));
    write_once(&path, |tmp| {
        let o = SynthOptions::new(Preset::Tiny, Some(n_layer), GgmlType::Q8_0, seed);
        write_synth(tmp, &o, &mut |_, _| {}).unwrap();
    });
    path
}

/// Writes `path` with `write` unless it exists, through a file of this thread's own renamed
/// into place: tests of one binary run on several threads, and one must never read a file
/// another is still writing.
pub fn write_once(path: &std::path::Path, write: impl FnOnce(&std::path::Path)) {
    if path.exists() {
        return;
    }
    let tmp = path.with_extension(format!("{:?}.part", std::thread::current().id()));
    write(&tmp);
    std::fs::rename(&tmp, path).unwrap();
}

/// The sliding window of [`synth_model_arch`]'s gemma3 files: shorter than the tests' contexts.
pub const GEMMA3_WINDOW: u32 = 6;
/// The original context of [`synth_model_arch`]'s phi3 files.
pub const PHI3_ORIG_CTX: u32 = 16;

/// `synth_model` as architecture `arch` (e.g. "qwen2": NeoX RoPE), the metadata keys renamed.
/// "gemma3" also gets its norm tensors (per-head Q/K, post-attention, post-FFN; weights near 1)
/// and a sliding window of [`GEMMA3_WINDOW`] positions (blocks 0-4 of every 6 local, RoPE base
/// 10000 there; the file's base, set to 1e6, in the others). "phi3" stores Q, K, V fused in
/// `attn_qkv` and gate and up stacked in `ffn_up`, rotates 3/4 of each head, and has LongRoPE
/// factors (long ones past [`PHI3_ORIG_CTX`], as every test context here) and an attention
/// factor.
pub fn synth_model_arch(n_layer: usize, seed: u64, arch: &str) -> PathBuf {
    let llama = synth_model(n_layer, seed);
    let path = llama.with_file_name(format!(
        "tiny-{arch}-{n_layer}-{seed}-{}.gguf",
        std::process::id()
    ));
    write_once(&path, |tmp| {
        let o = SynthOptions::new(Preset::Tiny, Some(n_layer), GgmlType::Q8_0, seed);
        let w = memwall::tools::bench::synth::synth_writer(&o).unwrap();
        let mut out = memwall::gguf::writer::GgufWriter::new();
        for (k, v) in w.metadata_pairs() {
            let v = if k == "general.architecture" {
                memwall::gguf::Value::String(arch.into())
            } else if arch == "gemma3" && k == "llama.rope.freq_base" {
                memwall::gguf::Value::F32(1e6)
            } else {
                v.clone()
            };
            let k = match k.strip_prefix("llama.") {
                Some(rest) => format!("{arch}.{rest}"),
                None => k.clone(),
            };
            out = out.metadata(k, v);
        }
        let n_head = w
            .metadata_pairs()
            .iter()
            .find(|(k, _)| k == "llama.attention.head_count")
            .and_then(|(_, v)| v.as_i128())
            .unwrap() as u64;
        let mut n_embd = 0;
        let phi3 = arch == "phi3";
        // phi3: the tensors fused in its files, by name, in fusion order.
        let mut parts: std::collections::HashMap<String, &memwall::gguf::writer::WriterTensor> =
            Default::default();
        for t in w.tensors() {
            if t.name == "blk.0.attn_norm.weight" {
                n_embd = t.dims[0];
            }
            let fused = ["attn_q.", "attn_k.", "attn_v.", "ffn_gate.", "ffn_up."];
            if phi3 && fused.iter().any(|f| t.name.contains(f)) {
                parts.insert(t.name.clone(), t);
                continue;
            }
            out = out.tensor(t.name.clone(), t.ty, &t.dims, t.data.clone());
        }
        if phi3 {
            // Row-major matrices of one type: stacking rows is concatenating bytes.
            for l in 0..n_layer {
                for (fused, members) in [
                    ("attn_qkv", &["attn_q", "attn_k", "attn_v"][..]),
                    ("ffn_up", &["ffn_gate", "ffn_up"][..]),
                ] {
                    let ts: Vec<_> = members
                        .iter()
                        .map(|m| parts[&format!("blk.{l}.{m}.weight")])
                        .collect();
                    let rows: u64 = ts.iter().map(|t| t.dims[1]).sum();
                    let data: Vec<u8> = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
                    let name = format!("blk.{l}.{fused}.weight");
                    out = out.tensor(name, ts[0].ty, &[ts[0].dims[0], rows], data);
                }
            }
            let n_rot = n_embd / n_head * 3 / 4 / 2 * 2;
            let half = n_rot / 2;
            let short: Vec<f32> = (0..half).map(|i| 1.0 + (i % 5) as f32 * 0.1).collect();
            let long: Vec<f32> = (0..half).map(|i| 1.0 + i as f32 * 1.5).collect();
            out = out
                .metadata(
                    "phi3.rope.dimension_count",
                    memwall::gguf::Value::U32(n_rot as u32),
                )
                .metadata(
                    "phi3.rope.scaling.original_context_length",
                    memwall::gguf::Value::U32(PHI3_ORIG_CTX),
                )
                .metadata(
                    "phi3.rope.scaling.attn_factor",
                    memwall::gguf::Value::F32(1.19),
                )
                .tensor_f32("rope_factors_long.weight", &[half], &long)
                .tensor_f32("rope_factors_short.weight", &[half], &short);
        }
        if arch == "gemma3" {
            let head_dim = n_embd / n_head;
            out = out.metadata(
                "gemma3.attention.sliding_window",
                memwall::gguf::Value::U32(GEMMA3_WINDOW),
            );
            let near_one = |n: u64, salt: u64| -> Vec<f32> {
                (0..n)
                    .map(|i| 1.0 + ((i * 7 + salt * 13) % 11) as f32 / 50.0 - 0.1)
                    .collect()
            };
            for l in 0..n_layer as u64 {
                for (name, n) in [
                    ("attn_q_norm", head_dim),
                    ("attn_k_norm", head_dim),
                    ("post_attention_norm", n_embd),
                    ("post_ffw_norm", n_embd),
                ] {
                    out = out.tensor_f32(format!("blk.{l}.{name}.weight"), &[n], &near_one(n, l));
                }
            }
        }
        out.write_to(tmp).unwrap();
    });
    path
}

/// The options of [`load`]: the CPU or (`gpu`) the GPU, f32 caches on both: the CPU's f16
/// default would round the re-rotated keys of a shift a second time, an error of the cache
/// type, not of the shift.
pub fn load_options(gpu: bool, f32_activations: bool) -> LoadOptions {
    load_options_kv(gpu, f32_activations, KvTypes::F32)
}

/// As [`load_options`], with KV caches of types `kv`.
pub fn load_options_kv(gpu: bool, f32_activations: bool, kv: KvTypes) -> LoadOptions {
    let device = if gpu {
        DeviceChoice::Gpu(DeviceSelector::Auto)
    } else {
        DeviceChoice::Cpu
    };
    LoadOptions {
        device,
        f32_activations,
        cache_type_k: Some(kv.k),
        cache_type_v: Some(kv.v),
        ..Default::default()
    }
}

/// Loads `path` on the CPU or (`gpu`) on the GPU with f32 caches, failing without an adapter.
pub fn load(path: &std::path::Path, gpu: bool, f32_activations: bool) -> Model {
    load_with_kv(path, gpu, f32_activations, KvTypes::F32)
}

/// As [`load`], with KV caches of types `kv`.
pub fn load_with_kv(
    path: &std::path::Path,
    gpu: bool,
    f32_activations: bool,
    kv: KvTypes,
) -> Model {
    let opts = load_options_kv(gpu, f32_activations, kv);
    let m = Model::load(path, &opts).unwrap_or_else(|e| panic!("cannot load {path:?}: {e}"));
    assert_eq!(m.gpu().is_some(), gpu, "{}", m.device_name());
    m
}

/// Greedy generation of `n` tokens after `prompt`.
pub fn greedy(s: &mut Session, prompt: &[u32], n: usize) -> Generation {
    s.set_sampler(SamplerParams::greedy()).unwrap();
    s.set_max_tokens(n);
    s.set_n_probs(0);
    s.generate(prompt, |_| true).unwrap()
}

/// `n` pseudo-random token ids below `n_vocab` (avoiding the last id, the synthetic models'
/// end of generation).
pub fn random_ids(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (n_vocab as u64 - 1)) as u32
        })
        .collect()
}

/// Largest |a - b| over two equal-length slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
