//! Runs the forward pass with each stage on the device its placement names.
//!
//! The model code (`crate::model`) stays written once against `Backend`: the executor calls its
//! stages (embedding, one block, head) on the CPU or the GPU backend and moves the hidden state
//! (`[n, n_embd]` f32) through the host where two consecutive stages sit on different devices.
//! Each layer's KV cache lives on the device that last ran the layer; before a forward pass
//! whose placement puts a layer elsewhere, its cached rows are copied over exactly (both
//! backends keep f32 caches), so moving a layer never changes a result. Moves happen between
//! forward passes, never inside one.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::Config;
use crate::cpu_backend::{CpuBackend, PreparedWeights};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::{GpuAct, GpuBackend, GpuModel};
use crate::ground::{Device, Phase, PhasePlacement, Placement};
use crate::kv_type::KvTypes;
use crate::memory::reader::lock;
use crate::model::Scratch;
use crate::scheduler::dynamic::Dynamic;
use crate::scheduler::policy::TimeSource;

/// Milliseconds of each stage of one forward pass (a measured pass, see
/// [`Exec::measure_next`]): GPU stages by GPU timestamps around them when the adapter has
/// timestamp queries, else (and CPU stages always) by the wall clock with the stage's device
/// synchronized before the clock stops.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageTimes {
    pub phase: Phase,
    /// How the GPU stages were timed.
    pub source: TimeSource,
    /// Wall-clock milliseconds of the whole pass (its batches, without the timestamp
    /// read-backs): the stage times sum to no more than this.
    pub wall_ms: f64,
    /// Tokens in the pass.
    pub tokens: usize,
    pub embed: (Device, f64),
    pub layers: Vec<(Device, f64)>,
    pub head: Option<(Device, f64)>,
    /// Total milliseconds spent moving the hidden state between devices, and how many moves.
    pub crossing_ms: f64,
    pub crossings: usize,
}

/// A layer's KV cache moved between devices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvMove {
    pub layer: usize,
    pub from: Device,
    pub to: Device,
    /// Cached positions copied.
    pub positions: usize,
}

/// Counters over a session.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExecStats {
    /// Hidden-state moves between devices.
    pub crossings: u64,
    /// KV cache moves (a layer changed device between passes).
    pub kv_moves: u64,
    /// Positions copied by those moves.
    pub kv_positions_moved: u64,
    /// Blocks this session uploaded to make them resident, and freed (residency changes).
    pub blocks_uploaded: u64,
    pub blocks_freed: u64,
}

/// A placement-driven forward pass over a CPU backend and, when the model has one, a GPU
/// backend.
pub struct Exec {
    cfg: Config,
    gguf: Arc<Gguf>,
    pool: Arc<crate::cpu::par::Workers>,
    gpu_model: Option<Arc<GpuModel>>,
    n_ctx: usize,
    batch: usize,
    f32_activations: bool,
    /// The model's CPU weights prepared at load (packed matrices, dequantized vectors), shared
    /// by its sessions' CPU backends.
    cpu_weights: Arc<PreparedWeights>,
    /// Element types of every layer's K and V cache.
    kv_types: KvTypes,
    /// Made when a placement first puts a stage on the CPU.
    cpu: Option<(CpuBackend, Scratch<Vec<f32>>)>,
    /// Made when a placement first puts a stage on the GPU.
    gpu: Option<(GpuBackend, Scratch<GpuAct>)>,
    placement: PhasePlacement,
    /// Where layer l's cached positions 0..n_past live.
    kv_home: Vec<Device>,
    /// Hidden state in transit between devices: [batch, n_embd].
    host: Vec<f32>,
    measure_next: bool,
    /// The dynamic offload policy, when on.
    dynamic: Option<Dynamic>,
    /// Whether the last pass was timed (its times are in `last_times`).
    timed: bool,
    /// The measured pass in progress (the head adds its time).
    pending: Option<StageTimes>,
    last_times: Option<StageTimes>,
    /// Whether the measured pass in progress times GPU stages with timestamps.
    use_stamps: bool,
    /// GPU timestamps of the batch in progress: (stage index: 0 embedding, 1 + l block l,
    /// n_layer + 1 head; stamp before; stamp after).
    marks: Vec<(usize, u32, u32)>,
    /// Blocks whose weights this session keeps resident on the GPU itself (`[n_layer]`, all
    /// false unless the policy manages residency, see [`Exec::manage_residency`]).
    own_resident: Vec<bool>,
    /// The GPU budget residency decisions keep within, when the policy manages them.
    residency_budget: Option<u64>,
    /// Stream loads (bytes, ms) already given to the policy.
    upload_seen: (u64, f64),
    /// Moves to the CPU after GPU failures (`failover`).
    fallbacks: Vec<Fallback>,
    /// CPU blocks whose weights stream from storage, and the reader bringing them.
    cpu_stream: Option<BlockStream>,
    /// The model's expert cache, when its experts are held under a budget.
    expert_cache: Option<crate::memory::experts::SharedExpertCache>,
    pub stats: ExecStats,
}

/// The model's one storage reader, through which streamed blocks are read on both devices:
/// `streamed[l]` (`[n_layer]`) says block l's matrices stream when it runs on the CPU; a GPU's
/// stream ring loads the blocks it does not hold resident through the same reader.
#[derive(Clone)]
pub struct BlockStream {
    pub reader: crate::memory::SharedReader,
    pub streamed: Vec<bool>,
}

/// Runs `$body` with `$b`, `$s` bound to the backend and scratch of device `$d`.
macro_rules! on_dev {
    ($self:ident, $d:expr, |$b:ident, $s:ident| $body:expr) => {
        match $d {
            Device::Cpu => {
                let (ref mut $b, ref mut $s) = *$self.cpu_side()?;
                $body
            }
            Device::Gpu => {
                let (ref mut $b, ref mut $s) = *$self.gpu_side()?;
                $body
            }
        }
    };
}

// Parts of `impl Exec` in their own files (they see its private fields and `on_dev!`).
mod failover;
mod forward;
mod policy_side;
mod stamps;

pub(crate) use failover::{fit_uploaded, gpu_stages};
pub use failover::{Fallback, FallbackCause, KvRebuild};

/// A pass of more than one token is prompt processing.
pub(crate) fn phase_of(n_tokens: usize) -> Phase {
    if n_tokens > 1 {
        Phase::Prefill
    } else {
        Phase::Decode
    }
}

impl Exec {
    /// An executor for `placement` with a KV cache of `n_ctx` positions and batches of up to
    /// `batch` tokens. A placement that puts a stage on the GPU needs `gpu_model` holding that
    /// stage's weights.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config,
        gguf: Arc<Gguf>,
        pool: Arc<crate::cpu::par::Workers>,
        gpu_model: Option<Arc<GpuModel>>,
        placement: PhasePlacement,
        n_ctx: usize,
        batch: usize,
        f32_activations: bool,
        kv_types: KvTypes,
        cpu_weights: Arc<PreparedWeights>,
    ) -> Result<Exec> {
        if n_ctx == 0 || batch == 0 {
            return Err(Error::InvalidArgument(
                "context and batch must be at least 1 token".into(),
            ));
        }
        let mut e = Exec {
            kv_home: placement.prefill.layers.clone(),
            host: vec![0.0; batch * cfg.n_embd],
            cfg,
            gguf,
            pool,
            gpu_model,
            n_ctx,
            batch,
            f32_activations,
            kv_types,
            cpu_weights,
            cpu: None,
            gpu: None,
            placement: placement.clone(),
            measure_next: false,
            dynamic: None,
            timed: false,
            pending: None,
            last_times: None,
            use_stamps: false,
            marks: Vec::new(),
            own_resident: vec![false; placement.prefill.layers.len()],
            residency_budget: None,
            upload_seen: (0, 0.0),
            fallbacks: Vec::new(),
            cpu_stream: None,
            expert_cache: None,
            stats: ExecStats::default(),
        };
        for phase in [Phase::Prefill, Phase::Decode] {
            e.check(placement.get(phase))?;
        }
        // Make the backends the placements use now, so an out-of-memory shows at start.
        if placement.prefill.uses(Device::Cpu) || placement.decode.uses(Device::Cpu) {
            e.cpu_side()?;
        }
        if placement.prefill.uses(Device::Gpu) || placement.decode.uses(Device::Gpu) {
            e.gpu_side()?;
        }
        Ok(e)
    }

    /// Checks that `p` fits this model and that every GPU stage's weights are on the GPU.
    fn check(&self, p: &Placement) -> Result<()> {
        if p.layers.len() != self.cfg.n_layer {
            return Err(Error::InvalidArgument(format!(
                "placement of {} layers for a model of {}",
                p.layers.len(),
                self.cfg.n_layer
            )));
        }
        if !p.uses(Device::Gpu) {
            return Ok(());
        }
        let g = self.gpu_model.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("placement {p} uses the GPU but none is open"))
        })?;
        if self.cfg.moe.is_some() {
            // A mixture-of-experts block never streams through the GPU's ring (its experts
            // would be read whole every pass): on the GPU it must be resident.
            let on_gpu = |l: usize| p.layers[l] == Device::Gpu;
            if let Some(l) = (0..p.layers.len()).find(|&l| on_gpu(l) && self.gpu_streams(l)) {
                return Err(Error::InvalidArgument(format!(
                    "placement {p} runs mixture-of-experts block {l} on the GPU, which does not \
                     hold its experts"
                )));
            }
        }
        let tied = self.cfg.tied_embeddings;
        // Blocks without resident weights are streamed; the embedding and head must be there.
        let missing = crate::backend::expected_weights(&self.cfg)
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| id.layer_index().is_none())
            .find(|&id| crate::gpu::needed_on_gpu(id, p, tied) && !g.has(id));
        match missing {
            Some(id) => Err(Error::InvalidArgument(format!(
                "placement {p} runs {} on the GPU, but its weights were not uploaded",
                id.tensor_name()
            ))),
            None => Ok(()),
        }
    }

    fn cpu_side(&mut self) -> Result<&mut (CpuBackend, Scratch<Vec<f32>>)> {
        if self.cpu.is_none() {
            let kv: Vec<bool> = self.kv_home.iter().map(|&d| d == Device::Cpu).collect();
            let mut b = CpuBackend::with_prepared(
                self.gguf.clone(),
                self.cfg.clone(),
                self.n_ctx,
                &kv,
                self.kv_types,
                self.cpu_weights.clone(),
            )?;
            b.set_f32_activations(self.f32_activations);
            if let Some(st) = &self.cpu_stream {
                b.set_streamed(st.streamed.clone());
            }
            if let Some(c) = &self.expert_cache {
                b.set_expert_cache(c.clone());
            }
            let s = Scratch::new(&mut b, &self.cfg, self.batch)?;
            self.cpu = Some((b, s));
        }
        self.cpu
            .as_mut()
            .ok_or_else(|| Error::InvalidArgument("no CPU backend".into()))
    }

    fn gpu_side(&mut self) -> Result<&mut (GpuBackend, Scratch<GpuAct>)> {
        if self.gpu.is_none() {
            let m = self
                .gpu_model
                .clone()
                .ok_or_else(|| Error::InvalidArgument("no GPU is open".into()))?;
            let mut b = GpuBackend::with_kv_types(m, self.n_ctx, self.batch, self.kv_types)?;
            let s = Scratch::new(&mut b, &self.cfg, self.batch)?;
            // Caches for the blocks that start here (streamed ones have none yet).
            for (l, &d) in self.kv_home.iter().enumerate() {
                if d == Device::Gpu {
                    b.write_kv(l, &[], &[])?;
                }
            }
            for (l, &r) in self.own_resident.iter().enumerate() {
                if r {
                    b.make_resident(l, &self.gguf)?;
                }
            }
            self.gpu = Some((b, s));
            self.enable_streaming_if_needed()?;
        }
        self.gpu
            .as_mut()
            .ok_or_else(|| Error::InvalidArgument("no GPU backend".into()))
    }

    /// Reads streamed blocks through `stream`'s reader: the CPU's non-resident blocks, and the
    /// GPU's (before the first pass).
    pub fn set_cpu_stream(&mut self, stream: BlockStream) -> Result<()> {
        if stream.streamed.len() != self.cfg.n_layer {
            return Err(Error::InvalidArgument(format!(
                "stream plan of {} blocks for a model of {}",
                stream.streamed.len(),
                self.cfg.n_layer
            )));
        }
        if let Some((b, _)) = self.cpu.as_mut() {
            b.set_streamed(stream.streamed.clone());
        }
        self.cpu_stream = Some(stream);
        // A GPU ring made already reads through the reader from now on.
        self.enable_streaming_if_needed()
    }

    /// Reads the CPU's experts through the model's expert cache.
    pub fn set_expert_cache(&mut self, cache: crate::memory::experts::SharedExpertCache) {
        if let Some((b, _)) = self.cpu.as_mut() {
            b.set_expert_cache(cache.clone());
        }
        self.expert_cache = Some(cache);
    }

    /// Whether block `l` streams when it runs on the CPU.
    fn cpu_streams(&self, l: usize) -> bool {
        self.cpu_stream
            .as_ref()
            .is_some_and(|s| s.streamed.get(l) == Some(&true))
    }

    /// Runs streamed block `l` of `n` tokens at `pos0` on the CPU, its weights read in from
    /// storage first (the slot goes back to the reader whatever the block's result).
    fn cpu_block(&mut self, l: usize, n: usize, pos0: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let reader = self
            .cpu_stream
            .as_ref()
            .map(|s| s.reader.clone())
            .ok_or_else(|| Error::InvalidArgument(format!("block {l} does not stream")))?;
        let slot = lock(&reader)?.acquire(l)?;
        let (b, s) = match self.cpu_side() {
            Ok(side) => side,
            Err(e) => {
                lock(&reader)?.release(slot);
                return Err(e);
            }
        };
        b.set_slot(slot);
        let r = crate::model::layer_stage(b, &cfg, s, l, n, pos0);
        if let Some(slot) = b.take_slot() {
            lock(&reader)?.release(slot);
        }
        r
    }

    /// The stream reader's counters, when CPU blocks stream.
    pub fn stream_stats(&self) -> Option<crate::memory::ReaderStats> {
        let s = self.cpu_stream.as_ref()?;
        let r = s.reader.lock().ok()?;
        Some(r.stats())
    }

    /// Whether a placement puts a block without resident weights on the GPU.
    fn streams(&self, p: &Placement) -> bool {
        let on_gpu = |l: usize| p.layers[l] == Device::Gpu;
        (0..p.layers.len()).any(|l| on_gpu(l) && self.gpu_streams(l))
    }

    /// Whether block `l` streams when it runs on the GPU: neither the model nor this session
    /// holds its weights there.
    fn gpu_streams(&self, l: usize) -> bool {
        self.gpu_model
            .as_ref()
            .is_some_and(|g| !g.has_layer(l) && !self.own_resident.get(l).copied().unwrap_or(false))
    }

    /// Makes the GPU backend's stream slots when a placement streams blocks.
    fn enable_streaming_if_needed(&mut self) -> Result<()> {
        let need = self.streams(&self.placement.prefill) || self.streams(&self.placement.decode);
        if need {
            let gguf = self.gguf.clone();
            let source = self.cpu_stream.as_ref().map(|s| s.reader.clone());
            if let Some((b, _)) = self.gpu.as_mut() {
                b.enable_streaming(gguf, source)?;
            }
        }
        Ok(())
    }

    /// The blocks a pass with placement `p` reads from storage, in pass order: CPU blocks
    /// that stream, and GPU blocks without resident weights.
    fn streamed_order(&self, p: &Placement) -> Vec<usize> {
        let Some(st) = &self.cpu_stream else {
            return Vec::new();
        };
        (0..p.layers.len())
            .filter(|&l| match p.layers[l] {
                Device::Cpu => st.streamed.get(l) == Some(&true),
                Device::Gpu => self.gpu_streams(l),
            })
            .collect()
    }

    /// Points the reader at the blocks a pass with placement `p` streams (a no-op while they
    /// stay the same).
    pub(crate) fn order_reads(&mut self, p: &Placement) -> Result<()> {
        let order = self.streamed_order(p);
        if let Some(st) = &self.cpu_stream {
            lock(&st.reader)?.set_order(&order);
        }
        Ok(())
    }

    /// The placement of `phase`.
    pub fn placement(&self) -> &PhasePlacement {
        &self.placement
    }

    /// Replaces the placement of `phase`; the move (KV rows of the layers that change device)
    /// happens at the start of the next pass of that phase.
    pub fn set_placement(&mut self, phase: Phase, p: Placement) -> Result<()> {
        self.check(&p)?;
        *self.placement.get_mut(phase) = p;
        self.enable_streaming_if_needed()
    }

    /// The GPU backend, if one was made (tests read its launch statistics).
    pub fn gpu_backend(&self) -> Option<&GpuBackend> {
        self.gpu.as_ref().map(|g| &g.0)
    }

    /// Synchronizes after every stage of the next pass and records its times
    /// ([`Exec::take_times`]).
    pub fn measure_next(&mut self) {
        self.measure_next = true;
    }

    /// The stage times of the last measured pass.
    pub fn take_times(&mut self) -> Option<StageTimes> {
        self.last_times.take()
    }

    /// A short name of what runs where, e.g. `cpu`, `gpu:lavapipe (Vulkan)` or
    /// `cpu+gpu:... [c|cccGGG|G]`.
    pub fn name(&self) -> String {
        let p = &self.placement.decode;
        let gpu_name = self
            .gpu_model
            .as_ref()
            .map(|g| format!("gpu:{} ({})", g.ctx.info.name, g.ctx.info.backend));
        match (p.uses(Device::Cpu), p.uses(Device::Gpu), gpu_name) {
            (true, true, Some(g)) => format!("cpu+{g} [{p}]"),
            (false, true, Some(g)) => g,
            _ => "cpu".into(),
        }
    }

    /// Moves the KV rows 0..n_past of every layer that `p` puts on another device than the
    /// one holding them.
    fn migrate(&mut self, p: &Placement, n_past: usize) -> Result<()> {
        let mut moved = 0usize;
        // The caches as stored (both devices hold the same types): raw blocks move losslessly.
        let mut k = Vec::new();
        let mut v = Vec::new();
        for l in 0..self.cfg.n_layer {
            let (from, to) = (self.kv_home[l], p.layers[l]);
            if from == to {
                continue;
            }
            if n_past > 0 {
                on_dev!(self, from, |b, _s| b.read_kv_raw(l, n_past, &mut k, &mut v))?;
                on_dev!(self, to, |b, _s| b.write_kv_raw(l, &k, &v))?;
                self.stats.kv_moves += 1;
                self.stats.kv_positions_moved += n_past as u64;
                moved += 1;
                log::debug!("layer {l}: KV cache of {n_past} positions moved {from} -> {to}");
            } else {
                // Nothing cached yet: give the new device an empty cache.
                on_dev!(self, to, |b, _s| b.write_kv(l, &[], &[]))?;
            }
            on_dev!(self, from, |b, _s| {
                b.drop_kv(l);
                Ok::<(), Error>(())
            })?;
            self.kv_home[l] = to;
        }
        if moved > 0 {
            log::info!("placement {p}: moved the KV cache of {moved} layers ({n_past} positions)");
        }
        Ok(())
    }

    /// Moves the KV cache (positions 0..n_past) to where `phase`'s placement wants it now,
    /// instead of at the start of that phase's next pass.
    pub fn settle(&mut self, phase: Phase, n_past: usize) -> Result<()> {
        let p = self.placement.get(phase).clone();
        let pool = self.pool.clone();
        pool.install(|| self.migrate(&p, n_past))
    }

    /// Element types of the K and V caches.
    pub fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    /// Where each layer's KV cache is now.
    pub fn kv_home(&self) -> &[Device] {
        &self.kv_home
    }

    /// Bytes of KV cache held per device: [cpu, gpu].
    pub fn kv_bytes(&self) -> [u64; 2] {
        let t = self.kv_types;
        let row = self.cfg.kv_dim();
        let per_layer = (self.n_ctx * (t.k.bytes(row) + t.v.bytes(row))) as u64;
        let mut out = [0u64; 2];
        for &d in &self.kv_home {
            out[d.index()] += per_layer;
        }
        out
    }

    /// Shifts every layer's KV cache (positions 0..s.n_pos) on the device that holds it: a
    /// context shift (`crate::engine::ctx_shift`).
    pub fn shift_kv(&mut self, s: crate::backend::KvShift) -> Result<()> {
        s.check()?;
        // The RoPE factors this context runs with (LongRoPE's long or short ones).
        let cfg = self.cfg.for_context(self.n_ctx);
        for l in 0..cfg.n_layer {
            let d = self.kv_home[l];
            on_dev!(self, d, |b, _s| b.shift_kv(l, &cfg, s))?;
        }
        Ok(())
    }

    /// Copies positions 0..n_pos of layer l's KV cache to k, v: [n_pos, kv_dim] (f32), from the
    /// device that holds it.
    pub fn read_layer_kv(
        &mut self,
        l: usize,
        n_pos: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<()> {
        let d = self.layer_home(l)?;
        on_dev!(self, d, |b, _s| b.read_kv(l, n_pos, k, v))
    }

    /// Fills positions 0.. of layer l's KV cache from k, v: [n, kv_dim] on its device.
    pub fn write_layer_kv(&mut self, l: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let d = self.layer_home(l)?;
        on_dev!(self, d, |b, _s| b.write_kv(l, k, v))
    }

    fn layer_home(&self, l: usize) -> Result<Device> {
        self.kv_home.get(l).copied().ok_or_else(|| {
            Error::InvalidArgument(format!("layer {l} of a model of {}", self.cfg.n_layer))
        })
    }
}
