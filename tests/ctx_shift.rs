//! Context shift (`crate::engine::ctx_shift`): the moved keys equal RoPE recomputed at their new
//! positions (CPU and GPU caches); on a one-block model, whose cache depends on each token
//! alone, decoding after a shift equals evaluating the kept tokens from scratch; a long greedy
//! generation in a small context never fails and keeps its KV memory flat; CPU and GPU pick the
//! same ids through several shifts; `stop` refuses what does not fit.
//!
//! GPU cases run on the adapter `gpu` picks (lavapipe in CI); no adapter is a failure.

mod common;

use common::kv::{
    greedy, load, max_abs_diff, random_ids, synth_model, synth_model_arch, GEMMA3_WINDOW,
    PHI3_ORIG_CTX,
};
use memwall::api::CtxOverflow;
use memwall::backend::KvShift;
use memwall::config::RopeKind;
use memwall::engine::StopReason;
use memwall::model::Logits;
use memwall::Error;

/// Fills every layer's cache with keys RoPE-rotated at positions 0..n_pos, shifts, and holds
/// the result to keys rotated from scratch at the new positions (values moved unchanged).
fn shift_matches_rope_at_new_positions(gpu: bool) {
    // gemma3's blocks 0 and 5 are local and global: each re-rotates with its own base.
    for path in [
        synth_model(2, 11),
        synth_model_arch(2, 11, "qwen2"),
        synth_model_arch(6, 11, "gemma3"),
        synth_model_arch(2, 11, "phi3"),
    ] {
        shift_matches_rope_on(&path, gpu);
    }
}

fn shift_matches_rope_on(path: &std::path::Path, gpu: bool) {
    let model = load(path, gpu, false);
    let cfg = model.config().clone();
    let mut s = model.session_with_ctx(64).unwrap();
    let (n_pos, keep, discard) = (40, 3, 11);
    let kv_dim = cfg.kv_dim();
    // Block l's RoPE (its own base in a sliding-window block; phi3's LongRoPE factors for
    // this context and its attention factor).
    let rope = |l: usize, x: &mut [f32], n: usize, pos0: usize| {
        let r = cfg.rotation(l, 64);
        memwall::cpu::rope_tokens(x, n, cfg.n_head_kv, cfg.head_dim, pos0, &r).unwrap()
    };
    let unit = |seed: u64, n: usize| -> Vec<f32> {
        random_ids(n, 1 << 20, seed)
            .iter()
            .map(|&r| r as f32 / (1 << 19) as f32 - 1.0)
            .collect()
    };
    // Per layer: base keys (before RoPE) and values, [n_pos, kv_dim].
    let mut bases = Vec::new();
    for l in 0..cfg.n_layer {
        let base = unit(100 + l as u64, n_pos * kv_dim);
        let v = unit(200 + l as u64, n_pos * kv_dim);
        let mut k = base.clone();
        rope(l, &mut k, n_pos, 0);
        s.exec_mut().write_layer_kv(l, &k, &v).unwrap();
        bases.push((base, k, v));
    }
    s.exec_mut()
        .shift_kv(KvShift {
            keep,
            discard,
            n_pos,
        })
        .unwrap();
    let n_new = n_pos - discard;
    let f32_cache = s.kv_signature() == "k=f32,v=f32";
    // Quantized caches round each value on the way in; f32 ones only the rotation does.
    let tol = if f32_cache { 1e-4 } else { 0.1 };
    for (l, (base, k_in, v_in)) in bases.iter().enumerate() {
        let mut k = vec![0f32; n_new * kv_dim];
        let mut v = vec![0f32; n_new * kv_dim];
        s.exec_mut()
            .read_layer_kv(l, n_new, &mut k, &mut v)
            .unwrap();
        let mut want_k = k_in[..keep * kv_dim].to_vec();
        let mut moved = base[(keep + discard) * kv_dim..].to_vec();
        rope(l, &mut moved, n_new - keep, keep);
        want_k.extend_from_slice(&moved);
        let mut want_v = v_in[..keep * kv_dim].to_vec();
        want_v.extend_from_slice(&v_in[(keep + discard) * kv_dim..]);
        let dk = max_abs_diff(&k, &want_k);
        let dv = max_abs_diff(&v, &want_v);
        let arch = &cfg.arch;
        eprintln!("gpu={gpu} {arch} layer {l}: max |dK| {dk:e}, max |dV| {dv:e}");
        assert!(dk <= tol, "layer {l}: keys off by {dk}");
        assert!(dv <= tol, "layer {l}: values off by {dv}");
    }
}

#[test]
fn cpu_shift_re_rotates_keys_to_their_new_positions() {
    shift_matches_rope_at_new_positions(false);
}

#[test]
fn gpu_shift_re_rotates_keys_to_their_new_positions() {
    shift_matches_rope_at_new_positions(true);
}

/// A one-block model's cache rows depend on their token and position only, so after a shift
/// the next token's logits must equal those of the kept tokens evaluated from scratch. Run
/// with llama's RoPE, qwen2's (NeoX), gemma3's (a sliding-window block: the window moves
/// with the positions) and phi3's (partial rotary, LongRoPE factors, an attention factor the
/// shift must not apply twice).
fn shift_equals_recompute(gpu: bool) {
    let llama = synth_model(1, 5);
    let qwen2 = synth_model_arch(1, 5, "qwen2");
    let gemma3 = synth_model_arch(1, 5, "gemma3");
    let phi3 = synth_model_arch(1, 5, "phi3");
    for path in [llama, qwen2, gemma3, phi3] {
        let model = load(&path, gpu, false);
        assert_eq!(
            model.config().rope_kind == RopeKind::Neox,
            model.config().arch != "llama"
        );
        if model.config().arch == "gemma3" {
            assert_eq!(model.config().window(0), Some(GEMMA3_WINDOW as usize));
        }
        if model.config().arch == "phi3" {
            let c = model.config();
            assert!(c.n_rot < c.head_dim && c.rope_attn_factor != 1.0);
            assert_eq!(
                c.long_rope.as_ref().unwrap().orig_ctx,
                PHI3_ORIG_CTX as usize
            );
        }
        shift_equals_recompute_on(&model, gpu);
    }
}

fn shift_equals_recompute_on(model: &memwall::api::Model, gpu: bool) {
    let n_vocab = model.config().n_vocab;
    let (n_ctx, keep) = (32, 2);
    let prompt = random_ids(n_ctx, n_vocab, 9);
    let next = random_ids(1, n_vocab, 10)[0];
    let mut s = model.session_with_ctx(n_ctx).unwrap();
    s.set_keep(Some(keep));
    s.eval(&prompt, Logits::Last).unwrap();
    let shifted = s.eval(&[next], Logits::Last).unwrap();
    // llama.cpp's rule: half of what is not kept is dropped.
    let discard = (n_ctx - keep) / 2;
    let mut kept = prompt[..keep].to_vec();
    kept.extend_from_slice(&prompt[keep + discard..]);
    kept.push(next);
    assert_eq!(s.tokens(), &kept[..]);
    assert_eq!(s.shift_stats().shifts, 1);
    assert_eq!(s.shift_stats().discarded, discard);

    let mut fresh = model.session_with_ctx(n_ctx).unwrap();
    let scratch = fresh.eval(&kept, Logits::Last).unwrap();
    let scale = scratch.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = max_abs_diff(&shifted, &scratch);
    let arch = &model.config().arch;
    eprintln!("gpu={gpu} {arch}: max |logit diff| {d:e} (max |logit| {scale})");
    assert!(d <= 1e-3 * scale.max(1.0), "shifted vs recomputed: {d}");
    // Two shifts later, still the kept tokens' from-scratch logits.
    let more = random_ids(40, n_vocab, 12);
    let shifted = s.eval(&more, Logits::Last).unwrap();
    let tokens = s.tokens().to_vec();
    assert!(s.shift_stats().shifts >= 2, "{:?}", s.shift_stats());
    let mut fresh = model.session_with_ctx(n_ctx).unwrap();
    let scratch = fresh.eval(&tokens, Logits::Last).unwrap();
    let d = max_abs_diff(&shifted, &scratch);
    assert!(d <= 1e-3 * scale.max(1.0), "after more shifts: {d}");
}

#[test]
fn cpu_decoding_after_a_shift_equals_recomputing_the_kept_tokens() {
    shift_equals_recompute(false);
}

#[test]
fn gpu_decoding_after_a_shift_equals_recomputing_the_kept_tokens() {
    shift_equals_recompute(true);
}

/// 2,000 greedy tokens in a 256-token context on the CPU: the generation runs to its limit
/// through many shifts, the context never exceeds its size and the KV memory does not grow.
#[test]
fn long_greedy_generation_in_a_small_context_on_the_cpu() {
    let model = load(&common::model_path(), false, false);
    let prompt = model.tokenizer().encode("Once upon a time", true, false);
    let mut s = model.session_with_ctx(256).unwrap();
    // Keep the prompt (llama.cpp's `--keep -1`).
    s.set_keep(Some(prompt.len()));
    let kv0 = s.exec().kv_bytes();
    // Where the greedy text reaches an end of generation (it does on some CPU kernel paths,
    // whose roundings pick other ids), the generation goes on from the prompt's last token,
    // so 2,000 tokens always pass through the shifts.
    let (mut generated, mut ends) = (0, 0);
    let mut feed = prompt.clone();
    while generated < 2000 {
        let g = greedy(&mut s, &feed, 2000 - generated);
        generated += g.generated_ids.len();
        match g.stop {
            StopReason::Limit => break,
            StopReason::Eog => {
                ends += 1;
                feed = prompt[prompt.len() - 1..].to_vec();
            }
            other => panic!("the generation stopped: {other:?}"),
        }
        assert!(ends < 50, "{ends} ends of generation in {generated} tokens");
    }
    assert_eq!(generated, 2000);
    assert!(s.tokens().len() <= 256);
    assert_eq!(&s.tokens()[..prompt.len()], &prompt[..]);
    // Each shift drops (256 - keep) / 2 tokens.
    let st = s.shift_stats();
    eprintln!("{st:?}");
    assert!(st.shifts >= 13, "{st:?}");
    assert_eq!(st.discarded, st.shifts * ((256 - prompt.len()) / 2));
    assert_eq!(s.exec().kv_bytes(), kv0);
}

/// The same greedy ids from the CPU and the GPU through several shifts (f32 activations on
/// both, the mode in which they agree to rounding).
#[test]
fn cpu_and_gpu_pick_the_same_ids_through_shifts() {
    let mut ids = Vec::new();
    for gpu in [false, true] {
        let model = load(&common::model_path(), gpu, true);
        let prompt = model.tokenizer().encode("Once upon a time", true, false);
        let mut s = model.session_with_ctx(64).unwrap();
        let kv0 = s.exec().kv_bytes();
        let g = greedy(&mut s, &prompt, 150);
        assert_eq!(g.stop, StopReason::Limit);
        assert!(s.shift_stats().shifts >= 3, "{:?}", s.shift_stats());
        assert_eq!(s.exec().kv_bytes(), kv0);
        ids.push(g.generated_ids);
    }
    assert_eq!(ids[0], ids[1], "CPU and GPU ids differ");
}

/// `stop` refuses a prompt longer than the context and ends a generation at the context's
/// end; `shift` processes the same prompt.
#[test]
fn stop_refuses_what_does_not_fit_and_shift_processes_it() {
    let model = load(&synth_model(2, 3), false, false);
    let n_vocab = model.config().n_vocab;
    let long = random_ids(80, n_vocab, 4);
    let mut s = model.session_with_ctx(32).unwrap();
    s.set_ctx_overflow(CtxOverflow::Stop);
    match s.eval(&long, Logits::Last) {
        Err(Error::ContextOverflow { n_prompt, n_ctx }) => assert_eq!((n_prompt, n_ctx), (80, 32)),
        other => panic!(
            "expected a context overflow, got {:?}",
            other.map(|v| v.len())
        ),
    }
    assert!(
        s.tokens().is_empty(),
        "a refused prompt leaves the session as it was"
    );
    let g = greedy(&mut s, &long[..20], 50);
    assert_eq!(g.stop, StopReason::ContextFull);
    assert_eq!(s.tokens().len(), 32);

    let mut s = model.session_with_ctx(32).unwrap();
    s.set_keep(Some(4));
    let g = greedy(&mut s, &long, 10);
    assert_eq!(g.generated_ids.len(), 10);
    assert_eq!(&s.tokens()[..4], &long[..4]);
    assert!(s.tokens().len() <= 32);
    assert!(s.shift_stats().shifts >= 2, "{:?}", s.shift_stats());
    // --keep as large as the context leaves nothing to drop: a clear error.
    let mut s = model.session_with_ctx(16).unwrap();
    s.set_keep(Some(16));
    let e = s.eval(&long[..20], Logits::Last).unwrap_err();
    assert!(e.to_string().contains("--keep 16"), "{e}");
}

/// The CLI: `--ctx-overflow stop` names the overflow; the default shifts through it.
#[test]
fn cli_long_prompt_errors_with_stop_and_runs_with_shift() {
    let m = common::model_path();
    let prompt = "word ".repeat(60);
    let base = |extra: &[&str]| {
        let mut a: Vec<std::ffi::OsString> = vec!["run".into(), "-m".into(), m.clone().into()];
        for x in [
            "--device", "cpu", "-c", "32", "-n", "4", "--temp", "0", "-p", &prompt,
        ] {
            a.push(x.into());
        }
        a.extend(extra.iter().map(|x| x.into()));
        let refs: Vec<&std::ffi::OsStr> = a.iter().map(|x| x.as_os_str()).collect();
        common::run_memwall(&refs)
    };
    let (code, text) = base(&["--ctx-overflow", "stop"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("does not fit the context of 32"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    let (code, text) = base(&["--json"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("\"shifts\""), "{text}");
}
