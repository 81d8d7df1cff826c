//! cargo-fuzz target for the GGUF reader.
//!
//! Run (needs a nightly toolchain; `rustup toolchain list` shows one here):
//!   cargo install cargo-fuzz
//!   (from the repository root)
//!   mkdir -p tests/fuzz/corpus/gguf_parse && cp ../shared/fixtures/*.gguf tests/fuzz/corpus/gguf_parse/
//!   cargo +nightly fuzz run --fuzz-dir tests/fuzz gguf_parse -- -max_total_time=300
//! On stable, `cargo check --manifest-path tests/fuzz/Cargo.toml` builds it, and
//! tests/gguf_fuzz_smoke.rs runs the same body on seeded mutations in `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../exercise.rs");

fuzz_target!(|data: &[u8]| exercise(data));
