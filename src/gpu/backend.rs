//! The GPU implementation of [`Backend`]: the model's forward pass as WGSL kernels.
//!
//! Weights live in a shared [`GpuModel`]; a backend adds one session's KV cache, activation
//! buffers and a [`Recorder`]. Ops are recorded, not run: a whole decode step becomes one
//! command buffer, submitted when the host needs a result (`read`, `argmax`, `sync`) or writes
//! an input. Logits stay on the GPU unless sampling needs them (greedy decode reads back one
//! token id).

use std::sync::Arc;

use crate::backend::{Backend, WeightId};
use crate::error::{Error, Result};

use crate::gpu::kernels::attention::{attention_scratch_len, AttentionConfig, ATTENTION_CHUNK};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::Launch;
use crate::gpu::recorder::Recorder;
use crate::gpu::registry::KernelKey;
use crate::gpu::stream::StreamRing;
use crate::gpu::timing::GpuTimer;
use crate::gpu::weights::{GpuModel, GpuWeightMatrix};
use crate::kv_type::KvTypes;

mod kv;
mod matmul;
mod moe;
mod residency;
use kv::{kv_layer, KvLayer};

/// Batches of at most this many tokens take the batched matvec (weights re-read per token);
/// larger ones the tiled matmul.
pub(crate) const MATVEC_MAX_TOKENS: usize = 4;

/// An activation buffer on the GPU: `len` f32 values.
pub struct GpuAct {
    buf: wgpu::Buffer,
    len: usize,
}

impl GpuAct {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        // Profiling is a developer switch: its report goes to stderr when the session ends.
        if let Some(r) = self.rec.profile_report() {
            eprint!("{r}");
        }
    }
}

pub struct GpuBackend {
    m: Arc<GpuModel>,
    rec: Recorder,
    /// Per layer; `None` for layers that run on the CPU.
    kv: Vec<Option<KvLayer>>,
    /// The caches' element types (`kv` module).
    kv_types: KvTypes,
    n_ctx: usize,
    /// Attention's split-over-the-sequence partials: [attention_scratch_len] f32.
    att_scratch: wgpu::Buffer,
    /// Token ids of the current batch: [max_tokens] u32.
    ids: wgpu::Buffer,
    max_tokens: usize,
    /// Argmax results: [max_tokens] u32.
    argmax_out: wgpu::Buffer,
    /// MAP_READ staging for readbacks, grown to the largest read.
    staging: Option<wgpu::Buffer>,
    /// A matmul input quantized to 8 bits: [max_tokens, max_cols / 4] words of four int8.
    qx: wgpu::Buffer,
    /// Its chunk scales and sums: [max_tokens, max_cols / 32] vec4<f32>.
    qd: wgpu::Buffer,
    /// Slots for blocks that run here without resident weights (see `gpu::stream`).
    stream: Option<StreamRing>,
    /// Blocks this session made resident itself (the scheduler's residency decisions), by
    /// matrix id: uploaded from the mmap as a stream slot is, freed when evicted. The
    /// model's own resident blocks are shared by every session and never evicted.
    own: std::collections::HashMap<WeightId, GpuWeightMatrix>,
    /// Timestamp queries for measured passes, when the adapter has them and the model allows
    /// them (see `gpu::timing`).
    timer: Option<GpuTimer>,
    /// Bytes of every buffer this session allocated (KV cache, scratch, activations,
    /// readback staging, uniform ring); the weights are the model's (`GpuModel::weight_bytes`).
    allocated: u64,
    /// Elements qx / qd can hold: max_tokens * max_cols.
    q_capacity: usize,
    /// The activation buffer qx / qd hold the quantization of, and how many of its leading
    /// elements (chunks are independent, so any prefix of whole rows is valid too): set by
    /// the ops that quantize (rms_norm and swiglu fused with it, quantize_act before a
    /// matmul) and cleared by every op that could change that buffer or qx / qd, so the
    /// matmuls after a norm quantize their input once, not once each.
    quantized: Option<(wgpu::Buffer, usize)>,
    /// The mixture-of-experts step's buffers, made at the first mixture block run here.
    moe: Option<moe::MoeBufs>,
}

fn storage(m: &GpuModel, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
    let ctx = &m.ctx;
    let limit = ctx
        .limits
        .max_storage_buffer_binding_size
        .min(ctx.limits.max_buffer_size);
    if bytes > limit {
        return Err(Error::OutOfMemory {
            what: format!(
                "{label}: {bytes} bytes exceed the adapter's storage binding limit of {limit} bytes"
            ),
        });
    }
    ctx.before_alloc(label)?;
    ctx.scoped(&format!("allocate {label} ({bytes} bytes)"), || {
        Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    })
}

impl GpuBackend {
    /// A session on `m` with an f32 KV cache of `n_ctx` positions and batches of up to
    /// `max_tokens` tokens.
    pub fn new(m: Arc<GpuModel>, n_ctx: usize, max_tokens: usize) -> Result<GpuBackend> {
        GpuBackend::with_kv_types(m, n_ctx, max_tokens, KvTypes::F32)
    }

    /// As [`GpuBackend::new`], with KV caches of the given types.
    pub fn with_kv_types(
        m: Arc<GpuModel>,
        n_ctx: usize,
        max_tokens: usize,
        kv_types: KvTypes,
    ) -> Result<GpuBackend> {
        if n_ctx == 0 || max_tokens == 0 {
            return Err(Error::InvalidArgument(
                "context and batch must be at least 1 token".into(),
            ));
        }
        let cfg = &m.cfg;
        kv_types.check_head_dim(cfg.head_dim)?;
        // Caches for the layers whose weights are here; a layer that moves here later gets
        // its cache then (between tokens).
        let mut kv = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            kv.push(if m.has_layer(l) {
                Some(kv_layer(&m, l, n_ctx, kv_types)?)
            } else {
                None
            });
        }
        // Sized by the shape alone (a window never needs more: chunks before it stay unused).
        let att = attention_scratch_len(
            &attention_config(&m, 0, n_ctx, kv_types),
            max_tokens,
            ATTENTION_CHUNK as usize,
        );
        let att_scratch = storage(&m, "attention scratch", (att as u64).saturating_mul(4))?;
        let ids = storage(&m, "token ids", max_tokens as u64 * 4)?;
        let argmax_out = storage(&m, "argmax", max_tokens as u64 * 4)?;
        // A mixture's routed experts quantize a token's k activation rows of n_ff_exp at once.
        let moe_cols = cfg
            .moe
            .as_ref()
            .map_or(0, |m| m.n_expert_used.saturating_mul(m.n_ff_exp));
        let max_cols = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff).max(moe_cols);
        let qx = storage(&m, "qx", (qx_words(max_tokens, max_cols) * 4) as u64)?;
        let qd = storage(&m, "qd", (qd_vec4s(max_tokens, max_cols) * 16) as u64)?;
        let rec = Recorder::new(&m.ctx)?;
        // Two stamps per stage (embedding, blocks, head) of one batch.
        let timer = if m.timestamps {
            GpuTimer::new(&m.ctx, 2 * (cfg.n_layer as u32 + 2))?
        } else {
            None
        };
        let allocated = kv
            .iter()
            .flatten()
            .flat_map(|l| [&l.k, &l.v])
            .chain([&att_scratch, &ids, &argmax_out, &qx, &qd])
            .map(|b| b.size())
            .sum::<u64>()
            + rec.ring_bytes()
            + timer.as_ref().map_or(0, |t| t.bytes());
        Ok(GpuBackend {
            own: std::collections::HashMap::new(),
            timer,
            allocated,
            qx,
            qd,
            q_capacity: max_tokens.saturating_mul(max_cols),
            quantized: None,
            moe: None,
            m,
            rec,
            kv,
            kv_types,
            n_ctx,
            att_scratch,
            ids,
            max_tokens,
            argmax_out,
            staging: None,
            stream: None,
        })
    }

    /// A weight matrix: the resident copy, else the streamed one.
    fn weight(&self, w: WeightId) -> Result<GpuWeightMatrix> {
        if let Some(m) = self.own.get(&w) {
            return Ok(m.clone());
        }
        if let Some(m) = self.stream.as_ref().and_then(|r| r.matrix(w)) {
            if !self.m.has(w) {
                return Ok(m.clone());
            }
        }
        self.m.matrix(w).cloned()
    }

    pub fn model(&self) -> &Arc<GpuModel> {
        &self.m
    }

    /// Bytes of GPU buffers this session allocated so far: KV cache, scratch, activations,
    /// readback staging and the uniform ring (the weights are `model().weight_bytes`).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    /// Per-kernel timings when `MEMWALL_GPU_PROFILE=1` (see [`Recorder`]).
    pub fn profile_report(&self) -> Option<String> {
        self.rec.profile_report()
    }

    /// Launches recorded, submissions made and bind groups cached so far.
    pub fn stats(&self) -> (u64, u64, usize) {
        (
            self.rec.n_launches,
            self.rec.n_submits,
            self.rec.n_bind_groups(),
        )
    }

    fn record(&mut self, launch: Launch<'_>) -> Result<()> {
        self.rec.record(&self.m.ctx, &self.m.kernels, launch)
    }

    /// Submits pending work and copies `bytes` from the start of `src` to the host.
    fn read_bytes(&mut self, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let ctx = &self.m.ctx;
        if bytes > src.size() {
            return Err(Error::Gpu(format!(
                "read of {bytes} bytes from a {}-byte buffer",
                src.size()
            )));
        }
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let need_new = self.staging.as_ref().is_none_or(|s| s.size() < bytes);
        if need_new {
            // The old staging buffer is dropped: count the live one only.
            let old = self.staging.as_ref().map_or(0, |s| s.size());
            self.allocated = self.allocated.saturating_sub(old) + bytes;
            // Grown once to the largest read (the logits); not in the steady-state loop.
            self.staging = Some(ctx.scoped("readback buffer", || {
                Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }))
            })?);
        }
        let staging = self
            .staging
            .clone()
            .ok_or_else(|| Error::Gpu("no readback buffer".into()))?;
        self.rec.copy(src, 0, &staging, 0, bytes)?;
        self.rec.flush(ctx)?;
        let slice = staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            // The receiver waits below; a send error only means nobody is listening.
            let _ = tx.send(r);
        });
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| ctx.lost_or("readback", Error::Gpu(format!("wait for the GPU: {e}"))))?;
        rx.recv()
            .map_err(|_| ctx.lost_or("readback", Error::Gpu("readback callback never ran".into())))?
            .map_err(|e| {
                ctx.lost_or("readback", Error::Gpu(format!("map readback buffer: {e}")))
            })?;
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("read mapped buffer: {e}")))?;
            view.to_vec()
        };
        staging.unmap();
        ctx.check_uncaptured("readback")?;
        Ok(out)
    }

    /// Forgets the quantized input if `buf` is the buffer it was made from (an op is about to
    /// change it).
    fn written(&mut self, buf: &wgpu::Buffer) {
        if self.quantized.as_ref().is_some_and(|(b, _)| b == buf) {
            self.quantized = None;
        }
    }
}

/// Block `layer`'s attention shape.
fn attention_config(m: &GpuModel, layer: usize, n_ctx: usize, kv: KvTypes) -> AttentionConfig {
    let cfg = &m.cfg;
    AttentionConfig {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        scale: cfg.attn_scale,
        n_ctx,
        kv,
        window: cfg.window(layer),
        softcap: cfg.attn_logit_softcap,
    }
}

impl Backend for GpuBackend {
    type Act = GpuAct;

    fn name(&self) -> String {
        format!("gpu:{} ({})", self.m.ctx.info.name, self.m.ctx.info.backend)
    }

    fn alloc(&mut self, len: usize) -> Result<GpuAct> {
        let bytes = (len as u64).saturating_mul(4);
        self.allocated += bytes.max(4);
        Ok(GpuAct {
            buf: storage(&self.m, "activation", bytes)?,
            len,
        })
    }

    fn write(&mut self, dst: &mut GpuAct, src: &[f32]) -> Result<()> {
        if src.len() > dst.len {
            return Err(Error::Gpu(format!(
                "write of {} values into a buffer of {}",
                src.len(),
                dst.len
            )));
        }
        self.written(&dst.buf);
        // Recorded work must see the old contents: submit it before the queue write.
        self.rec.flush(&self.m.ctx)?;
        self.m
            .ctx
            .queue
            .write_buffer(&dst.buf, 0, bytemuck::cast_slice(src));
        Ok(())
    }

    fn read(&mut self, src: &GpuAct, dst: &mut [f32]) -> Result<()> {
        if dst.len() > src.len {
            return Err(Error::Gpu(format!(
                "read of {} values from a buffer of {}",
                dst.len(),
                src.len
            )));
        }
        let bytes = self.read_bytes(&src.buf, dst.len() as u64 * 4)?;
        for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    fn embed(&mut self, ids: &[u32], out: &mut GpuAct) -> Result<()> {
        let m = Arc::clone(&self.m);
        let table = m.matrix(WeightId::TokEmbd)?;
        if ids.len() > self.max_tokens || out.len < ids.len() * table.cols {
            return Err(Error::Gpu(format!(
                "embedding of {} tokens (batch {}, output {} values)",
                ids.len(),
                self.max_tokens,
                out.len
            )));
        }
        self.written(&out.buf);
        self.rec.flush(&m.ctx)?;
        m.ctx
            .queue
            .write_buffer(&self.ids, 0, bytemuck::cast_slice(ids));
        let id_buf = self.ids.clone();
        for p in &table.parts {
            let launch = m.kernels.embedding_part_launch(
                &p.m,
                p.row0,
                table.rows,
                &id_buf,
                &out.buf,
                ids.len(),
                m.cfg.embed_scale,
            )?;
            self.record(launch)?;
        }
        Ok(())
    }

    fn rms_norm(&mut self, norm: WeightId, x: &GpuAct, n: usize, out: &mut GpuAct) -> Result<()> {
        let m = Arc::clone(&self.m);
        let w = m.vector(norm)?;
        let width = (w.size() / 4) as usize;
        self.written(&out.buf);
        let len = n.saturating_mul(width);
        if !m.f32_activations && width.is_multiple_of(32) && len <= self.q_capacity {
            // Quantize the result on the way out: the matmuls that read it skip quantize_act.
            let (qx, qd) = (self.qx.clone(), self.qd.clone());
            let launch = m.kernels.rms_norm_quant_launch(
                &x.buf,
                w,
                &out.buf,
                &qx,
                &qd,
                width,
                n,
                m.cfg.rms_eps,
            )?;
            self.record(launch)?;
            self.quantized = Some((out.buf.clone(), len));
            return Ok(());
        }
        let launch = m
            .kernels
            .rms_norm_launch(&x.buf, w, &out.buf, width, n, m.cfg.rms_eps)?;
        self.record(launch)
    }

    fn matmul(&mut self, w: WeightId, x: &GpuAct, n: usize, out: &mut GpuAct) -> Result<()> {
        self.matmul_parts(w, x, n, out, false)
    }

    fn moe(&mut self, layer: usize, x: &GpuAct, n: usize, out: &mut GpuAct) -> Result<()> {
        self.moe_ffn(layer, x, n, out)
    }

    fn matmul_qkv(
        &mut self,
        l: usize,
        x: &GpuAct,
        n: usize,
        q: &mut GpuAct,
        k: &mut GpuAct,
        v: &mut GpuAct,
    ) -> Result<()> {
        if self.matmul_stacked(WeightId::Wq(l), x, n, &[q, k, v])? {
            return Ok(());
        }
        self.matmul_parts(WeightId::Wq(l), x, n, q, false)?;
        self.matmul_parts(WeightId::Wk(l), x, n, k, false)?;
        self.matmul_parts(WeightId::Wv(l), x, n, v, false)
    }

    fn matmul_gate_up(
        &mut self,
        l: usize,
        x: &GpuAct,
        n: usize,
        g: &mut GpuAct,
        u: &mut GpuAct,
    ) -> Result<()> {
        if self.matmul_stacked(WeightId::Gate(l), x, n, &[g, u])? {
            return Ok(());
        }
        self.matmul_parts(WeightId::Gate(l), x, n, g, false)?;
        self.matmul_parts(WeightId::Up(l), x, n, u, false)
    }

    fn matmul_add(
        &mut self,
        w: WeightId,
        y: &GpuAct,
        n: usize,
        rows: usize,
        tmp: &mut GpuAct,
        x: &mut GpuAct,
    ) -> Result<()> {
        let mat = self.weight(w)?;
        let fused = mat.rows == rows && mat.parts.first().is_some_and(|p| self.q8_path(&p.m));
        if fused {
            return self.matmul_parts(w, y, n, x, true);
        }
        self.matmul_parts(w, y, n, tmp, false)?;
        self.add(x, tmp, n * rows)
    }

    fn add_bias(&mut self, bias: WeightId, x: &mut GpuAct, n: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        let b = m.vector(bias)?;
        let width = (b.size() / 4) as usize;
        self.written(&x.buf);
        let launch = m.kernels.add_bias_launch(&x.buf, b, width, n)?;
        self.record(launch)
    }

    fn rope(
        &mut self,
        layer: usize,
        x: &mut GpuAct,
        n: usize,
        n_heads: usize,
        pos0: usize,
    ) -> Result<()> {
        let m = Arc::clone(&self.m);
        self.written(&x.buf);
        let cfg = m.rope_config(layer, n_heads);
        let launch =
            m.kernels
                .rope_launch(&x.buf, m.rope_freqs(layer, self.n_ctx), &cfg, n, pos0)?;
        self.record(launch)
    }

    fn rope_qk(
        &mut self,
        layer: usize,
        q: &mut GpuAct,
        k: &mut GpuAct,
        n: usize,
        (n_head, n_head_kv): (usize, usize),
        pos0: usize,
    ) -> Result<()> {
        let m = Arc::clone(&self.m);
        self.written(&q.buf);
        self.written(&k.buf);
        // The frequencies depend on the head dimension only, shared by Q and K.
        let cfg = m.rope_config(layer, n_head);
        let freqs = m.rope_freqs(layer, self.n_ctx);
        let launch = m
            .kernels
            .rope_pair_launch(&q.buf, &k.buf, n_head_kv, freqs, &cfg, n, pos0)?;
        self.record(launch)
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &GpuAct,
        k: &GpuAct,
        v: &GpuAct,
        n: usize,
        pos0: usize,
        out: &mut GpuAct,
    ) -> Result<()> {
        let m = Arc::clone(&self.m);
        if pos0 + n > self.n_ctx {
            return Err(Error::ContextOverflow {
                n_prompt: pos0 + n,
                n_ctx: self.n_ctx,
            });
        }
        let (kc, vc) = self.kv_buffers(layer)?;
        self.written(&out.buf);
        let cfg = attention_config(&m, layer, self.n_ctx, self.kv_types);
        let launches = m
            .kernels
            .kv_store_launch(&k.buf, &v.buf, &kc, &vc, &cfg, n, pos0)?;
        for l in launches {
            self.rec.record(&m.ctx, &m.kernels, l)?;
        }
        let scratch = self.att_scratch.clone();
        // The output projection reads `out` quantized: the split pass quantizes it on the way
        // out where it can (one chunk), saving the quantize_act launch.
        let len = n.saturating_mul(cfg.n_head * cfg.head_dim);
        let (qx, qd) = (self.qx.clone(), self.qd.clone());
        let quant = (!m.f32_activations && len <= self.q_capacity).then_some((&qx, &qd));
        let (launches, quantized) = m
            .kernels
            .attention_launches_quant(&q.buf, &kc, &vc, &scratch, &out.buf, quant, &cfg, n, pos0)?;
        for l in launches {
            self.rec.record(&m.ctx, &m.kernels, l)?;
        }
        // Else qx / qd are untouched and still hold what `quantized` says.
        if quantized {
            self.quantized = Some((out.buf.clone(), len));
        }
        Ok(())
    }

    fn glu(&mut self, gate: &mut GpuAct, up: &GpuAct, len: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        let act = m.cfg.ffn_act;
        self.written(&gate.buf);
        if !m.f32_activations && len.is_multiple_of(32) && len > 0 && len <= self.q_capacity {
            let (qx, qd) = (self.qx.clone(), self.qd.clone());
            let launch = m
                .kernels
                .swiglu_quant_launch(act, &gate.buf, &up.buf, &qx, &qd, len)?;
            self.record(launch)?;
            self.quantized = Some((gate.buf.clone(), len));
            return Ok(());
        }
        let launch = m.kernels.glu_launch(act, &gate.buf, &up.buf, len)?;
        self.record(launch)
    }

    fn add(&mut self, x: &mut GpuAct, y: &GpuAct, len: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        self.written(&x.buf);
        let launch = m
            .kernels
            .elementwise_launch(KernelKey::Add, &x.buf, &y.buf, len)?;
        self.record(launch)
    }

    fn add_scaled(&mut self, x: &mut GpuAct, y: &GpuAct, s: f32, len: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        self.written(&x.buf);
        let launch = m.kernels.add_scaled_launch(&x.buf, &y.buf, s, len)?;
        self.record(launch)
    }

    fn scale(&mut self, x: &mut GpuAct, s: f32, len: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        self.written(&x.buf);
        // The argmax ids' buffer stands in for the binding the scale mode does not read.
        let argmax_out = self.argmax_out.clone();
        let launch = m.kernels.scale_launch(&x.buf, &argmax_out, s, len)?;
        self.record(launch)
    }

    fn copy_rows(
        &mut self,
        x: &GpuAct,
        first: usize,
        n_rows: usize,
        width: usize,
        out: &mut GpuAct,
    ) -> Result<()> {
        let (start, count) = (first * width, n_rows * width);
        if start + count > x.len || count > out.len {
            return Err(Error::Gpu(format!(
                "copy of rows {first}..{} of width {width}: buffers of {} and {} values",
                first + n_rows,
                x.len,
                out.len
            )));
        }
        self.written(&out.buf);
        self.rec
            .copy(&x.buf, start as u64 * 4, &out.buf, 0, count as u64 * 4)
    }

    fn argmax(&mut self, x: &GpuAct, n_rows: usize, width: usize) -> Result<Vec<u32>> {
        if n_rows > self.max_tokens || x.len < n_rows * width {
            return Err(Error::Gpu(format!(
                "argmax of {n_rows} rows of {width}: buffer of {} values",
                x.len
            )));
        }
        let m = Arc::clone(&self.m);
        let out = self.argmax_out.clone();
        let launch = m.kernels.argmax_launch(&x.buf, &out, width, n_rows)?;
        self.record(launch)?;
        let bytes = self.read_bytes(&out, n_rows as u64 * 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn read_kv(&mut self, layer: usize, n_pos: usize, k: &mut [f32], v: &mut [f32]) -> Result<()> {
        self.kv_read(layer, n_pos, k, v)
    }

    fn write_kv(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.kv_write(layer, k, v)
    }

    fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    fn read_kv_raw(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut Vec<u8>,
        v: &mut Vec<u8>,
    ) -> Result<()> {
        self.kv_read_raw(layer, n_pos, k, v)
    }

    fn write_kv_raw(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<()> {
        self.kv_write_raw(layer, k, v)
    }

    fn drop_kv(&mut self, layer: usize) {
        self.kv_drop(layer)
    }

    fn sync(&mut self) -> Result<()> {
        let ctx = &self.m.ctx;
        self.rec.flush(ctx)?;
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| ctx.lost_or("sync", Error::Gpu(format!("wait for the GPU: {e}"))))?;
        ctx.check_uncaptured("sync")
    }
}
