//! Model hyper-parameters read from GGUF metadata (`<arch>.*` keys), for the llama family:
//! llama, mistral, qwen2 (QKV bias, NeoX RoPE), qwen3 (per-head Q/K norms, NeoX RoPE), gemma3
//! (scaled embedding, post-norms, GeGLU, interleaved sliding-window layers), gemma2 (the same
//! with every other layer local and soft-capped attention scores), phi3 (fused QKV and
//! gate/up tensors, partial rotary, LongRoPE), the mixtures of experts qwen3moe, qwen2moe
//! (a gated shared expert), olmoe (whole-projection Q/K norms) and llama with experts
//! (Mixtral), and others that share the shape. One forward pass reads these differences;
//! there is no copy of the model per architecture.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use kernels_ref::Rotation;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs (2i, 2i+1): ggml's "normal" mode, used by llama and mistral (the GGUF
    /// converter permutes Q/K rows so this matches the HF checkpoints).
    Normal,
    /// Halves (i, i + n_rot/2): qwen2, phi3, gemma and the other NeoX-style models.
    Neox,
}

/// The activation of the gated feed-forward unit: down(act(gate(x)) * up(x)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU: silu(g) = g * sigmoid(g) (llama and most others).
    Silu,
    /// GeGLU with the tanh form of GELU, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))):
    /// gemma (llama.cpp's `src/models/gemma3.cpp` builds its FFN with `LLM_FFN_GELU`,
    /// `LLM_FFN_PAR`, and ggml's `ggml_gelu` is the tanh approximation).
    GeluTanh,
}

/// Whether and how Q and K are RMS-normalized before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head's `[head_dim]` row on its own, one weight shared by the heads (qwen3,
    /// qwen3moe: llama.cpp's `src/models/qwen3.cpp` normalizes the per-head views of Qcur and
    /// Kcur).
    PerHead,
    /// The whole projection of a token (`[q_dim]` and `[kv_dim]` weights, olmoe:
    /// `src/models/olmoe.cpp` normalizes Qcur and Kcur before splitting them into heads).
    Whole,
}

/// A mixture-of-experts feed-forward in every block (qwen3moe, qwen2moe, olmoe, and llama
/// files with experts: Mixtral). llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) with a
/// softmax gate: the router's logits through a softmax, the `n_expert_used` largest kept,
/// their probabilities as the experts' weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Feed-forward width of one expert.
    pub n_ff_exp: usize,
    /// The kept probabilities are divided by their sum (`norm_w`: true for qwen3moe and
    /// llama, false for qwen2moe and olmoe, as their graph builders pass it).
    pub norm_weights: bool,
    /// Width of the shared expert every token also runs (qwen2moe; granitemoe files of
    /// Granite's shared-expert models).
    pub n_ff_shared: Option<usize>,
    /// The shared expert's output is scaled by the sigmoid of its own gate
    /// (`ffn_gate_inp_shexp`: qwen2moe), or added as it is (granitemoe: llama.cpp's
    /// src/models/granite.cpp adds `ffn_shexp` to the routed sum).
    pub shared_gate: bool,
}

/// Sliding-window (local) attention on some layers, as gemma3 interleaves it with global
/// layers.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// A query at position p sees keys at positions p - size + 1 ..= p: llama.cpp's
    /// `is_masked_swa` (src/llama-hparams.h) masks key p0 for query p1 when `p1 - p0 >= n_swa`
    /// (LLAMA_SWA_TYPE_STANDARD).
    pub size: usize,
    /// `[n_layer]`: whether each layer is local.
    pub layers: Vec<bool>,
    /// RoPE base of the local layers (`<arch>.rope.freq_base_swa`, else 10000: llama.cpp's
    /// `rope_freq_base_train_swa` default), whose position scale is 1 (linear scaling applies
    /// to the global layers only, llama.cpp's `rope_freq_scale_train_swa`).
    pub rope_base: f32,
    /// Position scale of the local layers: 1 for gemma3, the global one for gemma2.
    pub rope_scale: f32,
}

/// Phi-3's LongRoPE: two sets of per-pair frequency factors, the long ones for contexts past
/// the length the model was first trained at (llama.cpp's `llama_model::get_rope_factors` in
/// src/llama-model.cpp picks `rope_long` when `n_ctx_seq > n_ctx_orig_yarn`, else
/// `rope_short`).
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// `[n_rot / 2]` (`rope_factors_short.weight`).
    pub short: Vec<f32>,
    /// `[n_rot / 2]` (`rope_factors_long.weight`).
    pub long: Vec<f32>,
    /// `<arch>.rope.scaling.original_context_length` (else the training context).
    pub orig_ctx: usize,
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
    /// Phi-3's long and short factors, of which `rope_factors(n_ctx)` picks one; when set,
    /// `rope_freq_factors` holds the short ones.
    pub long_rope: Option<LongRope>,
    /// Multiplies the rotated dimensions of Q and K after RoPE (`rope.scaling.attn_factor`,
    /// LongRoPE's sqrt(1 + ln(s) / ln(n_orig)) as llama.cpp's converter writes it, conversion/
    /// phi.py): ggml's `rope_yarn` multiplies cos and sin by this `mscale` (with YaRN's
    /// extrapolation off, as for phi3), so the dimensions past `n_rot` keep their scale.
    pub rope_attn_factor: f32,
    /// Dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    pub rope_kind: RopeKind,
    /// The output head reuses the token embedding (no `output.weight` tensor).
    pub tied_embeddings: bool,
    /// Q, K and V projections have bias vectors (qwen2).
    pub qkv_bias: bool,
    /// Q and K are RMS-normalized (`attn_q_norm` / `attn_k_norm`) before RoPE.
    pub qk_norm: QkNorm,
    /// The feed-forward is a mixture of experts (in every block).
    pub moe: Option<Moe>,
    /// Every this-many-th block (blocks l with (l + 1) % step == 0) applies no RoPE (NoPE):
    /// smollm3, whose step of 4 llama.cpp sets in code, not in the file
    /// (`src/models/smollm3.cpp`: `n_no_rope_layer_step = 4`, `use_rope = (il + 1) %
    /// n_no_rope_layer_step != 0`); 1 (no RoPE anywhere) for a granite file whose
    /// `rope.scaling.finetuned` is false.
    pub no_rope_layer_step: Option<usize>,
    pub ffn_act: FfnAct,
    /// Multiplies every token embedding row: 1, or sqrt(n_embd) for gemma (llama.cpp's
    /// `src/models/gemma3.cpp`: `ggml_scale(ctx0, inpL, sqrtf(n_embd))`).
    pub embed_scale: f32,
    /// The attention output and the FFN output are RMS-normalized again (their own weights,
    /// `post_attention_norm` and `post_ffw_norm`) before their residual adds: gemma2/3.
    pub post_norms: bool,
    /// Attention score scale: 1 / sqrt(head_dim), except gemma3 27B's 1 / sqrt(n_embd /
    /// n_head) (llama.cpp's `llama_model_gemma3::load_arch_hparams`, `f_attention_scale`).
    pub attn_scale: f32,
    pub sliding_window: Option<SlidingWindow>,
    /// Attention scores become cap * tanh(score / cap) before the softmax
    /// (`<arch>.attn_logit_softcapping`, gemma2: llama.cpp's `build_attn_mha` applies it to
    /// the scaled Q times K when `hparams.attn_soft_cap`).
    pub attn_logit_softcap: Option<f32>,
    /// Final logits become cap * tanh(logits / cap) (`<arch>.final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// Multiplies each residual branch (the attention output, the FFN output) before its add:
    /// 1, or granite's `<arch>.residual_scale` (llama.cpp's src/models/granite.cpp,
    /// `f_residual_scale`).
    pub residual_scale: f32,
    /// Multiplies the final logits: 1, or 1 / granite's `<arch>.logit_scale`.
    pub logit_scale: f32,
}

/// Architectures the forward pass runs, with the RoPE style each uses (llama.cpp's
/// `llama_model_rope_type` in src/llama-model.cpp).
const SUPPORTED: &[(&str, RopeKind)] = &[
    ("llama", RopeKind::Normal),
    ("mistral", RopeKind::Normal),
    ("qwen2", RopeKind::Neox),
    ("qwen3", RopeKind::Neox),
    ("qwen2moe", RopeKind::Neox),
    ("qwen3moe", RopeKind::Neox),
    ("olmoe", RopeKind::Neox),
    ("smollm3", RopeKind::Normal),
    ("gemma2", RopeKind::Neox),
    ("gemma3", RopeKind::Neox),
    ("phi3", RopeKind::Neox),
    ("granite", RopeKind::Normal),
    ("granitemoe", RopeKind::Normal),
];

/// Gemma 3's local/global interleave when the file gives none: llama.cpp's
/// `load_swa_pattern(ml, 6)` in src/models/gemma3.cpp, which with `set_swa_pattern` in
/// src/llama-hparams.cpp makes layer l local when `l % 6 < 5` (every sixth layer global).
const GEMMA3_SWA_PATTERN: usize = 6;
/// Gemma 2's: every other layer local (`load_swa_pattern(ml, 2)` in src/models/gemma2.cpp).
const GEMMA2_SWA_PATTERN: usize = 2;

impl Config {
    /// Reads the configuration, naming the key that is missing or wrong.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.get_str("general.architecture")?.to_string();
        let rope_kind = SUPPORTED
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                Error::Config(format!(
                    "architecture {arch:?} is not supported (supported: {})",
                    SUPPORTED
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
        // A fused bias (`attn_qkv.bias`) is split with its weight by `unfuse`.
        let qkv_bias =
            g.tensor("blk.0.attn_q.bias").is_some() || g.tensor("blk.0.attn_qkv.bias").is_some();
        let qk_norm = match g.tensor("blk.0.attn_q_norm.weight") {
            None => QkNorm::None,
            Some(t) if t.n_elements as usize == head_dim => QkNorm::PerHead,
            Some(_) => QkNorm::Whole,
        };
        let moe = moe_of(g, &arch, n_ff)?;
        let granite = matches!(arch.as_str(), "granite" | "granitemoe");
        // granite: `rope.scaling.finetuned` switches RoPE on (the default) or off in every
        // block (llama.cpp's granite hparams: "Granite uses rope_finetuned as a switch for
        // rope"); a step of 1 makes every block NoPE.
        let granite_nope = granite
            && !g
                .opt(&key("rope.scaling.finetuned"), Gguf::get_bool)?
                .unwrap_or(true);
        let no_rope_layer_step = match arch.as_str() {
            "smollm3" => Some(4),
            _ if granite_nope => Some(1),
            _ => None,
        };
        let rope_freq_factors = match g.tensor("rope_freqs.weight") {
            None if scaling == Some("llama3") => {
                return Err(Error::Config(format!(
                    "{} = \"llama3\" needs the tensor rope_freqs.weight, which is missing",
                    key("rope.scaling.type")
                )))
            }
            None => None,
            Some(t) => Some(factors(g, t, n_rot)?),
        };

        let long_rope =
            match (
                g.tensor("rope_factors_long.weight"),
                g.tensor("rope_factors_short.weight"),
            ) {
                (None, None) => None,
                (Some(long), Some(short)) => Some(LongRope {
                    short: factors(g, short, n_rot)?,
                    long: factors(g, long, n_rot)?,
                    orig_ctx: g
                        .opt(&key("rope.scaling.original_context_length"), Gguf::get_u32)?
                        .map_or(n_ctx_train, |v| v as usize),
                }),
                (Some(_), None) | (None, Some(_)) => return Err(Error::Config(
                    "LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight"
                        .into(),
                )),
            };
        if long_rope.is_some() && rope_freq_factors.is_some() {
            return Err(Error::Config(
                "both rope_freqs.weight and LongRoPE factors are present".into(),
            ));
        }
        let rope_freq_factors = match &long_rope {
            Some(lr) => Some(lr.short.clone()),
            None => rope_freq_factors,
        };
        let rope_attn_factor = g
            .opt(&key("rope.scaling.attn_factor"), Gguf::get_f32)?
            .unwrap_or(1.0);

        let gemma3 = arch == "gemma3";
        let gemma2 = arch == "gemma2";
        let gemma = gemma2 || gemma3;
        // gemma only: phi3 files state a window too, but llama.cpp runs them with global
        // attention (src/models/phi3.cpp, `load_arch_hparams`: "Phi SWA is currently disabled",
        // `swa_type = LLAMA_SWA_TYPE_NONE`), and agreeing with it is the goal.
        let window_size = g.opt(&key("attention.sliding_window"), Gguf::get_u32)?;
        let sliding_window = match window_size {
            Some(size) if gemma3 && size > 0 => Some(SlidingWindow {
                size: size as usize,
                layers: swa_layers(
                    g,
                    &key("attention.sliding_window_pattern"),
                    n_layer,
                    GEMMA3_SWA_PATTERN,
                )?,
                rope_base: g
                    .opt(&key("rope.freq_base_swa"), Gguf::get_f32)?
                    .unwrap_or(10000.0),
                rope_scale: 1.0,
            }),
            // gemma2: every other block local (llama.cpp's `load_swa_pattern(ml, 2)` in
            // src/models/gemma2.cpp), 4096 positions when the file does not say, and the local
            // blocks' RoPE is the global one (`rope_freq_base_train_swa =
            // rope_freq_base_train`, likewise the scale) unless `rope.freq_base_swa` is given.
            _ if gemma2 => Some(SlidingWindow {
                size: window_size.filter(|&w| w > 0).unwrap_or(4096) as usize,
                layers: swa_layers(
                    g,
                    &key("attention.sliding_window_pattern"),
                    n_layer,
                    GEMMA2_SWA_PATTERN,
                )?,
                rope_base: g
                    .opt(&key("rope.freq_base_swa"), Gguf::get_f32)?
                    .unwrap_or(rope_base),
                rope_scale: rope_freq_scale,
            }),
            _ => None,
        };
        // gemma2 caps the attention scores (llama.cpp sets `attn_soft_cap` for gemma2 alone).
        let attn_logit_softcap = match gemma2 {
            true => g
                .opt(&key("attn_logit_softcapping"), Gguf::get_f32)?
                .filter(|&c| c != 0.0),
            false => None,
        };
        let final_logit_softcap = g
            .opt(&key("final_logit_softcapping"), Gguf::get_f32)?
            .filter(|&c| c != 0.0);
        // Gemma 3 27B (62 blocks) and Gemma 2 27B (46 blocks) scale by the model width per head
        // instead of the head size (`f_attention_scale` in src/models/gemma3.cpp, gemma2.cpp).
        let attn_scale = if (gemma3 && n_layer == 62) || (gemma2 && n_layer == 46) {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        // granite's four multipliers; 0 (or absent) leaves that one off, as llama.cpp's
        // `if (hparams.f_..._scale)` tests do.
        let granite_scale = |k: &str| -> Result<Option<f32>> {
            Ok(match granite {
                true => g.opt(&key(k), Gguf::get_f32)?.filter(|&v| v != 0.0),
                false => None,
            })
        };
        let attn_scale = granite_scale("attention.scale")?.unwrap_or(attn_scale);
        let residual_scale = granite_scale("residual_scale")?.unwrap_or(1.0);
        let logit_scale = granite_scale("logit_scale")?.map_or(1.0, |s| 1.0 / s);
        let embed_scale = match granite_scale("embedding_scale")? {
            Some(s) => s,
            None if gemma => (n_embd as f32).sqrt(),
            None => 1.0,
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
            long_rope,
            rope_attn_factor,
            n_rot,
            rope_kind,
            tied_embeddings,
            qkv_bias,
            qk_norm,
            moe,
            no_rope_layer_step,
            ffn_act: if gemma {
                FfnAct::GeluTanh
            } else {
                FfnAct::Silu
            },
            // RMSNorm weights are used as stored: llama.cpp's converter already folded gemma's
            // (1 + w) into them (conversion/gemma.py, `Gemma3Model.norm_shift` adds 1.0 to every
            // `norm.weight`), and src/models/gemma3.cpp multiplies by the stored weight.
            embed_scale,
            post_norms: gemma,
            attn_logit_softcap,
            attn_scale,
            sliding_window,
            final_logit_softcap,
            residual_scale,
            logit_scale,
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
        if !(self.rope_attn_factor.is_finite() && self.rope_attn_factor > 0.0) {
            return bad(format!(
                "RoPE attention factor {} is not a positive number",
                self.rope_attn_factor
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!("RoPE base {} is not valid", self.rope_base));
        }
        if let Some(m) = &self.moe {
            if m.n_expert == 0
                || m.n_expert_used == 0
                || m.n_expert_used > m.n_expert
                || m.n_ff_exp == 0
                || m.n_ff_shared == Some(0)
            {
                return bad(format!(
                    "mixture of experts using {} of {} experts of width {} (shared {:?})",
                    m.n_expert_used, m.n_expert, m.n_ff_exp, m.n_ff_shared
                ));
            }
        }
        if let Some(w) = &self.sliding_window {
            if w.size == 0 || w.layers.len() != self.n_layer {
                return bad(format!(
                    "sliding window of {} positions over {} of {} layers",
                    w.size,
                    w.layers.len(),
                    self.n_layer
                ));
            }
            if !(w.rope_base.is_finite() && w.rope_base > 0.0) {
                return bad(format!("local RoPE base {} is not valid", w.rope_base));
            }
        }
        if let Some(c) = self.attn_logit_softcap {
            if !(c.is_finite() && c > 0.0) {
                return bad(format!(
                    "attention logit soft-cap {c} is not a positive number"
                ));
            }
        }
        if let Some(c) = self.final_logit_softcap {
            if !(c.is_finite() && c > 0.0) {
                return bad(format!("final logit soft-cap {c} is not a positive number"));
            }
        }
        if !(self.embed_scale.is_finite() && self.attn_scale.is_finite()) {
            return bad(format!(
                "embedding scale {} / attention scale {} not finite",
                self.embed_scale, self.attn_scale
            ));
        }
        let normal = |v: f32| v.is_finite() && v != 0.0;
        if !(normal(self.residual_scale) && normal(self.logit_scale)) {
            return bad(format!(
                "residual scale {} / logit multiplier {} must be finite and non-zero",
                self.residual_scale, self.logit_scale
            ));
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
        let range = |f: &[f32]| {
            f.iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)))
        };
        if let (Some(f), None) = (&self.rope_freq_factors, &self.long_rope) {
            let (lo, hi) = range(f);
            d.push(format!(
                "RoPE frequency factors per pair (rope_freqs.weight, llama3): {} from {lo} to {hi}",
                f.len()
            ));
        }
        if let Some(lr) = &self.long_rope {
            let ((sl, sh), (ll, lh)) = (range(&lr.short), range(&lr.long));
            d.push(format!(
                "LongRoPE: {} short factors ({sl} to {sh}) up to a context of {}, long ones \
                 ({ll} to {lh}) past it",
                lr.short.len(),
                lr.orig_ctx
            ));
        }
        if self.rope_attn_factor != 1.0 {
            d.push(format!(
                "rotated Q/K dimensions scaled by {} (rope.scaling.attn_factor)",
                self.rope_attn_factor
            ));
        }
        match self.no_rope_layer_step {
            Some(1) => d.push("no RoPE in any block (NoPE)".into()),
            Some(step) => d.push(format!("no RoPE in every {step}th block (NoPE)")),
            None => {}
        }
        if self.qkv_bias {
            d.push("Q, K and V biases".into());
        }
        match self.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => d.push("per-head RMS norms of Q and K before RoPE".into()),
            QkNorm::Whole => d.push("RMS norms of the whole Q and K before RoPE".into()),
        }
        if let Some(m) = &self.moe {
            d.push(format!(
                "mixture of experts: {} of {} experts of width {} per token{}{}",
                m.n_expert_used,
                m.n_expert,
                m.n_ff_exp,
                if m.norm_weights {
                    ", weights normalized to sum 1"
                } else {
                    ""
                },
                m.n_ff_shared
                    .map(|w| format!(
                        ", a{} shared expert of width {w}",
                        if m.shared_gate { " gated" } else { "n ungated" }
                    ))
                    .unwrap_or_default()
            ));
        }
        if self.embed_scale != 1.0 {
            d.push(format!("token embedding scaled by {}", self.embed_scale));
        }
        if self.post_norms {
            d.push("RMS norms of the attention and FFN outputs before each residual add".into());
        }
        if self.ffn_act == FfnAct::GeluTanh {
            d.push("GeGLU feed-forward (tanh GELU)".into());
        }
        if (self.attn_scale - 1.0 / (self.head_dim as f32).sqrt()).abs() > 1e-7 {
            d.push(format!(
                "attention scale {} (not 1/sqrt(head size))",
                self.attn_scale
            ));
        }
        if let Some(w) = &self.sliding_window {
            let local = w.layers.iter().filter(|&&b| b).count();
            d.push(format!(
                "sliding-window attention of {} positions in {local} of {} blocks (RoPE base {} \
                 there), global attention in the others",
                w.size, self.n_layer, w.rope_base
            ));
        }
        if let Some(c) = self.attn_logit_softcap {
            d.push(format!(
                "attention scores soft-capped at {c} (c tanh(s / c))"
            ));
        }
        if let Some(c) = self.final_logit_softcap {
            d.push(format!("final logits soft-capped at {c} (c tanh(x / c))"));
        }
        if self.residual_scale != 1.0 {
            d.push(format!(
                "attention and FFN outputs scaled by {} before each residual add",
                self.residual_scale
            ));
        }
        if self.logit_scale != 1.0 {
            d.push(format!("final logits scaled by {}", self.logit_scale));
        }
        d.push(if self.tied_embeddings {
            "output head tied to the token embedding".into()
        } else {
            "separate output head".into()
        });
        d
    }

    /// The per-pair RoPE frequency factors for a context of `n_ctx` positions: LongRoPE's long
    /// ones past its original context, else the file's (short or llama3) ones.
    pub fn rope_factors(&self, n_ctx: usize) -> Option<&[f32]> {
        match &self.long_rope {
            Some(lr) if n_ctx > lr.orig_ctx => Some(&lr.long),
            _ => self.rope_freq_factors.as_deref(),
        }
    }

    /// This configuration as a context of `n_ctx` positions runs it: `rope_freq_factors`
    /// holds `rope_factors(n_ctx)`, and that choice is made (no LongRoPE pair is left).
    pub fn for_context(&self, n_ctx: usize) -> Config {
        let mut c = self.clone();
        c.rope_freq_factors = self.rope_factors(n_ctx).map(<[f32]>::to_vec);
        c.long_rope = None;
        c
    }

    /// Block `l`'s RoPE in a context of `n_ctx` positions: its base and position scale, the
    /// frequency factors for that context, the attention factor and the pairing.
    pub fn rotation(&self, l: usize, n_ctx: usize) -> Rotation<'_> {
        let (freq_base, freq_scale) = self.rope_of(l);
        Rotation {
            n_rot: self.n_rot,
            freq_base,
            freq_scale,
            factors: self.rope_factors(n_ctx),
            mscale: self.rope_attn_factor,
            neox: self.rope_kind == RopeKind::Neox,
        }
    }

    /// Splits the fused projections some files store into the tensors the forward pass
    /// reads, as views of the same bytes (`Gguf::split_rows`): `attn_qkv` (weight and bias)
    /// into `attn_q`, `attn_k`, `attn_v` (rows q_dim, kv_dim, kv_dim: llama.cpp's
    /// `build_qkv` in src/llama-graph.cpp views Q, K and V at those offsets), and phi3's
    /// `ffn_up` of 2 n_ff rows into `ffn_gate` (the first half) and `ffn_up` (llama.cpp's
    /// src/models/phi3.cpp builds its FFN with `LLM_FFN_SWIGLU` and no gate tensor, and
    /// `ggml_swiglu` applies silu to the first half of the row and multiplies by the second).
    pub fn unfuse(&self, g: &mut Gguf) -> Result<()> {
        let (q, kv, ff) = (self.q_dim() as u64, self.kv_dim() as u64, self.n_ff as u64);
        for l in 0..self.n_layer {
            let p = |s: &str| format!("blk.{l}.{s}");
            for part in ["weight", "bias"] {
                let fused = p(&format!("attn_qkv.{part}"));
                if g.tensor(&fused).is_some() {
                    let parts = [("attn_q", q), ("attn_k", kv), ("attn_v", kv)]
                        .map(|(n, r)| (p(&format!("{n}.{part}")), r));
                    g.split_rows(&fused, &parts)?;
                }
            }
            let up = p("ffn_up.weight");
            let stacked = g.tensor(&up).is_some_and(|t| t.n_rows() == 2 * ff);
            if self.arch == "phi3" && stacked && g.tensor(&p("ffn_gate.weight")).is_none() {
                g.split_rows(&up, &[(p("ffn_gate.weight"), ff), (up.clone(), ff)])?;
            }
        }
        Ok(())
    }

    /// Whether block `l` rotates Q and K (false for smollm3's NoPE blocks).
    pub fn uses_rope(&self, l: usize) -> bool {
        self.no_rope_layer_step
            .is_none_or(|step| !(l + 1).is_multiple_of(step))
    }

    /// The attention window of block `l`: Some(size) for a sliding-window (local) block.
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window
            .as_ref()
            .filter(|w| w.layers.get(l).copied().unwrap_or(false))
            .map(|w| w.size)
    }

    /// RoPE (base, position scale) of block `l`: the local ones for a sliding-window block
    /// (llama.cpp's `get_rope_freq_base` / `get_rope_freq_scale` in src/llama-model.cpp).
    pub fn rope_of(&self, l: usize) -> (f32, f32) {
        match &self.sliding_window {
            Some(w) if self.window(l).is_some() => (w.rope_base, w.rope_scale),
            _ => self.global_rope(),
        }
    }

    /// RoPE (base, position scale) of the global (not sliding-window) blocks.
    pub fn global_rope(&self) -> (f32, f32) {
        (self.rope_base, self.rope_freq_scale)
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

/// The mixture-of-experts configuration of an `arch` file, if its blocks have experts
/// (`<arch>.expert_count` > 0; required for qwen2moe, qwen3moe and olmoe). The expert width is
/// `expert_feed_forward_length`, else llama.cpp's default: `n_ff / n_expert_used` for the qwen
/// MoE models, `n_ff` for the others (src/models/qwen3moe.cpp, llama.cpp, olmoe.cpp).
fn moe_of(g: &Gguf, arch: &str, n_ff: usize) -> Result<Option<Moe>> {
    let key = |k: &str| format!("{arch}.{k}");
    let qwen = matches!(arch, "qwen2moe" | "qwen3moe");
    let needs = qwen || matches!(arch, "olmoe" | "granitemoe");
    let n_expert = g.opt(&key("expert_count"), Gguf::get_u32)?.unwrap_or(0) as usize;
    if n_expert == 0 {
        if needs {
            return Err(Error::Config(format!(
                "{arch} needs {} > 0 (a mixture-of-experts architecture)",
                key("expert_count")
            )));
        }
        return Ok(None);
    }
    if !needs && !matches!(arch, "llama" | "mistral") {
        return Err(Error::Config(format!(
            "{arch} with experts ({} = {n_expert}) is not supported",
            key("expert_count")
        )));
    }
    let n_expert_used = g.get_u32(&key("expert_used_count"))? as usize;
    let n_ff_exp = match g.opt(&key("expert_feed_forward_length"), Gguf::get_u32)? {
        Some(w) => w as usize,
        None if qwen => n_ff / n_expert_used.max(1),
        None => n_ff,
    };
    let shared_width = g.opt(&key("expert_shared_feed_forward_length"), Gguf::get_u32)?;
    let n_ff_shared = match arch {
        "qwen2moe" => Some(shared_width.map_or(n_ff, |w| w as usize)),
        // Granite's shared-expert models are granitemoe files stating a shared width.
        "granitemoe" => shared_width.filter(|&w| w > 0).map(|w| w as usize),
        _ => None,
    };
    Ok(Some(Moe {
        n_expert,
        n_expert_used,
        n_ff_exp,
        // granitemoe: llama.cpp's `build_moe_ffn(..., norm_w = true, ...)`.
        norm_weights: matches!(arch, "qwen3moe" | "llama" | "mistral" | "granitemoe"),
        n_ff_shared,
        shared_gate: arch == "qwen2moe",
    }))
}

/// A `[n_rot / 2]` table of per-pair RoPE frequency factors, each a positive number.
fn factors(g: &Gguf, t: &crate::gguf::TensorInfo, n_rot: usize) -> Result<Vec<f32>> {
    let n = t.n_elements as usize;
    let err = |msg: String| Error::Tensor {
        name: t.name.clone(),
        msg,
    };
    if t.dims.len() != 1 || n != n_rot / 2 {
        return Err(err(format!(
            "dimensions {:?}, expected [{}] (half the {n_rot} rotated dimensions)",
            t.dims,
            n_rot / 2
        )));
    }
    let f =
        kernels_ref::dequantize_vec(t.ty, g.tensor_data(t), n).map_err(|e| err(e.to_string()))?;
    if let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err(err(format!(
            "frequency factor {bad} is not a positive number"
        )));
    }
    Ok(f)
}

/// Opens a model file: its configuration, and the file with its fused projections split into
/// the tensors the forward pass reads (`Config::unfuse`).
pub fn open_model(path: impl AsRef<std::path::Path>) -> Result<(Gguf, Config)> {
    let mut g = Gguf::open(path)?;
    let c = Config::from_gguf(&g)?;
    c.unfuse(&mut g)?;
    Ok((g, c))
}

/// `[n_layer]` local-layer flags from `key`: an array of bools (one per layer), a period n
/// (layer l local when l % n < n - 1; 0 makes every layer local), or the architecture's period
/// `default` when the key is absent (llama.cpp's `load_swa_pattern` and `set_swa_pattern`).
fn swa_layers(g: &Gguf, key: &str, n_layer: usize, default: usize) -> Result<Vec<bool>> {
    use crate::gguf::Value;
    let period =
        |n: usize| -> Vec<bool> { (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect() };
    match g.get(key) {
        None => Ok(period(default)),
        Some(Value::Array(_, items)) => {
            let flags = items
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect::<Option<Vec<bool>>>();
            match flags {
                Some(f) if f.len() == n_layer => Ok(f),
                _ => Err(Error::Config(format!(
                    "{key} must be {n_layer} bools (one per block) or a number"
                ))),
            }
        }
        Some(_) => Ok(period(g.get_u32(key)? as usize)),
    }
}
