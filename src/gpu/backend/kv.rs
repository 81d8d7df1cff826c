//! The GPU backend's KV cache: per layer a K and a V buffer holding `[n_ctx, n_head_kv,
//! head_dim]` in the session's cache types' GGUF layouts (`crate::kv_type`), the same bytes as
//! the CPU backend's cache of the same types. The kernels append rows quantized on the GPU
//! (`shaders/kv_store.wgsl`) and decode them inside the attention loops
//! (`shaders/kv/read.wgsl`); the host side here reads and writes whole caches: as f32 through
//! kernels-ref's quantizers and exact dequantizers (`read_kv`, `write_kv`: context shift,
//! prompt cache), or as raw blocks (`read_kv_raw`, `write_kv_raw`: moving a layer between
//! devices, lossless for every type).

use super::{storage, GpuBackend};
use crate::error::{Error, Result};
use crate::gpu::kernels::attention::kv_cache_bytes;
use crate::gpu::weights::GpuModel;
use crate::kv_type::KvTypes;

/// One layer's KV cache: K and V, each `[n_ctx, n_head_kv, head_dim]` in its type's layout
/// (`kv_cache_bytes` bytes: u32 words for the kernels).
pub(super) struct KvLayer {
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
}

/// Allocates layer `l`'s cache of `n_ctx` positions in `types`.
pub(super) fn kv_layer(m: &GpuModel, l: usize, n_ctx: usize, types: KvTypes) -> Result<KvLayer> {
    let values = n_ctx.saturating_mul(m.cfg.kv_dim());
    Ok(KvLayer {
        k: storage(m, &format!("kv.{l}.k"), kv_cache_bytes(types.k, values))?,
        v: storage(m, &format!("kv.{l}.v"), kv_cache_bytes(types.v, values))?,
    })
}

impl GpuBackend {
    /// Layer `layer`'s K and V buffers.
    pub(super) fn kv_buffers(&self, layer: usize) -> Result<(wgpu::Buffer, wgpu::Buffer)> {
        self.kv
            .get(layer)
            .and_then(|c| c.as_ref())
            .map(|c| (c.k.clone(), c.v.clone()))
            .ok_or_else(|| Error::Gpu(format!("no KV cache for layer {layer} on the GPU")))
    }

    /// Checks a read of `n_pos` positions; returns the values per cache.
    fn kv_read_len(&self, layer: usize, n_pos: usize) -> Result<usize> {
        if n_pos > self.n_ctx {
            return Err(Error::Gpu(format!(
                "read of {n_pos} KV positions of layer {layer} (context {})",
                self.n_ctx
            )));
        }
        Ok(n_pos * self.m.cfg.kv_dim())
    }

    /// `Backend::read_kv_raw`: positions 0..n_pos as stored.
    pub(super) fn kv_read_raw(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut Vec<u8>,
        v: &mut Vec<u8>,
    ) -> Result<()> {
        let (kc, vc) = self.kv_buffers(layer)?;
        let len = self.kv_read_len(layer, n_pos)?;
        let t = self.kv_types;
        for (buf, ty, dst) in [(&kc, t.k, k), (&vc, t.v, v)] {
            let bytes = ty.bytes(len);
            // Copies are in whole words; the cache buffer is rounded up to one.
            let mut got = self.read_bytes(buf, (bytes as u64).next_multiple_of(4))?;
            got.truncate(bytes);
            *dst = got;
        }
        Ok(())
    }

    /// `Backend::read_kv`: positions 0..n_pos decoded to f32 (exactly, as the CPU decodes).
    pub(super) fn kv_read(
        &mut self,
        layer: usize,
        n_pos: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<()> {
        let len = self.kv_read_len(layer, n_pos)?;
        if k.len() < len || v.len() < len {
            return Err(Error::Gpu(format!(
                "read of {n_pos} KV positions of layer {layer} into {} and {} values",
                k.len(),
                v.len()
            )));
        }
        let (mut kb, mut vb) = (Vec::new(), Vec::new());
        self.kv_read_raw(layer, n_pos, &mut kb, &mut vb)?;
        let t = self.kv_types;
        t.k.dequantize_into(&kb, &mut k[..len]);
        t.v.dequantize_into(&vb, &mut v[..len]);
        Ok(())
    }

    /// `Backend::write_kv_raw`: fills positions 0.. from caches in the stored layout,
    /// allocating the layer's cache if needed.
    pub(super) fn kv_write_raw(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<()> {
        let t = self.kv_types;
        let kv_dim = self.m.cfg.kv_dim();
        let row = (t.k.bytes(kv_dim), t.v.bytes(kv_dim));
        let n_pos = k.len() / row.0.max(1);
        if layer >= self.kv.len()
            || k.len() != n_pos * row.0
            || v.len() != n_pos * row.1
            || n_pos > self.n_ctx
        {
            return Err(Error::Gpu(format!(
                "write of {} K and {} V bytes into layer {layer}'s cache of {} positions \
                 ({} and {} bytes per position)",
                k.len(),
                v.len(),
                self.n_ctx,
                row.0,
                row.1
            )));
        }
        if self.kv[layer].is_none() {
            let c = kv_layer(&self.m, layer, self.n_ctx, t)?;
            self.allocated += c.k.size() + c.v.size();
            self.kv[layer] = Some(c);
        }
        let (kc, vc) = self.kv_buffers(layer)?;
        // Recorded work must see the old contents: submit it before the queue writes.
        self.rec.flush(&self.m.ctx)?;
        for (buf, src) in [(&kc, k), (&vc, v)] {
            // Queue writes are whole words: pad with zeros (the bytes after position n_pos
            // are not valid cache contents; the buffer holds the padded length).
            if src.is_empty() {
                continue;
            }
            let mut data = src.to_vec();
            data.resize(src.len().next_multiple_of(4), 0);
            self.m.ctx.queue.write_buffer(buf, 0, &data);
        }
        Ok(())
    }

    /// `Backend::write_kv`: quantizes k, v (`[n_pos, kv_dim]` f32) with kernels-ref's
    /// quantizers (the CPU's bytes) and writes them.
    pub(super) fn kv_write(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let kv_dim = self.m.cfg.kv_dim();
        if k.len() != v.len() || k.len() > self.n_ctx * kv_dim || !k.len().is_multiple_of(kv_dim) {
            return Err(Error::Gpu(format!(
                "write of {} K and {} V values into layer {layer}'s cache of {} positions",
                k.len(),
                v.len(),
                self.n_ctx
            )));
        }
        let t = self.kv_types;
        let mut kb = vec![0u8; t.k.bytes(k.len())];
        let mut vb = vec![0u8; t.v.bytes(v.len())];
        t.k.quantize_into(k, &mut kb)?;
        t.v.quantize_into(v, &mut vb)?;
        self.kv_write_raw(layer, &kb, &vb)
    }

    /// `Backend::drop_kv`.
    pub(super) fn kv_drop(&mut self, layer: usize) {
        if let Some(slot) = self.kv.get_mut(layer) {
            if let Some(old) = slot.take() {
                self.allocated = self.allocated.saturating_sub(old.k.size() + old.v.size());
                // Cached bind groups name the freed buffers and would keep them alive; they
                // are rebuilt on next use (a migration is between tokens, not in the loop).
                if self.rec.flush(&self.m.ctx).is_ok() {
                    self.rec.clear_cache();
                }
            }
        }
    }
}
