//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod agreement;
pub mod json;
pub mod kv;
pub mod rng;
pub mod shared;

pub use rng::Rng;
#[allow(unused_imports)]
pub use shared::{shared, shared_path};

use std::path::PathBuf;
use std::process::Command;

use memwall::gguf::writer::GgufWriter;
use memwall::gguf::{Value, ValueType};
use memwall::GgmlType;

/// max |a - b| / max |b|: a difference relative to the range of the expected values (robust
/// to near-zero entries, as logits have). Fails on a length mismatch or a non-finite `a`.
pub fn rel_to_range(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite values");
    let range = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / range
}

/// The test model: `MEMWALL_MODEL`, else the cache path. Panics (fails the test) when missing.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("MEMWALL_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is not set");
            PathBuf::from(home).join(".cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(p.is_file(), "test model missing at {}", p.display());
    p
}

/// Gemma 3 270M Q4_K_M (`scripts/fetch-models.sh gemma3-270m`): `MEMWALL_GEMMA3`, else the
/// cache path. Panics (fails the test) when missing.
pub fn gemma3_path() -> PathBuf {
    let p = std::env::var_os("MEMWALL_GEMMA3")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is not set");
            PathBuf::from(home).join(".cache/memwall/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        p.is_file(),
        "Gemma 3 270M missing at {} (scripts/fetch-models.sh gemma3-270m fetches it; \
         MEMWALL_GEMMA3 names another path)",
        p.display()
    );
    p
}

/// The reference files made with llama.cpp for a real model other than the test model:
/// `tests/data/reference/<name>/`.
pub fn model_reference(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference")
        .join(name)
}

/// f16 bits of 1.0.
pub const F16_ONE: [u8; 2] = [0x00, 0x3c];

/// `n` Q4_0 blocks with scale 1.0 and nibbles 0..16.
pub fn q4_0_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for _ in 0..n {
        b.extend_from_slice(&F16_ONE);
        b.extend((0..16u8).map(|i| i | (15 - i) << 4));
    }
    b
}

/// A small valid image: four metadata pairs and two tensors.
/// kv0 general.architecture (string), kv1 test.u64, kv2 test.arr ([u32; 4]),
/// kv3 test.strs (["ab", "cd"]); t0 "blk.0.w" Q4_0 [64, 2], t1 "norm" F32 [4].
pub fn base() -> GgufWriter {
    GgufWriter::new()
        .metadata("general.architecture", Value::String("llama".into()))
        .metadata("test.u64", Value::U64(7))
        .metadata(
            "test.arr",
            Value::Array(ValueType::U32, (1..=4).map(Value::U32).collect()),
        )
        .metadata(
            "test.strs",
            Value::Array(
                ValueType::String,
                vec![Value::String("ab".into()), Value::String("cd".into())],
            ),
        )
        .tensor("blk.0.w", GgmlType::Q4_0, &[64, 2], q4_0_blocks(4))
        .tensor_f32("norm", &[4], &[1.0, 2.0, 3.0, 4.0])
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Writes `bytes` to a fresh temp file named after `name`.
pub fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gguf-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs the real binary; returns (exit code, stdout + stderr).
pub fn run_memwall(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .output()
        .expect("cannot run the memwall binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Runs `memwall check FILE` and asserts it fails cleanly, naming `needle`.
pub fn assert_check_fails(path: &std::path::Path, needle: &str) {
    let (code, text) = run_memwall(&["check".as_ref(), path.as_os_str()]);
    assert_eq!(
        code,
        Some(1),
        "{}: exit code {code:?}\n{text}",
        path.display()
    );
    assert!(
        !text.contains("panicked"),
        "{}: panic\n{text}",
        path.display()
    );
    assert!(
        text.contains(needle),
        "{}: output does not name {needle:?}\n{text}",
        path.display()
    );
}

#[allow(dead_code)]
mod reference;
#[allow(unused_imports)]
pub use reference::{reference_forward, rel_err};

#[allow(dead_code)]
mod kernels;
#[allow(unused_imports)]
pub use kernels::*;
