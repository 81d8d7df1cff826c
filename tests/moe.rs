//! The mixture-of-experts path on real text: the test model upcycled into 4 experts per block
//! (2 used per token, `memwall upcycle`, tests/data/reference/smollm2-upcycled-moe). With
//! identical experts it gives the dense model's logits; with distinct experts its perplexity
//! agrees with llama.cpp's on the same file, on the CPU and on the GPU's expert kernels
//! (lavapipe in CI), whose logits follow the CPU path's and whose decode reads nothing back;
//! and under a memory budget too small for it, an expert cache that holds some experts and
//! reads the others from storage gives the all-resident logits bit for bit.

mod common;

use std::path::PathBuf;
use std::sync::Mutex;

use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::model::Logits;
use memwall::tools::bench::upcycle::{upcycle, UpcycleOptions};

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

fn load(path: &std::path::Path, o: LoadOptions) -> Model {
    Model::load(path, &o).unwrap()
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
fn logits(m: &Model) -> Vec<Vec<f32>> {
    let mut s = m.session_with_ctx(256).unwrap();
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
    // to rounding (1e-5 where the packed and the file-layout kernels sum alike, 4e-3 on the
    // AVX2 path, whose two kernels sum in other orders and flip an 8-bit code downstream);
    // after it the mixture's 1-ulp differences (p y + (1 - p) y) reach the cache and flip
    // 8-bit roundings of later activations, which moves logits by about 2%. A wrong mixture
    // (weights not summing to 1, a wrong expert's rows) moves them by far more.
    let (dense, moe) = (
        load(&common::model_path(), cpu()),
        load(&upcycled(false), cpu()),
    );
    let (mut sd, mut sm) = (
        dense.session_with_ctx(256).unwrap(),
        moe.session_with_ctx(256).unwrap(),
    );
    for i in 0..24u32 {
        let id = 100 + (i * 37) % 4000;
        let g = sm.eval(&[id], Logits::Last).unwrap();
        let w = sd.eval(&[id], Logits::Last).unwrap();
        let e = common::rel_err(&g, &w);
        let tol = if i == 0 { 1e-2 } else { 0.06 };
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
        Ok(m) => m,
        Err(e) => panic!("cannot load on the GPU ({e}); install Mesa lavapipe"),
    };
    assert!(on_gpu.gpu().is_some(), "--device gpu must not fall back");
    assert_experts_on_gpu(&on_gpu);
    common::agreement::check_perplexity_at(&on_gpu, 256, 15, LLAMA_CPP_PPL_DISTINCT);
}

/// Every block (so every mixture of experts) of `m` runs on the GPU in both phases.
fn assert_experts_on_gpu(m: &Model) {
    use memwall::ground::Device;
    let p = m.placement();
    for (phase, pl) in [("prefill", &p.prefill), ("decode", &p.decode)] {
        assert!(
            pl.layers.iter().all(|&d| d == Device::Gpu),
            "{phase} placement {pl}: the expert blocks must run on the GPU"
        );
    }
}

/// The GPU's expert kernels (routing on the GPU, the experts' matvecs over the stacks by the
/// ids it left there, the weighted sum) follow the CPU's expert path: f32 activations on both,
/// a 70-token prefill (pairs of every expert) and 6 decode steps, through 30 blocks.
#[test]
fn gpu_experts_follow_the_cpu_path() {
    use memwall::gpu::DeviceSelector;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = upcycled(true);
    let f32_act = |device| LoadOptions {
        device,
        f32_activations: true,
        n_ctx: 256,
        ..Default::default()
    };
    let gpu = load(&path, f32_act(DeviceChoice::Gpu(DeviceSelector::Auto)));
    assert!(gpu.gpu().is_some(), "--device gpu must not fall back");
    assert_experts_on_gpu(&gpu);
    let cpu = load(&path, f32_act(DeviceChoice::Cpu));
    let (got, want) = (logits(&gpu), logits(&cpu));
    let n_vocab = cpu.config().n_vocab;
    let mut worst = 0f32;
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        // Each token's logits of the prefill on their own range.
        for (i, (gt, wt)) in g.chunks(n_vocab).zip(w.chunks(n_vocab)).enumerate() {
            let e = common::rel_to_range(gt, wt);
            worst = worst.max(e);
            assert!(
                e <= 1e-2,
                "step {step} token {i}: GPU logits differ from the CPU's by {e:.3e} of the range"
            );
        }
    }
    eprintln!("worst GPU-vs-CPU expert logit difference: {worst:.3e} of max |logit|");
}

/// The expert ids never come back to the host: a greedy decode step of the mixture is one
/// submission, as a dense model's, and creates nothing once warm.
#[test]
fn gpu_expert_decode_is_one_submission_per_token() {
    use memwall::gpu::DeviceSelector;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = LoadOptions {
        device: DeviceChoice::Gpu(DeviceSelector::Auto),
        n_ctx: 128,
        ..Default::default()
    };
    let m = load(&upcycled(true), gpu);
    assert_experts_on_gpu(&m);
    let mut s = m.session_with_ctx(128).unwrap();
    let prompt = m.tokenizer().encode("The capital of France is", true, true);
    let mut id = s.eval_argmax(&prompt).unwrap();
    id = s.eval_argmax(&[id]).unwrap();
    let (l0, s0, bg0) = s.gpu_backend().unwrap().stats();
    let steps = 6;
    for _ in 0..steps {
        id = s.eval_argmax(&[id]).unwrap();
    }
    let (l1, s1, bg1) = s.gpu_backend().unwrap().stats();
    assert_eq!(s1 - s0, steps, "submissions per decode step");
    assert_eq!(bg1, bg0, "bind groups created in the token loop");
    // Per block at least the router, the routing, three expert matvecs, the activation and
    // the sum.
    assert!(l1 - l0 >= steps * m.config().n_layer as u64 * 7);
}

/// The smallest budget a load of `path` would take now (the plan counts what the process
/// holds), from the refusal of a budget of one byte.
fn minimum_now(path: &std::path::Path) -> u64 {
    let o = LoadOptions {
        mem_budget: Some(1),
        ..cpu()
    };
    match Model::load(path, &o) {
        Err(memwall::Error::MemoryBudget { minimum, .. }) => minimum,
        other => panic!("a one-byte budget was not refused: {other:?}"),
    }
}

#[test]
fn an_expert_cache_holding_some_experts_gives_the_resident_logits_bit_for_bit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = upcycled(true);
    let with_budget = |budget| LoadOptions {
        mem_budget: Some(budget),
        ..cpu()
    };
    // Room for about a third of the 120 experts (1.66 MB each) beside the dense parts.
    let minimum = minimum_now(&path);
    let cached = load(&path, with_budget(minimum + (70 << 20)));
    let plan = cached.memory().expect("a memory plan").clone();
    let x = plan.experts.clone().expect("an expert cache");
    assert!(!plan.residency.streams(), "no block streams: {plan:?}");
    assert!(plan.residency.planned_bytes <= plan.budget_bytes);
    assert_eq!(x.n_experts, 120);
    assert!(
        x.capacity_bytes > 0 && x.capacity_bytes < x.expert_bytes / 2,
        "{x:?}"
    );
    let got = logits(&cached);
    let st = cached.expert_stats().expect("cache statistics");
    assert!(st.misses > 0 && st.hits > 0, "{st:?}");
    assert!(st.held > 0 && st.held_bytes <= st.capacity_bytes, "{st:?}");
    // Each miss read its expert's three slices: 1.66 MB of Q4_1.
    assert!(st.bytes_read >= st.misses * 1_600_000, "{st:?}");
    let resident = load(&path, with_budget(64 << 30));
    assert!(resident.expert_stats().is_none());
    assert!(resident.memory().unwrap().experts.is_none());
    let want = logits(&resident);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let diff = g
            .iter()
            .zip(w)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(diff.is_none(), "step {step} differs at {diff:?}");
    }
    // Less room than one expert beside the working set (the minimum moves by a few KB between
    // measurements): every expert is read when needed, the same logits.
    let bare = load(&path, with_budget(minimum_now(&path) + (1 << 20)));
    let room = bare
        .memory()
        .unwrap()
        .experts
        .as_ref()
        .unwrap()
        .capacity_bytes;
    assert!(room < 1_600_000, "{room}");
    let got = logits(&bare);
    assert_eq!(bare.expert_stats().unwrap().hits, 0);
    assert!(got.iter().zip(&want).all(|(g, w)| g == w));
}

#[test]
fn run_reports_the_expert_cache() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = upcycled(true);
    // The CLI process holds far less than this test's: 160 MB leaves its expert cache about a
    // third of the 199 MB of experts beside the ~90 MB the rest needs.
    let budget = "160M";
    let args = [
        "run",
        "-d",
        "cpu",
        "-c",
        "256",
        "--temp",
        "0",
        "-n",
        "8",
        "--json",
        "-p",
        "The capital of France is",
        "--mem-budget",
        budget,
        "-m",
    ];
    let mut a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    a.push(path.as_os_str());
    let (code, out) = common::run_memwall(&a);
    assert_eq!(code, Some(0), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let x = &v["experts"];
    let (hits, misses) = (x["hits"].as_u64().unwrap(), x["misses"].as_u64().unwrap());
    // 13 tokens through 30 blocks of 2 experts each, the prompt's grouped.
    assert!(hits + misses >= 30 * 2 * 8, "{x}");
    assert!(misses > 0 && x["bytes_read"].as_u64().unwrap() > 0, "{x}");
    let rate = x["hit_rate"].as_f64().unwrap();
    assert!(
        (rate - hits as f64 / (hits + misses) as f64).abs() < 1e-9,
        "{x}"
    );
    assert!(
        v["memory"]["experts"]["capacity_bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
}
