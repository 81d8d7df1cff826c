//! The exact placement optimum for given per-stage costs: a dynamic programme over the stages
//! (embedding, blocks, head) whose state is the device of the previous stage (a change of
//! device costs one crossing) and the GPU memory used so far.

use super::PolicyConfig;
use crate::error::{Error, Result};
use crate::ground::{Device, Placement};

/// Most memory units the dynamic programme tracks: sizes are rounded up to units of
/// `ceil(budget / MAX_UNITS)` bytes, so the table stays small (stages × 2 × 4097) whatever the
/// model size, and rounding up means a chosen placement never exceeds the budget (at worst it
/// leaves one unit per stage unused).
pub const MAX_UNITS: u64 = 4096;

/// Per-token milliseconds of every stage on each device, and of one boundary crossing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StageCosts {
    /// `[cpu_ms, gpu_ms]` (indexed by `Device::index`) per stage, in execution order:
    /// embedding, blocks 0.., head (`n_layer + 2` entries).
    pub stages: Vec<[f64; 2]>,
    /// Milliseconds per token each time the hidden state moves between devices.
    pub crossing_ms: f64,
}

impl StageCosts {
    /// Predicted per-token milliseconds of `p`: every stage on its device plus the crossings.
    /// Non-finite costs count as infinite (never preferred).
    pub fn predict(&self, p: &Placement) -> f64 {
        let stage_ms: f64 = p
            .stages()
            .zip(&self.stages)
            .map(|(d, c)| finite_or_inf(c[d.index()]))
            .sum();
        stage_ms + finite_or_inf(self.crossing_ms) * p.crossings() as f64
    }

    /// Checks the stage count and that every cost is finite and non-negative.
    pub fn validate(&self, n_layer: usize, what: &str) -> Result<()> {
        if self.stages.len() != n_layer + 2 {
            return Err(Error::InvalidArgument(format!(
                "{what}: {} stage costs for {n_layer} layers (want embed + layers + head = {})",
                self.stages.len(),
                n_layer + 2
            )));
        }
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !self.stages.iter().all(|c| ok(c[0]) && ok(c[1])) || !ok(self.crossing_ms) {
            return Err(Error::InvalidArgument(format!(
                "{what}: costs must be finite and non-negative"
            )));
        }
        Ok(())
    }
}

fn finite_or_inf(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else {
        x
    }
}

/// GPU bytes of every stage in execution order (embedding, blocks, head).
pub(crate) fn stage_gpu_bytes(cfg: &PolicyConfig) -> Vec<u64> {
    std::iter::once(cfg.embed_gpu_bytes)
        .chain(cfg.layer_gpu_bytes.iter().copied())
        .chain(std::iter::once(cfg.head_gpu_bytes))
        .collect()
}

/// GPU bytes `p` needs: its GPU stages plus the fixed scratch once any stage is on the GPU.
pub fn gpu_bytes(p: &Placement, cfg: &PolicyConfig) -> u64 {
    if !p.uses(Device::Gpu) {
        return 0;
    }
    p.stages()
        .zip(stage_gpu_bytes(cfg))
        .filter(|(d, _)| *d == Device::Gpu)
        .fold(cfg.fixed_gpu_bytes, |acc, (_, b)| acc.saturating_add(b))
}

/// Whether `p` may run: all-CPU always can; a placement using the GPU needs the GPU and must
/// fit the budget.
pub fn fits(p: &Placement, cfg: &PolicyConfig) -> bool {
    !p.uses(Device::Gpu) || (cfg.gpu_available && gpu_bytes(p, cfg) <= cfg.gpu_budget_bytes)
}

/// Builds a placement from the devices of its stages in execution order.
pub(crate) fn from_stages(devs: &[Device]) -> Option<Placement> {
    let (&embed, rest) = devs.split_first()?;
    let (&head, layers) = rest.split_last()?;
    Some(Placement {
        embed,
        layers: layers.to_vec(),
        head,
    })
}

/// Exact optimum: minimises Σ stage time on its device + `crossing_ms` × crossings subject to
/// Σ GPU bytes (+ `fixed_gpu_bytes` when any stage is on the GPU) ≤ `gpu_budget_bytes`.
/// Returns the placement and its predicted per-token milliseconds. All-CPU is always feasible,
/// so there is always an answer; with no GPU (or a budget below the fixed bytes) it is all-CPU.
pub fn solve(costs: &StageCosts, cfg: &PolicyConfig) -> Result<(Placement, f64)> {
    let n_stage = cfg.n_layer + 2;
    if costs.stages.len() != n_stage || cfg.layer_gpu_bytes.len() != cfg.n_layer {
        return Err(Error::InvalidArgument(format!(
            "solve: {} stage costs and {} layer sizes for {} layers",
            costs.stages.len(),
            cfg.layer_gpu_bytes.len(),
            cfg.n_layer
        )));
    }
    let all_cpu = Placement::all(Device::Cpu, cfg.n_layer);
    if !cfg.gpu_available || cfg.gpu_budget_bytes < cfg.fixed_gpu_bytes {
        let ms = costs.predict(&all_cpu);
        return Ok((all_cpu, ms));
    }
    let avail = cfg.gpu_budget_bytes - cfg.fixed_gpu_bytes;
    let bytes = stage_gpu_bytes(cfg);
    let total = bytes.iter().fold(0u64, |a, &b| a.saturating_add(b));
    // Memory units: when everything fits there is no constraint to track (one state); otherwise
    // sizes round UP to `unit` bytes and the capacity rounds DOWN, so Σ ceil(b/unit) ≤ cap
    // implies Σ b ≤ cap × unit ≤ avail.
    let (weights, cap): (Vec<usize>, usize) = if total <= avail {
        (vec![0; n_stage], 0)
    } else {
        let unit = avail.div_ceil(MAX_UNITS).max(1);
        let w = bytes
            .iter()
            .map(|&b| usize::try_from(b.div_ceil(unit)).unwrap_or(usize::MAX))
            .collect();
        (w, (avail / unit) as usize)
    };
    let crossing = finite_or_inf(costs.crossing_ms);
    let width = cap + 1;
    // dp[d * width + u]: least cost of the stages so far with the last on device d and u units
    // used; [2 * width]. back[(k * 2 + d) * width + u]: device of stage k - 1 on that best path.
    let mut dp = vec![f64::INFINITY; 2 * width];
    let mut back = vec![0u8; n_stage * 2 * width];
    for d in [Device::Cpu, Device::Gpu] {
        let w = if d == Device::Gpu { weights[0] } else { 0 };
        if w <= cap {
            dp[d.index() * width + w] = finite_or_inf(costs.stages[0][d.index()]);
        }
    }
    for k in 1..n_stage {
        let mut next = vec![f64::INFINITY; 2 * width];
        for d in [Device::Cpu, Device::Gpu] {
            let w = if d == Device::Gpu { weights[k] } else { 0 };
            let here = finite_or_inf(costs.stages[k][d.index()]);
            for u in w..=cap {
                let u_prev = u - w;
                let mut best = f64::INFINITY;
                let mut best_prev = 0u8;
                for p in [Device::Cpu, Device::Gpu] {
                    let mut c = dp[p.index() * width + u_prev];
                    if p != d {
                        c += crossing;
                    }
                    if c < best {
                        best = c;
                        best_prev = p.index() as u8;
                    }
                }
                next[d.index() * width + u] = best + here;
                back[(k * 2 + d.index()) * width + u] = best_prev;
            }
        }
        dp = next;
    }
    // The best end state; all-CPU (u = 0, last on CPU) is always reachable with finite CPU
    // costs, and is the fallback if every state is infinite.
    let mut best = (f64::INFINITY, Device::Cpu, 0usize);
    for d in [Device::Cpu, Device::Gpu] {
        for u in 0..width {
            let c = dp[d.index() * width + u];
            if c < best.0 {
                best = (c, d, u);
            }
        }
    }
    if !best.0.is_finite() {
        let ms = costs.predict(&all_cpu);
        return Ok((all_cpu, ms));
    }
    let (_, mut d, mut u) = best;
    let mut devs = vec![Device::Cpu; n_stage];
    for k in (0..n_stage).rev() {
        devs[k] = d;
        let prev = back[(k * 2 + d.index()) * width + u];
        if d == Device::Gpu {
            u = u.saturating_sub(weights[k]);
        }
        d = if prev == 0 { Device::Cpu } else { Device::Gpu };
    }
    let p = from_stages(&devs).unwrap_or(all_cpu);
    // Report the cost recomputed from the placement so callers compare like with like.
    let ms = costs.predict(&p);
    Ok((p, ms))
}
