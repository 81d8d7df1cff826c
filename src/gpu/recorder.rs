//! Records kernel launches into one command buffer per step, creating nothing in steady state.
//!
//! Each launch's uniform parameters go into the next 256-byte slot of a uniform ring buffer that
//! is written once per submission, and its bind group (pipeline + storage buffers + the ring at a
//! dynamic offset) comes from a cache keyed by the kernel and the buffers. The first token of a
//! session fills the cache; every later token only encodes: no buffer, bind group or pipeline is
//! created in the token loop.

use std::collections::HashMap;
use std::num::NonZeroU64;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{Kernels, Launch, Pipeline, PARAMS_SLOT};
use crate::gpu::registry::KernelKey;

/// Launches one submission can hold (a decode step of a 30-layer model needs ~500).
const RING_SLOTS: usize = 2048;

enum Op {
    Dispatch {
        pipeline: wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        offset: u32,
        groups: (u32, u32),
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    },
    /// A GPU timestamp written into `set[index]` when the work recorded before it is done
    /// (an empty compute pass whose beginning writes it: only TIMESTAMP_QUERY needed).
    Stamp { set: wgpu::QuerySet, index: u32 },
    /// Resolves `set[0..count]` into `dst` (u64 ticks each).
    Resolve {
        set: wgpu::QuerySet,
        count: u32,
        dst: wgpu::Buffer,
    },
}

type BindKey = (KernelKey, Vec<(u32, wgpu::Buffer)>);

pub struct Recorder {
    /// [RING_SLOTS, PARAMS_SLOT] bytes of uniform params.
    ring: wgpu::Buffer,
    /// Host copy of the slots used so far in this submission.
    params: Vec<u8>,
    ops: Vec<Op>,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Launches recorded and submissions made, for tests and profiling.
    pub n_launches: u64,
    pub n_submits: u64,
    /// Per-kernel (launches, seconds) when profiling (`MEMWALL_GPU_PROFILE=1`): every launch
    /// is then submitted and waited for alone, so the figures are wall-clock per kernel
    /// (slower overall, but it works on adapters without timestamp queries).
    pub profile: Option<HashMap<String, (u64, f64)>>,
}

/// The profile's entry for [`Recorder::empty_round_trip`].
const ROUND_TRIP: &str = "(empty submit + wait)";

impl Recorder {
    /// Bytes of the uniform ring.
    pub fn ring_bytes(&self) -> u64 {
        self.ring.size()
    }

    pub fn new(ctx: &GpuContext) -> Result<Recorder> {
        let ring = ctx.scoped("uniform ring", || {
            Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params ring"),
                size: RING_SLOTS as u64 * PARAMS_SLOT,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }))
        })?;
        Ok(Recorder {
            ring,
            params: Vec::with_capacity(RING_SLOTS * PARAMS_SLOT as usize),
            ops: Vec::new(),
            bind_groups: HashMap::new(),
            n_launches: 0,
            n_submits: 0,
            profile: std::env::var("MEMWALL_GPU_PROFILE")
                .is_ok_and(|v| v == "1")
                .then(HashMap::new),
        })
    }

    /// Bind groups created so far (constant once every op has run once).
    pub fn n_bind_groups(&self) -> usize {
        self.bind_groups.len()
    }

    /// Appends `launch` to the current submission.
    pub fn record(
        &mut self,
        ctx: &GpuContext,
        kernels: &Kernels,
        launch: Launch<'_>,
    ) -> Result<()> {
        if launch.params.len() as u64 > PARAMS_SLOT {
            return Err(Error::Gpu(format!(
                "{}: params of {} bytes exceed a slot",
                launch.key.label(),
                launch.params.len()
            )));
        }
        if self.params.len() >= RING_SLOTS * PARAMS_SLOT as usize {
            self.flush(ctx)?;
        }
        let Pipeline { pipeline, layout } = kernels.pipeline(ctx, launch.key)?;
        let key: BindKey = (
            launch.key,
            launch
                .buffers
                .iter()
                .map(|&(b, buf)| (b, buf.clone()))
                .collect(),
        );
        let bind_group = match self.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let mut entries: Vec<wgpu::BindGroupEntry<'_>> = launch
                    .buffers
                    .iter()
                    .map(|&(binding, b)| wgpu::BindGroupEntry {
                        binding,
                        resource: b.as_entire_binding(),
                    })
                    .collect();
                entries.push(wgpu::BindGroupEntry {
                    binding: launch.uniform_binding,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.ring,
                        offset: 0,
                        size: NonZeroU64::new(PARAMS_SLOT),
                    }),
                });
                let label = launch.key.label();
                let bg = ctx.scoped(&format!("bind group {label}"), || {
                    Ok(ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(&label),
                        layout: &layout,
                        entries: &entries,
                    }))
                })?;
                self.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        let offset = self.params.len();
        self.params.extend_from_slice(&launch.params);
        self.params.resize(offset + PARAMS_SLOT as usize, 0);
        self.ops.push(Op::Dispatch {
            pipeline: pipeline.clone(),
            bind_group,
            offset: offset as u32,
            groups: launch.groups,
        });
        self.n_launches += 1;
        if self.profile.is_some() {
            let t = std::time::Instant::now();
            self.flush(ctx)?;
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("wait for the GPU: {e}")))?;
            let dt = t.elapsed().as_secs_f64();
            let base = self.empty_round_trip(ctx)?;
            if let Some(p) = self.profile.as_mut() {
                for (key, dt) in [(launch.key.label(), dt), (ROUND_TRIP.into(), base)] {
                    let e = p.entry(key).or_insert((0, 0.0));
                    e.0 += 1;
                    e.1 += dt;
                }
            }
        }
        Ok(())
    }

    /// Seconds to write one parameter slot, submit an empty pass and wait: what every profiled
    /// launch pays on top of its kernel (on lavapipe ~0.2 ms, about as much as a small
    /// kernel's whole figure; a normal pass submits hundreds of launches at once, where a
    /// launch costs ~0.02-0.05 ms: `cargo bench --bench gpu_launch`). Sampled after each
    /// profiled launch, under the same load, so the report can subtract it.
    fn empty_round_trip(&mut self, ctx: &GpuContext) -> Result<f64> {
        let t = std::time::Instant::now();
        ctx.scoped("profile round trip", || {
            // The ring is free: the launch just profiled has completed.
            ctx.queue
                .write_buffer(&self.ring, 0, &[0u8; PARAMS_SLOT as usize]);
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("profile round trip"),
                });
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default()));
            ctx.queue.submit([enc.finish()]);
            Ok(())
        })?;
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("wait for the GPU: {e}")))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// The profile as lines `kernel launches total_ms ms_per_launch`, slowest first.
    pub fn profile_report(&self) -> Option<String> {
        let p = self.profile.as_ref()?;
        let mut v: Vec<_> = p.iter().collect();
        v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        // Mean empty submit + wait, measured beside every launch (not part of the total).
        let base = p
            .get(ROUND_TRIP)
            .map_or(0.0, |(n, t)| t / (*n).max(1) as f64);
        v.retain(|e| e.0 != ROUND_TRIP);
        let total: f64 = v.iter().map(|e| e.1 .1).sum();
        let launches: u64 = v.iter().map(|e| e.1 .0).sum();
        let mut s = format!(
            "GPU profile: {:.1} ms in all, each launch submitted and waited for alone; \
             an empty submit + wait takes {:.3} ms (net: minus that, {:.1} ms in all)\n",
            total * 1e3,
            base * 1e3,
            (total - base * launches as f64) * 1e3
        );
        for (k, (n, t)) in v {
            s += &format!(
                "{k:28} {n:7} launches {:10.1} ms {:8.3} ms each {:8.3} net\n",
                t * 1e3,
                t * 1e3 / *n as f64,
                (t / *n as f64 - base) * 1e3
            );
        }
        Some(s)
    }

    /// Appends a buffer-to-buffer copy (between compute passes, in order).
    pub fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        if src_offset + bytes > src.size()
            || dst_offset + bytes > dst.size()
            || !bytes.is_multiple_of(4)
        {
            return Err(Error::Gpu(format!(
                "copy of {bytes} bytes from {src_offset} of {} into {dst_offset} of {}",
                src.size(),
                dst.size()
            )));
        }
        if bytes > 0 {
            self.ops.push(Op::Copy {
                src: src.clone(),
                src_offset,
                dst: dst.clone(),
                dst_offset,
                bytes,
            });
        }
        Ok(())
    }

    /// Appends a GPU timestamp write into `set[index]`, ordered after the work recorded so far.
    pub fn stamp(&mut self, set: &wgpu::QuerySet, index: u32) {
        self.ops.push(Op::Stamp {
            set: set.clone(),
            index,
        });
    }

    /// Appends the resolution of timestamps `set[0..count]` into `dst` ([count] u64).
    pub fn resolve(&mut self, set: &wgpu::QuerySet, count: u32, dst: &wgpu::Buffer) {
        self.ops.push(Op::Resolve {
            set: set.clone(),
            count,
            dst: dst.clone(),
        });
    }

    /// Whether anything is recorded and not yet submitted.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Submits what is recorded as one command buffer (without waiting for it).
    pub fn flush(&mut self, ctx: &GpuContext) -> Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        // A lost device takes no more work (and a test may lose it here).
        ctx.before_submit()?;
        let ops = std::mem::take(&mut self.ops);
        let params = std::mem::take(&mut self.params);
        let res = ctx.scoped("submit", || {
            if !params.is_empty() {
                ctx.queue.write_buffer(&self.ring, 0, &params);
            }
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("step"),
                });
            let mut i = 0;
            while i < ops.len() {
                if let Op::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    bytes,
                } = &ops[i]
                {
                    enc.copy_buffer_to_buffer(src, *src_offset, dst, *dst_offset, *bytes);
                    i += 1;
                    continue;
                }
                if let Op::Stamp { set, index } = &ops[i] {
                    let _ = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("timestamp"),
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: set,
                            beginning_of_pass_write_index: Some(*index),
                            end_of_pass_write_index: None,
                        }),
                    });
                    i += 1;
                    continue;
                }
                if let Op::Resolve { set, count, dst } = &ops[i] {
                    enc.resolve_query_set(set, 0..*count, dst, 0);
                    i += 1;
                    continue;
                }
                // A run of dispatches shares one compute pass (wgpu orders them).
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("kernels"),
                    timestamp_writes: None,
                });
                while let Some(Op::Dispatch {
                    pipeline,
                    bind_group,
                    offset,
                    groups,
                }) = ops.get(i)
                {
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind_group, &[*offset]);
                    pass.dispatch_workgroups(groups.0, groups.1, 1);
                    i += 1;
                }
            }
            ctx.queue.submit([enc.finish()]);
            Ok(())
        });
        // Keep the host buffers' capacity for the next step.
        self.params = params;
        self.params.clear();
        self.n_submits += 1;
        res
    }

    /// Forgets cached bind groups (after buffers they name were dropped).
    pub fn clear_cache(&mut self) {
        self.bind_groups.clear();
    }
}
