//! Tokenizer against llama.cpp: the test model's prompts (`reference/tokenize.jsonl`) and
//! llama.cpp's own tokenizer test vectors (`reference/vocab/ggml-vocab-*.gguf` with `.inp` and
//! `.out`), plus decoding round trips and streaming.

use std::path::PathBuf;

use memwall::gguf::Gguf;
use memwall::tokenizer::{StreamDecoder, Tokenizer};

#[path = "common/shared.rs"]
mod shared_data;
use shared_data::shared;

fn model_path() -> PathBuf {
    match std::env::var_os("MEMWALL_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var("HOME").expect("HOME"))
            .join(".cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

fn model_tokenizer() -> Tokenizer {
    let g = Gguf::open(model_path()).expect("test model missing: set MEMWALL_MODEL");
    Tokenizer::from_gguf(&g).unwrap()
}

fn vocab(name: &str) -> Tokenizer {
    let path = shared().join(format!("reference/vocab/ggml-vocab-{name}.gguf"));
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert!(t.warnings().is_empty(), "{name}: {:?}", t.warnings());
    t
}

/// The test strings of a `.inp` file and the expected ids of the `.out` file, paired.
fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = shared().join(format!("reference/vocab/ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let mut texts: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    // Most files end with a separator, which leaves one empty string after it; gemma-4's ends
    // with its last string.
    if texts.last().is_some_and(String::is_empty) {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree");
    assert!(texts.len() > 40);
    texts.into_iter().zip(ids).collect()
}

/// Every vector of one vocabulary; returns (passed, total) and prints the failures.
fn run_vocab(name: &str) -> (usize, usize) {
    let t = vocab(name);
    let v = vectors(name);
    let mut pass = 0;
    for (text, want) in &v {
        let got = t.encode(text, false, true);
        if &got == want {
            pass += 1;
        } else {
            println!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}");
        }
    }
    println!("{name}: {pass}/{} vectors pass", v.len());
    (pass, v.len())
}

macro_rules! vocab_test {
    ($fn:ident, $name:literal) => {
        #[test]
        fn $fn() {
            let (pass, total) = run_vocab($name);
            assert_eq!(pass, total, "{}: {pass}/{total}", $name);
        }
    };
}

vocab_test!(vocab_llama_spm, "llama-spm");
vocab_test!(vocab_phi_3, "phi-3");
vocab_test!(vocab_gpt_2, "gpt-2");
vocab_test!(vocab_deepseek_coder, "deepseek-coder");
vocab_test!(vocab_starcoder, "starcoder");
vocab_test!(vocab_falcon, "falcon");
vocab_test!(vocab_llama_bpe, "llama-bpe");
vocab_test!(vocab_qwen2, "qwen2");
vocab_test!(vocab_qwen35, "qwen35");
vocab_test!(vocab_command_r, "command-r");
vocab_test!(vocab_mpt, "mpt");
vocab_test!(vocab_refact, "refact");
vocab_test!(vocab_deepseek_llm, "deepseek-llm");
vocab_test!(vocab_gemma_4, "gemma-4");

#[test]
fn model_prompts_match_llama_cpp() {
    let t = model_tokenizer();
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
    let path = shared().join("reference/tokenize.jsonl");
    let lines = std::fs::read_to_string(path).unwrap();
    let mut n = 0;
    for line in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = v["text"].as_str().unwrap();
        let ids = |k: &str| -> Vec<u32> {
            v[k].as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let add_bos = v["add_bos_default"].as_bool().unwrap();
        assert_eq!(t.add_bos(), add_bos);
        assert_eq!(t.encode(text, true, true), ids("ids"), "{text:?}");
        assert_eq!(t.encode(text, false, true), ids("ids_no_bos"), "{text:?}");
        assert_eq!(
            t.encode(text, true, false),
            ids("ids_no_parse_special"),
            "{text:?} without special parsing"
        );
        n += 1;
    }
    assert!(n >= 8);
}

#[test]
fn model_special_tokens() {
    let t = model_tokenizer();
    assert_eq!(t.n_vocab(), 49152);
    let im_start = t.id_of("<|im_start|>").unwrap();
    let im_end = t.id_of("<|im_end|>").unwrap();
    let eot = t.id_of("<|endoftext|>").unwrap();
    assert_eq!(t.bos(), Some(im_start)); // tokenizer.ggml.bos_token_id = 1
    assert_eq!(t.eos(), Some(im_end)); // tokenizer.ggml.eos_token_id = 2
    assert!(t.is_eog(im_end) && t.is_eog(eot));
    assert!(!t.is_eog(im_start));
    assert!(!t.is_eog(t.encode("Hello", false, false)[0]));
    assert_eq!(t.token_text(im_end), "<|im_end|>");
    assert_eq!(t.token_text(u32::MAX), "");
    // Control tokens decode to their text only when special text is wanted.
    assert_eq!(t.decode_token(im_end, true), b"<|im_end|>");
    assert!(t.decode_token(im_end, false).is_empty());
    assert_eq!(t.token_bytes(im_end), b"<|im_end|>");
    assert!(t.decode_token(u32::MAX, true).is_empty());
}

#[test]
fn model_decode_round_trips() {
    let t = model_tokenizer();
    let texts = [
        "Hello! 你好！ Bonjour! 🙂 Numbers: 12345 3.14159",
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "<|im_start|>user\nHi<|im_end|>\n",
        "Ünïcödé — “quotes” and emoji 👩‍👩‍👧",
    ];
    for text in texts {
        let ids = t.encode(text, false, true);
        assert_eq!(t.decode(&ids, true), text);
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_bytes(i)).collect();
        assert_eq!(bytes, text.as_bytes());
    }
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>", false, true);
    assert_eq!(t.decode(&ids, false), "user\nHi");
}

#[test]
fn vocab_decode_round_trips() {
    // llama-spm: SentencePiece adds a leading space that decoding removes again.
    // deepseek-coder: byte-level BPE without the clean-up of spaces.
    for name in ["llama-spm", "deepseek-coder"] {
        let t = vocab(name);
        for (text, _) in vectors(name) {
            let ids = t.encode(&text, false, true);
            assert_eq!(t.decode(&ids, true), text, "{name}");
        }
    }
    // gpt-2 cleans up spaces before punctuation when decoding, as llama.cpp does.
    let t = vocab("gpt-2");
    let ids = t.encode("Hello , world !", false, true);
    assert_eq!(t.decode(&ids, true), "Hello, world!");
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_bytes(i)).collect();
    assert_eq!(bytes, b"Hello , world !");
}

#[test]
fn spm_bos_and_byte_fallback() {
    let t = vocab("llama-spm");
    let ids = t.encode("Hi", true, true);
    assert_eq!(ids[0], t.bos().unwrap());
    assert_eq!(ids.len(), t.encode("Hi", false, true).len() + 1);
    // A character outside the vocabulary falls back to its UTF-8 bytes as <0xNN> tokens.
    let ids = t.encode("𒀀", false, true);
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i)).collect();
    assert_eq!(texts, ["▁", "<0xF0>", "<0x92>", "<0x80>", "<0x80>"]);
    assert_eq!(t.decode(&ids, false), "𒀀");
}

#[test]
fn stream_decoder_holds_split_characters() {
    let t = model_tokenizer();
    let text = "I 🙂 you 👩‍👩‍👧!";
    let ids = t.encode(text, false, false);
    // The test only means something if some emoji is split across tokens.
    let split = ids
        .iter()
        .any(|&i| std::str::from_utf8(&t.token_bytes(i)).is_err());
    assert!(split, "no token here ends inside a character");
    let mut d = StreamDecoder::new(&t, false);
    let mut out = String::new();
    for &id in &ids {
        let piece = d.push(id);
        assert!(!piece.contains('\u{FFFD}'), "partial character emitted");
        out.push_str(&piece);
    }
    out.push_str(&d.flush());
    assert_eq!(out, text);

    // An unfinished character at the end comes out lossily on flush.
    let mut d = StreamDecoder::new(&t, false);
    let partial: Vec<u32> = t
        .encode("🙂", false, false)
        .into_iter()
        .take_while(|&i| std::str::from_utf8(&t.token_bytes(i)).is_err())
        .take(1)
        .collect();
    assert_eq!(partial.len(), 1);
    assert_eq!(d.push(partial[0]), "");
    assert_eq!(d.flush(), "\u{FFFD}");
}

#[test]
fn encoding_the_perplexity_text_is_fast() {
    let t = model_tokenizer();
    let text = std::fs::read_to_string(shared().join("reference/ppl_text.txt")).unwrap();
    let start = std::time::Instant::now();
    let ids = t.encode(&text, false, true);
    let dt = start.elapsed();
    println!("{} bytes -> {} tokens in {dt:?}", text.len(), ids.len());
    assert!(ids.len() > 3000);
    assert_eq!(t.decode(&ids, true), text);
    assert!(dt.as_secs_f64() < 1.0, "took {dt:?}");
}

#[test]
fn gemma4_decodes_spaces_newlines_and_bytes() {
    let t = vocab("gemma-4");
    assert!(t.add_bos());
    for text in [
        "Hello world",
        "  two\n\n\nlines \t tab",
        "𒀀 🦙 ÅÉ 你好",
        "<start> a",
    ] {
        let ids = t.encode(text, false, true);
        assert_eq!(t.decode(&ids, false), text);
    }
    // A run of newlines that is a token is one token.
    let ids = t.encode("a\n\n\nb", false, true);
    assert_eq!(t.token_text(ids[1]), "\n\n\n");
}
