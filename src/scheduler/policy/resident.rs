//! Residency: which blocks keep their weights on the GPU, chosen with both phases' placements.
//!
//! A block placed on the GPU whose weights are not resident is streamed from the mmap into a
//! ring slot while the previous block runs (`crate::gpu::stream`). Its per-token cost there is
//! `max(gpu_ms, upload_ms / tokens_per_pass)`: the copy overlaps the previous stage's compute,
//! so a pass waits only for whichever is longer (the upload is `weight_bytes / upload_gbps`,
//! once per pass: per token in decode, once per batch of a prompt in prefill). A resident block
//! costs its `gpu_ms` and its weights' bytes.
//!
//! Memory: the GPU holds the resident weights, the KV cache of every block either phase runs
//! there, the embedding and head when either phase runs them there (they never stream), the
//! fixed scratch once anything is on the GPU, and the ring's slots once any GPU block is not
//! resident. The budget bounds the sum.
//!
//! Both phases read the same resident weights, so residency is one set and the objective is
//! the expected per-token time of the token mix: `share_prefill · prefill_ms + share_decode ·
//! decode_ms`, shares from the tokens each phase processed (plus a prior, see
//! `Policy::shares`). The solver is exact: a dynamic programme over the stages whose state is
//! the previous stage's device in each phase and the memory used, run once without streaming
//! (no ring) and once with the ring set aside, the better answer kept.

use super::{PolicyConfig, StageCosts, MAX_UNITS};
use crate::error::{Error, Result};
use crate::ground::{Device, PhasePlacement, Placement};

/// What residency decisions need besides [`PolicyConfig`]; with it the config's
/// `layer_gpu_bytes` are not used (a block's bytes are its weights when resident plus its KV).
#[derive(Debug, Clone, PartialEq)]
pub struct ResidencyConfig {
    /// GPU bytes of each block's weights when resident: `[n_layer]`.
    pub weight_bytes: Vec<u64>,
    /// GPU bytes of each block's KV cache when it runs on the GPU: `[n_layer]`.
    pub kv_bytes: Vec<u64>,
    /// GPU bytes of the stream ring (needed once any GPU block is not resident).
    pub ring_bytes: u64,
    /// Host-to-GPU upload bandwidth of a streamed block (repack + copy), GB/s; > 0.
    pub upload_gbps: f64,
    /// Most tokens one streamed prefill pass covers (the executor's batch): a block streams
    /// once per batch.
    pub prefill_batch: usize,
}

impl ResidencyConfig {
    pub(super) fn validate(&self, n_layer: usize) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("offload residency: {m}")));
        if self.weight_bytes.len() != n_layer || self.kv_bytes.len() != n_layer {
            return bad(format!(
                "{} weight and {} KV sizes for {n_layer} layers",
                self.weight_bytes.len(),
                self.kv_bytes.len()
            ));
        }
        if !(self.upload_gbps.is_finite() && self.upload_gbps > 0.0) {
            return bad(format!(
                "upload bandwidth {} GB/s not > 0",
                self.upload_gbps
            ));
        }
        if self.prefill_batch == 0 {
            return bad("prefill batch of 0 tokens".into());
        }
        Ok(())
    }

    /// Milliseconds to upload block `l`'s weights once.
    pub fn upload_ms(&self, l: usize) -> f64 {
        self.weight_bytes.get(l).copied().unwrap_or(0) as f64 / (self.upload_gbps * 1e6)
    }
}

/// Placements of both phases and the blocks whose weights are resident on the GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Joint {
    pub placements: PhasePlacement,
    /// `[n_layer]`: block l's weights stay on the GPU.
    pub resident: Vec<bool>,
}

/// Inputs of one joint evaluation: per-phase costs (`[prefill, decode]`), the weights of the
/// phases in the objective, and tokens per streamed pass of each phase.
#[derive(Debug, Clone, Copy)]
pub struct JointCosts<'a> {
    pub costs: [&'a StageCosts; 2],
    pub shares: [f64; 2],
    pub tokens_per_pass: [f64; 2],
}

fn inf(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else {
        x
    }
}

impl JointCosts<'_> {
    /// Per-token ms of stage `k` of phase `ph` on `d` (`resident` for blocks on the GPU).
    fn stage(&self, r: &ResidencyConfig, ph: usize, k: usize, d: Device, resident: bool) -> f64 {
        let c = self.costs[ph]
            .stages
            .get(k)
            .map_or(f64::INFINITY, |c| inf(c[d.index()]));
        let n_layer = r.weight_bytes.len();
        if d == Device::Cpu || resident || k == 0 || k > n_layer {
            return c;
        }
        let upload = r.upload_ms(k - 1) / self.tokens_per_pass[ph].max(1.0);
        c.max(upload)
    }

    /// Per-token ms of phase `ph` under `p` with `resident`.
    pub fn phase_ms(
        &self,
        r: &ResidencyConfig,
        ph: usize,
        p: &Placement,
        resident: &[bool],
    ) -> f64 {
        let n_layer = r.weight_bytes.len();
        let stage_ms: f64 = p
            .stages()
            .enumerate()
            .map(|(k, d)| {
                let res = k == 0 || k > n_layer || resident.get(k - 1).copied().unwrap_or(false);
                self.stage(r, ph, k, d, res)
            })
            .sum();
        stage_ms + inf(self.costs[ph].crossing_ms) * p.crossings() as f64
    }

    /// The objective: the shares' weighted sum of both phases' per-token ms.
    pub fn predict(&self, r: &ResidencyConfig, j: &Joint) -> f64 {
        let [sp, sd] = self.shares;
        sp * self.phase_ms(r, 0, &j.placements.prefill, &j.resident)
            + sd * self.phase_ms(r, 1, &j.placements.decode, &j.resident)
    }
}

/// GPU bytes of `j` (see the module docs).
pub fn joint_bytes(j: &Joint, cfg: &PolicyConfig, r: &ResidencyConfig) -> u64 {
    let (pp, pd) = (&j.placements.prefill, &j.placements.decode);
    let gpu = |a: Device, b: Device| a == Device::Gpu || b == Device::Gpu;
    if !pp.uses(Device::Gpu) && !pd.uses(Device::Gpu) {
        return 0;
    }
    let mut b = cfg.fixed_gpu_bytes;
    if gpu(pp.embed, pd.embed) {
        b = b.saturating_add(cfg.embed_gpu_bytes);
    }
    if gpu(pp.head, pd.head) {
        b = b.saturating_add(cfg.head_gpu_bytes);
    }
    let mut ring = false;
    for l in 0..cfg.n_layer {
        let on = pp
            .layers
            .get(l)
            .zip(pd.layers.get(l))
            .is_some_and(|(&a, &c)| gpu(a, c));
        let res = j.resident.get(l).copied().unwrap_or(false);
        if res {
            b = b.saturating_add(r.weight_bytes.get(l).copied().unwrap_or(0));
        }
        if on {
            b = b.saturating_add(r.kv_bytes.get(l).copied().unwrap_or(0));
            ring |= !res;
        }
    }
    if ring {
        b = b.saturating_add(r.ring_bytes);
    }
    b
}

/// Whether `j` may run: within the budget, and no GPU stage without a GPU.
pub fn joint_fits(j: &Joint, cfg: &PolicyConfig, r: &ResidencyConfig) -> bool {
    let uses = j.placements.prefill.uses(Device::Gpu) || j.placements.decode.uses(Device::Gpu);
    let any_res = j.resident.iter().any(|&x| x);
    if !uses && !any_res {
        return true;
    }
    cfg.gpu_available && joint_bytes(j, cfg, r) <= cfg.gpu_budget_bytes
}

/// The exact optimum of the objective within the budget (see the module docs). All-CPU with
/// nothing resident is always feasible, so there is always an answer.
pub fn solve_joint(
    jc: &JointCosts<'_>,
    cfg: &PolicyConfig,
    r: &ResidencyConfig,
) -> Result<(Joint, f64)> {
    let n = cfg.n_layer;
    r.validate(n)?;
    for c in jc.costs {
        if c.stages.len() != n + 2 {
            return Err(Error::InvalidArgument(format!(
                "solve_joint: {} stage costs for {n} layers",
                c.stages.len()
            )));
        }
    }
    let all_cpu = Joint {
        placements: PhasePlacement::same(Placement::all(Device::Cpu, n)),
        resident: vec![false; n],
    };
    let mut best = (jc.predict(r, &all_cpu), all_cpu);
    if !cfg.gpu_available || cfg.gpu_budget_bytes < cfg.fixed_gpu_bytes {
        return Ok((best.1, best.0));
    }
    for stream in [false, true] {
        let reserve = cfg.fixed_gpu_bytes + if stream { r.ring_bytes } else { 0 };
        let Some(avail) = cfg.gpu_budget_bytes.checked_sub(reserve) else {
            continue;
        };
        if let Some(j) = dp(jc, cfg, r, avail, stream) {
            let ms = jc.predict(r, &j);
            if ms < best.0 && joint_fits(&j, cfg, r) {
                best = (ms, j);
            }
        }
    }
    Ok((best.1, best.0))
}

/// One choice for a stage: device in prefill, device in decode, resident.
#[derive(Clone, Copy)]
struct Choice {
    dp: Device,
    dd: Device,
    res: bool,
}

/// The dynamic programme for `avail` bytes of stages (fixed bytes and ring set aside), with
/// or without streamed blocks.
fn dp(
    jc: &JointCosts<'_>,
    cfg: &PolicyConfig,
    r: &ResidencyConfig,
    avail: u64,
    stream: bool,
) -> Option<Joint> {
    let n = cfg.n_layer;
    let n_stage = n + 2;
    let devs = [Device::Cpu, Device::Gpu];
    // Choices and their bytes per stage.
    let mut choices: Vec<Vec<(Choice, u64)>> = Vec::with_capacity(n_stage);
    for k in 0..n_stage {
        let mut v = Vec::new();
        for dp in devs {
            for dd in devs {
                let on = dp == Device::Gpu || dd == Device::Gpu;
                if k == 0 || k == n + 1 {
                    let b = if !on {
                        0
                    } else if k == 0 {
                        cfg.embed_gpu_bytes
                    } else {
                        cfg.head_gpu_bytes
                    };
                    v.push((Choice { dp, dd, res: on }, b));
                    continue;
                }
                let l = k - 1;
                let kv = if on { r.kv_bytes[l] } else { 0 };
                if on {
                    v.push((
                        Choice { dp, dd, res: true },
                        kv.saturating_add(r.weight_bytes[l]),
                    ));
                }
                if !on || stream {
                    v.push((Choice { dp, dd, res: false }, kv));
                }
            }
        }
        choices.push(v);
    }
    let total = choices
        .iter()
        .map(|v| v.iter().map(|c| c.1).max().unwrap_or(0))
        .fold(0u64, |a, b| a.saturating_add(b));
    // Units as in `solve`: sizes round up, capacity down, so a chosen set never exceeds avail.
    let (unit, cap) = if total <= avail {
        (u64::MAX, 0usize)
    } else {
        let unit = avail.div_ceil(MAX_UNITS).max(1);
        (unit, (avail / unit) as usize)
    };
    let units = |b: u64| -> usize {
        if unit == u64::MAX {
            0
        } else {
            usize::try_from(b.div_ceil(unit)).unwrap_or(usize::MAX)
        }
    };
    let width = cap + 1;
    let [sp, sd] = jc.shares;
    let cross = [inf(jc.costs[0].crossing_ms), inf(jc.costs[1].crossing_ms)];
    // dp[s * width + u]: least cost so far with the last stage's devices s = dp + 2 dd and u
    // units used; back[(k * 4 + s) * width + u]: (previous state, choice index) of that path.
    let mut cost = vec![f64::INFINITY; 4 * width];
    let mut back = vec![(0u8, 0u8); n_stage * 4 * width];
    let state = |c: &Choice| c.dp.index() + 2 * c.dd.index();
    let here = |k: usize, c: &Choice| {
        sp * jc.stage(r, 0, k, c.dp, c.res) + sd * jc.stage(r, 1, k, c.dd, c.res)
    };
    for (ci, (c, b)) in choices[0].iter().enumerate() {
        let w = units(*b);
        if w <= cap {
            let s = state(c);
            let v = here(0, c);
            if v < cost[s * width + w] {
                cost[s * width + w] = v;
                back[s * width + w] = (0, ci as u8);
            }
        }
    }
    for k in 1..n_stage {
        let mut next = vec![f64::INFINITY; 4 * width];
        for (ci, (c, b)) in choices[k].iter().enumerate() {
            let w = units(*b);
            if w > cap {
                continue;
            }
            let s = state(c);
            let h = here(k, c);
            for prev in 0..4 {
                let (pp, pd) = (prev % 2, prev / 2);
                let mut x = h;
                if pp != c.dp.index() {
                    x += sp * cross[0];
                }
                if pd != c.dd.index() {
                    x += sd * cross[1];
                }
                for u in w..=cap {
                    let v = cost[prev * width + u - w] + x;
                    if v < next[s * width + u] {
                        next[s * width + u] = v;
                        back[(k * 4 + s) * width + u] = (prev as u8, ci as u8);
                    }
                }
            }
        }
        cost = next;
    }
    let mut end = (f64::INFINITY, 0usize, 0usize);
    for s in 0..4 {
        for u in 0..width {
            if cost[s * width + u] < end.0 {
                end = (cost[s * width + u], s, u);
            }
        }
    }
    if !end.0.is_finite() {
        return None;
    }
    let (_, mut s, mut u) = end;
    let mut picked = vec![
        Choice {
            dp: Device::Cpu,
            dd: Device::Cpu,
            res: false
        };
        n_stage
    ];
    for k in (0..n_stage).rev() {
        let (prev, ci) = back[(k * 4 + s) * width + u];
        let (c, b) = choices[k].get(ci as usize).copied()?;
        picked[k] = c;
        u = u.checked_sub(units(b))?;
        s = prev as usize;
    }
    let place = |f: fn(&Choice) -> Device| Placement {
        embed: f(&picked[0]),
        layers: picked[1..=n].iter().map(f).collect(),
        head: f(&picked[n + 1]),
    };
    Some(Joint {
        placements: PhasePlacement {
            prefill: place(|c| c.dp),
            decode: place(|c| c.dd),
        },
        resident: picked[1..=n].iter().map(|c| c.res).collect(),
    })
}
