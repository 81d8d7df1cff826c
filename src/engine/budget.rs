//! The CPU path under the memory budget: what the model costs in memory, which blocks stay
//! resident, and the reader that streams the others from storage.

use std::sync::{Arc, Mutex};

use super::LoadOptions;
use crate::backend::WeightId;
use crate::config::Config;
use crate::cpu::{Isa, PackedWeight};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::kv_type::KvTypes;
use crate::memory::experts::ExpertLayout;
use crate::memory::{BlockSpan, Costs, IoMode, LayerReader, LimitSource, Residency};
use crate::scheduler::exec::BlockStream;

/// The largest forward batch in prefill when blocks stream: each streamed block is read once
/// per batch (at 7B widths, 256 tokens of activations and logits take ~0.13 GB).
pub(crate) const STREAM_BATCH: usize = 256;

/// A resident block's compute time over a streamed block's read time, for the ring depth
/// (`memory::residency::ring_depth`). Decode reads a resident block from DRAM (~20 GB/s on a
/// phone or a laptop) and a streamed one from flash (1-3 GB/s): about a tenth.
const COMPUTE_PER_READ: f64 = 0.1;

/// What the load decided about memory (`run --json`, `bench`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryReport {
    /// The memory limit found (cgroup or `MemAvailable`), when the budget came from it.
    pub limit_bytes: Option<u64>,
    pub limit_source: LimitSource,
    /// The budget planned with.
    pub budget_bytes: u64,
    pub residency: Residency,
    /// Tokens per prefill batch.
    pub prefill_batch: usize,
    /// How streamed reads bypass the page cache (`None`: nothing streams).
    pub io_mode: Option<IoMode>,
    /// The expert cache, when a mixture of experts does not fit: its experts are then the
    /// unit of residency (every block's dense part stays resident, no block streams).
    pub experts: Option<ExpertPlan>,
    /// Where the experts lie in the file, with `experts`.
    #[serde(skip)]
    pub(crate) expert_layout: Option<ExpertLayout>,
}

/// How a mixture of experts that does not fit is held (`MemoryReport::experts`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExpertPlan {
    /// Bytes the cache may hold.
    pub capacity_bytes: u64,
    /// Bytes of all the experts in the file, and how many there are.
    pub expert_bytes: u64,
    pub n_experts: usize,
    /// The dense part of every block held resident (attention, norms, router).
    pub dense_bytes: u64,
    /// The experts one decoded token of a block needs at once, held beside the cache while
    /// they run.
    pub working_bytes: u64,
}

/// Where each block's expert stacks lie in the file.
fn expert_layout(g: &Gguf, cfg: &Config, n_expert: usize) -> Result<ExpertLayout> {
    use WeightId::*;
    let mut stacks = Vec::with_capacity(cfg.n_layer);
    for l in 0..cfg.n_layer {
        let mut s = [(0u64, 0u64); 3];
        for (slot, id) in s.iter_mut().zip([GateExps(l), UpExps(l), DownExps(l)]) {
            let t = g.require_tensor(&id.tensor_name())?;
            if !t.n_bytes.is_multiple_of(n_expert as u64) {
                return Err(Error::Tensor {
                    name: t.name.clone(),
                    msg: format!("{} bytes do not split into {n_expert} experts", t.n_bytes),
                });
            }
            *slot = (t.file_offset, t.n_bytes / n_expert as u64);
        }
        stacks.push(s);
    }
    Ok(ExpertLayout { n_expert, stacks })
}

/// The plan of a mixture of experts that does not fit (`c`: its costs with whole blocks): every
/// block's dense part resident, the KV cache, scratch and head as before, the experts one
/// token of a block needs at once, and the rest of the budget for the expert cache; no block
/// streams. A budget below that working minimum is refused naming it.
fn plan_experts(
    g: &Gguf,
    cfg: &Config,
    c: &Costs,
    budget: u64,
    pack: bool,
) -> Result<(Residency, ExpertPlan, ExpertLayout)> {
    let m = cfg.moe.as_ref().ok_or_else(|| {
        Error::InvalidArgument("an expert cache needs a mixture-of-experts model".into())
    })?;
    let layout = expert_layout(g, cfg, m.n_expert)?;
    let mut dense = 0;
    for l in 0..cfg.n_layer {
        for id in crate::backend::block_matrices(cfg, l) {
            if !id.is_expert_stack() {
                dense += held_bytes(g, id, pack)?;
            }
        }
    }
    let per_expert = (0..cfg.n_layer)
        .map(|l| layout.held_bytes(l))
        .max()
        .unwrap_or(0);
    // Alive at once in decode: a block's routed experts, and as many of the next block's read
    // ahead on a guess.
    let working = per_expert * 2 * m.n_expert_used as u64;
    let need = c.fixed + c.head + dense + working;
    if budget < need {
        use crate::ground::format_size as f;
        return Err(Error::MemoryBudget {
            budget,
            minimum: need,
            detail: format!(
                "{} of KV cache, {} of runtime and scratch{}, {} of output head, {} of the \
                 blocks' dense parts (attention, router), {} for the {} experts a token uses in \
                 a block and as many read ahead for the next",
                f(c.kv),
                f(c.fixed.saturating_sub(c.kv)),
                crate::memory::residency::shared_note(c),
                f(c.head),
                f(dense),
                f(working),
                m.n_expert_used
            ),
        });
    }
    let n = cfg.n_layer;
    let residency = Residency {
        budget,
        minimum: need,
        fixed_bytes: c.fixed,
        resident: vec![true; n],
        resident_bytes: c.head + dense,
        streamed_bytes: 0,
        slots: 0,
        slot_bytes: 0,
        planned_bytes: budget,
    };
    let plan = ExpertPlan {
        capacity_bytes: budget - need,
        expert_bytes: (0..n)
            .map(|l| layout.expert_bytes(l) * m.n_expert as u64)
            .sum(),
        n_experts: n * m.n_expert,
        dense_bytes: dense,
        working_bytes: working,
    };
    Ok((residency, plan, layout))
}

/// The tensors of block `l` (`blk.l.*`).
pub(super) fn block_tensors(g: &Gguf, l: usize) -> impl Iterator<Item = &TensorInfo> {
    let prefix = format!("blk.{l}.");
    g.tensors()
        .iter()
        .filter(move |t| t.name.starts_with(&prefix))
}

/// The byte range of block `l`'s tensors in the file.
pub(super) fn block_span(g: &Gguf, l: usize) -> Option<BlockSpan> {
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for t in block_tensors(g, l) {
        lo = lo.min(t.file_offset);
        hi = hi.max(t.file_offset + t.n_bytes);
    }
    // Lazily: with no tensors hi - lo would underflow.
    (hi > lo).then(|| BlockSpan {
        layer: l,
        offset: lo,
        len: hi - lo,
    })
}

/// The span rounded out to whole 4 KiB blocks, as the reader reads it.
fn read_bytes(s: &BlockSpan) -> u64 {
    let a = 4096;
    (s.offset + s.len).div_ceil(a) * a - s.offset / a * a
}

/// Bytes of matrix `id` held in memory: packed for the GEMM when `pack` and the format has a
/// packed layout, else its file pages.
fn held_bytes(g: &Gguf, id: WeightId, pack: bool) -> Result<u64> {
    let t = g.require_tensor(&id.tensor_name())?;
    let packed = match (pack, t.dims.as_slice()) {
        (true, [c, r]) => PackedWeight::bytes_for(Isa::best(), t.ty, *r as usize, *c as usize),
        _ => 0,
    };
    Ok(if packed > 0 { packed } else { t.n_bytes })
}

/// The costs of running `cfg` on the CPU with a context of `n_ctx` and batches of `batch`.
fn costs(
    g: &Gguf,
    cfg: &Config,
    n_ctx: usize,
    kv: KvTypes,
    batch: usize,
    pack: bool,
    held: u64,
) -> Result<(Costs, Vec<BlockSpan>)> {
    use WeightId::*;
    let kv_dim = cfg.kv_dim();
    // An absurd context must be an error here, not a wrapped product that passes the budget.
    let values = n_ctx.checked_mul(kv_dim).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a context of {n_ctx} tokens is too large ({kv_dim} cache values each)"
        ))
    })?;
    let per_layer_kv = (kv.k.bytes(values) as u64).saturating_add(kv.v.bytes(values) as u64);
    let vecs: u64 = crate::backend::expected_weights(cfg)
        .iter()
        .filter_map(|(_, d)| match d[..] {
            [len] => Some(len as u64 * 4),
            _ => None,
        })
        .sum();
    // What the process holds already (binary, threads, tokenizer, metadata pages): counted
    // as measured rather than estimated; at least what another model sharing the budget
    // planned to hold (its KV cache and weights are not all resident yet).
    let now = crate::memory::limit::resident_now().unwrap_or(64 << 20);
    let runtime = now.max(held);
    let host = (batch * cfg.n_embd * 4) as u64;
    let kv = cfg.n_layer as u64 * per_layer_kv;
    let fixed = runtime + kv + crate::plan::cpu_scratch_bytes(cfg, batch) + host + vecs;
    let head = held_bytes(g, if cfg.tied_embeddings { TokEmbd } else { Output }, pack)?;
    let mut resident = Vec::with_capacity(cfg.n_layer);
    let mut spans = Vec::with_capacity(cfg.n_layer);
    for l in 0..cfg.n_layer {
        let mut b = 0;
        for id in crate::backend::block_matrices(cfg, l) {
            b += held_bytes(g, id, pack && !id.is_expert_stack())?;
        }
        resident.push(b);
        spans.push(block_span(g, l).ok_or_else(|| Error::Tensor {
            name: format!("blk.{l}"),
            msg: "has no tensors in the file".into(),
        })?);
    }
    let read = spans.iter().map(read_bytes).collect();
    Ok((
        Costs {
            fixed,
            kv,
            shared: if held > now { held } else { 0 },
            head,
            resident,
            read,
        },
        spans,
    ))
}

/// The budget for `opts`: given, else the detected limit less a margin (`None` where no
/// limit can be read: everything resident, as without a budget).
fn budget(opts: &LoadOptions) -> Option<(u64, Option<u64>, LimitSource)> {
    if let Some(b) = opts.mem_budget {
        return Some((b, None, LimitSource::Given));
    }
    let l = crate::memory::detect_limit()?;
    Some((crate::memory::budget_of(l.bytes), Some(l.bytes), l.source))
}

/// Plans the CPU's memory for a model every stage of which runs on the CPU.
pub(super) fn decide(
    g: &Gguf,
    cfg: &Config,
    opts: &LoadOptions,
    kv: KvTypes,
    pack: bool,
) -> Result<Option<(MemoryReport, Vec<BlockSpan>)>> {
    let Some((budget, limit_bytes, limit_source)) = budget(opts) else {
        return Ok(None);
    };
    let n_ctx = if opts.n_ctx == 0 {
        cfg.n_ctx_train.min(4096)
    } else {
        opts.n_ctx
    };
    let plan_for = |batch: usize| -> Result<(Residency, Vec<BlockSpan>)> {
        let (c, spans) = costs(g, cfg, n_ctx, kv, batch, pack, opts.mem_held)?;
        Ok((crate::memory::plan(&c, budget, COMPUTE_PER_READ)?, spans))
    };
    if cfg.moe.is_some() {
        // A mixture of experts that does not fit holds experts, not blocks.
        let (c, spans) = costs(g, cfg, n_ctx, kv, super::PREFILL_BATCH, pack, opts.mem_held)?;
        let all = c.fixed + c.head + c.resident.iter().sum::<u64>();
        if all > budget {
            let (residency, experts, layout) = plan_experts(g, cfg, &c, budget, pack)?;
            let report = MemoryReport {
                limit_bytes,
                limit_source,
                budget_bytes: budget,
                residency,
                prefill_batch: super::PREFILL_BATCH,
                io_mode: None,
                experts: Some(experts),
                expert_layout: Some(layout),
            };
            return Ok(Some((report, spans)));
        }
    }
    let (mut residency, mut spans) = plan_for(super::PREFILL_BATCH)?;
    let mut batch = super::PREFILL_BATCH;
    if residency.streams() {
        // A larger batch reads each streamed block fewer times per prompt, but its scratch
        // comes out of the resident set, which every decoded token pays for. The largest
        // batch that keeps as much resident as the smallest one is free; the smallest still
        // hides its reads behind its compute where a pass computes longer than it reads (64
        // tokens of a 7B model, 2 cores: ~1.6 s of compute against ~1.1 s to read 19 of its 32
        // blocks at 1.9 GB/s).
        let count = |r: &Residency| r.resident.iter().filter(|&&x| x).count();
        for b in [STREAM_BATCH, STREAM_BATCH / 2] {
            match plan_for(b) {
                Ok((r, s)) if count(&r) >= count(&residency) => {
                    (residency, spans, batch) = (r, s, b);
                    break;
                }
                _ => {}
            }
        }
    }
    Ok(Some((
        MemoryReport {
            limit_bytes,
            limit_source,
            budget_bytes: budget,
            residency,
            prefill_batch: batch,
            io_mode: None,
            experts: None,
            expert_layout: None,
        },
        spans,
    )))
}

/// The file a reader streams from.
fn file_of(g: &Gguf) -> Result<&std::path::Path> {
    g.path()
        .ok_or_else(|| Error::InvalidArgument("streaming needs a model opened from a file".into()))
}

/// Starts the reader of the streamed blocks (`spans`: every block's). The load dropped what
/// it read through the map from the page cache (`PreparedWeights::build` with `drop_cache`).
pub(super) fn start_stream(
    g: &Gguf,
    report: &mut MemoryReport,
    spans: Vec<BlockSpan>,
    mode: Option<IoMode>,
) -> Result<BlockStream> {
    let path = file_of(g)?;
    let streamed: Vec<bool> = report.residency.resident.iter().map(|&r| !r).collect();
    let order = (0..streamed.len()).filter(|&l| streamed[l]).collect();
    let reader = LayerReader::start(path, spans, order, report.residency.slots, mode)?;
    report.io_mode = Some(reader.mode());
    Ok(BlockStream {
        streamed,
        reader: Arc::new(Mutex::new(reader)),
    })
}

/// The reader a GPU's stream ring loads its blocks through (`--stream`): every block's span
/// known, the order set by the executor from the blocks each pass streams.
pub(super) fn gpu_reader(g: &Gguf, cfg: &Config, mode: Option<IoMode>) -> Result<BlockStream> {
    let path = file_of(g)?;
    let spans: Vec<BlockSpan> = (0..cfg.n_layer).filter_map(|l| block_span(g, l)).collect();
    // Two host slots: the GPU ring copies a block out of its slot as soon as it has it.
    let reader = LayerReader::start(path, spans, Vec::new(), 2, mode)?;
    Ok(BlockStream {
        streamed: vec![false; cfg.n_layer],
        reader: Arc::new(Mutex::new(reader)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_a_blocks_tensors_and_reads_round_out_to_4k() {
        use crate::gguf::writer::GgufWriter;
        use kernels_ref::GgmlType;
        let w = GgufWriter::new()
            .tensor("blk.0.a", GgmlType::F32, &[1000], vec![0u8; 4000])
            .tensor("blk.0.b", GgmlType::F32, &[10], vec![0u8; 40])
            .tensor("blk.1.a", GgmlType::F32, &[8], vec![0u8; 32]);
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        let s0 = block_span(&g, 0).unwrap();
        let a = g.tensor("blk.0.a").unwrap();
        let b = g.tensor("blk.0.b").unwrap();
        assert_eq!(s0.offset, a.file_offset);
        assert_eq!(s0.offset + s0.len, b.file_offset + b.n_bytes);
        assert!(block_span(&g, 2).is_none());
        let r = read_bytes(&BlockSpan {
            layer: 0,
            offset: 4095,
            len: 2,
        });
        assert_eq!(r, 8192);
    }
}
