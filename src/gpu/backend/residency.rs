//! Which blocks' weights a GPU session holds: the stream ring for blocks that are not
//! resident, and the policy's residency changes between tokens (upload, free).

use std::sync::Arc;

use super::GpuBackend;
use crate::backend::WeightId;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::stream::StreamRing;

impl GpuBackend {
    /// Lets blocks whose weights are not resident run here, streamed from `gguf` (the file the
    /// model was loaded from) into a ring of two block-sized slots, made now. With `source`,
    /// blocks are read from storage through the model's reader (ahead of time, out of the page
    /// cache); without it, from the mmap.
    pub fn enable_streaming(
        &mut self,
        gguf: Arc<Gguf>,
        source: Option<crate::memory::SharedReader>,
    ) -> Result<()> {
        if self.stream.is_none() {
            let m = Arc::clone(&self.m);
            let ring = m.ctx.scoped("layer streaming slots", || {
                StreamRing::new(&m.ctx, gguf, m.max_binding_bytes)
            })?;
            self.allocated += ring.bytes;
            self.stream = Some(ring);
        }
        if let Some(ring) = self.stream.as_mut() {
            ring.set_source(source);
        }
        Ok(())
    }

    /// Makes block `l`'s weights available: resident ones are; others are loaded into a
    /// stream slot (after submitting the work recorded so far, which may read that slot).
    /// Returns whether the block is streamed.
    pub fn stream_in(&mut self, l: usize) -> Result<bool> {
        if self.has_block(l) {
            return Ok(false);
        }
        let m = Arc::clone(&self.m);
        let ring = self.stream.as_ref().ok_or_else(|| {
            Error::Gpu(format!(
                "block {l}'s weights are not on the GPU and layer streaming is off"
            ))
        })?;
        if !ring.holds(l) {
            self.rec.flush(&m.ctx)?;
            if let Some(ring) = self.stream.as_mut() {
                ring.load(&m.ctx, l)?;
            }
        }
        Ok(true)
    }

    /// Whether measured passes can time this backend's stages with GPU timestamps.
    pub fn has_timestamps(&self) -> bool {
        self.timer.is_some()
    }

    /// Records a GPU timestamp after the work recorded so far; its index among the stamps
    /// since the last [`GpuBackend::read_stamps`], or None without timestamp queries.
    pub fn stamp(&mut self) -> Result<Option<u32>> {
        match self.timer.as_mut() {
            Some(t) => t.stamp(&mut self.rec).map(Some),
            None => Ok(None),
        }
    }

    /// Submits, waits, and returns the milliseconds (on the GPU's clock) of every stamp since
    /// the last read, in index order.
    pub fn read_stamps(&mut self) -> Result<Vec<f64>> {
        let Some((buf, bytes)) = self.timer.as_mut().and_then(|t| t.resolve(&mut self.rec)) else {
            return Ok(Vec::new());
        };
        let raw = self.read_bytes(&buf, bytes)?;
        Ok(self.timer.as_ref().map_or(Vec::new(), |t| t.to_ms(&raw)))
    }

    /// (blocks loaded, bytes copied, GPU bytes of the slots) of layer streaming.
    pub fn stream_stats(&self) -> Option<(u64, u64, u64)> {
        self.stream
            .as_ref()
            .map(|r| (r.n_loads, r.bytes_loaded, r.bytes))
    }

    /// Whether block `l`'s weights are resident here (the model's or this session's).
    pub fn has_block(&self, l: usize) -> bool {
        self.m.has_layer(l) || self.own.contains_key(&WeightId::Wq(l))
    }

    /// Whether this session made block `l` resident itself.
    pub fn owns_block(&self, l: usize) -> bool {
        self.own.contains_key(&WeightId::Wq(l))
    }

    /// Makes block `l`'s matrices resident in this session, uploaded from `gguf` in the same
    /// layout (and split) a stream slot uses, so the block runs the same kernels either way.
    /// No-op when it is resident already. Between passes only.
    pub fn make_resident(&mut self, l: usize, gguf: &Gguf) -> Result<()> {
        if self.has_block(l) {
            return Ok(());
        }
        let m = Arc::clone(&self.m);
        let mut added = Vec::new();
        for id in crate::gpu::stream::layer_matrices(l) {
            let w = m.ctx.scoped(&format!("upload {}", id.tensor_name()), || {
                crate::gpu::stream::upload(&m.ctx, gguf, id, m.max_binding_bytes)
            })?;
            self.allocated += crate::gpu::stream::matrix_bytes(&w);
            added.push((id, w));
        }
        self.own.extend(added);
        Ok(())
    }

    /// Frees block `l`'s session-owned matrices (it streams from now on). Submits recorded
    /// work first and forgets cached bind groups, which would keep the buffers alive.
    pub fn evict(&mut self, l: usize) -> Result<()> {
        if !self.owns_block(l) {
            return Ok(());
        }
        self.rec.flush(&self.m.ctx)?;
        for id in crate::gpu::stream::layer_matrices(l) {
            if let Some(w) = self.own.remove(&id) {
                self.allocated = self
                    .allocated
                    .saturating_sub(crate::gpu::stream::matrix_bytes(&w));
            }
        }
        self.rec.clear_cache();
        Ok(())
    }

    /// (bytes, milliseconds) of host-side stream loads so far (repack + queue write).
    pub fn stream_upload(&self) -> Option<(u64, f64)> {
        self.stream.as_ref().map(|r| (r.bytes_loaded, r.load_ms))
    }
}
