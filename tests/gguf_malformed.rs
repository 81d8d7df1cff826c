//! Malformed GGUF files: each gives its specific error variant from the reader, and
//! `memwall check` (the real binary) exits 1 naming the problem, without a panic.

mod common;

use common::*;
use memwall::gguf::writer::{GgufWriter, Layout};
use memwall::gguf::{Gguf, GgufError, Value, ValueType, MAX_KEY_LEN, MAX_METADATA_BYTES};
use memwall::GgmlType;

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    want: fn(&GgufError) -> bool,
    /// What `check`'s output must contain.
    needle: &'static str,
}

fn base_bytes() -> (Vec<u8>, Layout) {
    base().to_bytes_with_layout()
}

fn cut(mut b: Vec<u8>, n: usize) -> Vec<u8> {
    b.truncate(n);
    b
}

fn patched(f: impl FnOnce(&mut Vec<u8>, &Layout)) -> Vec<u8> {
    let (mut b, l) = base_bytes();
    f(&mut b, &l);
    b
}

fn truncated_in(section: &str) -> impl Fn(&GgufError) -> bool + '_ {
    move |e| matches!(e, GgufError::Truncated { section: s, .. } if s.contains(section))
}

fn nested(depth: usize) -> Value {
    let mut v = Value::U8(1);
    let mut ty = ValueType::U8;
    for _ in 0..depth {
        v = Value::Array(ty, vec![v]);
        ty = ValueType::Array;
    }
    v
}

/// The cases. `want` is a plain fn so each case states its variant inline.
fn cases() -> Vec<Case> {
    let (b, l) = base_bytes();
    let kv3 = l.kvs[3];
    let t1 = l.tensors[1].clone();
    macro_rules! case {
        ($name:expr, $bytes:expr, $pat:pat, $needle:expr) => {
            Case {
                name: $name,
                bytes: $bytes,
                want: |e| matches!(e, $pat),
                needle: $needle,
            }
        };
    }
    use GgufError as E;
    vec![
        case!("empty", Vec::new(), E::Truncated { .. }, "magic"),
        case!(
            "magic_3_bytes",
            b[..3].to_vec(),
            E::Truncated { .. },
            "magic"
        ),
        case!(
            "bad_magic",
            patched(|b, _| b[3] = b'G'),
            E::BadMagic(_),
            "not a GGUF file"
        ),
        case!(
            "truncated_version",
            cut(b.clone(), 6),
            E::Truncated { .. },
            "version"
        ),
        case!(
            "version_1",
            patched(|b, l| put_u32(b, l.version_at, 1)),
            E::UnsupportedVersion(1),
            "version 1"
        ),
        case!(
            "version_4",
            patched(|b, l| put_u32(b, l.version_at, 4)),
            E::UnsupportedVersion(4),
            "version 4"
        ),
        case!(
            "big_endian",
            patched(|b, l| b[l.version_at..l.version_at + 4].copy_from_slice(&3u32.to_be_bytes())),
            E::BigEndian(_),
            "big-endian"
        ),
        case!(
            "truncated_tensor_count",
            cut(b.clone(), 12),
            E::Truncated { .. },
            "tensor count"
        ),
        case!(
            "truncated_kv_count",
            cut(b.clone(), 20),
            E::Truncated { .. },
            "metadata key count"
        ),
        case!(
            "kv_count_max",
            patched(|b, l| put_u64(b, l.n_kv_at, u64::MAX)),
            E::CountTooLarge { .. },
            "metadata key count"
        ),
        case!(
            "tensor_count_max",
            patched(|b, l| put_u64(b, l.n_tensors_at, u64::MAX)),
            E::CountTooLarge { .. },
            "tensor count"
        ),
        case!(
            "truncated_key_length",
            cut(b.clone(), kv3.key_len_at + 4),
            E::Truncated { .. },
            "metadata key #3"
        ),
        case!(
            "truncated_in_key",
            cut(b.clone(), kv3.key_at + 3),
            E::LengthTooLarge { .. },
            "metadata key #3"
        ),
        case!(
            "key_length_max",
            patched(|b, l| put_u64(b, l.kvs[3].key_len_at, u64::MAX)),
            E::LengthTooLarge { .. },
            "metadata key #3"
        ),
        case!(
            "key_not_utf8",
            patched(|b, l| b[l.kvs[1].key_at] = 0xff),
            E::InvalidUtf8 { .. },
            "UTF-8"
        ),
        case!(
            "truncated_value_type",
            cut(b.clone(), kv3.type_at + 2),
            E::Truncated { .. },
            "metadata type of \"test.strs\""
        ),
        case!(
            "truncated_scalar_value",
            cut(b.clone(), l.kvs[1].value_at + 3),
            E::Truncated { .. },
            "metadata value of \"test.u64\""
        ),
        case!(
            "bad_value_type",
            patched(|b, l| put_u32(b, l.kvs[1].type_at, 13)),
            E::UnknownValueType { ty: 13, .. },
            "unknown value type 13"
        ),
        case!(
            "string_length_max",
            patched(|b, l| put_u64(b, l.kvs[0].value_at, u64::MAX)),
            E::LengthTooLarge { .. },
            "general.architecture"
        ),
        case!(
            "string_length_past_end",
            patched(|b, l| put_u64(b, l.kvs[0].value_at, 1 << 20)),
            E::LengthTooLarge { .. },
            "general.architecture"
        ),
        case!(
            "array_count_max",
            patched(|b, l| put_u64(b, l.kvs[2].value_at + 4, u64::MAX)),
            E::CountTooLarge { .. },
            "test.arr"
        ),
        case!(
            "truncated_array_elements",
            cut(b.clone(), l.kvs[2].value_at + 12 + 6),
            E::CountTooLarge { .. },
            "test.arr"
        ),
        case!(
            "truncated_array_string",
            cut(b.clone(), kv3.value_at + 12 + 9),
            E::CountTooLarge { .. },
            "test.strs"
        ),
        case!(
            "array_string_length_past_end",
            patched(|b, l| put_u64(b, l.kvs[3].value_at + 12, 1000)),
            E::LengthTooLarge { .. },
            "test.strs"
        ),
        case!(
            "bad_array_element_type",
            patched(|b, l| put_u32(b, l.kvs[2].value_at, 77)),
            E::UnknownValueType { ty: 77, .. },
            "unknown value type 77"
        ),
        case!(
            "nested_too_deep",
            base().metadata("deep", nested(9)).to_bytes(),
            E::NestingTooDeep { .. },
            "nested deeper"
        ),
        case!(
            "duplicate_key",
            base().metadata("test.u64", Value::U64(8)).to_bytes(),
            E::DuplicateKey(_),
            "appears twice"
        ),
        case!(
            "key_too_long",
            base()
                .metadata("k".repeat(MAX_KEY_LEN as usize + 1), Value::U8(0))
                .to_bytes(),
            E::LimitExceeded { .. },
            "exceeds the limit"
        ),
        case!(
            "alignment_3",
            base().alignment(3).to_bytes(),
            E::BadAlignment(3),
            "general.alignment = 3"
        ),
        case!(
            "alignment_0",
            base().alignment(0).to_bytes(),
            E::BadAlignment(0),
            "general.alignment = 0"
        ),
        case!(
            "alignment_2_pow_31",
            base().alignment(1 << 31).to_bytes(),
            E::BadAlignment(_),
            "power of two"
        ),
        case!(
            "alignment_string",
            base()
                .metadata("general.alignment", Value::String("32".into()))
                .to_bytes(),
            E::WrongType { .. },
            "general.alignment"
        ),
        case!(
            "truncated_tensor_name_length",
            cut(b.clone(), t1.name_len_at + 4),
            E::Truncated { .. },
            "name of tensor #1"
        ),
        case!(
            "truncated_tensor_name",
            cut(b.clone(), t1.name_at + 2),
            E::LengthTooLarge { .. },
            "name of tensor #1"
        ),
        case!(
            "truncated_n_dims",
            cut(b.clone(), t1.n_dims_at + 2),
            E::Truncated { .. },
            "info of tensor \"norm\""
        ),
        case!(
            "truncated_dims",
            cut(b.clone(), t1.dims_at[0] + 5),
            E::Truncated { .. },
            "info of tensor \"norm\""
        ),
        case!(
            "truncated_tensor_type",
            cut(b.clone(), t1.type_at + 1),
            E::Truncated { .. },
            "info of tensor \"norm\""
        ),
        case!(
            "truncated_tensor_offset",
            cut(b.clone(), t1.offset_at + 7),
            E::Truncated { .. },
            "info of tensor \"norm\""
        ),
        case!(
            "tensor_name_not_utf8",
            patched(|b, l| b[l.tensors[0].name_at] = 0xc3),
            E::InvalidUtf8 { .. },
            "UTF-8"
        ),
        case!(
            "duplicate_tensor",
            base().tensor_f32("norm", &[1], &[0.0]).to_bytes(),
            E::DuplicateTensor(_),
            "tensor name \"norm\" appears twice"
        ),
        case!(
            "five_dims",
            base().tensor_f32("t5", &[1, 1, 1, 1, 1], &[0.0]).to_bytes(),
            E::TooManyDims { n: 5, .. },
            "5 dimensions"
        ),
        case!(
            "n_dims_max",
            patched(|b, l| put_u32(b, l.tensors[1].n_dims_at, u32::MAX)),
            E::TooManyDims { .. },
            "dimensions"
        ),
        case!(
            "unknown_tensor_type",
            patched(|b, l| put_u32(b, l.tensors[1].type_at, 4)),
            E::UnknownTensorType { id: 4, .. },
            "unknown tensor type id 4"
        ),
        case!(
            "tensor_type_max",
            patched(|b, l| put_u32(b, l.tensors[1].type_at, u32::MAX)),
            E::UnknownTensorType { .. },
            "unknown tensor type"
        ),
        case!(
            "dims_overflow",
            patched(|b, l| {
                put_u64(b, l.tensors[0].dims_at[0], 1 << 32);
                put_u64(b, l.tensors[0].dims_at[1], 1 << 32);
            }),
            E::DimOverflow { .. },
            "overflow"
        ),
        case!(
            "dim_negative_as_i64",
            patched(|b, l| {
                put_u64(b, l.tensors[0].dims_at[0], 0);
                put_u64(b, l.tensors[0].dims_at[1], 1 << 63);
            }),
            E::DimOverflow { .. },
            "overflow"
        ),
        case!(
            "row_not_block_multiple",
            patched(|b, l| {
                put_u64(b, l.tensors[0].dims_at[0], 48);
            }),
            E::RowNotBlockAligned {
                ne0: 48,
                block: 32,
                ..
            },
            "not a multiple of the Q4_0 block size"
        ),
        case!(
            "misaligned_offset",
            patched(|b, l| put_u64(b, l.tensors[1].offset_at, 8)),
            E::MisalignedOffset { offset: 8, .. },
            "not a multiple of the alignment"
        ),
        case!(
            "offset_past_end",
            patched(|b, l| put_u64(b, l.tensors[1].offset_at, 1 << 40)),
            E::DataOutOfBounds { .. },
            "outside the file"
        ),
        case!(
            "offset_overflows",
            patched(|b, l| put_u64(b, l.tensors[1].offset_at, u64::MAX - 31)),
            E::DataOutOfBounds { .. },
            "outside the file"
        ),
        case!(
            "data_truncated",
            cut(b.clone(), t1.data_at + 15),
            E::DataOutOfBounds { .. },
            "outside the file"
        ),
        case!(
            "data_section_missing",
            cut(b.clone(), l.header_end),
            E::DataOutOfBounds { .. },
            "outside the file"
        ),
        case!(
            "overlapping_tensors",
            patched(|b, l| put_u64(b, l.tensors[1].offset_at, 64)),
            E::Overlap { .. },
            "overlap"
        ),
        case!(
            "overlap_same_offset",
            patched(|b, l| put_u64(b, l.tensors[1].offset_at, 0)),
            E::Overlap { .. },
            "overlap"
        ),
    ]
}

#[test]
fn base_image_is_valid() {
    let w = base();
    w.validate().unwrap();
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.tensors().len(), 2);
    assert_eq!(g.metadata().len(), 4);
    assert!(memwall::tools::check::check_gguf(&g, "x".as_ref()).is_ok());
}

#[test]
fn each_malformed_image_gives_its_variant() {
    let cases = cases();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "case {} twice", c.name);
        match Gguf::from_bytes(c.bytes.clone()) {
            Ok(_) => panic!("{}: parsed without error", c.name),
            Err(e) => {
                assert!((c.want)(&e), "{}: unexpected error {e:?}", c.name);
                assert!(
                    e.to_string().contains(c.needle),
                    "{}: {e} lacks {:?}",
                    c.name,
                    c.needle
                );
            }
        }
    }
}

#[test]
fn check_binary_names_each_problem() {
    for c in cases() {
        let p = temp_file(&format!("malformed-{}", c.name), &c.bytes);
        assert_check_fails(&p, c.needle);
    }
}

#[test]
fn truncated_section_names_are_specific() {
    let (b, l) = base_bytes();
    let cases = [
        (cut(b.clone(), 2), "magic"),
        (cut(b.clone(), 5), "version"),
        (
            cut(b.clone(), l.kvs[1].value_at + 1),
            "metadata value of \"test.u64\"",
        ),
        (
            cut(b.clone(), l.tensors[1].n_dims_at + 1),
            "info of tensor \"norm\"",
        ),
    ];
    for (bytes, section) in cases {
        let e = Gguf::from_bytes(bytes).unwrap_err();
        assert!(truncated_in(section)(&e), "{section}: {e:?}");
    }
}

#[test]
fn metadata_decode_budget_bounds_memory() {
    // One element past the budget: a byte each in the file, a `Value` each decoded.
    let n = (MAX_METADATA_BYTES / std::mem::size_of::<Value>() as u64 + 1) as usize;
    let mut b = GgufWriter::new().to_bytes();
    b.truncate(24); // the header alone, without the writer's padding
    put_u64(&mut b, 16, 1); // one metadata pair
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&ValueType::Array.id().to_le_bytes());
    b.extend_from_slice(&ValueType::U8.id().to_le_bytes());
    b.extend_from_slice(&(n as u64).to_le_bytes());
    b.resize(b.len() + n, 7);
    let e = Gguf::from_bytes(b.clone()).unwrap_err();
    assert!(matches!(e, GgufError::LimitExceeded { .. }), "{e:?}");
    let p = temp_file("malformed-metadata-budget", &b);
    assert_check_fails(&p, "exceeds the limit");
}

#[test]
fn nesting_at_the_limit_is_accepted() {
    let w = base().metadata("deep", nested(memwall::gguf::MAX_ARRAY_DEPTH));
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.get("deep"), Some(&nested(memwall::gguf::MAX_ARRAY_DEPTH)));
}

#[test]
fn non_finite_scales_and_elements_are_reported() {
    use memwall::tools::check::{check_bytes, Problem};
    let nan16 = [0x00, 0x7e];
    let inf16 = [0x00, 0x7c];
    let mut q4_0 = q4_0_blocks(8);
    q4_0[3 * 18..3 * 18 + 2].copy_from_slice(&nan16);
    q4_0[6 * 18..6 * 18 + 2].copy_from_slice(&inf16);
    let mut q4_1 = vec![0u8; 2 * 20];
    q4_1[20 + 2..20 + 4].copy_from_slice(&nan16); // m of block 1
    let mut q2_k = vec![0u8; 3 * 84];
    q2_k[84 + 82..84 + 84].copy_from_slice(&inf16); // dmin of block 1
    let mut q6_k = vec![0u8; 210];
    q6_k[208..210].copy_from_slice(&nan16);
    let mut f32s: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    f32s[5 * 4..6 * 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let bf16 = [0u8, 0, 0x80, 0x7f]; // 0, +inf
    let mxfp4 = [[0x7fu8; 17], [0xff; 17]].concat();
    let w = GgufWriter::new()
        .tensor("q4_0", GgmlType::Q4_0, &[256], q4_0)
        .tensor("q4_1", GgmlType::Q4_1, &[64], q4_1)
        .tensor("q2_k", GgmlType::Q2_K, &[768], q2_k)
        .tensor("q6_k", GgmlType::Q6_K, &[256], q6_k)
        .tensor("f32", GgmlType::F32, &[8], f32s)
        .tensor("bf16", GgmlType::BF16, &[2], bf16.to_vec())
        .tensor("mxfp4", GgmlType::MXFP4, &[64], mxfp4)
        .tensor("iq1_m", GgmlType::IQ1_M, &[256], vec![0xffu8; 56]);
    let bytes = w.to_bytes();
    let r = check_bytes(bytes.clone());
    let scale = |t: &str, f: &'static str, first: u64, count: u64| Problem::NonFiniteScale {
        tensor: t.into(),
        field: f,
        first_block: first,
        count,
    };
    let elem = |t: &str, first: u64, count: u64| Problem::NonFiniteElement {
        tensor: t.into(),
        first_index: first,
        count,
    };
    assert_eq!(
        r.problems,
        vec![
            scale("q4_0", "d", 3, 2),
            scale("q4_1", "m", 1, 1),
            scale("q2_k", "dmin", 1, 1),
            scale("q6_k", "d", 0, 1),
            elem("f32", 5, 1),
            elem("bf16", 1, 1),
            scale("mxfp4", "e", 1, 1),
        ]
    );
    assert_eq!(r.size_checked_only, vec!["iq1_m".to_string()]);
    let p = temp_file("check-nan-scales", &bytes);
    assert_check_fails(
        &p,
        "scale field dmin is NaN or infinite in 1 block(s), first at block 1",
    );
    let (code, json) = run_memwall(&["check".as_ref(), "--json".as_ref(), p.as_os_str()]);
    assert_eq!(code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["problems"][0]["kind"], "non_finite_scale");
    assert_eq!(v["problems"][0]["first_block"], 3);
}

#[test]
fn missing_file_is_reported_not_panicked() {
    let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("does-not-exist.gguf");
    assert_check_fails(&p, "cannot open");
    let (code, text) = run_memwall(&["inspect".as_ref(), p.as_os_str()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot open") && !text.contains("panicked"),
        "{text}"
    );
}
