//! How `memwall bench-kernels` times a call (one call = a variant's launches in order): through
//! the engine's own [`Recorder`] and, where the adapter has `TIMESTAMP_QUERY`, its
//! [`GpuTimer`] (the same stamps the scheduler's measured passes use, `src/gpu/timing.rs`).
//!
//! A warm-up sizes the batch: `k` calls per submission so that one lasts about
//! [`TARGET_SUBMIT_S`]. Each repetition then records a stamp, the `k` calls, a stamp, submits
//! and waits. With timestamps the repetition's time is the GPU's own time between the stamps
//! (no submit/wait overhead); without them, or when the stamps read back non-increasing (a
//! driver that does not advance its clock), it is the wall clock around the submission and
//! the wait. The median repetition divided by `k` is the time per call.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, Kernels, Launch};
use crate::gpu::recorder::Recorder;
use crate::gpu::timing::GpuTimer;

/// Wall time one timed submission aims at (the calls per submission are chosen for it).
pub const TARGET_SUBMIT_S: f64 = 0.02;
/// Most calls in one submission (2 launches each at most: well within the recorder's ring).
const MAX_CALLS: usize = 64;

/// The `timing` value of a result timed by GPU timestamps.
pub const GPU_TIMESTAMPS: &str = "gpu-timestamps";
/// The `timing` value of a result timed by the host's wall clock.
pub const WALL_CLOCK: &str = "wall-clock";

/// A call's median time and how it was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Median seconds per call.
    pub secs: f64,
    /// Calls per timed submission.
    pub calls: usize,
    /// [`GPU_TIMESTAMPS`] when every repetition was timed by the stamps, else [`WALL_CLOCK`].
    pub timing: &'static str,
}

/// The timing source of an adapter: timestamps where it has them, unless `wall_clock` forces
/// the fallback.
pub fn source(ctx: &GpuContext, wall_clock: bool) -> &'static str {
    if !wall_clock && ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY) {
        GPU_TIMESTAMPS
    } else {
        WALL_CLOCK
    }
}

/// Records `calls` x `launches` into `rec`.
fn record(
    ctx: &GpuContext,
    ks: &Kernels,
    rec: &mut Recorder,
    launches: &[Launch<'_>],
    calls: usize,
) -> Result<()> {
    for _ in 0..calls {
        for l in launches {
            let copy = Launch {
                key: l.key,
                params: l.params.clone(),
                buffers: l.buffers.clone(),
                uniform_binding: l.uniform_binding,
                groups: l.groups,
            };
            rec.record(ctx, ks, copy)?;
        }
    }
    Ok(())
}

/// Submits what `rec` holds and waits for the device.
fn submit_wait(ctx: &GpuContext, rec: &mut Recorder) -> Result<()> {
    rec.flush(ctx)?;
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| ctx.lost_or("bench-kernels", Error::Gpu(format!("wait for GPU: {e}"))))?;
    ctx.check_uncaptured("bench-kernels")
}

/// Times one call of `launches` (see the module docs): `reps` repetitions, median;
/// `wall_clock` forces the host clock even where the adapter has timestamps.
pub fn time_calls(
    ctx: &GpuContext,
    ks: &Kernels,
    launches: &[Launch<'_>],
    reps: usize,
    wall_clock: bool,
) -> Result<Timed> {
    let mut rec = Recorder::new(ctx)?;
    let mut timer = if source(ctx, wall_clock) == GPU_TIMESTAMPS {
        GpuTimer::new(ctx, 2)?
    } else {
        None
    };
    // Warm-up: the first call creates the bind groups, the second sizes the batch.
    record(ctx, ks, &mut rec, launches, 1)?;
    submit_wait(ctx, &mut rec)?;
    let t = Instant::now();
    record(ctx, ks, &mut rec, launches, 1)?;
    submit_wait(ctx, &mut rec)?;
    let once = t.elapsed().as_secs_f64();
    let calls = ((TARGET_SUBMIT_S / once.max(1e-9)).ceil() as usize).clamp(1, MAX_CALLS);
    // Per repetition: (GPU seconds, if stamped; wall seconds).
    let mut v = Vec::with_capacity(reps);
    let mut all_stamped = timer.is_some();
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        if let Some(timer) = timer.as_mut() {
            timer.stamp(&mut rec)?;
        }
        record(ctx, ks, &mut rec, launches, calls)?;
        let stamps = match timer.as_mut() {
            Some(timer) => {
                timer.stamp(&mut rec)?;
                timer.resolve(&mut rec)
            }
            None => None,
        };
        submit_wait(ctx, &mut rec)?;
        let wall = t.elapsed().as_secs_f64();
        // [2] u64 ticks: before and after the calls (read_f32 copies the bits unchanged).
        let gpu = match (stamps, timer.as_ref()) {
            (Some((buf, bytes)), Some(timer)) => {
                let words = kernels::read_f32(ctx, &buf, (bytes / 4) as usize)?;
                let ms = timer.to_ms(bytemuck::cast_slice(&words));
                match ms[..] {
                    [a, b] if b > a => Some((b - a) * 1e-3),
                    _ => None,
                }
            }
            _ => None,
        };
        all_stamped &= gpu.is_some();
        v.push((gpu, wall));
    }
    // One clock for every repetition: the stamps only if all of them read back increasing.
    let mut secs: Vec<f64> = v
        .iter()
        .map(|&(gpu, wall)| match gpu {
            Some(g) if all_stamped => g / calls as f64,
            _ => wall / calls as f64,
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    Ok(Timed {
        secs: secs[secs.len() / 2],
        calls,
        timing: if all_stamped {
            GPU_TIMESTAMPS
        } else {
            WALL_CLOCK
        },
    })
}
