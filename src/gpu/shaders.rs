//! The kernel registry: every compute shader is named by a [`KernelKey`] and composed by
//! concatenating plain WGSL fragments from `shaders/` (no templating, no preprocessor). Each
//! fragment is ordinary WGSL; tunables are WGSL `override` constants set at pipeline creation.
//!
//! Composition order: reduction (`shaders/reduce/*.wgsl`: `override WG`, `fn wg_sum`), then the
//! weight format (`shaders/quant/*.wgsl`: weight bindings 0..1, `const QK`, `fn dq_block`; the
//! formats with an integer path also `fn dq_chunk`, preceded by `shaders/quant/chunk.wgsl`'s
//! `struct QChunk`), then the op (`shaders/<op>.wgsl`: its other bindings and the `main` entry
//! point).

use bytemuck::{Pod, Zeroable};
use kernels_ref::GgmlType;

const REDUCE_WORKGROUP: &str = include_str!("../../shaders/reduce/workgroup.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("../../shaders/reduce/subgroup.wgsl");
// The formats with an integer path carry the shared `struct QChunk` (quant/chunk.wgsl) ahead of
// their fragment, since their `dq_chunk` names it: every module that includes them stays valid.
const QUANT_Q4_0: &str = concat!(
    include_str!("../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../shaders/quant/q4_0.wgsl")
);
const QUANT_Q4_1: &str = concat!(
    include_str!("../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../shaders/quant/q4_1.wgsl")
);
const QUANT_Q8_0: &str = concat!(
    include_str!("../../shaders/quant/chunk.wgsl"),
    "\n",
    include_str!("../../shaders/quant/q8_0.wgsl")
);
const QUANT_F16: &str = include_str!("../../shaders/quant/f16.wgsl");
const QUANT_F32: &str = include_str!("../../shaders/quant/f32.wgsl");
const MATVEC: &str = include_str!("../../shaders/matvec.wgsl");
const MATVEC_Q8: &str = include_str!("../../shaders/matvec_q8.wgsl");
const QUANTIZE_ACT: &str = include_str!("../../shaders/quantize_act.wgsl");
const RMSNORM: &str = include_str!("../../shaders/rmsnorm.wgsl");
const ROPE: &str = include_str!("../../shaders/rope.wgsl");
const SWIGLU: &str = include_str!("../../shaders/swiglu.wgsl");
const ADD: &str = include_str!("../../shaders/add.wgsl");
const SOFTMAX: &str = include_str!("../../shaders/softmax.wgsl");
const ARGMAX: &str = include_str!("../../shaders/argmax.wgsl");
const EMBEDDING: &str = include_str!("../../shaders/embedding.wgsl");

/// Largest workgroup size the reduction fragments' workgroup arrays hold (`MAX_WG` in WGSL).
pub const MAX_WORKGROUP_SIZE: u32 = 256;

/// Weight formats the GPU kernels read (each has a `shaders/quant/*.wgsl` fragment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    Q4_0,
    Q4_1,
    Q8_0,
    F16,
    F32,
}

impl WeightFormat {
    /// Every format, in declaration order.
    pub const ALL: [WeightFormat; 5] = [
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::F16,
        WeightFormat::F32,
    ];

    /// The GPU format for a ggml type, if there is one.
    pub fn from_ggml(ty: GgmlType) -> Option<WeightFormat> {
        match ty {
            GgmlType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlType::Q4_1 => Some(WeightFormat::Q4_1),
            GgmlType::Q8_0 => Some(WeightFormat::Q8_0),
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
            WeightFormat::F16 => GgmlType::F16,
            WeightFormat::F32 => GgmlType::F32,
        }
    }

    /// Whether the repacked matrix has a separate scale buffer (WGSL binding 1).
    pub fn has_scales(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q8_0
        )
    }

    /// Whether the format's fragment has `dq_chunk`, the integer path of `KernelKey::MatvecQ8`
    /// (float weights keep the f32 matvec, as on the CPU).
    pub fn has_q8_path(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q8_0
        )
    }

    fn fragment(self) -> &'static str {
        match self {
            WeightFormat::Q4_0 => QUANT_Q4_0,
            WeightFormat::Q4_1 => QUANT_Q4_1,
            WeightFormat::Q8_0 => QUANT_Q8_0,
            WeightFormat::F16 => QUANT_F16,
            WeightFormat::F32 => QUANT_F32,
        }
    }
}

/// Columns per `dq_block` call, for every format (`QK` in WGSL).
pub const QK: u32 = 32;

/// One composed compute shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKey {
    /// `shaders/matvec.wgsl` over weights in `ty`; `subgroup` picks `subgroupAdd` reduction.
    Matvec { ty: WeightFormat, subgroup: bool },
    /// `shaders/rmsnorm.wgsl`; `subgroup` picks `subgroupAdd` reduction.
    RmsNorm { subgroup: bool },
    /// `shaders/rope.wgsl` (standalone: no reduction).
    Rope,
    /// `shaders/swiglu.wgsl` (standalone).
    Swiglu,
    /// `shaders/add.wgsl` (standalone).
    Add,
    /// `shaders/softmax.wgsl`; `subgroup` picks `subgroupAdd` for the row sum (the row maximum
    /// always goes through workgroup memory).
    Softmax { subgroup: bool },
    /// `shaders/argmax.wgsl` (workgroup-memory reduction only).
    Argmax,
    /// `shaders/embedding.wgsl`: rows of a table in `ty` to f32 (no reduction).
    Embedding { ty: WeightFormat },
    /// `shaders/quantize_act.wgsl`: f32 activations to int8 chunks of 32 (no reduction).
    QuantizeAct,
    /// `shaders/matvec_q8.wgsl` over weights in `ty` (one with `WeightFormat::has_q8_path`)
    /// and int8 activations; `subgroup` picks `subgroupAdd` reduction.
    MatvecQ8 { ty: WeightFormat, subgroup: bool },
}

impl KernelKey {
    /// Every kernel variant (the naga test validates each one).
    pub fn all() -> Vec<KernelKey> {
        let mut keys = Vec::new();
        for subgroup in [false, true] {
            for ty in WeightFormat::ALL {
                keys.push(KernelKey::Matvec { ty, subgroup });
                if ty.has_q8_path() {
                    keys.push(KernelKey::MatvecQ8 { ty, subgroup });
                }
            }
            keys.push(KernelKey::RmsNorm { subgroup });
            keys.push(KernelKey::Softmax { subgroup });
        }
        keys.extend([
            KernelKey::Rope,
            KernelKey::Swiglu,
            KernelKey::Add,
            KernelKey::Argmax,
            KernelKey::QuantizeAct,
        ]);
        for ty in WeightFormat::ALL {
            keys.push(KernelKey::Embedding { ty });
        }
        keys
    }

    /// Whether the key comes in a workgroup-memory and a subgroup variant (a context compiles
    /// one of the two); keys without the choice are compiled by every context.
    pub fn has_reduction_choice(&self) -> bool {
        matches!(
            self,
            KernelKey::Matvec { .. }
                | KernelKey::MatvecQ8 { .. }
                | KernelKey::RmsNorm { .. }
                | KernelKey::Softmax { .. }
        )
    }

    /// Whether the shader needs the adapter's `SUBGROUP` feature.
    pub fn uses_subgroups(&self) -> bool {
        match *self {
            KernelKey::Matvec { subgroup, .. }
            | KernelKey::MatvecQ8 { subgroup, .. }
            | KernelKey::RmsNorm { subgroup }
            | KernelKey::Softmax { subgroup } => subgroup,
            KernelKey::Rope
            | KernelKey::Swiglu
            | KernelKey::Add
            | KernelKey::Argmax
            | KernelKey::Embedding { .. }
            | KernelKey::QuantizeAct => false,
        }
    }

    /// A label for pipelines and messages, e.g. `matvec_q4_0_sg`.
    pub fn label(&self) -> String {
        let sg = if self.uses_subgroups() { "_sg" } else { "" };
        match *self {
            KernelKey::Matvec { ty, .. } => {
                format!("matvec_{}{sg}", ty.ggml().name().to_lowercase())
            }
            KernelKey::RmsNorm { .. } => format!("rmsnorm{sg}"),
            KernelKey::Rope => "rope".into(),
            KernelKey::Swiglu => "swiglu".into(),
            KernelKey::Add => "add".into(),
            KernelKey::Softmax { .. } => format!("softmax{sg}"),
            KernelKey::Argmax => "argmax".into(),
            KernelKey::Embedding { ty } => {
                format!("embedding_{}", ty.ggml().name().to_lowercase())
            }
            KernelKey::QuantizeAct => "quantize_act".into(),
            KernelKey::MatvecQ8 { ty, .. } => {
                format!("matvec_q8_{}{sg}", ty.ggml().name().to_lowercase())
            }
        }
    }

    /// The composed WGSL module (entry point `main`).
    pub fn source(&self) -> String {
        let reduce = if self.uses_subgroups() {
            REDUCE_SUBGROUP
        } else {
            REDUCE_WORKGROUP
        };
        let parts: Vec<&str> = match *self {
            KernelKey::Matvec { ty, .. } => vec![reduce, ty.fragment(), MATVEC],
            KernelKey::RmsNorm { .. } => vec![reduce, RMSNORM],
            KernelKey::Softmax { .. } => vec![reduce, SOFTMAX],
            KernelKey::Argmax => vec![REDUCE_WORKGROUP, ARGMAX],
            KernelKey::Embedding { ty } => vec![REDUCE_WORKGROUP, ty.fragment(), EMBEDDING],
            KernelKey::Rope => vec![ROPE],
            KernelKey::Swiglu => vec![SWIGLU],
            KernelKey::Add => vec![ADD],
            KernelKey::QuantizeAct => vec![QUANTIZE_ACT],
            KernelKey::MatvecQ8 { ty, .. } => vec![reduce, ty.fragment(), MATVEC_Q8],
        };
        parts.join("\n")
    }
}

/// Uniform parameters of `shaders/matvec.wgsl` (`struct MatvecParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatvecParams {
    pub rows: u32,
    pub cols: u32,
    /// ceil(cols / QK)
    pub blocks_per_row: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
}

/// Uniform parameters of `shaders/rmsnorm.wgsl` (`struct RmsNormParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RmsNormParams {
    /// row length
    pub n: u32,
    pub n_rows: u32,
    pub eps: f32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
}

/// Uniform parameters of `shaders/rope.wgsl` (`struct RopeParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RopeParams {
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    /// rotated dims per head (even, at most head_dim)
    pub n_rot: u32,
    /// position of the first token
    pub pos0: u32,
    /// 0: pairs (2i, 2i + 1); 1: pairs (i, i + n_rot / 2)
    pub neox: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
}

/// Uniform parameters of `shaders/swiglu.wgsl` and `shaders/add.wgsl`
/// (`struct ElementwiseParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ElementwiseParams {
    pub n: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Uniform parameters of `shaders/softmax.wgsl` and `shaders/argmax.wgsl` (`struct RowParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RowParams {
    /// row length
    pub n: u32,
    pub n_rows: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
}

/// Uniform parameters of `shaders/embedding.wgsl` (`struct EmbeddingParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct EmbeddingParams {
    pub rows: u32,
    pub cols: u32,
    pub n_tokens: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
}

/// Uniform parameters of `shaders/quantize_act.wgsl` (`struct QuantizeActParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct QuantizeActParams {
    /// n_tokens * cols / 32
    pub n_chunks: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Uniform parameters of `shaders/matvec_q8.wgsl` (`struct MatvecQ8Params`; the same fields
/// as the f32 batched matvec's).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatvecQ8Params {
    pub rows: u32,
    pub cols: u32,
    /// cols / 32: chunks per row
    pub blocks_per_row: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub n_tokens: u32,
    /// row length of y (at least row_offset + rows)
    pub y_stride: u32,
    /// first row of y written (a matrix split by rows across bindings)
    pub row_offset: u32,
    /// workgroups per token: ceil(rows / ROWS)
    pub row_groups: u32,
}

// Uniform structs must be a multiple of 16 bytes and match the WGSL layout (four 4-byte fields).
const _: () = assert!(std::mem::size_of::<MatvecParams>() == 16);
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 16);
const _: () = assert!(std::mem::size_of::<RopeParams>() == 32);
const _: () = assert!(std::mem::size_of::<ElementwiseParams>() == 16);
const _: () = assert!(std::mem::size_of::<RowParams>() == 16);
const _: () = assert!(std::mem::size_of::<EmbeddingParams>() == 16);
const _: () = assert!(std::mem::size_of::<QuantizeActParams>() == 16);
const _: () = assert!(std::mem::size_of::<MatvecQ8Params>() == 32);
