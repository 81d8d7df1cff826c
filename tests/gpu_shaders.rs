//! Every composed WGSL kernel variant parses and validates with naga (no GPU needed), and the
//! registry lists every variant.

use std::collections::HashSet;

use memwall::gpu::registry::{kv_type_pairs, KernelKey, MatvecOut, WeightFormat};
use memwall::kv_type::KvType;
use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, ValidationFlags, Validator};

/// Validates `key`'s module with exactly the capabilities it may rely on: the portable
/// variants get neither SUBGROUP nor SHADER_FLOAT16 (as wgpu's GL backend on llvmpipe), so a
/// stray subgroup or native-f16 use in them fails here.
fn validate(key: &KernelKey, caps: Capabilities) -> Result<(), String> {
    let src = key.source();
    let module = naga::front::wgsl::parse_str(&src)
        .map_err(|e| format!("{}: parse:\n{}", key.label(), e.emit_to_string(&src)))?;
    let mut v = Validator::new(ValidationFlags::all(), caps);
    if caps.contains(Capabilities::SUBGROUP) {
        v.subgroup_stages(ShaderStages::COMPUTE);
        v.subgroup_operations(SubgroupOperationSet::all());
    }
    v.validate(&module)
        .map_err(|e| format!("{}: validate:\n{}", key.label(), e.emit_to_string(&src)))?;
    let entry: Vec<&str> = module
        .entry_points
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    if entry != ["main"] {
        return Err(format!(
            "{}: entry points {entry:?}, want [main]",
            key.label()
        ));
    }
    Ok(())
}

/// `unpack2x16float` needs naga's SHADER_FLOAT16_IN_FLOAT32, which wgpu grants from the
/// downlevel flag SHADER_F16_IN_F32 (WebGPU baseline, GL 4.2+/GLES 3.0+, Vulkan): it is not
/// the optional `SHADER_F16` feature.
const BASELINE: Capabilities = Capabilities::SHADER_FLOAT16_IN_FLOAT32;

fn caps_for(key: &KernelKey) -> Capabilities {
    let mut caps = BASELINE;
    if key.uses_subgroups() {
        caps |= Capabilities::SUBGROUP;
    }
    if key.uses_f16() {
        // What wgpu grants for the SHADER_F16 feature.
        caps |= Capabilities::SHADER_FLOAT16;
    }
    caps
}

#[test]
fn every_kernel_variant_validates() {
    let mut failures = Vec::new();
    for key in KernelKey::all() {
        if let Err(e) = validate(&key, caps_for(&key)) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn f16_variants_need_the_f16_capability_and_enable_it_first() {
    let f16_keys: Vec<KernelKey> = KernelKey::all()
        .into_iter()
        .filter(|k| k.uses_f16())
        .collect();
    // Matvec and embedding, each over Q4_0, Q4_1, Q8_0 and F16 (matvec for both reductions).
    assert_eq!(f16_keys.len(), 12);
    for key in &f16_keys {
        let caps = caps_for(key) - Capabilities::SHADER_FLOAT16;
        assert!(
            validate(key, caps).is_err(),
            "{} validated without SHADER_FLOAT16",
            key.label()
        );
        assert_eq!(
            key.source().lines().next(),
            Some("enable f16;"),
            "{}: `enable f16;` must be the module's first line",
            key.label()
        );
    }
    // The portable variants never mention f16 arithmetic.
    for key in KernelKey::all().iter().filter(|k| !k.uses_f16()) {
        assert!(!key.source().contains("enable f16"), "{}", key.label());
    }
}

#[test]
fn subgroup_variants_need_the_subgroup_capability() {
    // Guards the test above: if the validator ignored capabilities, a subgroup variant would
    // pass on the portable settings too.
    for key in KernelKey::all().iter().filter(|k| k.uses_subgroups()) {
        assert!(
            validate(key, BASELINE).is_err(),
            "{} validated without SUBGROUP",
            key.label()
        );
    }
}

#[test]
fn all_lists_every_variant_once() {
    let all = KernelKey::all();
    let set: HashSet<KernelKey> = all.iter().copied().collect();
    assert_eq!(set.len(), all.len(), "duplicate keys in KernelKey::all()");
    // WeightFormat::ALL is exhaustive: this match stops compiling when a format is added.
    for ty in WeightFormat::ALL {
        match ty {
            WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q8_0
            | WeightFormat::Q4_K
            | WeightFormat::Q6_K
            | WeightFormat::F16
            | WeightFormat::F32 => {}
        }
        assert_eq!(WeightFormat::from_ggml(ty.ggml()), Some(ty));
    }
    assert_eq!(
        WeightFormat::ALL.iter().collect::<HashSet<_>>().len(),
        7,
        "WeightFormat::ALL lists every format once"
    );
    let mut want = HashSet::new();
    // Native-f16 decoding exists for every format but F32 (nothing to decode).
    let f16_formats = [
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::F16,
    ];
    for ty in WeightFormat::ALL {
        assert_eq!(ty.has_f16_variant(), f16_formats.contains(&ty), "{ty:?}");
    }
    for subgroup in [false, true] {
        for ty in WeightFormat::ALL {
            want.insert(KernelKey::Matvec {
                ty,
                subgroup,
                f16: false,
            });
        }
        for ty in f16_formats {
            want.insert(KernelKey::Matvec {
                ty,
                subgroup,
                f16: true,
            });
        }
        // The integer path exists exactly for the formats the CPU multiplies in integers.
        let integer = [
            WeightFormat::Q4_0,
            WeightFormat::Q4_1,
            WeightFormat::Q8_0,
            WeightFormat::Q4_K,
            WeightFormat::Q6_K,
        ];
        for ty in integer {
            want.insert(KernelKey::MatvecQ8 { ty, subgroup });
            if !subgroup {
                want.insert(KernelKey::MatvecQ8Rows { ty });
            }
            // The fused output modes of the integer path, in both layouts.
            for out in [MatvecOut::Add, MatvecOut::Split2, MatvecOut::Split3] {
                want.insert(KernelKey::MatvecQ8Out { ty, subgroup, out });
                if !subgroup {
                    want.insert(KernelKey::MatvecQ8RowsOut { ty, out });
                }
            }
            // The prefill twin of the row layout, in every output mode, with plain loads and
            // with subgroup broadcasts.
            for out in [
                None,
                Some(MatvecOut::Add),
                Some(MatvecOut::Split2),
                Some(MatvecOut::Split3),
            ] {
                want.insert(KernelKey::MatmulQ8Rows { ty, out, subgroup });
            }
        }
        want.insert(KernelKey::RmsNorm { subgroup });
        want.insert(KernelKey::RmsNormQuant { subgroup });
        want.insert(KernelKey::Softmax { subgroup });
        for kv in kv_type_pairs() {
            want.insert(KernelKey::AttentionSplit { subgroup, kv });
        }
        want.insert(KernelKey::AttentionCombine { subgroup });
    }
    // Kernels with no reduction choice: one variant each, compiled by every context.
    for key in [
        KernelKey::Rope,
        KernelKey::Swiglu,
        KernelKey::Add,
        KernelKey::AddBias,
        KernelKey::Argmax,
        KernelKey::QuantizeAct,
        KernelKey::BandwidthProbe,
        KernelKey::SwigluQuant,
    ] {
        assert!(!key.has_reduction_choice() && !key.uses_subgroups());
        want.insert(key);
    }
    // The KV cache kernels: a store per cache type, prefill per (K, V) type pair.
    let kv_keys = KvType::ALL
        .map(|ty| KernelKey::KvStore { ty })
        .into_iter()
        .chain(kv_type_pairs().map(|kv| KernelKey::AttentionPrefill { kv }));
    for key in kv_keys {
        assert!(!key.has_reduction_choice() && !key.uses_subgroups());
        want.insert(key);
    }
    // The prefill lanes variant: subgroups always, compiled by the contexts that choose it
    // (memwall::gpu::health::layouts::AdapterFacts::keys).
    for kv in kv_type_pairs() {
        let key = KernelKey::AttentionPrefillLanes { kv };
        assert!(!key.has_reduction_choice() && key.uses_subgroups());
        want.insert(key);
    }
    for ty in WeightFormat::ALL {
        for key in [KernelKey::Matmul { ty }, KernelKey::MatvecRows { ty }] {
            assert!(!key.has_reduction_choice() && !key.uses_subgroups());
            want.insert(key);
        }
        want.insert(KernelKey::Embedding { ty, f16: false });
    }
    for ty in f16_formats {
        want.insert(KernelKey::Embedding { ty, f16: true });
    }
    // The mixture-of-experts kernels: no reduction; the experts' f32 matvec per weight format
    // and their 8-bit kernel per format with an integer path.
    let moe_keys = WeightFormat::ALL
        .into_iter()
        .flat_map(|ty| {
            let q8 = ty
                .has_q8_path()
                .then_some(KernelKey::MatvecExperts { ty, q8: true });
            [Some(KernelKey::MatvecExperts { ty, q8: false }), q8]
        })
        .flatten()
        .chain([KernelKey::MoeRoute, KernelKey::MoeCombine]);
    for key in moe_keys {
        assert!(!key.has_reduction_choice() && !key.uses_subgroups() && key.is_moe());
        want.insert(key);
    }
    // Every key in `all()` is one of the enum's variants (exhaustive match), and every
    // variant/format/reduction combination is in `all()`.
    for key in &all {
        match key {
            KernelKey::Matvec { .. }
            | KernelKey::RmsNorm { .. }
            | KernelKey::Softmax { .. }
            | KernelKey::Rope
            | KernelKey::Swiglu
            | KernelKey::Add
            | KernelKey::AddBias
            | KernelKey::Argmax
            | KernelKey::Embedding { .. }
            | KernelKey::KvStore { .. }
            | KernelKey::AttentionSplit { .. }
            | KernelKey::AttentionCombine { .. }
            | KernelKey::AttentionPrefill { .. }
            | KernelKey::AttentionPrefillLanes { .. }
            | KernelKey::Matmul { .. }
            | KernelKey::MatvecRows { .. }
            | KernelKey::QuantizeAct
            | KernelKey::MatvecQ8 { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatvecQ8Out { .. }
            | KernelKey::MatvecQ8RowsOut { .. }
            | KernelKey::MatmulQ8Rows { .. }
            | KernelKey::RmsNormQuant { .. }
            | KernelKey::SwigluQuant
            | KernelKey::MoeRoute
            | KernelKey::MatvecExperts { .. }
            | KernelKey::MoeCombine
            | KernelKey::BandwidthProbe => {}
        }
    }
    assert_eq!(set, want);
    // Labels name pipelines and failures: they must be distinct.
    let labels: HashSet<String> = all.iter().map(|k| k.label()).collect();
    assert_eq!(labels.len(), all.len());
}

/// Every attention kernel composes `struct AttentionParams` from one fragment: its members
/// are the Rust twin's fields, in order, at the Rust offsets, and its size is the Rust size
/// (the host writes the Rust struct's bytes into the kernel's uniform).
#[test]
fn attention_params_match_the_rust_struct() {
    use memwall::gpu::registry::AttentionParams as P;
    use std::mem::{offset_of, size_of};
    // (name, offset) of each Rust field, in declaration order.
    macro_rules! fields {
        ($($f:ident),*) => { [$((stringify!($f), offset_of!(P, $f))),*] };
    }
    let want = fields!(
        n_tokens, n_head, n_head_kv, head_dim, pos0, n_chunks, tile_q, tile_k, scale, groups_x,
        quant, window, softcap, pad0, pad1, pad2
    );
    let attention = KernelKey::all().into_iter().filter(|k| {
        matches!(
            k,
            KernelKey::AttentionSplit { .. }
                | KernelKey::AttentionCombine { .. }
                | KernelKey::AttentionPrefill { .. }
                | KernelKey::AttentionPrefillLanes { .. }
        )
    });
    let mut n = 0;
    for key in attention {
        let module = naga::front::wgsl::parse_str(&key.source()).unwrap();
        let (members, span) = module
            .types
            .iter()
            .find_map(|(_, t)| match (&t.name, &t.inner) {
                (Some(name), naga::TypeInner::Struct { members, span })
                    if name == "AttentionParams" =>
                {
                    Some((members, *span))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no struct AttentionParams", key.label()));
        let got: Vec<(&str, usize)> = members
            .iter()
            .map(|m| (m.name.as_deref().unwrap_or("?"), m.offset as usize))
            .collect();
        assert_eq!(got, want, "{}", key.label());
        assert_eq!(span as usize, size_of::<P>(), "{}", key.label());
        n += 1;
    }
    // Split and combine in both reductions, prefill and lanes per cache type pair.
    assert_eq!(
        n,
        2 * (kv_type_pairs().count() + 1) + 2 * kv_type_pairs().count()
    );
}
