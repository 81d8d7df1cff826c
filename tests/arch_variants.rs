//! The architectures that share llama's shape, on small synthetic models written with the GGUF
//! writer: llama with tied embeddings, llama with Llama 3's per-pair RoPE frequency factors
//! (`rope_freqs.weight`), smollm3 with no RoPE in every fourth block, mistral with an output
//! head, qwen2 with QKV biases and NeoX RoPE, qwen3 with per-head Q/K norms and a head size
//! that is not n_embd / n_head (as Qwen3's 128 at width 1024 with 16 heads), gemma3 with its
//! scaled embedding, post-norms, GeGLU, sliding-window blocks with their own RoPE base and a
//! final-logit soft-cap, gemma2 with every other block local and soft-capped attention scores,
//! phi3 with fused QKV and gate/up tensors, partial rotary and LongRoPE
//! (long and short factors, the attention factor), and the mixtures of experts: qwen3moe (per-
//! head Q/K norms, normalized expert weights), qwen2moe (QKV biases, a gated shared expert),
//! olmoe (whole-projection Q/K norms) and mixtral (llama with experts); each written with its
//! architecture's metadata keys and tensor names.
//! For each, the CPU backend's logits match a forward pass built from kernels-ref alone, in one
//! batch and token by token, across weight formats; and on the GPU.

mod common;

use common::{reference_forward, rel_err, Rng};
use kernels_ref::GgmlType;
use memwall::engine::{LoadOptions, Model};
use memwall::gguf::writer::GgufWriter;
use memwall::gguf::{Gguf, Value};
use memwall::model::Logits;

const N_EMBD: usize = 64;
const N_HEAD: usize = 4;
const N_HEAD_KV: usize = 2;
const HEAD_DIM: usize = 16;
const N_FF: usize = 96;
const N_LAYER: usize = 2;
const N_VOCAB: usize = 257;
/// gemma3's sliding window here: shorter than the test prompts, so it masks.
const GEMMA3_WINDOW: usize = 5;
/// phi3's rotated dims per head here (of 16): partial rotary, as Phi-4-mini's 96 of 128.
const PHI3_N_ROT: usize = 12;
/// phi3's original context: sessions past it use the long LongRoPE factors.
const PHI3_ORIG_CTX: usize = 32;
/// Experts per block of the MoE variants, and how many each token uses.
const N_EXPERT: usize = 4;
const N_EXPERT_USED: usize = 2;
/// The qwen MoE variants' expert width (`expert_feed_forward_length`) and shared expert's.
const N_FF_EXP: usize = 32;
const N_FF_SHARED: usize = 64;
/// phi3's LongRoPE attention factor (sqrt(1 + ln(32) / ln(4096)), Phi-4-mini's).
const PHI3_ATTN_FACTOR: f32 = 1.1902;
/// granite's multipliers in the test files.
const GRANITE_EMBD_SCALE: f32 = 3.0;
const GRANITE_RESIDUAL_SCALE: f32 = 0.4;
const GRANITE_ATTN_SCALE: f32 = 0.09;
const GRANITE_LOGIT_SCALE: f32 = 4.0;

/// GPT-2's byte-to-unicode map: the vocabulary of a byte-level BPE with no merges.
/// Roughly N(0, scale²) values, every 97th 6x larger (an outlier now and then).
fn rand_vec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = rng.normal() * scale;
            if i % 97 == 13 {
                v * 6.0
            } else {
                v
            }
        })
        .collect()
}

fn byte_tokens() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xa1..=0xac);
    printable.extend(0xae..=0xff);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

struct Variant {
    arch: &'static str,
    tied: bool,
    bias: bool,
    matrix_type: GgmlType,
}

impl Variant {
    /// The architecture the file names: "llama3" is a llama file with Llama 3's RoPE
    /// frequency factors (`rope_freqs.weight`).
    fn file_arch(&self) -> &'static str {
        match self.arch {
            "llama3" | "mixtral" => "llama",
            // Granite's shared-expert models are granitemoe files with a shared width.
            "granitemoeshared" => "granitemoe",
            a => a,
        }
    }
    /// A mixture of experts (`N_EXPERT` experts, `N_EXPERT_USED` per token).
    fn moe(&self) -> bool {
        matches!(
            self.arch,
            "qwen3moe" | "qwen2moe" | "olmoe" | "mixtral" | "granitemoe" | "granitemoeshared"
        )
    }
    /// granite and granitemoe: the embedding, the residual branches and the logits scaled by
    /// the file's factors, and its own attention scale; granitemoe here with RoPE switched
    /// off (`rope.scaling.finetuned` false: no block rotates).
    fn granite(&self) -> bool {
        matches!(self.arch, "granite" | "granitemoe" | "granitemoeshared")
    }
    /// A shared expert: qwen2moe's gated by a sigmoid, granite's added as it is.
    fn shared_expert(&self) -> bool {
        matches!(self.arch, "qwen2moe" | "granitemoeshared")
    }
    fn granite_nope(&self) -> bool {
        self.arch == "granitemoe"
    }
    /// The experts' width: the qwen MoE files state theirs, the others use n_ff.
    fn n_ff_exp(&self) -> usize {
        match self.arch {
            "qwen3moe" | "qwen2moe" => N_FF_EXP,
            _ => N_FF,
        }
    }
    fn expected_qk_norm(&self) -> memwall::config::QkNorm {
        use memwall::config::QkNorm;
        match self.arch {
            _ if self.qwen3() => QkNorm::PerHead,
            "olmoe" => QkNorm::Whole,
            _ => QkNorm::None,
        }
    }
    /// Per-pair RoPE factors of the "llama3" variant ([HEAD_DIM / 2]). Spread well beyond the
    /// real ones (1 to 8) so that they move the logits at the test's short positions: a
    /// factor below 1 speeds a pair up.
    fn rope_factors(&self) -> Option<Vec<f32>> {
        (self.arch == "llama3").then(|| vec![0.05, 0.1, 0.3, 1.0, 2.0, 8.0, 0.07, 0.5])
    }
    /// qwen3 and gemma3: per-head Q/K norms and a head size of 32 at width 64 with 4 heads.
    fn qwen3(&self) -> bool {
        matches!(self.arch, "qwen3" | "qwen3moe") || self.gemma3()
    }
    /// gemma2: gemma3's shape without Q/K norms, every other block local (RoPE as the global
    /// ones), attention scores soft-capped low enough to bend these scores.
    fn gemma2(&self) -> bool {
        self.arch == "gemma2"
    }
    /// gemma2 or gemma3: scaled embedding, post-norms, GeGLU, sliding windows.
    fn gemma(&self) -> bool {
        self.gemma2() || self.gemma3()
    }
    /// gemma3: also the scaled embedding, post-attention and post-FFN norms, GeGLU, sliding
    /// windows of `GEMMA3_WINDOW` positions in five blocks of six (the interleave llama.cpp
    /// assumes when the file gives none) with their own RoPE base, and here a final-logit
    /// soft-cap low enough to bend the largest of these logits.
    fn gemma3(&self) -> bool {
        self.arch == "gemma3"
    }
    /// phi3: fused `attn_qkv` (and bias), gate and up stacked in `ffn_up`, 12 of 16 dims
    /// rotated, LongRoPE factors spread so that long and short differ at these positions.
    fn phi3(&self) -> bool {
        self.arch == "phi3"
    }
    fn longrope(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        self.phi3().then(|| {
            (
                vec![1.0, 1.1, 0.3, 2.0, 0.5, 1.4],
                vec![1.0, 4.0, 0.1, 16.0, 0.05, 9.0],
            )
        })
    }
    /// smollm3 needs a fourth block to have a NoPE one, gemma3 a sixth to have a global one.
    fn n_layer(&self) -> usize {
        match self.arch {
            "smollm3" => 4,
            "gemma3" => 6,
            "gemma2" => 4,
            _ => N_LAYER,
        }
    }
    fn head_dim(&self) -> usize {
        if self.qwen3() || self.gemma2() {
            2 * HEAD_DIM
        } else {
            HEAD_DIM
        }
    }
}

/// A norm weight of `n` values around 1.
fn norm_of(rng: &mut Rng, n: usize) -> Vec<f32> {
    rand_vec(rng, n, 0.3).iter().map(|v| 1.0 + v).collect()
}

fn write_model(v: &Variant, path: &std::path::Path) {
    let mut rng = Rng(0x9e3779b97f4a7c15 ^ v.matrix_type as u64);
    let mut tokens = byte_tokens();
    tokens.push("<|endoftext|>".into());
    let mut types = vec![Value::I32(1); 256];
    types.push(Value::I32(3));
    let a = v.file_arch();
    let mut w = GgufWriter::new()
        .metadata("general.architecture", Value::String(a.into()))
        .metadata(format!("{a}.block_count"), Value::U32(v.n_layer() as u32))
        .metadata(format!("{a}.context_length"), Value::U32(256))
        .metadata(format!("{a}.embedding_length"), Value::U32(N_EMBD as u32))
        .metadata(format!("{a}.feed_forward_length"), Value::U32(N_FF as u32))
        .metadata(
            format!("{a}.attention.head_count"),
            Value::U32(N_HEAD as u32),
        )
        .metadata(
            format!("{a}.attention.head_count_kv"),
            Value::U32(N_HEAD_KV as u32),
        )
        .metadata(
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        )
        .metadata(
            format!("{a}.rope.freq_base"),
            // gemma3's global blocks: 1e6 (its sliding-window blocks keep 10000).
            Value::F32(if v.gemma3() { 1e6 } else { 10000.0 }),
        )
        .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String("default".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            Value::Array(
                memwall::gguf::ValueType::String,
                tokens.into_iter().map(Value::String).collect(),
            ),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            Value::Array(memwall::gguf::ValueType::I32, types),
        )
        .metadata(
            "tokenizer.ggml.merges",
            Value::Array(memwall::gguf::ValueType::String, vec![]),
        )
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(256));
    if v.granite() {
        // Far enough from 1 that a factor left out moves the logits by much more than the
        // tolerance (real granite 3 files: 12, 0.22, 1/128 and 8 at width 2048).
        w = w
            .metadata(
                format!("{a}.embedding_scale"),
                Value::F32(GRANITE_EMBD_SCALE),
            )
            .metadata(
                format!("{a}.residual_scale"),
                Value::F32(GRANITE_RESIDUAL_SCALE),
            )
            .metadata(
                format!("{a}.attention.scale"),
                Value::F32(GRANITE_ATTN_SCALE),
            )
            .metadata(format!("{a}.logit_scale"), Value::F32(GRANITE_LOGIT_SCALE));
        if v.granite_nope() {
            w = w.metadata(format!("{a}.rope.scaling.finetuned"), Value::Bool(false));
        }
    }
    if v.gemma2() {
        w = w.metadata(format!("{a}.attn_logit_softcapping"), Value::F32(2.0));
    }
    if v.gemma() {
        w = w
            .metadata(
                format!("{a}.attention.sliding_window"),
                Value::U32(GEMMA3_WINDOW as u32),
            )
            // The logits here reach ~120: a cap of 50 bends the large ones hard.
            .metadata(format!("{a}.final_logit_softcapping"), Value::F32(50.0));
    }
    if v.phi3() {
        w = w
            .metadata(
                format!("{a}.rope.dimension_count"),
                Value::U32(PHI3_N_ROT as u32),
            )
            .metadata(
                format!("{a}.rope.scaling.original_context_length"),
                Value::U32(PHI3_ORIG_CTX as u32),
            )
            .metadata(
                format!("{a}.rope.scaling.attn_factor"),
                Value::F32(PHI3_ATTN_FACTOR),
            )
            // Phi-3-mini's files state a window; llama.cpp runs them with global attention.
            .metadata(format!("{a}.attention.sliding_window"), Value::U32(4));
    }
    if v.moe() {
        w = w
            .metadata(format!("{a}.expert_count"), Value::U32(N_EXPERT as u32))
            .metadata(
                format!("{a}.expert_used_count"),
                Value::U32(N_EXPERT_USED as u32),
            );
        if v.n_ff_exp() != N_FF {
            w = w.metadata(
                format!("{a}.expert_feed_forward_length"),
                Value::U32(v.n_ff_exp() as u32),
            );
        }
        if v.shared_expert() {
            w = w.metadata(
                format!("{a}.expert_shared_feed_forward_length"),
                Value::U32(N_FF_SHARED as u32),
            );
        }
    }
    if v.qwen3() || v.gemma2() {
        // Qwen3's files state the head size; it is not n_embd / n_head.
        let hd = Value::U32(v.head_dim() as u32);
        w = w
            .metadata(format!("{a}.attention.key_length"), hd.clone())
            .metadata(format!("{a}.attention.value_length"), hd);
    }
    let mat = |w: GgufWriter, name: String, rows: usize, cols: usize, rng: &mut Rng| {
        let x = rand_vec(rng, rows * cols, 0.5 / (cols as f32).sqrt() * 3.0);
        let bytes = kernels_ref::quantize(v.matrix_type, &x).unwrap();
        w.tensor(name, v.matrix_type, &[cols as u64, rows as u64], bytes)
    };
    // The embedding is stored Q8_0 as in the test model.
    let emb = rand_vec(&mut rng, N_VOCAB * N_EMBD, 1.0);
    w = w.tensor(
        "token_embd.weight",
        GgmlType::Q8_0,
        &[N_EMBD as u64, N_VOCAB as u64],
        kernels_ref::quantize(GgmlType::Q8_0, &emb).unwrap(),
    );
    let norm = |rng: &mut Rng| {
        rand_vec(rng, N_EMBD, 0.1)
            .iter()
            .map(|v| 1.0 + v)
            .collect::<Vec<_>>()
    };
    w = w.tensor_f32("output_norm.weight", &[N_EMBD as u64], &norm(&mut rng));
    if !v.tied {
        w = mat(w, "output.weight".into(), N_VOCAB, N_EMBD, &mut rng);
    }
    if let Some(f) = v.rope_factors() {
        assert_eq!(f.len(), HEAD_DIM / 2);
        w = w.tensor_f32("rope_freqs.weight", &[f.len() as u64], &f);
    }
    if let Some((short, long)) = v.longrope() {
        assert_eq!(short.len(), PHI3_N_ROT / 2);
        w = w.tensor_f32("rope_factors_long.weight", &[long.len() as u64], &long);
        w = w.tensor_f32("rope_factors_short.weight", &[short.len() as u64], &short);
    }
    let (q, kv) = (N_HEAD * v.head_dim(), N_HEAD_KV * v.head_dim());
    for l in 0..v.n_layer() {
        let p = |s: &str| format!("blk.{l}.{s}");
        w = w.tensor_f32(p("attn_norm.weight"), &[N_EMBD as u64], &norm(&mut rng));
        w = w.tensor_f32(p("ffn_norm.weight"), &[N_EMBD as u64], &norm(&mut rng));
        if v.phi3() {
            w = mat(w, p("attn_qkv.weight"), q + 2 * kv, N_EMBD, &mut rng);
        } else {
            w = mat(w, p("attn_q.weight"), q, N_EMBD, &mut rng);
            w = mat(w, p("attn_k.weight"), kv, N_EMBD, &mut rng);
            w = mat(w, p("attn_v.weight"), kv, N_EMBD, &mut rng);
        }
        w = mat(w, p("attn_output.weight"), N_EMBD, q, &mut rng);
        if v.moe() {
            // The router stays f32 (as real MoE files keep it), spread wide enough that the
            // top experts stand apart; each stack is n_expert matrices one after the other.
            let r = rand_vec(&mut rng, N_EMBD * N_EXPERT, 3.0 / (N_EMBD as f32).sqrt());
            w = w.tensor_f32(
                p("ffn_gate_inp.weight"),
                &[N_EMBD as u64, N_EXPERT as u64],
                &r,
            );
            let fe = v.n_ff_exp();
            for (name, rows, cols) in [
                ("ffn_gate_exps.weight", fe, N_EMBD),
                ("ffn_up_exps.weight", fe, N_EMBD),
                ("ffn_down_exps.weight", N_EMBD, fe),
            ] {
                let x = rand_vec(&mut rng, N_EXPERT * rows * cols, 1.5 / (cols as f32).sqrt());
                let bytes = kernels_ref::quantize(v.matrix_type, &x).unwrap();
                let dims = [cols as u64, rows as u64, N_EXPERT as u64];
                w = w.tensor(p(name), v.matrix_type, &dims, bytes);
            }
            if v.arch == "qwen2moe" {
                let gate = rand_vec(&mut rng, N_EMBD, 1.0 / (N_EMBD as f32).sqrt());
                w = w.tensor_f32(p("ffn_gate_inp_shexp.weight"), &[N_EMBD as u64], &gate);
            }
            if v.shared_expert() {
                w = mat(w, p("ffn_gate_shexp.weight"), N_FF_SHARED, N_EMBD, &mut rng);
                w = mat(w, p("ffn_up_shexp.weight"), N_FF_SHARED, N_EMBD, &mut rng);
                w = mat(w, p("ffn_down_shexp.weight"), N_EMBD, N_FF_SHARED, &mut rng);
            }
        } else if v.phi3() {
            w = mat(w, p("ffn_up.weight"), 2 * N_FF, N_EMBD, &mut rng);
        } else {
            w = mat(w, p("ffn_gate.weight"), N_FF, N_EMBD, &mut rng);
            w = mat(w, p("ffn_up.weight"), N_FF, N_EMBD, &mut rng);
        }
        if !v.moe() {
            w = mat(w, p("ffn_down.weight"), N_EMBD, N_FF, &mut rng);
        }
        if v.arch == "olmoe" {
            // Over the whole projections: [q_dim] and [kv_dim].
            let qn = norm_of(&mut rng, q);
            let kn = norm_of(&mut rng, kv);
            w = w.tensor_f32(p("attn_q_norm.weight"), &[q as u64], &qn);
            w = w.tensor_f32(p("attn_k_norm.weight"), &[kv as u64], &kn);
        }
        if v.qwen3() {
            let hd = v.head_dim();
            let qn = norm_of(&mut rng, hd);
            let kn = norm_of(&mut rng, hd);
            w = w.tensor_f32(p("attn_q_norm.weight"), &[hd as u64], &qn);
            w = w.tensor_f32(p("attn_k_norm.weight"), &[hd as u64], &kn);
        }
        if v.gemma() {
            w = w.tensor_f32(
                p("post_attention_norm.weight"),
                &[N_EMBD as u64],
                &norm(&mut rng),
            );
            w = w.tensor_f32(p("post_ffw_norm.weight"), &[N_EMBD as u64], &norm(&mut rng));
        }
        if v.bias && v.phi3() {
            let n = q + 2 * kv;
            w = w.tensor_f32(p("attn_qkv.bias"), &[n as u64], &rand_vec(&mut rng, n, 0.5));
        } else if v.bias {
            w = w.tensor_f32(p("attn_q.bias"), &[q as u64], &rand_vec(&mut rng, q, 0.5));
            w = w.tensor_f32(p("attn_k.bias"), &[kv as u64], &rand_vec(&mut rng, kv, 0.5));
            w = w.tensor_f32(p("attn_v.bias"), &[kv as u64], &rand_vec(&mut rng, kv, 0.5));
        }
    }
    w.write_to(path).unwrap();
}

#[test]
fn llama_llama3_mistral_qwen2_qwen3_smollm3_gemma2_gemma3_phi3_granite_and_moe_match_the_reference()
{
    let dir = std::env::temp_dir().join(format!("memwall-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Float weights take the fast path's f32 dot products, so they must match the reference
    // to rounding: these catch any structural slip (a bias, the RoPE pairing, the output head).
    // Quantized weights go through 8-bit activations, which moves random-weight logits by a
    // few percent of their range; a structural slip moves them by all of it.
    let v = |arch, tied, bias, matrix_type| Variant {
        arch,
        tied,
        bias,
        matrix_type,
    };
    let variants = [
        v("llama", true, false, GgmlType::F32),
        v("mistral", false, false, GgmlType::F16),
        v("qwen2", false, true, GgmlType::F32),
        v("qwen2", true, true, GgmlType::F16),
        v("llama", true, false, GgmlType::Q4_1),
        v("llama", false, false, GgmlType::Q8_0),
        v("mistral", false, false, GgmlType::Q4_0),
        v("qwen2", true, true, GgmlType::Q5_1),
        v("llama3", false, false, GgmlType::F32),
        v("llama3", true, false, GgmlType::Q4_0),
        v("smollm3", false, false, GgmlType::F32),
        v("smollm3", true, false, GgmlType::Q8_0),
        v("qwen3", false, false, GgmlType::F32),
        v("qwen3", true, false, GgmlType::Q8_0),
        v("gemma3", false, false, GgmlType::F32),
        v("gemma3", true, false, GgmlType::Q4_0),
        v("gemma2", false, false, GgmlType::F32),
        v("gemma2", true, false, GgmlType::Q8_0),
        v("phi3", false, false, GgmlType::F32),
        v("phi3", true, false, GgmlType::Q4_0),
        // A fused bias too (split with its weight).
        v("phi3", false, true, GgmlType::F16),
        v("qwen3moe", false, false, GgmlType::F32),
        v("qwen3moe", true, false, GgmlType::Q8_0),
        v("qwen2moe", false, true, GgmlType::F16),
        v("olmoe", false, false, GgmlType::F32),
        v("mixtral", false, false, GgmlType::F32),
        v("mixtral", true, false, GgmlType::Q8_0),
        v("granite", false, false, GgmlType::F32),
        v("granite", true, false, GgmlType::Q4_0),
        v("granitemoe", false, false, GgmlType::F32),
        v("granitemoe", true, false, GgmlType::Q8_0),
        v("granitemoeshared", false, false, GgmlType::F32),
    ];
    for v in &variants {
        let v: &Variant = v;
        let path = dir.join(format!("{}-{}.gguf", v.arch, v.matrix_type));
        write_model(v, &path);
        let float = matches!(v.matrix_type, GgmlType::F32 | GgmlType::F16);
        // Quantized experts run with f32 activations: the 8-bit ones move a random router's
        // near-ties enough to swap an expert now and then (which moves the logits by far more
        // than rounding), while f32 activations check the expert kernels to rounding.
        let f32_activations = v.moe() && !float;
        let opts = LoadOptions {
            f32_activations,
            ..Default::default()
        };
        let model = Model::load(&path, &opts).unwrap();
        let c = model.config().clone();
        assert_eq!(c.tied_embeddings, v.tied);
        assert_eq!(c.qkv_bias, v.bias);
        assert_eq!(c.qk_norm, v.expected_qk_norm());
        if v.longrope().is_none() {
            assert_eq!(c.rope_freq_factors, v.rope_factors());
        }
        assert_eq!(c.head_dim, v.head_dim());
        match &c.moe {
            Some(m) => {
                assert!(v.moe());
                assert_eq!((m.n_expert, m.n_expert_used), (N_EXPERT, N_EXPERT_USED));
                assert_eq!(m.n_ff_exp, v.n_ff_exp());
                assert_eq!(
                    m.norm_weights,
                    matches!(
                        v.arch,
                        "qwen3moe" | "mixtral" | "granitemoe" | "granitemoeshared"
                    )
                );
                let shared = v.shared_expert().then_some(N_FF_SHARED);
                assert_eq!(m.n_ff_shared, shared);
                assert_eq!(m.shared_gate, v.arch == "qwen2moe");
            }
            None => assert!(!v.moe()),
        }
        assert_eq!(c.post_norms, v.gemma());
        if v.granite() {
            assert_eq!(c.embed_scale, GRANITE_EMBD_SCALE);
            assert_eq!(c.residual_scale, GRANITE_RESIDUAL_SCALE);
            assert_eq!(c.attn_scale, GRANITE_ATTN_SCALE);
            assert_eq!(c.logit_scale, 1.0 / GRANITE_LOGIT_SCALE);
            let rotating = (0..c.n_layer).filter(|&l| c.uses_rope(l)).count();
            assert_eq!(rotating, if v.granite_nope() { 0 } else { c.n_layer });
        } else {
            assert_eq!((c.residual_scale, c.logit_scale), (1.0, 1.0));
        }
        if v.gemma2() {
            let local: Vec<bool> = (0..4).map(|l| c.window(l).is_some()).collect();
            assert_eq!(local, [true, false, true, false]);
            assert_eq!(
                c.rope_of(0),
                c.rope_of(1),
                "gemma2's local RoPE is the global one"
            );
            assert_eq!(c.attn_logit_softcap, Some(2.0));
            assert_eq!(c.final_logit_softcap, Some(50.0));
        } else {
            assert_eq!(c.attn_logit_softcap, None);
        }
        if let Some((short, long)) = v.longrope() {
            assert_eq!(c.n_rot, PHI3_N_ROT);
            assert_eq!(c.rope_factors(PHI3_ORIG_CTX), Some(&short[..]));
            assert_eq!(c.rope_factors(PHI3_ORIG_CTX + 1), Some(&long[..]));
            assert_eq!(c.rope_attn_factor, PHI3_ATTN_FACTOR);
            assert_eq!(
                c.window(0),
                None,
                "phi3's window is not applied (as llama.cpp)"
            );
        }
        if v.gemma3() {
            let local: Vec<bool> = (0..6).map(|l| c.window(l).is_some()).collect();
            assert_eq!(local, [true, true, true, true, true, false]);
            assert_eq!(c.window(0), Some(GEMMA3_WINDOW));
            assert_eq!(c.rope_of(0), (10000.0, 1.0));
            assert_eq!(c.rope_of(5), (1e6, 1.0));
            assert_eq!(c.embed_scale, (N_EMBD as f32).sqrt());
            assert_eq!(c.final_logit_softcap, Some(50.0));
        }
        let g = Gguf::open(&path).unwrap();
        let ids: Vec<u32> = model.tokenizer().encode("Hi, qwen & llama!", false, false);
        assert_eq!(ids.len(), 17, "one token per byte with no merges");
        let want = reference_forward(&g, &c, &ids, 64);
        let mut s = model.session_with_ctx(64).unwrap();
        let got = s.eval(&ids, Logits::All).unwrap();
        let e = rel_err(&got, &want);
        eprintln!(
            "{} {} tied={} bias={}: max rel err {e:.2e}",
            v.arch, v.matrix_type, v.tied, v.bias
        );
        // The Q8_0 embedding feeds the output head in tied variants, with 8-bit activations.
        let tol = if (float || f32_activations) && !v.tied {
            2e-3
        } else if float || f32_activations {
            2e-2
        } else {
            0.12
        };
        assert!(
            e < tol,
            "{} {}: logits differ by {e} (tolerance {tol})",
            v.arch,
            v.matrix_type
        );
        let mut s = model.session_with_ctx(64).unwrap();
        let mut step = Vec::new();
        for &id in &ids {
            step.extend(s.eval(&[id], Logits::All).unwrap());
        }
        let e = rel_err(&step, &got);
        assert!(
            e < 1e-3,
            "{} {}: decode differs from prefill by {e}",
            v.arch,
            v.matrix_type
        );
        if v.phi3() {
            // A context within the original length runs with the short factors.
            let mut s = model.session_with_ctx(PHI3_ORIG_CTX).unwrap();
            let short = s.eval(&ids, Logits::All).unwrap();
            let want_short = reference_forward(&g, &c, &ids, PHI3_ORIG_CTX);
            let e = rel_err(&short, &want_short);
            assert!(e < tol, "phi3 {}: short factors: {e}", v.matrix_type);
            assert!(
                rel_err(&want_short, &want) > 10.0 * tol,
                "the long and short factors must move these logits"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_architecture_and_missing_tensor_are_named() {
    let dir = std::env::temp_dir().join(format!("memwall-arch-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    write_model(
        &Variant {
            arch: "llama",
            tied: true,
            bias: false,
            matrix_type: GgmlType::Q8_0,
        },
        &path,
    );
    // Same file with another architecture name.
    let g = Gguf::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        let val = if k == "general.architecture" {
            Value::String("mamba".into())
        } else {
            val.clone()
        };
        w = w.metadata(k.clone(), val);
    }
    for t in g.tensors() {
        w = w.tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec());
    }
    let bad = dir.join("mamba.gguf");
    w.write_to(&bad).unwrap();
    let err = Model::load(&bad, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"mamba\" is not supported"), "{err}");
    // Without one layer's ffn_down.
    let mut w = GgufWriter::new();
    for (k, val) in g.metadata() {
        w = w.metadata(k.clone(), val.clone());
    }
    for t in g
        .tensors()
        .iter()
        .filter(|t| t.name != "blk.1.ffn_down.weight")
    {
        w = w.tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec());
    }
    let bad = dir.join("missing.gguf");
    w.write_to(&bad).unwrap();
    let err = Model::load(&bad, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.1.ffn_down.weight"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// qwen3's per-head Q/K norms and Llama 3's RoPE factors on the GPU (lavapipe in CI; an adapter
/// must be found): the whole model on the GPU against the same kernels-ref forward pass, prefill
/// and token by token.
#[test]
fn qwen3_llama3_smollm3_gemma2_gemma3_phi3_granite_and_the_mixtures_on_the_gpu_match_the_reference()
{
    use memwall::engine::DeviceChoice;
    use memwall::gpu::DeviceSelector;
    use memwall::kv_type::KvType;
    let dir = std::env::temp_dir().join(format!("memwall-arch-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("qwen3", GgmlType::F32, false, 5e-3),
        ("qwen3", GgmlType::Q8_0, true, 0.12),
        ("llama3", GgmlType::F32, false, 5e-3),
        ("smollm3", GgmlType::F32, false, 5e-3),
        ("gemma3", GgmlType::F32, false, 5e-3),
        ("gemma3", GgmlType::Q8_0, true, 0.12),
        ("phi3", GgmlType::F32, false, 5e-3),
        ("phi3", GgmlType::Q8_0, true, 0.12),
        ("gemma2", GgmlType::F32, false, 5e-3),
        ("gemma2", GgmlType::Q8_0, true, 0.12),
        // The mixtures on the GPU's expert kernels (routing, the experts' matvecs over the
        // stacks, qwen2moe's gated shared expert, olmoe's whole-projection Q/K norms).
        ("qwen3moe", GgmlType::F32, false, 5e-3),
        ("qwen3moe", GgmlType::Q8_0, true, 0.12),
        ("qwen2moe", GgmlType::F32, true, 5e-3),
        ("olmoe", GgmlType::F32, false, 5e-3),
        // Scaled embedding, residual branches (the add kernel's scaled form) and logits (its
        // scale mode); granitemoe without RoPE.
        ("granite", GgmlType::F32, false, 5e-3),
        ("granite", GgmlType::Q8_0, true, 0.12),
        ("granitemoe", GgmlType::F32, false, 5e-3),
        ("granitemoeshared", GgmlType::F32, false, 5e-3),
    ];
    for (arch, matrix_type, tied, tol) in cases {
        let v = Variant {
            arch,
            tied,
            bias: false,
            matrix_type,
        };
        let path = dir.join(format!("{arch}-gpu-{matrix_type}.gguf"));
        write_model(&v, &path);
        let opts = LoadOptions {
            device: DeviceChoice::Gpu(DeviceSelector::Auto),
            cache_type_k: Some(KvType::F32),
            cache_type_v: Some(KvType::F32),
            ..Default::default()
        };
        let model = match Model::load(&path, &opts) {
            Ok(m) => m,
            Err(e) => panic!(
                "cannot load on the GPU ({e}); install Mesa lavapipe (mesa-vulkan-drivers) \
                 or set WGPU_BACKEND"
            ),
        };
        assert!(model.gpu().is_some(), "--device gpu must not fall back");
        let on_gpu = |p: &memwall::ground::Placement| {
            p.layers.iter().all(|&d| d == memwall::ground::Device::Gpu)
        };
        let p = model.placement();
        assert!(
            on_gpu(&p.prefill) && on_gpu(&p.decode),
            "{arch}: every block on the GPU, got {}",
            p.decode
        );
        let c = model.config().clone();
        assert_eq!(c.qk_norm, v.expected_qk_norm());
        if v.longrope().is_none() {
            assert_eq!(c.rope_freq_factors, v.rope_factors());
        }
        assert_eq!(c.uses_rope(3), v.arch != "smollm3" && !v.granite_nope());
        let g = Gguf::open(&path).unwrap();
        let ids: Vec<u32> = model
            .tokenizer()
            .encode("Hi, a model on a GPU", false, false);
        let want = reference_forward(&g, &c, &ids, 64);
        let mut s = model.session_with_ctx(64).unwrap();
        let got = s.eval(&ids, Logits::All).unwrap();
        let e = rel_err(&got, &want);
        eprintln!(
            "{arch} {matrix_type} on {}: max rel err {e:.2e}",
            model.device_name()
        );
        assert!(
            e < tol,
            "{arch} {matrix_type} on the GPU: logits differ by {e} (tolerance {tol})"
        );
        let mut s = model.session_with_ctx(64).unwrap();
        let mut step = Vec::new();
        for &id in &ids {
            step.extend(s.eval(&[id], Logits::All).unwrap());
        }
        let e = rel_err(&step, &want);
        assert!(
            e < tol,
            "{arch} {matrix_type} on the GPU, token by token: {e} (tolerance {tol})"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
