//! Kernel variants of one operation and the order to fall back through them when the
//! preferred one is unusable (failed its selftest on this adapter, or on the known-bad list):
//! `subgroupAdd` reductions fall back to workgroup-memory ones, native-f16 weight decoding to
//! `unpack2x16float`. Every variant of a chain takes the same bindings, parameters and grid, so
//! a [`crate::gpu::Kernels`] set can compile a fallback under the preferred key and nothing
//! that plans launches has to know.

use crate::gpu::registry::{KernelKey, WeightFormat};

/// `key` with workgroup-memory reductions (itself when it has no reduction choice).
pub fn without_subgroup(key: KernelKey) -> KernelKey {
    match key {
        KernelKey::Matvec { ty, f16, .. } => KernelKey::Matvec {
            ty,
            subgroup: false,
            f16,
        },
        KernelKey::MatvecQ8 { ty, .. } => KernelKey::MatvecQ8 {
            ty,
            subgroup: false,
        },
        KernelKey::MatvecQ8Out { ty, out, .. } => KernelKey::MatvecQ8Out {
            ty,
            subgroup: false,
            out,
        },
        KernelKey::RmsNorm { .. } => KernelKey::RmsNorm { subgroup: false },
        KernelKey::RmsNormQuant { .. } => KernelKey::RmsNormQuant { subgroup: false },
        KernelKey::Softmax { .. } => KernelKey::Softmax { subgroup: false },
        KernelKey::AttentionSplit { kv, .. } => KernelKey::AttentionSplit {
            subgroup: false,
            kv,
        },
        KernelKey::AttentionCombine { .. } => KernelKey::AttentionCombine { subgroup: false },
        KernelKey::MatmulQ8Rows { ty, out, .. } => KernelKey::MatmulQ8Rows {
            ty,
            out,
            subgroup: false,
        },
        other => other,
    }
}

/// `key` with the portable u32-packed weight decoding (itself when it has no f16 choice).
pub fn without_f16(key: KernelKey) -> KernelKey {
    match key {
        KernelKey::Matvec { ty, subgroup, .. } => KernelKey::Matvec {
            ty,
            subgroup,
            f16: false,
        },
        KernelKey::Embedding { ty, .. } => KernelKey::Embedding { ty, f16: false },
        other => other,
    }
}

/// The variants that can stand in for `key`, best first, starting with `key` itself: the same
/// operation without native f16, then without subgroups, then without either.
pub fn fallbacks(key: KernelKey) -> Vec<KernelKey> {
    let mut out = vec![key];
    for k in [
        without_f16(key),
        without_subgroup(key),
        without_f16(without_subgroup(key)),
    ] {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// The variant the selftest judges together with `key`, if any: the split attention's two
/// passes only have an oracle as a pair, so one is unusable when the other is.
pub fn partner(key: KernelKey) -> Option<KernelKey> {
    match key {
        KernelKey::AttentionSplit { subgroup, .. } => {
            Some(KernelKey::AttentionCombine { subgroup })
        }
        // The combine's own check runs it after the split over f32 caches.
        KernelKey::AttentionCombine { subgroup } => Some(KernelKey::AttentionSplit {
            subgroup,
            kv: crate::kv_type::KvTypes::F32,
        }),
        _ => None,
    }
}

/// The key the launch planner takes instead of `key` when `key` has no usable variant: a
/// kernel of the same result but another grid (so not in `key`'s [`fallbacks`] chain, whose
/// members are compiled under `key`). The prefill matmul falls back to the batched matvec.
pub fn launch_fallback(key: KernelKey) -> Option<KernelKey> {
    match key {
        KernelKey::MatmulQ8Rows { ty, out: None, .. } => Some(KernelKey::MatvecQ8Rows { ty }),
        KernelKey::MatmulQ8Rows {
            ty, out: Some(out), ..
        } => Some(KernelKey::MatvecQ8RowsOut { ty, out }),
        KernelKey::AttentionPrefillLanes { kv } => Some(KernelKey::AttentionPrefill { kv }),
        _ => None,
    }
}

/// The weight format a key decodes, for the keys specific to one.
pub fn weight_format(key: &KernelKey) -> Option<WeightFormat> {
    match *key {
        KernelKey::Matvec { ty, .. }
        | KernelKey::MatvecRows { ty }
        | KernelKey::Matmul { ty }
        | KernelKey::Embedding { ty, .. }
        | KernelKey::MatvecQ8 { ty, .. }
        | KernelKey::MatvecQ8Rows { ty }
        | KernelKey::MatvecQ8Out { ty, .. }
        | KernelKey::MatvecQ8RowsOut { ty, .. }
        | KernelKey::MatmulQ8Rows { ty, .. }
        | KernelKey::MatvecExperts { ty, .. } => Some(ty),
        KernelKey::RmsNorm { .. }
        | KernelKey::Rope
        | KernelKey::Swiglu
        | KernelKey::Add
        | KernelKey::AddBias
        | KernelKey::Softmax { .. }
        | KernelKey::Argmax
        | KernelKey::KvStore { .. }
        | KernelKey::AttentionSplit { .. }
        | KernelKey::AttentionCombine { .. }
        | KernelKey::AttentionPrefill { .. }
        | KernelKey::AttentionPrefillLanes { .. }
        | KernelKey::QuantizeAct
        | KernelKey::BandwidthProbe
        | KernelKey::RmsNormQuant { .. }
        | KernelKey::SwigluQuant
        | KernelKey::MoeRoute
        | KernelKey::MoeCombine => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_start_with_the_key_and_end_portable() {
        for key in KernelKey::all() {
            let chain = fallbacks(key);
            assert_eq!(chain[0], key);
            // A key without a portable variant has a portable launch fallback instead.
            let last = *chain.last().unwrap();
            let last = launch_fallback(last)
                .filter(|_| last.uses_subgroups())
                .unwrap_or(last);
            assert!(
                !last.uses_subgroups() && !last.uses_f16(),
                "{}",
                key.label()
            );
            // Every member is a real key (one `all()` lists).
            for k in &chain {
                assert!(KernelKey::all().contains(k), "{}", k.label());
            }
        }
    }
}
