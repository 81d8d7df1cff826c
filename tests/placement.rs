//! Results do not depend on where the stages run: all-CPU, all-GPU, CPU/GPU splits at several
//! layers, separate prefill and decode placements, and layers moving between devices in the
//! middle of a generation. Runs on the adapter `gpu` picks (lavapipe in CI); no adapter is a
//! failure.

mod common;

use std::sync::OnceLock;

use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::gpu::DeviceSelector;
use memwall::ground::{Device, Phase, Placement};
use memwall::model::Logits;
use serde_json::Value;

fn load(device: DeviceChoice, gpu_layers: Option<usize>, f32_activations: bool) -> Model {
    let opts = LoadOptions {
        device,
        gpu_layers,
        f32_activations,
        ..Default::default()
    };
    match Model::load(common::model_path(), &opts) {
        Ok(m) => m,
        Err(e) => panic!("cannot load the model ({e}); a GPU adapter (lavapipe) is required"),
    }
}

fn gpu() -> DeviceChoice {
    DeviceChoice::Gpu(DeviceSelector::Auto)
}

/// Every weight on the GPU (so any placement can run), f32 activations: the mode in which the
/// CPU and GPU compute the same arithmetic up to f32 rounding.
fn gpu_f32() -> Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load(gpu(), None, true)).clone()
}

/// (prompt ids, reference continuation ids) of the first `n` greedy.jsonl prompts.
fn prompts(n: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(common::shared().join("reference/greedy.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|line| {
            let r: Value = serde_json::from_str(line).unwrap();
            (
                serde_json::from_value(r["prompt_ids"].clone()).unwrap(),
                serde_json::from_value(r["ids"].clone()).unwrap(),
            )
        })
        .collect()
}

/// Logits of the prompt (one prefill pass) and then of `steps` reference tokens fed one at a
/// time, with `place(step)` giving the (prefill, decode) placement before each pass.
fn logits_with(
    m: &Model,
    prompt: &[u32],
    feed: &[u32],
    place: &dyn Fn(usize) -> Option<(Placement, Placement)>,
) -> Vec<Vec<f32>> {
    let mut s = m.session_with_ctx(256).unwrap();
    let mut out = Vec::new();
    let mut toks: Vec<&[u32]> = vec![prompt];
    toks.extend(feed.iter().map(std::slice::from_ref));
    for (step, t) in toks.iter().enumerate() {
        if let Some((pre, dec)) = place(step) {
            s.exec_mut().set_placement(Phase::Prefill, pre).unwrap();
            s.exec_mut().set_placement(Phase::Decode, dec).unwrap();
        }
        out.push(s.eval(t, Logits::Last).unwrap());
    }
    out
}

#[test]
fn logits_do_not_depend_on_the_placement() {
    let m = gpu_f32();
    let n_layer = m.config().n_layer;
    let all_gpu = Placement::all(Device::Gpu, n_layer);
    let all_cpu = Placement::all(Device::Cpu, n_layer);
    let split = move |n: usize| Placement::gpu_layers(n, n_layer);
    // A placement per pass: layers move between devices in the middle of the generation.
    let moving = move |step: usize| {
        let p = split([0, 29, 7, 30, 15, 1][step % 6]);
        Some((p.clone(), p))
    };
    type Case<'a> = (
        &'a str,
        Box<dyn Fn(usize) -> Option<(Placement, Placement)>>,
    );
    let (ac, ag) = (all_cpu.clone(), all_gpu.clone());
    let cases: Vec<Case> = vec![
        ("all-cpu", Box::new(move |_| Some((ac.clone(), ac.clone())))),
        ("split 1", Box::new(move |_| Some((split(1), split(1))))),
        ("split 15", Box::new(move |_| Some((split(15), split(15))))),
        ("split 29", Box::new(move |_| Some((split(29), split(29))))),
        (
            "gpu prefill, cpu decode",
            Box::new(move |_| Some((ag.clone(), all_cpu.clone()))),
        ),
        ("moving mid-generation", Box::new(moving)),
    ];
    const STEPS: usize = 5;
    for (prompt, ids) in prompts(2) {
        let feed = &ids[..STEPS];
        let reference = logits_with(&m, &prompt, feed, &|_| {
            Some((all_gpu.clone(), all_gpu.clone()))
        });
        for (name, place) in &cases {
            let got = logits_with(&m, &prompt, feed, place.as_ref());
            let worst = got
                .iter()
                .zip(&reference)
                .map(|(a, b)| common::rel_to_range(a, b))
                .fold(0f32, f32::max);
            eprintln!("{name}: worst logit difference vs all-GPU {worst:.3e}");
            assert!(
                worst <= 1e-2,
                "{name}: logits differ from all-GPU by {worst:.3e}"
            );
        }
    }
}

#[test]
fn moving_the_kv_cache_between_devices_changes_nothing() {
    // Same kernels on the same device before and after: the KV cache of every layer goes to
    // the CPU and back between two decode steps, and the ids and logits are bit-identical
    // to a run that never moved it.
    let m = load(gpu(), None, false);
    let n_layer = m.config().n_layer;
    let prompt = m.tokenizer().encode("The capital of France is", true, true);
    let run = |move_at: Option<usize>| {
        let mut s = m.session_with_ctx(128).unwrap();
        let mut logits = s.eval(&prompt, Logits::Last).unwrap();
        let mut ids = Vec::new();
        let mut all = Vec::new();
        for step in 0..8 {
            let id = memwall::sampler::argmax(&logits) as u32;
            ids.push(id);
            all.push(logits.clone());
            if move_at == Some(step) {
                let n_past = s.tokens().len();
                let e = s.exec_mut();
                e.set_placement(Phase::Decode, Placement::all(Device::Cpu, n_layer))
                    .unwrap();
                e.settle(Phase::Decode, n_past).unwrap();
                assert!(e.kv_home().iter().all(|&d| d == Device::Cpu));
                e.set_placement(Phase::Decode, Placement::all(Device::Gpu, n_layer))
                    .unwrap();
                e.settle(Phase::Decode, n_past).unwrap();
                assert!(e.kv_home().iter().all(|&d| d == Device::Gpu));
                assert_eq!(e.stats.kv_moves, 2 * n_layer as u64);
            }
            logits = s.eval(&[id], Logits::Last).unwrap();
        }
        (ids, all)
    };
    let (ids_a, logits_a) = run(None);
    let (ids_b, logits_b) = run(Some(3));
    assert_eq!(ids_a, ids_b);
    assert_eq!(logits_a, logits_b, "logits changed after a KV round trip");
}

#[test]
fn a_split_agrees_with_llama_cpp() {
    // Half the blocks on the CPU, half and the head on the GPU, in the default (8-bit
    // activation) mode: the agreement rule on every reference prompt.
    let m = load(gpu(), Some(15), false);
    let p = m.placement().decode.clone();
    assert_eq!(p.layers.iter().filter(|&&d| d == Device::Gpu).count(), 15);
    assert_eq!(p.crossings(), 1);
    // The blocks placed on the CPU were never uploaded.
    let g = m.gpu().unwrap();
    assert!(!g.has_layer(0) && g.has_layer(n_layer_of(&m) - 1));
    common::agreement::check_greedy(&m);
}

fn n_layer_of(m: &Model) -> usize {
    m.config().n_layer
}

#[test]
fn placement_errors_are_clear() {
    // Blocks without resident weights may be placed on the GPU (they stream); the embedding
    // and head may not: a placement that needs their weights there is refused, not run.
    let two = load(gpu(), Some(2), false);
    let n_layer = two.config().n_layer;
    let mut s = two.session_with_ctx(64).unwrap();
    s.exec_mut()
        .set_placement(Phase::Decode, Placement::all(Device::Gpu, n_layer))
        .unwrap();
    let m = load(gpu(), Some(0), false);
    let mut s = m.session_with_ctx(64).unwrap();
    let err = s
        .exec_mut()
        .set_placement(Phase::Decode, Placement::all(Device::Gpu, n_layer))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not uploaded"), "{err}");
    let err = s
        .exec_mut()
        .set_placement(Phase::Decode, Placement::all(Device::Cpu, n_layer + 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("layers"), "{err}");
    // --gpu-layers with the CPU device is a contradiction, said so.
    let opts = LoadOptions {
        device: DeviceChoice::Cpu,
        gpu_layers: Some(3),
        ..Default::default()
    };
    let err = Model::load(common::model_path(), &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--gpu-layers"), "{err}");
}

#[test]
fn streamed_blocks_give_the_same_results_as_resident_ones() {
    // Only the last 2 blocks (and the head) resident; the other 28 run on the GPU too, their
    // weights streamed from the mmap through two slots. Same kernels on the same device as the
    // all-resident run: ids and logits must be identical.
    let resident = load(gpu(), None, false);
    let n_layer = resident.config().n_layer;
    let opts = LoadOptions {
        device: gpu(),
        gpu: memwall::gpu::GpuLoadOptions {
            resident: Some(Placement::gpu_layers(2, n_layer)),
            ..Default::default()
        },
        ..Default::default()
    };
    let streamed = Model::load(common::model_path(), &opts).unwrap();
    let g = streamed.gpu().unwrap();
    assert!(!g.has_layer(0) && !g.has_layer(n_layer - 3) && g.has_layer(n_layer - 2));
    assert_eq!(
        streamed.placement().decode,
        Placement::all(Device::Gpu, n_layer),
        "every block runs on the GPU"
    );
    for (prompt, _) in prompts(2) {
        let run = |m: &Model| {
            let mut s = m.session_with_ctx(128).unwrap();
            let mut logits = vec![s.eval(&prompt, Logits::Last).unwrap()];
            let mut ids = Vec::new();
            for _ in 0..6 {
                let id = memwall::sampler::argmax(logits.last().unwrap()) as u32;
                ids.push(id);
                logits.push(s.eval(&[id], Logits::Last).unwrap());
            }
            let loads = s.gpu_backend().unwrap().stream_stats().map(|x| x.0);
            (ids, logits, loads)
        };
        let (ids_r, logits_r, loads_r) = run(&resident);
        let (ids_s, logits_s, loads_s) = run(&streamed);
        assert_eq!(
            loads_r, None,
            "nothing streams when every block is resident"
        );
        // 28 blocks per pass, 7 passes.
        assert_eq!(loads_s, Some(28 * 7));
        assert_eq!(ids_s, ids_r);
        assert!(
            logits_s == logits_r,
            "streamed logits differ from resident ones"
        );
    }
}

#[test]
fn the_offload_policy_moves_layers_mid_generation_without_changing_results() {
    // All weights on the GPU, the policy re-deciding every 2 tokens from measured stage
    // times. On lavapipe (a software GPU on the same cores) the CPU path is several times
    // faster per layer, so the measured optimum is away from the all-GPU start and the policy
    // moves layers (and their KV caches) between tokens: the logits must not notice.
    let opts = LoadOptions {
        device: gpu(),
        f32_activations: true,
        resample_every: Some(2),
        ..Default::default()
    };
    let dynamic = Model::load(common::model_path(), &opts).unwrap();
    let reference = gpu_f32();
    for (prompt, ids) in prompts(2) {
        let feed = &ids[..10];
        let want = logits_with(&reference, &prompt, feed, &|_| None);
        let mut s = dynamic.session_with_ctx(256).unwrap();
        let mut toks: Vec<&[u32]> = vec![&prompt];
        toks.extend(feed.iter().map(std::slice::from_ref));
        let mut worst = 0f32;
        for (step, t) in toks.iter().enumerate() {
            let got = s.eval(t, Logits::Last).unwrap();
            let e = common::rel_to_range(&got, &want[step]);
            worst = worst.max(e);
            assert!(
                e <= 1e-2,
                "step {step}: logits differ from all-GPU by {e:.3e}"
            );
        }
        let report = s.exec().policy_report().unwrap();
        eprintln!(
            "policy: decode {} prefill {}, {} migrations, {} KV moves; worst {worst:.3e}",
            report.decode.placement,
            report.prefill.placement,
            report.migrations.len(),
            s.exec().stats.kv_moves
        );
        assert!(
            !report.migrations.is_empty(),
            "the policy never moved anything"
        );
        assert!(s.exec().stats.kv_moves > 0);
    }
}

fn cli_json(args: &[&str]) -> Value {
    let model = common::model_path();
    let mut a: Vec<&std::ffi::OsStr> = vec!["run".as_ref(), "-m".as_ref(), model.as_os_str()];
    a.extend(args.iter().map(|s| std::ffi::OsStr::new(*s)));
    a.extend(
        [
            "--json",
            "--temp",
            "0",
            "-n",
            "3",
            "-c",
            "256",
            "-p",
            "The capital of France is",
        ]
        .map(std::ffi::OsStr::new),
    );
    let (code, out) = common::run_memwall(&a);
    assert_eq!(code, Some(0), "{out}");
    let line = out.lines().rev().find(|l| l.starts_with('{')).expect(&out);
    serde_json::from_str(line).unwrap()
}

#[test]
fn cli_budget_split_and_streaming() {
    // A 40 MB budget holds a few blocks of this model (plus scratch): those run on the GPU,
    // the rest on the CPU; with --stream every block runs on the GPU.
    let split = cli_json(&["-d", "gpu", "--gpu-mem-budget", "40M"]);
    let p = split["placement"]["decode"].as_str().unwrap().to_string();
    let (g, c) = (p.matches('G').count(), p.matches('c').count());
    assert!(g > 0 && c > 0, "budget placement {p}");
    assert_eq!(split["generated_ids"].as_array().unwrap().len(), 3);
    let streamed = cli_json(&["-d", "gpu", "--gpu-mem-budget", "48M", "--stream"]);
    let p = streamed["placement"]["decode"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        p.split('|').nth(1).unwrap().chars().all(|c| c == 'G'),
        "{p}"
    );
    assert_eq!(streamed["generated_ids"], split["generated_ids"]);
    // Bad values are errors naming them.
    let model = common::model_path();
    for (args, needle) in [
        (vec!["--gpu-mem-budget", "12X"], "12X"),
        (vec!["--gpu-mem-budget", "1M", "--stream"], "stream"),
        (
            vec!["--gpu-layers", "3", "--gpu-mem-budget", "1G"],
            "alternatives",
        ),
    ] {
        let mut a: Vec<&std::ffi::OsStr> = vec![
            "run".as_ref(),
            "-m".as_ref(),
            model.as_os_str(),
            "-d".as_ref(),
            "gpu".as_ref(),
        ];
        a.extend(args.iter().map(std::ffi::OsStr::new));
        a.extend(["-p", "Hi", "-n", "1"].map(std::ffi::OsStr::new));
        let (code, out) = common::run_memwall(&a);
        assert_ne!(code, Some(0), "{args:?}: {out}");
        assert!(
            out.contains(needle) && !out.contains("panicked"),
            "{args:?}: {out}"
        );
    }
}
