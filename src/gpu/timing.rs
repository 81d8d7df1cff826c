//! GPU timestamps for the scheduler's measured passes.
//!
//! On an adapter with `TIMESTAMP_QUERY` the executor brackets each GPU stage of a measured pass
//! with two timestamps instead of synchronizing the host after it: the stage's time is then the
//! GPU's own execution time, without the submit-and-wait bubble a wall clock adds per stage.
//! A stamp is an empty compute pass whose beginning writes the timestamp (pass-level writes need
//! only `TIMESTAMP_QUERY`, not `TIMESTAMP_QUERY_INSIDE_ENCODERS`); the queue runs passes in
//! order, so it is written once the work recorded before it is done. The stamps of a pass are
//! resolved into a buffer and read back once, converted with `Queue::get_timestamp_period`.

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::recorder::Recorder;

/// The query set and its resolve buffer; a session makes one when the adapter has timestamps.
pub struct GpuTimer {
    set: wgpu::QuerySet,
    /// Resolved ticks: [cap] u64.
    resolved: wgpu::Buffer,
    cap: u32,
    /// Stamps recorded since the last read.
    used: u32,
    /// Nanoseconds per tick.
    period_ns: f64,
}

impl GpuTimer {
    /// A timer of `cap` stamps, or None when the adapter has no timestamp queries.
    pub fn new(ctx: &GpuContext, cap: u32) -> Result<Option<GpuTimer>> {
        if !ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY) || cap == 0 {
            return Ok(None);
        }
        let (set, resolved) = ctx.scoped("timestamp queries", || {
            let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("stage timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: cap,
            });
            let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("resolved timestamps"),
                size: cap as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            Ok((set, resolved))
        })?;
        Ok(Some(GpuTimer {
            set,
            resolved,
            cap,
            used: 0,
            period_ns: f64::from(ctx.queue.get_timestamp_period()),
        }))
    }

    /// GPU bytes of the resolve buffer.
    pub fn bytes(&self) -> u64 {
        self.resolved.size()
    }

    /// Records the next stamp; returns its index among the stamps since the last read.
    pub fn stamp(&mut self, rec: &mut Recorder) -> Result<u32> {
        if self.used >= self.cap {
            return Err(Error::Gpu(format!(
                "more than {} GPU timestamps in one measured pass",
                self.cap
            )));
        }
        let i = self.used;
        rec.stamp(&self.set, i);
        self.used += 1;
        Ok(i)
    }

    /// Records the resolution of the stamps so far; returns (buffer, bytes) to read back, and
    /// forgets them. None when no stamp was recorded.
    pub fn resolve(&mut self, rec: &mut Recorder) -> Option<(wgpu::Buffer, u64)> {
        let n = std::mem::take(&mut self.used);
        if n == 0 {
            return None;
        }
        rec.resolve(&self.set, n, &self.resolved);
        Some((self.resolved.clone(), n as u64 * 8))
    }

    /// Milliseconds of each stamp from raw resolved ticks (little-endian u64 each).
    pub fn to_ms(&self, raw: &[u8]) -> Vec<f64> {
        raw.chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b) as f64 * self.period_ns * 1e-6
            })
            .collect()
    }
}
