//! kernels-ref against gguf-py: every fixture tensor dequantizes to gguf-py's values, and our
//! quantizers lose no more than gguf-py's on the same data.

use std::collections::BTreeSet;
use std::path::PathBuf;

use kernels_ref::{can_quantize, dequantize_vec, quantize, GgmlType};
use memwall::gguf::{Gguf, TensorInfo};

#[path = "common/shared.rs"]
mod shared;

fn shared_dir() -> PathBuf {
    shared::shared()
}

fn open(name: &str) -> Gguf {
    let path = shared_dir().join("fixtures").join(name);
    Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32_tensor(g: &Gguf, t: &TensorInfo) -> Vec<f32> {
    assert_eq!(t.ty, GgmlType::F32, "{} is not F32", t.name);
    dequantize_vec(GgmlType::F32, g.tensor_data(t), t.n_elements as usize).unwrap()
}

fn rmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let s: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    (s / a.len() as f64).sqrt()
}

const LISTED: [GgmlType; 15] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::BF16,
    GgmlType::F16,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
];

#[test]
fn dequantize_matches_gguf_py() {
    let vectors = open("quant_vectors.gguf");
    let expected = open("quant_expected.gguf");
    let mut covered = BTreeSet::new();
    for t in vectors.tensors() {
        let want_t = expected
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from quant_expected.gguf", t.name));
        let want = f32_tensor(&expected, want_t);
        let got = dequantize_vec(t.ty, vectors.tensor_data(t), t.n_elements as usize)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(got.len(), want.len(), "{}", t.name);
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (worst, err) = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold(
                (0, 0.0f32),
                |(wi, we), (i, e)| if e > we { (i, e) } else { (wi, we) },
            );
        assert!(
            err <= 1e-6 * scale,
            "{} ({}): |diff| {err} at index {worst} (got {}, want {}) > 1e-6 * {scale}",
            t.name,
            t.ty,
            got[worst],
            want[worst]
        );
        eprintln!(
            "{:>16} {:>7}: max |diff| {err:e} (max |b| {scale})",
            t.name, t.ty
        );
        covered.insert(t.ty);
    }
    for ty in LISTED {
        assert!(covered.contains(&ty), "no fixture tensor of type {ty}");
    }
}

#[test]
fn quantizers_are_no_worse_than_gguf_py() {
    let vectors = open("quant_vectors.gguf");
    let expected = open("quant_expected.gguf");
    let mut covered = BTreeSet::new();
    for orig_t in expected.tensors() {
        let Some(name) = orig_t.name.strip_suffix(".orig") else {
            continue;
        };
        let qt = vectors
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing from quant_vectors.gguf"));
        let ty = qt.ty;
        if !can_quantize(ty) {
            continue;
        }
        let orig = f32_tensor(&expected, orig_t);
        let theirs = f32_tensor(&expected, expected.require_tensor(name).unwrap());
        let ours_bytes = quantize(ty, &orig).unwrap();
        let ours = dequantize_vec(ty, &ours_bytes, orig.len()).unwrap();
        let (e_ours, e_theirs) = (rmse(&ours, &orig), rmse(&theirs, &orig));
        let same_bytes = ours_bytes == vectors.tensor_data(qt);
        eprintln!(
            "{name:>16} {ty:>6}: rmse ours {e_ours:.6e} gguf-py {e_theirs:.6e} \
             (same bytes: {same_bytes})"
        );
        assert!(
            e_ours <= e_theirs * (1.0 + 1e-6),
            "{name}: our rmse {e_ours} > gguf-py's {e_theirs}"
        );
        // kernels-ref claims ggml's reference rounding rules, which gguf-py reproduces bit for
        // bit, so the blocks themselves must agree, not only their error.
        assert!(same_bytes, "{name}: {ty} blocks differ from gguf-py's");
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            // Float formats have one right answer: round to nearest even.
            assert_eq!(ours, theirs, "{name}: {ty} rounding differs from gguf-py");
            let again = quantize(ty, &ours).unwrap();
            assert_eq!(again, ours_bytes, "{name}: {ty} does not round-trip");
        }
        covered.insert(ty);
    }
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        assert!(
            covered.contains(&ty),
            "no .orig tensor of type {ty} was checked"
        );
    }
}

/// IQ4_XS, which the shared fixtures lack: random blocks and gguf-py 0.19.0's dequantization of
/// them, made by `scripts/gen-iq4xs-vectors.py` into `kernels-ref/tests/data/iq4_xs.gguf`.
#[test]
fn iq4_xs_dequantizes_as_gguf_py() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernels-ref/tests/data/iq4_xs.gguf");
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut n = 0;
    for t in g.tensors().iter().filter(|t| t.ty == GgmlType::IQ4_XS) {
        let want_t = g.tensor(&format!("{}.expected", t.name)).unwrap();
        let want = f32_tensor(&g, want_t);
        let got = dequantize_vec(t.ty, g.tensor_data(t), t.n_elements as usize).unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-6 * scale,
            "{}: max error {err} of {scale}",
            t.name
        );
        n += 1;
    }
    assert_eq!(n, 3, "IQ4_XS tensors in {}", path.display());
}
