//! Placement of the forward pass on devices: which stage (embedding, each transformer block,
//! output head) runs on the GPU and which on the CPU, separately for prefill and decode.
//!
//! The placement types themselves are the ground floor's (`crate::ground`); here are the pure
//! policy (`policy`), the dynamic re-decision (`dynamic`) and the executor that runs a placement
//! (`exec`).

pub mod policy;

pub mod dynamic;
pub mod exec;

use crate::ground::Placement;
pub use exec::{Exec, ExecStats, Fallback, FallbackCause, KvRebuild, StageTimes};

/// The placement for a GPU memory budget of `budget` bytes and a context of `n_ctx`
/// positions: `crate::plan::fit`'s choice (weights, KV cache, scratch and staging counted; the
/// most bytes on the GPU without exceeding the budget). With `stream`, room for the two stream
/// slots and for the KV cache of every block (all then run on the GPU) is set aside first.
/// `kv_bits`: mean bits per cached K/V value (`KvTypes::mean_bits`).
pub fn fit_budget(
    gguf: &crate::gguf::Gguf,
    cfg: &crate::config::Config,
    n_ctx: usize,
    budget: u64,
    stream: bool,
    kv_bits: f64,
) -> crate::error::Result<Placement> {
    let mm = crate::plan::MemoryModel::from_gguf(gguf, cfg, n_ctx, kv_bits)?;
    let budget = if stream {
        let slot = mm.layer_weight_bytes.iter().copied().max().unwrap_or(0);
        let reserve = 2 * slot + mm.kv_bytes_per_layer * mm.n_layer as u64;
        budget.checked_sub(reserve).ok_or_else(|| {
            crate::error::Error::InvalidArgument(format!(
                "--gpu-mem-budget of {} cannot hold the stream slots and the KV cache \
                 ({} needed before any resident weights)",
                crate::ground::format_size(budget),
                crate::ground::format_size(reserve)
            ))
        })?
    } else {
        budget
    };
    Ok(crate::plan::fit(&mm, budget).placement)
}
