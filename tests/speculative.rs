//! Speculative decoding (`crate::engine::speculative`): with a draft model (the test model
//! requantized to Q4_0) or prompt lookup, greedy ids equal plain greedy decoding's on the CPU
//! and on the GPU (lavapipe in CI; no adapter is a failure), also through context shifts; the
//! session's cache afterwards holds what plain decoding leaves; sampled tokens follow plain
//! sampling's distribution over many seeds; a draft of another vocabulary is refused.

mod common;

use std::path::PathBuf;

use common::kv::{load_options, random_ids, synth_model};
use memwall::api::DraftParams;
use memwall::api::{self, Finished};
use memwall::sampler::SamplerParams;
use memwall::GgmlType;

/// The test model requantized to Q4_0 (once per process): a draft of the same vocabulary.
fn q4_0_draft() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("speculative-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("draft-q4_0-{}.gguf", std::process::id()));
    common::kv::write_once(&path, |tmp| {
        memwall::tools::bench::requant::requantize(&common::model_path(), tmp, GgmlType::Q4_0)
            .unwrap();
    });
    path
}

fn api_model(path: &std::path::Path, gpu: bool, n_ctx: usize) -> api::Model {
    let opts = memwall::engine::LoadOptions {
        n_ctx,
        ..load_options(gpu, false)
    };
    api::ModelConfig::with_options(path, opts)
        .load()
        .unwrap_or_else(|e| panic!("cannot load {path:?} (gpu={gpu}): {e}"))
}

/// Runs one prompt to the end.
fn finish(s: &mut api::Session, ids: &[u32]) -> Finished {
    s.prompt_tokens(ids).unwrap().finish().unwrap()
}

const CODE: &str = "fn fib(n: u64) -> u64 {\n    if n < 2 {\n        return n;\n    }\n    \
                    fib(n - 1) + fib(n - 2)\n}\n\nfn fib_memo(n: u64, memo: &mut Vec<u64>) -> u64 {\n";

/// Greedy ids with each drafter equal plain greedy ids, and the cache holds the same tokens.
fn greedy_matches_plain(gpu: bool) {
    let target = api_model(&common::model_path(), gpu, 512);
    assert_eq!(target.gpu().is_some(), gpu);
    let draft = api_model(&q4_0_draft(), false, 512);
    let ids = target.tokenize(CODE, true);
    for lookup in [false, true] {
        let mut plain = target.session().unwrap();
        plain.set_max_tokens(80);
        let want = finish(&mut plain, &ids);
        assert!(want.speculative.is_none());
        let mut s = target.session().unwrap();
        s.set_max_tokens(80);
        // On the GPU, passes stay within its exact batch (4 tokens) whatever the maximum.
        let params = DraftParams {
            max: 6,
            min: 1,
            p_min: 0.5,
        };
        if lookup {
            s.set_draft_lookup(2, 4, params).unwrap();
        } else {
            s.set_draft_model(&draft, params).unwrap();
        }
        let got = finish(&mut s, &ids);
        let sp = got.speculative.unwrap();
        eprintln!("gpu={gpu} lookup={lookup}: {sp:?}");
        assert_eq!(
            got.generated_ids, want.generated_ids,
            "gpu={gpu} lookup={lookup}"
        );
        assert!(sp.passes > 0 && sp.accepted > 0, "{sp:?}");
        assert!(sp.accepted <= sp.drafted);
        assert_eq!(s.tokens(), plain.tokens(), "the cache after the generation");
        // The next prompt continues the same context either way.
        let more = target.tokenize("\n// tests\n", false);
        let (a, b) = (finish(&mut s, &more), finish(&mut plain, &more));
        assert_eq!(a.generated_ids, b.generated_ids);
    }
}

#[test]
fn greedy_with_drafts_equals_plain_greedy_on_the_cpu() {
    greedy_matches_plain(false);
}

#[test]
fn greedy_with_drafts_equals_plain_greedy_on_the_gpu() {
    greedy_matches_plain(true);
}

/// A generation far past a small context: the shifts fall on the same tokens with and
/// without drafts.
#[test]
fn greedy_with_drafts_through_context_shifts() {
    let target = api_model(&common::model_path(), false, 96);
    let ids = target.tokenize(CODE, true);
    let mut plain = target.session().unwrap();
    plain.set_max_tokens(200);
    let want = finish(&mut plain, &ids);
    let mut s = target.session().unwrap();
    s.set_max_tokens(200);
    s.set_draft_lookup(1, 3, DraftParams::default()).unwrap();
    let got = finish(&mut s, &ids);
    assert_eq!(got.generated_ids, want.generated_ids);
    assert!(s.shift_stats().shifts > 1);
    assert_eq!(s.shift_stats(), plain.shift_stats());
}

/// Sampled with top-k 4 at temperature 20 from a tiny random model, with a draft model of
/// other weights (its q differs from the model's p, so rejections draw from the residual):
/// for the tokens after the first, each token's frequency over the seeds is within 5 standard
/// deviations (of a difference of two proportions) of plain sampling's.
#[test]
fn sampled_tokens_follow_plain_sampling() {
    let target = api_model(&synth_model(1, 31), false, 64);
    let draft = api_model(&synth_model(1, 32), false, 64);
    let n_vocab = target.config().n_vocab;
    let prompt = random_ids(6, n_vocab, 3);
    let (runs, n_new) = (4000usize, 4usize);
    // The random model's logits span tens of units: a high temperature spreads its top 4.
    let sampling = |seed| SamplerParams {
        temperature: 20.0,
        top_k: 4,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        seed,
    };
    // counts[position][token]
    let count = |spec: bool| {
        let mut counts = vec![std::collections::HashMap::<u32, usize>::new(); n_new];
        let mut s = target.session().unwrap();
        s.set_max_tokens(n_new);
        for seed in 0..runs as u64 {
            s.reset();
            s.set_sampler(sampling(seed * 7919 + u64::from(spec)))
                .unwrap();
            if spec {
                let p = DraftParams {
                    max: 3,
                    min: 1,
                    p_min: 0.0,
                };
                s.set_draft_model(&draft, p).unwrap();
            }
            let g = finish(&mut s, &prompt);
            assert_eq!(g.generated_ids.len(), n_new);
            if spec {
                let sp = g.speculative.unwrap();
                assert!(sp.passes > 0);
            }
            for (i, &id) in g.generated_ids.iter().enumerate() {
                *counts[i].entry(id).or_default() += 1;
            }
        }
        counts
    };
    let (plain, spec) = (count(false), count(true));
    let mut worst = 0f64;
    for pos in 1..n_new {
        // A test of distributions needs several likely tokens at each position.
        let likely = plain[pos].values().filter(|&&c| c * 20 > runs).count();
        assert!(likely >= 2, "position {pos}: {:?}", plain[pos]);
        let tokens: std::collections::HashSet<u32> =
            plain[pos].keys().chain(spec[pos].keys()).copied().collect();
        for t in tokens {
            let a = *plain[pos].get(&t).unwrap_or(&0) as f64 / runs as f64;
            let b = *spec[pos].get(&t).unwrap_or(&0) as f64 / runs as f64;
            let p = (a + b) / 2.0;
            let sd = (2.0 * p * (1.0 - p) / runs as f64).sqrt().max(1e-9);
            worst = worst.max((a - b).abs() / sd);
            assert!(
                (a - b).abs() <= 5.0 * sd,
                "position {pos} token {t}: plain {a:.4}, speculative {b:.4} (sd {sd:.4})"
            );
        }
    }
    eprintln!("largest difference: {worst:.2} standard deviations");
}

#[test]
fn a_draft_of_another_vocabulary_is_refused() {
    let target = api_model(&common::model_path(), false, 128);
    let other = api_model(&synth_model(1, 31), false, 128);
    let mut s = target.session().unwrap();
    let e = s
        .set_draft_model(&other, DraftParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("vocabulary"), "{e}");
    let e = s
        .set_draft_lookup(3, 2, DraftParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("n-grams"), "{e}");
}
