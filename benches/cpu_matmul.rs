//! CPU matmul throughput on SmolLM2-135M shapes: GB/s of weights for decode-shaped matvecs and
//! GFLOP/s for prefill-shaped (128-token) matmuls, per format, plus a whole-model decode pass
//! over the real GGUF's weights when it is available (MEMWALL_MODEL or the default cache path).
//!
//! `cargo bench --bench cpu_matmul` (release). Figures are medians over repetitions after a
//! warm-up. Weights of the synthetic shapes are sized past L2 by cycling through copies, so the
//! decode GB/s is a memory figure, not an L2 one.

use std::time::{Duration, Instant};

use memwall::cpu::{self, Isa, MatmulScratch, PackedWeight, WeightView};
use memwall::GgmlType;

#[path = "../tests/common/rng.rs"]
mod rng;
use rng::Rng;

/// Random blocks with a sane f16 value in every 2-byte slot that could be a scale: simplest is
/// to give every byte pair a small half value, which is valid for any format's scale fields.
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize * rows;
    let mut v = vec![0u8; bytes];
    for pair in v.chunks_exact_mut(2) {
        let h = half::f16::from_f32(0.01 + 0.01 * rng.unit());
        pair.copy_from_slice(&h.to_le_bytes());
    }
    v
}

/// The median, or with MEMWALL_BENCH_MIN=1 the minimum (a steadier A/B figure on a machine
/// shared with other jobs, where the median mixes in time spent descheduled).
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    if std::env::var("MEMWALL_BENCH_MIN").is_ok_and(|s| s == "1") {
        return v[0];
    }
    v[v.len() / 2]
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), with MEMWALL_BENCH_CPUTIME=1: on a
/// machine shared with other jobs, time spent descheduled does not count, so a single-threaded
/// (RAYON_NUM_THREADS=1) A/B comparison of two kernels is steady. None elsewhere.
#[cfg(target_os = "linux")]
fn cpu_time() -> Option<Duration> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    if !std::env::var("MEMWALL_BENCH_CPUTIME").is_ok_and(|s| s == "1") {
        return None;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two 64-bit fields on 64-bit Linux) to `ts`.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.sec as u64, ts.nsec as u32))
}

#[cfg(not(target_os = "linux"))]
fn cpu_time() -> Option<Duration> {
    None
}

/// Median time of `f` over `reps` runs after 2 warm-up runs.
fn time(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    f();
    median(
        (0..reps)
            .map(|_| {
                let (t, c) = (Instant::now(), cpu_time());
                f();
                match (c, cpu_time()) {
                    (Some(a), Some(b)) => b - a,
                    _ => t.elapsed(),
                }
            })
            .collect(),
    )
}

fn bench_shape(
    isa: Isa,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    rng: &mut Rng,
) -> (f64, f64) {
    let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let bytes = rows * rb;
    // Enough copies to exceed the 32 MiB L3, so each decode call reads from memory.
    let copies = if n == 1 { (96 << 20) / bytes + 1 } else { 1 };
    let data: Vec<Vec<u8>> = (0..copies.min(64))
        .map(|_| weights(rng, ty, rows, cols))
        .collect();
    // Packed at load as the engine packs them (None where the ISA has no packed layout).
    let packed: Vec<Option<PackedWeight>> = data
        .iter()
        .map(|d| {
            let w = WeightView::new(ty, d, rows, cols).expect("view");
            PackedWeight::pack(isa, &w).expect("pack")
        })
        .collect();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit() - 0.5).collect();
    let mut y = vec![0f32; n * rows];
    let mut s = MatmulScratch::default();
    let mut i = 0;
    let reps = if n == 1 { 200 } else { 10 };
    let t = time(reps, || {
        let k = i % data.len();
        let mut w = WeightView::new(ty, &data[k], rows, cols).expect("view");
        if let Some(p) = &packed[k] {
            w = w.with_packed(p).expect("packed view");
        }
        i += 1;
        cpu::matmul_with(isa, &w, &x, n, &mut y, &mut s).expect("matmul");
    });
    let secs = t.as_secs_f64();
    (
        bytes as f64 / secs / 1e9,
        2.0 * (rows * cols * n) as f64 / secs / 1e9,
    )
}

fn synthetic(isa: Isa) {
    // (rows, cols): SmolLM2-135M's ffn_up/gate, ffn_down, attn_q/o, output (tied embedding);
    // Qwen2.5-1.5B's ffn_up/gate and ffn_down (widths the K-quants' 256-blocks divide).
    let shapes = [
        (1536usize, 576usize),
        (576, 1536),
        (576, 576),
        (49152, 576),
        (8960, 1536),
        (1536, 8960),
    ];
    let formats = [
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_NL,
        GgmlType::F16,
        GgmlType::F32,
    ];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    println!("{isa:?}, {} threads", rayon::current_num_threads());
    println!(
        "{:<7} {:>13} {:>14} {:>16}",
        "format", "rows x cols", "decode GB/s", "prefill GFLOP/s"
    );
    // MEMWALL_BENCH_FORMATS=Q4_1,Q8_0 limits the table to those formats.
    let only = std::env::var("MEMWALL_BENCH_FORMATS").ok();
    for ty in formats {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|f| f.eq_ignore_ascii_case(ty.name())))
        {
            continue;
        }
        if isa == Isa::Scalar && ty != GgmlType::Q4_1 && ty != GgmlType::Q8_0 {
            continue;
        }
        for &(rows, cols) in &shapes {
            if ty.row_bytes(cols as u64).is_none() || (rows == 49152 && ty != GgmlType::Q8_0) {
                continue;
            }
            let (gbs, _) = bench_shape(isa, ty, rows, cols, 1, &mut rng);
            let (_, gflops) = bench_shape(isa, ty, rows, cols, 128, &mut rng);
            println!(
                "{:<7} {:>6}x{:<6} {gbs:>14.2} {gflops:>16.1}",
                ty.name(),
                rows,
                cols
            );
        }
    }
}

/// One decode token's and one 128-token prefill's matmuls over every 2-D weight of the real
/// model (the token embedding stands in for the tied output projection).
fn real_model() {
    let path = std::env::var("MEMWALL_MODEL").unwrap_or_else(|_| {
        format!(
            "{}/.cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let g = match memwall::gguf::Gguf::open(&path) {
        Ok(g) => g,
        Err(e) => {
            println!("real model: skipped ({e})");
            return;
        }
    };
    let mats: Vec<WeightView> = g
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && t.dims[1] > 1)
        .map(|t| {
            WeightView::new(
                t.ty,
                g.tensor_data(t),
                t.dims[1] as usize,
                t.dims[0] as usize,
            )
            .expect("view")
        })
        .collect();
    let bytes: usize = mats.iter().map(|w| w.data.len()).sum();
    let flops: usize = mats.iter().map(|w| 2 * w.rows * w.cols).sum();
    let max_cols = mats.iter().map(|w| w.cols).max().unwrap_or(0);
    let max_rows = mats.iter().map(|w| w.rows).max().unwrap_or(0);
    // The same matrices packed once as `Model::load` packs them (none where the ISA has no
    // packed layout): timed beside the per-call path.
    let packed: Vec<Option<PackedWeight>> = mats
        .iter()
        .map(|w| PackedWeight::pack(Isa::best(), w).expect("pack"))
        .collect();
    let with_packed: Vec<WeightView> = mats
        .iter()
        .zip(&packed)
        .map(|(w, p)| p.as_ref().map_or(*w, |p| w.with_packed(p).expect("packed")))
        .collect();
    let mut s = MatmulScratch::default();
    for (n, what, mats) in [
        (1usize, "per call", &mats),
        (1, "packed", &with_packed),
        (128, "per call", &mats),
        (128, "packed", &with_packed),
    ] {
        let x: Vec<f32> = (0..n * max_cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mut y = vec![0f32; n * max_rows];
        let t = time(if n == 1 { 20 } else { 3 }, || {
            for w in mats.iter() {
                let (xs, ys) = (&x[..n * w.cols], &mut y[..n * w.rows]);
                cpu::matmul(w, xs, n, ys, &mut s).expect("matmul");
            }
        });
        let secs = t.as_secs_f64();
        println!(
            "real model ({what}), {} matrices, {:.1} MB, n_tokens {n}: {:.2} ms -> {:.1} tok/s of matmuls, {:.2} GB/s, {:.1} GFLOP/s",
            mats.len(),
            bytes as f64 / 1e6,
            secs * 1e3,
            n as f64 / secs,
            bytes as f64 / secs / 1e9,
            (flops * n) as f64 / secs / 1e9
        );
    }
}

fn main() {
    if std::env::var("MEMWALL_BENCH_FORMATS").is_err() {
        real_model();
    }
    if std::env::args().any(|a| a == "--real") {
        return;
    }
    synthetic(Isa::best());
    // --avx2: the AVX2 (and AVX-VNNI) kernels too when the best is newer, to compare them.
    if Isa::best() == Isa::Avx512Vnni && std::env::args().any(|a| a == "--vnni") {
        synthetic(Isa::AvxVnni);
    }
    if Isa::best() != Isa::Avx2 && std::env::args().any(|a| a == "--avx2") {
        synthetic(Isa::Avx2);
    }
    if std::env::args().any(|a| a == "--scalar") {
        synthetic(Isa::Scalar);
    }
}
