//! The executor's side of the offload policy: turning it on, feeding it timed passes and
//! applying its decisions, including which blocks this session keeps resident on the GPU.

use super::Exec;
use crate::error::{Error, Result};
use crate::ground::{Device, Phase, Placement};
use crate::scheduler::dynamic::Dynamic;
use crate::scheduler::policy::PolicyReport;

impl Exec {
    /// Lets the offload policy decide which blocks are resident (see
    /// `policy::ResidencyConfig`): `initial[l]` blocks are uploaded now (or when the GPU backend
    /// is made) and owned by this session; later decisions upload and free blocks between
    /// tokens. `budget` bounds the GPU bytes those decisions use. Call before
    /// [`Exec::enable_policy`]. Needs a GPU model without resident blocks of its own.
    pub fn manage_residency(&mut self, budget: u64, initial: Vec<bool>) -> Result<()> {
        let n = self.cfg.n_layer;
        let g = self
            .gpu_model
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("residency decisions need a GPU".into()))?;
        if initial.len() != n || (0..n).any(|l| g.has_layer(l)) {
            return Err(Error::InvalidArgument(format!(
                "residency decisions need {n} flags ({} given) and a GPU model holding no \
                 blocks itself",
                initial.len()
            )));
        }
        self.residency_budget = Some(budget);
        self.apply_residency(&initial)
    }

    /// Changes which blocks this session keeps resident (`want`, `[n_layer]`), between passes:
    /// what the policy does when it manages residency; tests call it directly. Results do not
    /// change: a resident block runs the same kernels on the same layout as a streamed one.
    pub fn set_residency(&mut self, want: &[bool]) -> Result<()> {
        if want.len() != self.cfg.n_layer {
            return Err(Error::InvalidArgument(format!(
                "residency of {} blocks for a model of {}",
                want.len(),
                self.cfg.n_layer
            )));
        }
        let pool = self.pool.clone();
        pool.install(|| self.apply_residency(want))
    }

    /// The blocks this session keeps resident itself.
    pub fn own_resident(&self) -> &[bool] {
        &self.own_resident
    }

    /// Uploads the blocks `want` marks and frees this session's others (frees first, so the
    /// GPU never holds both sets).
    pub(super) fn apply_residency(&mut self, want: &[bool]) -> Result<()> {
        let gguf = self.gguf.clone();
        if let Some((b, _)) = self.gpu.as_mut() {
            let mut changed = (0, 0);
            for (l, &w) in want.iter().enumerate() {
                if !w && b.owns_block(l) {
                    b.evict(l)?;
                    changed.1 += 1;
                    self.stats.blocks_freed += 1;
                }
            }
            for (l, &w) in want.iter().enumerate() {
                if w && !b.has_block(l) {
                    b.make_resident(l, &gguf)?;
                    changed.0 += 1;
                    self.stats.blocks_uploaded += 1;
                }
            }
            if changed != (0, 0) {
                log::info!(
                    "residency: {} blocks uploaded, {} freed ({} resident)",
                    changed.0,
                    changed.1,
                    want.iter().filter(|&&w| w).count()
                );
            }
        }
        self.own_resident = want.to_vec();
        self.enable_streaming_if_needed()
    }

    /// Turns on the dynamic offload policy: every `every`-th decode pass (and every prefill)
    /// is timed and the placement of its phase re-solved among the stages whose weights are
    /// on the GPU (sizes from `mm`, the plan of this model and context).
    pub fn enable_policy(&mut self, every: usize, mm: &crate::plan::MemoryModel) -> Result<()> {
        let resident = self.resident();
        if let Some(budget) = self.residency_budget {
            self.dynamic = Some(Dynamic::new_managed(
                every,
                mm,
                &resident,
                self.placement.clone(),
                self.own_resident.clone(),
                budget,
                self.batch,
                self.gpu_model.is_some(),
            )?);
            return Ok(());
        }
        self.dynamic = Some(Dynamic::new(
            every,
            mm,
            &resident,
            self.placement.clone(),
            self.gpu_model.is_some(),
        )?);
        Ok(())
    }

    /// The stages whose weights are resident on the GPU.
    pub fn resident(&self) -> Placement {
        let n = self.cfg.n_layer;
        let Some(g) = &self.gpu_model else {
            return Placement::all(Device::Cpu, n);
        };
        let dev = |b: bool| if b { Device::Gpu } else { Device::Cpu };
        let head_w = if self.cfg.tied_embeddings {
            crate::backend::WeightId::TokEmbd
        } else {
            crate::backend::WeightId::Output
        };
        Placement {
            embed: dev(g.has(crate::backend::WeightId::TokEmbd)),
            layers: (0..n)
                .map(|l| dev(g.has_layer(l) || self.own_resident.get(l).copied().unwrap_or(false)))
                .collect(),
            head: dev(g.has(crate::backend::WeightId::OutputNorm) && g.has(head_w)),
        }
    }

    /// The policy's report (placements, estimates, migrations), when it is on.
    pub fn policy_report(&self) -> Option<PolicyReport> {
        self.dynamic.as_ref().map(|d| d.report())
    }

    /// After a pass: puts back a probe's placement and gives a timed pass to the policy,
    /// applying its decision (the move happens at the start of the next pass).
    pub(super) fn after_pass(&mut self) -> Result<()> {
        let Some(dy) = self.dynamic.as_mut() else {
            return Ok(());
        };
        let restore = dy.take_restore();
        if let Some((phase, p)) = restore {
            *self.placement.get_mut(phase) = p;
        }
        if !std::mem::take(&mut self.timed) {
            return Ok(());
        }
        let Some(times) = self.last_times.clone() else {
            return Ok(());
        };
        let Some(dy) = self.dynamic.as_mut() else {
            return Ok(());
        };
        if let Some((bytes, ms)) = self.gpu.as_ref().and_then(|g| g.0.stream_upload()) {
            let (b0, m0) = std::mem::replace(&mut self.upload_seen, (bytes, ms));
            dy.policy.observe_upload(bytes - b0, ms - m0);
        }
        let d = dy.after(&times)?;
        if let Some(j) = d.joint.clone() {
            // Residency and both phases' placements are decided together.
            if d.changed {
                log::info!(
                    "offload policy ({:?}, {}): {}",
                    d.phase,
                    times.source,
                    d.reason
                );
            } else {
                log::debug!("offload policy ({:?}): {}", d.phase, d.reason);
            }
            if j.resident != self.own_resident {
                self.apply_residency(&j.resident)?;
            }
            for phase in [Phase::Prefill, Phase::Decode] {
                if self.placement.get(phase) != j.placements.get(phase) {
                    self.set_placement(phase, j.placements.get(phase).clone())?;
                }
            }
            return Ok(());
        }
        log::debug!(
            "offload policy: {:?} pass of {} tokens timed by {} ({:.3} ms wall)",
            times.phase,
            times.tokens,
            times.source,
            times.wall_ms
        );
        if d.changed {
            log::info!(
                "offload policy ({:?}, {}): {}",
                d.phase,
                times.source,
                d.reason
            );
            self.set_placement(d.phase, d.placement)?;
        } else {
            log::debug!("offload policy ({:?}): {}", d.phase, d.reason);
        }
        Ok(())
    }
}
