//! memwall's C API (include/memwall.h) for apps: Android through JNI, iOS through Swift.
//!
//! Every entry point checks its pointers, runs inside [`guard::guard`] (no panic and no Rust
//! error crosses the boundary: both become a negative `memwall_status` and a message for
//! `memwall_last_error`), and is built on `memwall::api`, the API the CLI uses.
#![allow(non_camel_case_types)]

mod guard;

use std::ffi::{c_char, c_void};
use std::sync::{Mutex, TryLockError};

use memwall::api::{
    self, CancelHandle, CtxOverflow, DeviceChoice, DraftParams, Event, KvType, SamplerParams,
    StopReason,
};

use guard::{c_str, guard, obj, CError, ERR_BUFFER_TOO_SMALL, ERR_BUSY, ERR_INVALID_ARGUMENT};

/// How to load a model and sample from it (`memwall_config` in memwall.h; same field order).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct memwall_config {
    /// "auto", "cpu", "gpu", an adapter index or a name substring; NULL means "auto".
    pub device: *const c_char,
    /// Bytes of GPU memory the model may use; 0: no budget (every stage on the GPU).
    pub gpu_mem_budget: u64,
    /// Context in tokens; 0: the model's, capped at 4096.
    pub n_ctx: u32,
    /// CPU worker threads; 0: every core.
    pub n_threads: u32,
    /// 0 or below: greedy.
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
    /// KV cache type of keys: "f16", "q8_0", "q4_0" or "f32"; NULL: the default (f16).
    pub cache_type_k: *const c_char,
    /// KV cache type of values, as `cache_type_k`.
    pub cache_type_v: *const c_char,
    /// Nonzero: a full context ends the generation (MEMWALL_STOP_CONTEXT_FULL) and a prompt
    /// over it is refused (MEMWALL_ERR_CONTEXT_FULL); 0 (default): the context shifts (the
    /// oldest half of the tokens is dropped) and the generation goes on.
    pub ctx_overflow_stop: i32,
    /// Directory of the GPU start-up caches (selftest record, driver pipeline cache); NULL:
    /// `$MEMWALL_CACHE_DIR`, else `$XDG_CACHE_HOME/memwall`, else `~/.cache/memwall`. Apps
    /// pass their own cache directory (Android: `getCacheDir()`).
    pub cache_dir: *const c_char,
    /// Bytes of memory the model may hold on the CPU (anonymous memory, mapped weights, KV
    /// cache, stream slots); blocks that do not fit stream from storage. 0: the process's
    /// memory limit (cgroup, else available memory) less a margin.
    pub mem_budget: u64,
}

/// A loaded model and the sampling its sessions start with.
pub struct memwall_model {
    model: api::Model,
    sampler: SamplerParams,
    /// The load config's `ctx_overflow_stop`, for sessions made without a config.
    overflow_stop: bool,
}

/// A conversation. The cancel flag sits outside the lock so `memwall_cancel` works while
/// `memwall_generate` holds it on another thread.
pub struct memwall_session {
    cancel: CancelHandle,
    inner: Mutex<api::Session>,
}

/// Receives each piece of generated text (`len` bytes of UTF-8, also NUL-terminated) and
/// its token id (-1 for text at the end that no token completed); returns nonzero to go on.
pub type memwall_token_callback = unsafe extern "C" fn(
    text: *const c_char,
    len: usize,
    token: i32,
    user_data: *mut c_void,
) -> i32;

fn sampler_of(c: &memwall_config) -> SamplerParams {
    SamplerParams {
        temperature: c.temperature,
        top_k: c.top_k as usize,
        top_p: c.top_p,
        min_p: c.min_p,
        repeat_penalty: c.repeat_penalty,
        seed: c.seed,
        ..SamplerParams::default()
    }
}

/// The version of the library, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn memwall_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of this thread's last failed call ("" if it succeeded); valid until this
/// thread's next memwall call.
#[no_mangle]
pub extern "C" fn memwall_last_error() -> *const c_char {
    guard::last_error_ptr()
}

/// The defaults: device auto, no GPU budget, the model's context, every core, greedy.
#[no_mangle]
pub extern "C" fn memwall_config_default() -> memwall_config {
    let s = SamplerParams::greedy();
    memwall_config {
        device: std::ptr::null(),
        gpu_mem_budget: 0,
        n_ctx: 0,
        n_threads: 0,
        temperature: s.temperature,
        top_k: s.top_k as u32,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        seed: s.seed,
        cache_type_k: std::ptr::null(),
        cache_type_v: std::ptr::null(),
        ctx_overflow_stop: 0,
        cache_dir: std::ptr::null(),
        mem_budget: 0,
    }
}

/// Loads a GGUF model; NULL on error (see `memwall_last_error`). `config` NULL: defaults.
///
/// # Safety
/// `path` is a NUL-terminated string; `config` is NULL or points to a `memwall_config`
/// whose `device`, `cache_type_k`, `cache_type_v` and `cache_dir` are NULL or NUL-terminated
/// strings.
#[no_mangle]
pub unsafe extern "C" fn memwall_model_load(
    path: *const c_char,
    config: *const memwall_config,
) -> *mut memwall_model {
    // SAFETY: the function's contract; no model to share with.
    unsafe { memwall_model_load_sharing(path, config, std::ptr::null()) }
}

/// `memwall_model_load`, the model sharing the memory budget with `other` (NULL: none), a
/// model loaded first in this process, typically the draft model of speculative decoding:
/// this model's plan counts what `other` planned to hold and gets the rest of the budget.
///
/// # Safety
/// As `memwall_model_load`; `other` is NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn memwall_model_load_sharing(
    path: *const c_char,
    config: *const memwall_config,
    other: *const memwall_model,
) -> *mut memwall_model {
    guard(
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the function's contract.
            let path = unsafe { c_str(path, "path") }?;
            let c = match unsafe { config.as_ref() } {
                Some(c) => *c,
                None => memwall_config_default(),
            };
            let mut cfg = api::ModelConfig::new(path).n_ctx(c.n_ctx as usize);
            // SAFETY: NULL or a live model, by the contract.
            if let Some(o) = unsafe { other.as_ref() } {
                cfg = cfg.share_budget_with(&o.model);
            }
            if !c.device.is_null() {
                // SAFETY: non-NULL, NUL-terminated by the contract.
                let d = unsafe { c_str(c.device, "config.device") }?;
                cfg = cfg.device(DeviceChoice::parse(d)?);
            }
            if c.gpu_mem_budget > 0 {
                cfg = cfg.gpu_mem_budget(c.gpu_mem_budget);
            }
            if c.mem_budget > 0 {
                cfg = cfg.mem_budget(c.mem_budget);
            }
            if c.n_threads > 0 {
                cfg = cfg.threads(c.n_threads as usize);
            }
            if !c.cache_type_k.is_null() {
                // SAFETY: non-NULL, NUL-terminated by the contract.
                let k = unsafe { c_str(c.cache_type_k, "config.cache_type_k") }?;
                cfg.options_mut().cache_type_k = Some(k.parse::<KvType>()?);
            }
            if !c.cache_type_v.is_null() {
                // SAFETY: non-NULL, NUL-terminated by the contract.
                let v = unsafe { c_str(c.cache_type_v, "config.cache_type_v") }?;
                cfg.options_mut().cache_type_v = Some(v.parse::<KvType>()?);
            }
            if !c.cache_dir.is_null() {
                // SAFETY: non-NULL, NUL-terminated by the contract.
                cfg = cfg.cache_dir(unsafe { c_str(c.cache_dir, "config.cache_dir") }?);
            }
            let sampler = sampler_of(&c);
            sampler.validate()?;
            let model = cfg.load()?;
            Ok(Box::into_raw(Box::new(memwall_model {
                model,
                sampler,
                overflow_stop: c.ctx_overflow_stop != 0,
            })))
        },
    )
}

/// Frees a model (NULL is ignored). Its sessions must be freed first.
///
/// # Safety
/// `model` is NULL or was returned by `memwall_model_load` and not freed.
#[no_mangle]
pub unsafe extern "C" fn memwall_model_free(model: *mut memwall_model) {
    guard(
        |_| (),
        || {
            if !model.is_null() {
                // SAFETY: the pointer came from Box::into_raw and is freed once.
                drop(unsafe { Box::from_raw(model) });
            }
            Ok(())
        },
    )
}

/// Tokenizes `text` into `out` (capacity `cap`); returns the number of tokens, or a negative
/// status (MEMWALL_ERR_BUFFER_TOO_SMALL when more than `cap`). With `out` NULL and `cap` 0
/// it returns the number of tokens only. `add_special`: start with BOS as a context does.
///
/// # Safety
/// `model` is a live model; `text` a NUL-terminated string; `out` NULL or `cap` writable
/// `uint32_t`s.
#[no_mangle]
pub unsafe extern "C" fn memwall_tokenize(
    model: *const memwall_model,
    text: *const c_char,
    add_special: i32,
    out: *mut u32,
    cap: i32,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let m = unsafe { obj(model, "model") }?;
            let text = unsafe { c_str(text, "text") }?;
            if cap < 0 || (out.is_null() && cap != 0) {
                return Err(CError::new(
                    ERR_INVALID_ARGUMENT,
                    format!("out is NULL or cap {cap} is negative"),
                ));
            }
            let ids = m.model.tokenize(text, add_special != 0);
            let n = i32::try_from(ids.len())
                .map_err(|_| CError::new(ERR_INVALID_ARGUMENT, "text has too many tokens"))?;
            if out.is_null() {
                return Ok(n);
            }
            if n > cap {
                return Err(CError::new(
                    ERR_BUFFER_TOO_SMALL,
                    format!("{n} tokens do not fit the buffer of {cap}"),
                ));
            }
            // SAFETY: `out` has room for `cap` >= n ids by the contract.
            unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), out, ids.len()) };
            Ok(n)
        },
    )
}

/// Starts a conversation; NULL on error. `config` NULL: the sampling the model was loaded
/// with (its device, budget, context and threads fields are not read here).
///
/// # Safety
/// `model` is a live model that outlives the session; `config` NULL or a `memwall_config`.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_new(
    model: *const memwall_model,
    config: *const memwall_config,
) -> *mut memwall_session {
    guard(
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the function's contract.
            let m = unsafe { obj(model, "model") }?;
            let (sampler, stop) = match unsafe { config.as_ref() } {
                Some(c) => (sampler_of(c), c.ctx_overflow_stop != 0),
                None => (m.sampler.clone(), m.overflow_stop),
            };
            let mut s = m.model.session()?;
            s.set_sampler(sampler)?;
            let overflow = if stop {
                CtxOverflow::Stop
            } else {
                CtxOverflow::Shift
            };
            s.set_ctx_overflow(overflow);
            Ok(Box::into_raw(Box::new(memwall_session {
                cancel: s.cancel_handle(),
                inner: Mutex::new(s),
            })))
        },
    )
}

/// Frees a session (NULL is ignored); no call on it may be running.
///
/// # Safety
/// `session` is NULL or was returned by `memwall_session_new` and not freed.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_free(session: *mut memwall_session) {
    guard(
        |_| (),
        || {
            if !session.is_null() {
                // SAFETY: the pointer came from Box::into_raw and is freed once.
                drop(unsafe { Box::from_raw(session) });
            }
            Ok(())
        },
    )
}

/// Locks a session for a call; a second call at the same time is an error, not a wait.
fn lock(s: &memwall_session) -> Result<std::sync::MutexGuard<'_, api::Session>, CError> {
    match s.inner.try_lock() {
        Ok(g) => Ok(g),
        Err(TryLockError::WouldBlock) => Err(CError::new(
            ERR_BUSY,
            "the session is busy with a call on another thread",
        )),
        Err(TryLockError::Poisoned(_)) => Err(CError::new(
            guard::ERR_INTERNAL,
            "the session is unusable after an internal error",
        )),
    }
}

/// Forgets the session's context.
///
/// # Safety
/// `session` is a live session.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_reset(session: *mut memwall_session) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            lock(s)?.reset();
            Ok(guard::OK)
        },
    )
}

/// Speculative decoding with `draft`, a model of the same vocabulary (checked: an error
/// otherwise): it drafts up to `draft_max` tokens per pass (stopping when its top token's
/// probability is below `p_min`; fewer than `draft_min` decode plainly), and each pass of the
/// session's model verifies them. Greedy output is plain decoding's. The session keeps what it
/// needs of `draft`, which may be freed afterwards.
///
/// # Safety
/// `session` is a live session and `draft` a live model.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_set_draft_model(
    session: *mut memwall_session,
    draft: *const memwall_model,
    draft_max: u32,
    draft_min: u32,
    p_min: f32,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            let d = unsafe { obj(draft, "draft") }?;
            let params = DraftParams {
                max: draft_max as usize,
                min: draft_min as usize,
                p_min: f64::from(p_min),
            };
            lock(s)?.set_draft_model(&d.model, params)?;
            Ok(guard::OK)
        },
    )
}

/// Speculative decoding by prompt lookup: the latest earlier occurrence of the context's last
/// n tokens (n from `ngram_max` down to `ngram_min`) proposes up to `draft_max` tokens.
///
/// # Safety
/// `session` is a live session.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_set_draft_lookup(
    session: *mut memwall_session,
    ngram_min: u32,
    ngram_max: u32,
    draft_max: u32,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            let params = DraftParams {
                max: draft_max as usize,
                min: 0,
                ..DraftParams::default()
            };
            lock(s)?.set_draft_lookup(ngram_min as usize, ngram_max as usize, params)?;
            Ok(guard::OK)
        },
    )
}

/// Plain decoding again; with `passes`, `drafted`, `accepted` non-NULL, first writes what
/// speculation did since it was set (verification passes, drafted and accepted tokens).
///
/// # Safety
/// `session` is a live session; each out pointer NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_clear_draft(
    session: *mut memwall_session,
    passes: *mut u64,
    drafted: *mut u64,
    accepted: *mut u64,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            let mut g = lock(s)?;
            let st = g.draft_stats().unwrap_or_default();
            for (p, v) in [
                (passes, st.passes),
                (drafted, st.drafted),
                (accepted, st.accepted),
            ] {
                // SAFETY: NULL or valid for a write, by the contract.
                if let Some(p) = unsafe { p.as_mut() } {
                    *p = v as u64;
                }
            }
            g.clear_draft();
            Ok(guard::OK)
        },
    )
}

/// Generates up to `max_tokens` after `prompt` (appended to the session's context), calling
/// `callback` (may be NULL) with each piece of text. Returns how it stopped (a
/// `memwall_stop`, >= 0) or a negative status.
///
/// # Safety
/// `session` is a live session; `prompt` a NUL-terminated string; `callback` NULL or a
/// function that does not unwind; `user_data` is passed to it untouched.
#[no_mangle]
pub unsafe extern "C" fn memwall_generate(
    session: *mut memwall_session,
    prompt: *const c_char,
    max_tokens: i32,
    callback: Option<memwall_token_callback>,
    user_data: *mut c_void,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            let prompt = unsafe { c_str(prompt, "prompt") }?;
            let max = usize::try_from(max_tokens).map_err(|_| {
                CError::new(
                    ERR_INVALID_ARGUMENT,
                    format!("max_tokens {max_tokens} is negative"),
                )
            })?;
            let mut inner = lock(s)?;
            inner.set_max_tokens(max);
            let stream = inner.prompt(prompt)?;
            // SAFETY: the callback's contract is the caller's.
            unsafe { run_stream(stream, callback, user_data) }
        },
    )
}

/// One message of a conversation (`memwall_message` in memwall.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct memwall_message {
    /// "system", "user", "assistant", ...
    pub role: *const c_char,
    pub content: *const c_char,
}

/// Generates the assistant's reply to a conversation rendered with the model's chat
/// template. When the session holds the earlier turns, only the new part is evaluated;
/// otherwise the context starts over. Returns a `memwall_stop` (>= 0) or a negative status.
///
/// # Safety
/// `session` is a live session; `messages` points to `n_messages` messages whose strings
/// are NUL-terminated; `callback` as for `memwall_generate`.
#[no_mangle]
pub unsafe extern "C" fn memwall_generate_chat(
    session: *mut memwall_session,
    messages: *const memwall_message,
    n_messages: usize,
    max_tokens: i32,
    callback: Option<memwall_token_callback>,
    user_data: *mut c_void,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            if messages.is_null() || n_messages == 0 {
                return Err(CError::new(ERR_INVALID_ARGUMENT, "no messages"));
            }
            // SAFETY: `n_messages` readable messages by the contract.
            let raw = unsafe { std::slice::from_raw_parts(messages, n_messages) };
            let mut msgs = Vec::with_capacity(raw.len());
            for (i, m) in raw.iter().enumerate() {
                // SAFETY: NUL-terminated strings by the contract.
                let role = unsafe { c_str(m.role, &format!("messages[{i}].role")) }?;
                let content = unsafe { c_str(m.content, &format!("messages[{i}].content")) }?;
                msgs.push(api::ChatMessage::new(role, content));
            }
            let max = usize::try_from(max_tokens).map_err(|_| {
                CError::new(
                    ERR_INVALID_ARGUMENT,
                    format!("max_tokens {max_tokens} is negative"),
                )
            })?;
            let mut inner = lock(s)?;
            inner.set_max_tokens(max);
            let stream = inner.chat(&msgs)?;
            // SAFETY: the callback's contract is the caller's.
            unsafe { run_stream(stream, callback, user_data) }
        },
    )
}

/// The fault injection of a model's GPU, for the failover tests (not part of the C API).
///
/// # Safety
/// `model` is NULL or a live model.
#[doc(hidden)]
pub unsafe fn test_gpu_faults(
    model: *const memwall_model,
) -> Option<std::sync::Arc<memwall::gpu::GpuFaults>> {
    // SAFETY: the function's contract.
    let m = unsafe { model.as_ref() }?;
    m.model.gpu().map(|g| g.ctx.faults().clone())
}

/// Runs a generation, handing each piece of text to `callback`; returns the stop code.
///
/// # Safety
/// `callback` is NULL or a function that does not unwind.
unsafe fn run_stream(
    mut stream: api::TokenStream<'_>,
    callback: Option<memwall_token_callback>,
    user_data: *mut c_void,
) -> Result<i32, CError> {
    let mut buf = Vec::new();
    while let Some(ev) = stream.next() {
        let (text, id) = match ev? {
            Event::Done(done) => return Ok(stop_code(done.stop)),
            Event::Token { id, text } => (text, id as i32),
            Event::Text(text) => (text, -1),
            _ => continue,
        };
        let Some(cb) = callback else { continue };
        if text.is_empty() {
            continue;
        }
        buf.clear();
        buf.extend_from_slice(text.as_bytes());
        buf.push(0);
        // SAFETY: `buf` is NUL-terminated and lives through the call; the callback's
        // contract is the caller's.
        if unsafe { cb(buf.as_ptr().cast(), text.len(), id, user_data) } == 0 {
            stream.stop();
        }
    }
    Err(CError::new(
        guard::ERR_INTERNAL,
        "the generation ended without a summary",
    ))
}

fn stop_code(s: StopReason) -> i32 {
    match s {
        StopReason::Eog => 0,
        StopReason::Limit => 1,
        StopReason::ContextFull => 2,
        StopReason::Cancelled => 3,
    }
}

/// How many times the session's stages moved from the GPU to the CPU because the GPU failed
/// (device lost, out of memory; at load or start included); the generation went on from the
/// same state. With `buf` non-NULL, the last move's description is written there
/// (NUL-terminated, cut to `cap` bytes). Returns the count or a negative status.
///
/// # Safety
/// `session` is a live session; `buf` NULL or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn memwall_session_fallbacks(
    session: *mut memwall_session,
    buf: *mut c_char,
    cap: usize,
) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            let s = unsafe { obj(session, "session") }?;
            let inner = lock(s)?;
            let all = inner.fallbacks();
            if !buf.is_null() && cap > 0 {
                let msg = all.last().map(|f| f.to_string()).unwrap_or_default();
                // Cut at a character boundary, leaving room for the NUL.
                let mut n = msg.len().min(cap - 1);
                while !msg.is_char_boundary(n) {
                    n -= 1;
                }
                // SAFETY: `buf` has `cap` > n writable bytes by the contract.
                unsafe {
                    std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
                    *buf.add(n) = 0;
                }
            }
            i32::try_from(all.len())
                .map_err(|_| CError::new(guard::ERR_INTERNAL, "too many fallbacks"))
        },
    )
}

/// Stops the generation running on `session` (from any thread) before its next token or
/// prompt batch; it returns MEMWALL_STOP_CANCELLED. Each `memwall_generate` clears the flag
/// when it starts.
///
/// # Safety
/// `session` is a live session.
#[no_mangle]
pub unsafe extern "C" fn memwall_cancel(session: *const memwall_session) -> i32 {
    guard(
        |code| code,
        || {
            // SAFETY: the function's contract.
            unsafe { obj(session, "session") }?.cancel.cancel();
            Ok(guard::OK)
        },
    )
}
