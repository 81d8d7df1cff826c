//! The KV-cache store and both attention paths (flash-decoding split + combine, tiled prefill)
//! on a real adapter against kernels-ref's `attention`, on seeded random inputs with outliers,
//! NaN-poisoned outputs, scratch and unwritten cache rows, for the workgroup-memory and (where
//! the adapter has them) subgroup reductions.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the GL path). With no adapter these
//! tests FAIL: a GPU test must never pass silently.

mod common;
mod gpu_support;

use gpu_support::{context, Rng, U};
use memwall::gpu::kernels::attention::{
    split_scratch_len, AttentionConfig, AttentionPath, ATTENTION_CHUNK, SPLIT_MAX_TOKENS,
};
use memwall::gpu::kernels::{self, upload_f32, Dispatch, Kernels, Launch};
use memwall::gpu::{GpuContext, KernelKey};
use memwall::kv_type::{KvType, KvTypes};

/// NaN guards appended to every output buffer.
const GUARD: usize = 3;

/// Workgroup-memory kernels, the subgroup ones where available (with the prefill lanes
/// variant where the adapter takes it: CPU-like, subgroups of 8 or more), and (when
/// `small_grid`) the portable ones and the lanes variant (where the adapter takes it) on a
/// grid of at most 61 x 61 workgroups so the 2-D dispatch (and the skipping of surplus
/// workgroups) runs for all but the smallest cases.
fn kernel_sets(ctx: &GpuContext, small_grid: bool) -> Vec<Kernels> {
    let mut v = vec![Kernels::with_options(ctx, false).unwrap()];
    if ctx.has_subgroups() {
        v.push(Kernels::with_options(ctx, true).unwrap());
    }
    if small_grid {
        let mut k = Kernels::with_options(ctx, false).unwrap();
        k.max_groups_per_dim = 61;
        v.push(k);
        // Only a set that chooses the lanes variant compiles it.
        if ctx.has_subgroups() {
            let mut k = Kernels::with_options(ctx, true).unwrap();
            if k.attention_lanes {
                k.max_groups_per_dim = 61;
                v.push(k);
            }
        }
    }
    v
}

fn poisoned(v: &[f32]) -> Vec<f32> {
    let mut p = v.to_vec();
    p.extend([f32::NAN; GUARD]);
    p
}

fn prepare_all(ctx: &GpuContext, k: &Kernels, launches: Vec<Launch<'_>>) -> Vec<Dispatch> {
    launches
        .into_iter()
        .map(|l| k.prepare(ctx, l).unwrap())
        .collect()
}

/// Per-element error bound for `out` (`[n_q, n_head, hd]`), from f32 precision and the
/// reduction lengths (first order, doubled for safety):
/// - key j's score s_j = scale q.k_j is a D-term f32 dot product plus the scale product:
///   |ds_j| <= (D + 2) u scale sum_i |q_i k_ji|;
/// - its weight exp(s_j - m_c) exp(m_c - M) (split) or exp(s_j - m) times the online
///   rescalings (prefill, which scale numerator and denominator alike) is off by a relative
///   (6 + 2 (M - s_j)) u from WGSL's exp accuracy of 3 + 2|x| ulp, plus a few roundings;
/// - a relative weight error e_j moves out_d by <= sum_j p_j e_j (|v_jd| + |out_d|);
/// - summing the weighted values and the weights over n_keys terms in f32 (any order and
///   blocking, with rescales) costs <= (n_keys + 8) u sum_j p_j (|v_jd| + |out_d|).
#[allow(clippy::too_many_arguments)]
fn tolerance(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    want: &[f32],
    n_q: usize,
    cfg: &AttentionConfig,
    pos0: usize,
) -> Vec<f64> {
    let (nh, nkv, hd) = (cfg.n_head, cfg.n_head_kv, cfg.head_dim);
    let scale = f64::from(cfg.scale);
    let mut tol = vec![0.0; want.len()];
    for t in 0..n_q {
        let n_keys = pos0 + t + 1;
        // Keys first..n_keys (a sliding window's last ones).
        let first = cfg.window.map_or(0, |w| n_keys.saturating_sub(w));
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let qv = &q[(t * nh + h) * hd..][..hd];
            let mut s = vec![0.0f64; n_keys];
            let mut mag = vec![0.0f64; n_keys];
            for j in first..n_keys {
                let kv = &k[(j * nkv + kvh) * hd..][..hd];
                for (&a, &b) in qv.iter().zip(kv) {
                    s[j] += f64::from(a) * f64::from(b) * scale;
                    mag[j] += (f64::from(a) * f64::from(b) * scale).abs();
                }
            }
            // gemma2's soft-cap: c tanh(s / c) has slope <= 1, so a score's error does not
            // grow; tanh itself may be off by a few ulp of c.
            let cap_err = cfg.softcap.map_or(0.0, |c| 16.0 * U * f64::from(c));
            if let Some(c) = cfg.softcap.map(f64::from) {
                s.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
            }
            let m = s[first..].iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s[first..].iter().map(|&x| (x - m).exp()).sum();
            // (p_j, relative error of key j's weight)
            let pe: Vec<(f64, f64)> = (0..n_keys)
                .map(|j| {
                    if j < first {
                        return (0.0, 0.0);
                    }
                    let e = (hd as f64 + 2.0) * U * mag[j] + (6.0 + 2.0 * (m - s[j])) * U + cap_err;
                    ((s[j] - m).exp() / z, e)
                })
                .collect();
            let o = (t * nh + h) * hd;
            for d in 0..hd {
                let out_d = f64::from(want[o + d]).abs();
                let (mut t1, mut t2) = (0.0, 0.0);
                for (j, &(p, e)) in pe.iter().enumerate() {
                    let w = p * (f64::from(v[(j * nkv + kvh) * hd + d]).abs() + out_d);
                    t1 += w * e;
                    t2 += w;
                }
                tol[o + d] = 2.0 * (t1 + (n_keys as f64 + 8.0) * U * t2) + 1e-30;
            }
        }
    }
    tol
}

/// One attention problem: the cache holds `pos0` earlier rows; `n` new tokens are stored
/// with kv_store and attended in the same compute pass.
struct Case {
    cfg: AttentionConfig,
    n: usize,
    pos0: usize,
    q: Vec<f32>,
    /// [pos0 + n, n_head_kv, hd]: the earlier rows then the new ones
    k: Vec<f32>,
    v: Vec<f32>,
    want: Vec<f32>,
    tol: Vec<f64>,
}

impl Case {
    fn new(n_head: usize, n_head_kv: usize, hd: usize, n: usize, pos0: usize) -> Case {
        Case::windowed(n_head, n_head_kv, hd, n, pos0, None)
    }

    /// As [`Case::new`], each query seeing only its last `window` positions.
    fn windowed(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        n: usize,
        pos0: usize,
        window: Option<usize>,
    ) -> Case {
        Case::capped(n_head, n_head_kv, hd, n, pos0, window, None)
    }

    /// As [`Case::windowed`], the scores soft-capped at `softcap` (gemma2).
    fn capped(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        n: usize,
        pos0: usize,
        window: Option<usize>,
        softcap: Option<f32>,
    ) -> Case {
        // Rows past the last position stay NaN: the kernels must never read them.
        let n_ctx = pos0 + n + 7;
        let cfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            n_ctx,
            kv: KvTypes::F32,
            window,
            softcap,
        };
        let mut rng = Rng(0xa77e ^ ((n_head * 131 + hd) * 7919 + n * 31 + pos0) as u64);
        let row = n_head_kv * hd;
        let q = rng.values(n * n_head * hd, 1.0);
        let k = rng.values((pos0 + n) * row, 1.0);
        let v = rng.values((pos0 + n) * row, 1.0);
        let mut want = vec![0.0; q.len()];
        kernels_ref::attention(
            &q,
            &k,
            &v,
            n,
            pos0 + n,
            n_head,
            n_head_kv,
            hd,
            pos0,
            kernels_ref::AttnScores::new(cfg.scale)
                .window(window)
                .softcap(softcap),
            &mut want,
        );
        let tol = tolerance(&q, &k, &v, &want, n, &cfg, pos0);
        Case {
            cfg,
            n,
            pos0,
            q,
            k,
            v,
            want,
            tol,
        }
    }

    /// Runs kv_store + attention on `path` in one compute pass and checks the output and the
    /// caches; returns the worst error / tolerance ratio.
    fn check(&self, ctx: &GpuContext, ks: &Kernels, path: AttentionPath) -> f64 {
        let (cfg, n, pos0) = (&self.cfg, self.n, self.pos0);
        let row = cfg.n_head_kv * cfg.head_dim;
        let what = format!(
            "heads {}/{} hd {} n {n} pos0 {pos0} window {:?} softcap {:?} {path:?} subgroup={} \
             max_groups={}",
            cfg.n_head,
            cfg.n_head_kv,
            cfg.head_dim,
            cfg.window,
            cfg.softcap,
            ks.subgroup,
            ks.max_groups_per_dim
        );
        // The cache: earlier rows filled, the rest NaN.
        let cache_init = |src: &[f32]| {
            let mut c = vec![f32::NAN; cfg.n_ctx * row];
            c[..pos0 * row].copy_from_slice(&src[..pos0 * row]);
            c
        };
        let k_cache = upload_f32(ctx, "k_cache", &cache_init(&self.k)).unwrap();
        let v_cache = upload_f32(ctx, "v_cache", &cache_init(&self.v)).unwrap();
        let k_new = upload_f32(ctx, "k", &self.k[pos0 * row..]).unwrap();
        let v_new = upload_f32(ctx, "v", &self.v[pos0 * row..]).unwrap();
        let q = upload_f32(ctx, "q", &self.q).unwrap();
        let out = upload_f32(ctx, "out", &poisoned(&vec![f32::NAN; self.q.len()])).unwrap();
        let scratch_len = split_scratch_len(cfg, n, ATTENTION_CHUNK as usize);
        let scratch = upload_f32(ctx, "scratch", &vec![f32::NAN; scratch_len]).unwrap();

        let mut launches = ks
            .kv_store_launch(&k_new, &v_new, &k_cache, &v_cache, cfg, n, pos0)
            .unwrap();
        launches.extend(
            ks.attention_launches_with(path, &q, &k_cache, &v_cache, &scratch, &out, cfg, n, pos0)
                .unwrap(),
        );
        let ds = prepare_all(ctx, ks, launches);
        kernels::run(ctx, &ds.iter().collect::<Vec<_>>()).unwrap();

        // The caches: the earlier rows and the new ones exact, the rows after still NaN.
        for (name, buf, src) in [("k", &k_cache, &self.k), ("v", &v_cache, &self.v)] {
            let got = kernels::read_f32(ctx, buf, cfg.n_ctx * row).unwrap();
            let end = (pos0 + n) * row;
            for (i, (g, w)) in got[..end].iter().zip(&src[..end]).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{what}: {name}_cache[{i}]");
            }
            assert!(
                got[end..].iter().all(|x| x.is_nan()),
                "{what}: kv_store wrote {name}_cache rows past pos0 + n"
            );
        }

        let got = kernels::read_f32(ctx, &out, self.q.len() + GUARD).unwrap();
        assert!(
            got[self.q.len()..].iter().all(|x| x.is_nan()),
            "{what}: wrote past the end of out"
        );
        let (mut at, mut ratio) = (0, 0f64);
        for (i, (&g, &w)) in got.iter().zip(&self.want).enumerate() {
            let err = (f64::from(g) - f64::from(w)).abs();
            let r = if err.is_nan() {
                f64::INFINITY
            } else {
                err / self.tol[i]
            };
            if r > ratio {
                (at, ratio) = (i, r);
            }
        }
        let hd = cfg.head_dim;
        assert!(
            ratio <= 1.0,
            "{what}: out[{at}] (token {}, head {}, dim {}) = {}, want {} (tol {:e}, ratio {ratio})",
            at / (cfg.n_head * hd),
            at / hd % cfg.n_head,
            at % hd,
            got[at],
            self.want[at],
            self.tol[at]
        );
        ratio
    }
}

/// (n_head, n_head_kv, head_dim): the test model's GQA, MHA, and 128-dim heads.
const SHAPES: [(usize, usize, usize); 3] = [(9, 3, 64), (4, 4, 64), (4, 2, 128)];

#[test]
fn kv_store_and_attention_match_kernels_ref() {
    let ctx = context();
    // (n_tokens, pos0): decode and prefill, at the start, after a short context, over several
    // chunks (1000 + n is not a multiple of the chunk or the tile), and at chunk boundaries.
    let mut cases = Vec::new();
    for n in [1usize, 3, 17, 64] {
        for pos0 in [0usize, 37, 1000] {
            cases.push((n, pos0));
        }
    }
    let c = ATTENTION_CHUNK as usize;
    // 70 tokens: a full workgroup of queries and a partial one (the prefill lanes variant).
    cases.extend([(1, c - 1), (1, c), (2, c - 1), (5, 2 * c - 3), (70, 5)]);
    let mut worst = 0f64;
    for (si, &(nh, nkv, hd)) in SHAPES.iter().enumerate() {
        let sets = kernel_sets(&ctx, si == 0);
        for &(n, pos0) in &cases {
            let case = Case::new(nh, nkv, hd, n, pos0);
            for ks in &sets {
                for path in [AttentionPath::Split, AttentionPath::Prefill] {
                    worst = worst.max(case.check(&ctx, ks, path));
                }
            }
        }
    }
    eprintln!("worst error / tolerance: {worst:.3e}");
}

/// Each case on the split, prefill and tiled prefill paths with every kernel set.
fn check_every_path(ctx: &GpuContext, cases: &[Case]) {
    let sets = kernel_sets(ctx, true);
    for case in cases {
        for ks in &sets {
            for path in [
                AttentionPath::Split,
                AttentionPath::Prefill,
                AttentionPath::PrefillTiled,
            ] {
                case.check(ctx, ks, path);
            }
        }
    }
}

#[test]
fn sliding_windows_match_kernels_ref() {
    // Windows shorter than the context on every path: inside one split chunk, across chunk
    // boundaries (whole chunks before the window are skipped), a window of one key, one as
    // long as the context (no effect), prefill tiles whose queries start their windows at
    // different keys, and gemma3's 256-dim heads with one KV head.
    let ctx = context();
    let c = ATTENTION_CHUNK as usize;
    let mut cases = Vec::new();
    for &(nh, nkv, hd) in &[(9usize, 3usize, 64usize), (4, 1, 256)] {
        for (n, pos0, w) in [
            (1usize, 37usize, 5usize),
            (3, 1000, 300),
            (1, c, c),
            (2, 2 * c + 3, c + 1),
            (4, 10, 1),
            (17, 37, 60),
            (64, 1000, 20),
            (70, 5, 33),
            (19, 300, 512),
        ] {
            cases.push(Case::windowed(nh, nkv, hd, n, pos0, Some(w)));
        }
    }
    check_every_path(&ctx, &cases);
}

#[test]
fn long_head_dims_and_odd_shapes_match() {
    // head_dim 256 (the largest), 4 (the smallest), 80 and 192 (not powers of two; 192 gives
    // a prefill tile of 10 queries), one kv head for many heads.
    let ctx = context();
    let sets = kernel_sets(&ctx, false);
    for (nh, nkv, hd, n, pos0) in [
        (2usize, 1usize, 256usize, 19usize, 300usize),
        (3, 3, 4, 21, 5),
        (5, 1, 80, 18, 260),
        (2, 2, 192, 23, 11),
    ] {
        let case = Case::new(nh, nkv, hd, n, pos0);
        for ks in &sets {
            for path in [AttentionPath::Split, AttentionPath::Prefill] {
                case.check(&ctx, ks, path);
            }
        }
    }
}

#[test]
fn attention_launches_picks_the_path_by_token_count() {
    let ctx = context();
    let ks = Kernels::new(&ctx).unwrap();
    let case = Case::new(9, 3, 64, 1, 0);
    let c = ATTENTION_CHUNK as usize;
    let cfg = AttentionConfig {
        n_ctx: c + 64,
        ..case.cfg
    };
    let buf = upload_f32(&ctx, "b", &vec![0.0; (c + 64) * 9 * 64]).unwrap();
    let scratch = upload_f32(&ctx, "s", &vec![0.0; split_scratch_len(&cfg, 64, c)]).unwrap();
    let keys = |n: usize, pos0: usize| -> Vec<String> {
        ks.attention_launches(&buf, &buf, &buf, &scratch, &buf, &cfg, n, pos0)
            .unwrap()
            .iter()
            .map(|l| l.key.label())
            .collect()
    };
    let sg = if ks.subgroup { "_sg" } else { "" };
    // One chunk holds the context: the split pass writes the output, no combine.
    let split = vec![format!("attention_split{sg}")];
    let split_combine = vec![
        format!("attention_split{sg}"),
        format!("attention_combine{sg}"),
    ];
    assert_eq!(keys(1, 0), split);
    assert_eq!(keys(SPLIT_MAX_TOKENS, c - SPLIT_MAX_TOKENS), split);
    assert_eq!(keys(1, c), split_combine);
    assert_eq!(keys(SPLIT_MAX_TOKENS, c - 1), split_combine);
    // CPU-like adapters with subgroups of 8 or more take the lanes variant for 64-dim heads.
    let prefill = if ks.attention_lanes {
        "attention_prefill_lanes"
    } else {
        "attention_prefill"
    };
    assert_eq!(keys(SPLIT_MAX_TOKENS + 1, 0), vec![prefill]);
    assert_eq!(keys(64, c), vec![prefill]);
    // The tiled path is the tiled kernel whatever the set's layout.
    let tiled = ks
        .attention_launches_with(
            AttentionPath::PrefillTiled,
            &buf,
            &buf,
            &buf,
            &scratch,
            &buf,
            &cfg,
            64,
            c,
        )
        .unwrap();
    assert_eq!(tiled.len(), 1);
    assert_eq!(tiled[0].key.label(), "attention_prefill");
    assert!(keys(0, 0).is_empty());
    assert_eq!(
        KernelKey::AttentionPrefill { kv: KvTypes::F32 }.label(),
        "attention_prefill",
        "labels as above"
    );
}

#[test]
fn oversize_and_malformed_requests_are_errors() {
    let ctx = context();
    let ks = Kernels::new(&ctx).unwrap();
    let cfg = AttentionConfig {
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        scale: 0.125,
        n_ctx: 100,
        kv: KvTypes::F32,
        window: None,
        softcap: None,
    };
    let row = 3 * 64;
    let act = |n: usize| upload_f32(&ctx, "act", &vec![0.0; n * 9 * 64]).unwrap();
    let kv = |n: usize| upload_f32(&ctx, "kv", &vec![0.0; n * row]).unwrap();
    let (q, out, k_cache, v_cache) = (act(8), act(8), kv(100), kv(100));
    let scratch_ok = split_scratch_len(&cfg, 8, ATTENTION_CHUNK as usize);
    let scratch = upload_f32(&ctx, "scratch", &vec![0.0; scratch_ok]).unwrap();
    let small = upload_f32(&ctx, "small", &[0.0; 16]).unwrap();
    let attn = |path, q, kc, s, out, cfg: &AttentionConfig, n, pos0| {
        ks.attention_launches_with(path, q, kc, &v_cache, s, out, cfg, n, pos0)
            .map(|l| l.len())
    };
    let err_has = |r: memwall::Result<usize>, what: &str| match r {
        Err(memwall::Error::Gpu(m)) => assert!(m.contains(what), "{m:?} should name {what}"),
        other => panic!("want Error::Gpu naming {what}, got {other:?}"),
    };
    for path in [AttentionPath::Split, AttentionPath::Prefill] {
        // The baseline is fine: the errors below come from the one thing changed.
        assert!(attn(path, &q, &k_cache, &scratch, &out, &cfg, 8, 92).unwrap() >= 1);
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &cfg, 8, 93),
            "n_ctx",
        );
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &cfg, 1, 100),
            "n_ctx",
        );
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &cfg, 2, usize::MAX),
            "n_ctx",
        );
        err_has(attn(path, &q, &k_cache, &scratch, &out, &cfg, 9, 0), "q");
        err_has(
            attn(path, &q, &k_cache, &scratch, &small, &cfg, 1, 0),
            "out",
        );
        err_has(
            attn(path, &q, &small, &scratch, &out, &cfg, 1, 0),
            "k_cache",
        );
        let big_ctx = AttentionConfig { n_ctx: 101, ..cfg };
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &big_ctx, 1, 0),
            "k_cache",
        );
        for head_dim in [0, 6, 260, 512] {
            let bad = AttentionConfig { head_dim, ..cfg };
            err_has(
                attn(path, &q, &k_cache, &scratch, &out, &bad, 1, 0),
                "head_dim",
            );
        }
        let bad = AttentionConfig {
            n_head_kv: 2,
            ..cfg
        };
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &bad, 1, 0),
            "n_head_kv",
        );
        let bad = AttentionConfig {
            n_head_kv: 0,
            ..cfg
        };
        err_has(
            attn(path, &q, &k_cache, &scratch, &out, &bad, 1, 0),
            "n_head_kv",
        );
    }
    // Only the split path uses the scratch buffer.
    err_has(
        attn(AttentionPath::Split, &q, &k_cache, &small, &out, &cfg, 1, 0),
        "scratch",
    );
    assert!(attn(
        AttentionPath::Prefill,
        &q,
        &k_cache,
        &small,
        &out,
        &cfg,
        1,
        0
    )
    .is_ok());
    // kv_store: the same position and size checks.
    let store = |k, kc, n, pos0| {
        ks.kv_store_launch(k, k, kc, kc, &cfg, n, pos0)
            .map(|l| l.len())
    };
    let k8 = kv(8);
    // K and V of one type: one launch; of different types: one per cache.
    assert_eq!(store(&k8, &k_cache, 8, 92).unwrap(), 1);
    let mixed = AttentionConfig {
        kv: KvTypes {
            k: KvType::F32,
            v: KvType::F16,
        },
        ..cfg
    };
    assert_eq!(
        ks.kv_store_launch(&k8, &k8, &k_cache, &k_cache, &mixed, 8, 92)
            .unwrap()
            .len(),
        2
    );
    assert_eq!(store(&k8, &k_cache, 0, 100).unwrap(), 0);
    err_has(store(&k8, &k_cache, 8, 93), "n_ctx");
    err_has(store(&k8, &k_cache, 9, 0), "kv_store k");
    err_has(store(&k8, &small, 1, 0), "k_cache");
}

#[test]
fn soft_capped_scores_match_kernels_ref() {
    // gemma2's attention logit soft-cap on every path, with and without a window: caps low
    // enough to bend these scores (|s| reaches a few units), and one that saturates tanh.
    let ctx = context();
    let mut cases = Vec::new();
    for &(nh, nkv, hd) in &[(9usize, 3usize, 64usize), (4, 2, 256)] {
        for (n, pos0, w, cap) in [
            (1usize, 37usize, None, 0.5f32),
            (3, 300, Some(40usize), 1.0),
            (17, 37, None, 2.0),
            (64, 100, Some(20), 0.05),
            (70, 5, None, 50.0),
        ] {
            cases.push(Case::capped(nh, nkv, hd, n, pos0, w, Some(cap)));
        }
    }
    check_every_path(&ctx, &cases);
}
