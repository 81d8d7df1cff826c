//! The agreement rule of ../shared/reference/README.md, for any device: greedy ids equal over
//! the decisive prefix, probabilities close there, and perplexity within 1% of llama.cpp's.

use std::sync::Arc;

use memwall::engine::Model;
use memwall::sampler::{Sampler, SamplerParams};
use serde_json::Value;

fn top2_gap(step: &[(u32, f64)]) -> f64 {
    step[0].1 - step.get(1).map_or(0.0, |s| s.1)
}

/// Asserts the agreement rule's points 1 and 2 for every prompt of greedy.jsonl.
pub fn check_greedy(m: &Arc<Model>) {
    let text = std::fs::read_to_string(super::shared().join("reference/greedy.jsonl")).unwrap();
    let mut n_lines = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        n_lines += 1;
        let r: Value = serde_json::from_str(line).unwrap();
        let prompt = r["prompt"].as_str().unwrap();
        let want_prompt: Vec<u32> = serde_json::from_value(r["prompt_ids"].clone()).unwrap();
        let ids = m.tokenizer().encode(prompt, true, true);
        assert_eq!(ids, want_prompt, "prompt tokens of {prompt:?}");
        let ref_ids: Vec<u32> = serde_json::from_value(r["ids"].clone()).unwrap();
        let ref_steps: Vec<Vec<(u32, f64)>> = r["top5_per_step"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["top5"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        (
                            t["id"].as_u64().unwrap() as u32,
                            t["prob"].as_f64().unwrap(),
                        )
                    })
                    .collect()
            })
            .collect();

        let mut session = m.session(512).unwrap();
        let mut sampler = Sampler::new(SamplerParams::greedy()).unwrap();
        let g = session
            .generate(&ids, ref_ids.len(), &mut sampler, 5, |_| true)
            .unwrap();

        // Decisive prefix: every step before the first near tie in either run.
        let mut decisive = 0;
        while decisive < ref_ids.len()
            && decisive < g.generated_ids.len()
            && top2_gap(&ref_steps[decisive]) >= 0.05
            && top2_gap(&g.top_probs[decisive]) >= 0.05
        {
            decisive += 1;
        }
        assert_eq!(
            g.generated_ids[..decisive],
            ref_ids[..decisive],
            "{prompt:?}: ids differ within the decisive prefix of {decisive}"
        );
        let mut sum_diff = 0.0;
        for (s, (ours, theirs)) in g
            .top_probs
            .iter()
            .zip(&ref_steps)
            .take(decisive)
            .enumerate()
        {
            let (ours, theirs) = (ours[0].1, theirs[0].1);
            let d = (ours - theirs).abs();
            assert!(
                d <= 0.15,
                "{prompt:?} step {s}: p {ours:.4} vs llama.cpp {theirs:.4}"
            );
            sum_diff += d;
        }
        let mean = if decisive > 0 {
            sum_diff / decisive as f64
        } else {
            0.0
        };
        assert!(
            mean <= 0.04,
            "{prompt:?}: mean probability difference {mean:.4}"
        );
        eprintln!(
            "{prompt:?}: decisive prefix {decisive}/{}, identical ids over {} steps, mean |dp| {mean:.4}",
            ref_ids.len(),
            g.generated_ids.iter().zip(&ref_ids).take_while(|(a, b)| a == b).count()
        );
    }
    assert_eq!(n_lines, 8, "greedy.jsonl should have 8 prompts");
}

/// Asserts the agreement rule's point 3: perplexity within 1% of llama.cpp's; returns it.
pub fn check_perplexity(m: &Arc<Model>) -> f64 {
    const LLAMA_CPP_PPL: f64 = 17.0046; // ../shared/reference/README.md, -c 256
    let text = std::fs::read_to_string(super::shared().join("reference/ppl_text.txt")).unwrap();
    let ids = m.tokenizer().encode(&text, true, false);
    let r = memwall::engine::perplexity(m, &ids, 256, |_, _| {}).unwrap();
    eprintln!(
        "PPL = {:.4} over {} chunks (llama.cpp {LLAMA_CPP_PPL})",
        r.ppl, r.n_chunks
    );
    assert_eq!(r.n_chunks, 15);
    let rel = (r.ppl - LLAMA_CPP_PPL).abs() / LLAMA_CPP_PPL;
    assert!(
        rel <= 0.01,
        "PPL {:.4} is {:.2}% from llama.cpp's",
        r.ppl,
        rel * 100.0
    );
    r.ppl
}
