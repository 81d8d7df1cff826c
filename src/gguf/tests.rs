//! Success-path tests of the reader. Malformed inputs are in `tests/gguf_malformed.rs`.

use super::*;
use crate::gguf::writer::GgufWriter;

/// A header, written out by hand (not with the writer), so the reader is checked against the
/// format itself: v3, 1 tensor, 2 metadata pairs.
fn hand_image() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&2u64.to_le_bytes()); // metadata pairs
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(b"a");
    b.extend_from_slice(&4u32.to_le_bytes()); // u32
    b.extend_from_slice(&[0x04, 0x03, 0x02, 0x01]);
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(b"bc");
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&3u32.to_le_bytes()); // of i16
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&[0xff, 0xff, 0x07, 0x00]); // -1, 7
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(b"t");
    b.extend_from_slice(&2u32.to_le_bytes()); // n_dims
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // F16
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    assert_eq!(b.len(), 112);
    b.resize(128, 0xee); // padding to 32; the reader must not care what it holds
    b.extend_from_slice(&[0x00, 0x3c, 0x00, 0xc0]); // f16 1.0, -2.0
    b
}

#[test]
fn hand_written_image_parses() {
    let g = Gguf::from_bytes(hand_image()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get("a"), Some(&Value::U32(0x0102_0304)));
    assert_eq!(
        g.get("bc"),
        Some(&Value::Array(
            ValueType::I16,
            vec![Value::I16(-1), Value::I16(7)]
        ))
    );
    assert_eq!(g.data_offset(), 128);
    let t = g.require_tensor("t").unwrap();
    assert_eq!((t.dims.as_slice(), t.ty), (&[2u64, 1][..], GgmlType::F16));
    assert_eq!((t.n_elements, t.n_bytes, t.file_offset), (2, 4, 128));
    assert_eq!((t.ne0(), t.n_rows()), (2, 1));
    assert_eq!(g.tensor_data(t), &[0x00, 0x3c, 0x00, 0xc0]);
}

#[test]
fn writer_matches_hand_written_image() {
    let w = GgufWriter::new()
        .metadata("a", Value::U32(0x0102_0304))
        .metadata(
            "bc",
            Value::Array(ValueType::I16, vec![Value::I16(-1), Value::I16(7)]),
        )
        .tensor("t", GgmlType::F16, &[2, 1], vec![0x00, 0x3c, 0x00, 0xc0]);
    let mut want = hand_image();
    want[112..128].fill(0);
    want.resize(160, 0); // the writer pads the data section to the alignment too
    assert_eq!(w.to_bytes(), want);
}

/// One value of every type, including nested and empty arrays and odd strings.
fn every_value() -> Vec<(String, Value)> {
    use Value as V;
    let nested = V::Array(
        ValueType::Array,
        vec![
            V::Array(ValueType::U8, vec![V::U8(1), V::U8(2)]),
            V::Array(ValueType::U8, vec![]),
            V::Array(ValueType::U8, vec![V::U8(255)]),
        ],
    );
    let deep = V::Array(
        ValueType::Array,
        vec![V::Array(
            ValueType::Array,
            vec![V::Array(ValueType::String, vec![V::String("x".into())])],
        )],
    );
    let vals = vec![
        V::U8(200),
        V::I8(-100),
        V::U16(60_000),
        V::I16(-30_000),
        V::U32(4_000_000_000),
        V::I32(-2_000_000_000),
        V::F32(-1.25e-7),
        V::Bool(true),
        V::Bool(false),
        V::String(String::new()),
        V::String("héllo\n\u{1F600}".into()),
        V::U64(u64::MAX),
        V::I64(i64::MIN),
        V::F64(std::f64::consts::PI),
        V::F32(f32::INFINITY),
        V::Array(ValueType::F32, vec![V::F32(0.5), V::F32(-0.0)]),
        V::Array(
            ValueType::String,
            vec![V::String("a".into()), V::String("".into())],
        ),
        V::Array(ValueType::I64, vec![]),
        nested,
        deep,
    ];
    vals.into_iter()
        .enumerate()
        .map(|(i, v)| (format!("k.{i}.{}", v.value_type().name()), v))
        .collect()
}

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    for version in [2, 3] {
        let mut w = GgufWriter::new().version(version);
        for (k, v) in every_value() {
            w = w.metadata(k, v);
        }
        w.validate().unwrap();
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.metadata(), every_value().as_slice());
        for (k, v) in every_value() {
            assert_eq!(g.get(&k), Some(&v), "{k}");
        }
    }
}

#[test]
fn alignment_other_than_32_is_honoured() {
    for align in [1u32, 8, 64, 4096] {
        // Odd data lengths, so a tensor would land misaligned unless the padding is right.
        let a: Vec<u8> = (0..7u8).collect();
        let b: Vec<u8> = (100..103u8).collect();
        let w = GgufWriter::new()
            .alignment(align)
            .tensor("a", GgmlType::I8, &[7], a.clone())
            .tensor("b", GgmlType::I8, &[3], b.clone());
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        let align = u64::from(align);
        assert_eq!(g.alignment(), align);
        assert_eq!(g.data_offset() % align, 0);
        let (ta, tb) = (g.tensor("a").unwrap(), g.tensor("b").unwrap());
        assert_eq!(tb.offset, 7u64.div_ceil(align) * align);
        assert_eq!(tb.file_offset % align, 0);
        assert_eq!(g.tensor_data(ta), a.as_slice());
        assert_eq!(g.tensor_data(tb), b.as_slice());
    }
}

#[test]
fn tensor_data_is_zero_copy() {
    let data: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let w = GgufWriter::new().tensor("w", GgmlType::F32, &[16, 4], data.clone());
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    let t = g.tensor("w").unwrap();
    let d = g.tensor_data(t);
    assert_eq!(d, data.as_slice());
    let whole = g.bytes().as_ptr_range();
    assert!(
        whole.contains(&d.as_ptr()),
        "tensor data is not a view of the image"
    );
    assert_eq!(
        d.as_ptr() as usize - whole.start as usize,
        t.file_offset as usize
    );
}

#[test]
fn foreign_tensor_info_gives_empty_data_not_a_panic() {
    let g = Gguf::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    let t = TensorInfo {
        name: "x".into(),
        dims: vec![u64::MAX, u64::MAX],
        ty: GgmlType::F32,
        offset: 0,
        file_offset: u64::MAX - 1,
        n_elements: u64::MAX,
        n_bytes: u64::MAX,
    };
    assert_eq!(g.tensor_data(&t), &[] as &[u8]);
    assert!(matches!(
        g.try_tensor_data(&t),
        Err(GgufError::DataOutOfBounds { .. })
    ));
    assert_eq!(t.n_rows(), u64::MAX);
}

#[test]
fn typed_getters_convert_and_name_the_key_in_errors() {
    let w = GgufWriter::new()
        .metadata("u8", Value::U8(7))
        .metadata("big", Value::U64(1 << 40))
        .metadata("neg", Value::I32(-3))
        .metadata("f", Value::F64(0.25))
        .metadata("s", Value::String("llama".into()))
        .metadata("b", Value::Bool(true))
        .metadata(
            "toks",
            Value::Array(ValueType::String, vec![Value::String("<s>".into())]),
        )
        .metadata(
            "ints",
            Value::Array(ValueType::U16, vec![Value::U16(1), Value::U16(65535)]),
        )
        .metadata(
            "huge",
            Value::Array(ValueType::U64, vec![Value::U64(u64::MAX)]),
        );
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.get_u32("u8").unwrap(), 7);
    assert_eq!(g.get_u64("big").unwrap(), 1 << 40);
    assert_eq!(g.get_i64("neg").unwrap(), -3);
    assert_eq!(g.get_f32("f").unwrap(), 0.25);
    assert_eq!(g.get_f32("neg").unwrap(), -3.0);
    assert_eq!(g.get_str("s").unwrap(), "llama");
    assert!(g.get_bool("b").unwrap());
    assert_eq!(g.get_str_array("toks").unwrap(), vec!["<s>"]);
    assert_eq!(g.get_i64_array("ints").unwrap(), vec![1, 65535]);
    assert_eq!(g.get_f32_array("ints").unwrap(), vec![1.0, 65535.0]);
    assert_eq!(g.get_array("ints").unwrap().len(), 2);
    assert_eq!(g.opt("u8", Gguf::get_u32).unwrap(), Some(7));
    assert_eq!(g.opt("absent", Gguf::get_u32).unwrap(), None);

    let wrong = |r: Result<()>, key: &str| match r {
        Err(e @ GgufError::WrongType { .. }) => {
            assert!(e.to_string().contains(&format!("{key:?}")), "{e}");
        }
        other => panic!("{key}: expected WrongType, got {other:?}"),
    };
    wrong(g.get_u32("big").map(drop), "big");
    wrong(g.get_u32("neg").map(drop), "neg");
    wrong(g.get_u64("neg").map(drop), "neg");
    wrong(g.get_u32("s").map(drop), "s");
    wrong(g.get_str("u8").map(drop), "u8");
    wrong(g.get_bool("u8").map(drop), "u8");
    wrong(g.get_f32("s").map(drop), "s");
    wrong(g.get_array("s").map(drop), "s");
    wrong(g.get_str_array("ints").map(drop), "ints");
    wrong(g.get_f32_array("toks").map(drop), "toks");
    wrong(g.get_i64_array("huge").map(drop), "huge");
    wrong(g.opt("s", Gguf::get_u32).map(drop), "s");
    let e = g.get_str("nope").unwrap_err();
    assert_eq!(e, GgufError::MissingKey("nope".into()));
    assert!(e.to_string().contains("\"nope\""));
    let e = g.require_tensor("w.missing").unwrap_err();
    assert_eq!(e, GgufError::MissingTensor("w.missing".into()));
    assert!(e.to_string().contains("w.missing"));
}

#[test]
fn empty_and_scalar_tensors() {
    let w = GgufWriter::new()
        .tensor("scalar", GgmlType::F32, &[], 2.0f32.to_le_bytes())
        .tensor("empty", GgmlType::Q8_0, &[32, 0], Vec::new())
        .tensor("after", GgmlType::F32, &[1], 3.0f32.to_le_bytes());
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    let s = g.tensor("scalar").unwrap();
    assert_eq!((s.n_elements, s.n_bytes, s.ne0(), s.n_rows()), (1, 4, 1, 1));
    let e = g.tensor("empty").unwrap();
    assert_eq!((e.n_elements, e.n_bytes, e.n_rows()), (0, 0, 0));
    assert_eq!(g.tensor_data(e), &[] as &[u8]);
    assert_eq!(
        g.tensor_data(g.tensor("after").unwrap()),
        3.0f32.to_le_bytes()
    );
}

#[test]
fn split_rows_makes_views_of_the_same_bytes() {
    // [4 cols, 6 rows] of Q8_0-sized rows would need 32 columns; F16 keeps it small.
    let vals: Vec<u8> = (0..4 * 6 * 2).map(|i| i as u8).collect();
    let w = GgufWriter::new()
        .tensor("a", GgmlType::F32, &[2], vec![0; 8])
        .tensor("fused", GgmlType::F16, &[4, 6], vals.clone())
        .tensor_f32("b", &[3], &[1.0, 2.0, 3.0]);
    let mut g = Gguf::from_bytes(w.to_bytes()).unwrap();
    let parts = [
        ("q".to_string(), 3),
        ("k".to_string(), 2),
        ("v".to_string(), 1),
    ];
    g.split_rows("fused", &parts).unwrap();
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "q", "k", "v", "b"]);
    assert!(g.tensor("fused").is_none());
    let k = g.require_tensor("k").unwrap();
    assert_eq!(
        (k.dims.as_slice(), k.n_elements, k.n_bytes),
        (&[4u64, 2][..], 8, 16)
    );
    assert_eq!(g.tensor_data(k), &vals[24..40]);
    assert_eq!(g.tensor_data(g.require_tensor("v").unwrap()), &vals[40..48]);
    assert_eq!(g.require_tensor("b").unwrap().n_elements, 3);
    // 1-D: along the elements.
    g.split_rows("b", &[("b0".into(), 1), ("b1".into(), 2)])
        .unwrap();
    let b1 = g.require_tensor("b1").unwrap();
    assert_eq!(
        g.tensor_data(b1),
        &[2.0f32, 3.0].map(f32::to_le_bytes).concat()[..]
    );
    // Bad requests name the tensor and change nothing.
    let before = g.tensors().to_vec();
    for (name, parts) in [
        ("q", vec![("x".to_string(), 2)]),
        ("q", vec![("x".to_string(), 3), ("y".to_string(), 0)]),
        ("q", vec![("k".to_string(), 3)]),
        ("nope", vec![("x".to_string(), 1)]),
    ] {
        let e = g.split_rows(name, &parts).unwrap_err().to_string();
        assert!(e.contains(name), "{e}");
    }
    assert_eq!(g.tensors(), &before[..]);
    let w = GgufWriter::new().tensor("q8", GgmlType::Q8_0, &[64], vec![0; 68]);
    let mut g = Gguf::from_bytes(w.to_bytes()).unwrap();
    let e = g
        .split_rows("q8", &[("x".into(), 16), ("y".into(), 48)])
        .unwrap_err();
    assert!(e.to_string().contains("not whole Q8_0 blocks"), "{e}");
}
