//! The kernel registry: every compute shader is named by a [`KernelKey`] and composed by
//! concatenating plain WGSL fragments from `shaders/` (no templating, no preprocessor). Each
//! fragment is ordinary WGSL; tunables are WGSL `override` constants set at pipeline creation.
//! The uniform parameter structs the kernels take are in [`crate::gpu::registry::params`].
//!
//! Composition order: reduction (`shaders/reduce/*.wgsl`: `override WG`, `fn wg_sum`), then the
//! weight format (`shaders/quant/*.wgsl`: weight bindings 0..1, `const QK`, `fn dq_block`; the
//! formats with an integer path also `fn dq_chunk`, preceded by `shaders/quant/chunk.wgsl`'s
//! `struct QChunk`), then the op (`shaders/<op>.wgsl`: its other bindings and the `main` entry
//! point). The matrix products are composed from one body per activation type
//! (`shaders/matrix/f32.wgsl`, `shaders/matrix/q8.wgsl`: the parameters, the bindings and
//! `fn row_partial`, a row's dot product with a token), a layout that owns `main` (how rows and
//! tokens spread over invocations: `reduce`, `subgroups`, `rows`, `tiles`, `tiles_q8` with a
//! `tile8/` entry point) and, for the 8-bit body, an output (`shaders/matrix/out/`). Native-f16 variants ([`KernelKey::uses_f16`]) use a `shaders/quant/f16/*.wgsl`
//! fragment instead, which starts with `enable f16;` and therefore goes first (a directive must
//! precede every declaration; WGSL declarations may come in any order).

pub mod params;

use kernels_ref::GgmlType;

use crate::kv_type::{KvType, KvTypes};

pub use crate::gpu::registry::params::*;

const REDUCE_WORKGROUP: &str = include_str!("../../../shaders/reduce/workgroup.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("../../../shaders/reduce/subgroup.wgsl");
// The formats with an integer path carry the shared `struct QChunk` (quant/chunk.wgsl) ahead of
// their fragment, since their `dq_chunk` names it: every module that includes them stays valid.
const QUANT_Q4_0: &str = concat!(
    include_str!("../../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/q4_0.wgsl")
);
const QUANT_Q4_1: &str = concat!(
    include_str!("../../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/q4_1.wgsl")
);
const QUANT_Q8_0: &str = concat!(
    include_str!("../../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/q8_0.wgsl")
);
const QUANT_Q4_K: &str = concat!(
    include_str!("../../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/q4_k.wgsl")
);
const QUANT_Q6_K: &str = concat!(
    include_str!("../../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/q6_k.wgsl")
);
const QUANT_F16: &str = include_str!("../../../shaders/quant/f16.wgsl");
const QUANT_F32: &str = include_str!("../../../shaders/quant/f32.wgsl");
const QUANT_Q4_0_F16: &str = include_str!("../../../shaders/quant/f16/q4_0.wgsl");
const QUANT_Q4_1_F16: &str = include_str!("../../../shaders/quant/f16/q4_1.wgsl");
const QUANT_Q8_0_F16: &str = include_str!("../../../shaders/quant/f16/q8_0.wgsl");
const QUANT_F16_F16: &str = include_str!("../../../shaders/quant/f16/f16.wgsl");
// The matrix products: one body per activation type (what a row's dot product with a token
// is), the layouts that spread rows and tokens over invocations, and the outputs.
const MATRIX_F32: &str = include_str!("../../../shaders/matrix/f32.wgsl");
const MATRIX_Q8: &str = include_str!("../../../shaders/matrix/q8.wgsl");
const MATRIX_REDUCE: &str = include_str!("../../../shaders/matrix/reduce.wgsl");
const MATRIX_SUBGROUPS: &str = include_str!("../../../shaders/matrix/subgroups.wgsl");
const MATRIX_ROWS: &str = include_str!("../../../shaders/matrix/rows.wgsl");
const MATRIX_TILES: &str = include_str!("../../../shaders/matrix/tiles.wgsl");
const MATRIX_TILES_Q8: &str = include_str!("../../../shaders/matrix/tiles_q8.wgsl");
const TILE8_DIRECT: &str = include_str!("../../../shaders/matrix/tile8/direct.wgsl");
const TILE8_LANES: &str = include_str!("../../../shaders/matrix/tile8/lanes.wgsl");
const LOAD_X4: &str = include_str!("../../../shaders/load_x4.wgsl");
// The 8-bit activations and a chunk's dot product with them (the matrix body's and the routed
// experts' kernels).
const Q8_ACT: &str = include_str!("../../../shaders/q8_act.wgsl");
const QUANTIZE_ACT: &str = include_str!("../../../shaders/quantize_act.wgsl");
const QUANTIZE_CHUNK: &str = include_str!("../../../shaders/quantize_chunk.wgsl");
const RMSNORM_QUANT: &str = include_str!("../../../shaders/rmsnorm_quant.wgsl");
const SWIGLU_QUANT: &str = include_str!("../../../shaders/swiglu_quant.wgsl");
const Q8_OUT_STORE: &str = include_str!("../../../shaders/matrix/out/store.wgsl");
const Q8_OUT_ADD: &str = include_str!("../../../shaders/matrix/out/add.wgsl");
const Q8_OUT_SPLIT2: &str = include_str!("../../../shaders/matrix/out/split2.wgsl");
const Q8_OUT_SPLIT3: &str = include_str!("../../../shaders/matrix/out/split3.wgsl");
const RMSNORM: &str = include_str!("../../../shaders/rmsnorm.wgsl");
const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
const SWIGLU: &str = include_str!("../../../shaders/swiglu.wgsl");
const ADD: &str = include_str!("../../../shaders/add.wgsl");
const ADD_BIAS: &str = include_str!("../../../shaders/add_bias.wgsl");
const SOFTMAX: &str = include_str!("../../../shaders/softmax.wgsl");
const ARGMAX: &str = include_str!("../../../shaders/argmax.wgsl");
const EMBEDDING: &str = include_str!("../../../shaders/embedding.wgsl");
const KV_STORE: &str = include_str!("../../../shaders/kv_store.wgsl");
// Head of every attention kernel: `struct AttentionParams` (the twin of params.rs's) and the
// shared constants.
const ATTENTION_PARAMS: &str = include_str!("../../../shaders/attention/params.wgsl");
// Bindings of the attention kernels that read the query and the caches (composed after
// ATTENTION_PARAMS, before KV_READ).
const ATTENTION_QKV: &str = include_str!("../../../shaders/attention/qkv.wgsl");
const KV_READ: &str = include_str!("../../../shaders/kv/read.wgsl");
const ATTENTION_SPLIT: &str = include_str!("../../../shaders/attention_split.wgsl");
const ATTENTION_COMBINE: &str = include_str!("../../../shaders/attention_combine.wgsl");
const ATTENTION_PREFILL: &str = include_str!("../../../shaders/attention_prefill.wgsl");
const ATTENTION_PREFILL_LANES: &str = include_str!("../../../shaders/attention_prefill_lanes.wgsl");
const BANDWIDTH: &str = include_str!("../../../shaders/bandwidth.wgsl");
const MOE_ROUTE: &str = include_str!("../../../shaders/moe_route.wgsl");
const EXPERTS_HEADER: &str = include_str!("../../../shaders/experts/header.wgsl");
const MATVEC_EXPERTS: &str = include_str!("../../../shaders/matvec_experts.wgsl");
const EXPERTS_Q8: &str = include_str!("../../../shaders/experts_q8.wgsl");
const MOE_COMBINE: &str = include_str!("../../../shaders/moe_combine.wgsl");

/// Largest workgroup size the reduction fragments' workgroup arrays hold (`MAX_WG` in WGSL).
pub const MAX_WORKGROUP_SIZE: u32 = 256;

/// Weight formats the GPU kernels read (each has a `shaders/quant/*.wgsl` fragment).
// Named as ggml names the types (Q4_K, not Q4K).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    Q4_0,
    Q4_1,
    Q8_0,
    /// 256-column super-blocks of 8 sub-blocks with 6-bit scales and mins (4.5 bits/weight).
    Q4_K,
    /// 256-column super-blocks of 16 sub-blocks with 8-bit scales (6.5625 bits/weight).
    Q6_K,
    F16,
    F32,
}

impl WeightFormat {
    /// Every format, in declaration order.
    pub const ALL: [WeightFormat; 7] = [
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4_K,
        WeightFormat::Q6_K,
        WeightFormat::F16,
        WeightFormat::F32,
    ];

    /// The GPU format for a ggml type, if there is one.
    pub fn from_ggml(ty: GgmlType) -> Option<WeightFormat> {
        match ty {
            GgmlType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlType::Q4_1 => Some(WeightFormat::Q4_1),
            GgmlType::Q8_0 => Some(WeightFormat::Q8_0),
            GgmlType::Q4_K => Some(WeightFormat::Q4_K),
            GgmlType::Q6_K => Some(WeightFormat::Q6_K),
            GgmlType::F16 => Some(WeightFormat::F16),
            GgmlType::F32 => Some(WeightFormat::F32),
            _ => None,
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            WeightFormat::Q4_0 => GgmlType::Q4_0,
            WeightFormat::Q4_1 => GgmlType::Q4_1,
            WeightFormat::Q8_0 => GgmlType::Q8_0,
            WeightFormat::Q4_K => GgmlType::Q4_K,
            WeightFormat::Q6_K => GgmlType::Q6_K,
            WeightFormat::F16 => GgmlType::F16,
            WeightFormat::F32 => GgmlType::F32,
        }
    }

    /// Whether the repacked matrix has a separate scale buffer (WGSL binding 1).
    pub fn has_scales(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4_0
                | WeightFormat::Q4_1
                | WeightFormat::Q8_0
                | WeightFormat::Q4_K
                | WeightFormat::Q6_K
        )
    }

    /// Whether the format's fragment has `dq_chunk`, the integer path of `KernelKey::MatvecQ8`
    /// (float weights keep the f32 matvec, as on the CPU).
    pub fn has_q8_path(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4_0
                | WeightFormat::Q4_1
                | WeightFormat::Q8_0
                | WeightFormat::Q4_K
                | WeightFormat::Q6_K
        )
    }

    fn fragment(self) -> &'static str {
        match self {
            WeightFormat::Q4_0 => QUANT_Q4_0,
            WeightFormat::Q4_1 => QUANT_Q4_1,
            WeightFormat::Q8_0 => QUANT_Q8_0,
            WeightFormat::Q4_K => QUANT_Q4_K,
            WeightFormat::Q6_K => QUANT_Q6_K,
            WeightFormat::F16 => QUANT_F16,
            WeightFormat::F32 => QUANT_F32,
        }
    }

    /// The native-f16 fragment (`shaders/quant/f16/*.wgsl`, first line `enable f16;`), for
    /// the formats that have one (F32 weights have nothing to decode in f16).
    fn f16_fragment(self) -> Option<&'static str> {
        match self {
            WeightFormat::Q4_0 => Some(QUANT_Q4_0_F16),
            WeightFormat::Q4_1 => Some(QUANT_Q4_1_F16),
            WeightFormat::Q8_0 => Some(QUANT_Q8_0_F16),
            WeightFormat::F16 => Some(QUANT_F16_F16),
            // K-quants: the u32-packed decode only, so far.
            WeightFormat::Q4_K | WeightFormat::Q6_K | WeightFormat::F32 => None,
        }
    }

    /// Whether kernels reading this format have a native-f16 variant.
    pub fn has_f16_variant(self) -> bool {
        self.f16_fragment().is_some()
    }
}

/// Where a fused integer matvec ([`KernelKey::MatvecQ8Out`], [`KernelKey::MatvecQ8RowsOut`])
/// puts its rows (`shaders/matrix/out/*.wgsl`; the plain keys store into one y).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatvecOut {
    /// y += W x: the residual add folded into the projection (y is read and written).
    Add,
    /// Two matrices stacked by rows (gate | up) into two outputs.
    Split2,
    /// Three matrices stacked by rows (Wq | Wk | Wv) into three outputs.
    Split3,
}

impl MatvecOut {
    pub const ALL: [MatvecOut; 3] = [MatvecOut::Add, MatvecOut::Split2, MatvecOut::Split3];

    /// Output buffers the launch binds (bindings 4, 6, 7).
    pub fn n_outputs(self) -> usize {
        match self {
            MatvecOut::Add => 1,
            MatvecOut::Split2 => 2,
            MatvecOut::Split3 => 3,
        }
    }

    /// "add", "split2" or "split3" (labels and selftest rows).
    pub fn name(self) -> &'static str {
        match self {
            MatvecOut::Add => "add",
            MatvecOut::Split2 => "split2",
            MatvecOut::Split3 => "split3",
        }
    }

    fn fragment(self) -> &'static str {
        match self {
            MatvecOut::Add => Q8_OUT_ADD,
            MatvecOut::Split2 => Q8_OUT_SPLIT2,
            MatvecOut::Split3 => Q8_OUT_SPLIT3,
        }
    }
}

/// Columns per `dq_block` call, for every format (`QK` in WGSL; a K-quant super-block of 256
/// columns is 8 calls).
pub const QK: u32 = 32;

/// Fewest invocations per subgroup the subgroup-broadcast kernels need
/// ([`KernelKey::min_subgroup_size`]): they broadcast lanes 0..8 of each subgroup.
pub const MIN_SUBGROUP_BROADCAST: u32 = 8;

/// One composed compute shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKey {
    /// The f32 body (`shaders/matrix/f32.wgsl`) in the row layout (`matrix/rows.wgsl`): one
    /// invocation per row, no reduction or barrier (for CPU-like adapters, where barriers are
    /// expensive).
    MatvecRows { ty: WeightFormat },
    /// The f32 body in workgroup-memory tiles (`matrix/tiles.wgsl`: the prefill matmul) over
    /// weights in `ty` (no reduction).
    Matmul { ty: WeightFormat },
    /// The f32 body in the reduction layout (`matrix/reduce.wgsl`) over weights in `ty`;
    /// `subgroup` picks `subgroupAdd` reduction;
    /// `f16` decodes the weights with native f16 arithmetic (needs `SHADER_F16`; only formats
    /// with [`WeightFormat::has_f16_variant`]).
    Matvec {
        ty: WeightFormat,
        subgroup: bool,
        f16: bool,
    },
    /// `shaders/rmsnorm.wgsl`; `subgroup` picks `subgroupAdd` reduction.
    RmsNorm { subgroup: bool },
    /// `shaders/rope.wgsl` (standalone: no reduction).
    Rope,
    /// `shaders/swiglu.wgsl` (standalone).
    Swiglu,
    /// `shaders/add.wgsl` (standalone).
    Add,
    /// `shaders/add_bias.wgsl`: a `[width]` bias added to every row (standalone).
    AddBias,
    /// `shaders/softmax.wgsl`; `subgroup` picks `subgroupAdd`/`subgroupMax` reductions.
    Softmax { subgroup: bool },
    /// `shaders/argmax.wgsl` (workgroup-memory reduction only).
    Argmax,
    /// `shaders/kv_store.wgsl`: appends keys or values to a layer's K or V cache of type `ty`,
    /// quantizing them (standalone).
    KvStore { ty: KvType },
    /// `shaders/attention_split.wgsl`: per-chunk partial attention (flash-decoding, pass 1);
    /// `subgroup` picks subgroup reductions; `kv` the caches' types (decoded in the loops by
    /// `shaders/kv/read.wgsl`).
    AttentionSplit { subgroup: bool, kv: KvTypes },
    /// `shaders/attention_combine.wgsl`: merges the chunks (flash-decoding, pass 2).
    AttentionCombine { subgroup: bool },
    /// `shaders/attention_prefill.wgsl`: tiled causal attention with online softmax
    /// (no reduction) over caches of types `kv`.
    AttentionPrefill { kv: KvTypes },
    /// `shaders/attention_prefill_lanes.wgsl`: `AttentionPrefill` for CPU-like adapters with
    /// subgroups of 8 or more (a query per invocation, keys shared by `subgroupBroadcast`;
    /// head_dim 64 only), with its own grid: `variants::launch_fallback` names the tiled one.
    AttentionPrefillLanes { kv: KvTypes },
    /// `shaders/embedding.wgsl`: rows of a table in `ty` to f32 (no reduction); `f16` as for
    /// `Matvec`.
    Embedding { ty: WeightFormat, f16: bool },
    /// `shaders/quantize_act.wgsl`: f32 activations to int8 chunks of 32 (no reduction).
    QuantizeAct,
    /// The 8-bit body (`shaders/matrix/q8.wgsl`) over weights in `ty` (one with
    /// `WeightFormat::has_q8_path`) and int8 activations, each row summed over the workgroup
    /// (`matrix/reduce.wgsl`); `subgroup`: each row summed by one subgroup
    /// (`matrix/subgroups.wgsl`), the same grid.
    MatvecQ8 { ty: WeightFormat, subgroup: bool },
    /// The 8-bit body in register tiles (`matrix/tiles_q8.wgsl` with `TILE` 4): 4 rows per
    /// invocation, tokens in tiles of 4 then one at a time, no reduction or barrier (the
    /// decode matvec of CPU-like adapters, as `MatvecRows`).
    MatvecQ8Rows { ty: WeightFormat },
    /// `shaders/bandwidth.wgsl`: the memory bandwidth probe of `memwall bench` (reads a large
    /// buffer, writes a partial sum per workgroup; workgroup-memory reduction only).
    BandwidthProbe,
    /// `MatvecQ8` writing its rows as `out` says (accumulate, or split across outputs).
    MatvecQ8Out {
        ty: WeightFormat,
        subgroup: bool,
        out: MatvecOut,
    },
    /// `MatvecQ8Rows` writing its rows as `out` says.
    MatvecQ8RowsOut { ty: WeightFormat, out: MatvecOut },
    /// `shaders/rmsnorm_quant.wgsl`: `RmsNorm` that also quantizes its output as `QuantizeAct`
    /// would; `subgroup` picks `subgroupAdd` reduction.
    RmsNormQuant { subgroup: bool },
    /// `shaders/swiglu_quant.wgsl`: `Swiglu` that also quantizes its result (standalone).
    SwigluQuant,
    /// The prefill twin of `MatvecQ8Rows` (`out`: `None` stores, else as `MatvecQ8RowsOut`):
    /// the same register tiles with `TILE` 8, 4 rows x 8 tokens per invocation
    /// (`matrix/tile8/direct.wgsl`); `subgroup`: the same result with each 8-token tile's
    /// activations loaded once per subgroup and broadcast (`matrix/tile8/lanes.wgsl`; needs
    /// `SUBGROUP` and subgroups of at least [`MIN_SUBGROUP_BROADCAST`] invocations).
    MatmulQ8Rows {
        ty: WeightFormat,
        out: Option<MatvecOut>,
        subgroup: bool,
    },
    /// `shaders/moe_route.wgsl`: each token's experts and their weights from its router
    /// logits (standalone).
    MoeRoute,
    /// `shaders/matvec_experts.wgsl`: the routed experts' matvecs over a stack of every
    /// expert's matrix in `ty`, the expert ids read on the GPU (no reduction), f32 inputs;
    /// `q8`: `shaders/experts_q8.wgsl`, the same products over 8-bit activations in the
    /// CPU's integer arithmetic, the pairs grouped by expert (a `ty` with an integer path).
    MatvecExperts { ty: WeightFormat, q8: bool },
    /// `shaders/moe_combine.wgsl`: the experts' outputs weighted and summed, plus the gated
    /// shared expert (standalone).
    MoeCombine,
}

impl KernelKey {
    /// Every kernel variant (the naga test validates each one).
    pub fn all() -> Vec<KernelKey> {
        let mut keys = Vec::new();
        for subgroup in [false, true] {
            for f16 in [false, true] {
                for ty in WeightFormat::ALL {
                    if !f16 || ty.has_f16_variant() {
                        keys.push(KernelKey::Matvec { ty, subgroup, f16 });
                    }
                }
            }
            for ty in WeightFormat::ALL {
                if ty.has_q8_path() {
                    keys.push(KernelKey::MatvecQ8 { ty, subgroup });
                    if !subgroup {
                        keys.push(KernelKey::MatvecQ8Rows { ty });
                    }
                    for out in MatvecOut::ALL {
                        keys.push(KernelKey::MatvecQ8Out { ty, subgroup, out });
                        if !subgroup {
                            keys.push(KernelKey::MatvecQ8RowsOut { ty, out });
                        }
                    }
                    for out in [None].into_iter().chain(MatvecOut::ALL.map(Some)) {
                        keys.push(KernelKey::MatmulQ8Rows { ty, out, subgroup });
                    }
                }
            }
            keys.push(KernelKey::RmsNorm { subgroup });
            keys.push(KernelKey::RmsNormQuant { subgroup });
            keys.push(KernelKey::Softmax { subgroup });
            for kv in kv_type_pairs() {
                keys.push(KernelKey::AttentionSplit { subgroup, kv });
            }
            keys.push(KernelKey::AttentionCombine { subgroup });
        }
        keys.extend([
            KernelKey::Rope,
            KernelKey::Swiglu,
            KernelKey::Add,
            KernelKey::AddBias,
            KernelKey::Argmax,
            KernelKey::QuantizeAct,
            KernelKey::BandwidthProbe,
            KernelKey::SwigluQuant,
        ]);
        keys.extend(KvType::ALL.map(|ty| KernelKey::KvStore { ty }));
        keys.extend(kv_type_pairs().map(|kv| KernelKey::AttentionPrefill { kv }));
        keys.extend(kv_type_pairs().map(|kv| KernelKey::AttentionPrefillLanes { kv }));
        for f16 in [false, true] {
            for ty in WeightFormat::ALL {
                if !f16 || ty.has_f16_variant() {
                    keys.push(KernelKey::Embedding { ty, f16 });
                }
            }
        }
        for ty in WeightFormat::ALL {
            keys.push(KernelKey::Matmul { ty });
            keys.push(KernelKey::MatvecRows { ty });
        }
        keys.push(KernelKey::MoeRoute);
        for ty in WeightFormat::ALL {
            keys.push(KernelKey::MatvecExperts { ty, q8: false });
            if ty.has_q8_path() {
                keys.push(KernelKey::MatvecExperts { ty, q8: true });
            }
        }
        keys.push(KernelKey::MoeCombine);
        keys
    }

    /// Whether only a mixture-of-experts block runs the kernel (a dense model never
    /// compiles or checks it).
    pub fn is_moe(&self) -> bool {
        matches!(
            self,
            KernelKey::MoeRoute | KernelKey::MatvecExperts { .. } | KernelKey::MoeCombine
        )
    }

    /// Whether the key comes in a u32-packed and a native-f16 variant (a context compiles one
    /// of the two).
    pub fn has_f16_choice(&self) -> bool {
        match *self {
            KernelKey::Matvec { ty, .. } | KernelKey::Embedding { ty, .. } => ty.has_f16_variant(),
            KernelKey::RmsNorm { .. }
            | KernelKey::Softmax { .. }
            | KernelKey::Rope
            | KernelKey::Swiglu
            | KernelKey::Add
            | KernelKey::AddBias
            | KernelKey::Argmax
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
            | KernelKey::BandwidthProbe => false,
        }
    }

    /// Whether the shader uses native f16 arithmetic (`enable f16;`: needs `SHADER_F16`).
    /// `f16: true` on a format without an f16 fragment (not in `all()`) composes the portable
    /// shader, so it does not count.
    pub fn uses_f16(&self) -> bool {
        match *self {
            KernelKey::Matvec { ty, f16, .. } | KernelKey::Embedding { ty, f16 } => {
                f16 && ty.has_f16_variant()
            }
            KernelKey::RmsNorm { .. }
            | KernelKey::Softmax { .. }
            | KernelKey::Rope
            | KernelKey::Swiglu
            | KernelKey::Add
            | KernelKey::AddBias
            | KernelKey::Argmax
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
            | KernelKey::BandwidthProbe => false,
        }
    }

    /// Whether the key comes in a workgroup-memory and a subgroup variant (a context compiles
    /// one of the two); keys without the choice are compiled by every context.
    pub fn has_reduction_choice(&self) -> bool {
        matches!(
            self,
            KernelKey::Matvec { .. }
                | KernelKey::RmsNorm { .. }
                | KernelKey::Softmax { .. }
                | KernelKey::AttentionSplit { .. }
                | KernelKey::AttentionCombine { .. }
                | KernelKey::MatvecQ8 { .. }
                | KernelKey::MatvecQ8Out { .. }
                | KernelKey::RmsNormQuant { .. }
                | KernelKey::MatmulQ8Rows { .. }
        )
    }

    /// Fewest invocations per subgroup the shader works with (0: any): the subgroup-broadcast
    /// kernels read lanes 0..[`MIN_SUBGROUP_BROADCAST`]; the `subgroupAdd` reductions work
    /// with any size.
    pub fn min_subgroup_size(&self) -> u32 {
        match *self {
            KernelKey::MatmulQ8Rows { subgroup: true, .. }
            | KernelKey::AttentionPrefillLanes { .. } => MIN_SUBGROUP_BROADCAST,
            _ => 0,
        }
    }

    /// Whether the shader needs the adapter's `SUBGROUP` feature.
    pub fn uses_subgroups(&self) -> bool {
        match *self {
            KernelKey::Matvec { subgroup, .. }
            | KernelKey::MatvecQ8 { subgroup, .. }
            | KernelKey::MatvecQ8Out { subgroup, .. }
            | KernelKey::RmsNorm { subgroup }
            | KernelKey::RmsNormQuant { subgroup }
            | KernelKey::Softmax { subgroup }
            | KernelKey::AttentionSplit { subgroup, .. }
            | KernelKey::AttentionCombine { subgroup }
            | KernelKey::MatmulQ8Rows { subgroup, .. } => subgroup,
            KernelKey::AttentionPrefillLanes { .. } => true,
            KernelKey::Rope
            | KernelKey::Swiglu
            | KernelKey::Add
            | KernelKey::AddBias
            | KernelKey::Argmax
            | KernelKey::Embedding { .. }
            | KernelKey::KvStore { .. }
            | KernelKey::AttentionPrefill { .. }
            | KernelKey::Matmul { .. }
            | KernelKey::MatvecRows { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatvecQ8RowsOut { .. }
            | KernelKey::SwigluQuant => false,
            KernelKey::QuantizeAct
            | KernelKey::BandwidthProbe
            | KernelKey::MoeRoute
            | KernelKey::MatvecExperts { .. }
            | KernelKey::MoeCombine => false,
        }
    }

    /// A label for pipelines and messages, e.g. `matvec_q4_0_sg_f16`.
    pub fn label(&self) -> String {
        let sg = if self.uses_subgroups() { "_sg" } else { "" };
        let h = if self.uses_f16() { "_f16" } else { "" };
        match *self {
            KernelKey::Matvec { ty, .. } => {
                format!("matvec_{}{sg}{h}", ty.ggml().name().to_lowercase())
            }
            KernelKey::Matmul { ty } => format!("matmul_{}", ty.ggml().name().to_lowercase()),
            KernelKey::MatvecRows { ty } => {
                format!("matvec_rows_{}", ty.ggml().name().to_lowercase())
            }
            KernelKey::RmsNorm { .. } => format!("rmsnorm{sg}"),
            KernelKey::Rope => "rope".into(),
            KernelKey::Swiglu => "swiglu".into(),
            KernelKey::Add => "add".into(),
            KernelKey::AddBias => "add_bias".into(),
            KernelKey::Softmax { .. } => format!("softmax{sg}"),
            KernelKey::Argmax => "argmax".into(),
            KernelKey::Embedding { ty, .. } => {
                format!("embedding_{}{h}", ty.ggml().name().to_lowercase())
            }
            KernelKey::KvStore { ty } => match ty {
                KvType::F32 => "kv_store".into(),
                _ => format!("kv_store_{ty}"),
            },
            KernelKey::AttentionSplit { kv, .. } => format!("attention_split{sg}{}", kv_suffix(kv)),
            KernelKey::AttentionCombine { .. } => format!("attention_combine{sg}"),
            KernelKey::AttentionPrefill { kv } => format!("attention_prefill{}", kv_suffix(kv)),
            KernelKey::AttentionPrefillLanes { kv } => {
                format!("attention_prefill_lanes{}", kv_suffix(kv))
            }
            KernelKey::QuantizeAct => "quantize_act".into(),
            KernelKey::MatvecQ8 { ty, .. } => {
                format!("matvec_q8_{}{sg}", ty.ggml().name().to_lowercase())
            }
            KernelKey::MatvecQ8Rows { ty } => {
                format!("matvec_q8_rows_{}", ty.ggml().name().to_lowercase())
            }
            KernelKey::BandwidthProbe => "bandwidth_probe".into(),
            KernelKey::MatvecQ8Out { ty, out, .. } => format!(
                "matvec_q8_{}_{}{sg}",
                out.name(),
                ty.ggml().name().to_lowercase()
            ),
            KernelKey::MatvecQ8RowsOut { ty, out } => format!(
                "matvec_q8_rows_{}_{}",
                out.name(),
                ty.ggml().name().to_lowercase()
            ),
            KernelKey::MatmulQ8Rows { ty, out, .. } => format!(
                "matmul_q8_rows_{}{}{sg}",
                out.map_or(String::new(), |o| format!("{}_", o.name())),
                ty.ggml().name().to_lowercase()
            ),
            KernelKey::RmsNormQuant { .. } => format!("rmsnorm_quant{sg}"),
            KernelKey::SwigluQuant => "swiglu_quant".into(),
            KernelKey::MoeRoute => "moe_route".into(),
            KernelKey::MatvecExperts { ty, q8 } => format!(
                "matvec_experts_{}{}",
                if q8 { "q8_" } else { "" },
                ty.ggml().name().to_lowercase()
            ),
            KernelKey::MoeCombine => "moe_combine".into(),
        }
    }

    /// The composed WGSL module (entry point `main`). A native-f16 variant's module starts
    /// with its quant fragment, whose first line is `enable f16;`.
    pub fn source(&self) -> String {
        let reduce = if self.uses_subgroups() {
            REDUCE_SUBGROUP
        } else {
            REDUCE_WORKGROUP
        };
        let parts: Vec<&str> = match *self {
            KernelKey::Matmul { ty } => vec![ty.fragment(), LOAD_X4, MATRIX_F32, MATRIX_TILES],
            KernelKey::MatvecRows { ty } => vec![ty.fragment(), LOAD_X4, MATRIX_F32, MATRIX_ROWS],
            KernelKey::Matvec { ty, .. } => match ty.f16_fragment() {
                Some(q) if self.uses_f16() => vec![q, reduce, LOAD_X4, MATRIX_F32, MATRIX_REDUCE],
                _ => vec![reduce, ty.fragment(), LOAD_X4, MATRIX_F32, MATRIX_REDUCE],
            },
            KernelKey::RmsNorm { .. } => vec![reduce, RMSNORM],
            KernelKey::Softmax { .. } => vec![reduce, SOFTMAX],
            KernelKey::Argmax => vec![REDUCE_WORKGROUP, ARGMAX],
            KernelKey::Embedding { ty, .. } => match ty.f16_fragment() {
                Some(q) if self.uses_f16() => vec![q, REDUCE_WORKGROUP, EMBEDDING],
                _ => vec![REDUCE_WORKGROUP, ty.fragment(), EMBEDDING],
            },
            KernelKey::Rope => vec![ROPE],
            KernelKey::Swiglu => vec![SWIGLU],
            KernelKey::Add => vec![ADD],
            KernelKey::AddBias => vec![ADD_BIAS],
            KernelKey::KvStore { .. } => vec![KV_STORE],
            KernelKey::AttentionSplit { .. } => {
                vec![
                    reduce,
                    ATTENTION_PARAMS,
                    ATTENTION_QKV,
                    KV_READ,
                    QUANTIZE_CHUNK,
                    ATTENTION_SPLIT,
                ]
            }
            KernelKey::AttentionCombine { .. } => vec![reduce, ATTENTION_PARAMS, ATTENTION_COMBINE],
            KernelKey::AttentionPrefill { .. } => {
                vec![ATTENTION_PARAMS, ATTENTION_QKV, KV_READ, ATTENTION_PREFILL]
            }
            KernelKey::AttentionPrefillLanes { .. } => {
                vec![
                    ATTENTION_PARAMS,
                    ATTENTION_QKV,
                    KV_READ,
                    ATTENTION_PREFILL_LANES,
                ]
            }
            KernelKey::BandwidthProbe => vec![REDUCE_WORKGROUP, BANDWIDTH],
            KernelKey::QuantizeAct => vec![QUANTIZE_CHUNK, QUANTIZE_ACT],
            KernelKey::MatvecQ8 { .. }
            | KernelKey::MatvecQ8Out { .. }
            | KernelKey::MatvecQ8Rows { .. }
            | KernelKey::MatvecQ8RowsOut { .. }
            | KernelKey::MatmulQ8Rows { .. } => self.q8_matrix_parts(),
            KernelKey::RmsNormQuant { .. } => vec![reduce, QUANTIZE_CHUNK, RMSNORM_QUANT],
            KernelKey::SwigluQuant => vec![QUANTIZE_CHUNK, SWIGLU_QUANT],
            KernelKey::MoeRoute => vec![MOE_ROUTE],
            KernelKey::MatvecExperts { ty, q8 } => {
                if q8 {
                    vec![ty.fragment(), Q8_ACT, EXPERTS_HEADER, EXPERTS_Q8]
                } else {
                    vec![ty.fragment(), LOAD_X4, EXPERTS_HEADER, MATVEC_EXPERTS]
                }
            }
            KernelKey::MoeCombine => vec![MOE_COMBINE],
        };
        parts.join("\n")
    }

    /// The fragments of an 8-bit-activation matrix key: the format's integer path, the 8-bit
    /// body (`shaders/matrix/q8.wgsl`), its layout and its output.
    fn q8_matrix_parts(&self) -> Vec<&'static str> {
        let (ty, out, layout): (WeightFormat, Option<MatvecOut>, &[&'static str]) = match *self {
            KernelKey::MatvecQ8 { ty, subgroup } => (ty, None, q8_reduction(subgroup)),
            KernelKey::MatvecQ8Out { ty, subgroup, out } => (ty, Some(out), q8_reduction(subgroup)),
            KernelKey::MatvecQ8Rows { ty } => (ty, None, &[MATRIX_TILES_Q8, TILE8_DIRECT]),
            KernelKey::MatvecQ8RowsOut { ty, out } => {
                (ty, Some(out), &[MATRIX_TILES_Q8, TILE8_DIRECT])
            }
            KernelKey::MatmulQ8Rows { ty, out, subgroup } => (
                ty,
                out,
                if subgroup {
                    &[MATRIX_TILES_Q8, TILE8_LANES]
                } else {
                    &[MATRIX_TILES_Q8, TILE8_DIRECT]
                },
            ),
            _ => return Vec::new(),
        };
        // The workgroup reduction's fragment declares WG and wg_sum before the body.
        let mut parts = if layout == [MATRIX_REDUCE] {
            vec![REDUCE_WORKGROUP]
        } else {
            Vec::new()
        };
        parts.extend([ty.fragment(), Q8_ACT, MATRIX_Q8]);
        parts.extend_from_slice(layout);
        parts.push(out.map_or(Q8_OUT_STORE, MatvecOut::fragment));
        parts
    }

    /// Override constants of the matrix layouts that the key fixes: the widest token tile of
    /// `shaders/matrix/tiles_q8.wgsl` (8 for the prefill matmul, 4 for the decode matvec).
    pub fn matrix_constants(&self) -> Vec<(&'static str, f64)> {
        match *self {
            KernelKey::MatmulQ8Rows { .. } => vec![("TILE", 8.0)],
            KernelKey::MatvecQ8Rows { .. } | KernelKey::MatvecQ8RowsOut { .. } => {
                vec![("TILE", 4.0)]
            }
            _ => Vec::new(),
        }
    }

    /// The pipeline's override constants for the KV cache types (`TYPE` of
    /// `shaders/kv_store.wgsl`, `K_TYPE` and `V_TYPE` of `shaders/kv/read.wgsl`); empty for
    /// the other kernels.
    pub fn kv_constants(&self) -> Vec<(&'static str, f64)> {
        match *self {
            KernelKey::KvStore { ty } => vec![("TYPE", kv_code(ty))],
            KernelKey::AttentionSplit { kv, .. }
            | KernelKey::AttentionPrefill { kv }
            | KernelKey::AttentionPrefillLanes { kv } => {
                vec![("K_TYPE", kv_code(kv.k)), ("V_TYPE", kv_code(kv.v))]
            }
            _ => Vec::new(),
        }
    }
}

/// The reduction layout of the 8-bit matrix body: a subgroup per row, or rows summed over
/// the workgroup.
fn q8_reduction(subgroup: bool) -> &'static [&'static str] {
    if subgroup {
        &[MATRIX_SUBGROUPS]
    } else {
        &[MATRIX_REDUCE]
    }
}

/// Every (K type, V type) pair, f32/f32 first.
pub fn kv_type_pairs() -> impl Iterator<Item = KvTypes> {
    KvType::ALL
        .into_iter()
        .flat_map(|k| KvType::ALL.map(|v| KvTypes { k, v }))
}

/// A type's number in the WGSL (`shaders/kv/read.wgsl`).
fn kv_code(t: KvType) -> f64 {
    match t {
        KvType::F32 => 0.0,
        KvType::F16 => 1.0,
        KvType::Q8_0 => 2.0,
        KvType::Q4_0 => 3.0,
    }
}

/// Label suffix of an attention kernel's cache types ("" for the f32 caches).
fn kv_suffix(kv: KvTypes) -> String {
    if kv == KvTypes::F32 {
        String::new()
    } else {
        format!("_k{}_v{}", kv.k, kv.v)
    }
}
