//! Synthetic models: random weights at the layer widths of real 1B, 7B and 35B-class llama
//! models and of Qwen3-30B-A3B's mixture of experts (or tiny ones for tests), with fewer
//! layers, so benchmarks and the layer-streaming path run at real layer sizes without
//! downloading a model.
//!
//! The file is written tensor by tensor (the header first, then each tensor's data generated,
//! quantized with kernels-ref and written), so a 35B-class layer (~400 MB at 4 bits) is the
//! most memory the writer holds. The vocabulary is a byte-level GPT-2 BPE: the 256 byte
//! tokens, merges of lower-case letter pairs while the vocabulary has room, filler tokens, and
//! `<|endoftext|>` last (end of generation).

use std::io::Write;
use std::path::Path;

use kernels_ref::{f16_to_f32, f32_to_f16, GgmlType, QK_K};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gguf::writer::{put_str, put_u32, put_u64, put_value, GgufWriter};
use crate::gguf::{Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// A model shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SynthShape {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_vocab: usize,
    pub n_layer: usize,
    pub n_ctx: usize,
    /// No `output.weight`: the embedding table doubles as the output head.
    pub tied: bool,
    /// Per-head size when it is not n_embd / n_head (Qwen3's 128 at width 2048 with 32 heads);
    /// 0 for n_embd / n_head.
    pub head_dim: usize,
    /// A qwen3moe model (per-head Q/K norms, experts in every block) instead of llama.
    pub moe: Option<SynthMoe>,
}

/// The experts of a synthetic qwen3moe model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SynthMoe {
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// One expert's feed-forward width.
    pub n_ff_exp: usize,
}

impl SynthShape {
    /// The per-head size.
    pub fn head_dim(&self) -> usize {
        match self.head_dim {
            0 => self.n_embd / self.n_head.max(1),
            d => d,
        }
    }
    fn arch(&self) -> &'static str {
        if self.moe.is_some() {
            "qwen3moe"
        } else {
            "llama"
        }
    }
}

/// The shapes `memwall synth --preset` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// A few-MB model for tests.
    Tiny,
    /// Llama-3.2-1B's widths (GQA 32/8, vocabulary 128256, tied embeddings).
    B1,
    /// Llama-2-7B's widths (32 heads, no GQA, vocabulary 32000).
    B7,
    /// CodeLlama-34B's widths (GQA 64/8, feed-forward 22016, vocabulary 32000).
    B35,
    /// A few-MB qwen3moe model for tests: 8 experts of width 64, 2 per token.
    TinyMoe,
    /// Qwen3-30B-A3B's widths (48 blocks in the real model): width 2048, 32/4 heads of 128,
    /// 128 experts of width 768, 8 per token, vocabulary 151936.
    Moe30bA3b,
}

impl Preset {
    /// Parses `tiny|1b|7b|35b`.
    pub fn parse(s: &str) -> Result<Preset> {
        match s.trim().to_lowercase().as_str() {
            "tiny" => Ok(Preset::Tiny),
            "1b" => Ok(Preset::B1),
            "7b" => Ok(Preset::B7),
            "35b" | "34b" => Ok(Preset::B35),
            "tiny-moe" => Ok(Preset::TinyMoe),
            "30b-a3b" => Ok(Preset::Moe30bA3b),
            other => Err(Error::InvalidArgument(format!(
                "unknown preset {other:?} (tiny, 1b, 7b, 35b, tiny-moe, 30b-a3b)"
            ))),
        }
    }

    /// The preset's widths with two layers (the real models have 16 to 48).
    pub fn shape(self) -> SynthShape {
        let s = |n_embd, n_ff, n_head, n_head_kv, n_vocab, tied| SynthShape {
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            n_vocab,
            n_layer: 2,
            n_ctx: 4096,
            tied,
            head_dim: 0,
            moe: None,
        };
        let moe = |mut shape: SynthShape, head_dim, n_expert, n_expert_used, n_ff_exp| {
            shape.head_dim = head_dim;
            shape.moe = Some(SynthMoe {
                n_expert,
                n_expert_used,
                n_ff_exp,
            });
            shape
        };
        match self {
            Preset::Tiny => s(128, 384, 4, 2, 512, true),
            Preset::B1 => s(2048, 8192, 32, 8, 128_256, true),
            Preset::B7 => s(4096, 11008, 32, 32, 32_000, false),
            Preset::B35 => s(8192, 22016, 64, 8, 32_000, false),
            Preset::TinyMoe => moe(s(128, 384, 4, 2, 512, true), 32, 8, 2, 64),
            Preset::Moe30bA3b => moe(s(2048, 6144, 32, 4, 151_936, false), 128, 128, 8, 768),
        }
    }
}

/// Parses the weight types `synth` writes: `q4_0|q4_1|q8_0|q4_k|q6_k|f16`.
pub fn parse_type(s: &str) -> Result<GgmlType> {
    match s.trim().to_lowercase().as_str() {
        "q4_0" => Ok(GgmlType::Q4_0),
        "q4_1" => Ok(GgmlType::Q4_1),
        "q8_0" => Ok(GgmlType::Q8_0),
        "q4_k" => Ok(GgmlType::Q4_K),
        "q6_k" => Ok(GgmlType::Q6_K),
        "f16" => Ok(GgmlType::F16),
        other => Err(Error::InvalidArgument(format!(
            "weight type {other:?} is not one synth writes (q4_0, q4_1, q8_0, q4_k, q6_k, \
             q4_k_m, f16)"
        ))),
    }
}

/// Parses `synth --type`: a type of [`parse_type`], or `q4_k_m` (llama.cpp's Q4_K_M mix:
/// Q4_K with Q6_K where that mix spends more bits). Returns (type, Q4_K_M mix).
pub fn parse_weights(s: &str) -> Result<(GgmlType, bool)> {
    if s.trim().eq_ignore_ascii_case("q4_k_m") {
        return Ok((GgmlType::Q4_K, true));
    }
    Ok((parse_type(s)?, false))
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthOptions {
    pub shape: SynthShape,
    /// Type of every matrix (embedding and output head included); norms are F32.
    pub ty: GgmlType,
    pub seed: u64,
    /// Skews a mixture of experts' routing as real routers are: expert e's router row is
    /// scaled by (1 + e)^-skew, so the low experts' logits spread wider and win the top-k
    /// more often (0: every expert alike, as random weights route).
    pub router_skew: f32,
    /// llama.cpp's Q4_K_M mix (with `ty` Q4_K): the output head Q6_K, and the attention
    /// value and feed-forward down projections Q6_K in the layers where that mix spends
    /// more bits (the first and last eighth, every third between), so a synthetic model
    /// moves the bytes per token a downloaded Q4_K_M file does.
    pub q4_k_m: bool,
}

impl SynthOptions {
    /// `preset`'s shape with `n_layer` layers (None: 2).
    pub fn new(preset: Preset, n_layer: Option<usize>, ty: GgmlType, seed: u64) -> SynthOptions {
        let mut shape = preset.shape();
        if let Some(n) = n_layer {
            shape.n_layer = n;
        }
        SynthOptions {
            shape,
            ty,
            seed,
            router_skew: 0.0,
            q4_k_m: false,
        }
    }
}

/// What `write_synth` wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SynthReport {
    pub shape: SynthShape,
    pub ty: String,
    pub n_params: u64,
    pub file_bytes: u64,
}

/// One tensor of the model, before its data exists.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    name: String,
    ty: GgmlType,
    /// dims[0] is the row length.
    dims: Vec<u64>,
    kind: Fill,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fill {
    /// Uniform in [-a, a] with a = scale (a matrix row of `cols` has outputs of std ~0.6).
    Matrix { scale: f32 },
    /// 1 + small noise (a norm weight).
    Norm,
    /// A router: `Matrix` with row e scaled by (1 + e)^-skew.
    Router { scale: f32, skew: f32 },
}

impl Spec {
    fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    fn n_bytes(&self) -> Result<u64> {
        self.ty.row_bytes(self.n_elements()).ok_or_else(|| {
            Error::InvalidArgument(format!("{}: {:?} overflows", self.name, self.dims))
        })
    }
}

fn check(o: &SynthOptions) -> Result<()> {
    let s = &o.shape;
    let bad = |m: String| Err(Error::InvalidArgument(m));
    if s.n_layer == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.n_vocab < 258 {
        return bad(format!("unusable synthetic shape {s:?}"));
    }
    if !s.n_embd.is_multiple_of(s.n_head) || !s.n_head.is_multiple_of(s.n_head_kv) {
        return bad(format!("heads do not divide the widths in {s:?}"));
    }
    let blk = o.ty.block_size();
    let ff = s.moe.map_or(s.n_ff, |m| m.n_ff_exp);
    if !s.n_embd.is_multiple_of(blk) || !ff.is_multiple_of(blk) {
        return bad(format!("widths of {s:?} are not whole {} blocks", o.ty));
    }
    if o.q4_k_m && o.ty != GgmlType::Q4_K {
        return bad(format!("the Q4_K_M mix is Q4_K based, not {}", o.ty));
    }
    if !(o.router_skew.is_finite() && o.router_skew >= 0.0) {
        return bad(format!("router skew {} must be 0 or more", o.router_skew));
    }
    if let Some(m) = s.moe {
        if m.n_expert_used == 0 || m.n_expert_used > m.n_expert {
            return bad(format!(
                "{} of {} experts per token",
                m.n_expert_used, m.n_expert
            ));
        }
    }
    if s.n_vocab > u32::MAX as usize {
        return bad(format!("vocabulary of {}", s.n_vocab));
    }
    Ok(())
}

fn specs(o: &SynthOptions) -> Vec<Spec> {
    let s = &o.shape;
    let head_dim = s.head_dim();
    let (q, kv) = (s.n_head * head_dim, s.n_head_kv * head_dim);
    let mat = |name: String, rows: usize, cols: usize| Spec {
        name,
        ty: o.ty,
        dims: vec![cols as u64, rows as u64],
        // Uniform [-a, a] has variance a²/3: a row dot a unit-RMS input has std ~0.6.
        kind: Fill::Matrix {
            scale: 1.0 / (cols as f32).sqrt(),
        },
    };
    let norm_of = |name: String, n: usize| Spec {
        name,
        ty: GgmlType::F32,
        dims: vec![n as u64],
        kind: Fill::Norm,
    };
    let norm = |name: String| norm_of(name, s.n_embd);
    // llama.cpp's use_more_bits(layer, n_layer) for the Q4_K_M mix.
    let n = s.n_layer;
    let more_bits = |l: usize| o.q4_k_m && (l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2);
    let q6 = |sp: Spec| Spec {
        ty: GgmlType::Q6_K,
        ..sp
    };
    let embd = Spec {
        kind: Fill::Matrix { scale: 1.0 },
        ..mat("token_embd.weight".into(), s.n_vocab, s.n_embd)
    };
    let mut v = vec![
        // A tied embedding is the output head too: the mix gives it the head's Q6_K.
        if s.tied && o.q4_k_m { q6(embd) } else { embd },
        norm("output_norm.weight".into()),
    ];
    if !s.tied {
        let head = mat("output.weight".into(), s.n_vocab, s.n_embd);
        v.push(if o.q4_k_m { q6(head) } else { head });
    }
    for l in 0..s.n_layer {
        let p = |t: &str| format!("blk.{l}.{t}");
        v.push(norm(p("attn_norm.weight")));
        v.push(mat(p("attn_q.weight"), q, s.n_embd));
        v.push(mat(p("attn_k.weight"), kv, s.n_embd));
        let attn_v = mat(p("attn_v.weight"), kv, s.n_embd);
        v.push(if more_bits(l) { q6(attn_v) } else { attn_v });
        v.push(mat(p("attn_output.weight"), s.n_embd, q));
        v.push(norm(p("ffn_norm.weight")));
        let Some(m) = s.moe else {
            v.push(mat(p("ffn_gate.weight"), s.n_ff, s.n_embd));
            v.push(mat(p("ffn_up.weight"), s.n_ff, s.n_embd));
            let down = mat(p("ffn_down.weight"), s.n_embd, s.n_ff);
            v.push(if more_bits(l) { q6(down) } else { down });
            continue;
        };
        v.push(norm_of(p("attn_q_norm.weight"), head_dim));
        v.push(norm_of(p("attn_k_norm.weight"), head_dim));
        // The router in f32 (as real MoE files keep it); the expert stacks [cols, rows,
        // n_expert], an expert's rows after the previous one's.
        v.push(Spec {
            ty: GgmlType::F32,
            kind: Fill::Router {
                scale: 1.0 / (s.n_embd as f32).sqrt(),
                skew: o.router_skew,
            },
            ..mat(p("ffn_gate_inp.weight"), m.n_expert, s.n_embd)
        });
        let stack = |name: String, rows: usize, cols: usize| {
            let mut sp = mat(name, rows, cols);
            sp.dims.push(m.n_expert as u64);
            sp
        };
        v.push(stack(p("ffn_gate_exps.weight"), m.n_ff_exp, s.n_embd));
        v.push(stack(p("ffn_up_exps.weight"), m.n_ff_exp, s.n_embd));
        let down = stack(p("ffn_down_exps.weight"), s.n_embd, m.n_ff_exp);
        v.push(if more_bits(l) { q6(down) } else { down });
    }
    v
}

/// The byte-level vocabulary: GPT-2's byte-to-unicode map for the 256 bytes.
fn byte_tokens() -> Vec<String> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).map_or_else(|| format!("[byte{b}]"), |c| c.to_string())
        })
        .collect()
}

fn metadata(o: &SynthOptions) -> Vec<(String, Value)> {
    let s = &o.shape;
    let n = s.n_vocab;
    let eos = (n - 1) as u32;
    let mut tokens = byte_tokens();
    let mut merges = Vec::new();
    'outer: for a in 'a'..='z' {
        for b in 'a'..='z' {
            if tokens.len() + 1 >= n {
                break 'outer;
            }
            merges.push(Value::String(format!("{a} {b}")));
            tokens.push(format!("{a}{b}"));
        }
    }
    while tokens.len() + 1 < n {
        tokens.push(format!("[synth{}]", tokens.len()));
    }
    tokens.push("<|endoftext|>".into());
    let mut types = vec![Value::I32(1); n - 1];
    types.push(Value::I32(3));
    let arch = s.arch();
    let a = |k: &str| format!("{arch}.{k}");
    let u = |v: usize| Value::U32(v as u32);
    let mut meta = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            "general.name".into(),
            Value::String(format!("memwall synthetic {}x{}", s.n_layer, s.n_embd)),
        ),
        ("memwall.synthetic.seed".into(), Value::U64(o.seed)),
        (a("block_count"), u(s.n_layer)),
        (a("context_length"), u(s.n_ctx)),
        (a("embedding_length"), u(s.n_embd)),
        (a("feed_forward_length"), u(s.n_ff)),
        (a("attention.head_count"), u(s.n_head)),
        (a("attention.head_count_kv"), u(s.n_head_kv)),
        (a("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (a("rope.freq_base"), Value::F32(10000.0)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt-2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(
                ValueType::String,
                tokens.into_iter().map(Value::String).collect(),
            ),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(ValueType::I32, types),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(ValueType::String, merges),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ];
    if s.head_dim != 0 {
        meta.push((a("attention.key_length"), u(s.head_dim)));
        meta.push((a("attention.value_length"), u(s.head_dim)));
    }
    if let Some(m) = s.moe {
        meta.push((a("expert_count"), u(m.n_expert)));
        meta.push((a("expert_used_count"), u(m.n_expert_used)));
        meta.push((a("expert_feed_forward_length"), u(m.n_ff_exp)));
    }
    meta
}

/// splitmix64: a seeded stream per chunk, so the data does not depend on the thread count.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform value in [-1, 1) from 24 random bits of the stream `state`.
pub(crate) fn uniform(state: &mut u64) -> f32 {
    (splitmix(state) >> 40) as f32 / (1u32 << 23) as f32 - 1.0
}

/// FNV-1a of a tensor name: a per-tensor seed that does not depend on the tensor order.
pub(crate) fn hash_name(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Rows generated and quantized per parallel task.
const ROWS_PER_CHUNK: usize = 64;

/// Tensor `index`'s bytes in ggml layout.
fn tensor_data(spec: &Spec, index: usize, seed: u64) -> Result<Vec<u8>> {
    let cols = spec.dims.first().copied().unwrap_or(1) as usize;
    let rows = (spec.n_elements() / cols.max(1) as u64) as usize;
    let base = seed ^ (index as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    let chunks: Vec<Result<Vec<u8>>> = (0..rows.div_ceil(ROWS_PER_CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut st = base ^ (c as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let r0 = c * ROWS_PER_CHUNK;
            let n = (rows - r0).min(ROWS_PER_CHUNK) * cols;
            // [n / cols, cols] values of this chunk's rows.
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    let u = uniform(&mut st);
                    match spec.kind {
                        Fill::Matrix { scale } => u * scale,
                        Fill::Norm => 1.0 + 0.1 * u,
                        Fill::Router { scale, skew } => {
                            let row = (r0 + i / cols) as f32;
                            u * scale * (1.0 + row).powf(-skew)
                        }
                    }
                })
                .collect();
            match spec.ty {
                GgmlType::Q4_K => Ok(quant_q4_k(&x)),
                GgmlType::Q6_K => Ok(quant_q6_k(&x)),
                ty => kernels_ref::quantize(ty, &x).map_err(|e| Error::Tensor {
                    name: spec.name.clone(),
                    msg: e.to_string(),
                }),
            }
        })
        .collect();
    let mut out = Vec::with_capacity(spec.n_bytes()? as usize);
    for c in chunks {
        out.extend_from_slice(&c?);
    }
    Ok(out)
}

/// Q4_K blocks of `x` (a whole number of 256-element blocks) by each 32-element
/// sub-block's min and max: a plain quantizer, not ggml's iterative search (which only
/// lowers the error a little); the layout is ggml's `block_q4_K`.
fn quant_q4_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * 144);
    for b in x.chunks_exact(QK_K) {
        // Per sub-block: scale (step of its 4-bit codes) and min (subtracted, >= 0).
        let mut scale = [0f32; 8];
        let mut min = [0f32; 8];
        for (j, sb) in b.chunks_exact(32).enumerate() {
            let lo = sb.iter().fold(0f32, |a, &v| a.min(v));
            let hi = sb.iter().fold(f32::MIN, |a, &v| a.max(v));
            scale[j] = (hi - lo) / 15.0;
            min[j] = -lo;
        }
        let d = scale.iter().fold(0f32, |a, &v| a.max(v)) / 63.0;
        let dmin = min.iter().fold(0f32, |a, &v| a.max(v)) / 63.0;
        // Round d and dmin to f16 first, so the 6-bit codes fit what the decoder sees.
        let (dh, dminh) = (f32_to_f16(d), f32_to_f16(dmin));
        let (d, dmin) = (f16_to_f32(dh), f16_to_f32(dminh));
        let code = |v: f32, step: f32| {
            if step > 0.0 {
                (v / step).round().clamp(0.0, 63.0) as u8
            } else {
                0
            }
        };
        let sc: Vec<u8> = scale.iter().map(|&v| code(v, d)).collect();
        let m: Vec<u8> = min.iter().map(|&v| code(v, dmin)).collect();
        // ggml's 12-byte packing of eight 6-bit scales and mins (get_scale_min_k4).
        let mut packed = [0u8; 12];
        for j in 0..4 {
            packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            packed[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
        }
        let mut q = [0u8; QK_K];
        for (j, sb) in b.chunks_exact(32).enumerate() {
            let step = d * f32::from(sc[j]);
            let off = dmin * f32::from(m[j]);
            for (l, &v) in sb.iter().enumerate() {
                q[32 * j + l] = if step > 0.0 {
                    ((v + off) / step).round().clamp(0.0, 15.0) as u8
                } else {
                    0
                };
            }
        }
        out.extend_from_slice(&dh.to_le_bytes());
        out.extend_from_slice(&dminh.to_le_bytes());
        out.extend_from_slice(&packed);
        // Each 64 values: byte l holds sub-block 2k's value l low, 2k+1's high.
        for k in 0..4 {
            for l in 0..32 {
                out.push(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
            }
        }
    }
    out
}

/// Q6_K blocks of `x` by each 16-element sub-block's largest magnitude; the layout is
/// ggml's `block_q6_K` (low nibbles, high bit pairs, int8 scales, f16 d).
fn quant_q6_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * 210);
    for b in x.chunks_exact(QK_K) {
        let mut scale = [0f32; 16];
        for (j, sb) in b.chunks_exact(16).enumerate() {
            scale[j] = sb.iter().fold(0f32, |a, &v| a.max(v.abs())) / 31.0;
        }
        let d = scale.iter().fold(0f32, |a, &v| a.max(v)) / 127.0;
        let dh = f32_to_f16(d);
        let d = f16_to_f32(dh);
        let sc: Vec<i8> = scale
            .iter()
            .map(|&v| {
                if d > 0.0 {
                    (v / d).round().clamp(0.0, 127.0) as i8
                } else {
                    0
                }
            })
            .collect();
        // 6-bit codes, value + 32.
        let mut q = [0u8; QK_K];
        for (i, &v) in b.iter().enumerate() {
            let step = d * f32::from(sc[i / 16]);
            let c = if step > 0.0 {
                (v / step).round().clamp(-32.0, 31.0)
            } else {
                0.0
            };
            q[i] = (c + 32.0) as u8;
        }
        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        // Each 128 values: ql[l] = (l, l + 64) low nibbles, ql[l + 32] = (l + 32, l + 96);
        // qh[l] their high bit pairs in the order l, l + 32, l + 64, l + 96.
        for h in 0..2 {
            let (qv, ql, qh) = (&q[128 * h..], &mut ql[64 * h..], &mut qh[32 * h..]);
            for l in 0..32 {
                ql[l] = (qv[l] & 15) | ((qv[l + 64] & 15) << 4);
                ql[l + 32] = (qv[l + 32] & 15) | ((qv[l + 96] & 15) << 4);
                qh[l] = (qv[l] >> 4)
                    | ((qv[l + 32] >> 4) << 2)
                    | ((qv[l + 64] >> 4) << 4)
                    | ((qv[l + 96] >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(sc.iter().map(|&v| v as u8));
        out.extend_from_slice(&dh.to_le_bytes());
    }
    out
}

/// The whole model in memory (for small shapes and tests; `write_synth` streams).
pub fn synth_writer(o: &SynthOptions) -> Result<GgufWriter> {
    check(o)?;
    let mut w = GgufWriter::new();
    for (k, v) in metadata(o) {
        w = w.metadata(k, v);
    }
    for (i, s) in specs(o).iter().enumerate() {
        w = w.tensor(s.name.clone(), s.ty, &s.dims, tensor_data(s, i, o.seed)?);
    }
    Ok(w)
}

/// Writes the model to `path` tensor by tensor, reporting (bytes written, total) as it goes.
/// The image is byte for byte what [`synth_writer`]'s `to_bytes` gives.
pub fn write_synth(
    path: impl AsRef<Path>,
    o: &SynthOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport> {
    check(o)?;
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let specs = specs(o);
    let meta = metadata(o);
    let align = DEFAULT_ALIGNMENT;
    // The header, as GgufWriter lays it out: magic, version, counts, metadata, tensor infos
    // with offsets rounded up to the alignment, then padding to the data section.
    let mut head = Vec::new();
    head.extend_from_slice(&GGUF_MAGIC);
    put_u32(&mut head, 3);
    put_u64(&mut head, specs.len() as u64);
    put_u64(&mut head, meta.len() as u64);
    for (k, v) in &meta {
        put_str(&mut head, k);
        put_u32(&mut head, v.value_type().id());
        put_value(&mut head, v);
    }
    let mut offset = 0u64;
    let mut sizes = Vec::with_capacity(specs.len());
    for s in &specs {
        put_str(&mut head, &s.name);
        put_u32(&mut head, s.dims.len() as u32);
        for &d in &s.dims {
            put_u64(&mut head, d);
        }
        put_u32(&mut head, s.ty.id());
        put_u64(&mut head, offset);
        let n = s.n_bytes()?;
        sizes.push(n);
        offset = (offset + n).div_ceil(align) * align;
    }
    let pad = |len: u64| (len.div_ceil(align) * align - len) as usize;
    head.resize(head.len() + pad(head.len() as u64), 0);
    let total = head.len() as u64 + offset;
    let file = std::fs::File::create(path).map_err(io)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
    f.write_all(&head).map_err(io)?;
    let mut done = head.len() as u64;
    let mut n_params = 0u64;
    for (i, (s, &n)) in specs.iter().zip(&sizes).enumerate() {
        let data = tensor_data(s, i, o.seed)?;
        if data.len() as u64 != n {
            return Err(Error::Tensor {
                name: s.name.clone(),
                msg: format!("{} bytes generated, {n} expected", data.len()),
            });
        }
        f.write_all(&data).map_err(io)?;
        f.write_all(&vec![0u8; pad(n)]).map_err(io)?;
        done += n + pad(n) as u64;
        n_params += s.n_elements();
        progress(done, total);
    }
    f.flush().map_err(io)?;
    Ok(SynthReport {
        shape: o.shape,
        ty: if o.q4_k_m {
            "q4_k_m".into()
        } else {
            o.ty.name().to_lowercase()
        },
        n_params,
        file_bytes: total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_for_every_type() {
        let all = [
            Preset::Tiny,
            Preset::B1,
            Preset::B7,
            Preset::B35,
            Preset::TinyMoe,
            Preset::Moe30bA3b,
        ];
        for p in all {
            for ty in ["q4_0", "q4_1", "q8_0", "f16"] {
                let o = SynthOptions::new(p, Some(1), parse_type(ty).unwrap(), 1);
                check(&o).unwrap();
            }
        }
        // K-quant blocks are 256 wide: the presets past the tiny ones.
        for p in [Preset::B1, Preset::B7, Preset::B35, Preset::Moe30bA3b] {
            for ty in ["q4_k", "q6_k", "q4_k_m"] {
                let (t, mix) = parse_weights(ty).unwrap();
                let o = SynthOptions {
                    q4_k_m: mix,
                    ..SynthOptions::new(p, Some(1), t, 1)
                };
                check(&o).unwrap();
            }
        }
        assert!(Preset::parse("13b").is_err() && parse_type("q5_k").is_err());
        assert!(parse_type("q4_k_m").is_err() && parse_weights("Q4_K_M").unwrap().1);
    }

    #[test]
    fn k_quant_blocks_decode_close_to_their_values() {
        // Values with a negative offset and a zero run, as weight rows have.
        let mut st = 7u64;
        let x: Vec<f32> = (0..4 * QK_K)
            .map(|i| {
                if i % 97 < 20 {
                    0.0
                } else {
                    0.03 * uniform(&mut st) - 0.004
                }
            })
            .collect();
        for (ty, bytes, tol) in [
            (GgmlType::Q4_K, quant_q4_k(&x), 0.0045),
            (GgmlType::Q6_K, quant_q6_k(&x), 0.0012),
        ] {
            assert_eq!(Some(bytes.len() as u64), ty.row_bytes(x.len() as u64));
            let y = kernels_ref::dequantize_vec(ty, &bytes, x.len()).unwrap();
            let worst = x
                .iter()
                .zip(&y)
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(worst < tol, "{ty}: worst error {worst}");
            // A coarser quantizer of this range would miss by a full step somewhere.
            assert!(worst > 0.0);
        }
    }

    #[test]
    fn q4_k_m_mix_puts_q6_k_where_llama_cpp_does() {
        let o = SynthOptions {
            q4_k_m: true,
            ..SynthOptions::new(Preset::B7, Some(32), GgmlType::Q4_K, 1)
        };
        let sp = specs(&o);
        let ty = |n: &str| sp.iter().find(|s| s.name == n).unwrap().ty;
        assert_eq!(ty("output.weight"), GgmlType::Q6_K);
        assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
        // n = 32: layers 0..4 and 28..32, then 4 + 2, 4 + 5, ...
        let six: Vec<usize> = (0..32)
            .filter(|l| ty(&format!("blk.{l}.ffn_down.weight")) == GgmlType::Q6_K)
            .collect();
        assert_eq!(
            six,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        assert_eq!(ty("blk.6.attn_v.weight"), GgmlType::Q6_K);
        assert_eq!(ty("blk.5.attn_q.weight"), GgmlType::Q4_K);
        assert_eq!(ty("blk.5.attn_v.weight"), GgmlType::Q4_K);
    }

    #[test]
    fn vocabulary_fills_exactly_with_eos_last() {
        let o = SynthOptions::new(Preset::Tiny, None, GgmlType::Q8_0, 3);
        let meta = metadata(&o);
        let tokens = meta
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .map(|(_, v)| v.clone());
        let Some(Value::Array(_, t)) = tokens else {
            panic!("no tokens")
        };
        assert_eq!(t.len(), o.shape.n_vocab);
        assert_eq!(t.last(), Some(&Value::String("<|endoftext|>".into())));
    }
}
