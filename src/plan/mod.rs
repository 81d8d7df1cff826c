//! Memory accounting: what each device holds for a model, a context and a placement (weights,
//! KV cache, runtime scratch, staging), and the `memwall plan` report built on it.
//!
//! Sizes come either from a GGUF file (exact tensor bytes) or from architecture numbers (a
//! parameter count or widths, at a weight bit width), so a reader can check a plan for a model
//! they do not have. [`fit`] picks the placement for a GPU byte budget (`--gpu-mem-budget`).

mod fit;
mod report;

use crate::ground::format_size;
pub use fit::{account, fit, DeviceUse, Fit};
pub use report::{plan, PlanReport, Row};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::kernels::attention::{attention_scratch_len, AttentionConfig, ATTENTION_CHUNK};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};

/// Tokens per forward batch the engine allocates activations for (the engine's
/// `PREFILL_BATCH`; activation scratch scales with it).
pub const PLAN_BATCH: usize = 64;

/// Bytes of every stage of a llama-shaped model, as memwall would hold them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryModel {
    /// Where the numbers come from (file name, or "architecture numbers").
    pub source: String,
    pub n_layer: usize,
    pub n_ctx: usize,
    /// Token embedding table (`token_embd.weight`).
    pub embed_bytes: u64,
    /// Every tensor of block `l` (`blk.l.*`).
    pub layer_weight_bytes: Vec<u64>,
    /// The head's own tensors: `output.weight` (absent when tied) and `output_norm.weight`.
    /// A tied head reads the embedding table; [`account`] places that table on each device
    /// that needs it, once.
    pub head_bytes: u64,
    /// Bytes of block `l`'s matrices packed at load for the CPU GEMM (`PreparedWeights`) when the
    /// block runs on the CPU: anonymous memory in place of those weights' mmap pages. Zero
    /// without packing (`--no-repack`, an ISA or format without a packed layout); filled by
    /// [`MemoryModel::with_cpu_packing`].
    pub cpu_packed_layer_bytes: Vec<u64>,
    /// The same for the head's matrix on the CPU (a tied head's packed embedding table comes
    /// on top of the table's pages, which the embedding stage still reads).
    pub cpu_packed_head_bytes: u64,
    /// File tensors no stage reads (counted in [`MemoryModel::weights_total`] only).
    pub other_bytes: u64,
    pub tied_embeddings: bool,
    /// Bits per KV element (32: f32 as memwall allocates; 16, 8, 4.5... for what-if plans).
    pub kv_bits: f64,
    /// K and V of one layer for `n_ctx` positions: 2 · n_ctx · kv_dim · kv_bits / 8.
    pub kv_bytes_per_layer: u64,
    /// Activations, quantized matmul inputs and f32 norm copies of the CPU backend.
    pub cpu_scratch_bytes: u64,
    /// Activations, attention partials, quantized matmul inputs, ids of the GPU backend.
    pub gpu_scratch_bytes: u64,
    /// The GPU readback buffer for one row of logits ([n_vocab] f32).
    pub gpu_staging_bytes: u64,
    /// The readback buffer when the hidden state of a batch crosses from the GPU to the CPU
    /// ([PLAN_BATCH, n_embd] f32): the staging buffer grows to the larger of the two.
    pub gpu_transfer_bytes: u64,
}

/// The widths the runtime buffers depend on.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_ff: usize,
    n_vocab: usize,
    n_layer: usize,
}

impl Shape {
    fn of(cfg: &Config) -> Shape {
        Shape {
            n_embd: cfg.n_embd,
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            n_ff: cfg.n_ff,
            n_vocab: cfg.n_vocab,
            n_layer: cfg.n_layer,
        }
    }
    fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// `n · bits / 8` rounded up, with bits taken to a thousandth (exact for 4, 4.5, 16...).
fn bits_to_bytes(n: u128, bits: f64) -> Result<u64> {
    if !(bits.is_finite() && bits > 0.0 && bits <= 64.0) {
        return Err(Error::InvalidArgument(format!(
            "bit width {bits} must be a number in (0, 64]"
        )));
    }
    let milli = (bits * 1000.0).round() as u128;
    let bytes = n
        .checked_mul(milli)
        .map(|v| v.div_ceil(8000))
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{n} elements at {bits} bits overflow 64-bit bytes"))
        })?;
    Ok(bytes)
}

/// KV cache bytes of one layer: K and V, `n_ctx` rows of `kv_dim` elements each.
pub fn kv_layer_bytes(n_ctx: usize, kv_dim: usize, kv_bits: f64) -> Result<u64> {
    let n = (2 * n_ctx as u128)
        .checked_mul(kv_dim as u128)
        .ok_or_else(|| Error::InvalidArgument(format!("context {n_ctx} is too large")))?;
    bits_to_bytes(n, kv_bits)
}

/// Scratch: x, h, o, sel [batch, n_embd]; q, att [batch, q_dim]; k, v [batch, kv_dim];
/// g, u [batch, n_ff]; logits [batch, n_vocab]; all f32, on each backend that runs stages.
fn act_bytes(s: &Shape, b: u128) -> u128 {
    let f = |v: usize| v as u128;
    b * 4 * (4 * f(s.n_embd) + 2 * f(s.q_dim()) + 2 * f(s.kv_dim()) + 2 * f(s.n_ff) + f(s.n_vocab))
}

/// The CPU backend's runtime bytes for batches of `batch` tokens: activations, the quantized
/// matmul input, the prefill matmul's transposed outputs and the f32 norm weights.
fn cpu_runtime(s: &Shape, batch: usize) -> u64 {
    // u128: no width a Config or ArchSpec admits overflows these products.
    let b = batch as u128;
    let f = |v: usize| v as u128;
    let act = act_bytes(s, b);
    let max_cols = s.n_embd.max(s.q_dim()).max(s.n_ff);
    let max_rows = s.n_vocab.max(s.n_ff).max(s.q_dim()).max(s.n_embd);
    // CPU QAct for [batch, max_cols]: int8 values, a scale and a sum per 32, two half sums
    // per 32 (f32).
    let qact = b * f(max_cols) + b * f(max_cols) / 32 * 4 * 2 + b * f(max_cols) / 16 * 4;
    // CPU `yt`: [rows, batch] f32 outputs of a prefill matmul, the head's the largest.
    let yt = b * f(max_rows) * 4;
    // Norm weights copied to f32: two per block and the output norm.
    let norms = (2 * f(s.n_layer) + 1) * f(s.n_embd) * 4;
    u64::try_from(act + qact + yt + norms).unwrap_or(u64::MAX)
}

/// The CPU backend's runtime bytes for a model of `cfg` and batches of `batch` tokens (what
/// [`MemoryModel::cpu_scratch_bytes`] counts for `PLAN_BATCH`).
pub fn cpu_scratch_bytes(cfg: &Config, batch: usize) -> u64 {
    cpu_runtime(&Shape::of(cfg), batch)
}

/// Runtime bytes per device, mirroring what `Scratch::new` (src/model.rs),
/// `CpuBackend::new`/`MatmulScratch` and `GpuBackend::new` allocate for `PLAN_BATCH` tokens.
/// Returns (cpu scratch, gpu scratch, gpu staging, gpu transfer).
fn runtime(s: &Shape, n_ctx: usize) -> (u64, u64, u64, u64) {
    let cpu = cpu_runtime(s, PLAN_BATCH);
    let b = PLAN_BATCH as u128;
    let f = |v: usize| v as u128;
    let out = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    // Scratch: x, h, o, sel [batch, n_embd]; q, att [batch, q_dim]; k, v [batch, kv_dim];
    // g, u [batch, n_ff]; logits [batch, n_vocab]; all f32, on each backend that runs stages.
    let act = act_bytes(s, b);
    let max_cols = s.n_embd.max(s.q_dim()).max(s.n_ff);

    let att_cfg = AttentionConfig {
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim,
        scale: 1.0,
        n_ctx,
        kv: crate::kv_type::KvTypes::F32,
        window: None,
        softcap: None,
    };
    // Split-attention partials: [min(batch, 4), n_head, ceil(n_ctx / chunk), head_dim + 4].
    let att = f(attention_scratch_len(
        &att_cfg,
        PLAN_BATCH,
        ATTENTION_CHUNK as usize,
    )) * 4;
    // Token ids and argmax results: [batch] u32 each.
    let ids = 2 * b * 4;
    // The matmul input as int8 words [batch, max_cols / 4] and chunk scales (vec4 per 32).
    let qx = f(qx_words(PLAN_BATCH, max_cols)) * 4;
    let qd = f(qd_vec4s(PLAN_BATCH, max_cols)) * 16;
    // RoPE frequencies: [head_dim / 2] f32 at most.
    let rope = f(s.head_dim / 2) * 4;
    let gpu = act + att + ids + qx + qd + rope;
    let staging = f(s.n_vocab) * 4;
    let cpu = cpu as u128;
    let transfer = b * f(s.n_embd) * 4;
    (out(cpu), out(gpu), out(staging), out(transfer))
}

/// Largest width (layers, heads, head size, n_embd, n_ff, vocab) an architecture plan takes.
pub const MAX_DIM: usize = 1 << 24;
/// Most bytes (weights, KV cache and runtime together) a plan handles: 2^60, an exabyte.
pub const MAX_PLAN_BYTES: u64 = 1 << 60;

/// Largest context an architecture plan takes.
pub const MAX_CTX: usize = 1 << 30;

/// Architecture numbers for a plan without a file. Widths not given are derived: n_embd =
/// n_head · head_dim (or head_dim = n_embd / n_head), n_head_kv = n_head, n_vocab = 32000,
/// n_ff solved from the parameter count when one is given, else llama's 8/3 · n_embd rounded
/// up to a multiple of 256.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArchSpec {
    pub params: Option<u64>,
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    pub n_head_kv: Option<usize>,
    pub head_dim: Option<usize>,
    pub n_embd: Option<usize>,
    pub n_ff: Option<usize>,
    pub n_vocab: Option<usize>,
    pub n_ctx: Option<usize>,
    pub weight_bits: Option<f64>,
    pub kv_bits: Option<f64>,
    pub tied_embeddings: bool,
}

/// Default vocabulary size for architecture plans (llama 1/2).
pub const DEFAULT_VOCAB: usize = 32000;

fn need<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| Error::InvalidArgument(format!("{what} is missing")))
}

fn nonzero(v: usize, what: &str) -> Result<usize> {
    in_range(v, what, MAX_DIM)
}

fn in_range(v: usize, what: &str, max: usize) -> Result<usize> {
    if v == 0 {
        return Err(Error::InvalidArgument(format!("{what} must be at least 1")));
    }
    if v > max {
        return Err(Error::InvalidArgument(format!(
            "{what} = {v} is larger than {max}"
        )));
    }
    Ok(v)
}

impl MemoryModel {
    /// Exact tensor bytes of `g` per stage, a KV cache of `n_ctx` positions at `kv_bits`, and
    /// the runtime buffers memwall's backends allocate for this shape.
    pub fn from_gguf(g: &Gguf, cfg: &Config, n_ctx: usize, kv_bits: f64) -> Result<MemoryModel> {
        in_range(n_ctx, "the context (--ctx)", MAX_CTX)?;
        let mut layers = vec![0u64; cfg.n_layer];
        let (mut embed, mut head, mut other) = (0u64, 0u64, 0u64);
        for t in g.tensors() {
            let block = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<usize>().ok());
            match (t.name.as_str(), block) {
                ("token_embd.weight", _) => embed += t.n_bytes,
                ("output.weight" | "output_norm.weight" | "output_norm.bias", _) => {
                    head += t.n_bytes
                }
                (_, Some(l)) if l < cfg.n_layer => layers[l] += t.n_bytes,
                _ => other += t.n_bytes,
            }
        }
        let (cpu, gpu, staging, transfer) = runtime(&Shape::of(cfg), n_ctx);
        let kv_dim = cfg.n_head_kv.checked_mul(cfg.head_dim).ok_or_else(|| {
            Error::Config(format!(
                "KV width {} x {} overflows",
                cfg.n_head_kv, cfg.head_dim
            ))
        })?;
        MemoryModel {
            source: String::new(),
            n_layer: cfg.n_layer,
            n_ctx,
            embed_bytes: embed,
            cpu_packed_layer_bytes: vec![0; layers.len()],
            layer_weight_bytes: layers,
            head_bytes: head,
            cpu_packed_head_bytes: 0,
            other_bytes: other,
            tied_embeddings: cfg.tied_embeddings,
            kv_bits,
            kv_bytes_per_layer: kv_layer_bytes(n_ctx, kv_dim, kv_bits)?,
            cpu_scratch_bytes: cpu,
            gpu_scratch_bytes: gpu,
            gpu_staging_bytes: staging,
            gpu_transfer_bytes: transfer,
        }
        .checked()
    }

    /// This model with the CPU's weights packed at load as `Model::load` packs them (see
    /// `LoadOptions::no_repack`).
    pub fn with_cpu_packing(mut self, g: &Gguf, cfg: &Config) -> Result<MemoryModel> {
        use crate::cpu_backend::PreparedWeights;
        let mut on = vec![false; cfg.n_layer];
        self.cpu_packed_layer_bytes = (0..cfg.n_layer)
            .map(|l| {
                on.iter_mut().enumerate().for_each(|(i, v)| *v = i == l);
                PreparedWeights::bytes_for(g, cfg, &on, false)
            })
            .collect::<Result<_>>()?;
        self.cpu_packed_head_bytes = PreparedWeights::bytes_for(g, cfg, &[], true)?;
        Ok(self)
    }

    /// From architecture numbers: weight bytes = ⌈params · weight_bits / 8⌉, spread over the
    /// embedding, the blocks and the head in proportion to their parameter counts (the
    /// rounding remainder, a few bytes, goes to the head).
    pub fn from_arch(a: &ArchSpec) -> Result<MemoryModel> {
        let n_layer = nonzero(need(a.n_layer, "the layer count (--layers)")?, "--layers")?;
        let n_head = nonzero(need(a.n_head, "the head count (--heads)")?, "--heads")?;
        let n_ctx = in_range(need(a.n_ctx, "the context (--ctx)")?, "--ctx", MAX_CTX)?;
        let weight_bits = need(a.weight_bits, "the weight bit width (--weight-bits)")?;
        let kv_bits = a
            .kv_bits
            .unwrap_or(crate::kv_type::KvTypes::default().mean_bits());
        let n_head_kv = nonzero(a.n_head_kv.unwrap_or(n_head), "--kv-heads")?;
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(Error::InvalidArgument(format!(
                "the head count {n_head} is not a multiple of the KV head count {n_head_kv}"
            )));
        }
        let (n_embd, head_dim) = match (a.n_embd, a.head_dim) {
            (_, Some(hd)) => {
                let hd = nonzero(hd, "--head-dim")?;
                (nonzero(a.n_embd.unwrap_or(n_head * hd), "--n-embd")?, hd)
            }
            (Some(e), None) => {
                if e == 0 || !e.is_multiple_of(n_head) {
                    return Err(Error::InvalidArgument(format!(
                        "the embedding width {e} is not a multiple of the head count {n_head}"
                    )));
                }
                (e, e / n_head)
            }
            (None, None) => {
                return Err(Error::InvalidArgument(
                    "the head size is missing: give --head-dim or --n-embd".into(),
                ))
            }
        };
        let n_vocab = nonzero(a.n_vocab.unwrap_or(DEFAULT_VOCAB), "--vocab")?;
        let (q_dim, kv_dim) = (
            n_head as u128 * head_dim as u128,
            n_head_kv as u128 * head_dim as u128,
        );
        let (e, v, nl) = (n_embd as u128, n_vocab as u128, n_layer as u128);
        // Parameters outside the feed-forward: embedding, head (+ its norm), and per block
        // Wq, Wo [q_dim, e], Wk, Wv [kv_dim, e] and two norms.
        let embed_p = v * e;
        let head_p = if a.tied_embeddings { 0 } else { v * e } + e;
        let attn_p = 2 * e * q_dim + 2 * e * kv_dim + 2 * e;
        let n_ff = match (a.n_ff, a.params) {
            (Some(ff), _) => nonzero(ff, "--n-ff")?,
            (None, Some(p)) => {
                let fixed = embed_p + head_p + nl * attn_p;
                let p = p as u128;
                if p <= fixed {
                    return Err(Error::InvalidArgument(format!(
                        "{p} parameters leave nothing for the feed-forward: embeddings and \
                         attention alone take {fixed}"
                    )));
                }
                // Gate, up and down: 3 · e · n_ff per block.
                let ff = (p - fixed) / (3 * e * nl);
                let ff = usize::try_from(ff).unwrap_or(usize::MAX);
                nonzero(ff, "the feed-forward width derived from --params")?
            }
            (None, None) => (8 * n_embd / 3).div_ceil(256) * 256,
        };
        let layer_p = attn_p + 3 * e * n_ff as u128;
        let derived = embed_p + head_p + nl * layer_p;
        let params = a.params.map_or(derived, u128::from);
        if params == 0 {
            return Err(Error::InvalidArgument("--params must be at least 1".into()));
        }
        let total = bits_to_bytes(params, weight_bits)? as u128;
        if total > MAX_PLAN_BYTES as u128 {
            return Err(Error::InvalidArgument(format!(
                "{params} parameters at {weight_bits} bits are {total} bytes, more than the \
                 {MAX_PLAN_BYTES} a plan handles"
            )));
        }
        // Exact in u128 for any real model; a ratio in f64 past that (the head takes the
        // remainder either way, so the total stays exact).
        let share = |p: u128| -> u64 {
            let v = total.checked_mul(p).map_or_else(
                || (total as f64 * (p as f64 / derived as f64)) as u128,
                |tp| tp / derived,
            );
            u64::try_from(v.min(total)).unwrap_or(u64::MAX)
        };
        let embed_bytes = share(embed_p);
        let layer_bytes = share(layer_p);
        let spent = embed_bytes as u128 + layer_bytes as u128 * nl;
        let head_bytes = u64::try_from(total.saturating_sub(spent)).unwrap_or(u64::MAX);
        let shape = Shape {
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_layer,
        };
        let (cpu, gpu, staging, transfer) = runtime(&shape, n_ctx);
        MemoryModel {
            source: format!(
                "architecture: {params} parameters at {weight_bits} bits, {n_layer} layers, \
                 n_embd {n_embd}, {n_head} heads ({n_head_kv} KV) x {head_dim}, n_ff {n_ff}, \
                 vocab {n_vocab}"
            ),
            n_layer,
            n_ctx,
            embed_bytes,
            layer_weight_bytes: vec![layer_bytes; n_layer],
            cpu_packed_layer_bytes: vec![0; n_layer],
            cpu_packed_head_bytes: 0,
            head_bytes,
            other_bytes: 0,
            tied_embeddings: a.tied_embeddings,
            kv_bits,
            kv_bytes_per_layer: kv_layer_bytes(n_ctx, kv_dim as usize, kv_bits)?,
            cpu_scratch_bytes: cpu,
            gpu_scratch_bytes: gpu,
            gpu_staging_bytes: staging,
            gpu_transfer_bytes: transfer,
        }
        .checked()
    }

    /// Rejects a model whose bytes, all together, pass [`MAX_PLAN_BYTES`], so every sum
    /// [`account`] and [`plan`] form stays far from overflowing.
    fn checked(self) -> Result<MemoryModel> {
        let all = [
            self.weights_total(),
            self.kv_total(),
            self.cpu_scratch_bytes,
            self.gpu_scratch_bytes,
            self.gpu_staging_bytes,
            self.gpu_transfer_bytes,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b));
        if all > MAX_PLAN_BYTES {
            return Err(Error::InvalidArgument(format!(
                "the model needs {all} bytes, more than the {MAX_PLAN_BYTES} a plan handles"
            )));
        }
        Ok(self)
    }

    /// Every weight byte: embedding, blocks, head and unused file tensors.
    pub fn weights_total(&self) -> u64 {
        self.layer_weight_bytes
            .iter()
            .fold(self.embed_bytes, |a, &b| a.saturating_add(b))
            .saturating_add(self.head_bytes)
            .saturating_add(self.other_bytes)
    }

    /// The KV cache of every layer.
    pub fn kv_total(&self) -> u64 {
        self.kv_bytes_per_layer.saturating_mul(self.n_layer as u64)
    }
}

#[cfg(test)]
mod tests;
