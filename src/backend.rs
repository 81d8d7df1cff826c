//! The one interface every compute backend implements (CPU now, GPU next).
//!
//! The model's forward pass (`model.rs`) is written once against this trait. A backend owns
//! its copy of the weights (zero-copy views of the mmap on the CPU, repacked buffers on a GPU)
//! and its KV cache; the model names weights by `WeightId` and hands activations around as the
//! backend's own buffer type, so a backend can keep them on its device between ops. The
//! scheduler can give different layers to different backends: the hidden state crosses a
//! boundary through `read`/`write`.

use crate::config::{Config, QkNorm};
use crate::error::Result;
use crate::kv_type::KvTypes;

/// A weight tensor of a llama-shaped model, by role and layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightId {
    TokEmbd,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Wq(usize),
    Wk(usize),
    Wv(usize),
    Bq(usize),
    Bk(usize),
    Bv(usize),
    /// Per-head RMS norms of Q and K before RoPE (`[head_dim]`, qwen3).
    QNorm(usize),
    KNorm(usize),
    Wo(usize),
    /// RMS norms of the attention output and of the FFN output before their residual adds
    /// (`[n_embd]`, gemma2/3).
    PostAttnNorm(usize),
    PostFfnNorm(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// The router of a mixture-of-experts block: `[n_embd, n_expert]`, one logit per expert.
    GateInp(usize),
    /// Every expert's gate, up and down matrices stacked along a third axis: `[n_embd,
    /// n_ff_exp, n_expert]` (down: `[n_ff_exp, n_embd, n_expert]`); expert e is rows
    /// e * n_ff_exp.. of the 2-D view (e * n_embd.. for down), contiguous in the file.
    GateExps(usize),
    UpExps(usize),
    DownExps(usize),
    /// The shared expert every token runs (qwen2moe): its gate `[n_embd]` (one logit, through
    /// a sigmoid) and its feed-forward matrices (`[n_embd, n_ff_shexp]`, down `[n_ff_shexp,
    /// n_embd]`).
    GateInpShexp(usize),
    GateShexp(usize),
    UpShexp(usize),
    DownShexp(usize),
}

impl WeightId {
    /// The GGUF tensor name (llama.cpp's naming).
    pub fn tensor_name(self) -> String {
        use WeightId::*;
        match self {
            TokEmbd => "token_embd.weight".into(),
            OutputNorm => "output_norm.weight".into(),
            Output => "output.weight".into(),
            AttnNorm(l) => format!("blk.{l}.attn_norm.weight"),
            Wq(l) => format!("blk.{l}.attn_q.weight"),
            Wk(l) => format!("blk.{l}.attn_k.weight"),
            Wv(l) => format!("blk.{l}.attn_v.weight"),
            Bq(l) => format!("blk.{l}.attn_q.bias"),
            Bk(l) => format!("blk.{l}.attn_k.bias"),
            Bv(l) => format!("blk.{l}.attn_v.bias"),
            QNorm(l) => format!("blk.{l}.attn_q_norm.weight"),
            KNorm(l) => format!("blk.{l}.attn_k_norm.weight"),
            Wo(l) => format!("blk.{l}.attn_output.weight"),
            PostAttnNorm(l) => format!("blk.{l}.post_attention_norm.weight"),
            PostFfnNorm(l) => format!("blk.{l}.post_ffw_norm.weight"),
            FfnNorm(l) => format!("blk.{l}.ffn_norm.weight"),
            Gate(l) => format!("blk.{l}.ffn_gate.weight"),
            Up(l) => format!("blk.{l}.ffn_up.weight"),
            Down(l) => format!("blk.{l}.ffn_down.weight"),
            GateInp(l) => format!("blk.{l}.ffn_gate_inp.weight"),
            GateExps(l) => format!("blk.{l}.ffn_gate_exps.weight"),
            UpExps(l) => format!("blk.{l}.ffn_up_exps.weight"),
            DownExps(l) => format!("blk.{l}.ffn_down_exps.weight"),
            GateInpShexp(l) => format!("blk.{l}.ffn_gate_inp_shexp.weight"),
            GateShexp(l) => format!("blk.{l}.ffn_gate_shexp.weight"),
            UpShexp(l) => format!("blk.{l}.ffn_up_shexp.weight"),
            DownShexp(l) => format!("blk.{l}.ffn_down_shexp.weight"),
        }
    }

    /// The transformer block the weight belongs to (`None`: embedding, output norm, head).
    pub fn layer_index(self) -> Option<usize> {
        use WeightId::*;
        match self {
            TokEmbd | OutputNorm | Output => None,
            AttnNorm(l) | Wq(l) | Wk(l) | Wv(l) | Bq(l) | Bk(l) | Bv(l) | QNorm(l) | KNorm(l)
            | Wo(l) | PostAttnNorm(l) | PostFfnNorm(l) | FfnNorm(l) | Gate(l) | Up(l) | Down(l)
            | GateInp(l) | GateExps(l) | UpExps(l) | DownExps(l) | GateInpShexp(l)
            | GateShexp(l) | UpShexp(l) | DownShexp(l) => Some(l),
        }
    }

    /// Whether this is a stack of every expert's matrices (`[cols, rows, n_expert]`): read an
    /// expert at a time, never packed or uploaded whole.
    pub fn is_expert_stack(self) -> bool {
        matches!(
            self,
            WeightId::GateExps(_) | WeightId::UpExps(_) | WeightId::DownExps(_)
        )
    }
}

/// The matrices of block `l` (its norms, biases and the shared expert's gate vector are not):
/// the attention projections, then the dense feed-forward's or, in a mixture-of-experts block,
/// the router, the expert stacks and the shared expert's.
pub(crate) fn block_matrices(cfg: &Config, l: usize) -> Vec<WeightId> {
    use WeightId::*;
    let mut v = vec![Wq(l), Wk(l), Wv(l), Wo(l)];
    match &cfg.moe {
        None => v.extend([Gate(l), Up(l), Down(l)]),
        Some(m) => {
            v.extend([GateInp(l), GateExps(l), UpExps(l), DownExps(l)]);
            if m.n_ff_shared.is_some() {
                v.extend([GateShexp(l), UpShexp(l), DownShexp(l)]);
            }
        }
    }
    v
}

/// Compute operations of a llama-shaped forward pass. Shapes are row-major `[n_tokens, width]`
/// unless noted; `n` is the number of tokens in the current batch (at most the batch size the
/// buffers were allocated for).
pub trait Backend {
    /// An activation buffer on this backend's device.
    type Act;

    /// Short name for logs ("cpu", "vulkan:lavapipe", ...).
    fn name(&self) -> String;

    /// A buffer of `len` f32 values.
    fn alloc(&mut self, len: usize) -> Result<Self::Act>;
    /// Copies host values into the start of `dst`.
    fn write(&mut self, dst: &mut Self::Act, src: &[f32]) -> Result<()>;
    /// Copies the start of `src` to the host.
    fn read(&mut self, src: &Self::Act, dst: &mut [f32]) -> Result<()>;

    /// out: [n, n_embd] = rows `ids` of the token embedding times `Config::embed_scale`.
    fn embed(&mut self, ids: &[u32], out: &mut Self::Act) -> Result<()>;
    /// out: [n, w] = RMSNorm of x: [n, w] scaled by the norm weight `norm` ([w]).
    fn rms_norm(
        &mut self,
        norm: WeightId,
        x: &Self::Act,
        n: usize,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// out: [n, rows] = x: [n, cols] · Wᵀ for the weight `w` ([rows, cols]).
    fn matmul(&mut self, w: WeightId, x: &Self::Act, n: usize, out: &mut Self::Act) -> Result<()>;
    /// q, k, v = x · Wq/Wk/Wvᵀ of layer `l` (x: [n, n_embd]). A backend may run the three as
    /// one stacked matmul over a single read of x; the results must equal the three matmuls'.
    #[allow(clippy::too_many_arguments)]
    fn matmul_qkv(
        &mut self,
        l: usize,
        x: &Self::Act,
        n: usize,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &mut Self::Act,
    ) -> Result<()> {
        self.matmul(WeightId::Wq(l), x, n, q)?;
        self.matmul(WeightId::Wk(l), x, n, k)?;
        self.matmul(WeightId::Wv(l), x, n, v)
    }
    /// g, u = x · Gate/Upᵀ of layer `l`, as [`Backend::matmul_qkv`] for the feed-forward.
    fn matmul_gate_up(
        &mut self,
        l: usize,
        x: &Self::Act,
        n: usize,
        g: &mut Self::Act,
        u: &mut Self::Act,
    ) -> Result<()> {
        self.matmul(WeightId::Gate(l), x, n, g)?;
        self.matmul(WeightId::Up(l), x, n, u)
    }
    /// x: [n, rows] += y: [n, cols] · Wᵀ (the residual add folded into the projection that
    /// feeds it); `tmp` ([n, rows]) is scratch the default (matmul, then add) uses. The
    /// result must equal that default's.
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &mut self,
        w: WeightId,
        y: &Self::Act,
        n: usize,
        rows: usize,
        tmp: &mut Self::Act,
        x: &mut Self::Act,
    ) -> Result<()> {
        self.matmul(w, y, n, tmp)?;
        self.add(x, tmp, n * rows)
    }
    /// x: [n, w] += bias ([w]) on every row.
    fn add_bias(&mut self, bias: WeightId, x: &mut Self::Act, n: usize) -> Result<()>;
    /// RoPE in place on x: [n, n_heads, head_dim] with block `layer`'s base and scale
    /// (`Config::rope_of`); token i is at position pos0 + i.
    fn rope(
        &mut self,
        layer: usize,
        x: &mut Self::Act,
        n: usize,
        n_heads: usize,
        pos0: usize,
    ) -> Result<()>;
    /// RoPE on the queries q: [n, n_head, head_dim] and the keys k: [n, n_head_kv, head_dim],
    /// as `rope` on each; a backend may rotate both in one pass (the GPU: one launch fewer).
    fn rope_qk(
        &mut self,
        layer: usize,
        q: &mut Self::Act,
        k: &mut Self::Act,
        n: usize,
        (n_head, n_head_kv): (usize, usize),
        pos0: usize,
    ) -> Result<()> {
        self.rope(layer, q, n, n_head, pos0)?;
        self.rope(layer, k, n, n_head_kv, pos0)
    }
    /// Stores k, v: [n, n_head_kv, head_dim] in layer `layer`'s KV cache at positions
    /// pos0..pos0+n, then out: [n, n_head, head_dim] = causal attention of q: [n, n_head,
    /// head_dim] over positions 0..=pos0+i (from pos0+i-window+1 in a sliding-window block,
    /// `Config::window`), scores scaled by `Config::attn_scale`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        layer: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        n: usize,
        pos0: usize,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// out: [n, n_embd] = block `layer`'s mixture of experts on x: [n, n_embd] (the normalized
    /// FFN input): each token's router logits through a softmax, its `n_expert_used` most
    /// probable experts' feed-forwards weighted by their probabilities (divided by their sum
    /// where `Moe::norm_weights`), plus the shared expert's times sigmoid(x · its gate) where
    /// the model has one. A backend without expert kernels refuses (the scheduler keeps such
    /// blocks off it).
    fn moe(&mut self, layer: usize, x: &Self::Act, n: usize, out: &mut Self::Act) -> Result<()> {
        let _ = (x, n, out);
        Err(crate::error::Error::InvalidArgument(format!(
            "block {layer} is a mixture of experts, which {} does not run",
            self.name()
        )))
    }
    /// gate[i] = act(gate[i]) * up[i] for the first `len` elements, in place, with the model's
    /// activation (`Config::ffn_act`: SwiGLU or GeGLU).
    fn glu(&mut self, gate: &mut Self::Act, up: &Self::Act, len: usize) -> Result<()>;
    /// x[i] = cap * tanh(x[i] / cap) for the first `len` elements (final-logit soft-capping).
    /// The default goes through the host.
    fn softcap(&mut self, x: &mut Self::Act, cap: f32, len: usize) -> Result<()> {
        let mut v = vec![0f32; len];
        self.read(x, &mut v)?;
        crate::cpu::softcap(&mut v, cap);
        self.write(x, &v)
    }
    /// x[i] += y[i] for the first `len` elements.
    fn add(&mut self, x: &mut Self::Act, y: &Self::Act, len: usize) -> Result<()>;
    /// x[i] += s * y[i] for the first `len` elements, `s * y[i]` rounded to f32 first
    /// (granite's scaled residual branches). The default goes through the host.
    fn add_scaled(&mut self, x: &mut Self::Act, y: &Self::Act, s: f32, len: usize) -> Result<()> {
        let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
        self.read(x, &mut a)?;
        self.read(y, &mut b)?;
        let sum = a.clone();
        kernels_ref::add_scaled(&sum, &b, s, &mut a);
        self.write(x, &a)
    }
    /// x[i] *= s for the first `len` elements (granite's logit scale). The default goes through
    /// the host.
    fn scale(&mut self, x: &mut Self::Act, s: f32, len: usize) -> Result<()> {
        let mut v = vec![0f32; len];
        self.read(x, &mut v)?;
        kernels_ref::scale(&mut v, s);
        self.write(x, &v)
    }
    /// out: [n_rows, width] = rows first..first+n_rows of x: [*, width].
    fn copy_rows(
        &mut self,
        x: &Self::Act,
        first: usize,
        n_rows: usize,
        width: usize,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// The index of the largest value in each of `n_rows` rows of x: `[n_rows, width]` (ties
    /// to the lowest index, NaN skipped): greedy sampling. The default reads the rows back; a
    /// GPU backend reduces on the device and reads back only the ids.
    fn argmax(&mut self, x: &Self::Act, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        let mut v = vec![0f32; n_rows * width];
        self.read(x, &mut v)?;
        Ok(v.chunks(width.max(1))
            .map(|row| crate::sampler::argmax(row) as u32)
            .collect())
    }
    /// Copies positions 0..n_pos of layer `layer`'s cached keys and values to the host:
    /// k, v: [n_pos, n_head_kv * head_dim] each. Moving a layer to another device carries its
    /// cache this way, so the move does not change any result.
    fn read_kv(&mut self, layer: usize, n_pos: usize, k: &mut [f32], v: &mut [f32]) -> Result<()>;
    /// Fills positions 0..n_pos of layer `layer`'s cache from k, v: [n_pos, n_head_kv *
    /// head_dim], allocating the layer's cache if this backend holds none for it yet.
    fn write_kv(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()>;
    /// The cache's element types (the layout of [`Backend::read_kv_raw`]).
    fn kv_types(&self) -> KvTypes;
    /// Copies positions 0..n_pos of layer `layer`'s cache as stored, in `kv_types()`'s GGUF
    /// layouts: `kv_types().k.bytes(n_pos * kv_dim)` bytes into k (likewise v). Two backends
    /// of the same types hold the same bytes, so moving a layer this way is lossless for every
    /// type (through f32, a quantized cache would be quantized a second time).
    fn read_kv_raw(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut Vec<u8>,
        v: &mut Vec<u8>,
    ) -> Result<()>;
    /// Fills positions 0.. of layer `layer`'s cache from bytes in `kv_types()`'s layouts (what
    /// [`Backend::read_kv_raw`] gives), allocating the cache as `write_kv` does.
    fn write_kv_raw(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<()>;
    /// Context shift of layer `layer`'s cache holding positions 0..s.n_pos: drops positions
    /// s.keep..s.keep+s.discard, moves the later ones down by s.discard and re-rotates their
    /// keys by -s.discard positions with `cfg`'s RoPE. The default goes through the host
    /// (`read_kv`, rotate, `write_kv`); a backend may do it on its device, with the same result
    /// to rounding.
    fn shift_kv(&mut self, layer: usize, cfg: &Config, s: KvShift) -> Result<()> {
        shift_kv_host(self, layer, cfg, s)
    }
    /// Frees layer `layer`'s cache (the layer now runs on another device).
    fn drop_kv(&mut self, layer: usize);
    /// Waits for queued work (GPU); a no-op on the CPU.
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
}

/// One shift of a cache holding positions 0..n_pos: positions keep..keep+discard are dropped,
/// keep+discard..n_pos move to keep..n_pos-discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShift {
    pub keep: usize,
    pub discard: usize,
    pub n_pos: usize,
}

impl KvShift {
    /// Checks that the shift stays inside the cached positions.
    pub fn check(&self) -> Result<()> {
        if self
            .keep
            .checked_add(self.discard)
            .is_none_or(|e| e > self.n_pos)
        {
            return Err(crate::error::Error::InvalidArgument(format!(
                "context shift keeping {} and dropping {} of {} cached positions",
                self.keep, self.discard, self.n_pos
            )));
        }
        Ok(())
    }
}

/// Shifts layer `layer`'s cache through the host: reads positions 0..n_pos as f32, moves the
/// rows, re-rotates the moved keys with the model's RoPE (normal or NeoX, its base and scale)
/// and writes positions 0..n_pos-discard back. The default of [`Backend::shift_kv`].
pub fn shift_kv_host<B: Backend + ?Sized>(
    b: &mut B,
    layer: usize,
    cfg: &Config,
    s: KvShift,
) -> Result<()> {
    s.check()?;
    if s.discard == 0 {
        return Ok(());
    }
    let kv_dim = cfg.kv_dim();
    // k, v: [n_pos, kv_dim], then [n_pos - discard, kv_dim] after the move.
    let mut k = vec![0f32; s.n_pos * kv_dim];
    let mut v = vec![0f32; s.n_pos * kv_dim];
    b.read_kv(layer, s.n_pos, &mut k, &mut v)?;
    let from = (s.keep + s.discard) * kv_dim;
    k.copy_within(from.., s.keep * kv_dim);
    v.copy_within(from.., s.keep * kv_dim);
    let n_new = s.n_pos - s.discard;
    k.truncate(n_new * kv_dim);
    v.truncate(n_new * kv_dim);
    if !cfg.uses_rope(layer) {
        // A NoPE block's keys carry no position: moving them is the whole shift.
        return b.write_kv(layer, &k, &v);
    }
    // `cfg` is the session's (`Config::for_context`): its factors are the context's.
    crate::cpu::rope_shift(
        &mut k[s.keep * kv_dim..],
        n_new - s.keep,
        cfg.n_head_kv,
        cfg.head_dim,
        -(s.discard as i64),
        &cfg.rotation(layer, 0),
    )?;
    b.write_kv(layer, &k, &v)
}

/// Every weight the forward pass uses, with the shape ([ne0, ne1]) it must have.
pub(crate) fn expected_weights(cfg: &Config) -> Vec<(WeightId, Vec<usize>)> {
    use WeightId::*;
    let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let mut v = vec![(TokEmbd, vec![e, cfg.n_vocab]), (OutputNorm, vec![e])];
    if !cfg.tied_embeddings {
        v.push((Output, vec![e, cfg.n_vocab]));
    }
    for l in 0..cfg.n_layer {
        v.extend([
            (AttnNorm(l), vec![e]),
            (Wq(l), vec![e, q]),
            (Wk(l), vec![e, kv]),
            (Wv(l), vec![e, kv]),
            (Wo(l), vec![q, e]),
            (FfnNorm(l), vec![e]),
        ]);
        match &cfg.moe {
            None => v.extend([
                (Gate(l), vec![e, ff]),
                (Up(l), vec![e, ff]),
                (Down(l), vec![ff, e]),
            ]),
            Some(m) => {
                let (x, fe) = (m.n_expert, m.n_ff_exp);
                v.extend([
                    (GateInp(l), vec![e, x]),
                    (GateExps(l), vec![e, fe, x]),
                    (UpExps(l), vec![e, fe, x]),
                    (DownExps(l), vec![fe, e, x]),
                ]);
                if let (Some(_), true) = (m.n_ff_shared, m.shared_gate) {
                    v.push((GateInpShexp(l), vec![e]));
                }
                if let Some(fs) = m.n_ff_shared {
                    v.extend([
                        (GateShexp(l), vec![e, fs]),
                        (UpShexp(l), vec![e, fs]),
                        (DownShexp(l), vec![fs, e]),
                    ]);
                }
            }
        }
        if cfg.qkv_bias {
            v.extend([(Bq(l), vec![q]), (Bk(l), vec![kv]), (Bv(l), vec![kv])]);
        }
        // Per head ([head_dim]) or over the whole projection ([q_dim] and [kv_dim], olmoe).
        let (qn, kn) = match cfg.qk_norm {
            QkNorm::None => (0, 0),
            QkNorm::PerHead => (cfg.head_dim, cfg.head_dim),
            QkNorm::Whole => (q, kv),
        };
        if qn > 0 {
            v.extend([(QNorm(l), vec![qn]), (KNorm(l), vec![kn])]);
        }
        if cfg.post_norms {
            v.extend([(PostAttnNorm(l), vec![e]), (PostFfnNorm(l), vec![e])]);
        }
    }
    v
}
