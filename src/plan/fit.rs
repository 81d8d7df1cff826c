//! What each device holds for a placement, and the placement for a GPU byte budget.

use crate::ground::{Device, Placement};

use super::MemoryModel;

/// Bytes one device holds. On the CPU `weights` are pages of the memory-mapped file (clean,
/// reclaimable, re-read from storage if evicted); the rest is anonymous memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceUse {
    pub weights: u64,
    pub kv: u64,
    pub scratch: u64,
    pub staging: u64,
    /// CPU weights packed at load for the GEMM (anonymous; `weights` no longer counts the mmap
    /// pages they replace).
    pub packed: u64,
    /// Everything at once: weights + kv + scratch + staging + packed (all of it is allocated
    /// up front).
    pub peak: u64,
}

impl DeviceUse {
    /// Memory that is not file pages: what cannot be evicted and re-read.
    pub fn anonymous(&self) -> u64 {
        self.kv + self.scratch + self.staging + self.packed
    }
}

/// What each device holds when the stages run where `p` says, indexed by
/// [`Device::index`]. The KV cache of a block lives where the block runs; the embedding table
/// is held once by each device that reads it (the embedding stage, or a tied head); runtime
/// buffers exist on a device that runs at least one stage; the GPU's readback staging grows to
/// a batch's hidden state when that crosses from the GPU to the CPU. Layers of `p` beyond
/// `m.n_layer` are ignored.
pub fn account(m: &MemoryModel, p: &Placement) -> [DeviceUse; 2] {
    let mut out = [DeviceUse::default(); 2];
    for d in [Device::Cpu, Device::Gpu] {
        let u = &mut out[d.index()];
        let cpu = d == Device::Cpu;
        for (l, (&dev, &w)) in p.layers.iter().zip(&m.layer_weight_bytes).enumerate() {
            if dev == d {
                let packed = match cpu {
                    true => m.cpu_packed_layer_bytes.get(l).copied().unwrap_or(0),
                    false => 0,
                };
                u.weights += w.saturating_sub(packed);
                u.packed += packed;
                u.kv += m.kv_bytes_per_layer;
            }
        }
        if p.head == d {
            let packed = if cpu { m.cpu_packed_head_bytes } else { 0 };
            u.packed += packed;
            u.weights += match m.tied_embeddings {
                true => m.head_bytes,
                false => m.head_bytes.saturating_sub(packed),
            };
        }
        if p.embed == d || (m.tied_embeddings && p.head == d) {
            u.weights += m.embed_bytes;
        }
        if p.uses(d) {
            match d {
                Device::Cpu => u.scratch = m.cpu_scratch_bytes,
                Device::Gpu => {
                    u.scratch = m.gpu_scratch_bytes;
                    u.staging = if gpu_to_cpu(p.stages()) {
                        m.gpu_staging_bytes.max(m.gpu_transfer_bytes)
                    } else {
                        m.gpu_staging_bytes
                    };
                }
            }
        }
        u.peak = u.weights + u.kv + u.scratch + u.staging + u.packed;
    }
    out
}

/// Whether the hidden state moves from the GPU to the CPU somewhere in `stages`.
fn gpu_to_cpu(stages: impl Iterator<Item = Device>) -> bool {
    let mut prev = None;
    for s in stages {
        if prev == Some(Device::Gpu) && s == Device::Cpu {
            return true;
        }
        prev = Some(s);
    }
    false
}

/// The placement for a GPU byte budget and what it leaves to stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fit {
    pub placement: Placement,
    /// What the GPU holds for `placement` (its peak is within the budget).
    pub gpu: DeviceUse,
    /// Blocks resident on the GPU (the last `resident_layers`).
    pub resident_layers: usize,
    /// Blocks that would have to stream to the GPU each token to run every block there.
    pub streamed_layers: usize,
    /// Their weight bytes: what streaming would move per token.
    pub streamed_bytes: u64,
    /// Every stage is on the GPU.
    pub fits_all: bool,
}

/// One candidate: the last `k` blocks on the GPU, the head and the embedding where given.
struct Candidate {
    k: usize,
    head: Device,
    embed: Device,
}

impl Candidate {
    fn placement(&self, n_layer: usize) -> Placement {
        // The last k blocks on the GPU, as --gpu-layers k; the embedding and head as chosen.
        Placement {
            embed: self.embed,
            head: self.head,
            ..Placement::gpu_layers(self.k, n_layer)
        }
    }

    /// The stage devices with runs of equal devices collapsed (embed, cpu blocks, gpu blocks,
    /// head): enough for crossings and the direction of each.
    fn runs(&self, n_layer: usize) -> Vec<Device> {
        let mut seq = vec![self.embed];
        if self.k < n_layer {
            seq.push(Device::Cpu);
        }
        if self.k > 0 {
            seq.push(Device::Gpu);
        }
        seq.push(self.head);
        seq.dedup();
        seq
    }

    /// The GPU's use, as [`account`] computes it, in O(1) from the suffix sums of the block
    /// weights (`suffix[k]` = weights of the last k blocks).
    fn gpu_use(&self, m: &MemoryModel, suffix: &[u64]) -> DeviceUse {
        let head = self.head == Device::Gpu;
        let embed = self.embed == Device::Gpu;
        let mut u = DeviceUse {
            weights: suffix[self.k],
            kv: self.k as u64 * m.kv_bytes_per_layer,
            ..DeviceUse::default()
        };
        if head {
            u.weights += m.head_bytes;
        }
        if embed || (m.tied_embeddings && head) {
            u.weights += m.embed_bytes;
        }
        if self.k > 0 || head || embed {
            u.scratch = m.gpu_scratch_bytes;
            let runs = self.runs(m.n_layer);
            u.staging = if gpu_to_cpu(runs.into_iter()) {
                m.gpu_staging_bytes.max(m.gpu_transfer_bytes)
            } else {
                m.gpu_staging_bytes
            };
        }
        u.peak = u.weights + u.kv + u.scratch + u.staging;
        u
    }
}

/// The placement that keeps the most bytes each token reads (block weights and KV cache, head
/// weights) in GPU memory without the GPU's peak passing `gpu_budget`. Decode is bandwidth-
/// bound, so the bytes read from the faster memory are what a placement buys; for a block and
/// for the head, what they cost in the budget is also what they save per token.
///
/// Blocks are taken from the output side, contiguous, so the hidden state crosses to the GPU
/// once; the head (for a small model the largest matmul per token) goes to the GPU when that
/// buys more bytes, and the embedding joins the GPU only when every block is there (a tied
/// embedding then costs nothing more). Among equal byte counts the placement with fewer
/// crossings, then more GPU stages, wins. Every candidate is searched, so more budget never
/// keeps fewer bytes on the GPU.
pub fn fit(m: &MemoryModel, gpu_budget: u64) -> Fit {
    let n = m.n_layer.min(m.layer_weight_bytes.len());
    // suffix[k]: weights of the last k blocks.
    let mut suffix = vec![0u64; n + 1];
    for k in 1..=n {
        suffix[k] = suffix[k - 1] + m.layer_weight_bytes[n - k];
    }
    let mut best: Option<(u64, usize, usize, Candidate)> = None;
    for head in [Device::Cpu, Device::Gpu] {
        for k in 0..=n {
            let embeds: &[Device] = if k == n && head == Device::Gpu {
                &[Device::Cpu, Device::Gpu]
            } else {
                &[Device::Cpu]
            };
            for &embed in embeds {
                let c = Candidate { k, head, embed };
                let u = c.gpu_use(m, &suffix);
                if u.peak > gpu_budget {
                    continue;
                }
                let score = u.weights + u.kv;
                let crossings = c.runs(n).len() - 1;
                let stages =
                    k + usize::from(head == Device::Gpu) + usize::from(embed == Device::Gpu);
                let better = match &best {
                    None => true,
                    Some((s, cr, st, _)) => {
                        (score, std::cmp::Reverse(crossings), stages)
                            > (*s, std::cmp::Reverse(*cr), *st)
                    }
                };
                if better {
                    best = Some((score, crossings, stages, c));
                }
            }
        }
    }
    // The all-CPU candidate (k = 0, head and embedding on the CPU) always fits, so `best` is
    // set; the fallback only keeps this free of a panic path.
    let c = best.map_or(
        Candidate {
            k: 0,
            head: Device::Cpu,
            embed: Device::Cpu,
        },
        |b| b.3,
    );
    let placement = c.placement(n);
    let gpu = account(m, &placement)[Device::Gpu.index()];
    Fit {
        fits_all: !placement.uses(Device::Cpu),
        gpu,
        resident_layers: c.k,
        streamed_layers: n - c.k,
        streamed_bytes: suffix[n] - suffix[c.k],
        placement,
    }
}
