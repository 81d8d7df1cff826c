//! The shared data folder (`../shared`: reference outputs, quant fixtures, tokenizer vocabularies)
//! beside the repository, or beside the folder holding it. Used through `common`, or by
//! `#[path]` from tests that do not include `common`.
#![allow(dead_code)]

use std::path::PathBuf;

/// A file or folder under the shared data folder; panics (fails the test) naming what is
/// missing.
pub fn shared_path(rel: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for up in ["../shared", "../../shared"] {
        let p = root.join(up).join(rel);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "shared data {rel} not found beside {} (tried ../shared and ../../shared)",
        root.display()
    );
}

/// The shared data folder itself.
pub fn shared() -> PathBuf {
    shared_path("reference")
        .parent()
        .expect("reference has a parent")
        .to_path_buf()
}
