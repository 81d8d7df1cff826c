//! The launch layouts a [`Kernels`](crate::gpu::Kernels) set chooses from the adapter's facts,
//! decided here once: the set's flags ([`Kernels::matvec_rows`](crate::gpu::Kernels),
//! `attention_lanes`) and the key sets that compile and selftest the variants (start-up
//! [`health::needed_keys`](crate::gpu::health::needed_keys), `memwall selftest`) follow the
//! same answer, so no adapter compiles or tests a variant its sets never launch.

use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{KernelOptions, DEFAULT_WORKGROUP_SIZE};
use crate::gpu::registry::{KernelKey, MAX_WORKGROUP_SIZE, MIN_SUBGROUP_BROADCAST};

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
    /// Threads that run a dispatch's workgroups on a CPU-like adapter (1 elsewhere): see
    /// [`cpu_worker_threads`].
    pub worker_threads: u32,
}

/// The threads llvmpipe (lavapipe, GL llvmpipe) hands a compute dispatch's workgroups to:
/// `LP_NUM_THREADS` when set, else one per CPU (Mesa's default; a dispatch takes as long as
/// its busiest thread). At least 1.
pub fn cpu_worker_threads() -> u32 {
    let lp = std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let n = lp.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
    });
    n.max(1)
}

/// How the integer register tiles (`shaders/matrix/tiles_q8.wgsl`) spread a matrix's rows over
/// workgroups: `stride` live invocations per workgroup (the rest return or skip their work),
/// chosen per launch so that the workgroups share out evenly over the adapter's worker
/// threads. (The decode matvec keeps full workgroups: balancing them gained nothing on
/// lavapipe.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowBalance {
    /// Worker threads ([`AdapterFacts::worker_threads`]); 0 (not a CPU adapter): keep full
    /// workgroups.
    pub threads: u32,
    /// Granularity of the live invocations: a SIMD pass of llvmpipe and a subgroup (the
    /// subgroup kernel broadcasts within one, so its lanes are all live or all dead).
    pub lanes: u32,
    /// The workgroup size (`WG`), the largest stride.
    pub workgroup_size: u32,
}

/// Set-up cost of a workgroup on llvmpipe, in SIMD passes of the kernel body: small; it only
/// breaks ties towards fewer workgroups.
const WORKGROUP_COST: f64 = 0.25;

impl RowBalance {
    /// Live invocations per workgroup for a launch of `rows` rows, `per_inv` rows `stride`
    /// apart per invocation (the matmul's 4): `workgroup_size` on a GPU, else the multiple of
    /// `lanes` whose workgroups give the busiest thread the fewest SIMD passes (llvmpipe hands
    /// workgroups to its threads one at a time; a pass whose lanes are all dead costs next to
    /// nothing, one with a live lane a whole pass). E.g. 576 rows of 4 per invocation on 2
    /// threads: 24 (6 workgroups of 96 rows, 3 passes each, 3 per thread) instead of 64 (3
    /// workgroups of 8 passes, the last with 1 live row in 4: one thread runs 2, the other
    /// 1); on 1 thread 48 (3 workgroups of 192 rows: 18 passes instead of 24).
    pub fn stride(&self, rows: u32, per_inv: u32) -> u32 {
        let wg = self.workgroup_size.max(1);
        let lanes = self.lanes.clamp(1, wg);
        if self.threads == 0 || rows == 0 || !wg.is_multiple_of(lanes) {
            return wg;
        }
        let threads = self.threads as usize;
        let mut best = (f64::INFINITY, wg);
        // Each thread's passes for the candidate stride (one buffer for all candidates).
        let mut load = vec![0.0f64; threads];
        // Largest stride first: a later one must be strictly better.
        for stride in (1..=wg / lanes).rev().map(|k| k * lanes) {
            let per_group = stride.saturating_mul(per_inv.max(1));
            let groups = rows.div_ceil(per_group);
            // Too many workgroups for a sensible schedule (and the cost loop).
            if groups > 4096 {
                continue;
            }
            load.fill(0.0);
            for g in 0..groups {
                let rem = rows - g * per_group;
                // Invocations with a row below `rows` (their subgroups' passes run).
                let live = rem.min(stride);
                let cost = f64::from(live.div_ceil(lanes)) + WORKGROUP_COST;
                // The next workgroup goes to the thread that is free first.
                if let Some(t) = load.iter_mut().min_by(|a, b| a.total_cmp(b)) {
                    *t += cost;
                }
            }
            let span = load.iter().copied().fold(0.0, f64::max);
            if span < best.0 - 1e-9 {
                best = (span, stride);
            }
        }
        best.1
    }
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
            worker_threads: if ctx.info.device_type == "Cpu" {
                cpu_worker_threads()
            } else {
                1
            },
        }
    }

    /// How the row-layout kernels spread rows over workgroups on this adapter.
    pub fn row_balance(&self) -> RowBalance {
        RowBalance {
            threads: if self.cpu_like {
                self.worker_threads
            } else {
                0
            },
            lanes: self.subgroup_min_size.max(MIN_SUBGROUP_BROADCAST),
            workgroup_size: self.workgroup_size,
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
        worker_threads: 2,
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
        let pairs = crate::gpu::registry::kv_type_pairs().count();
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
            let needed = needed_keys(&facts, opts, &formats, kv, false);
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

    #[test]
    fn row_strides_share_workgroups_evenly_over_threads() {
        let two = LAVAPIPE.row_balance();
        assert_eq!(two.threads, 2);
        // 576 rows (attention output, FFN down): 6 workgroups of 96 rows, not 3 of 256.
        assert_eq!(two.stride(576, 4), 24);
        // QKV (960 rows): 6 workgroups of 5 passes, not 4 of 8.
        assert_eq!(two.stride(960, 4), 40);
        // Already even: full workgroups (gate | up stacked, 12 workgroups).
        assert_eq!(two.stride(3072, 4), 64);
        // Every stride is a multiple of the lanes within the workgroup.
        for rows in [1, 7, 64, 255, 256, 576, 960, 1536, 49152] {
            for per_inv in [1, 4] {
                let s = two.stride(rows, per_inv);
                assert!(
                    s.is_multiple_of(8) && (8..=64).contains(&s),
                    "{rows} {per_inv}: {s}"
                );
            }
        }
        // One thread: no pass wasted on a partial workgroup's dead rows (3 workgroups of 192
        // rows: 18 passes, not 24).
        let one = RowBalance { threads: 1, ..two };
        assert_eq!(one.stride(576, 4), 48);
        assert_eq!(one.stride(3072, 4), 64);
        // A real GPU: today's full workgroups.
        let gpu = RowBalance { threads: 0, ..two };
        assert_eq!(gpu.stride(576, 4), 64);
        let discrete = AdapterFacts {
            cpu_like: false,
            ..LAVAPIPE
        };
        assert_eq!(discrete.row_balance().stride(576, 4), 64);
    }
}
