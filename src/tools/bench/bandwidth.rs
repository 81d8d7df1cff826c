//! Memory bandwidth probes: the floor decode speed is compared against.
//!
//! - CPU: a STREAM-like triad `a[i] = b[i] + s * c[i]` over three f64 arrays, counted as
//!   STREAM counts it (24 bytes per element: two reads and one write; the write-allocate read
//!   of `a` that a cache without streaming stores also makes is not counted), and a read-only
//!   pass (a wrapping sum of the words of one array, 8 bytes per element), the access pattern of
//!   decoding (weights are only read). Both run on a rayon pool of the engine's thread count.
//! - GPU: `shaders/bandwidth.wgsl` reads one buffer and writes a partial sum per workgroup
//!   ([`crate::gpu::probe`]).
//!
//! Each figure is the best of several runs after one warm-up (as STREAM reports), with the
//! device synchronized before the clock stops.

use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gpu::{GpuContext, Kernels};

/// One device's measured bandwidth.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProbeResult {
    /// `cpu` or `gpu:<adapter name> (<backend>)`.
    pub device: String,
    /// Read-only bandwidth in GB/s (1e9 bytes/s): the figure decode is compared with.
    pub read_gbs: f64,
    /// CPU only: the STREAM triad in GB/s.
    pub triad_gbs: Option<f64>,
    /// Bytes one read pass moves.
    pub bytes: u64,
    /// Timed runs (the best is reported), after one warm-up.
    pub runs: usize,
    /// CPU threads (None on a GPU).
    pub threads: Option<usize>,
    /// How the time was taken.
    pub method: String,
}

/// Elements per parallel task.
const CHUNK: usize = 1 << 16;

/// Best seconds of `runs` calls of `f` after one warm-up call.
fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The CPU probe with arrays of `bytes_per_array` bytes each on `threads` threads.
/// Bytes per CPU probe array by default: four times the last-level cache and at least 256 MiB,
/// so the read streams from DRAM rather than cache (on a 480 MiB L3, 256 MiB reads at 32.6
/// GB/s where 4 GiB reads at 25.0); the triad's three arrays kept within a quarter of the
/// process's memory limit.
pub fn default_probe_bytes() -> u64 {
    let llc = crate::memory::limit::last_level_cache().unwrap_or(0);
    let want = (4 * llc).max(256 << 20);
    let cap = crate::memory::detect_limit().map_or(u64::MAX, |l| l.bytes / 12);
    want.min(cap).max(16 << 20)
}

pub fn cpu_probe(bytes_per_array: u64, threads: usize, runs: usize) -> Result<ProbeResult> {
    let n = (bytes_per_array / 8) as usize;
    if n < CHUNK || runs == 0 || threads == 0 {
        return Err(Error::InvalidArgument(format!(
            "CPU bandwidth probe of {bytes_per_array} bytes per array, {runs} runs, {threads} \
             threads (at least {} bytes, 1 run, 1 thread)",
            CHUNK * 8
        )));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("memwall-probe-{i}"))
        .build()
        .map_err(|e| Error::InvalidArgument(format!("cannot start probe threads: {e}")))?;
    let alloc = |what: &str| -> Result<Vec<f64>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
            what: format!("{what} of the bandwidth probe ({bytes_per_array} bytes)"),
        })?;
        Ok(v)
    };
    let (mut a, mut b, mut c) = (alloc("array a")?, alloc("array b")?, alloc("array c")?);
    // [n] f64 each, first touched by the threads that will use them (NUMA-friendly).
    pool.install(|| {
        a.par_extend((0..n).into_par_iter().map(|_| 0.0));
        b.par_extend((0..n).into_par_iter().map(|i| 1.0 + (i % 7) as f64));
        c.par_extend((0..n).into_par_iter().map(|i| 2.0 - (i % 5) as f64));
    });
    let s = 3.0f64;
    let triad = best_of(runs, || {
        pool.install(|| {
            a.par_chunks_mut(CHUNK)
                .zip(b.par_chunks(CHUNK))
                .zip(c.par_chunks(CHUNK))
                .for_each(|((a, b), c)| {
                    for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                        *a = b + s * c;
                    }
                });
        });
        std::hint::black_box(&mut a);
    });
    let read = best_of(runs, || {
        let sum = pool.install(|| {
            a.par_chunks(CHUNK)
                .map(|ch| {
                    // Four quarters read in lockstep: four streams in flight, as the triad
                    // has three (one stream per core leaves the prefetchers half idle).
                    let q = ch.len() / 4;
                    let (h0, h1) = ch.split_at(2 * q);
                    let ((q0, q1), (q2, q3)) = (h0.split_at(q), h1.split_at(q));
                    let mut acc = [0u64; 4];
                    for (((a, b), c), d) in q0.iter().zip(q1).zip(q2).zip(q3) {
                        acc[0] = acc[0].wrapping_add(a.to_bits());
                        acc[1] = acc[1].wrapping_add(b.to_bits());
                        acc[2] = acc[2].wrapping_add(c.to_bits());
                        acc[3] = acc[3].wrapping_add(d.to_bits());
                    }
                    // The last chunk's tail when its length is not a multiple of 4.
                    let tail = q3[q..]
                        .iter()
                        .fold(0u64, |s, x| s.wrapping_add(x.to_bits()));
                    acc.iter().fold(tail, |s, &x| s.wrapping_add(x))
                })
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
    });
    // The triad wrote b + s*c everywhere: a wrong loop would show here.
    if a.iter()
        .zip(&b)
        .zip(&c)
        .any(|((&a, &b), &c)| a != b + s * c)
    {
        return Err(Error::InvalidArgument(
            "CPU bandwidth probe computed a wrong triad".into(),
        ));
    }
    let bytes = n as u64 * 8;
    Ok(ProbeResult {
        device: "cpu".into(),
        read_gbs: bytes as f64 / read.max(1e-12) / 1e9,
        triad_gbs: Some(3.0 * bytes as f64 / triad.max(1e-12) / 1e9),
        bytes,
        runs,
        threads: Some(threads),
        method: "wall clock, best run".into(),
    })
}

/// Launches per timed submission of the GPU probe.
const GPU_LAUNCHES: usize = 8;

/// The GPU probe reading a buffer of `bytes` (capped by the adapter's binding limit).
pub fn gpu_probe(ctx: &GpuContext, ks: &Kernels, bytes: u64, runs: usize) -> Result<ProbeResult> {
    let p = crate::gpu::probe::read_bandwidth(ctx, ks, bytes, GPU_LAUNCHES, runs)?;
    Ok(ProbeResult {
        device: format!("gpu:{} ({})", ctx.info.name, ctx.info.backend),
        read_gbs: p.gbs,
        triad_gbs: None,
        bytes: p.bytes,
        runs,
        threads: None,
        method: format!("wall clock around {GPU_LAUNCHES} launches per submission, best run"),
    })
}
