//! The executor's side of the dynamic offload policy: which passes are timed, what the policy
//! may place where, and turning measured stage times into its samples.
//!
//! Every `every`-th decode pass and every prefill pass runs with each stage synchronized and
//! timed; before such a pass the policy may swap in a probe placement (one stage on the other
//! device) for that pass only. After it, the sample goes to the policy, which re-solves the
//! placement of that phase; a changed placement takes effect at the next pass of the phase
//! (the executor moves the KV rows of the layers that changed device first).

use crate::error::Result;
use crate::ground::{Device, Phase, PhasePlacement, Placement};
use crate::plan::MemoryModel;
use crate::scheduler::exec::StageTimes;
use crate::scheduler::policy::{
    joint_bytes, Decision, Joint, Policy, PolicyConfig, PolicyReport, Prior, ResidencyConfig,
    Sample,
};

/// A stage the GPU cannot hold in this run (no resident weights) gets a size over any budget.
fn unavailable(budget: u64) -> u64 {
    budget.saturating_add(1)
}

/// Rough bandwidths for the prior (GB/s): only a starting point, replaced by measurements of
/// the stages on their devices within the first samples and by probes of the others.
const PRIOR_CPU_GBPS: f64 = 10.0;
const PRIOR_GPU_GBPS: f64 = 10.0;
const PRIOR_CROSSING_MS: f64 = 0.05;
/// Host-to-GPU upload of a streamed block (repack + copy), GB/s: replaced by the stream ring's
/// measured loads after the first streamed pass.
const PRIOR_UPLOAD_GBPS: f64 = 2.0;

pub struct Dynamic {
    pub policy: Policy,
    /// Decode passes between timed passes.
    pub every: usize,
    decode_passes: usize,
    /// The placement a probe replaced for the current pass.
    restore: Option<(Phase, Placement)>,
}

impl Dynamic {
    /// A policy over the stages whose weights are resident on the GPU (`resident`): the GPU
    /// budget is what they take, so the policy moves stages among the devices without
    /// uploading anything.
    pub fn new(
        every: usize,
        mm: &MemoryModel,
        resident: &Placement,
        initial: PhasePlacement,
        gpu_available: bool,
    ) -> Result<Dynamic> {
        let kv = mm.kv_bytes_per_layer;
        let fixed = mm.gpu_scratch_bytes + mm.gpu_staging_bytes.max(mm.gpu_transfer_bytes);
        let embed = mm.embed_bytes;
        let head = mm.head_bytes
            + if mm.tied_embeddings {
                mm.embed_bytes
            } else {
                0
            };
        let mut budget = fixed;
        let on = |d: Device| d == Device::Gpu;
        if on(resident.embed) {
            budget += embed;
        }
        if on(resident.head) {
            budget += head;
        }
        for (l, &d) in resident.layers.iter().enumerate() {
            if on(d) {
                budget += mm.layer_weight_bytes.get(l).copied().unwrap_or(0) + kv;
            }
        }
        let cap = |ok: bool, b: u64| if ok { b } else { unavailable(budget) };
        let layer_bytes: Vec<u64> = resident
            .layers
            .iter()
            .enumerate()
            .map(|(l, &d)| {
                cap(
                    on(d),
                    mm.layer_weight_bytes.get(l).copied().unwrap_or(0) + kv,
                )
            })
            .collect();
        let cfg = PolicyConfig::new(
            mm.n_layer,
            cap(on(resident.embed), embed),
            layer_bytes,
            cap(on(resident.head), head),
            fixed,
            budget,
            gpu_available && resident.uses(Device::Gpu),
        );
        // Stage bytes a token reads: the embedding one row (negligible), a block its weights,
        // the head its matrix.
        let mut stage_bytes = vec![0u64];
        stage_bytes.extend(mm.layer_weight_bytes.iter().copied());
        stage_bytes.push(head);
        let prior = Prior::from_bytes(
            &stage_bytes,
            PRIOR_CPU_GBPS,
            PRIOR_GPU_GBPS,
            PRIOR_CROSSING_MS,
        )?;
        Ok(Dynamic {
            policy: Policy::new(cfg, prior, initial)?,
            every: every.max(1),
            decode_passes: 0,
            restore: None,
        })
    }

    /// A policy that also decides which blocks are resident (`--stream` with a budget and
    /// `--resample-every`): blocks are uploaded and freed by the session, the embedding and
    /// head stay where the load put them (`model_resident`; their bytes, when on the GPU, are
    /// held whatever the placement, so they count as fixed). The budget is `budget`, or what
    /// the initial state needs if that is more (the load's fit and the policy round sizes
    /// differently).
    #[allow(clippy::too_many_arguments)]
    pub fn new_managed(
        every: usize,
        mm: &MemoryModel,
        model_resident: &Placement,
        initial: PhasePlacement,
        resident: Vec<bool>,
        budget: u64,
        batch: usize,
        gpu_available: bool,
    ) -> Result<Dynamic> {
        let on = |d: Device| d == Device::Gpu;
        let head = mm.head_bytes
            + if mm.tied_embeddings && !on(model_resident.embed) {
                mm.embed_bytes
            } else {
                0
            };
        let mut fixed = mm.gpu_scratch_bytes + mm.gpu_staging_bytes.max(mm.gpu_transfer_bytes);
        if on(model_resident.embed) {
            fixed += mm.embed_bytes;
        }
        if on(model_resident.head) {
            fixed += head;
        }
        let slot = mm.layer_weight_bytes.iter().copied().max().unwrap_or(0);
        let residency = ResidencyConfig {
            weight_bytes: mm.layer_weight_bytes.clone(),
            kv_bytes: vec![mm.kv_bytes_per_layer; mm.n_layer],
            ring_bytes: crate::gpu::stream::RING_SLOTS as u64 * slot,
            upload_gbps: PRIOR_UPLOAD_GBPS,
            prefill_batch: batch.max(1),
        };
        let never = u64::MAX / 4;
        let mut cfg = PolicyConfig::new(
            mm.n_layer,
            if on(model_resident.embed) { 0 } else { never },
            vec![0; mm.n_layer],
            if on(model_resident.head) { 0 } else { never },
            fixed,
            budget,
            gpu_available,
        );
        cfg.residency = Some(residency.clone());
        let start = Joint {
            placements: initial.clone(),
            resident: resident.clone(),
        };
        cfg.gpu_budget_bytes = budget.max(joint_bytes(&start, &cfg, &residency));
        let mut stage_bytes = vec![0u64];
        stage_bytes.extend(mm.layer_weight_bytes.iter().copied());
        stage_bytes.push(mm.head_bytes);
        let prior = Prior::from_bytes(
            &stage_bytes,
            PRIOR_CPU_GBPS,
            PRIOR_GPU_GBPS,
            PRIOR_CROSSING_MS,
        )?;
        let mut policy = Policy::new(cfg, prior, initial)?;
        policy.set_resident(resident)?;
        Ok(Dynamic {
            policy,
            every: every.max(1),
            decode_passes: 0,
            restore: None,
        })
    }

    /// Called before every pass of `phase` of `n` tokens, before [`Dynamic::before`] when the
    /// pass is timed too.
    pub fn count(&mut self, phase: Phase, n: usize) {
        self.policy.count_tokens(phase, n);
    }

    /// Called before a pass of `phase`: whether to time it, and the probe placement to run it
    /// with instead of `current`, if any.
    pub fn before(&mut self, phase: Phase, current: &Placement) -> (bool, Option<Placement>) {
        let due = match phase {
            Phase::Prefill => true,
            Phase::Decode => {
                self.decode_passes += 1;
                self.decode_passes.is_multiple_of(self.every)
            }
        };
        if !due {
            return (false, None);
        }
        let probe = self.policy.probe(phase);
        if probe.is_some() {
            self.restore = Some((phase, current.clone()));
        }
        (true, probe)
    }

    /// The placement a probe displaced, to put back after the pass.
    pub fn take_restore(&mut self) -> Option<(Phase, Placement)> {
        self.restore.take()
    }

    /// Feeds a timed pass to the policy; returns its decision for that phase.
    pub fn after(&mut self, t: &StageTimes) -> Result<Decision> {
        let per_token = |ms: f64| ms / t.tokens.max(1) as f64;
        let s = Sample {
            phase: t.phase,
            source: t.source,
            tokens: t.tokens,
            embed: (t.embed.0, per_token(t.embed.1)),
            layers: t.layers.iter().map(|&(d, ms)| (d, per_token(ms))).collect(),
            head: t
                .head
                .map_or((t.embed.0, f64::NAN), |(d, ms)| (d, per_token(ms))),
            crossing_ms: (t.crossings > 0).then(|| per_token(t.crossing_ms / t.crossings as f64)),
        };
        self.policy.observe(&s)?;
        Ok(self.policy.decide(t.phase))
    }

    pub fn report(&self) -> PolicyReport {
        self.policy.report()
    }
}
