//! The llama-family forward pass, written once against `Backend`.
//!
//! It is split into stages (embedding, one transformer block, output head); the scheduler
//! (`scheduler::exec`) runs each stage on its backend and moves the hidden state between them.

use crate::backend::{Backend, WeightId};
use crate::config::{Config, QkNorm};
use crate::error::{Error, Result};

/// Which logits a forward call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a prompt prefix whose predictions nobody reads).
    None,
    /// The last token's: what sampling needs.
    Last,
    /// Every token's.
    All,
    /// The tokens' from index k of this call on (perplexity scores the second half).
    From(usize),
}

impl Logits {
    /// The rows (first, count) of a batch of `n` tokens starting at index `start_idx` of a
    /// call of `n_total` tokens whose logits are wanted, if any.
    pub fn rows(self, n_total: usize, start_idx: usize, n: usize) -> Option<(usize, usize)> {
        let done = start_idx + n;
        match self {
            Logits::None => None,
            Logits::Last if done == n_total => Some((n - 1, 1)),
            Logits::Last => None,
            Logits::All => Some((0, n)),
            Logits::From(k) if k < done => {
                let first = k.saturating_sub(start_idx);
                Some((first, n - first))
            }
            Logits::From(_) => None,
        }
    }
}

/// Activation buffers of one backend for batches of up to `batch` tokens, made once.
pub struct Scratch<A> {
    pub batch: usize,
    /// [batch, n_embd] hidden state (the residual stream).
    pub x: A,
    /// [batch, n_embd] normalised hidden state.
    pub h: A,
    /// [batch, n_head * head_dim]
    pub q: A,
    /// [batch, n_head_kv * head_dim]
    pub k: A,
    /// [batch, n_head_kv * head_dim]
    pub v: A,
    /// [batch, n_head * head_dim] attention output
    pub att: A,
    /// [batch, n_embd] projection output
    pub o: A,
    /// [batch, n_ff] gate projection, then SwiGLU result
    pub g: A,
    /// [batch, max(n_ff, kv_dim)] up projection (and the normalized K while attention runs in
    /// a model with Q/K norms)
    pub u: A,
    /// [batch, n_embd] rows whose logits are wanted
    pub sel: A,
    /// [batch, n_vocab] logits
    pub logits: A,
}

impl<A> Scratch<A> {
    pub fn new<B: Backend<Act = A>>(b: &mut B, cfg: &Config, batch: usize) -> Result<Self> {
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "batch size must be at least 1".into(),
            ));
        }
        Ok(Scratch {
            batch,
            x: b.alloc(batch * cfg.n_embd)?,
            h: b.alloc(batch * cfg.n_embd)?,
            q: b.alloc(batch * cfg.q_dim())?,
            k: b.alloc(batch * cfg.kv_dim())?,
            v: b.alloc(batch * cfg.kv_dim())?,
            att: b.alloc(batch * cfg.q_dim())?,
            o: b.alloc(batch * cfg.n_embd)?,
            g: b.alloc(batch * cfg.n_ff)?,
            u: b.alloc(batch * cfg.n_ff.max(cfg.kv_dim()))?,
            sel: b.alloc(batch * cfg.n_embd)?,
            logits: b.alloc(batch * cfg.n_vocab)?,
        })
    }
}

/// x = embedding rows of `ids` (n = ids.len() ≤ batch).
pub fn embed_stage<B: Backend>(b: &mut B, s: &mut Scratch<B::Act>, ids: &[u32]) -> Result<()> {
    b.embed(ids, &mut s.x)
}

/// One transformer block on s.x ([n, n_embd]) for tokens at positions pos0..pos0+n.
pub fn layer_stage<B: Backend>(
    b: &mut B,
    cfg: &Config,
    s: &mut Scratch<B::Act>,
    l: usize,
    n: usize,
    pos0: usize,
) -> Result<()> {
    use WeightId::*;
    // Attention block.
    b.rms_norm(AttnNorm(l), &s.x, n, &mut s.h)?;
    b.matmul_qkv(l, &s.h, n, &mut s.q, &mut s.k, &mut s.v)?;
    if cfg.qkv_bias {
        b.add_bias(Bq(l), &mut s.q, n)?;
        b.add_bias(Bk(l), &mut s.k, n)?;
        b.add_bias(Bv(l), &mut s.v, n)?;
    }
    let qk_norm = cfg.qk_norm != QkNorm::None;
    if qk_norm {
        // Rows of head_dim values (each head on its own) or of the whole projection: q into
        // att, k into u (both free here and at least as large: [n, q_dim] and [n, max(n_ff, kv_dim)]),
        // then the handles swapped so RoPE and attention read the normalized values; u is
        // swapped back below, att keeps q's old buffer (the same shape).
        let (qr, kr) = match cfg.qk_norm {
            QkNorm::PerHead => (n * cfg.n_head, n * cfg.n_head_kv),
            _ => (n, n),
        };
        b.rms_norm(QNorm(l), &s.q, qr, &mut s.att)?;
        std::mem::swap(&mut s.q, &mut s.att);
        b.rms_norm(KNorm(l), &s.k, kr, &mut s.u)?;
        std::mem::swap(&mut s.k, &mut s.u);
    }
    if cfg.uses_rope(l) {
        b.rope_qk(l, &mut s.q, &mut s.k, n, (cfg.n_head, cfg.n_head_kv), pos0)?;
    }
    b.attention(l, &s.q, &s.k, &s.v, n, pos0, &mut s.att)?;
    if qk_norm {
        std::mem::swap(&mut s.k, &mut s.u);
    }
    residual(b, cfg, s, Wo(l), PostAttnNorm(l), Att, n)?;
    // Feed-forward block.
    b.rms_norm(FfnNorm(l), &s.x, n, &mut s.h)?;
    if cfg.moe.is_some() {
        b.moe(l, &s.h, n, &mut s.o)?;
        return add_branch(b, cfg, s, PostFfnNorm(l), n);
    }
    b.matmul_gate_up(l, &s.h, n, &mut s.g, &mut s.u)?;
    // SwiGLU / GeGLU written over the gate buffer: each element reads only its own inputs.
    b.glu(&mut s.g, &s.u, n * cfg.n_ff)?;
    residual(b, cfg, s, Down(l), PostFfnNorm(l), Gated, n)
}

/// Which scratch buffer a residual branch's projection reads.
#[derive(Clone, Copy)]
enum BranchInput {
    /// s.att: the attention output.
    Att,
    /// s.g: the gated FFN activations.
    Gated,
}
use BranchInput::{Att, Gated};

/// x += w · input, or x += rms_norm(w · input) with the `post` weights where the model
/// normalizes its branches (gemma's post-attention and post-FFN norms).
fn residual<B: Backend>(
    b: &mut B,
    cfg: &Config,
    s: &mut Scratch<B::Act>,
    w: WeightId,
    post: WeightId,
    input: BranchInput,
    n: usize,
) -> Result<()> {
    let y = match input {
        Att => &s.att,
        Gated => &s.g,
    };
    if !cfg.post_norms && cfg.residual_scale == 1.0 {
        return b.matmul_add(w, y, n, cfg.n_embd, &mut s.o, &mut s.x);
    }
    b.matmul(w, y, n, &mut s.o)?;
    add_branch(b, cfg, s, post, n)
}

/// x += s.o, the branch output (rms_norm(s.o) with the `post` weights where the model
/// normalizes its branches; residual_scale * s.o where it scales them).
fn add_branch<B: Backend>(
    b: &mut B,
    cfg: &Config,
    s: &mut Scratch<B::Act>,
    post: WeightId,
    n: usize,
) -> Result<()> {
    if cfg.residual_scale != 1.0 {
        // granite (no post-norms): x += scale * o.
        return b.add_scaled(&mut s.x, &s.o, cfg.residual_scale, n * cfg.n_embd);
    }
    if !cfg.post_norms {
        return b.add(&mut s.x, &s.o, n * cfg.n_embd);
    }
    b.rms_norm(post, &s.o, n, &mut s.h)?;
    b.add(&mut s.x, &s.h, n * cfg.n_embd)
}

/// Final norm and output head for rows first..first+n_rows of s.x; leaves s.logits:
/// [n_rows, n_vocab].
pub fn head_stage<B: Backend>(
    b: &mut B,
    cfg: &Config,
    s: &mut Scratch<B::Act>,
    first: usize,
    n_rows: usize,
) -> Result<()> {
    b.copy_rows(&s.x, first, n_rows, cfg.n_embd, &mut s.sel)?;
    b.rms_norm(WeightId::OutputNorm, &s.sel, n_rows, &mut s.h)?;
    let out = if cfg.tied_embeddings {
        WeightId::TokEmbd
    } else {
        WeightId::Output
    };
    b.matmul(out, &s.h, n_rows, &mut s.logits)?;
    if cfg.logit_scale != 1.0 {
        b.scale(&mut s.logits, cfg.logit_scale, n_rows * cfg.n_vocab)?;
    }
    if let Some(cap) = cfg.final_logit_softcap {
        b.softcap(&mut s.logits, cap, n_rows * cfg.n_vocab)?;
    }
    Ok(())
}
