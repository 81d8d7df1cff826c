//! The CPU's weights packed once at load for the GEMM (`cpu::PackedWeight`), shared by every
//! session of a model.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backend::WeightId;
use crate::config::Config;
use crate::cpu::{Isa, PackedWeight, WeightView};
use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Packed copies of the matrices of the blocks (and head) placed on the CPU, where the CPU's
/// best ISA has a packed layout for their format; matmuls of other weights read the mmap.
#[derive(Debug, Default)]
pub struct PackedWeights {
    mats: HashMap<WeightId, PackedWeight>,
    /// How long packing took (part of the model's load time).
    pub time: Duration,
}

/// The matrices (not norms or biases) of blocks with `layers[l]` set, and the head's matrix
/// with `head`: `Output`, or the embedding table a tied head multiplies with.
fn matrices(cfg: &Config, layers: &[bool], head: bool) -> Vec<WeightId> {
    use WeightId::*;
    let mut ids = Vec::new();
    for (l, _) in layers.iter().enumerate().filter(|(_, &on)| on) {
        if l < cfg.n_layer {
            ids.extend([Wq(l), Wk(l), Wv(l), Wo(l), Gate(l), Up(l), Down(l)]);
        }
    }
    if head {
        ids.push(if cfg.tied_embeddings { TokEmbd } else { Output });
    }
    ids
}

/// A weight's view of the mmap: type and [ne1 rows][ne0 cols].
fn view<'a>(g: &'a Gguf, id: WeightId) -> Result<WeightView<'a>> {
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
    WeightView::new(t.ty, g.tensor_data(t), rows, cols)
}

impl PackedWeights {
    /// Bytes `build` would allocate for the same arguments (the memory plan counts them as
    /// anonymous CPU memory in place of those weights' mmap pages).
    pub fn bytes_for(g: &Gguf, cfg: &Config, layers: &[bool], head: bool) -> Result<u64> {
        let isa = Isa::best();
        let mut n = 0;
        for id in matrices(cfg, layers, head) {
            let w = view(g, id)?;
            n += PackedWeight::bytes_for(isa, w.ty, w.rows, w.cols);
        }
        Ok(n)
    }

    /// Packs, on the current rayon pool, the matrices of the blocks with `layers[l]` set and
    /// with `head` the head's.
    pub fn build(g: &Gguf, cfg: &Config, layers: &[bool], head: bool) -> Result<PackedWeights> {
        let t0 = Instant::now();
        let isa = Isa::best();
        let mut mats = HashMap::new();
        for id in matrices(cfg, layers, head) {
            if let Some(p) = PackedWeight::pack(isa, &view(g, id)?)? {
                mats.insert(id, p);
                // The matmuls read the packed copy from now on; the load's prefault made the
                // file's pages resident, and without this they would hold the same bytes twice.
                g.release_pages(g.require_tensor(&id.tensor_name())?);
            }
        }
        Ok(PackedWeights {
            mats,
            time: t0.elapsed(),
        })
    }

    /// `id`'s packed copy, if it has one.
    pub fn get(&self, id: WeightId) -> Option<&PackedWeight> {
        self.mats.get(&id)
    }

    /// Bytes held (anonymous memory).
    pub fn bytes(&self) -> u64 {
        self.mats.values().map(|p| p.bytes() as u64).sum()
    }
}
