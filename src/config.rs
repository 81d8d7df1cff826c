//! Model hyper-parameters read from GGUF metadata (`<arch>.*` keys), for the llama family:
//! llama, mistral, qwen2 (QKV bias, NeoX RoPE), qwen3 (per-head Q/K norms, NeoX RoPE) and
//! others that share the shape.

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs (2i, 2i+1): ggml's "normal" mode, used by llama and mistral (the GGUF
    /// converter permutes Q/K rows so this matches the HF checkpoints).
    Normal,
    /// Halves (i, i + n_rot/2): qwen2, phi3, gemma and the other NeoX-style models.
    Neox,
}

/// Hyper-parameters of a llama-shaped decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Multiplies positions (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// Per-pair RoPE frequency factors, `[n_rot / 2]`: pair i's angle is divided by factor i
    /// (Llama 3.1+'s "llama3" scaling, stored by llama.cpp's converter as the tensor
    /// `rope_freqs.weight`; ggml's `ggml_rope_cache_init` in ggml/src/ggml-cpu/ops.cpp passes
    /// `theta / ff` to `rope_yarn`).
    pub rope_freq_factors: Option<Vec<f32>>,
    /// Dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    pub rope_kind: RopeKind,
    /// The output head reuses the token embedding (no `output.weight` tensor).
    pub tied_embeddings: bool,
    /// Q, K and V projections have bias vectors (qwen2).
    pub qkv_bias: bool,
    /// Each head of Q and K is RMS-normalized (its own `[head_dim]` weight) before RoPE
    /// (qwen3: llama.cpp's `src/models/qwen3.cpp` applies `attn_q_norm` / `attn_k_norm` to the
    /// per-head views of Qcur and Kcur, then `ggml_rope_ext` in NeoX mode).
    pub qk_norm: bool,
    /// Every this-many-th block (blocks l with (l + 1) % step == 0) applies no RoPE (NoPE):
    /// smollm3, whose step of 4 llama.cpp sets in code, not in the file
    /// (`src/models/smollm3.cpp`: `n_no_rope_layer_step = 4`, `use_rope = (il + 1) %
    /// n_no_rope_layer_step != 0`).
    pub no_rope_layer_step: Option<usize>,
}

/// Architectures whose forward pass is the llama one, with the RoPE style each uses. (granite
/// is llama-shaped too but scales the embedding, the residual branches, the attention and the
/// logits by its own factors; it stays refused until those are applied.)
const LLAMA_LIKE: &[(&str, RopeKind)] = &[
    ("llama", RopeKind::Normal),
    ("mistral", RopeKind::Normal),
    ("qwen2", RopeKind::Neox),
    ("qwen3", RopeKind::Neox),
    ("smollm3", RopeKind::Normal),
];

impl Config {
    /// Reads the configuration, naming the key that is missing or wrong.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.get_str("general.architecture")?.to_string();
        let rope_kind = LLAMA_LIKE
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                Error::Config(format!(
                    "architecture {arch:?} is not supported (supported: {})",
                    LLAMA_LIKE
                        .iter()
                        .map(|(a, _)| *a)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        let key = |k: &str| format!("{arch}.{k}");
        let n_embd = g.get_u32(&key("embedding_length"))? as usize;
        let n_layer = g.get_u32(&key("block_count"))? as usize;
        let n_head = g.get_u32(&key("attention.head_count"))? as usize;
        let n_head_kv = g
            .opt(&key("attention.head_count_kv"), Gguf::get_u32)?
            .map_or(n_head, |v| v as usize);
        let n_ff = g.get_u32(&key("feed_forward_length"))? as usize;
        let n_ctx_train = g.get_u32(&key("context_length"))? as usize;
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = g
            .opt(&key("rope.freq_base"), Gguf::get_f32)?
            .unwrap_or(10000.0);
        let scaling_key = key("rope.scaling.type");
        let scaling = match g.get(&scaling_key) {
            None => None,
            Some(_) => Some(g.get_str(&scaling_key)?),
        };
        let rope_freq_scale = match scaling {
            // "llama3" scales by the per-pair factors of `rope_freqs.weight` (read below).
            None | Some("none") | Some("llama3") => 1.0,
            Some("linear") => {
                let f = g.get_f32(&key("rope.scaling.factor"))?;
                if !(f.is_finite() && f > 0.0) {
                    return Err(Error::Config(format!(
                        "{} = {f} must be a positive number",
                        key("rope.scaling.factor")
                    )));
                }
                1.0 / f
            }
            Some(other) => {
                return Err(Error::Config(format!(
                    "{} = {other:?} is not supported (none, linear, llama3)",
                    key("rope.scaling.type")
                )))
            }
        };
        if n_head == 0 || !n_embd.is_multiple_of(n_head) {
            return Err(Error::Config(format!(
                "embedding length {n_embd} is not divisible by the head count {n_head}"
            )));
        }
        let head_dim = g
            .opt(&key("attention.key_length"), Gguf::get_u32)?
            .map_or(n_embd / n_head, |v| v as usize);
        let n_rot = g
            .opt(&key("rope.dimension_count"), Gguf::get_u32)?
            .map_or(head_dim, |v| v as usize);

        let emb = g.require_tensor("token_embd.weight")?;
        let n_vocab = emb.n_rows() as usize;
        let tied_embeddings = g.tensor("output.weight").is_none();
        let qkv_bias = g.tensor("blk.0.attn_q.bias").is_some();
        let qk_norm = g.tensor("blk.0.attn_q_norm.weight").is_some();
        let no_rope_layer_step = (arch == "smollm3").then_some(4);
        let rope_freq_factors = match g.tensor("rope_freqs.weight") {
            None if scaling == Some("llama3") => {
                return Err(Error::Config(format!(
                    "{} = \"llama3\" needs the tensor rope_freqs.weight, which is missing",
                    key("rope.scaling.type")
                )))
            }
            None => None,
            Some(t) => {
                let n = t.n_elements as usize;
                if t.dims.len() != 1 || n != n_rot / 2 {
                    return Err(Error::Tensor {
                        name: t.name.clone(),
                        msg: format!(
                            "dimensions {:?}, expected [{}] (half the {n_rot} rotated dimensions)",
                            t.dims,
                            n_rot / 2
                        ),
                    });
                }
                let f = kernels_ref::dequantize_vec(t.ty, g.tensor_data(t), n).map_err(|e| {
                    Error::Tensor {
                        name: t.name.clone(),
                        msg: e.to_string(),
                    }
                })?;
                if let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                    return Err(Error::Tensor {
                        name: t.name.clone(),
                        msg: format!("frequency factor {bad} is not a positive number"),
                    });
                }
                Some(f)
            }
        };

        let c = Config {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_freq_scale,
            rope_freq_factors,
            n_rot,
            rope_kind,
            tied_embeddings,
            qkv_bias,
            qk_norm,
            no_rope_layer_step,
        };
        c.validate()?;
        Ok(c)
    }

    /// Consistency checks that would otherwise surface as out-of-bounds slices.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.n_layer == 0 || self.n_embd == 0 || self.n_ff == 0 || self.n_vocab == 0 {
            return bad(format!("empty model dimensions: {self:?}"));
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "head count {} is not a multiple of the KV head count {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return bad(format!(
                "RoPE dimension count {} must be even and at most the head size {}",
                self.n_rot, self.head_dim
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad(format!("RMS norm epsilon {} is not valid", self.rms_eps));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!("RoPE base {} is not valid", self.rope_base));
        }
        Ok(())
    }

    /// How this model's forward pass differs from plain llama's, one line each (`memwall
    /// inspect`).
    pub fn differences(&self) -> Vec<String> {
        let mut d = Vec::new();
        let gqa = if self.n_head_kv < self.n_head {
            format!(", grouped-query attention ({} KV heads)", self.n_head_kv)
        } else {
            String::new()
        };
        d.push(format!(
            "{} blocks, width {}, {} heads of {}{gqa}, feed-forward {}",
            self.n_layer, self.n_embd, self.n_head, self.head_dim, self.n_ff
        ));
        if self.head_dim * self.n_head != self.n_embd {
            d.push(format!(
                "head size {} from attention.key_length (not width / heads = {})",
                self.head_dim,
                self.n_embd / self.n_head
            ));
        }
        let pairs = match self.rope_kind {
            RopeKind::Normal => "adjacent pairs",
            RopeKind::Neox => "NeoX pairs (i, i + n_rot/2)",
        };
        d.push(format!(
            "RoPE: {pairs}, {} of {} dims, base {}, position scale {}",
            self.n_rot, self.head_dim, self.rope_base, self.rope_freq_scale
        ));
        if let Some(f) = &self.rope_freq_factors {
            let (lo, hi) = f
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            d.push(format!(
                "RoPE frequency factors per pair (rope_freqs.weight, llama3): {} from {lo} to {hi}",
                f.len()
            ));
        }
        if let Some(step) = self.no_rope_layer_step {
            d.push(format!("no RoPE in every {step}th block (NoPE)"));
        }
        if self.qkv_bias {
            d.push("Q, K and V biases".into());
        }
        if self.qk_norm {
            d.push("per-head RMS norms of Q and K before RoPE".into());
        }
        d.push(if self.tied_embeddings {
            "output head tied to the token embedding".into()
        } else {
            "separate output head".into()
        });
        d
    }

    /// Whether block `l` rotates Q and K (false for smollm3's NoPE blocks).
    pub fn uses_rope(&self, l: usize) -> bool {
        self.no_rope_layer_step
            .is_none_or(|step| !(l + 1).is_multiple_of(step))
    }

    /// Width of the Q projection output.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the K and V projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
