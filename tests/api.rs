//! The embedding API (`memwall::api`): its token stream against a token-by-token greedy
//! recomputation, cancellation from another thread (between tokens and between prompt
//! batches), the callback form, chat, thread-safety bounds, and examples/generate.rs run
//! against the test model.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use memwall::api::{
    CancelHandle, ChatMessage, DeviceChoice, Event, Model, ModelConfig, Session, StopReason,
    TokenStream,
};

fn model() -> Model {
    ModelConfig::new(common::model_path())
        .device(DeviceChoice::Cpu)
        .n_ctx(512)
        .load()
        .unwrap()
}

/// Greedy ids after `prompt`, one eval_argmax per token on a fresh engine session.
fn greedy_reference(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = m.session_with_ctx(512).unwrap();
    let mut id = s.eval_argmax(prompt).unwrap();
    let mut out = vec![id];
    while out.len() < n && !m.tokenizer().is_eog(id) {
        id = s.eval_argmax(&[id]).unwrap();
        out.push(id);
    }
    out
}

const PROMPT: &str = "The three primary colors are";

#[test]
fn thread_safety_bounds() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send_sync::<memwall::engine::Model>();
    send_sync::<CancelHandle>();
    send::<Session>();
    send::<memwall::engine::Session>();
    send::<TokenStream<'static>>();
}

#[test]
fn stream_matches_greedy_recomputation() {
    let m = model();
    let mut s = m.session().unwrap();
    s.set_max_tokens(12);
    let mut ids = Vec::new();
    let mut text = String::new();
    let mut done = None;
    for ev in s.prompt(PROMPT).unwrap() {
        match ev.unwrap() {
            Event::Token { id, text: t } => {
                ids.push(id);
                text.push_str(&t);
            }
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => done = Some(*d),
            Event::Prefill { .. } | Event::Placement(_) | Event::DeviceFallback(_) => {}
        }
    }
    let done = done.expect("no Done event");
    let prompt = m.tokenize(PROMPT, true);
    assert_eq!(done.prompt_ids, prompt);
    assert_eq!(ids, greedy_reference(&m, &prompt, 12));
    assert_eq!(done.generated_ids, ids);
    assert_eq!(done.text, text);
    assert_eq!(text, m.detokenize(&ids));
    assert_eq!(done.stop, StopReason::Limit);
    assert_eq!(done.timings.n_prompt, prompt.len());
    assert_eq!(done.timings.n_decoded, 11);
    assert!(done.device.starts_with("cpu"), "{}", done.device);
    // The context holds the prompt and every generated token but the last (never fed).
    assert_eq!(s.tokens().len(), prompt.len() + 11);

    // The next prompt continues the context (no second BOS).
    let before = s.tokens().len();
    let next = s.prompt(" and").unwrap().finish().unwrap();
    assert_eq!(next.prompt_ids, m.tokenize(" and", false));
    assert!(s.tokens().len() > before);
}

#[test]
fn cancel_from_another_thread_between_tokens() {
    let m = model();
    let mut s = m.session().unwrap();
    s.set_max_tokens(200);
    let handle = s.cancel_handle();
    let mut stream = s.prompt(PROMPT).unwrap();
    let mut n_tokens = 0;
    let mut stop = None;
    for ev in &mut stream {
        match ev.unwrap() {
            Event::Token { .. } => {
                n_tokens += 1;
                if n_tokens == 3 {
                    let h = handle.clone();
                    std::thread::spawn(move || h.cancel()).join().unwrap();
                }
            }
            Event::Done(d) => stop = Some(d.stop),
            _ => {}
        }
    }
    assert_eq!(stop, Some(StopReason::Cancelled));
    assert_eq!(n_tokens, 3);
    // A new prompt clears the flag.
    let next = s.prompt(" and").unwrap().finish().unwrap();
    assert_ne!(next.stop, StopReason::Cancelled);
}

#[test]
fn cancel_between_prompt_batches() {
    let m = model();
    let mut s = m.session().unwrap();
    let handle = s.cancel_handle();
    let long = "one two three four five six seven eight nine ten ".repeat(20);
    let n_prompt = m.tokenize(&long, true).len();
    assert!(
        n_prompt > 130,
        "the prompt must span several batches: {n_prompt}"
    );
    let mut prefill = Vec::new();
    let mut stop = None;
    for ev in s.prompt(&long).unwrap() {
        match ev.unwrap() {
            Event::Prefill { done, total } => {
                assert_eq!(total, n_prompt);
                prefill.push(done);
                handle.cancel();
            }
            Event::Token { .. } => panic!("a token after the cancel"),
            Event::Done(d) => stop = Some(d.stop),
            _ => {}
        }
    }
    assert_eq!(stop, Some(StopReason::Cancelled));
    assert_eq!(prefill, vec![64]);
    assert_eq!(s.tokens().len(), 64);
}

#[test]
fn callback_form_stops_when_asked() {
    let m = model();
    let mut s = m.session().unwrap();
    let mut pieces = Vec::new();
    let done = s
        .prompt_with(PROMPT, |t| {
            pieces.push(t.to_string());
            pieces.len() < 4
        })
        .unwrap();
    assert_eq!(done.stop, StopReason::Cancelled);
    assert_eq!(pieces.len(), 4);
    assert_eq!(pieces.concat(), done.text);
}

#[test]
fn chat_renders_the_template_and_continues() {
    let m = model();
    let mut s = m.session().unwrap();
    s.set_max_tokens(24);
    let user = ChatMessage::new("user", "What is the capital of France?");
    let first = s
        .chat(std::slice::from_ref(&user))
        .unwrap()
        .finish()
        .unwrap();
    let rendered = m.render_chat(std::slice::from_ref(&user)).unwrap();
    let prompt = m.tokenize(&rendered, true);
    assert_eq!(first.prompt_ids, prompt);
    assert_eq!(first.generated_ids, greedy_reference(&m, &prompt, 24));
    // A follow-up evaluates at most the whole conversation, and generates.
    let convo = [
        user,
        ChatMessage::new("assistant", first.text.trim()),
        ChatMessage::new("user", "And of Italy?"),
    ];
    let full = m.tokenize(&m.render_chat(&convo).unwrap(), true);
    let second = s.chat(&convo).unwrap().finish().unwrap();
    assert!(second.prompt_ids.len() <= full.len());
    assert!(full.ends_with(&second.prompt_ids));
    assert!(!second.generated_ids.is_empty());
    assert!(s.chat(&[]).is_err());
}

#[test]
fn errors_are_typed() {
    let bad = ModelConfig::new("/nonexistent/model.gguf").load();
    assert!(matches!(
        bad,
        Err(memwall::Error::Io { .. }) | Err(memwall::Error::Gguf(_))
    ));
    let m = model();
    let mut s = m.session().unwrap();
    assert!(s.prompt("").is_err());
}

/// Whether `artifact` is missing or older than any of `inputs`.
fn stale(artifact: &Path, inputs: &[PathBuf]) -> bool {
    let t = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match t(artifact) {
        None => true,
        Some(a) => inputs.iter().any(|i| t(i).is_some_and(|n| n > a)),
    }
}

/// The example's binary, built by `cargo test` (it builds examples, after the library) or
/// here when missing or older than its source or the library.
fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let bin = profile_dir.join("examples").join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    if stale(&bin, &[src, profile_dir.join("libmemwall.rlib")]) {
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()).unwrap() {
            "debug" => "dev".to_string(),
            p => p.to_string(),
        };
        let st = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "memwall",
                "--example",
                name,
                "--profile",
                &profile,
            ])
            .arg("--target-dir")
            .arg(profile_dir.parent().unwrap())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(st.success(), "cannot build example {name}");
    }
    bin
}

#[test]
fn example_generate_runs() {
    // As the example loads it: device auto, a context of 1024.
    let m = ModelConfig::new(common::model_path())
        .n_ctx(1024)
        .load()
        .unwrap();
    let mut s = m.session().unwrap();
    s.set_max_tokens(48);
    let expected = s.prompt(PROMPT).unwrap().finish().unwrap();
    let out = Command::new(example_binary("generate"))
        .arg(common::model_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("{PROMPT}{}", expected.text)),
        "{stdout:?} vs {:?}",
        expected.text
    );
    assert!(stdout.contains("tokens, stop: "), "{stdout}");
}

#[test]
fn placement_events_follow_the_offload_policy() {
    // On lavapipe the policy moves layers off the all-GPU start (as in tests/placement.rs);
    // the stream reports each change, and the last report is where the stages ended.
    let mut cfg = ModelConfig::new(common::model_path())
        .device(DeviceChoice::Gpu(memwall::gpu::DeviceSelector::Auto))
        .n_ctx(256);
    cfg.options_mut().resample_every = Some(2);
    let m = cfg.load().unwrap();
    let mut s = m.session().unwrap();
    s.set_max_tokens(12);
    let mut seen = vec![m.placement().clone()];
    let mut done = None;
    for ev in s.prompt(PROMPT).unwrap() {
        match ev.unwrap() {
            Event::Placement(p) => {
                assert_ne!(Some(&p), seen.last(), "a placement event without a change");
                seen.push(p);
            }
            Event::Done(d) => done = Some(*d),
            _ => {}
        }
    }
    let done = done.unwrap();
    let report = s.exec().policy_report().unwrap();
    assert!(
        !report.migrations.is_empty(),
        "the policy never moved anything"
    );
    assert!(seen.len() > 1, "no placement event");
    assert_eq!(seen.last(), Some(&done.placement));
    assert_eq!(&done.placement, s.exec().placement());
}

/// The builder's KV cache types reach the session: a q8_0/q4_0 cache is what the engine
/// session reports, and its greedy output is the engine's with the same load options.
#[test]
fn cache_types_reach_the_session() {
    use memwall::api::KvType;
    let cfg = ModelConfig::new(common::model_path())
        .device(DeviceChoice::Cpu)
        .n_ctx(256)
        .cache_types(KvType::Q8_0, KvType::Q4_0);
    let m = cfg.load().unwrap();
    let mut s = m.session().unwrap();
    assert_eq!(s.kv_signature(), "k=q8_0,v=q4_0");
    s.set_max_tokens(6);
    let mut ids = Vec::new();
    for ev in s.prompt(PROMPT).unwrap() {
        if let Event::Token { id, .. } = ev.unwrap() {
            ids.push(id);
        }
    }
    let prompt = m.tokenize(PROMPT, true);
    assert_eq!(ids, greedy_reference(&m, &prompt, ids.len()));
}
