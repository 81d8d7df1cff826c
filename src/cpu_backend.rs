//! The CPU backend: `Backend` over the fast kernels in `cpu`, reading weights straight from the
//! memory map, or the model's `PreparedWeights` where it holds them: matrices packed at load
//! and the norm weights and biases (a few KB per layer) dequantized to f32.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{Backend, WeightId};
use crate::config::Config;
use crate::cpu::{MatmulScratch, WeightView};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::kv_type::KvTypes;
use crate::memory::Slot;
use kernels_ref::AttnScores;

mod f32act;
mod kv;
use f32act::matmul_f32_act;
use kernels_ref::GgmlType;
use kv::LayerKv;

mod moe;
mod prepared;
pub use prepared::PreparedWeights;

/// Where a matrix lives in the file and how it is shaped.
#[derive(Debug, Clone, Copy)]
struct MatRef {
    ty: GgmlType,
    offset: usize,
    n_bytes: usize,
    /// ne1: output features.
    rows: usize,
    /// ne0: input features.
    cols: usize,
}

pub struct CpuBackend {
    gguf: Arc<Gguf>,
    cfg: Config,
    n_ctx: usize,
    mats: HashMap<WeightId, MatRef>,
    /// Norm weights and biases as f32, [width] each (shared with `prepared` when it has them).
    vecs: HashMap<WeightId, Arc<[f32]>>,
    /// Per layer; `None` for layers that run elsewhere.
    kv: Vec<Option<LayerKv>>,
    /// Values in one layer's K (or V) cache: n_ctx * n_head_kv * head_dim.
    kv_len: usize,
    /// Element types of the K and V caches.
    kv_types: KvTypes,
    mm: MatmulScratch,
    /// The model's weights prepared at load: its packed matrices are read instead of the mmap
    /// where present (its vectors are shared into `vecs`).
    prepared: Arc<PreparedWeights>,
    /// Matmul inputs stay f32 (weights dequantized per row, f32 dot products) instead of the
    /// 8-bit activation chunks of the fast kernels: the validation mode the GPU's f32 path is
    /// compared with, since 8-bit rounding amplifies 1-ulp differences between two devices.
    f32_activations: bool,
    /// RoPE angles of the last positions rotated (shared by Q and K of every layer): [0] for
    /// the global blocks, [1] for the sliding-window ones, whose base differs (gemma3), so
    /// alternating blocks keep their tables.
    rope_cache: [crate::cpu::RopeCache; 2],
    /// `[n_layer]`: block l's matrices stream from storage (the executor hands its slot in
    /// before the block runs); empty when nothing streams.
    streamed: Vec<bool>,
    /// The stream slot holding the block now running, while it runs.
    slot: Option<Slot>,
    /// Buffers of the mixture-of-experts step.
    moe: moe::MoeScratch,
    /// The experts held under a memory budget and read on a miss (the model's, shared by its
    /// sessions); `None`: experts are read from the map.
    experts: Option<crate::memory::experts::SharedExpertCache>,
}

fn expect_shape(t: &TensorInfo, dims: &[usize]) -> Result<()> {
    let got: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    if got != dims {
        return Err(Error::Tensor {
            name: t.name.clone(),
            msg: format!("has shape {got:?}, the configuration needs {dims:?}"),
        });
    }
    Ok(())
}

impl CpuBackend {
    /// Checks that every weight exists with the right shape and a type the CPU can compute
    /// with, naming the first tensor that does not.
    pub fn check_weights(g: &Gguf, cfg: &Config) -> Result<()> {
        for (id, dims) in crate::backend::expected_weights(cfg) {
            let t = g.require_tensor(&id.tensor_name())?;
            expect_shape(t, &dims)?;
            if !t.ty.is_supported() {
                return Err(Error::UnsupportedType {
                    ty: t.ty,
                    what: t.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// A backend with a KV cache of `n_ctx` positions for every layer.
    pub fn new(gguf: Arc<Gguf>, cfg: Config, n_ctx: usize) -> Result<CpuBackend> {
        let all = vec![true; cfg.n_layer];
        Self::with_kv_layers(gguf, cfg, n_ctx, &all)
    }

    /// A backend holding f32 KV caches only for the layers with `kv_layers[l]` set (the
    /// layers placed on the CPU); others get one when a layer moves here (`write_kv`) or first
    /// runs.
    pub fn with_kv_layers(
        gguf: Arc<Gguf>,
        cfg: Config,
        n_ctx: usize,
        kv_layers: &[bool],
    ) -> Result<CpuBackend> {
        Self::with_kv_types(gguf, cfg, n_ctx, kv_layers, KvTypes::F32)
    }

    /// [`CpuBackend::with_kv_layers`] with K and V caches of the given types.
    pub fn with_kv_types(
        gguf: Arc<Gguf>,
        cfg: Config,
        n_ctx: usize,
        kv_layers: &[bool],
        kv_types: KvTypes,
    ) -> Result<CpuBackend> {
        Self::with_prepared(gguf, cfg, n_ctx, kv_layers, kv_types, Arc::default())
    }

    /// [`CpuBackend::with_kv_types`] using `prepared`'s packed matrices in the matmuls and its
    /// dequantized 1-D weights (built at load: the mmap is not read here, so the pages the
    /// load handed back stay out).
    pub fn with_prepared(
        gguf: Arc<Gguf>,
        cfg: Config,
        n_ctx: usize,
        kv_layers: &[bool],
        kv_types: KvTypes,
        prepared: Arc<PreparedWeights>,
    ) -> Result<CpuBackend> {
        Self::check_weights(&gguf, &cfg)?;
        kv_types.check_head_dim(cfg.head_dim)?;
        let mut mats = HashMap::new();
        let mut vecs = HashMap::new();
        for (id, dims) in crate::backend::expected_weights(&cfg) {
            if let [len] = dims[..] {
                let v = match prepared.vec(id) {
                    Some(v) => v.clone(),
                    None => Self::dequantize_vec(&gguf, id, len)?.1,
                };
                vecs.insert(id, v);
            } else {
                let t = gguf.require_tensor(&id.tensor_name())?;
                mats.insert(
                    id,
                    MatRef {
                        ty: t.ty,
                        offset: t.file_offset as usize,
                        n_bytes: t.n_bytes as usize,
                        // An expert stack [cols, rows, n_expert] is n_expert * rows rows.
                        rows: dims[1..].iter().product(),
                        cols: dims[0],
                    },
                );
            }
        }
        if n_ctx == 0 {
            return Err(Error::InvalidArgument(
                "context size must be at least 1".into(),
            ));
        }
        // [n_ctx, n_head_kv, head_dim] values per layer for K and for V. A context the machine
        // cannot hold is an error, not an abort inside the allocator.
        let per_layer = cfg
            .n_head_kv
            .checked_mul(n_ctx)
            .and_then(|v| v.checked_mul(cfg.head_dim))
            .filter(|&v| v.checked_mul(4 * 2 * cfg.n_layer).is_some())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("context of {n_ctx} tokens is too large"))
            })?;
        let mut b = CpuBackend {
            gguf,
            cfg,
            n_ctx,
            mats,
            vecs,
            kv: Vec::new(),
            kv_len: per_layer,
            kv_types,
            mm: MatmulScratch::default(),
            prepared,
            f32_activations: false,
            rope_cache: Default::default(),
            streamed: Vec::new(),
            slot: None,
            moe: Default::default(),
            experts: None,
        };
        b.kv = (0..b.cfg.n_layer).map(|_| None).collect();
        for (l, &on) in kv_layers.iter().enumerate().take(b.cfg.n_layer) {
            if on {
                b.alloc_kv(l)?;
            }
        }
        Ok(b)
    }

    /// The 1-D weight `id`'s tensor and its `len` values dequantized from the mmap to
    /// `[len] f32`.
    pub(crate) fn dequantize_vec(
        g: &Gguf,
        id: WeightId,
        len: usize,
    ) -> Result<(&TensorInfo, Arc<[f32]>)> {
        let t = g.require_tensor(&id.tensor_name())?;
        let v = kernels_ref::dequantize_vec(t.ty, g.tensor_data(t), len).map_err(|e| {
            Error::Tensor {
                name: t.name.clone(),
                msg: e.to_string(),
            }
        })?;
        Ok((t, v.into()))
    }

    /// Marks the blocks whose matrices stream (`[n_layer]`): their bytes come only from the
    /// slot [`CpuBackend::set_slot`] hands in, never from the mmap.
    pub fn set_streamed(&mut self, streamed: Vec<bool>) {
        self.streamed = streamed;
    }

    /// Reads the experts through `cache` instead of the map.
    pub fn set_expert_cache(&mut self, cache: crate::memory::experts::SharedExpertCache) {
        self.experts = Some(cache);
    }

    /// Hands in the slot holding a streamed block's bytes before the block runs.
    pub fn set_slot(&mut self, slot: Slot) {
        self.slot = Some(slot);
    }

    /// Takes the slot back after the block ran (to return it to the reader).
    pub fn take_slot(&mut self) -> Option<Slot> {
        self.slot.take()
    }

    /// `w`'s bytes (at `m`): from the stream slot when its block streams, else the mmap.
    fn bytes_of<'a>(
        gguf: &'a Gguf,
        slot: Option<&'a Slot>,
        streamed: &[bool],
        w: WeightId,
        m: MatRef,
    ) -> Result<&'a [u8]> {
        let Some(l) = w.layer_index().filter(|&l| streamed.get(l) == Some(&true)) else {
            return Ok(&gguf.bytes()[m.offset..m.offset + m.n_bytes]);
        };
        slot.filter(|s| s.layer() == l)
            .and_then(|s| s.bytes(m.offset as u64, m.n_bytes))
            .ok_or_else(|| Error::Tensor {
                name: w.tensor_name(),
                msg: format!("block {l} streams, but its bytes were not read in before it ran"),
            })
    }

    /// `w` (at `m`)'s view of its bytes (the mmap or the stream slot), with its packed copy if
    /// it has one. (Not a method, so the views borrow these fields only and the matmul scratch
    /// stays free.)
    fn view<'a>(
        gguf: &'a Gguf,
        prepared: &'a PreparedWeights,
        slot: Option<&'a Slot>,
        streamed: &[bool],
        w: WeightId,
        m: MatRef,
    ) -> Result<WeightView<'a>> {
        let data = Self::bytes_of(gguf, slot, streamed, w, m)?;
        let v = WeightView::new(m.ty, data, m.rows, m.cols)?;
        match prepared.get(w) {
            Some(p) => v.with_packed(p),
            None => Ok(v),
        }
    }

    /// Switches matmuls to f32 activations (see the field's comment).
    pub fn set_f32_activations(&mut self, on: bool) {
        self.f32_activations = on;
    }

    fn mat(&self, w: WeightId) -> Result<MatRef> {
        self.mats.get(&w).copied().ok_or_else(|| Error::Tensor {
            name: w.tensor_name(),
            msg: "is not a matrix of this model".into(),
        })
    }

    /// outs[i]: [n, rows_i] = x: [n, cols] · ws[i]ᵀ for weights sharing the input (Q/K/V,
    /// gate/up), as one `cpu::matmul_many` call: one activation quantization and one parallel
    /// region for all of them. With `f32_activations`, one `matmul` each.
    fn matmul_many(
        &mut self,
        ws: &[WeightId],
        x: &Vec<f32>,
        n: usize,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<()> {
        if self.f32_activations {
            for (&w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(w, x, n, out)?;
            }
            return Ok(());
        }
        let mut views = Vec::with_capacity(ws.len());
        let mut ys: Vec<&mut [f32]> = Vec::with_capacity(ws.len());
        for (&w, out) in ws.iter().zip(outs.iter_mut()) {
            let m = self.mat(w)?;
            let v = Self::view(
                &self.gguf,
                &self.prepared,
                self.slot.as_ref(),
                &self.streamed,
                w,
                m,
            )?;
            ys.push(&mut out[..n * v.rows]);
            views.push(v);
        }
        let cols = views.first().map_or(0, |v| v.cols);
        crate::cpu::matmul_many(&views, &x[..n * cols], n, &mut ys, &mut self.mm)
    }

    fn vec(&self, id: WeightId) -> Result<&[f32]> {
        self.vecs
            .get(&id)
            .map(|v| &v[..])
            .ok_or_else(|| Error::Tensor {
                name: id.tensor_name(),
                msg: "is not a vector of this model".into(),
            })
    }
}

impl Backend for CpuBackend {
    type Act = Vec<f32>;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn alloc(&mut self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn write(&mut self, dst: &mut Vec<f32>, src: &[f32]) -> Result<()> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&mut self, src: &Vec<f32>, dst: &mut [f32]) -> Result<()> {
        let n = dst.len();
        dst.copy_from_slice(&src[..n]);
        Ok(())
    }

    fn embed(&mut self, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let m = self.mats[&WeightId::TokEmbd];
        let row_bytes = m.n_bytes / m.rows;
        let table = &self.gguf.bytes()[m.offset..m.offset + m.n_bytes];
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= m.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {}",
                    m.rows
                )));
            }
            kernels_ref::dequantize(
                m.ty,
                &table[id * row_bytes..(id + 1) * row_bytes],
                &mut out[i * m.cols..(i + 1) * m.cols],
            )
            .map_err(|e| Error::Tensor {
                name: WeightId::TokEmbd.tensor_name(),
                msg: e.to_string(),
            })?;
        }
        let scale = self.cfg.embed_scale;
        if scale != 1.0 {
            out[..ids.len() * m.cols]
                .iter_mut()
                .for_each(|v| *v *= scale);
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        norm: WeightId,
        x: &Vec<f32>,
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = self.vec(norm)?;
        let width = w.len();
        crate::cpu::rms_norm(&x[..n * width], w, self.cfg.rms_eps, &mut out[..n * width])
    }

    fn matmul(&mut self, w: WeightId, x: &Vec<f32>, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let m = self.mat(w)?;
        let (slot, streamed) = (self.slot.as_ref(), &self.streamed[..]);
        let data = Self::bytes_of(&self.gguf, slot, streamed, w, m)?;
        if self.f32_activations {
            return matmul_f32_act(
                m.ty,
                data,
                m.rows,
                m.cols,
                &x[..n * m.cols],
                n,
                &mut out[..n * m.rows],
            );
        }
        let view = Self::view(&self.gguf, &self.prepared, slot, streamed, w, m)?;
        let (x, y) = (&x[..n * m.cols], &mut out[..n * m.rows]);
        crate::cpu::matmul(&view, x, n, y, &mut self.mm)
    }

    fn matmul_qkv(
        &mut self,
        l: usize,
        x: &Vec<f32>,
        n: usize,
        q: &mut Vec<f32>,
        k: &mut Vec<f32>,
        v: &mut Vec<f32>,
    ) -> Result<()> {
        use WeightId::{Wk, Wq, Wv};
        self.matmul_many(&[Wq(l), Wk(l), Wv(l)], x, n, &mut [q, k, v])
    }

    fn matmul_gate_up(
        &mut self,
        l: usize,
        x: &Vec<f32>,
        n: usize,
        g: &mut Vec<f32>,
        u: &mut Vec<f32>,
    ) -> Result<()> {
        use WeightId::{Gate, Up};
        self.matmul_many(&[Gate(l), Up(l)], x, n, &mut [g, u])
    }

    fn add_bias(&mut self, bias: WeightId, x: &mut Vec<f32>, n: usize) -> Result<()> {
        let b = self.vec(bias)?;
        for row in x[..n * b.len()].chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
        }
        Ok(())
    }

    fn rope(
        &mut self,
        layer: usize,
        x: &mut Vec<f32>,
        n: usize,
        n_heads: usize,
        pos0: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        crate::cpu::rope_tokens_cached(
            &mut self.rope_cache[usize::from(c.window(layer).is_some())],
            &mut x[..n * n_heads * c.head_dim],
            n,
            n_heads,
            c.head_dim,
            pos0,
            &c.rotation(layer, self.n_ctx),
        )
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n: usize,
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (hd, n_head, n_kv) = (self.cfg.head_dim, self.cfg.n_head, self.cfg.n_head_kv);
        let (scale, window) = (self.cfg.attn_scale, self.cfg.window(layer));
        let softcap = self.cfg.attn_logit_softcap;
        let n_ctx = self.n_ctx;
        if pos0 + n > n_ctx {
            return Err(Error::ContextOverflow {
                n_prompt: pos0 + n,
                n_ctx,
            });
        }
        let types = self.kv_types;
        let cache = self.alloc_kv(layer)?;
        // Append the new keys and values: rows pos0..pos0+n of [n_ctx, n_kv, hd], quantized
        // to the cache types.
        let row = n_kv * hd;
        let (kr, vr) = (types.k.bytes(row), types.v.bytes(row));
        types
            .k
            .quantize_into(&k[..n * row], &mut cache.k[pos0 * kr..(pos0 + n) * kr])?;
        types
            .v
            .quantize_into(&v[..n * row], &mut cache.v[pos0 * vr..(pos0 + n) * vr])?;
        use crate::cpu::KvView;
        crate::cpu::attention_kv(
            &q[..n * n_head * hd],
            KvView {
                data: &cache.k,
                ty: types.k,
            },
            KvView {
                data: &cache.v,
                ty: types.v,
            },
            n,
            pos0 + n,
            n_head,
            n_kv,
            hd,
            pos0,
            AttnScores::new(scale).window(window).softcap(softcap),
            &mut out[..n * n_head * hd],
        )
    }

    fn moe(&mut self, layer: usize, x: &Vec<f32>, n: usize, out: &mut Vec<f32>) -> Result<()> {
        self.moe_ffn(layer, x, n, out)
    }

    fn glu(&mut self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) -> Result<()> {
        let act = self.cfg.ffn_act;
        // Chunks of whole vectors, so an element's arithmetic never depends on the split.
        const CHUNK: usize = 4096;
        let (g, u) = (&mut gate[..len], &up[..len]);
        if len >= 4 * CHUNK {
            let failed = std::sync::Mutex::new(None);
            crate::cpu::par::for_each_item_init(
                g.chunks_mut(CHUNK).zip(u.chunks(CHUNK)).collect(),
                || (),
                |_, (g, u)| {
                    if let Err(e) = crate::cpu::glu_in_place(act, g, u) {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                },
            );
            match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        } else {
            crate::cpu::glu_in_place(act, g, u)
        }
    }

    fn read_kv(&mut self, layer: usize, n_pos: usize, k: &mut [f32], v: &mut [f32]) -> Result<()> {
        let len = n_pos * self.cfg.kv_dim();
        let cache = self
            .kv
            .get(layer)
            .and_then(|c| c.as_ref())
            .ok_or_else(|| Error::InvalidArgument(format!("no KV cache for layer {layer}")))?;
        if n_pos > self.n_ctx || k.len() < len || v.len() < len {
            return Err(Error::InvalidArgument(format!(
                "read of {n_pos} KV positions of layer {layer} (context {})",
                self.n_ctx
            )));
        }
        let t = self.kv_types;
        t.k.dequantize_into(&cache.k[..t.k.bytes(len)], &mut k[..len]);
        t.v.dequantize_into(&cache.v[..t.v.bytes(len)], &mut v[..len]);
        Ok(())
    }

    fn write_kv(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let n_ctx = self.n_ctx;
        let kv_dim = self.cfg.kv_dim();
        let (t, kv_len) = (self.kv_types, self.kv_len);
        let cache = self.alloc_kv(layer)?;
        if k.len() != v.len() || k.len() > kv_len || !k.len().is_multiple_of(kv_dim) {
            return Err(Error::InvalidArgument(format!(
                "write of {} K and {} V values into layer {layer}'s cache of {n_ctx} positions",
                k.len(),
                v.len()
            )));
        }
        t.k.quantize_into(k, &mut cache.k[..t.k.bytes(k.len())])?;
        t.v.quantize_into(v, &mut cache.v[..t.v.bytes(v.len())])?;
        Ok(())
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
        let len = n_pos * self.cfg.kv_dim();
        let cache = self
            .kv
            .get(layer)
            .and_then(|c| c.as_ref())
            .ok_or_else(|| Error::InvalidArgument(format!("no KV cache for layer {layer}")))?;
        if n_pos > self.n_ctx {
            return Err(Error::InvalidArgument(format!(
                "read of {n_pos} KV positions of layer {layer} (context {})",
                self.n_ctx
            )));
        }
        let t = self.kv_types;
        k.clear();
        k.extend_from_slice(&cache.k[..t.k.bytes(len)]);
        v.clear();
        v.extend_from_slice(&cache.v[..t.v.bytes(len)]);
        Ok(())
    }

    fn write_kv_raw(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<()> {
        let n_ctx = self.n_ctx;
        let kv_dim = self.cfg.kv_dim();
        let t = self.kv_types;
        let (kr, vr) = (t.k.bytes(kv_dim), t.v.bytes(kv_dim));
        let n_pos = k.len() / kr.max(1);
        let cache = self.alloc_kv(layer)?;
        if k.len() != n_pos * kr || v.len() != n_pos * vr || n_pos > n_ctx {
            return Err(Error::InvalidArgument(format!(
                "write of {} K and {} V bytes into layer {layer}'s cache of {n_ctx} positions \
                 ({kr} and {vr} bytes per position)",
                k.len(),
                v.len()
            )));
        }
        cache.k[..k.len()].copy_from_slice(k);
        cache.v[..v.len()].copy_from_slice(v);
        Ok(())
    }

    fn drop_kv(&mut self, layer: usize) {
        if let Some(slot) = self.kv.get_mut(layer) {
            *slot = None;
        }
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        x[..len]
            .iter_mut()
            .zip(&y[..len])
            .for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn add_scaled(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, s: f32, len: usize) -> Result<()> {
        x[..len].iter_mut().zip(&y[..len]).for_each(|(a, b)| {
            let sb = s * b;
            *a += sb;
        });
        Ok(())
    }

    fn scale(&mut self, x: &mut Vec<f32>, s: f32, len: usize) -> Result<()> {
        x[..len].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn copy_rows(
        &mut self,
        x: &Vec<f32>,
        first: usize,
        n_rows: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        out[..n_rows * width].copy_from_slice(&x[first * width..(first + n_rows) * width]);
        Ok(())
    }
}
