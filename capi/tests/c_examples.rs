//! examples/c built with the system C compiler against include/memwall.h and the cdylib, and
//! run on the test model: generate.c's text equals what the Rust API generates with the same
//! settings, and errors.c's error cases (missing, non-GGUF and truncated files, NULL
//! arguments, small buffers, context overflow) come back as codes and messages.

mod common;

use std::process::Command;

use memwall::api::{DeviceChoice, ModelConfig};

#[test]
fn c_generate_matches_the_rust_api() {
    let exe = common::build_c_example("generate");
    let model = common::model_path();
    let prompt = "The three primary colors are";
    let out = Command::new(&exe).arg(&model).arg(prompt).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    // The same settings as generate.c: CPU, context 512, greedy, 32 tokens.
    let m = ModelConfig::new(&model)
        .device(DeviceChoice::Cpu)
        .n_ctx(512)
        .load()
        .unwrap();
    let mut s = m.session().unwrap();
    s.set_max_tokens(32);
    let expected = s.prompt(prompt).unwrap().finish().unwrap();
    assert!(!expected.text.is_empty());
    assert_eq!(stdout, format!("{prompt}{}\n", expected.text));
    let n_prompt = m.tokenize(prompt, true).len();
    assert!(
        stderr.contains(&format!(
            "prompt of {n_prompt} tokens, first id {}",
            expected.prompt_ids[0]
        )),
        "{stderr}"
    );
}

#[test]
fn c_errors_come_back_as_codes_and_text() {
    let exe = common::build_c_example("errors");
    let scratch = std::env::temp_dir().join(format!("memwall-capi-err-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let out = Command::new(&exe)
        .arg(common::model_path())
        .arg(&scratch)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.ends_with("0 failure(s)\n"), "{stdout}");
    // Every case ran and printed its message.
    for case in [
        "missing file: ok",
        "not a GGUF file: ok",
        "truncated model: ok",
        "NULL path: ok",
        "unknown KV cache type: ok",
        "small buffer: ok code=-8 message=",
        "prompt over the context: ok code=-5 message=prompt of",
        "prompt over the context shifts: ok code=1",
        "callback stops: ok code=3",
    ] {
        assert!(stdout.contains(case), "no {case:?} in:\n{stdout}");
    }
}
