//! The launch layouts a [`Kernels`](crate::gpu::Kernels) set chooses from the adapter's facts,
//! decided here once: the set's flags ([`Kernels::matvec_rows`](crate::gpu::Kernels),
//! `attention_lanes`) and the key sets that compile and selftest the variants (start-up
//! [`health::needed_keys`](crate::gpu::health::needed_keys), `memwall selftest`) follow the
//! same answer, so no adapter compiles or tests a variant its sets never launch.

use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{KernelOptions, DEFAULT_WORKGROUP_SIZE};
use crate::gpu::shaders::{KernelKey, MAX_WORKGROUP_SIZE, MIN_SUBGROUP_BROADCAST};

/// What an adapter offers that decides the layouts (synthetic in unit tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterFacts {
    /// Device type "Cpu" (lavapipe, llvmpipe, SwiftShader): barriers and loads that every
    /// lane makes alike are expensive there.
    pub cpu_like: bool,
    /// The `SUBGROUP` feature.
    pub subgroups: bool,
    /// Smallest subgroup size the adapter reports (0 when unknown).
    pub subgroup_min_size: u32,
    /// The kernels' workgroup size (`override WG`).
    pub workgroup_size: u32,
}

impl AdapterFacts {
    pub fn of(ctx: &GpuContext) -> AdapterFacts {
        // Largest power of two within the device limit, the default and MAX_WG.
        let cap = DEFAULT_WORKGROUP_SIZE
            .min(MAX_WORKGROUP_SIZE)
            .min(ctx.limits.max_compute_invocations_per_workgroup)
            .min(ctx.limits.max_compute_workgroup_size_x)
            .max(1);
        AdapterFacts {
            cpu_like: ctx.info.device_type == "Cpu",
            subgroups: ctx.has_subgroups(),
            subgroup_min_size: ctx.info.subgroup_min_size,
            workgroup_size: 1u32 << (31 - cap.leading_zeros()),
        }
    }

    /// Matvec launches use the row layout (`MatvecRows`, `MatvecQ8Rows*`, `MatmulQ8Rows`):
    /// one invocation per row, no barrier (lavapipe runs a 64-wide workgroup as 8 SIMD passes
    /// and pays dearly for every barrier).
    pub fn matvec_rows(&self) -> bool {
        self.cpu_like
    }

    /// Prefill attention of 64-dim heads uses [`KernelKey::AttentionPrefillLanes`] in a set
    /// with `subgroup` reductions: CPU-like adapters whose subgroups (and workgroups) hold the
    /// 8 lanes it broadcasts from, where every lane reading the same workgroup element (the
    /// tiled kernel) is a loop over the lanes.
    pub fn attention_lanes(&self, subgroup: bool) -> bool {
        subgroup
            && self.subgroups
            && self.cpu_like
            && self.subgroup_min_size >= MIN_SUBGROUP_BROADCAST
            && self.workgroup_size >= MIN_SUBGROUP_BROADCAST
    }

    /// Whether a set with `subgroup` reductions on this adapter ever launches `key` by its
    /// own choice (tests may still force a layout on a set that compiled its key).
    pub fn launches(&self, subgroup: bool, key: &KernelKey) -> bool {
        match key {
            KernelKey::AttentionPrefillLanes { .. } => self.attention_lanes(subgroup),
            _ => true,
        }
    }

    /// Whether a set with `subgroup` reductions on this adapter launches `key` when no test
    /// forces the other matvec layout (`Kernels::matvec_rows`): the start-up set
    /// ([`health::needed_keys`](crate::gpu::health::needed_keys)) compiles and selftests
    /// only these. The other layout's keys stay deferred in every set (compiled on first
    /// use), so a start never pays for kernels its launch planner never picks.
    pub fn chooses(&self, subgroup: bool, key: &KernelKey) -> bool {
        self.launches(subgroup, key) && row_layout(key).is_none_or(|r| r == self.matvec_rows())
    }

    /// The keys a set with `opts` on this adapter compiles (before fallbacks), in
    /// [`KernelKey::all`]'s order.
    pub fn keys(&self, opts: KernelOptions) -> Vec<KernelKey> {
        KernelKey::all()
            .into_iter()
            .filter(|k| opts.compiles(k) && self.launches(opts.subgroup, k))
            .collect()
    }
}

/// Which matvec layout `key` belongs to: `Some(true)` for the row layouts (one invocation per
/// row, [`AdapterFacts::matvec_rows`]), `Some(false)` for the workgroup/subgroup reductions and
/// the f32 tiled matmul, `None` for kernels both layouts share.
pub fn row_layout(key: &KernelKey) -> Option<bool> {
    match key {
        KernelKey::MatvecRows { .. }
        | KernelKey::MatvecQ8Rows { .. }
        | KernelKey::MatvecQ8RowsOut { .. }
        | KernelKey::MatmulQ8Rows { .. } => Some(true),
        KernelKey::Matvec { .. }
        | KernelKey::Matmul { .. }
        | KernelKey::MatvecQ8 { .. }
        | KernelKey::MatvecQ8Out { .. } => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_type::KvTypes;

    const LAVAPIPE: AdapterFacts = AdapterFacts {
        cpu_like: true,
        subgroups: true,
        subgroup_min_size: 8,
        workgroup_size: 64,
    };

    fn lanes_keys(facts: AdapterFacts, subgroup: bool) -> usize {
        let opts = KernelOptions {
            subgroup,
            f16: false,
        };
        let keys = facts.keys(opts);
        // Everything else the options choose is there whatever the adapter.
        assert!(keys.contains(&KernelKey::AttentionPrefill { kv: KvTypes::F32 }));
        keys.iter()
            .filter(|k| matches!(k, KernelKey::AttentionPrefillLanes { .. }))
            .count()
    }

    #[test]
    fn only_cpu_like_adapters_with_wide_subgroups_get_the_lanes_attention() {
        let pairs = crate::gpu::shaders::kv_type_pairs().count();
        assert_eq!(lanes_keys(LAVAPIPE, true), pairs);
        assert!(LAVAPIPE.attention_lanes(true) && LAVAPIPE.matvec_rows());
        // The same adapter's workgroup-memory set never chooses it.
        assert_eq!(lanes_keys(LAVAPIPE, false), 0);
        let discrete = AdapterFacts {
            cpu_like: false,
            subgroup_min_size: 32,
            ..LAVAPIPE
        };
        assert_eq!(lanes_keys(discrete, true), 0);
        assert!(!discrete.matvec_rows());
        // llvmpipe on GL: no subgroups (it reports a size anyway).
        let gl = AdapterFacts {
            subgroups: false,
            ..LAVAPIPE
        };
        assert_eq!(lanes_keys(gl, false), 0);
        let narrow = AdapterFacts {
            subgroup_min_size: 4,
            ..LAVAPIPE
        };
        assert_eq!(lanes_keys(narrow, true), 0);
        let small_wg = AdapterFacts {
            workgroup_size: 4,
            ..LAVAPIPE
        };
        assert_eq!(lanes_keys(small_wg, true), 0);
    }

    #[test]
    fn a_start_needs_only_the_matvec_layout_the_adapter_chooses() {
        use crate::gpu::{health::needed_keys, WeightFormat};
        let opts = KernelOptions {
            subgroup: true,
            f16: false,
        };
        let formats = [WeightFormat::Q4_1].into_iter().collect();
        let kv = KvTypes::F32;
        let rows = |k: &KernelKey| row_layout(k) == Some(true);
        let workgroup = |k: &KernelKey| row_layout(k) == Some(false);
        let discrete = AdapterFacts {
            cpu_like: false,
            subgroup_min_size: 32,
            ..LAVAPIPE
        };
        for (facts, want_rows) in [(LAVAPIPE, true), (discrete, false)] {
            let needed = needed_keys(&facts, opts, &formats, kv);
            assert!(needed
                .iter()
                .any(|k| rows(k) == want_rows && workgroup(k) != want_rows));
            assert!(
                !needed
                    .iter()
                    .any(|k| if want_rows { workgroup(k) } else { rows(k) }),
                "{facts:?}: {needed:?}"
            );
            // The set itself keeps both layouts (the other deferred), so tests can force it.
            let keys = facts.keys(opts);
            assert!(keys.iter().any(rows) && keys.iter().any(workgroup));
        }
    }
}
