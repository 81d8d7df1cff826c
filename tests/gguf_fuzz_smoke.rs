//! A stable-toolchain stand-in for the cargo-fuzz target: the same `exercise` body on a few
//! thousand seeded mutations of valid images. It proves nothing about inputs it does not try,
//! but it runs in every `cargo test`.

mod common;
#[path = "fuzz/exercise.rs"]
mod exercise;

use common::*;
use memwall::gguf::{Gguf, Value, ValueType};
use memwall::GgmlType;

/// Values that hit edge cases when written over a count, length, type or offset.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    4,
    9,
    31,
    32,
    255,
    u32::MAX as u64,
    i64::MAX as u64,
    u64::MAX,
    1 << 40,
];

fn mutate(rng: &mut Rng, src: &[u8]) -> Vec<u8> {
    let mut b = src.to_vec();
    for _ in 0..1 + rng.below_usize(4) {
        if b.is_empty() {
            break;
        }
        let at = rng.below_usize(b.len());
        match rng.below_usize(6) {
            0 => b[at] ^= 1 << rng.below_usize(8),
            1 => b[at] = rng.next_u64() as u8,
            2 => {
                let v = INTERESTING[rng.below_usize(INTERESTING.len())].to_le_bytes();
                let w = [1, 2, 4, 8][rng.below_usize(4)];
                let end = (at + w).min(b.len());
                b[at..end].copy_from_slice(&v[..end - at]);
            }
            3 => b.truncate(at),
            4 => {
                let n = rng.below_usize(16);
                b.splice(at..at, (0..n).map(|_| rng.next_u64() as u8));
            }
            _ => {
                let end = (at + rng.below_usize(16)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

/// Seeds: the base image, one with every value type and nesting, one with many tensor types.
fn seeds() -> Vec<Vec<u8>> {
    let every = base()
        .version(2)
        .alignment(16)
        .metadata("i8", Value::I8(-1))
        .metadata("f64", Value::F64(1.5))
        .metadata("b", Value::Bool(true))
        .metadata(
            "nest",
            Value::Array(
                ValueType::Array,
                vec![Value::Array(ValueType::I16, vec![Value::I16(3)])],
            ),
        );
    let types = memwall::gguf::writer::GgufWriter::new()
        .tensor("q2k", GgmlType::Q2_K, &[256], vec![0u8; 84])
        .tensor("f16", GgmlType::F16, &[4], vec![0u8; 8])
        .tensor("bf16", GgmlType::BF16, &[2, 2], vec![0u8; 8])
        .tensor("q8", GgmlType::Q8_0, &[32, 2], vec![1u8; 68]);
    vec![base().to_bytes(), every.to_bytes(), types.to_bytes()]
}

#[test]
fn seeded_mutations_never_panic() {
    let seeds = seeds();
    for s in &seeds {
        Gguf::from_bytes(s.clone()).unwrap();
        exercise::exercise(s);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut parsed, n) = (0, 6000);
    for i in 0..n {
        let m = mutate(&mut rng, &seeds[i % seeds.len()]);
        if Gguf::from_bytes(m.clone()).is_ok() {
            parsed += 1;
        }
        exercise::exercise(&m);
    }
    // Both outcomes must be reached, or the mutations are not exercising the reader.
    assert!(
        parsed > n / 50 && parsed < n - n / 50,
        "{parsed} of {n} parsed"
    );
}
