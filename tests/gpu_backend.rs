//! The GPU backend against the CPU backend, op by op on the test model's real weights, and
//! a model whose tensors are split across storage bindings (a forced small limit) against the
//! same model in whole bindings: the split must give bit-identical results.
//!
//! Needs a GPU adapter (lavapipe in CI; `WGPU_BACKEND=gl` for the portable path): with none,
//! these tests FAIL.

mod common;
mod gpu_support;

use std::sync::Arc;

use memwall::backend::{Backend, WeightId};
use memwall::config::Config;
use memwall::cpu_backend::CpuBackend;
use memwall::gguf::Gguf;
use memwall::gpu::{GpuAct, GpuBackend, GpuLoadOptions, GpuModel};

const N_CTX: usize = 64;
const BATCH: usize = 8;

fn load(max_binding_bytes: Option<u64>) -> (Arc<Gguf>, Config, Arc<GpuModel>) {
    let g = Arc::new(Gguf::open(common::model_path()).unwrap());
    let cfg = Config::from_gguf(&g).unwrap();
    let ctx = gpu_support::context();
    let m = GpuModel::load(
        ctx,
        &g,
        &cfg,
        &GpuLoadOptions {
            max_binding_bytes,
            ..Default::default()
        },
    )
    .unwrap();
    (g, cfg, Arc::new(m))
}

fn read<B: Backend>(b: &mut B, a: &B::Act, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    b.read(a, &mut v).unwrap();
    v
}

/// Runs the same ops on both backends and compares each result.
#[test]
fn gpu_ops_match_the_cpu_backend_on_real_weights() {
    let (g, cfg, m) = load(None);
    let mut gb = GpuBackend::new(m.clone(), N_CTX, BATCH).unwrap();
    let mut cb = CpuBackend::new(g.clone(), cfg.clone(), N_CTX).unwrap();
    let (e, ff, qd) = (cfg.n_embd, cfg.n_ff, cfg.q_dim());
    // First, middle and last ids of the vocabulary, and a common one.
    let ids = [0u32, 1, 2, 12_345, (cfg.n_vocab - 1) as u32];
    let n = ids.len();

    macro_rules! both {
        ($len:expr) => {
            (gb.alloc($len).unwrap(), cb.alloc($len).unwrap())
        };
    }
    let (mut gx, mut cx) = both!(BATCH * e);
    gb.embed(&ids, &mut gx).unwrap();
    cb.embed(&ids, &mut cx).unwrap();
    let (x_g, x_c) = (read(&mut gb, &gx, n * e), read(&mut cb, &cx, n * e));
    // Q8_0 rows dequantize exactly the same way on both.
    assert_eq!(common::rel_to_range(&x_g, &x_c), 0.0, "embedding");

    let (mut gh, mut ch) = both!(BATCH * e);
    gb.rms_norm(WeightId::AttnNorm(3), &gx, n, &mut gh).unwrap();
    cb.rms_norm(WeightId::AttnNorm(3), &cx, n, &mut ch).unwrap();
    let r = common::rel_to_range(&read(&mut gb, &gh, n * e), &read(&mut cb, &ch, n * e));
    assert!(r < 1e-5, "rms_norm rel err {r}");
    // From here both take the CPU's normalised input, so their 8-bit codes are identical.
    let h_host = read(&mut cb, &ch, n * e);
    gb.write(&mut gh, &h_host).unwrap();

    // Matmuls: both quantize the activations to 8 bits the same way (llama.cpp's scheme) and
    // form the same integer chunk products; only the f32 summation order differs (~1e-6 of
    // the range). 1e-4 leaves room for a code flipped by a 1-ulp difference in the input.
    let (mut gq, mut cq) = both!(BATCH * qd);
    for n_tok in [1, n] {
        gb.matmul(WeightId::Wq(3), &gh, n_tok, &mut gq).unwrap();
        cb.matmul(WeightId::Wq(3), &ch, n_tok, &mut cq).unwrap();
        let r = common::rel_to_range(
            &read(&mut gb, &gq, n_tok * qd),
            &read(&mut cb, &cq, n_tok * qd),
        );
        eprintln!("Wq x {n_tok}: rel err {r:.2e}");
        assert!(r < 1e-4, "Wq x {n_tok} rel err {r}");
    }
    let (mut gg, mut cg) = both!(BATCH * ff);
    let (mut gu, mut cu) = both!(BATCH * ff);
    gb.matmul(WeightId::Gate(5), &gh, n, &mut gg).unwrap();
    cb.matmul(WeightId::Gate(5), &ch, n, &mut cg).unwrap();
    gb.matmul(WeightId::Up(5), &gh, n, &mut gu).unwrap();
    cb.matmul(WeightId::Up(5), &ch, n, &mut cu).unwrap();
    gb.glu(&mut gg, &gu, n * ff).unwrap();
    cb.glu(&mut cg, &cu, n * ff).unwrap();
    let r = common::rel_to_range(&read(&mut gb, &gg, n * ff), &read(&mut cb, &cg, n * ff));
    assert!(r < 1e-4, "gate/up/swiglu rel err {r}");
    // Down takes the CPU's own SwiGLU output on both, so only Down's rounding differs.
    let cg_host = read(&mut cb, &cg, n * ff);
    gb.write(&mut gg, &cg_host).unwrap();
    let (mut go, mut co) = both!(BATCH * e);
    gb.matmul(WeightId::Down(5), &gg, n, &mut go).unwrap();
    cb.matmul(WeightId::Down(5), &cg, n, &mut co).unwrap();
    let r = common::rel_to_range(&read(&mut gb, &go, n * e), &read(&mut cb, &co, n * e));
    assert!(r < 1e-4, "down rel err {r}");

    gb.add(&mut gx, &go, n * e).unwrap();
    cb.add(&mut cx, &co, n * e).unwrap();
    let r = common::rel_to_range(&read(&mut gb, &gx, n * e), &read(&mut cb, &cx, n * e));
    assert!(r < 1e-4, "add rel err {r}");

    // RoPE at a non-zero position on identical inputs.
    let q_host = read(&mut cb, &cq, n * qd);
    gb.write(&mut gq, &q_host).unwrap();
    gb.rope(0, &mut gq, n, cfg.n_head, 17).unwrap();
    cb.rope(0, &mut cq, n, cfg.n_head, 17).unwrap();
    let r = common::rel_to_range(&read(&mut gb, &gq, n * qd), &read(&mut cb, &cq, n * qd));
    assert!(r < 1e-5, "rope rel err {r}");

    // Output head (the tied 49152-row embedding: a 2-D dispatch) and argmax on the device.
    let (mut gs, mut cs) = both!(BATCH * e);
    gb.copy_rows(&gx, 2, 2, e, &mut gs).unwrap();
    cb.copy_rows(&cx, 2, 2, e, &mut cs).unwrap();
    assert_eq!(
        read(&mut gb, &gs, 2 * e),
        read(&mut gb, &gx, 4 * e)[2 * e..],
        "copy_rows"
    );
    let sel_c = read(&mut cb, &cs, 2 * e);
    gb.write(&mut gs, &sel_c).unwrap();
    let nv = cfg.n_vocab;
    let (mut gl, mut cl) = both!(2 * nv);
    gb.matmul(WeightId::TokEmbd, &gs, 2, &mut gl).unwrap();
    cb.matmul(WeightId::TokEmbd, &cs, 2, &mut cl).unwrap();
    let logits_g = read(&mut gb, &gl, 2 * nv);
    let r = common::rel_to_range(&logits_g, &read(&mut cb, &cl, 2 * nv));
    assert!(r < 1e-4, "output head rel err {r}");
    let ids_dev = gb.argmax(&gl, 2, nv).unwrap();
    let ids_host: Vec<u32> = logits_g
        .chunks(nv)
        .map(|row| memwall::sampler::argmax(row) as u32)
        .collect();
    assert_eq!(ids_dev, ids_host, "argmax on the device");
}

/// Runs a few ops that touch every split tensor kind (embedding table, matrices) on `m`.
fn split_probe(m: &Arc<GpuModel>, cfg: &Config) -> Vec<Vec<f32>> {
    let mut b = GpuBackend::new(m.clone(), N_CTX, BATCH).unwrap();
    let e = cfg.n_embd;
    let ids = [0u32, 7, 30_000, (cfg.n_vocab - 1) as u32];
    let n = ids.len();
    let mut x = b.alloc(BATCH * e).unwrap();
    let mut h = b.alloc(BATCH * e).unwrap();
    let mut g = b.alloc(BATCH * cfg.n_ff).unwrap();
    let mut o = b.alloc(BATCH * e).unwrap();
    let mut l = b.alloc(BATCH * cfg.n_vocab).unwrap();
    b.embed(&ids, &mut x).unwrap();
    b.rms_norm(WeightId::FfnNorm(0), &x, n, &mut h).unwrap();
    b.matmul(WeightId::Gate(0), &h, n, &mut g).unwrap();
    b.matmul(WeightId::Down(0), &g, n, &mut o).unwrap();
    b.matmul(WeightId::TokEmbd, &h, 1, &mut l).unwrap();
    let mut out = vec![read(&mut b, &x, n * e), read(&mut b, &g, n * cfg.n_ff)];
    out.push(read(&mut b, &o, n * e));
    out.push(read(&mut b, &l, cfg.n_vocab));
    out.push(
        b.argmax(&l, 1, cfg.n_vocab)
            .unwrap()
            .iter()
            .map(|&i| i as f32)
            .collect(),
    );
    out
}

#[test]
fn tensors_split_across_bindings_give_identical_results() {
    let (_, cfg, whole) = load(None);
    // 96 KiB per binding: the embedding table (30 MB) becomes hundreds of parts and every
    // projection several.
    let (_, _, split) = load(Some(96 * 1024));
    let parts = |id| split.matrix(id).unwrap().parts.len();
    assert!(
        parts(WeightId::TokEmbd) > 100,
        "{}",
        parts(WeightId::TokEmbd)
    );
    assert!(parts(WeightId::Gate(0)) > 1 && parts(WeightId::Down(0)) > 1);
    assert_eq!(whole.matrix(WeightId::Gate(0)).unwrap().parts.len(), 1);
    let a = split_probe(&whole, &cfg);
    let b = split_probe(&split, &cfg);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        // Same kernels on the same rows: bit-identical.
        assert_eq!(x, y, "output {i} differs between split and whole tensors");
    }
}

/// Layer by layer through the real model on both backends from the same input, with f32
/// activations on both (the 8-bit path is compared op by op above: there a 1-ulp difference
/// upstream may flip a code, which is 1/127 of a chunk's range): the hidden state after each
/// block stays within f32 rounding of the CPU's, so a kernel that drifts shows at its layer.
#[test]
fn every_layer_follows_the_cpu_backend() {
    use memwall::model::{embed_stage, layer_stage, Scratch};
    let g = Arc::new(Gguf::open(common::model_path()).unwrap());
    let cfg = Config::from_gguf(&g).unwrap();
    let opts = GpuLoadOptions {
        f32_activations: true,
        ..Default::default()
    };
    let m = Arc::new(GpuModel::load(gpu_support::context(), &g, &cfg, &opts).unwrap());
    let mut gb = GpuBackend::new(m.clone(), N_CTX, BATCH).unwrap();
    let mut cb = CpuBackend::new(g.clone(), cfg.clone(), N_CTX).unwrap();
    cb.set_f32_activations(true);
    let mut gs = Scratch::new(&mut gb, &cfg, BATCH).unwrap();
    let mut cs = Scratch::new(&mut cb, &cfg, BATCH).unwrap();
    let ids = [1u32, 504, 3575, 282, 4649, 314];
    let n = ids.len();
    let e = cfg.n_embd;
    embed_stage(&mut cb, &mut cs, &ids).unwrap();
    for l in 0..cfg.n_layer {
        // Both start the layer from the CPU's state, so errors do not compound.
        let x = read(&mut cb, &cs.x, n * e);
        gb.write(&mut gs.x, &x).unwrap();
        layer_stage(&mut gb, &cfg, &mut gs, l, n, 0).unwrap();
        layer_stage(&mut cb, &cfg, &mut cs, l, n, 0).unwrap();
        let r = common::rel_to_range(&read(&mut gb, &gs.x, n * e), &read(&mut cb, &cs.x, n * e));
        eprintln!("layer {l}: rel err {r:.2e}");
        // f32 sums of up to 1536 terms in different orders, through norm, attention and
        // SwiGLU: ~1e-6 of the state's range; 1e-4 leaves room and still catches any real
        // kernel error (a wrong scale or index is O(1)).
        assert!(r < 1e-4, "layer {l}: GPU differs from the CPU by {r:.3e}");
    }
}

/// A GPU backend with only the base ops: the trait's default (unfused) `matmul_qkv`,
/// `matmul_gate_up` and `matmul_add` run on it.
struct Unfused<'a>(&'a mut GpuBackend);

impl Backend for Unfused<'_> {
    type Act = GpuAct;
    fn name(&self) -> String {
        self.0.name()
    }
    fn alloc(&mut self, len: usize) -> memwall::error::Result<GpuAct> {
        self.0.alloc(len)
    }
    fn write(&mut self, dst: &mut GpuAct, src: &[f32]) -> memwall::error::Result<()> {
        self.0.write(dst, src)
    }
    fn read(&mut self, src: &GpuAct, dst: &mut [f32]) -> memwall::error::Result<()> {
        self.0.read(src, dst)
    }
    fn embed(&mut self, ids: &[u32], out: &mut GpuAct) -> memwall::error::Result<()> {
        self.0.embed(ids, out)
    }
    fn rms_norm(
        &mut self,
        norm: WeightId,
        x: &GpuAct,
        n: usize,
        out: &mut GpuAct,
    ) -> memwall::error::Result<()> {
        self.0.rms_norm(norm, x, n, out)
    }
    fn matmul(
        &mut self,
        w: WeightId,
        x: &GpuAct,
        n: usize,
        out: &mut GpuAct,
    ) -> memwall::error::Result<()> {
        self.0.matmul(w, x, n, out)
    }
    fn add_bias(&mut self, b: WeightId, x: &mut GpuAct, n: usize) -> memwall::error::Result<()> {
        self.0.add_bias(b, x, n)
    }
    fn rope(
        &mut self,
        layer: usize,
        x: &mut GpuAct,
        n: usize,
        n_heads: usize,
        pos0: usize,
    ) -> memwall::error::Result<()> {
        self.0.rope(layer, x, n, n_heads, pos0)
    }
    fn attention(
        &mut self,
        layer: usize,
        q: &GpuAct,
        k: &GpuAct,
        v: &GpuAct,
        n: usize,
        pos0: usize,
        out: &mut GpuAct,
    ) -> memwall::error::Result<()> {
        self.0.attention(layer, q, k, v, n, pos0, out)
    }
    fn glu(&mut self, g: &mut GpuAct, u: &GpuAct, len: usize) -> memwall::error::Result<()> {
        self.0.glu(g, u, len)
    }
    fn read_kv(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> memwall::error::Result<()> {
        self.0.read_kv(layer, n_pos, k, v)
    }
    fn write_kv(&mut self, layer: usize, k: &[f32], v: &[f32]) -> memwall::error::Result<()> {
        self.0.write_kv(layer, k, v)
    }
    fn kv_types(&self) -> memwall::kv_type::KvTypes {
        self.0.kv_types()
    }
    fn read_kv_raw(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut Vec<u8>,
        v: &mut Vec<u8>,
    ) -> memwall::error::Result<()> {
        self.0.read_kv_raw(layer, n_pos, k, v)
    }
    fn write_kv_raw(&mut self, layer: usize, k: &[u8], v: &[u8]) -> memwall::error::Result<()> {
        self.0.write_kv_raw(layer, k, v)
    }
    fn drop_kv(&mut self, layer: usize) {
        self.0.drop_kv(layer)
    }
    fn add(&mut self, x: &mut GpuAct, y: &GpuAct, len: usize) -> memwall::error::Result<()> {
        self.0.add(x, y, len)
    }
    fn copy_rows(
        &mut self,
        x: &GpuAct,
        first: usize,
        n_rows: usize,
        width: usize,
        out: &mut GpuAct,
    ) -> memwall::error::Result<()> {
        self.0.copy_rows(x, first, n_rows, width, out)
    }
}

/// The fused entry points (stacked Q/K/V and gate/up in one launch each, the residual add
/// folded into Wo and Down) against the trait's unfused defaults on the same GPU backend:
/// every element is the same sequence of operations, so the hidden state must agree bit for
/// bit, through a prefill batch and then decode steps, with fewer launches. The fused side's
/// q/k/v/g/u start poisoned, so a row the stacked launch misses would show as NaN.
#[test]
fn fused_layers_match_the_unfused_ops_bit_for_bit() {
    use memwall::model::{embed_stage, layer_stage, Scratch};
    let (_, cfg, m) = load(None);
    assert!(m.fused(WeightId::Wq(0)).is_some() && m.fused(WeightId::Gate(0)).is_some());
    let mut fb = GpuBackend::new(m.clone(), N_CTX, BATCH).unwrap();
    let mut ub_inner = GpuBackend::new(m.clone(), N_CTX, BATCH).unwrap();
    let mut fs = Scratch::new(&mut fb, &cfg, BATCH).unwrap();
    let mut ub = Unfused(&mut ub_inner);
    let mut us = Scratch::new(&mut ub, &cfg, BATCH).unwrap();
    let e = cfg.n_embd;
    let mut pos = 0;
    let mut launches = (0, 0);
    for ids in [&[1u32, 504, 3575, 282, 4649][..], &[314], &[28]] {
        let n = ids.len();
        for (buf, len) in [
            (&mut fs.q, cfg.q_dim()),
            (&mut fs.k, cfg.kv_dim()),
            (&mut fs.v, cfg.kv_dim()),
            (&mut fs.g, cfg.n_ff),
            (&mut fs.u, cfg.n_ff),
        ] {
            fb.write(buf, &vec![f32::NAN; BATCH * len]).unwrap();
        }
        embed_stage(&mut fb, &mut fs, ids).unwrap();
        embed_stage(&mut ub, &mut us, ids).unwrap();
        let (f0, u0) = (fb.stats().0, ub.0.stats().0);
        for l in 0..cfg.n_layer {
            layer_stage(&mut fb, &cfg, &mut fs, l, n, pos).unwrap();
            layer_stage(&mut ub, &cfg, &mut us, l, n, pos).unwrap();
        }
        launches = (fb.stats().0 - f0, ub.0.stats().0 - u0);
        let (a, b) = (read(&mut fb, &fs.x, n * e), read(&mut ub, &us.x, n * e));
        assert!(a.iter().all(|v| v.is_finite()), "non-finite hidden state");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "tokens at {pos}: element {i}");
        }
        pos += n;
    }
    eprintln!(
        "decode step layers: {} launches fused, {} unfused",
        launches.0, launches.1
    );
    // Per layer: one stacked Q/K/V launch instead of three matvecs, one gate/up instead of
    // two, no add after Wo or Down, and RoPE of Q and K in one launch (`rope_qk`) instead of
    // the trait's default of one `rope` each.
    assert_eq!(
        launches.1 - launches.0,
        6 * cfg.n_layer as u64,
        "launches saved per decode step"
    );
}
