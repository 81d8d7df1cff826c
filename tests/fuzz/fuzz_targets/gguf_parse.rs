//! cargo-fuzz target for the GGUF reader.
//!
//! Run (needs a nightly toolchain; `rustup toolchain list` shows one here):
//!   cargo install cargo-fuzz
//!   cd tests/fuzz && cargo +nightly fuzz run gguf_parse -- -max_total_time=300
//! Seed the corpus with a small valid image, for example the fixtures:
//!   mkdir -p corpus/gguf_parse && cp ../../../shared/fixtures/*.gguf corpus/gguf_parse/
//! On stable, `cargo check --manifest-path tests/fuzz/Cargo.toml` builds it, and
//! tests/gguf_fuzz_smoke.rs runs the same body on seeded mutations in `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../exercise.rs");

fuzz_target!(|data: &[u8]| exercise(data));
