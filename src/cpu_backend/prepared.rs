//! The CPU's weights prepared once at load and shared by every session of a model: matrices
//! packed for the GEMM (`cpu::PackedWeight`) and the 1-D weights dequantized to f32.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::WeightId;
use crate::config::Config;
use crate::cpu::{Isa, PackedWeight, WeightView};
use crate::cpu_backend::CpuBackend;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};

/// What the CPU backend reads instead of the mmap: packed copies of the matrices of the blocks
/// (and head) placed on the CPU, where the CPU's best ISA has a packed layout for their format
/// (matmuls of other weights read the mmap), and every 1-D weight dequantized (always, also
/// with `--no-repack` / `--stream`, which pack no matrix).
#[derive(Debug, Default)]
pub struct PreparedWeights {
    mats: HashMap<WeightId, PackedWeight>,
    /// The 1-D weights (norms, biases), each `[len] f32`, dequantized before any page is
    /// handed back: reading one from the mmap later would fault back in the whole (large)
    /// page-cache folio around it, packed neighbours included (ext4 maps up to 2 MiB per fault).
    /// Shared with each session's `CpuBackend`, which does not copy them.
    vecs: HashMap<WeightId, Arc<[f32]>>,
    /// How long packing took (part of the model's load time).
    pub time: Duration,
}

/// The matrices (not norms or biases) of blocks with `layers[l]` set, and the head's matrix
/// with `head`: `Output`, or the embedding table a tied head multiplies with.
fn matrices(cfg: &Config, layers: &[bool], head: bool) -> Vec<WeightId> {
    let mut ids = Vec::new();
    // The head first: the largest matrix, packed while little else is held, so its file pages
    // and its packed copy, both resident until it is done, do not add to the load's peak.
    if head {
        ids.push(if cfg.tied_embeddings {
            WeightId::TokEmbd
        } else {
            WeightId::Output
        });
    }
    for (l, _) in layers.iter().enumerate().filter(|(_, &on)| on) {
        if l < cfg.n_layer {
            // Expert stacks are read an expert at a time from the file, never packed whole.
            let mats = crate::backend::block_matrices(cfg, l);
            ids.extend(mats.into_iter().filter(|id| !id.is_expert_stack()));
        }
    }
    ids
}

/// A matrix's tensor and its view of the mmap: type and [ne1 rows][ne0 cols].
fn matrix(g: &Gguf, id: WeightId) -> Result<(&TensorInfo, WeightView<'_>)> {
    let t = g.require_tensor(&id.tensor_name())?;
    let (cols, rows) = match t.dims.as_slice() {
        [c, r] => (*c as usize, *r as usize),
        d => {
            return Err(Error::Tensor {
                name: t.name.clone(),
                msg: format!("has shape {d:?}, a matrix is needed"),
            })
        }
    };
    Ok((t, WeightView::new(t.ty, g.tensor_data(t), rows, cols)?))
}

impl PreparedWeights {
    /// Bytes `build` would allocate for the packed matrices with the same arguments (the memory
    /// plan counts them as anonymous CPU memory in place of those weights' mmap pages).
    pub fn bytes_for(g: &Gguf, cfg: &Config, layers: &[bool], head: bool) -> Result<u64> {
        let isa = Isa::best();
        let mut n = 0;
        for id in matrices(cfg, layers, head) {
            let (_, w) = matrix(g, id)?;
            n += PackedWeight::bytes_for(isa, w.ty, w.rows, w.cols);
        }
        Ok(n)
    }

    /// Dequantizes the model's 1-D weights and packs, on the current rayon pool, the matrices
    /// of the blocks with `layers[l]` set and with `head` the head's (none of either: the
    /// vectors only, as with `--no-repack`). With `drop_cache` (a memory budget tight enough
    /// to stream), what is read is also dropped from the page cache tensor by tensor, so the
    /// load's peak is the packed copies alone.
    pub fn build(
        g: &Gguf,
        cfg: &Config,
        layers: &[bool],
        head: bool,
        drop_cache: bool,
    ) -> Result<PreparedWeights> {
        let t0 = Instant::now();
        let isa = Isa::best();
        let mut vecs = HashMap::new();
        let mut read = Vec::new();
        for (id, dims) in crate::backend::expected_weights(cfg) {
            if let [len] = dims[..] {
                let (t, v) = CpuBackend::dequantize_vec(g, id, len)?;
                vecs.insert(id, v);
                read.push(t);
            }
        }
        // Reading a norm mapped the folio around it; what the matrices packed below do not
        // hand back, the load's prefault maps again where the mmap is still read. (After all
        // of them: a neighbour's read would map the folio again.)
        for t in read {
            g.release_pages(t);
        }
        if drop_cache {
            g.drop_file_cache();
        }
        let mut mats = HashMap::new();
        for id in matrices(cfg, layers, head) {
            let (t, w) = matrix(g, id)?;
            if let Some(p) = PackedWeight::pack(isa, &w)? {
                mats.insert(id, p);
                // The matmuls read the packed copy from now on: without this the file's pages
                // read while packing would hold the same bytes a second time.
                g.release_pages(t);
                if drop_cache {
                    g.drop_file_cache();
                }
            }
        }
        Ok(PreparedWeights {
            mats,
            vecs,
            time: t0.elapsed(),
        })
    }

    /// The names of the tensors held here, packed or dequantized: the CPU backend never reads
    /// them from the mmap, so the load does not page them in.
    pub fn tensor_names(&self) -> impl Iterator<Item = String> + '_ {
        let ids = self.mats.keys().chain(self.vecs.keys());
        ids.map(|id| id.tensor_name())
    }

    /// `id`'s dequantized values, if it is one of the model's 1-D weights.
    pub fn vec(&self, id: WeightId) -> Option<&Arc<[f32]>> {
        self.vecs.get(&id)
    }

    /// `id`'s packed copy, if it has one.
    pub fn get(&self, id: WeightId) -> Option<&PackedWeight> {
        self.mats.get(&id)
    }

    /// Bytes of the packed matrices (anonymous memory; the vectors are a few KB a layer).
    pub fn bytes(&self) -> u64 {
        self.mats.values().map(|p| p.bytes() as u64).sum()
    }
}
