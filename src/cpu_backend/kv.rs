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
                zeroed(bytes).ok_or_else(|| Error::OutOfMemory {
                    what: format!(
                        "KV cache of layer {l} for a context of {n_ctx} tokens ({} MiB)",
                        (k_bytes + v_bytes) >> 20
                    ),
                })
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

/// `bytes` zero bytes, or None when the allocator refuses. Asked of the allocator already
/// zeroed (calloc) rather than written: a large block comes as fresh pages that stay out of
/// the resident set until a position is written, so a session's RSS grows with the context
/// it uses, not the context it may reach (an f16 cache for 4096 positions is ~94 MB on the
/// test model, most of a short chat never touched).
fn zeroed(bytes: usize) -> Option<Vec<u8>> {
    if bytes == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(bytes).ok()?;
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `bytes` u8s (size
    // `bytes`, align 1), exactly what a Vec<u8> of capacity `bytes` owns, and all `bytes` are
    // initialized (zero).
    Some(unsafe { Vec::from_raw_parts(ptr, bytes, bytes) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_is_all_zero_and_sized() {
        for n in [0usize, 1, 31, 4096, 3 << 20] {
            let v = super::zeroed(n).unwrap();
            assert_eq!((v.len(), v.capacity()), (n, n));
            assert!(v.iter().all(|&b| b == 0), "{n}");
        }
    }
}
