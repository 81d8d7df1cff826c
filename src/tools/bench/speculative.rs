//! Speculative decoding in `memwall bench` (`--draft-model FILE` or `--draft-lookup`): beside
//! each configuration's llama-bench style runs, greedy generations after a text prompt, plain
//! and with drafts, on the same session. Random ids (the plain runs' input) would never follow
//! a draft, so these runs generate from real text: the tokens/s of both, the speed-up, what
//! the model kept of the drafts, and whether the drafted runs gave the plain run's ids.
//!
//! Each repetition starts from an empty context (the prompt evaluated again, not timed) and a
//! new drafter, so no run finds the previous one's prompt in the draft model's cache. The
//! drafted runs start with one untimed warm-up (the draft model's first pages and buffers).

use std::path::PathBuf;

use super::results::{SpecResult, Stat};
use crate::engine::{DeviceChoice, DraftParams, LoadOptions, Model, Session};
use crate::error::{Error, Result};

/// The prompt of the drafted runs when none is given: code, where a draft model (and prompt
/// lookup) is typically confident.
pub const DEFAULT_PROMPT: &str = "// A function that sorts a vector of integers with \
    quicksort, in Rust.\nfn quicksort(v: &mut Vec<i32>) {";

/// Where the drafts come from.
#[derive(Debug, Clone)]
pub enum DraftSource {
    /// A smaller model of the same vocabulary, on `device`.
    Model { path: PathBuf, device: DeviceChoice },
    /// Prompt lookup over n-grams of 2..=4 tokens (as `memwall run --draft-lookup`).
    Lookup,
}

/// What `--draft-*` asks the bench to measure.
#[derive(Debug, Clone)]
pub struct BenchDraft {
    pub source: DraftSource,
    pub params: DraftParams,
    /// The text the generations continue.
    pub prompt: String,
}

/// The draft model of `d`, loaded before the model so that the model's plan gets what it
/// leaves of the budget (`LoadOptions::mem_held`).
pub(super) fn load_draft(d: &BenchDraft, target: &LoadOptions) -> Result<Option<Model>> {
    let DraftSource::Model { path, device } = &d.source else {
        return Ok(None);
    };
    let opts = LoadOptions {
        threads: target.threads,
        device: device.clone(),
        n_ctx: target.n_ctx,
        mem_budget: target.mem_budget,
        stream_io: target.stream_io,
        cache_type_k: target.cache_type_k,
        cache_type_v: target.cache_type_v,
        ..Default::default()
    };
    Model::load(path, &opts).map(Some)
}

/// Reader counters of `s`, when its blocks stream: (bytes read, seconds waited).
fn reads(s: &Session) -> Option<(u64, f64)> {
    s.exec().stream_stats().map(|r| (r.bytes_read, r.wait_s))
}

/// One timed generation.
struct Run {
    tps: f64,
    ids: Vec<u32>,
    spec: Option<crate::engine::SpecStats>,
    /// Bytes read from storage, when blocks stream.
    read: Option<u64>,
}

/// One greedy generation of at most `n_gen` tokens after `ids` from an empty context.
fn generate(s: &mut Session, ids: &[u32], n_gen: usize) -> Result<Run> {
    s.reset();
    s.set_max_tokens(n_gen);
    let before = reads(s);
    let g = s.generate(ids, |_| true)?;
    Ok(Run {
        tps: g.timings.decode_tps,
        read: reads(s).zip(before).map(|(b, a)| b.0 - a.0),
        ids: g.generated_ids,
        spec: g.speculative,
    })
}

/// Plain and drafted greedy runs of `n_gen` tokens after `d.prompt` on `model`, `reps` of
/// each; `draft` is the loaded draft model of `d` (`None` for prompt lookup).
pub(super) fn measure(
    model: &Model,
    d: &BenchDraft,
    draft: Option<&Model>,
    n_gen: usize,
    reps: usize,
) -> Result<SpecResult> {
    let ids = model.tokenizer().encode(&d.prompt, true, true);
    if ids.is_empty() {
        return Err(Error::InvalidArgument(
            "the drafted runs' prompt has no tokens".into(),
        ));
    }
    let mut s = model.session_with_ctx(ids.len() + n_gen + 1)?;
    let (mut plain_tps, mut draft_tps) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let (mut plain_read, mut draft_read) = (None::<u64>, None::<u64>);
    let (mut plain_tokens, mut draft_tokens) = (0usize, 0usize);
    let mut want = Vec::new();
    for _ in 0..reps {
        let r = generate(&mut s, &ids, n_gen)?;
        plain_tps.push(r.tps);
        plain_tokens += r.ids.len();
        plain_read = r.read.map(|b| b + plain_read.unwrap_or(0));
        want = r.ids;
    }
    let set_drafter = |s: &mut Session| match (&d.source, draft) {
        (DraftSource::Model { .. }, Some(m)) => s.set_draft_model(m, d.params),
        (DraftSource::Lookup, _) => s.set_draft_lookup(2, 4, d.params),
        (DraftSource::Model { path, .. }, None) => Err(Error::InvalidArgument(format!(
            "the draft model {} is not loaded",
            path.display()
        ))),
    };
    set_drafter(&mut s)?;
    generate(&mut s, &ids, n_gen)?;
    let mut stats = crate::engine::SpecStats::default();
    let mut same_ids = true;
    for _ in 0..reps {
        // A new drafter each run: its own cache and pace start empty, as in a first run.
        set_drafter(&mut s)?;
        let r = generate(&mut s, &ids, n_gen)?;
        draft_tps.push(r.tps);
        draft_tokens += r.ids.len();
        draft_read = r.read.map(|b| b + draft_read.unwrap_or(0));
        same_ids &= r.ids == want;
        if let Some(sp) = r.spec {
            stats.passes += sp.passes;
            stats.drafted += sp.drafted;
            stats.accepted += sp.accepted;
        }
    }
    s.clear_draft();
    let (plain_tps, draft_tps) = (Stat::new(plain_tps), Stat::new(draft_tps));
    let per_token =
        |bytes: Option<u64>, tokens: usize| bytes.map(|b| b as f64 / tokens.max(1) as f64);
    Ok(SpecResult {
        drafter: match &d.source {
            DraftSource::Model { path, .. } => format!("model:{}", path.display()),
            DraftSource::Lookup => "lookup".into(),
        },
        draft_max: d.params.max,
        prompt_tokens: ids.len(),
        tokens: want.len(),
        speedup: draft_tps.mean / plain_tps.mean.max(1e-12),
        plain_tps,
        draft_tps,
        passes: stats.passes,
        drafted: stats.drafted,
        accepted: stats.accepted,
        acceptance: stats.acceptance(),
        tokens_per_pass: stats.tokens_per_pass(),
        same_ids,
        draft_planned_bytes: draft.and_then(Model::planned_bytes),
        plain_read_bytes_per_token: per_token(plain_read, plain_tokens),
        draft_read_bytes_per_token: per_token(draft_read, draft_tokens),
    })
}
