//! Attention on the GPU: time per call of the decode (split + combine) and prefill (tiled,
//! online softmax) paths at the test model's attention shape (9 query heads, 3 KV heads, head
//! dim 64, a 2048-position f32 cache), decode at pos0 0, 100 and 1000 and a 64-token prefill,
//! for each reduction variant the default adapter has (WGPU_BACKEND picks another). Each call
//! is submitted and waited for; median (and min) of 10 after 2 warm-ups. Decode at pos0 0
//! shows the fixed cost of a submit and wait.
//!
//! `cargo bench --bench gpu_attention`

use std::time::Instant;

use memwall::gpu::kernels::attention::{
    split_scratch_len, AttentionConfig, AttentionPath, ATTENTION_CHUNK,
};
use memwall::gpu::kernels::{self, upload_f32, Dispatch, Kernels};
use memwall::gpu::{DeviceSelector, GpuContext};
use memwall::kv_type::KvTypes;

fn values(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn main() {
    let ctx = GpuContext::new(&DeviceSelector::Auto).expect("a GPU adapter");
    let mut sets = vec![Kernels::with_options(&ctx, false).expect("kernels")];
    if ctx.has_subgroups() {
        sets.push(Kernels::with_options(&ctx, true).expect("subgroup kernels"));
    }
    use AttentionPath::{Prefill, Split};
    // (n_tokens, pos0, paths)
    let runs: [(usize, usize, &[AttentionPath]); 4] = [
        (1, 0, &[Split]),
        (1, 100, &[Split, Prefill]),
        (1, 1000, &[Split, Prefill]),
        (64, 0, &[Prefill, Split]),
    ];
    let cfg = AttentionConfig {
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        scale: 0.125,
        n_ctx: 2048,
        kv: KvTypes::F32,
        window: None,
        softcap: None,
    };
    let mut seed = 7u64;
    for (n, pos0, paths) in runs {
        // q, out: [n, 9, 64]; k, v caches: [2048, 3, 64]; scratch: the split path's partials.
        let q = upload_f32(&ctx, "q", &values(&mut seed, n * 9 * 64)).unwrap();
        let kc = upload_f32(&ctx, "k", &values(&mut seed, 2048 * 3 * 64)).unwrap();
        let vc = upload_f32(&ctx, "v", &values(&mut seed, 2048 * 3 * 64)).unwrap();
        let out = upload_f32(&ctx, "out", &vec![0.0; n * 9 * 64]).unwrap();
        let s = split_scratch_len(&cfg, n, ATTENTION_CHUNK as usize);
        let scratch = upload_f32(&ctx, "scratch", &vec![0.0; s]).unwrap();
        for ks in &sets {
            for &path in paths {
                let launches = ks
                    .attention_launches_with(path, &q, &kc, &vc, &scratch, &out, &cfg, n, pos0)
                    .unwrap();
                let ds: Vec<Dispatch> = launches
                    .into_iter()
                    .map(|l| ks.prepare(&ctx, l).unwrap())
                    .collect();
                let refs: Vec<&Dispatch> = ds.iter().collect();
                let mut times = Vec::new();
                for i in 0..12 {
                    let t = Instant::now();
                    kernels::run(&ctx, &refs).unwrap();
                    if i >= 2 {
                        times.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                times.sort_by(f64::total_cmp);
                println!(
                    "{} subgroup={}: n_tokens {n} pos0 {pos0} {path:?}: median {:.3} ms (min {:.3})",
                    ctx.info.name,
                    ks.subgroup,
                    times[times.len() / 2],
                    times[0]
                );
            }
        }
    }
}
