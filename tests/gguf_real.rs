//! The reader, `check` and `inspect` on files written by other tools: the test model (written
//! by llama.cpp's converter) and the gguf-py fixtures.

mod common;

use common::*;
use memwall::gguf::{Gguf, GgufError};
use memwall::tools::check::{check_file, scale_fields, Field};
use memwall::GgmlType;

#[test]
fn model_metadata_matches_smollm2_135m() {
    let g = Gguf::open(model_path()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let emb = g.require_tensor("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ty, emb.dims.as_slice()),
        (GgmlType::Q8_0, &[576u64, 49152][..])
    );
    assert_eq!(g.tensor_data(emb).len() as u64, 49152 * 576 / 32 * 34);
}

#[test]
fn model_passes_check_and_inspect() {
    let r = check_file(model_path());
    assert!(r.is_ok(), "{:?}", r.problems);
    assert_eq!(r.n_tensors, 272);
    let (code, text) = run_memwall(&["check".as_ref(), model_path().as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.starts_with("OK: 272 tensors, "), "{text}");
    let (code, text) = run_memwall(&["inspect".as_ref(), model_path().as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("llama.block_count = 30"), "{text}");
    assert!(text.contains("token_embd.weight"), "{text}");
    assert!(text.contains("total parameters: 134515008"), "{text}");
}

/// The fixtures' K-quant and IQ4_NL blocks are random bytes whose scale fields gguf-py set to
/// values in [0.001, 0.05]: reading every scale at the offsets in `scale_fields` and finding
/// them all in range checks the offset table against an independent writer.
#[test]
fn scale_offsets_match_gguf_py_fixtures() {
    let g = Gguf::open(shared_path("fixtures/quant_vectors.gguf")).unwrap();
    let mut checked = std::collections::BTreeSet::new();
    for t in g.tensors() {
        let random_blocks = matches!(
            t.ty,
            GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::IQ4_NL
        );
        if !random_blocks {
            continue;
        }
        let fields = scale_fields(t.ty).unwrap();
        for block in g.tensor_data(t).chunks_exact(t.ty.type_size()) {
            for &(name, off, enc) in fields {
                assert_eq!(enc, Field::Half);
                let v = half::f16::from_le_bytes([block[off], block[off + 1]]).to_f32();
                assert!((0.001..=0.05).contains(&v), "{} {name}@{off}: {v}", t.name);
            }
        }
        checked.insert(t.ty);
    }
    assert_eq!(checked.len(), 6, "{checked:?}");
    for f in [
        "fixtures/quant_vectors.gguf",
        "fixtures/quant_expected.gguf",
    ] {
        let r = check_file(shared_path(f));
        assert!(r.is_ok() && r.size_checked_only.is_empty(), "{f}: {r:?}");
    }
}

#[test]
fn every_scale_field_lies_inside_its_block() {
    for ty in GgmlType::ALL {
        for &(name, off, enc) in scale_fields(ty).unwrap_or(&[]) {
            let size = match enc {
                Field::Half => 2,
                Field::Single => 4,
                Field::E8M0 => 1,
            };
            assert!(off + size <= ty.type_size(), "{ty} {name}@{off}");
        }
    }
}

/// Cuts the model at many points (densely in the header, sparsely in the data): every cut
/// must be a truncation error, never a panic and never a success.
#[test]
fn truncated_model_never_panics() {
    let full = std::fs::read(model_path()).unwrap();
    let g = Gguf::from_bytes(full.clone()).unwrap();
    let header = g.data_offset() as usize;
    let mut points: Vec<usize> = (0..64).collect();
    points.extend((0..400).map(|i| 64 + i * (header - 64) / 400));
    points.extend((1..16).map(|i| header + i * (full.len() - header) / 16));
    points.push(full.len() - 1);
    for &n in &points {
        let e = match Gguf::from_bytes(full[..n].to_vec()) {
            Ok(_) => panic!("cut at {n} parsed"),
            Err(e) => e,
        };
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::LengthTooLarge { .. }
                    | GgufError::CountTooLarge { .. }
                    | GgufError::DataOutOfBounds { .. }
            ),
            "cut at {n}: {e:?}"
        );
    }
    for &n in &[3usize, 100, header / 2, header + 1000] {
        let p = temp_file(&format!("model-cut-{n}"), &full[..n]);
        let (code, text) = run_memwall(&["check".as_ref(), p.as_os_str()]);
        assert_eq!(code, Some(1), "cut at {n}: {text}");
        let named = ["truncated", "outside the file", "larger than", "cannot fit"]
            .iter()
            .any(|w| text.contains(w));
        assert!(named, "cut at {n}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}
