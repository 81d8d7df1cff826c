//! The `memwall` binary as a user meets it: --help for every command, `run --json` output
//! shape, `tokenize`, errors that name the problem and exit non-zero without a panic.

mod common;

use std::process::{Command, Output};

fn memwall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .output()
        .expect("memwall binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_command_has_help() {
    for cmd in ["run", "tokenize", "perplexity", "inspect", "check"] {
        let o = memwall(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help failed: {}", stderr(&o));
        assert!(
            stdout(&o).contains("Usage: memwall"),
            "{cmd} --help: {}",
            stdout(&o)
        );
    }
    let o = memwall(&["--help"]);
    for cmd in ["run", "tokenize", "perplexity", "inspect", "check"] {
        assert!(stdout(&o).contains(cmd), "top-level help lacks {cmd}");
    }
}

#[test]
fn run_json_reports_ids_text_timings_and_probs() {
    let model = common::model_path();
    let o = memwall(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--n-probs",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let last = out.lines().last().expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        v["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    let gen = v["generated_ids"].as_array().unwrap();
    assert_eq!(gen.len(), 8);
    // llama.cpp's greedy continuation starts with " Paris." (../shared/reference/greedy.jsonl).
    assert_eq!(gen[0], 7042);
    assert!(v["text"].as_str().unwrap().starts_with(" Paris"));
    for k in ["load_ms", "ttft_ms", "prefill_tps", "decode_tps"] {
        let t = v["timings"][k].as_f64().unwrap_or(-1.0);
        assert!(t > 0.0, "timing {k} = {t}");
    }
    let probs = v["top_probs"].as_array().unwrap();
    assert_eq!(probs.len(), 8);
    for (step, id) in probs.iter().zip(gen) {
        let step = step.as_array().unwrap();
        assert_eq!(step.len(), 3);
        // Greedy: the chosen token is the most likely one, and probabilities are sorted.
        assert_eq!(&step[0]["id"], id);
        let p: Vec<f64> = step.iter().map(|t| t["prob"].as_f64().unwrap()).collect();
        assert!(
            p.windows(2).all(|w| w[0] >= w[1]) && p[0] <= 1.0 && p[2] > 0.0,
            "{p:?}"
        );
    }
}

#[test]
fn run_streams_text_and_prints_timings() {
    let model = common::model_path();
    let o = memwall(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with(" Paris"), "{}", stdout(&o));
    let err = stderr(&o);
    for k in ["load", "first token", "prefill", "decode"] {
        assert!(err.contains(k), "timings line lacks {k}: {err}");
    }
}

#[test]
fn chat_uses_the_models_template() {
    let model = common::model_path();
    let o = memwall(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hi",
        "-n",
        "2",
        "--temp",
        "0",
        "--chat",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    // <|im_start|> = 1, <|im_end|> = 2 in this vocabulary: the template's markers are parsed
    // as special tokens, and the prompt ends with the assistant's turn opening.
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&t| t == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&t| t == 2).count(), 2);
}

#[test]
fn tokenize_prints_a_json_array() {
    let model = common::model_path();
    let o = memwall(&[
        "tokenize",
        "-m",
        model.to_str().unwrap(),
        "The capital of France is",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[504,3575,282,4649,314]");
}

/// Without context shifts (`--ctx-overflow stop`; the default shifts, `tests/ctx_shift.rs`).
#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let model = common::model_path();
    let long = "word ".repeat(100);
    let o = memwall(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        &long,
        "-c",
        "16",
        "-n",
        "4",
        "--ctx-overflow",
        "stop",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("does not fit the context of 16"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_and_non_gguf_files_are_clear_errors() {
    let o = memwall(&["run", "-m", "/nonexistent/model.gguf", "-p", "x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("/nonexistent/model.gguf"),
        "{}",
        stderr(&o)
    );
    let dir = std::env::temp_dir().join(format!("memwall-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("bogus.gguf");
    std::fs::write(&bogus, b"this is not a gguf file at all").unwrap();
    let o = memwall(&["run", "-m", bogus.to_str().unwrap(), "-p", "x"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a GGUF file"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn tokenize_reproduces_every_reference_line() {
    let model = common::model_path();
    let lines = std::fs::read_to_string(common::shared().join("reference/tokenize.jsonl")).unwrap();
    let mut n = 0;
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = r["text"].as_str().unwrap();
        for (flag, key) in [
            (None, "ids"),
            (Some("--no-parse-special"), "ids_no_parse_special"),
        ] {
            let mut args = vec!["tokenize", "-m", model.to_str().unwrap()];
            args.extend(flag);
            args.push(text);
            let o = memwall(&args);
            assert!(o.status.success(), "{}", stderr(&o));
            let got: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
            assert_eq!(got, r[key], "{key} of {text:?}");
        }
        n += 1;
    }
    assert_eq!(n, 8);
}

#[test]
fn perplexity_json_reports_ppl_and_chunks() {
    let model = common::model_path();
    let text = std::fs::read_to_string(common::shared().join("reference/ppl_text.txt")).unwrap();
    let dir = std::env::temp_dir().join(format!("memwall-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("short.txt");
    std::fs::write(&f, &text[..3000]).unwrap();
    let o = memwall(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let ppl = v["ppl"].as_f64().unwrap();
    let n_chunks = v["n_chunks"].as_u64().unwrap();
    // About 650 tokens in 3000 characters of English: 10 windows of 64.
    assert!((8..=12).contains(&n_chunks), "{n_chunks} chunks");
    // A working 135M model on plain English prose, with only 32 tokens of context per
    // prediction: well above 1 and far below the vocabulary size (a broken model gives
    // thousands).
    assert!(ppl > 2.0 && ppl < 100.0, "ppl {ppl}");
    let o = memwall(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "100000",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("fewer than one window"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tokenize_works_on_a_vocabulary_only_file() {
    // llama.cpp's own vocabulary test file (no tensors) and its first expected line.
    let vocab = common::shared().join("reference/vocab/ggml-vocab-gpt-2.gguf");
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
    let first_text = inp.split("\n__ggml_vocab_test__\n").next().unwrap();
    let want: Vec<u32> = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let o = memwall(&["tokenize", "-m", vocab.to_str().unwrap(), first_text]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Vec<u32> = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(got, want, "{first_text:?}");
}

#[test]
fn absurd_context_sizes_are_errors_not_aborts() {
    let model = common::model_path();
    for (ctx, needle) in [("9223372036854775807", "too large"), ("0", "")] {
        let o = memwall(&[
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Hi",
            "-c",
            ctx,
            "-n",
            "2",
        ]);
        if ctx == "0" {
            // 0 means the model's own context: a normal run.
            assert!(o.status.success(), "{}", stderr(&o));
            continue;
        }
        assert!(!o.status.success());
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}
