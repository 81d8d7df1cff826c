//! A llama-family forward pass built from kernels-ref's reference ops alone: the oracle the
//! engine's forward pass is compared with. It follows llama.cpp's graphs for each difference
//! the config names (src/models/qwen3.cpp, gemma2.cpp, gemma3.cpp, smollm3.cpp, phi3.cpp,
//! qwen3moe.cpp, qwen2moe.cpp, olmoe.cpp, and `build_moe_ffn` in src/llama-graph.cpp), reading
//! the file's tensors as stored (phi3's fused `attn_qkv` and stacked gate/up `ffn_up`, the
//! experts' stacked `ffn_*_exps` included).

use memwall::config::{Config, FfnAct, QkNorm, RopeKind};
use memwall::gguf::Gguf;

/// Raw bytes, type, rows and cols of matrix `name`.
fn mat(g: &Gguf, name: &str) -> (Vec<u8>, kernels_ref::GgmlType, usize, usize) {
    let t = g.require_tensor(name).unwrap();
    (
        g.tensor_data(t).to_vec(),
        t.ty,
        t.dims[1] as usize,
        t.dims[0] as usize,
    )
}

fn vecf(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.require_tensor(name).unwrap();
    kernels_ref::dequantize_vec(t.ty, g.tensor_data(t), t.n_elements as usize).unwrap()
}

/// y: [n, rows] = x: [n, cols] · Wᵀ.
fn matmul(g: &Gguf, name: &str, x: &[f32], n: usize) -> Vec<f32> {
    let (w, ty, rows, cols) = mat(g, name);
    let mut y = vec![f32::NAN; n * rows];
    kernels_ref::matmul(ty, &w, rows, cols, x, n, &mut y).unwrap();
    y
}

/// y: [n, rows] = x: [n, cols] · expert e's matrix of the stack `name` ([cols, rows,
/// n_expert]).
fn expert_matmul(g: &Gguf, name: &str, e: usize, x: &[f32], n: usize) -> Vec<f32> {
    let t = g.require_tensor(name).unwrap();
    let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
    let rb = t.ty.row_bytes(cols as u64).unwrap() as usize;
    let w = &g.tensor_data(t)[e * rows * rb..(e + 1) * rows * rb];
    let mut y = vec![f32::NAN; n * rows];
    kernels_ref::matmul(t.ty, w, rows, cols, x, n, &mut y).unwrap();
    y
}

/// The gated feed-forward down(act(gate · x) * (up · x)) of the matrices `gate`, `up`,
/// `down` (expert e of stacks when `e` is given) on x: [n, n_embd].
fn ffn(g: &Gguf, c: &Config, names: [&str; 3], e: Option<usize>, x: &[f32], n: usize) -> Vec<f32> {
    let mm = |name: &str, x: &[f32]| match e {
        Some(e) => expert_matmul(g, name, e, x, n),
        None => matmul(g, name, x, n),
    };
    let (gate, up) = (mm(names[0], x), mm(names[1], x));
    let mut s = vec![0f32; gate.len()];
    match c.ffn_act {
        FfnAct::Silu => kernels_ref::swiglu(&gate, &up, &mut s),
        FfnAct::GeluTanh => kernels_ref::geglu(&gate, &up, &mut s),
    }
    mm(names[2], &s)
}

/// Block l's mixture of experts on h: [n, n_embd], token by token as llama.cpp's
/// `build_moe_ffn`: softmax of the router's logits, the top n_expert_used experts weighted by
/// their (normalized) probabilities, plus the shared expert: qwen2moe's times the sigmoid of
/// its gate, granitemoe's as it is.
fn moe(g: &Gguf, c: &Config, l: usize, h: &[f32], n: usize) -> Vec<f32> {
    let m = c.moe.as_ref().unwrap();
    let e = c.n_embd;
    let p = |s: &str| format!("blk.{l}.{s}");
    let logits = matmul(g, &p("ffn_gate_inp.weight"), h, n);
    let mut out = vec![0f32; n * e];
    let exps = [
        p("ffn_gate_exps.weight"),
        p("ffn_up_exps.weight"),
        p("ffn_down_exps.weight"),
    ];
    for t in 0..n {
        let (mut ids, mut w) = (vec![0u32; m.n_expert_used], vec![0f32; m.n_expert_used]);
        let lt = &logits[t * m.n_expert..(t + 1) * m.n_expert];
        kernels_ref::route_experts(lt, m.norm_weights, &mut ids, &mut w);
        let x = &h[t * e..(t + 1) * e];
        for (&id, &wt) in ids.iter().zip(&w) {
            let names = [&exps[0][..], &exps[1][..], &exps[2][..]];
            let y = ffn(g, c, names, Some(id as usize), x, 1);
            out[t * e..(t + 1) * e]
                .iter_mut()
                .zip(&y)
                .for_each(|(o, v)| *o += wt * v);
        }
    }
    if m.n_ff_shared.is_some() {
        let names = [
            &p("ffn_gate_shexp.weight")[..],
            &p("ffn_up_shexp.weight")[..],
            &p("ffn_down_shexp.weight")[..],
        ];
        let y = ffn(g, c, names, None, h, n);
        // qwen2moe gates it (the file has its gate vector); granitemoe adds it as it is.
        let gate = g
            .tensor(&p("ffn_gate_inp_shexp.weight"))
            .map(|_| vecf(g, &p("ffn_gate_inp_shexp.weight")));
        for t in 0..n {
            let sig = match &gate {
                Some(gate) => {
                    let v = kernels_ref::dot_f64(&h[t * e..(t + 1) * e], gate);
                    (1.0 / (1.0 + (-v).exp())) as f32
                }
                None => 1.0,
            };
            for (o, y) in out[t * e..(t + 1) * e]
                .iter_mut()
                .zip(&y[t * e..(t + 1) * e])
            {
                *o += sig * y;
            }
        }
    }
    out
}

/// Splits y: [n, sum of widths] into its column blocks ([n, width] each).
fn split_cols(y: &[f32], n: usize, widths: &[usize]) -> Vec<Vec<f32>> {
    let total: usize = widths.iter().sum();
    assert_eq!(y.len(), n * total);
    let mut at = 0;
    widths
        .iter()
        .map(|&w| {
            let part = (0..n)
                .flat_map(|t| y[t * total + at..t * total + at + w].iter().copied())
                .collect();
            at += w;
            part
        })
        .collect()
}

/// Logits [n, n_vocab] of `ids` from position 0, in a context of `n_ctx` positions (which
/// picks LongRoPE's long or short factors).
pub fn reference_forward(g: &Gguf, c: &Config, ids: &[u32], n_ctx: usize) -> Vec<f32> {
    let n = ids.len();
    let e = c.n_embd;
    let (emb, ety, _, _) = mat(g, "token_embd.weight");
    let mut x = vec![0f32; n * e];
    for (i, &id) in ids.iter().enumerate() {
        kernels_ref::embedding(ety, &emb, e, id as usize, &mut x[i * e..(i + 1) * e]).unwrap();
    }
    // gemma: the embedding times sqrt(n_embd).
    x.iter_mut().for_each(|v| *v *= c.embed_scale);
    let neox = c.rope_kind == RopeKind::Neox;
    let mut h = vec![0f32; n * e];
    let (qd, kd) = (c.q_dim(), c.kv_dim());
    for l in 0..c.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        kernels_ref::rms_norm(&x, &vecf(g, &p("attn_norm.weight")), c.rms_eps, &mut h);
        let fused = g.tensor(&p("attn_qkv.weight")).is_some();
        let (mut q, mut k, mut v) = if fused {
            // llama.cpp's build_qkv: Q, K, V are views of one product at offsets 0, q, q + kv.
            let mut qkv = matmul(g, &p("attn_qkv.weight"), &h, n);
            if c.qkv_bias {
                let b = vecf(g, &p("attn_qkv.bias"));
                for row in qkv.chunks_mut(b.len()) {
                    let r = row.to_vec();
                    kernels_ref::add(&r, &b, row);
                }
            }
            let mut parts = split_cols(&qkv, n, &[qd, kd, kd]).into_iter();
            let mut next = || parts.next().unwrap();
            (next(), next(), next())
        } else {
            (
                matmul(g, &p("attn_q.weight"), &h, n),
                matmul(g, &p("attn_k.weight"), &h, n),
                matmul(g, &p("attn_v.weight"), &h, n),
            )
        };
        if c.qkv_bias && !fused {
            for (t, name) in [
                (&mut q, "attn_q.bias"),
                (&mut k, "attn_k.bias"),
                (&mut v, "attn_v.bias"),
            ] {
                let b = vecf(g, &p(name));
                for row in t.chunks_mut(b.len()) {
                    let r = row.to_vec();
                    kernels_ref::add(&r, &b, row);
                }
            }
        }
        if c.qk_norm != QkNorm::None {
            // Each head's row of head_dim values on its own (llama.cpp's qwen3 graph), or each
            // token's whole projection (olmoe): the weight's length is the row.
            for (t, name) in [
                (&mut q, "attn_q_norm.weight"),
                (&mut k, "attn_k_norm.weight"),
            ] {
                let w = vecf(g, &p(name));
                let per_head = c.qk_norm == QkNorm::PerHead;
                assert_eq!(w.len() == c.head_dim, per_head);
                let r = t.clone();
                kernels_ref::rms_norm(&r, &w, c.rms_eps, t);
            }
        }
        for i in (0..n).filter(|_| c.uses_rope(l)) {
            // gemma3's sliding-window blocks have their own base; phi3 has LongRoPE's factors
            // for this context and its attention factor.
            let (freq_base, freq_scale) = c.rope_of(l);
            let r = kernels_ref::Rotation {
                n_rot: c.n_rot,
                freq_base,
                freq_scale,
                factors: c.rope_factors(n_ctx),
                mscale: c.rope_attn_factor,
                neox,
            };
            let (nh, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
            kernels_ref::rope(&mut q[i * qd..(i + 1) * qd], nh, hd, i, &r);
            kernels_ref::rope(&mut k[i * kd..(i + 1) * kd], nkv, hd, i, &r);
        }
        let mut att = vec![0f32; n * qd];
        let (nh, nkv, hd, w) = (c.n_head, c.n_head_kv, c.head_dim, c.window(l));
        // gemma's sliding windows; gemma2's soft-capped scores.
        let sc = kernels_ref::AttnScores::new(c.attn_scale)
            .window(w)
            .softcap(c.attn_logit_softcap);
        kernels_ref::attention(&q, &k, &v, n, n, nh, nkv, hd, 0, sc, &mut att);
        let mut o = matmul(g, &p("attn_output.weight"), &att, n);
        if c.post_norms {
            let r = o.clone();
            kernels_ref::rms_norm(
                &r,
                &vecf(g, &p("post_attention_norm.weight")),
                c.rms_eps,
                &mut o,
            );
        }
        residual_add(&mut x, &o, c.residual_scale);
        kernels_ref::rms_norm(&x, &vecf(g, &p("ffn_norm.weight")), c.rms_eps, &mut h);
        if c.moe.is_some() {
            let d = moe(g, c, l, &h, n);
            residual_add(&mut x, &d, c.residual_scale);
            continue;
        }
        let (gate, up) = if g.tensor(&p("ffn_gate.weight")).is_some() {
            (
                matmul(g, &p("ffn_gate.weight"), &h, n),
                matmul(g, &p("ffn_up.weight"), &h, n),
            )
        } else {
            // phi3: ffn_up stacks gate and up; ggml_swiglu gates with the first half.
            let both = matmul(g, &p("ffn_up.weight"), &h, n);
            let mut parts = split_cols(&both, n, &[c.n_ff, c.n_ff]).into_iter();
            (parts.next().unwrap(), parts.next().unwrap())
        };
        let mut s = vec![0f32; gate.len()];
        match c.ffn_act {
            FfnAct::Silu => kernels_ref::swiglu(&gate, &up, &mut s),
            FfnAct::GeluTanh => kernels_ref::geglu(&gate, &up, &mut s),
        }
        let mut d = matmul(g, &p("ffn_down.weight"), &s, n);
        if c.post_norms {
            let r = d.clone();
            kernels_ref::rms_norm(&r, &vecf(g, &p("post_ffw_norm.weight")), c.rms_eps, &mut d);
        }
        residual_add(&mut x, &d, c.residual_scale);
    }
    kernels_ref::rms_norm(&x, &vecf(g, "output_norm.weight"), c.rms_eps, &mut h);
    let out = if c.tied_embeddings {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let mut logits = matmul(g, out, &h, n);
    // granite: times 1 / its logit scale.
    if c.logit_scale != 1.0 {
        kernels_ref::scale(&mut logits, c.logit_scale);
    }
    if let Some(cap) = c.final_logit_softcap {
        kernels_ref::softcap(&mut logits, cap);
    }
    logits
}

/// x += branch, or x += scale * branch (granite's residual scale).
fn residual_add(x: &mut [f32], branch: &[f32], scale: f32) {
    let x2 = x.to_vec();
    if scale == 1.0 {
        kernels_ref::add(&x2, branch, x);
    } else {
        kernels_ref::add_scaled(&x2, branch, scale, x);
    }
}

/// Largest |a - b| relative to the largest |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
