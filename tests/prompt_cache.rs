//! Prefix reuse and prompt cache files (`crate::engine::prompt_cache`): a restored prefix gives the
//! same output as evaluating the prompt (also on sliding-window and LongRoPE models); files from another model, with other KV types,
//! truncated, corrupt, or with trailing bytes are refused with typed errors (never a panic)
//! and leave the session untouched; a failed save keeps the existing file.

mod common;

use std::path::PathBuf;

use common::kv::{greedy, load, random_ids, synth_model, synth_model_arch, GEMMA3_WINDOW};
use memwall::api::{PromptCache, PromptCacheError};
use memwall::engine::Session;
use memwall::model::Logits;
use memwall::Error;

fn temp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prompt-cache-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}.bin", std::process::id()))
}

/// The cache refusal `r` carries, panicking on success or another error.
fn refusal(r: memwall::Result<PromptCache>) -> PromptCacheError {
    match r {
        Err(Error::PromptCache { kind, .. }) => kind,
        Err(e) => panic!("expected a prompt cache refusal, got {e}"),
        Ok(_) => panic!("a bad prompt cache was accepted"),
    }
}

/// A session of `model` holding `tokens`, and its cache image.
fn image_of(s: &mut Session, tokens: &[u32]) -> Vec<u8> {
    s.reset();
    s.eval(tokens, Logits::None).unwrap();
    s.prompt_cache_image().unwrap()
}

/// A restored prefix (file) and a reused prefix (same session) give the greedy ids of
/// evaluating the whole prompt, on the real model.
#[test]
fn restored_and_reused_prefixes_give_identical_output() {
    let model = load(&common::model_path(), false, false);
    let text = "You are a helpful assistant who answers in one sentence. ".repeat(6);
    let prompt = model.tokenizer().encode(&text, true, false);
    let n = prompt.len();
    let mut s = model.session_with_ctx(512).unwrap();
    let want = greedy(&mut s, &prompt, 24).generated_ids;

    // Save the prompt but its last token, restore it in a new session, generate.
    let path = temp("real");
    let mut a = model.session_with_ctx(512).unwrap();
    a.eval(&prompt[..n - 1], Logits::None).unwrap();
    let bytes = a.save_prompt_cache(&path).unwrap();
    assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
    let mut b = model.session_with_ctx(512).unwrap();
    let cache = PromptCache::load(&path, &b).unwrap();
    assert_eq!(cache.tokens(), &prompt[..n - 1]);
    let r = b.restore_prefix(&cache, &prompt).unwrap();
    assert_eq!(r, n - 1);
    assert_eq!(greedy(&mut b, &prompt[r..], 24).generated_ids, want);

    // A prompt that shares only part of the cached one restores that part.
    let mut other = prompt[..n / 2].to_vec();
    other.extend(model.tokenizer().encode(" Be brief.", false, false));
    let mut c = model.session_with_ctx(512).unwrap();
    assert_eq!(c.restore_prefix(&cache, &other).unwrap(), n / 2);

    // Within a session: the common prefix is kept, one token left to evaluate.
    let mut d = model.session_with_ctx(512).unwrap();
    d.eval(&other, Logits::None).unwrap();
    let r = d.reuse_prefix(&prompt);
    assert_eq!(r, n / 2);
    assert_eq!(greedy(&mut d, &prompt[r..], 24).generated_ids, want);
    d.eval(&[prompt[0]], Logits::None).unwrap();
    let full: Vec<u32> = d.tokens().to_vec();
    assert_eq!(d.reuse_prefix(&full), full.len() - 1);
}

/// On gemma3 (sliding-window blocks, a window much shorter than the prompt) and phi3 (LongRoPE,
/// partial rotary, fused tensors), on the CPU and the GPU: a prefix restored from a file and
/// one reused in its session give the greedy ids of evaluating the whole prompt.
#[test]
fn restored_prefixes_on_sliding_window_and_longrope_models() {
    for (arch, n_layer) in [("gemma3", 6), ("phi3", 2)] {
        let path = synth_model_arch(n_layer, 21, arch);
        for gpu in [false, true] {
            let model = load(&path, gpu, false);
            let n_vocab = model.config().n_vocab;
            let prompt = random_ids(40, n_vocab, 3);
            assert!(prompt.len() > 6 * GEMMA3_WINDOW as usize);
            let mut s = model.session_with_ctx(96).unwrap();
            let want = greedy(&mut s, &prompt, 12).generated_ids;
            let file = temp(&format!("{arch}-{gpu}"));
            let mut a = model.session_with_ctx(96).unwrap();
            a.eval(&prompt[..31], Logits::None).unwrap();
            a.save_prompt_cache(&file).unwrap();
            let mut b = model.session_with_ctx(96).unwrap();
            let cache = PromptCache::load(&file, &b).unwrap();
            let r = b.restore_prefix(&cache, &prompt).unwrap();
            assert_eq!(r, 31);
            let got = greedy(&mut b, &prompt[r..], 12).generated_ids;
            assert_eq!(got, want, "{arch} gpu={gpu}: restored prefix");
            let mut c = model.session_with_ctx(96).unwrap();
            c.eval(&prompt[..17], Logits::None).unwrap();
            c.eval(&random_ids(9, n_vocab, 4), Logits::None).unwrap();
            let r = c.reuse_prefix(&prompt);
            assert_eq!(r, 17);
            let got = greedy(&mut c, &prompt[r..], 12).generated_ids;
            assert_eq!(got, want, "{arch} gpu={gpu}: reused prefix");
            std::fs::remove_file(&file).ok();
        }
    }
}

/// Files made for another model (same shape, other weights; another shape) are refused.
#[test]
fn a_cache_from_another_model_is_refused() {
    let m1 = load(&synth_model(2, 21), false, false);
    let m2 = load(&synth_model(2, 22), false, false);
    let m3 = load(&synth_model(3, 21), false, false);
    let ids = random_ids(12, m1.config().n_vocab, 1);
    let mut s1 = m1.session_with_ctx(64).unwrap();
    let path = temp("m1");
    std::fs::write(&path, image_of(&mut s1, &ids)).unwrap();
    assert!(PromptCache::load(&path, &s1).is_ok());
    for m in [&m2, &m3] {
        let s = m.session_with_ctx(64).unwrap();
        match refusal(PromptCache::load(&path, &s)) {
            PromptCacheError::OtherModel { file, model } => assert_ne!(file, model),
            e => panic!("expected another-model refusal, got {e}"),
        }
    }
    let real = load(&common::model_path(), false, false);
    let s = real.session_with_ctx(64).unwrap();
    let e = refusal(PromptCache::load(&path, &s));
    assert!(matches!(e, PromptCacheError::OtherModel { .. }), "{e}");
    assert!(e.to_string().contains("another model"), "{e}");
}

/// A file whose KV signature differs (re-checksummed, so only the types differ) is refused,
/// naming both.
#[test]
fn a_cache_with_other_kv_types_is_refused() {
    let m = load(&synth_model(2, 23), false, false);
    let mut s = m.session_with_ctx(64).unwrap();
    let ids = random_ids(10, m.config().n_vocab, 2);
    let mut img = image_of(&mut s, &ids);
    let sig = s.kv_signature();
    let at = img
        .windows(sig.len())
        .position(|w| w == sig.as_bytes())
        .unwrap();
    let other = if sig == "k=q8_0,v=q8_0" {
        "k=f32,v=f32"
    } else {
        "k=q8_0,v=q8_0"
    };
    // Same length or not, rebuild the image with the other signature and a fresh checksum.
    let mut out = img[..at - 4].to_vec();
    out.extend_from_slice(&(other.len() as u32).to_le_bytes());
    out.extend_from_slice(other.as_bytes());
    out.extend_from_slice(&img[at + sig.len()..img.len() - 8]);
    out.extend_from_slice(&PromptCache::checksum(&out).to_le_bytes());
    img = out;
    let path = temp("sig");
    std::fs::write(&path, &img).unwrap();
    match refusal(PromptCache::load(&path, &s)) {
        PromptCacheError::KvTypes { file, session } => {
            assert_eq!(file, other);
            assert_eq!(session, sig);
        }
        e => panic!("expected a KV type refusal, got {e}"),
    }
}

/// Truncations, flipped bytes and trailing bytes are typed refusals; none panics, and the
/// session is left as it was.
#[test]
fn truncated_or_corrupt_caches_are_refused() {
    let m = load(&synth_model(2, 24), false, false);
    let mut s = m.session_with_ctx(64).unwrap();
    let ids = random_ids(9, m.config().n_vocab, 3);
    let img = image_of(&mut s, &ids);
    let held = s.tokens().to_vec();
    let path = temp("bad");
    let len = img.len();
    for cut in [0, 5, 8, 11, 20, 30, 40, len / 2, len - 9, len - 1] {
        std::fs::write(&path, &img[..cut]).unwrap();
        match refusal(PromptCache::load(&path, &s)) {
            PromptCacheError::Truncated { at, .. } => assert_eq!(at, cut as u64),
            e => panic!("cut at {cut}: expected a truncation, got {e}"),
        }
    }
    for at in [0, 9, 13, 25, 33, 45, 60, len / 2, len - 20, len - 1] {
        let mut bad = img.clone();
        bad[at] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let e = refusal(PromptCache::load(&path, &s));
        // Past the header (magic, version, fingerprint, shape, signature, token count), any
        // change is caught by the checksum; in it, by the field it breaks or the checksum.
        if at >= 36 + s.kv_signature().len() {
            assert!(matches!(e, PromptCacheError::Checksum { .. }), "{at}: {e}");
        }
        assert!(!e.to_string().is_empty());
    }
    let mut long = img.clone();
    long.extend_from_slice(&[0; 3]);
    std::fs::write(&path, &long).unwrap();
    let e = refusal(PromptCache::load(&path, &s));
    assert!(
        matches!(e, PromptCacheError::TrailingBytes { extra: 3 }),
        "{e}"
    );
    std::fs::write(&path, b"GGUF and something else entirely").unwrap();
    let e = refusal(PromptCache::load(&path, &s));
    assert!(matches!(e, PromptCacheError::BadMagic { .. }), "{e}");
    assert_eq!(s.tokens(), &held[..]);
    let missing = refusal_io(PromptCache::load(temp("missing-file"), &s));
    assert!(missing.contains("missing-file"), "{missing}");
}

fn refusal_io(r: memwall::Result<PromptCache>) -> String {
    match r {
        Err(e @ Error::Io { .. }) => e.to_string(),
        Err(e) => panic!("expected an I/O error, got {e}"),
        Ok(_) => panic!("a missing file was accepted"),
    }
}

/// A save that cannot complete leaves the existing file as it was.
#[test]
fn a_failed_save_keeps_the_existing_file() {
    let m = load(&synth_model(2, 25), false, false);
    let mut s = m.session_with_ctx(64).unwrap();
    let path = temp("keep");
    std::fs::write(&path, b"the user's file").unwrap();
    // The temporary file's name taken by a directory: the write fails before any rename.
    let mut tmp = path.file_name().unwrap().to_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    s.eval(&random_ids(5, m.config().n_vocab, 4), Logits::None)
        .unwrap();
    assert!(s.save_prompt_cache(&path).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"the user's file");
    std::fs::remove_dir(&tmp).unwrap();
    s.save_prompt_cache(&path).unwrap();
    assert!(PromptCache::load(&path, &s).is_ok());
}

/// `memwall run --prompt-cache`: the second run restores the prompt and prints the same ids;
/// a corrupt file is a clear error.
#[test]
fn cli_prompt_cache_reuses_the_prompt_and_refuses_a_corrupt_file() {
    let m = common::model_path();
    let path = temp("cli");
    let _ = std::fs::remove_file(&path);
    let prompt = "You are a careful assistant. ".repeat(8);
    let run = || {
        let mut a: Vec<std::ffi::OsString> = vec!["run".into(), "-m".into(), m.clone().into()];
        for x in [
            "--device", "cpu", "-n", "8", "--temp", "0", "--json", "-p", &prompt,
        ] {
            a.push(x.into());
        }
        a.push("--prompt-cache".into());
        a.push(path.clone().into());
        let refs: Vec<&std::ffi::OsStr> = a.iter().map(|x| x.as_os_str()).collect();
        common::run_memwall(&refs)
    };
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text.lines().last().unwrap()).unwrap()
    };
    let (code, first) = run();
    assert_eq!(code, Some(0), "{first}");
    let (code, second) = run();
    assert_eq!(code, Some(0), "{second}");
    let (a, b) = (json(&first), json(&second));
    assert_eq!(a["generated_ids"], b["generated_ids"]);
    assert_eq!(a["prompt_cache"]["restored_tokens"], 0);
    let n = a["prompt_ids"].as_array().unwrap().len() as u64;
    assert_eq!(b["prompt_cache"]["restored_tokens"], n - 1);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (code, text) = run();
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("checksum mismatch"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
}
