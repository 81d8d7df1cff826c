//! Running the `memwall` binary and reading the fields of its `--json` reports: a missing or
//! mistyped field fails the test naming the field and the object it was looked up in.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs the real binary with `args`; its exit status and both streams.
pub fn memwall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .output()
        .expect("memwall binary runs")
}

/// `v[key]` as a number.
pub fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// `v[key]` as an unsigned integer.
pub fn int(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}

/// `v[key]` as a string.
pub fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}
