//! Q4_K and Q6_K decode on the GPU exactly as kernels-ref does: the embedding kernel (a plain
//! `dq_block` per 32 columns, no arithmetic of its own) is run over every row of seeded random
//! tables and over the shared gguf-py fixtures, and its output compared value by value.
//!
//! Every product in the two fragments is exact in f32 (see shaders/quant/q4_k.wgsl and
//! q6_k.wgsl), so the GPU value must equal kernels-ref's bit for bit whatever order or fma
//! contraction the shader compiler picks; the comparison is exact.
//!
//! Needs a GPU adapter (lavapipe, or `WGPU_BACKEND=gl`) and ../shared; FAILS without either.

mod common;
mod gpu_support;

use std::path::PathBuf;

use gpu_support::{context, random_weights, Rng};
use kernels_ref::GgmlType;
use memwall::gguf::Gguf;
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::{repack, GpuContext, WeightFormat};

fn shared_dir() -> PathBuf {
    common::shared()
}

/// Every kernel set of the adapter, plus one on a 7-workgroup-wide grid (37 rows: 7 x 6, 5 surplus).
fn kernel_sets(ctx: &GpuContext) -> Vec<Kernels> {
    let mut v = vec![Kernels::with_options(ctx, false).unwrap()];
    if ctx.has_subgroups() {
        v.push(Kernels::with_options(ctx, true).unwrap());
    }
    let mut small = Kernels::with_options(ctx, false).unwrap();
    small.max_groups_per_dim = 7;
    v.push(small);
    v
}

/// All rows of `table` (`[rows, cols]` of `ty`, ggml layout) through the GPU embedding, in
/// order: `[rows, cols]` f32.
fn decode_all_rows(
    ctx: &GpuContext,
    k: &Kernels,
    ty: WeightFormat,
    table: &[u8],
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let m = kernels::upload_matrix(ctx, &repack(ty, table, rows, cols).unwrap()).unwrap();
    let ids: Vec<u32> = (0..rows as u32).collect();
    let idb = kernels::upload_u32(ctx, "ids", &ids).unwrap();
    // Poisoned, with 3 guard elements that must stay NaN.
    let ob = kernels::upload_f32(ctx, "out", &vec![f32::NAN; rows * cols + 3]).unwrap();
    let d = k.embedding(ctx, &m, &idb, &ob, rows).unwrap();
    kernels::run(ctx, &[&d]).unwrap();
    let got = kernels::read_f32(ctx, &ob, rows * cols + 3).unwrap();
    assert!(
        got[rows * cols..].iter().all(|v| v.is_nan()),
        "{ty:?}: wrote past the end"
    );
    got[..rows * cols].to_vec()
}

/// Asserts `got == want` bit for bit (so a NaN anywhere fails), naming the first difference.
fn assert_exact(what: &str, got: &[f32], want: &[f32], cols: usize) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: [{}, {}]: got {} want {}",
            i / cols,
            i % cols,
            got[i],
            want[i]
        );
    }
}

#[test]
fn kquant_tables_decode_exactly() {
    let ctx = context();
    let ks = kernel_sets(&ctx);
    for ty in [WeightFormat::Q4_K, WeightFormat::Q6_K] {
        // 37 x 768: 111 super-blocks (odd, so Q6_K's last scale pair is half empty); 5 x 4352:
        // 17 per row, more than one 64-invocation stride of 32-column blocks.
        for (rows, cols) in [(37, 768), (5, 4352), (1, 256)] {
            let mut rng = Rng(0x6b ^ (rows * 977 + cols) as u64);
            let table = random_weights(&mut rng, ty.ggml(), rows, cols);
            let want = kernels_ref::dequantize_vec(ty.ggml(), &table, rows * cols).unwrap();
            for k in &ks {
                let got = decode_all_rows(&ctx, k, ty, &table, rows, cols);
                let what = format!(
                    "{ty:?} [{rows}x{cols}] subgroup={} max_groups={}",
                    k.subgroup, k.max_groups_per_dim
                );
                assert_exact(&what, &got, &want, cols);
            }
        }
    }
}

#[test]
fn kquant_fixtures_decode_like_gguf_py() {
    // Blocks written by gguf-py (random codes and 6-bit scales) and gguf-py's own dequantized
    // values: an oracle independent of kernels-ref.
    let dir = shared_dir().join("fixtures");
    let open = |n: &str| {
        let p = dir.join(n);
        Gguf::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (vectors, expected) = (open("quant_vectors.gguf"), open("quant_expected.gguf"));
    let ctx = context();
    let k = Kernels::new(&ctx).unwrap();
    let mut seen = [0usize; 2];
    for t in vectors.tensors() {
        let Some(slot) = [GgmlType::Q4_K, GgmlType::Q6_K]
            .iter()
            .position(|&g| g == t.ty)
        else {
            continue;
        };
        let ty = WeightFormat::from_ggml(t.ty).unwrap();
        let cols = t.dims[0] as usize;
        let rows = (t.n_elements / t.dims[0]) as usize;
        let data = vectors.tensor_data(t);
        let got = decode_all_rows(&ctx, &k, ty, data, rows, cols);
        // kernels-ref: exact.
        let want = kernels_ref::dequantize_vec(t.ty, data, rows * cols).unwrap();
        assert_exact(&t.name, &got, &want, cols);
        // gguf-py: within the fixtures' documented bound, 1e-6 * max|b|.
        let e = expected.require_tensor(&t.name).unwrap();
        let py = kernels_ref::dequantize_vec(GgmlType::F32, expected.tensor_data(e), rows * cols)
            .unwrap();
        let max_b = py.iter().fold(0f32, |m, v| m.max(v.abs()));
        let max_err = got
            .iter()
            .zip(&py)
            .map(|(a, b)| (a - b).abs())
            .fold(
                0f32,
                |m, v| if v.is_nan() { f32::INFINITY } else { m.max(v) },
            );
        eprintln!(
            "{}: [{rows}x{cols}] max |gpu - gguf-py| {max_err:e}",
            t.name
        );
        assert!(
            max_err <= 1e-6 * max_b,
            "{}: max error {max_err} > 1e-6 * {max_b}",
            t.name
        );
        seen[slot] += 1;
    }
    assert!(
        seen.iter().all(|&n| n > 0),
        "fixtures lack Q4_K or Q6_K tensors: {seen:?}"
    );
}
