//! The CPU backend's per-layer KV caches.

use super::CpuBackend;
use crate::error::{Error, Result};

/// Layer `l`'s KV cache: K and V each [n_ctx, n_head_kv, head_dim] (position-major) in the
/// bytes of their `KvType` (rows of `kv_types.k.bytes(kv_dim)` and `kv_types.v.bytes(kv_dim)`
/// bytes), so appending a token writes one contiguous run.
pub(super) struct LayerKv {
    pub(super) k: Vec<u8>,
    pub(super) v: Vec<u8>,
}

impl CpuBackend {
    /// Allocates layer `l`'s cache if it has none (zeroed: positions past the tokens written
    /// are never read).
    pub(super) fn alloc_kv(&mut self, l: usize) -> Result<&mut LayerKv> {
        let n_layer = self.cfg.n_layer;
        let n_ctx = self.n_ctx;
        let (k_bytes, v_bytes) = (
            self.kv_types.k.bytes(self.kv_len),
            self.kv_types.v.bytes(self.kv_len),
        );
        let slot = self
            .kv
            .get_mut(l)
            .ok_or_else(|| Error::InvalidArgument(format!("layer {l} of {n_layer}")))?;
        if slot.is_none() {
            let alloc = |bytes: usize| -> Result<Vec<u8>> {
                let mut v = Vec::new();
                v.try_reserve_exact(bytes).map_err(|_| Error::OutOfMemory {
                    what: format!(
                        "KV cache of layer {l} for a context of {n_ctx} tokens ({} MiB)",
                        (k_bytes + v_bytes) >> 20
                    ),
                })?;
                v.resize(bytes, 0);
                Ok(v)
            };
            *slot = Some(LayerKv {
                k: alloc(k_bytes)?,
                v: alloc(v_bytes)?,
            });
        }
        slot.as_mut()
            .ok_or_else(|| Error::InvalidArgument(format!("no KV cache for layer {l}")))
    }
}
