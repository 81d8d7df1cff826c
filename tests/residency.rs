//! Residency decided at run time: a session uploads blocks to keep them resident and frees
//! them (the others stream), between tokens, without changing any result. Runs on the adapter
//! `gpu` picks (lavapipe); no adapter is a failure.

mod common;

use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::gpu::{DeviceSelector, GpuLoadOptions};
use memwall::ground::{Device, Placement};
use memwall::model::Logits;

fn gpu() -> DeviceChoice {
    DeviceChoice::Gpu(DeviceSelector::Auto)
}

fn load(opts: &LoadOptions) -> Model {
    match Model::load(common::model_path(), opts) {
        Ok(m) => m,
        Err(e) => panic!("cannot load the model ({e}); a GPU adapter (lavapipe) is required"),
    }
}

/// (prompt ids) of the first `n` greedy.jsonl prompts.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(common::shared().join("reference/greedy.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|line| {
            let r: serde_json::Value = serde_json::from_str(line).unwrap();
            serde_json::from_value(r["prompt_ids"].clone()).unwrap()
        })
        .collect()
}

/// Greedy ids and the logits of every step: the prompt, then `n` generated tokens; `before`
/// runs before each step with the session.
fn greedy(
    m: &Model,
    prompt: &[u32],
    n: usize,
    before: &mut dyn FnMut(usize, &mut memwall::engine::Session),
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = m.session_with_ctx(256).unwrap();
    before(0, &mut s);
    let mut logits = vec![s.eval(prompt, Logits::Last).unwrap()];
    let mut ids = Vec::new();
    for step in 1..=n {
        let id = memwall::sampler::argmax(logits.last().unwrap()) as u32;
        ids.push(id);
        before(step, &mut s);
        logits.push(s.eval(&[id], Logits::Last).unwrap());
    }
    (ids, logits)
}

#[test]
fn changing_residency_mid_generation_changes_no_logit() {
    // Every stage on the GPU; the model holds no block, the session makes a different set
    // of blocks resident every two tokens (uploading some, freeing others) and streams the
    // rest. Same kernels on the same device as the all-resident model: identical logits.
    let all = load(&LoadOptions {
        device: gpu(),
        ..Default::default()
    });
    let n_layer = all.config().n_layer;
    let bare = load(&LoadOptions {
        device: gpu(),
        gpu: GpuLoadOptions {
            resident: Some(Placement {
                layers: vec![Device::Cpu; n_layer],
                ..Placement::all(Device::Gpu, n_layer)
            }),
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(
        bare.placement().decode,
        Placement::all(Device::Gpu, n_layer)
    );
    let sets: Vec<Vec<bool>> = vec![
        (0..n_layer).map(|l| l < 8).collect(),
        (0..n_layer).map(|l| l % 3 == 0).collect(),
        vec![false; n_layer],
        (0..n_layer).map(|l| l >= n_layer - 5).collect(),
    ];
    for prompt in prompts(2) {
        let (ids_r, logits_r) = greedy(&all, &prompt, 8, &mut |_, _| {});
        let mut held = Vec::new();
        let (ids, logits) = greedy(&bare, &prompt, 8, &mut |step, s| {
            if step % 2 == 0 {
                let want = &sets[(step / 2) % sets.len()];
                s.exec_mut().set_residency(want).unwrap();
                assert_eq!(s.exec().own_resident(), &want[..]);
                let g = s.gpu_backend().unwrap();
                assert!((0..n_layer).all(|l| g.has_block(l) == want[l]));
                held.push(g.allocated_bytes());
            }
        });
        assert_eq!(ids, ids_r);
        assert!(logits == logits_r, "logits changed with residency");
        // Freed blocks give their memory back: the empty set (steps 4) holds least.
        assert_eq!(held.iter().min(), Some(&held[2]), "{held:?}");
        assert!(held[0] > held[2] && held[1] > held[2], "{held:?}");
    }
}

#[test]
fn the_policy_changes_residency_mid_generation_without_changing_the_ids() {
    // Streaming under a budget, re-decided every 2 tokens: the policy picks the placements and
    // which blocks stay resident; on lavapipe (a software GPU) it moves blocks to the CPU and
    // frees their weights. f32 activations make CPU and GPU agree to rounding, so the greedy
    // ids are those of the all-GPU run.
    let opts = LoadOptions {
        device: gpu(),
        f32_activations: true,
        gpu_mem_budget: Some(48 << 20),
        stream: true,
        n_ctx: 256,
        resample_every: Some(2),
        ..Default::default()
    };
    let managed = load(&opts);
    let reference = load(&LoadOptions {
        device: gpu(),
        f32_activations: true,
        ..Default::default()
    });
    let g = managed.gpu().unwrap();
    let n_layer = managed.config().n_layer;
    assert!(
        (0..n_layer).all(|l| !g.has_layer(l)),
        "sessions own the blocks"
    );
    for prompt in prompts(2) {
        let (ids_r, _) = greedy(&reference, &prompt, 10, &mut |_, _| {});
        let mut start = None;
        let (ids, _) = greedy(&managed, &prompt, 10, &mut |step, s| {
            if step == 0 {
                start = Some(s.exec().own_resident().to_vec());
            }
        });
        assert_eq!(ids, ids_r);
        let start = start.unwrap();
        assert!(
            start.iter().any(|&r| r),
            "the budget's fit starts some blocks resident"
        );
    }
    // One more generation to read the counters of a whole session.
    let prompt = &prompts(1)[0];
    let mut s = managed.session_with_ctx(256).unwrap();
    let mut last = s.eval(prompt, Logits::Last).unwrap();
    for _ in 0..10 {
        let id = memwall::sampler::argmax(&last) as u32;
        last = s.eval(&[id], Logits::Last).unwrap();
    }
    let st = s.exec().stats.clone();
    let report = s.exec().policy_report().unwrap();
    eprintln!(
        "residency {:?}, {} uploads, {} frees, shares {:?}, decode {}",
        report.resident,
        st.blocks_uploaded,
        st.blocks_freed,
        report.shares,
        report.decode.placement
    );
    assert!(st.blocks_freed > 0, "the policy never changed residency");
    assert!(report.resident.is_some() && report.shares.is_some());
}
