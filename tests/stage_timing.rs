//! How measured passes time the GPU stages: GPU timestamp queries when the adapter has them
//! (their sum is GPU execution time, so it cannot exceed the pass's wall time), the wall clock
//! with a sync per stage otherwise. Runs on the adapter `gpu` picks (lavapipe; with
//! `WGPU_BACKEND=gl`, llvmpipe's GL) and with timestamps turned off (the fallback).

mod common;

use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::gpu::{DeviceSelector, GpuLoadOptions};
use memwall::ground::{Device, Phase};
use memwall::model::Logits;
use memwall::scheduler::policy::TimeSource;
use memwall::scheduler::StageTimes;

fn load(no_timestamps: bool) -> Model {
    let opts = LoadOptions {
        device: DeviceChoice::Gpu(DeviceSelector::Auto),
        // A split: CPU blocks, a crossing, GPU blocks and head.
        gpu_layers: Some(20),
        gpu: GpuLoadOptions {
            no_timestamps,
            ..Default::default()
        },
        ..Default::default()
    };
    match Model::load(common::model_path(), &opts) {
        Ok(m) => m,
        Err(e) => panic!("cannot load the model ({e}); a GPU adapter is required"),
    }
}

/// Checks one measured pass: every stage timed, positive, and the stages plus crossings
/// within the pass's wall time (timestamps: GPU time of work the host waited for; wall
/// clock: disjoint intervals of it).
fn check(t: &StageTimes, want: TimeSource, phase: Phase) {
    assert_eq!(t.source, want, "{t:?}");
    assert_eq!(t.phase, phase);
    let (head_dev, head_ms) = t.head.expect("the head was timed");
    assert_eq!(head_dev, Device::Gpu);
    let stages: Vec<f64> = std::iter::once(t.embed.1)
        .chain(t.layers.iter().map(|l| l.1))
        .chain(std::iter::once(head_ms))
        .collect();
    for (k, &ms) in stages.iter().enumerate() {
        assert!(ms.is_finite() && ms > 0.0, "stage {k}: {ms} ms ({t:?})");
    }
    // GPU stages (blocks 10.., head) only: the embedding and blocks 0..10 are CPU.
    assert!(t.layers[..10].iter().all(|l| l.0 == Device::Cpu));
    assert!(t.layers[10..].iter().all(|l| l.0 == Device::Gpu));
    let sum: f64 = stages.iter().sum::<f64>() + t.crossing_ms;
    // 2 % plus 0.5 ms for the clocks' granularity and the GPU clock's own rate.
    assert!(
        sum <= t.wall_ms * 1.02 + 0.5,
        "stages sum to {sum:.3} ms, more than the pass's {:.3} ms ({t:?})",
        t.wall_ms
    );
    assert_eq!(t.crossings, 1);
}

fn measured(m: &Model, want: TimeSource) {
    let prompt = m.tokenizer().encode("The capital of France is", true, true);
    let mut s = m.session_with_ctx(64).unwrap();
    s.exec_mut().measure_next();
    let logits = s.eval(&prompt, Logits::Last).unwrap();
    let t = s
        .exec_mut()
        .take_times()
        .expect("the prefill pass was measured");
    check(&t, want, Phase::Prefill);
    let id = memwall::sampler::argmax(&logits) as u32;
    s.exec_mut().measure_next();
    s.eval(&[id], Logits::Last).unwrap();
    let t = s
        .exec_mut()
        .take_times()
        .expect("the decode pass was measured");
    check(&t, want, Phase::Decode);
}

#[test]
fn gpu_stages_are_timed_by_timestamps_when_the_adapter_has_them() {
    let m = load(false);
    let g = m.gpu().unwrap();
    let has = g.ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY);
    eprintln!(
        "{} ({}): timestamp queries {has}",
        g.ctx.info.name, g.ctx.info.backend
    );
    assert_eq!(g.timestamps, has);
    let want = if has {
        TimeSource::GpuTimestamps
    } else {
        TimeSource::WallClock
    };
    measured(&m, want);
}

#[test]
fn without_timestamps_the_wall_clock_times_each_stage() {
    let m = load(true);
    assert!(!m.gpu().unwrap().timestamps);
    measured(&m, TimeSource::WallClock);
}
