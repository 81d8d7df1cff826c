//! The mixture-of-experts path on real text: the test model upcycled into 4 experts per block
//! (2 used per token, `memwall upcycle`, tests/data/reference/smollm2-upcycled-moe). With
//! identical experts it gives the dense model's logits; with distinct experts its perplexity
//! agrees with llama.cpp's on the same file, on the CPU and with a GPU device (lavapipe in CI);
//! and blocks streamed from storage under a memory budget give the all-resident logits.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use memwall::bench::upcycle::{upcycle, UpcycleOptions};
use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::model::Logits;

/// Loads in this file run one at a time: the budget plan counts what the process holds.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// llama.cpp's `llama-perplexity -c 256` on the distinct-experts file (15 chunks).
const LLAMA_CPP_PPL_DISTINCT: f64 = 18.8959;

/// The upcycled test model (written once per process; 248 MB).
fn upcycled(distinct: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memwall-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = if distinct { "distinct" } else { "same" };
    let path = dir.join(format!("moe-{name}.gguf"));
    common::kv::write_once(&path, |tmp| {
        let o = UpcycleOptions {
            n_expert: 4,
            n_expert_used: 2,
            distinct,
            seed: 1,
        };
        let s = upcycle(&common::model_path(), tmp, &o).unwrap();
        assert_eq!((s.n_layer, s.expert_type.as_str()), (30, "q4_1"));
    });
    path
}

fn load(path: &std::path::Path, o: LoadOptions) -> Arc<Model> {
    Arc::new(Model::load(path, &o).unwrap())
}

fn cpu() -> LoadOptions {
    LoadOptions {
        device: DeviceChoice::Cpu,
        n_ctx: 256,
        ..Default::default()
    }
}

/// The logits of a 70-token prompt (prefill, tokens grouped by expert) and of 6 greedy tokens
/// after it (decode, one token's experts).
fn logits(m: &Arc<Model>) -> Vec<Vec<f32>> {
    let mut s = m.session(256).unwrap();
    let prompt: Vec<u32> = (0..70).map(|i| 100 + (i * 37) % 4000).collect();
    let n_vocab = m.config().n_vocab;
    let mut out = vec![s.eval(&prompt, Logits::All).unwrap()];
    for _ in 0..6 {
        let last = out.last().unwrap();
        let id = memwall::sampler::argmax(&last[last.len() - n_vocab..]) as u32;
        out.push(s.eval(&[id], Logits::Last).unwrap());
    }
    out
}

#[test]
fn identical_experts_give_the_dense_models_logits() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let m = load(&upcycled(false), cpu()).config().moe.clone();
    let m = m.expect("the upcycled model has experts");
    assert_eq!((m.n_expert, m.n_expert_used, m.n_ff_exp), (4, 2, 1536));
    assert!(
        m.norm_weights,
        "llama with experts normalizes the kept weights"
    );
    // f32 activations: the expert kernels and the dense ones to rounding, prefill and decode.
    let f32_act = LoadOptions {
        f32_activations: true,
        ..cpu()
    };
    let dense = load(&common::model_path(), f32_act.clone());
    let moe = load(&upcycled(false), f32_act);
    let (got, want) = (logits(&moe), logits(&dense));
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let e = common::rel_err(g, w);
        // Two copies of an expert weighted p and 1 - p: the dense result to rounding.
        assert!(
            e < 2e-3,
            "step {step}: the mixture differs from the dense model by {e}"
        );
    }
    // 8-bit activations (the default path): the first token's logits equal the dense ones
    // to rounding; after it the mixture's 1-ulp differences (p y + (1 - p) y) reach the
    // cache and flip 8-bit roundings of later activations, which moves logits by about 2%.
    let (dense, moe) = (
        load(&common::model_path(), cpu()),
        load(&upcycled(false), cpu()),
    );
    let (mut sd, mut sm) = (dense.session(256).unwrap(), moe.session(256).unwrap());
    for i in 0..24u32 {
        let id = 100 + (i * 37) % 4000;
        let g = sm.eval(&[id], Logits::Last).unwrap();
        let w = sd.eval(&[id], Logits::Last).unwrap();
        let e = common::rel_err(&g, &w);
        let tol = if i == 0 { 1e-5 } else { 0.06 };
        assert!(
            e < tol,
            "token {i}: the mixture differs from the dense model by {e}"
        );
    }
}

#[test]
fn distinct_experts_perplexity_agrees_with_llama_cpp_on_the_cpu_and_the_gpu() {
    use memwall::gpu::DeviceSelector;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = upcycled(true);
    let on_cpu = load(&path, cpu());
    let ppl = common::agreement::check_perplexity_at(&on_cpu, 256, 15, LLAMA_CPP_PPL_DISTINCT);
    // The experts matter: the same file with copies scores the dense model's 17.0.
    assert!(ppl > 18.0, "distinct experts scored {ppl}");
    let gpu = LoadOptions {
        device: DeviceChoice::Gpu(DeviceSelector::Auto),
        n_ctx: 256,
        ..Default::default()
    };
    let on_gpu = match Model::load(&path, &gpu) {
        Ok(m) => Arc::new(m),
        Err(e) => panic!("cannot load on the GPU ({e}); install Mesa lavapipe"),
    };
    assert!(on_gpu.gpu().is_some(), "--device gpu must not fall back");
    common::agreement::check_perplexity_at(&on_gpu, 256, 15, LLAMA_CPP_PPL_DISTINCT);
}

#[test]
fn streamed_expert_blocks_give_the_resident_logits_bit_for_bit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = upcycled(true);
    let with_budget = |budget| LoadOptions {
        mem_budget: Some(budget),
        ..cpu()
    };
    let minimum = match Model::load(&path, &with_budget(1)) {
        Err(memwall::Error::MemoryBudget { minimum, .. }) => minimum,
        other => panic!("a one-byte budget was not refused: {other:?}"),
    };
    // The minimum and about a quarter of the 240 MB of blocks: the rest stream.
    let streamed = load(&path, with_budget(minimum + (60 << 20)));
    let r = streamed.memory().expect("a memory plan").residency.clone();
    let n_streamed = r.resident.iter().filter(|&&x| !x).count();
    assert!(n_streamed > 10, "{n_streamed} of 30 blocks stream: {r:?}");
    let got = logits(&streamed);
    let resident = load(&path, with_budget(64 << 30));
    assert!(!resident.memory().unwrap().residency.streams());
    let want = logits(&resident);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let diff = g
            .iter()
            .zip(w)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(diff.is_none(), "step {step} differs at {diff:?}");
    }
}
