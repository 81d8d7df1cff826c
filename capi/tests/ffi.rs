//! The C API called directly: memwall_cancel from another thread stops a running
//! memwall_generate, a second call on a busy session is MEMWALL_ERR_BUSY (not a wait or a
//! data race), and the token callback sees the text the Rust API generates.

mod common;

use std::ffi::{c_char, c_void, CStr, CString};

use memwall_c::*;

const STOP_LIMIT: i32 = 1;
const STOP_CANCELLED: i32 = 3;
const ERR_BUSY: i32 = -9;

struct State {
    session: *mut memwall_session,
    text: String,
    n_tokens: usize,
    busy_code: Option<i32>,
}

/// Collects text; at the third token cancels from another thread and tries a second
/// generation on the same (busy) session from this one.
unsafe extern "C" fn on_token(text: *const c_char, len: usize, _id: i32, user: *mut c_void) -> i32 {
    // SAFETY: `user` is the State the test passes; `text` has `len` bytes.
    let st = unsafe { &mut *(user as *mut State) };
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    st.text.push_str(std::str::from_utf8(bytes).unwrap());
    st.n_tokens += 1;
    if st.n_tokens == 3 {
        let p = CString::new("x").unwrap();
        st.busy_code = Some(unsafe {
            memwall_generate(st.session, p.as_ptr(), 4, None, std::ptr::null_mut())
        });
        let s = st.session as usize;
        std::thread::spawn(move || unsafe { memwall_cancel(s as *const memwall_session) })
            .join()
            .unwrap();
    }
    1
}

/// The Rust API's model the C API's output is compared with (CPU, the tests' 256-token
/// context): loaded once and shared by the tests, which each make their own session.
fn reference_model() -> &'static memwall::api::Model {
    static MODEL: std::sync::OnceLock<memwall::api::Model> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        memwall::api::ModelConfig::new(common::model_path())
            .device(memwall::api::DeviceChoice::Cpu)
            .n_ctx(256)
            .load()
            .unwrap()
    })
}

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(memwall_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn cancel_from_another_thread_and_busy_session() {
    let path = CString::new(common::model_path().to_str().unwrap()).unwrap();
    let cpu = CString::new("cpu").unwrap();
    let mut cfg = memwall_config_default();
    cfg.device = cpu.as_ptr();
    cfg.n_ctx = 256;
    unsafe {
        let m = memwall_model_load(path.as_ptr(), &cfg);
        assert!(!m.is_null(), "{}", last_error());
        let s = memwall_session_new(m, std::ptr::null());
        assert!(!s.is_null(), "{}", last_error());
        let mut st = State {
            session: s,
            text: String::new(),
            n_tokens: 0,
            busy_code: None,
        };
        let prompt = CString::new("The three primary colors are").unwrap();
        let r = memwall_generate(
            s,
            prompt.as_ptr(),
            100,
            Some(on_token),
            (&mut st as *mut State).cast(),
        );
        assert_eq!(r, STOP_CANCELLED, "{}", last_error());
        assert_eq!(st.n_tokens, 3);
        assert_eq!(st.busy_code, Some(ERR_BUSY));

        // The text so far is the Rust API's first three pieces (greedy, same context).
        let mut rs = reference_model().session().unwrap();
        rs.set_max_tokens(3);
        let expected = rs
            .prompt("The three primary colors are")
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(st.text, expected.text);

        // The flag is cleared by the next generation.
        memwall_session_reset(s);
        let r = memwall_generate(s, prompt.as_ptr(), 2, None, std::ptr::null_mut());
        assert_eq!(r, STOP_LIMIT, "{}", last_error());
        assert_eq!(last_error(), "");
        memwall_session_free(s);
        memwall_model_free(m);
    }
}

unsafe extern "C" fn collect(text: *const c_char, len: usize, _id: i32, user: *mut c_void) -> i32 {
    // SAFETY: `user` is the String the test passes; `text` has `len` bytes.
    let out = unsafe { &mut *(user as *mut String) };
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    out.push_str(&String::from_utf8_lossy(bytes));
    1
}

#[test]
fn chat_matches_the_rust_api() {
    let path = CString::new(common::model_path().to_str().unwrap()).unwrap();
    let cpu = CString::new("cpu").unwrap();
    let mut cfg = memwall_config_default();
    cfg.device = cpu.as_ptr();
    cfg.n_ctx = 256;
    let (role, content) = ("user", "What is the capital of France?");
    let (r, c) = (CString::new(role).unwrap(), CString::new(content).unwrap());
    let msgs = [memwall_message {
        role: r.as_ptr(),
        content: c.as_ptr(),
    }];
    let mut text = String::new();
    unsafe {
        let m = memwall_model_load(path.as_ptr(), &cfg);
        assert!(!m.is_null(), "{}", last_error());
        let s = memwall_session_new(m, std::ptr::null());
        let code = memwall_generate_chat(
            s,
            msgs.as_ptr(),
            1,
            16,
            Some(collect),
            (&mut text as *mut String).cast(),
        );
        assert!(code >= 0, "{}", last_error());
        let bad = memwall_generate_chat(s, msgs.as_ptr(), 0, 16, None, std::ptr::null_mut());
        assert_eq!(bad, -1);
        assert!(last_error().contains("no messages"), "{}", last_error());
        memwall_session_free(s);
        memwall_model_free(m);
    }
    let mut rs = reference_model().session().unwrap();
    rs.set_max_tokens(16);
    let expected = rs
        .chat(&[memwall::api::ChatMessage::new(role, content)])
        .unwrap()
        .finish()
        .unwrap();
    assert!(!expected.text.is_empty());
    assert_eq!(text, expected.text);
}

/// A GPU lost in the middle of memwall_generate: the generation finishes (on the CPU) and
/// memwall_session_fallbacks reports the move.
#[test]
fn device_loss_is_survived_and_reported() {
    let path = CString::new(common::model_path().to_str().unwrap()).unwrap();
    let gpu = CString::new("gpu").unwrap();
    let mut cfg = memwall_config_default();
    cfg.device = gpu.as_ptr();
    cfg.n_ctx = 256;
    let mut text = String::new();
    unsafe {
        let m = memwall_model_load(path.as_ptr(), &cfg);
        assert!(!m.is_null(), "{}", last_error());
        let s = memwall_session_new(m, std::ptr::null());
        assert!(!s.is_null(), "{}", last_error());
        assert_eq!(memwall_session_fallbacks(s, std::ptr::null_mut(), 0), 0);
        let faults = test_gpu_faults(m).expect("the model runs on a GPU");
        // A few submissions in: during the prompt or the first tokens.
        faults.lose_device_after_submits(3);
        let prompt = CString::new("The three primary colors are").unwrap();
        let r = memwall_generate(
            s,
            prompt.as_ptr(),
            8,
            Some(collect),
            (&mut text as *mut String).cast(),
        );
        assert_eq!(r, STOP_LIMIT, "{}", last_error());
        assert!(faults.device_lost());
        assert!(!text.is_empty());
        let mut buf = [0 as c_char; 256];
        let n = memwall_session_fallbacks(s, buf.as_mut_ptr(), buf.len());
        assert_eq!(n, 1, "{}", last_error());
        let msg = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
        assert!(msg.contains("device lost"), "{msg}");
        // A buffer too small gets a cut, NUL-terminated message.
        let mut small = [1 as c_char; 8];
        assert_eq!(memwall_session_fallbacks(s, small.as_mut_ptr(), 8), 1);
        assert_eq!(CStr::from_ptr(small.as_ptr()).to_bytes().len(), 7);
        memwall_session_free(s);
        memwall_model_free(m);
    }
}

/// Drafting through the C API (prompt lookup, then a draft model: the test model itself)
/// gives plain greedy decoding's text, and its statistics come back.
#[test]
fn speculative_decoding_gives_plain_greedy_text() {
    let path = CString::new(common::model_path().to_str().unwrap()).unwrap();
    let cpu = CString::new("cpu").unwrap();
    let mut cfg = memwall_config_default();
    cfg.device = cpu.as_ptr();
    cfg.n_ctx = 256;
    cfg.temperature = 0.0;
    let prompt = CString::new("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,").unwrap();
    unsafe {
        let m = memwall_model_load(path.as_ptr(), &cfg);
        assert!(!m.is_null(), "{}", last_error());
        // Generates on a new session of `model`, drafting by prompt lookup (true) or with the
        // model `m` (false), or plainly.
        let run = |model: *mut memwall_model, draft: Option<bool>| {
            let s = memwall_session_new(model, &cfg);
            assert!(!s.is_null(), "{}", last_error());
            match draft {
                Some(true) => assert_eq!(memwall_session_set_draft_lookup(s, 1, 3, 5), 0),
                Some(false) => assert_eq!(memwall_session_set_draft_model(s, m, 5, 1, 0.3), 0),
                None => {}
            }
            let mut text = String::new();
            let r = memwall_generate(
                s,
                prompt.as_ptr(),
                24,
                Some(collect),
                (&mut text as *mut String).cast(),
            );
            assert_eq!(r, STOP_LIMIT, "{}", last_error());
            let (mut passes, mut drafted, mut accepted) = (0u64, 0u64, 0u64);
            assert_eq!(
                memwall_session_clear_draft(s, &mut passes, &mut drafted, &mut accepted),
                0
            );
            memwall_session_free(s);
            (text, passes, drafted, accepted)
        };
        let (plain, p0, _, _) = run(m, None);
        assert_eq!(p0, 0);
        for lookup in [true, false] {
            let (text, passes, drafted, accepted) = run(m, Some(lookup));
            assert_eq!(text, plain, "lookup={lookup}");
            assert!(
                passes > 0 && accepted > 0 && accepted <= drafted,
                "{passes} {drafted} {accepted}"
            );
        }
        // A model loaded to share the budget with the draft (here the same file) drafts with
        // it as before; a budget the two cannot share is refused, named.
        let mut shared_cfg = cfg;
        shared_cfg.mem_budget = 64 << 30;
        let t = memwall_model_load_sharing(path.as_ptr(), &shared_cfg, m);
        assert!(!t.is_null(), "{}", last_error());
        let (text, passes, _, accepted) = run(t, Some(false));
        assert_eq!(text, plain);
        assert!(passes > 0 && accepted > 0, "{passes} {accepted}");
        memwall_model_free(t);
        shared_cfg.mem_budget = 1 << 20;
        assert!(memwall_model_load_sharing(path.as_ptr(), &shared_cfg, m).is_null());
        assert!(last_error().contains("memory budget"), "{}", last_error());
        // A bad n-gram range is an invalid argument, named.
        let s = memwall_session_new(m, &cfg);
        assert_eq!(memwall_session_set_draft_lookup(s, 3, 2, 5), -1);
        assert!(last_error().contains("n-grams"), "{}", last_error());
        memwall_session_free(s);
        memwall_model_free(m);
    }
}
