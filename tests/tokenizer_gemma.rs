//! Gemma 3's tokenizer (SentencePiece `llama` model, 262,144 tokens, no space prefix, byte
//! fallback) against llama.cpp: `tests/data/reference/gemma-3-270m/tokenize.jsonl` (prompts,
//! llama.cpp's SPM test strings, the perplexity text) and the prompt ids of its `greedy.jsonl`.
//!
//! The model is found through `MEMWALL_GEMMA3`, else `~/.cache/memwall/gemma-3-270m-q4_k_m.gguf`
//! (`scripts/fetch-models.sh gemma3-270m`); a missing model fails the tests.

use std::path::Path;
use std::time::Instant;

use memwall::gguf::Gguf;
use memwall::tokenizer::Tokenizer;
use serde_json::Value;

mod common;
use common::shared_path;

fn gemma() -> Tokenizer {
    let g = Gguf::open(common::gemma3_path()).expect("Gemma 3 file does not open");
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
    t
}

fn reference(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference/gemma-3-270m")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn gemma_texts_match_llama_cpp() {
    let t = gemma();
    let lines = reference("tokenize.jsonl");
    assert_eq!(
        lines.len(),
        9 + 46 + 1,
        "9 prompts, 46 strings, ppl_text.txt"
    );
    let mut failed = 0;
    for v in &lines {
        let text = v["text"].as_str().unwrap();
        let want = ids(&v["ids"]);
        let got = t.encode(text, false, true);
        if got != want {
            failed += 1;
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            let short: String = text.chars().take(80).collect();
            println!(
                "{short:?} ({} chars): first difference at {at}\n  want {:?}\n  got  {:?}",
                text.chars().count(),
                &want[at..want.len().min(at + 8)],
                &got[at..got.len().min(at + 8)]
            );
        }
    }
    assert_eq!(failed, 0, "{failed} of {} texts differ", lines.len());
}

#[test]
fn gemma_prompt_ids_match_greedy_reference() {
    let t = gemma();
    let lines = reference("greedy.jsonl");
    assert_eq!(lines.len(), 9);
    for v in &lines {
        let prompt = v["prompt"].as_str().unwrap();
        assert_eq!(
            t.encode(prompt, true, true),
            ids(&v["prompt_ids"]),
            "{prompt:?}"
        );
    }
}

#[test]
fn gemma_special_tokens() {
    let t = gemma();
    assert_eq!(t.n_vocab(), 262_144);
    assert!(t.add_bos());
    assert_eq!(t.bos(), t.id_of("<bos>"));
    assert_eq!(t.eos(), t.id_of("<eos>"));
    let eot = t.id_of("<end_of_turn>").unwrap();
    let sot = t.id_of("<start_of_turn>").unwrap();
    assert!(t.is_eog(eot) && t.is_eog(t.eos().unwrap()));
    assert!(!t.is_eog(sot));
    // No space prefix: a text's first word has no leading "▁".
    let ids = t.encode("Hello world", false, false);
    assert_eq!(t.token_text(ids[0]), "Hello");
    assert_eq!(t.decode(&ids, false), "Hello world");
    // "</s>" is not Gemma's EOS, but llama.cpp makes it a control token by its text.
    let s = t.id_of("</s>").unwrap();
    assert_eq!(t.encode("a</s>", false, true), [t.id_of("a").unwrap(), s]);
    // Byte fallback for a character outside the vocabulary round-trips.
    let text = "\u{12000}";
    let ids = t.encode(text, false, true);
    assert_eq!(t.decode(&ids, false), text);
}

#[test]
fn gemma_load_and_encode_are_fast() {
    let path = common::gemma3_path();
    let start = Instant::now();
    let g = Gguf::open(&path).unwrap();
    let open = start.elapsed();
    let start = Instant::now();
    let t = Tokenizer::from_gguf(&g).unwrap();
    let load = start.elapsed();
    let text = std::fs::read_to_string(shared_path("reference/ppl_text.txt")).unwrap();
    let start = Instant::now();
    let ids = t.encode(&text, false, true);
    let encode = start.elapsed();
    println!(
        "GGUF opened in {open:?}; vocabulary of {} tokens loaded in {load:?}; {} bytes -> {} tokens in {encode:?}",
        t.n_vocab(),
        text.len(),
        ids.len()
    );
    assert_eq!(t.decode(&ids, true), text);
    // Generous bounds (a loaded CI machine); the figures above are the measurement.
    assert!(load.as_secs_f64() < 1.0, "loading took {load:?}");
    assert!(encode.as_secs_f64() < 0.5, "encoding took {encode:?}");
}
