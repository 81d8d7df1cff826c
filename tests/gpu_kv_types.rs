//! GPU KV caches of every type (f32, f16, q8_0, q4_0; K and V chosen separately): the GPU's
//! store writes kernels-ref's blocks (the CPU's bytes), attention over them (decode split and
//! tiled prefill paths) matches kernels-ref's attention over the dequantized caches, the host
//! reads and writes (`read_kv`, `write_kv`, and raw blocks for moving layers) round-trip, and
//! CPU and GPU generate the same greedy ids with quantized caches.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the portable path): with none, these
//! tests FAIL.

mod common;
mod gpu_support;

use std::sync::Arc;

use common::kv::{greedy, load_with_kv};
use gpu_support::Rng;
use memwall::backend::Backend;
use memwall::config::Config;
use memwall::cpu_backend::CpuBackend;
use memwall::gguf::Gguf;
use memwall::gpu::registry::kv_type_pairs;
use memwall::gpu::{GpuBackend, GpuLoadOptions, GpuModel};
use memwall::kv_type::{KvType, KvTypes};

const N_CTX: usize = 32;
const BATCH: usize = 16;

fn load() -> (Arc<Gguf>, Config, Arc<GpuModel>) {
    let g = Arc::new(Gguf::open(common::model_path()).unwrap());
    let cfg = Config::from_gguf(&g).unwrap();
    let m = GpuModel::load(gpu_support::context(), &g, &cfg, &GpuLoadOptions::default()).unwrap();
    (g, cfg, Arc::new(m))
}

/// kernels-ref's bytes of `x` in `ty`.
fn quantized(ty: KvType, x: &[f32]) -> Vec<u8> {
    kernels_ref::quantize(ty.ggml_type(), x).unwrap()
}

/// Decode and prefill steps through the backends' attention for every (K, V) type pair: the
/// GPU cache holds exactly the CPU's (kernels-ref's) bytes, and the GPU's output is
/// kernels-ref's attention over the dequantized caches.
#[test]
fn gpu_store_and_attention_match_kernels_ref_for_every_type_pair() {
    let (g, cfg, m) = load();
    let (qd, kvd, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    for (pi, kv) in kv_type_pairs().enumerate() {
        let mut gb = GpuBackend::with_kv_types(m.clone(), N_CTX, BATCH, kv).unwrap();
        let all = vec![true; cfg.n_layer];
        let mut cb = CpuBackend::with_kv_types(g.clone(), cfg.clone(), N_CTX, &all, kv).unwrap();
        let mut rng = Rng(0x6b76 + pi as u64);
        let (mut q_g, mut k_g, mut v_g, mut o_g) = (
            gb.alloc(BATCH * qd).unwrap(),
            gb.alloc(BATCH * kvd).unwrap(),
            gb.alloc(BATCH * kvd).unwrap(),
            gb.alloc(BATCH * qd).unwrap(),
        );
        // Prefill past the split path's limit (tiled path), then decode one and three tokens
        // (split path).
        for (n, pos0) in [(9usize, 0usize), (1, 9), (3, 10)] {
            let q = rng.values(n * qd, 1.0);
            let k = rng.values(n * kvd, 1.0);
            let v = rng.values(n * kvd, 1.0);
            gb.write(&mut q_g, &q).unwrap();
            gb.write(&mut k_g, &k).unwrap();
            gb.write(&mut v_g, &v).unwrap();
            gb.attention(0, &q_g, &k_g, &v_g, n, pos0, &mut o_g)
                .unwrap();
            let mut out = vec![0f32; n * qd];
            gb.read(&o_g, &mut out).unwrap();
            let mut o_c = vec![0f32; BATCH * qd];
            cb.attention(0, &q, &k, &v, n, pos0, &mut o_c).unwrap();

            let n_pos = pos0 + n;
            let (mut gk, mut gv, mut ck, mut cv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            gb.read_kv_raw(0, n_pos, &mut gk, &mut gv).unwrap();
            cb.read_kv_raw(0, n_pos, &mut ck, &mut cv).unwrap();
            assert!(
                gk == ck && gv == cv,
                "{}: GPU and CPU cache bytes differ",
                kv.signature()
            );
            // The new rows are kernels-ref's quantization of k and v.
            let (kr, vr) = (kv.k.bytes(kvd), kv.v.bytes(kvd));
            assert_eq!(
                gk[pos0 * kr..],
                quantized(kv.k, &k)[..],
                "{}",
                kv.signature()
            );
            assert_eq!(
                gv[pos0 * vr..],
                quantized(kv.v, &v)[..],
                "{}",
                kv.signature()
            );

            let (mut kd, mut vd) = (vec![0f32; n_pos * kvd], vec![0f32; n_pos * kvd]);
            gb.read_kv(0, n_pos, &mut kd, &mut vd).unwrap();
            let mut want = vec![0f32; n * qd];
            let scale = 1.0 / (hd as f32).sqrt();
            kernels_ref::attention(
                &q,
                &kd,
                &vd,
                n,
                n_pos,
                cfg.n_head,
                cfg.n_head_kv,
                hd,
                pos0,
                kernels_ref::AttnScores::new(scale),
                &mut want,
            );
            // A wiring check (types, buffers, paths): a wrongly decoded cache is off by O(0.1)
            // on these values of magnitude <= 1.5; the kernels' rounding bounds themselves are
            // derived and checked per variant by the selftest (tests/gpu_selftest.rs), which
            // stay below 3e-4 for heads of 64 over 256 keys.
            for (i, (&a, &b)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{} n {n} pos0 {pos0} [{i}]: gpu {a} ref {b}",
                    kv.signature()
                );
            }
            for (&a, &b) in out.iter().zip(&o_c) {
                assert!((a - b).abs() <= 1e-4, "{}: gpu {a} cpu {b}", kv.signature());
            }
        }
    }
}

/// write_kv quantizes with kernels-ref's quantizers and read_kv returns the exact dequantized
/// values; raw blocks move a layer between GPU and CPU (and back) without changing a byte.
#[test]
fn gpu_read_write_kv_round_trip_for_every_type() {
    let (g, cfg, m) = load();
    let kvd = cfg.kv_dim();
    let n_pos = 7;
    for (i, &t) in KvType::ALL.iter().enumerate() {
        // K in t, V in the next type: both caches, each with its own type.
        let kv = KvTypes {
            k: t,
            v: KvType::ALL[(i + 1) % KvType::ALL.len()],
        };
        let mut gb = GpuBackend::with_kv_types(m.clone(), N_CTX, BATCH, kv).unwrap();
        let mut rng = Rng(0x77 + i as u64);
        let k = rng.values(n_pos * kvd, 2.0);
        let v = rng.values(n_pos * kvd, 2.0);
        gb.write_kv(1, &k, &v).unwrap();
        let (mut kb, mut vb) = (Vec::new(), Vec::new());
        gb.read_kv_raw(1, n_pos, &mut kb, &mut vb).unwrap();
        assert_eq!(kb, quantized(kv.k, &k), "{}", kv.signature());
        assert_eq!(vb, quantized(kv.v, &v), "{}", kv.signature());
        let (mut kd, mut vd) = (vec![0f32; n_pos * kvd], vec![0f32; n_pos * kvd]);
        gb.read_kv(1, n_pos, &mut kd, &mut vd).unwrap();
        let deq = |ty: KvType, b: &[u8]| {
            let mut out = vec![0f32; n_pos * kvd];
            kernels_ref::dequantize(ty.ggml_type(), b, &mut out).unwrap();
            out
        };
        assert_eq!(kd, deq(kv.k, &kb), "{}", kv.signature());
        assert_eq!(vd, deq(kv.v, &vb), "{}", kv.signature());

        // GPU -> CPU -> GPU as raw blocks (what the scheduler's migration does).
        let none = vec![false; cfg.n_layer];
        let mut cb = CpuBackend::with_kv_types(g.clone(), cfg.clone(), N_CTX, &none, kv).unwrap();
        cb.write_kv_raw(1, &kb, &vb).unwrap();
        let (mut ck, mut cv) = (vec![0f32; n_pos * kvd], vec![0f32; n_pos * kvd]);
        cb.read_kv(1, n_pos, &mut ck, &mut cv).unwrap();
        assert!(ck == kd && cv == vd, "{}", kv.signature());
        gb.drop_kv(1);
        let (mut cbk, mut cbv) = (Vec::new(), Vec::new());
        cb.read_kv_raw(1, n_pos, &mut cbk, &mut cbv).unwrap();
        gb.write_kv_raw(1, &cbk, &cbv).unwrap();
        let (mut k2, mut v2) = (Vec::new(), Vec::new());
        gb.read_kv_raw(1, n_pos, &mut k2, &mut v2).unwrap();
        assert!(k2 == kb && v2 == vb, "{}", kv.signature());
        // Malformed raw writes are errors, not partial writes.
        assert!(gb.write_kv_raw(1, &kb[1..], &vb).is_err());
    }
}

/// CPU and GPU pick the same greedy ids with quantized caches (f32 activations on both, the
/// mode in which they agree to rounding).
#[test]
fn cpu_and_gpu_pick_the_same_ids_with_quantized_caches() {
    for (k, v) in [(KvType::Q8_0, KvType::Q8_0), (KvType::Q8_0, KvType::Q4_0)] {
        let kv = KvTypes { k, v };
        let mut ids = Vec::new();
        for gpu in [false, true] {
            let model = load_with_kv(&common::model_path(), gpu, true, kv);
            let prompt = model
                .tokenizer()
                .encode("The capital of France is", true, false);
            let mut s = model.session_with_ctx(96).unwrap();
            assert_eq!(s.exec().kv_types(), kv);
            ids.push(greedy(&mut s, &prompt, 24).generated_ids);
        }
        assert_eq!(ids[0], ids[1], "{}: CPU and GPU ids differ", kv.signature());
    }
}
