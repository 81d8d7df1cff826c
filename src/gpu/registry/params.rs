//! The uniform parameter structs of the kernels, laid out as the WGSL structs they mirror
//! (`#[repr(C)]`, 16-byte multiples; the size asserts at the end catch a field added on one
//! side only).

use bytemuck::{Pod, Zeroable};

/// Uniform parameters of the f32-activation matrix products in every layout (`struct
/// MatvecParams` of `shaders/matrix/f32.wgsl`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatvecParams {
    pub rows: u32,
    pub cols: u32,
    /// ceil(cols / QK)
    pub blocks_per_row: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub n_tokens: u32,
    /// row length of y (at least row_offset + rows)
    pub y_stride: u32,
    /// first row of y written (a matrix split by rows across bindings)
    pub row_offset: u32,
    /// workgroups per token (`reduce.wgsl`, `rows.wgsl`: ceil(rows / rows per workgroup)),
    /// or row tiles (`tiles.wgsl`: ceil(rows / TM))
    pub row_groups: u32,
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
    /// heads of the second buffer rotated by the same launch (0: none)
    pub n_heads2: u32,
    /// multiplies cos and sin (LongRoPE's attention factor; 1 for most models)
    pub mscale: f32,
    pub pad: [u32; 3],
}

/// Uniform parameters of `shaders/swiglu.wgsl` and `shaders/add.wgsl`
/// (`struct ElementwiseParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ElementwiseParams {
    pub n: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// the gated units' activation: [`ACT_SILU`] or [`ACT_GELU_TANH`]; `add`'s mode:
    /// [`ADD_SCALED`] or [`SCALE`]
    pub act: u32,
    /// `add`'s factor (1 for a plain add); the gated units ignore it
    pub scale: f32,
}

/// `ElementwiseParams::act` of `add`: x += scale * y.
pub const ADD_SCALED: u32 = 0;
/// `ElementwiseParams::act` of `add`: x *= scale (y is not read).
pub const SCALE: u32 = 1;

/// `ElementwiseParams::act` of SwiGLU.
pub const ACT_SILU: u32 = 0;
/// `ElementwiseParams::act` of GeGLU (tanh GELU).
pub const ACT_GELU_TANH: u32 = 1;

/// The `ElementwiseParams::act` code of `act`.
pub fn act_code(act: crate::config::FfnAct) -> u32 {
    match act {
        crate::config::FfnAct::Silu => ACT_SILU,
        crate::config::FfnAct::GeluTanh => ACT_GELU_TANH,
    }
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
    /// rows of this part of the table
    pub rows: u32,
    pub cols: u32,
    pub n_tokens: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// first table row of this part
    pub row0: u32,
    /// rows of the whole table
    pub total_rows: u32,
    /// multiplies every value (gemma's sqrt(n_embd); 1 otherwise)
    pub scale: f32,
    pub pad1: u32,
}

/// Uniform parameters of `shaders/add_bias.wgsl` (`struct BiasParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BiasParams {
    /// elements of x: n_rows * width
    pub n: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// row length (the bias length)
    pub width: u32,
    pub pad0: u32,
}

/// Uniform parameters of `shaders/kv_store.wgsl` (`struct KvStoreParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct KvStoreParams {
    pub n_tokens: u32,
    /// f32 per cache row: n_head_kv * head_dim
    pub row_len: u32,
    /// cache row of the first token
    pub pos0: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// invocations of the first (src, cache) pair, then of the second (0: one pair)
    pub units_k: u32,
    pub units_v: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Uniform parameters of the attention kernels: `struct AttentionParams` of
/// `shaders/attention/params.wgsl`, composed into each (tests/gpu_shaders.rs checks the twin).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct AttentionParams {
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// position of the first query token
    pub pos0: u32,
    /// split and combine: chunks per (token, head)
    pub n_chunks: u32,
    /// prefill: query tokens per workgroup
    pub tile_q: u32,
    /// prefill: key positions per staged tile
    pub tile_k: u32,
    pub scale: f32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// split with one chunk: 1 also quantizes the output into qx / qd (head_dim a multiple
    /// of 32), else 0
    pub quant: u32,
    /// sliding window: a query at position p sees keys p - window + 1 ..= p; 0 = no window
    pub window: u32,
    /// scores become softcap * tanh(score / softcap) before the softmax; 0 = no cap (gemma2)
    pub softcap: f32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

/// Uniform parameters of `shaders/bandwidth.wgsl` (`struct ProbeParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ProbeParams {
    /// vec4s in the source buffer
    pub n_vec4: u32,
    /// workgroups that read (one output each)
    pub n_groups: u32,
    /// vec4s each invocation reads at most: ceil(n_vec4 / (n_groups * WG))
    pub per_thread: u32,
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

/// Uniform parameters of the integer kernels (`struct MatvecQ8Params` of
/// `shaders/matrix/q8.wgsl`; the same fields as the f32 batched matvec's).
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
    /// first row of the weight buffers read (a row range of a fused matrix)
    pub w_row0: u32,
    /// split outputs: global rows below split1 go to y, below split2 to y1, the rest to y2
    pub split1: u32,
    pub split2: u32,
    /// live invocations per workgroup of the register-tile layout, and the distance between
    /// an invocation's 4 rows (`shaders/matrix/tiles_q8.wgsl`; `RowBalance::stride`); unused
    /// by the others
    pub row_stride: u32,
    /// rows between an invocation's 4 rows of the register tiles: `row_stride` (strided) or
    /// 1 (runs of 4)
    pub row_step: u32,
    /// rows between consecutive invocations' first rows of the register tiles: 1 (strided)
    /// or 4 (runs of 4)
    pub inv_step: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Uniform parameters of `shaders/moe_route.wgsl` (`struct MoeRouteParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MoeRouteParams {
    pub n_tokens: u32,
    pub n_expert: u32,
    /// experts used per token
    pub k: u32,
    /// 1: divide the kept probabilities by their sum
    pub normalize: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

/// Uniform parameters of the routed experts' kernels (`struct MatvecExpertsParams` of
/// `shaders/experts/header.wgsl`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatvecExpertsParams {
    /// rows of one expert's matrix
    pub rows: u32,
    pub cols: u32,
    /// ceil(cols / QK)
    pub blocks_per_row: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    /// (token, slot) pairs
    pub n_pairs: u32,
    /// pairs per input row (k: every slot reads its token's input; 1: each pair its own)
    pub x_div: u32,
    /// ceil(rows / WG)
    pub row_groups: u32,
    /// the experts the launch's weight binding holds: e_lo..e_hi
    pub e_lo: u32,
    pub e_hi: u32,
    /// `shaders/matmul_experts.wgsl`: pairs scanned by one workgroup, and how many such chunks
    /// (0 for the matvec)
    pub chunk: u32,
    pub n_chunks: u32,
    pub pad0: u32,
}

/// Uniform parameters of `shaders/moe_combine.wgsl` (`struct MoeCombineParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MoeCombineParams {
    pub n_tokens: u32,
    /// row length (n_embd)
    pub n: u32,
    /// experts per token
    pub k: u32,
    /// 1: add the shared expert's gated output
    pub has_shared: u32,
    /// workgroups along x in the dispatch
    pub groups_x: u32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

// Uniform structs must be a multiple of 16 bytes and match the WGSL layout (four 4-byte fields).
const _: () = assert!(std::mem::size_of::<MatvecParams>() == 32);
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 16);
const _: () = assert!(std::mem::size_of::<RopeParams>() == 48);
const _: () = assert!(std::mem::size_of::<ElementwiseParams>() == 16);
const _: () = assert!(std::mem::size_of::<RowParams>() == 16);
const _: () = assert!(std::mem::size_of::<EmbeddingParams>() == 32);
const _: () = assert!(std::mem::size_of::<BiasParams>() == 16);
const _: () = assert!(std::mem::size_of::<KvStoreParams>() == 32);
const _: () = assert!(std::mem::size_of::<AttentionParams>() == 64);
const _: () = assert!(std::mem::size_of::<QuantizeActParams>() == 16);
const _: () = assert!(std::mem::size_of::<MatvecQ8Params>() == 64);
const _: () = assert!(std::mem::size_of::<MoeRouteParams>() == 32);
const _: () = assert!(std::mem::size_of::<MatvecExpertsParams>() == 48);
const _: () = assert!(std::mem::size_of::<MoeCombineParams>() == 32);
