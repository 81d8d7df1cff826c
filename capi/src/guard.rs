//! Status codes, the thread-local last error, and the guard every entry point runs in: no
//! panic and no Rust error crosses into C; both become a code and a message.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use memwall::Error;

/// The codes of include/memwall.h (`memwall_status`).
pub const OK: i32 = 0;
pub const ERR_INVALID_ARGUMENT: i32 = -1;
pub const ERR_IO: i32 = -2;
pub const ERR_FORMAT: i32 = -3;
pub const ERR_UNSUPPORTED: i32 = -4;
pub const ERR_CONTEXT_FULL: i32 = -5;
pub const ERR_OUT_OF_MEMORY: i32 = -6;
pub const ERR_GPU: i32 = -7;
pub const ERR_BUFFER_TOO_SMALL: i32 = -8;
pub const ERR_BUSY: i32 = -9;
pub const ERR_INTERNAL: i32 = -10;

/// An error on its way to C: the code and the message `memwall_last_error` returns.
pub struct CError {
    pub code: i32,
    pub msg: String,
}

impl CError {
    pub fn new(code: i32, msg: impl Into<String>) -> CError {
        CError {
            code,
            msg: msg.into(),
        }
    }
}

impl From<Error> for CError {
    fn from(e: Error) -> CError {
        let code = match &e {
            Error::Io { .. } => ERR_IO,
            Error::Gguf(_)
            | Error::Config(_)
            | Error::Tokenizer(_)
            | Error::ChatTemplate(_)
            | Error::Tensor { .. }
            | Error::PromptCache { .. } => ERR_FORMAT,
            Error::UnsupportedType { .. } => ERR_UNSUPPORTED,
            Error::ContextOverflow { .. } => ERR_CONTEXT_FULL,
            Error::OutOfMemory { .. } | Error::MemoryBudget { .. } => ERR_OUT_OF_MEMORY,
            Error::InvalidArgument(_) => ERR_INVALID_ARGUMENT,
            Error::Gpu(_) | Error::DeviceLost { .. } => ERR_GPU,
        };
        CError::new(code, e.to_string())
    }
}

thread_local! {
    /// The message of this thread's last failed call ("" after a successful one).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // A message with a NUL byte is cut there rather than lost.
    let msg = msg.split('\0').next().unwrap_or_default();
    let c = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// This thread's last error message; valid until this thread's next memwall call.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs an entry point's body: clears the last error, and turns an error or a panic into
/// `on_error(code)` with the message stored for `memwall_last_error`.
pub fn guard<T>(on_error: impl Fn(i32) -> T, body: impl FnOnce() -> Result<T, CError>) -> T {
    set_last_error("");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.msg);
            on_error(e.code)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_last_error(&format!("internal error (panic): {what}"));
            on_error(ERR_INTERNAL)
        }
    }
}

/// A required C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives the call.
pub unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, CError> {
    if p.is_null() {
        return Err(CError::new(ERR_INVALID_ARGUMENT, format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CError::new(ERR_INVALID_ARGUMENT, format!("{what} is not valid UTF-8")))
}

/// A required reference from a pointer.
///
/// # Safety
/// `p` is NULL or points to a live `T` that outlives the call.
pub unsafe fn obj<'a, T>(p: *const T, what: &str) -> Result<&'a T, CError> {
    // SAFETY: the caller's contract.
    unsafe { p.as_ref() }
        .ok_or_else(|| CError::new(ERR_INVALID_ARGUMENT, format!("{what} is NULL")))
}
