//! GPU failures during a session (issue 7): a lost device or an allocation out of memory
//! moves the session's stages to the CPU from the same state, the generation finishes with
//! the same ids as an uninterrupted CPU run, and the caller gets `Event::DeviceFallback`.
//! Faults are injected through the GPU's test hooks (`memwall::gpu::GpuFaults`); the loss is
//! a real `wgpu::Device::destroy`.
//!
//! CPU and GPU agree on greedy ids with f32 activations and f32 caches (the settings of the
//! context-shift tests), so every comparison here runs in that mode.

mod common;

use std::sync::Arc;

use common::kv::load_options;
use memwall::api::{
    Event, FallbackCause, Finished, KvRebuild, Model, ModelConfig, Placement, StopReason,
};
use memwall::engine::LoadOptions;
use memwall::gpu::GpuFaults;
use memwall::ground::Device;

const N_TOKENS: usize = 10;

fn load(opts: LoadOptions) -> Model {
    ModelConfig::with_options(common::model_path(), opts)
        .n_ctx(256)
        .load()
        .unwrap()
}

fn faults(m: &Model) -> Arc<GpuFaults> {
    m.gpu().expect("a GPU model").ctx.faults().clone()
}

/// A prompt of more than one prefill batch (64 tokens).
fn long_prompt(m: &Model) -> Vec<u32> {
    let text = "The quick brown fox jumps over the lazy dog while the farmer watches. ".repeat(8);
    let ids = m.tokenize(&text, true);
    assert!(ids.len() > 64, "{} tokens", ids.len());
    ids
}

fn short_prompt(m: &Model) -> Vec<u32> {
    m.tokenize("Once upon a time, in a small village,", true)
}

/// The events of a greedy generation of N_TOKENS after `prompt`; `on_token(i)` runs before
/// the i-th token event is taken.
fn run(m: &Model, prompt: &[u32], mut on_token: impl FnMut(usize)) -> (Vec<Event>, Finished) {
    let mut s = m.session().unwrap();
    s.set_max_tokens(N_TOKENS);
    let mut events = Vec::new();
    let mut n_tok = 0;
    let mut done = None;
    for ev in s.prompt_tokens(prompt).unwrap() {
        let ev = ev.unwrap();
        if let Event::Token { .. } = ev {
            n_tok += 1;
            on_token(n_tok);
        }
        match ev {
            Event::Done(d) => done = Some(*d),
            ev => events.push(ev),
        }
    }
    let done = done.expect("no Done event");
    assert_eq!(done.fallbacks, s.fallbacks().to_vec());
    (events, done)
}

fn cpu_ids(prompt_of: impl Fn(&Model) -> Vec<u32>) -> Vec<u32> {
    let m = load(load_options(false, true));
    let (_, done) = run(&m, &prompt_of(&m), |_| {});
    assert_eq!(done.stop, StopReason::Limit);
    done.generated_ids
}

/// Token ids and the fallbacks, with the index of the token events each fallback came after.
fn split(events: &[Event]) -> (Vec<u32>, Vec<(usize, memwall::api::Fallback)>) {
    let mut ids = Vec::new();
    let mut falls = Vec::new();
    for ev in events {
        match ev {
            Event::Token { id, .. } => ids.push(*id),
            Event::DeviceFallback(f) => falls.push((ids.len(), f.clone())),
            _ => {}
        }
    }
    (ids, falls)
}

#[test]
fn device_lost_mid_decode_finishes_like_an_uninterrupted_cpu_run() {
    let expected = cpu_ids(short_prompt);
    let m = load(load_options(true, true));
    let f = faults(&m);
    // After the 4th token is handed out, the next submission destroys the device.
    let (events, done) = run(&m, &short_prompt(&m), |i| {
        if i == 4 {
            f.lose_device_after_submits(0);
        }
    });
    assert!(f.device_lost(), "the loss was not injected");
    let (ids, falls) = split(&events);
    assert_eq!(ids, done.generated_ids);
    assert_eq!(done.generated_ids, expected, "ids differ from the CPU run");
    assert_eq!(falls.len(), 1, "{falls:?}");
    let (after, fb) = &falls[0];
    assert_eq!(*after, 4, "the fallback comes with the 5th token");
    assert_eq!(fb.cause, FallbackCause::DeviceLost);
    assert_eq!(fb.kv, KvRebuild::Recomputed);
    assert_eq!((fb.from, fb.to), (Device::Gpu, Device::Cpu));
    assert!(fb.position > 4, "{fb}");
    assert_eq!(done.device, "cpu");
    assert!(fb.to_string().contains("device lost"), "{fb}");
}

#[test]
fn device_lost_during_prefill_finishes_like_an_uninterrupted_cpu_run() {
    let expected = cpu_ids(long_prompt);
    let m = load(load_options(true, true));
    let f = faults(&m);
    f.lose_device_after_submits(0);
    let (events, done) = run(&m, &long_prompt(&m), |_| {});
    assert!(f.device_lost());
    let (_, falls) = split(&events);
    assert_eq!(done.generated_ids, expected, "ids differ from the CPU run");
    assert_eq!(falls.len(), 1, "{falls:?}");
    assert_eq!(falls[0].0, 0, "the loss happened before the first token");
    assert_eq!(falls[0].1.cause, FallbackCause::DeviceLost);
    // A later session of the same model starts on the CPU, and says why.
    let mut s = m.session().unwrap();
    assert_eq!(s.fallbacks().len(), 1, "{:?}", s.fallbacks());
    assert_eq!(s.fallbacks()[0].cause, FallbackCause::DeviceLost);
    s.set_max_tokens(2);
    let done = s.prompt("Hello").unwrap().finish().unwrap();
    assert_eq!(done.generated_ids.len(), 2);
}

#[test]
fn out_of_memory_at_load_leaves_the_blocks_that_did_not_fit_on_the_cpu() {
    let expected = cpu_ids(short_prompt);
    // Count the allocations of a whole load, then fail one in the middle of the blocks.
    let counter = Arc::new(GpuFaults::default());
    let mut opts = load_options(true, true);
    opts.gpu.faults = Some(counter.clone());
    let full = load(opts.clone());
    assert!(full.load_fallback().is_none());
    let n = counter.allocations();
    drop(full);
    let f = Arc::new(GpuFaults::default());
    f.fail_allocations(n / 2, 1);
    opts.gpu.faults = Some(f.clone());
    let m = load(opts);
    let fb = m
        .load_fallback()
        .expect("the load reports the fallback")
        .clone();
    assert_eq!(fb.cause, FallbackCause::OutOfMemory);
    assert!(fb.reason.contains("injected"), "{fb}");
    let p = &m.placement().decode;
    let n_layer = p.layers.len();
    let on_gpu = p.layers.iter().filter(|&&d| d == Device::Gpu).count();
    assert!(on_gpu > 0 && on_gpu < n_layer, "placement {p}");
    assert_eq!(fb.stages, n_layer - on_gpu, "{fb}");
    assert_eq!(
        p.layers[n_layer - 1],
        Device::Cpu,
        "the last blocks did not fit"
    );
    let (events, done) = run(&m, &short_prompt(&m), |_| {});
    let (_, falls) = split(&events);
    assert_eq!(falls.len(), 1, "the session reports the load's fallback");
    assert_eq!((falls[0].0, &falls[0].1), (0, &fb));
    assert_eq!(done.generated_ids, expected, "ids differ from the CPU run");
}

#[test]
fn out_of_memory_in_a_streamed_upload_goes_on_on_the_cpu() {
    let expected = cpu_ids(short_prompt);
    let mut opts = load_options(true, true);
    let n_layer = {
        let m = load(load_options(false, true));
        m.config().n_layer
    };
    // The last 2 blocks resident, the others streamed through two slots at every pass.
    opts.gpu.resident = Some(Placement::gpu_layers(2, n_layer));
    let m = load(opts);
    let f = faults(&m);
    let (events, done) = run(&m, &short_prompt(&m), |i| {
        if i == 3 {
            f.fail_allocations(0, 1);
        }
    });
    let (_, falls) = split(&events);
    assert_eq!(done.generated_ids, expected, "ids differ from the CPU run");
    assert_eq!(falls.len(), 1, "{falls:?}");
    assert_eq!(falls[0].0, 3);
    let fb = &falls[0].1;
    assert_eq!(fb.cause, FallbackCause::OutOfMemory);
    assert!(fb.reason.contains("stream block"), "{fb}");
    // The device still answered: the cache was copied, not recomputed.
    assert_eq!(fb.kv, KvRebuild::Copied);
    assert_eq!(fb.stages, n_layer + 2);
}
