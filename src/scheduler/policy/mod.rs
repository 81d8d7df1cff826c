//! The dynamic offload policy: a pure component (no GPU, no engine) that is fed per-stage
//! timings measured by the executor and answers which placement each phase should run.
//!
//! The loop the executor runs every N tokens, per phase:
//! `probe` (which placement to time next: the current one, or now and then the current one with
//! one stage moved to the other device) → run and time it → `observe` → `decide` (re-solve the
//! placement exactly for the current estimates; move only when the gain beats the hysteresis).
//!
//! Estimates (see `estimate.rs`): per phase, each stage's cost on a device is its shape (cost
//! relative to the device's other stages) times the device's current speed, so the stages that
//! run on a device also tell how fast the others would run there (a throttled or recovered GPU
//! is seen through the head alone). Device-wide deviations within the noise band are smoothed
//! heavily; one beyond it in two consecutive samples is a change, taken at once.

mod estimate;
mod report;
mod resident;
mod solve;

pub use report::{DecisionReport, PhaseReport, PolicyReport, StageReport};
pub use resident::{joint_bytes, joint_fits, solve_joint, Joint, JointCosts, ResidencyConfig};
pub use solve::{fits, gpu_bytes, solve, StageCosts, MAX_UNITS};

use crate::error::{Error, Result};
use crate::ground::{Device, Phase, PhasePlacement, Placement};
use estimate::Estimator;

/// What the policy may do and how it weighs evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    pub n_layer: usize,
    /// GPU bytes each stage needs when resident there (weights + its KV cache).
    pub embed_gpu_bytes: u64,
    /// `[n_layer]`
    pub layer_gpu_bytes: Vec<u64>,
    pub head_gpu_bytes: u64,
    /// Bytes the GPU needs whatever the placement (scratch, staging) once any stage is on it.
    pub fixed_gpu_bytes: u64,
    /// Budget for all of the above; placements over it are never chosen nor probed. Each
    /// phase's placement is checked against it on its own: an executor that keeps both phases'
    /// GPU stages resident at once must leave room for the other phase in what it passes here.
    pub gpu_budget_bytes: u64,
    /// Relative predicted gain a new placement needs before it replaces the current one
    /// (0.1 = 10 % faster), in [0, 1).
    pub hysteresis: f64,
    /// Every this many samples (calls to `probe`), one stage is timed on the other device
    /// (0 = never).
    pub probe_every: usize,
    /// Weight of a new timing in a stage's running estimate (EWMA in log space), and (times
    /// k / n_stage for k stages timed) of a within-noise deviation in its device's speed; in
    /// (0, 1].
    pub smoothing: f64,
    /// Relative timing noise to treat as noise, not as a change of device speed (0.3 = a
    /// device-wide deviation beyond ±30 % in two consecutive samples is a throttle or a
    /// recovery and is taken at once); > 0.
    pub noise: f64,
    pub gpu_available: bool,
    /// When set, the policy also decides which blocks' weights stay resident on the GPU
    /// (the others stream), jointly for both phases (see `resident.rs`); `layer_gpu_bytes` is
    /// then unused.
    pub residency: Option<ResidencyConfig>,
}

impl PolicyConfig {
    /// Defaults for the tunables, tuned with the simulated cost model in tests/policy.rs:
    /// hysteresis 0.1, a probe every 4 samples, smoothing 0.6, noise band 0.3 (see the constants).
    pub fn new(
        n_layer: usize,
        embed_gpu_bytes: u64,
        layer_gpu_bytes: Vec<u64>,
        head_gpu_bytes: u64,
        fixed_gpu_bytes: u64,
        gpu_budget_bytes: u64,
        gpu_available: bool,
    ) -> PolicyConfig {
        PolicyConfig {
            n_layer,
            embed_gpu_bytes,
            layer_gpu_bytes,
            head_gpu_bytes,
            fixed_gpu_bytes,
            gpu_budget_bytes,
            hysteresis: DEFAULT_HYSTERESIS,
            probe_every: DEFAULT_PROBE_EVERY,
            smoothing: DEFAULT_SMOOTHING,
            noise: DEFAULT_NOISE,
            gpu_available,
            residency: None,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("offload policy: {m}")));
        if self.layer_gpu_bytes.len() != self.n_layer {
            return bad(format!(
                "{} layer sizes for {} layers",
                self.layer_gpu_bytes.len(),
                self.n_layer
            ));
        }
        if !(self.hysteresis.is_finite() && (0.0..1.0).contains(&self.hysteresis)) {
            return bad(format!("hysteresis {} not in [0, 1)", self.hysteresis));
        }
        if !(self.smoothing.is_finite() && self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad(format!("smoothing {} not in (0, 1]", self.smoothing));
        }
        if !(self.noise.is_finite() && self.noise > 0.0) {
            return bad(format!("noise {} not > 0", self.noise));
        }
        if let Some(r) = &self.residency {
            r.validate(self.n_layer)?;
        }
        Ok(())
    }
}

/// Relative gain needed to migrate: above the few-percent error the smoothed estimates keep
/// under ±20 % per-measurement noise, so a near-tie never flips back and forth.
pub const DEFAULT_HYSTERESIS: f64 = 0.1;
/// A probe every 4 samples keeps the other device's estimates fresh at ≤ 1/4 of samples
/// running one stage on a possibly slower device.
pub const DEFAULT_PROBE_EVERY: usize = 4;
/// EWMA weight of a stage's timing in its shape, and (times k / n_stage for k stages timed)
/// of a within-noise device-wide deviation in the device scale. The trade-off: larger tracks
/// real small drifts faster but passes more noise into the estimates (one stage's steady-state
/// spread is ≈ σ·√(s/(2 − s)), 7.5 % at 0.6 for ±20 % uniform noise, σ = 11.5 %), which the
/// hysteresis must cover. Large changes (throttling) do not depend on it: they are taken at
/// the second consecutive sample beyond the noise band. In tests/policy.rs 0.6 and 0.8 pass
/// everything; 1.0 lets near-ties flip up to 4 times in 200 noisy samples; 0.4 learns a wrong
/// prior's stage shapes too slowly from probes.
pub const DEFAULT_SMOOTHING: f64 = 0.6;
/// Pseudo-tokens each phase starts with in the residency objective's shares: before much has
/// run, neither phase's needs are ignored (one short prompt would otherwise make the first
/// decision prefill-only); after a few hundred tokens the observed mix dominates.
pub const PRIOR_SHARE_TOKENS: f64 = 64.0;
/// Device-wide deviations beyond ±30 % are changes: well above ±20 % timing noise (plus the few
/// percent the estimate itself is off), well below a 2× throttle (whose observations stay
/// beyond ln 1.3 even with ±20 % noise: 1.6 / 1.07 > 1.3).
pub const DEFAULT_NOISE: f64 = 0.3;

/// Which clock timed a sample's GPU stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeSource {
    /// GPU timestamp queries around each GPU stage (the GPU's execution time, no host sync
    /// per stage); CPU stages and crossings are still timed by the wall clock.
    GpuTimestamps,
    /// The host's wall clock with the device synchronized after each stage (adapters without
    /// timestamp queries).
    WallClock,
}

impl std::fmt::Display for TimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeSource::GpuTimestamps => "gpu timestamps",
            TimeSource::WallClock => "wall clock",
        })
    }
}

/// One timed sample: per-token milliseconds per stage on the device it ran on this time.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub phase: Phase,
    /// How the GPU stages were timed.
    pub source: TimeSource,
    /// Tokens the sample covered (the timings are already per token).
    pub tokens: usize,
    pub embed: (Device, f64),
    /// `[n_layer]`
    pub layers: Vec<(Device, f64)>,
    pub head: (Device, f64),
    /// Milliseconds per boundary crossing per token (None when no crossing happened).
    pub crossing_ms: Option<f64>,
}

/// Initial per-device per-stage cost estimates for each phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Prior {
    pub prefill: StageCosts,
    pub decode: StageCosts,
}

impl Prior {
    pub fn new(prefill: StageCosts, decode: StageCosts) -> Prior {
        Prior { prefill, decode }
    }

    /// The bandwidth floor: a stage reads `stage_bytes` (weights + KV cache) per token, so it
    /// takes bytes / bandwidth on each device; `stage_bytes` is `[n_layer + 2]` (embedding,
    /// blocks, head). Prefill gets the same estimate: it is compute-bound and faster per token,
    /// but its first samples correct that, and only relative costs matter to the choice.
    pub fn from_bytes(
        stage_bytes: &[u64],
        cpu_gbps: f64,
        gpu_gbps: f64,
        crossing_ms: f64,
    ) -> Result<Prior> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        if !ok(cpu_gbps) || !ok(gpu_gbps) {
            return Err(Error::InvalidArgument(format!(
                "offload prior: bandwidths {cpu_gbps} / {gpu_gbps} GB/s must be positive"
            )));
        }
        // bytes / (GB/s · 1e9) s = bytes / (GB/s · 1e6) ms
        let ms = |b: u64, gbps: f64| b as f64 / (gbps * 1e6);
        let costs = StageCosts {
            stages: stage_bytes
                .iter()
                .map(|&b| [ms(b, cpu_gbps), ms(b, gpu_gbps)])
                .collect(),
            crossing_ms,
        };
        Ok(Prior::new(costs.clone(), costs))
    }

    fn get(&self, phase: Phase) -> &StageCosts {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }
}

/// The outcome of one `decide`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Decision {
    pub phase: Phase,
    /// Samples of this phase observed when the decision was made.
    pub sample: usize,
    /// The placement in force after the decision.
    pub placement: Placement,
    pub changed: bool,
    /// Predicted per-token ms of the placement in force after the decision.
    pub predicted_ms: f64,
    /// Predicted per-token ms of the placement in force before it (same estimates).
    pub current_predicted_ms: f64,
    /// One line for `-v` logs.
    pub reason: String,
    /// With residency decisions: both phases' placements and the resident blocks in force
    /// after the decision (the executor applies all of it); `predicted_ms` is then the
    /// objective (both phases weighted by their token shares).
    pub joint: Option<Joint>,
}

/// Per-phase state: estimates, counters, probe cursor.
#[derive(Debug, Clone)]
struct PhaseState {
    est: Estimator,
    samples: usize,
    probe_calls: usize,
    probes: usize,
    probe_cursor: usize,
    last: Option<Decision>,
    /// The clock of the latest sample.
    source: Option<TimeSource>,
}

/// The dynamic offload policy (see the module docs).
#[derive(Debug, Clone)]
pub struct Policy {
    cfg: PolicyConfig,
    current: PhasePlacement,
    phases: [PhaseState; 2],
    history: Vec<Decision>,
    /// `[n_layer]`: blocks whose weights are resident (residency mode only).
    resident: Vec<bool>,
    /// Tokens each phase processed (`count_tokens`), `[prefill, decode]`.
    tokens: [u64; 2],
    /// Mean tokens of the prefill samples (a streamed block loads once per batch of them).
    prefill_tokens: f64,
}

/// Whether `p` may run as `phase`'s placement beside the other phase's and the resident set.
fn phase_fits(
    cfg: &PolicyConfig,
    current: &PhasePlacement,
    resident: &[bool],
    phase: Phase,
    p: &Placement,
) -> bool {
    match &cfg.residency {
        None => fits(p, cfg),
        Some(r) => {
            let mut placements = current.clone();
            *placements.get_mut(phase) = p.clone();
            let j = Joint {
                placements,
                resident: resident.to_vec(),
            };
            joint_fits(&j, cfg, r)
        }
    }
}

impl Policy {
    /// Errors when the config is inconsistent, the prior or the initial placements do not
    /// match `n_layer`, or an initial placement does not fit (over budget, GPU unavailable).
    pub fn new(cfg: PolicyConfig, prior: Prior, initial: PhasePlacement) -> Result<Policy> {
        cfg.validate()?;
        for phase in [Phase::Prefill, Phase::Decode] {
            prior.get(phase).validate(cfg.n_layer, "offload prior")?;
            let p = initial.get(phase);
            if p.layers.len() != cfg.n_layer {
                return Err(Error::InvalidArgument(format!(
                    "offload policy: initial {phase:?} placement has {} layers, want {}",
                    p.layers.len(),
                    cfg.n_layer
                )));
            }
            if cfg.residency.is_none() && !fits(p, &cfg) {
                return Err(Error::InvalidArgument(format!(
                    "offload policy: initial {phase:?} placement {} needs {} GPU bytes, budget \
                     {} (GPU available: {})",
                    p.compact(),
                    gpu_bytes(p, &cfg),
                    cfg.gpu_budget_bytes,
                    cfg.gpu_available
                )));
            }
        }
        let state = |phase| PhaseState {
            est: Estimator::new(prior.get(phase)),
            samples: 0,
            probe_calls: 0,
            probes: 0,
            probe_cursor: 0,
            last: None,
            source: None,
        };
        let mut pol = Policy {
            phases: [state(Phase::Prefill), state(Phase::Decode)],
            resident: vec![false; cfg.n_layer],
            cfg,
            current: initial,
            history: Vec::new(),
            tokens: [0; 2],
            prefill_tokens: 0.0,
        };
        if pol.cfg.residency.is_some() {
            pol.set_resident(vec![false; pol.cfg.n_layer])?;
        }
        Ok(pol)
    }

    /// Residency mode: the blocks whose weights are resident now (`[n_layer]`). Errors when
    /// the length is wrong or the placements in force with it do not fit.
    pub fn set_resident(&mut self, resident: Vec<bool>) -> Result<()> {
        let Some(r) = &self.cfg.residency else {
            return Err(Error::InvalidArgument(
                "offload policy: residency is not on".into(),
            ));
        };
        let j = Joint {
            placements: self.current.clone(),
            resident,
        };
        if j.resident.len() != self.cfg.n_layer || !joint_fits(&j, &self.cfg, r) {
            return Err(Error::InvalidArgument(format!(
                "offload policy: {} resident blocks with placements {} / {} need {} GPU bytes, \
                 budget {} (GPU available: {})",
                j.resident.iter().filter(|&&x| x).count(),
                j.placements.prefill,
                j.placements.decode,
                joint_bytes(&j, &self.cfg, r),
                self.cfg.gpu_budget_bytes,
                self.cfg.gpu_available
            )));
        }
        self.resident = j.resident;
        Ok(())
    }

    /// Residency mode: the resident blocks (all false otherwise).
    pub fn resident(&self) -> &[bool] {
        &self.resident
    }

    /// Counts `n` tokens processed by a pass of `phase` (timed or not): the residency
    /// objective weighs the phases by these.
    pub fn count_tokens(&mut self, phase: Phase, n: usize) {
        self.tokens[phase.index()] += n as u64;
    }

    /// The weights of prefill and decode in the residency objective: each phase's tokens plus
    /// [`PRIOR_SHARE_TOKENS`], over the total.
    pub fn shares(&self) -> [f64; 2] {
        let p = self.tokens[0] as f64 + PRIOR_SHARE_TOKENS;
        let d = self.tokens[1] as f64 + PRIOR_SHARE_TOKENS;
        [p / (p + d), d / (p + d)]
    }

    /// Measured host-to-GPU upload of streamed blocks: `bytes` in `ms`; folds into the
    /// residency model's bandwidth (EWMA with the smoothing weight). Ignored outside
    /// residency mode or for empty or non-finite measurements.
    pub fn observe_upload(&mut self, bytes: u64, ms: f64) {
        let s = self.cfg.smoothing;
        if let Some(r) = self.cfg.residency.as_mut() {
            if bytes > 0 && ms.is_finite() && ms > 0.0 {
                let gbps = bytes as f64 / (ms * 1e6);
                r.upload_gbps = (r.upload_gbps.ln() * (1.0 - s) + gbps.ln() * s).exp();
            }
        }
    }

    /// The joint costs the residency objective weighs.
    fn joint_costs(&self) -> JointCosts<'_> {
        let batch = self.cfg.residency.as_ref().map_or(1, |r| r.prefill_batch) as f64;
        JointCosts {
            costs: [self.phases[0].est.costs(), self.phases[1].est.costs()],
            shares: self.shares(),
            tokens_per_pass: [self.prefill_tokens.clamp(1.0, batch), 1.0],
        }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// The placement in force for `phase`.
    pub fn placement(&self, phase: Phase) -> &Placement {
        self.current.get(phase)
    }

    pub fn placements(&self) -> &PhasePlacement {
        &self.current
    }

    /// Current per-stage `[cpu_ms, gpu_ms]` estimates and crossing cost of `phase`.
    pub fn estimates(&self, phase: Phase) -> &StageCosts {
        self.phases[phase.index()].est.costs()
    }

    /// Decisions that changed a placement (migrations), oldest first.
    pub fn history(&self) -> &[Decision] {
        &self.history
    }

    /// The latest decision for `phase`, changed or not.
    pub fn last_decision(&self, phase: Phase) -> Option<&Decision> {
        self.phases[phase.index()].last.as_ref()
    }

    /// Folds a timed sample into the estimates. Errors (and changes nothing) when the sample
    /// has the wrong number of layers or no tokens; negative or non-finite timings are skipped.
    pub fn observe(&mut self, s: &Sample) -> Result<()> {
        if s.layers.len() != self.cfg.n_layer || s.tokens == 0 {
            return Err(Error::InvalidArgument(format!(
                "offload sample: {} layers and {} tokens (want {} layers, > 0 tokens)",
                s.layers.len(),
                s.tokens,
                self.cfg.n_layer
            )));
        }
        let regular: Vec<Device> = self.current.get(s.phase).stages().collect();
        let timed: Vec<(Device, f64)> = std::iter::once(s.embed)
            .chain(s.layers.iter().copied())
            .chain(std::iter::once(s.head))
            .collect();
        let st = &mut self.phases[s.phase.index()];
        st.est.observe(
            &timed,
            &regular,
            s.crossing_ms,
            self.cfg.smoothing,
            self.cfg.noise,
        );
        st.samples += 1;
        st.source = Some(s.source);
        if s.phase == Phase::Prefill {
            let n = st.samples as f64;
            self.prefill_tokens += (s.tokens as f64 - self.prefill_tokens) / n;
        }
        Ok(())
    }

    /// Re-solves `phase` for the current estimates and migrates when the optimum beats the
    /// current placement's prediction by more than the hysteresis.
    pub fn decide(&mut self, phase: Phase) -> Decision {
        if self.cfg.residency.is_some() {
            return self.decide_joint(phase);
        }
        let st = &self.phases[phase.index()];
        let current = self.current.get(phase).clone();
        let costs = st.est.costs();
        let current_ms = costs.predict(&current);
        let h = self.cfg.hysteresis;
        let (placement, predicted_ms, changed, reason) = match solve(costs, &self.cfg) {
            Ok((best, best_ms)) => {
                let gain = if current_ms > 0.0 {
                    1.0 - best_ms / current_ms
                } else {
                    0.0
                };
                // A placement that stopped fitting (the GPU was lost) is left whatever the gain.
                let must = !fits(&current, &self.cfg);
                if best != current && (must || gain > h) {
                    let why = if must {
                        "current no longer fits".to_string()
                    } else {
                        format!("gain {:.1}% > hysteresis {:.1}%", gain * 100.0, h * 100.0)
                    };
                    let r = format!(
                        "{phase:?}: migrate {current} ({current_ms:.3} ms/tok) -> {best} \
                         ({best_ms:.3} ms/tok): {why}"
                    );
                    (best, best_ms, true, r)
                } else {
                    let r = if best == current {
                        format!("{phase:?}: keep {current} ({current_ms:.3} ms/tok): optimal")
                    } else {
                        format!(
                            "{phase:?}: keep {current} ({current_ms:.3} ms/tok): best {best} \
                             ({best_ms:.3} ms/tok) gains {:.1}% <= hysteresis {:.1}%",
                            gain * 100.0,
                            h * 100.0
                        )
                    };
                    (current, current_ms, false, r)
                }
            }
            Err(e) => {
                let r = format!("{phase:?}: keep {current}: {e}");
                (current, current_ms, false, r)
            }
        };
        let d = Decision {
            phase,
            sample: st.samples,
            placement: placement.clone(),
            changed,
            predicted_ms,
            current_predicted_ms: current_ms,
            reason,
            joint: None,
        };
        *self.current.get_mut(phase) = placement;
        if changed {
            self.history.push(d.clone());
        }
        self.phases[phase.index()].last = Some(d.clone());
        d
    }

    /// Residency mode: re-solves both phases' placements and the resident set for the
    /// objective; moves when the optimum beats the current state by more than the hysteresis
    /// (or the current state no longer fits).
    fn decide_joint(&mut self, phase: Phase) -> Decision {
        let Some(r) = self.cfg.residency.clone() else {
            return self.keep(phase, 0.0, "residency is off".into());
        };
        let jc = self.joint_costs();
        let cur = Joint {
            placements: self.current.clone(),
            resident: self.resident.clone(),
        };
        let cur_ms = jc.predict(&r, &cur);
        let h = self.cfg.hysteresis;
        let n_res = |j: &Joint| j.resident.iter().filter(|&&x| x).count();
        let show = |j: &Joint| {
            format!(
                "prefill {} decode {} resident {}/{}",
                j.placements.prefill,
                j.placements.decode,
                n_res(j),
                j.resident.len()
            )
        };
        let [sp, sd] = jc.shares;
        let (best, best_ms) = match solve_joint(&jc, &self.cfg, &r) {
            Ok(x) => x,
            Err(e) => return self.keep(phase, cur_ms, format!("{phase:?}: keep: {e}")),
        };
        let gain = if cur_ms > 0.0 {
            1.0 - best_ms / cur_ms
        } else {
            0.0
        };
        let must = !joint_fits(&cur, &self.cfg, &r);
        let (next, ms, changed, reason) = if best != cur && (must || gain > h) {
            let why = if must {
                "current no longer fits".to_string()
            } else {
                format!("gain {:.1}% > hysteresis {:.1}%", gain * 100.0, h * 100.0)
            };
            let reason = format!(
                "migrate {} ({cur_ms:.3} ms/tok) -> {} ({best_ms:.3} ms/tok, shares prefill \
                 {sp:.2} decode {sd:.2}): {why}",
                show(&cur),
                show(&best)
            );
            (best, best_ms, true, reason)
        } else {
            let reason = if best == cur {
                format!("keep {} ({cur_ms:.3} ms/tok): optimal", show(&cur))
            } else {
                format!(
                    "keep {} ({cur_ms:.3} ms/tok): best {} ({best_ms:.3} ms/tok) gains \
                     {:.1}% <= hysteresis {:.1}%",
                    show(&cur),
                    show(&best),
                    gain * 100.0,
                    h * 100.0
                )
            };
            (cur, cur_ms, false, reason)
        };
        let d = Decision {
            phase,
            sample: self.phases[phase.index()].samples,
            placement: next.placements.get(phase).clone(),
            changed,
            predicted_ms: ms,
            current_predicted_ms: cur_ms,
            reason: format!("{phase:?}: {reason}"),
            joint: Some(next.clone()),
        };
        self.current = next.placements;
        self.resident = next.resident;
        if changed {
            self.history.push(d.clone());
        }
        self.phases[phase.index()].last = Some(d.clone());
        d
    }

    /// A decision that changes nothing.
    fn keep(&mut self, phase: Phase, ms: f64, reason: String) -> Decision {
        let joint = self.cfg.residency.as_ref().map(|_| Joint {
            placements: self.current.clone(),
            resident: self.resident.clone(),
        });
        let d = Decision {
            phase,
            sample: self.phases[phase.index()].samples,
            placement: self.current.get(phase).clone(),
            changed: false,
            predicted_ms: ms,
            current_predicted_ms: ms,
            reason,
            joint,
        };
        self.phases[phase.index()].last = Some(d.clone());
        d
    }

    /// Call once before each timed sample of `phase`: every `probe_every`-th call returns the
    /// placement to run that sample with instead of the current one, which is the current one
    /// with one stage on the other device (round-robin over stages); a stage that would not fit
    /// on the GPU goes there in place of the GPU stages that gain least from it; moves that still
    /// do not fit, or need an unavailable GPU, are skipped. Otherwise None (run the current
    /// placement).
    pub fn probe(&mut self, phase: Phase) -> Option<Placement> {
        if self.cfg.probe_every == 0 {
            return None;
        }
        let st = &mut self.phases[phase.index()];
        st.probe_calls += 1;
        if !st.probe_calls.is_multiple_of(self.cfg.probe_every) {
            return None;
        }
        let current = self.current.get(phase);
        let fits_here =
            |p: &Placement| phase_fits(&self.cfg, &self.current, &self.resident, phase, p);
        let n_stage = self.cfg.n_layer + 2;
        let est = &st.est.costs().stages;
        // GPU stages least worth their GPU bytes first (GPU ms − CPU ms, largest first): the
        // ones to move out when a probe needs room on a full GPU.
        let mut evict: Vec<usize> = (0..n_stage).collect();
        evict.sort_by(|&a, &b| {
            let gain = |k: usize| est.get(k).map_or(0.0, |c| c[1] - c[0]);
            gain(b).total_cmp(&gain(a))
        });
        for i in 0..n_stage {
            let k = (st.probe_cursor + i) % n_stage;
            let mut devs: Vec<Device> = current.stages().collect();
            let Some(d) = devs.get_mut(k) else {
                continue;
            };
            *d = d.other();
            let to_gpu = *d == Device::Gpu;
            if to_gpu && !self.cfg.gpu_available {
                continue;
            }
            let mut p = solve::from_stages(&devs);
            // A stage that does not fit beside the current GPU stages is probed in place of the
            // least useful of them, so a full GPU does not freeze the estimates of the stages
            // left on the CPU.
            for &j in &evict {
                if !to_gpu || p.as_ref().is_none_or(&fits_here) {
                    break;
                }
                if j != k && devs[j] == Device::Gpu {
                    devs[j] = Device::Cpu;
                    p = solve::from_stages(&devs);
                }
            }
            if let Some(p) = p.filter(&fits_here) {
                st.probe_cursor = (k + 1) % n_stage;
                st.probes += 1;
                return Some(p);
            }
        }
        None
    }

    /// The GPU went away (lost device, failed bring-up): from now on everything runs on the
    /// CPU; both phases migrate at once and the decisions are recorded.
    pub fn gpu_lost(&mut self) -> Vec<Decision> {
        self.cfg.gpu_available = false;
        [Phase::Prefill, Phase::Decode]
            .into_iter()
            .map(|phase| self.decide(phase))
            .collect()
    }

    /// Everything worth printing or serialising: placement, estimates and counters per phase,
    /// and the migrations.
    pub fn report(&self) -> PolicyReport {
        let phase = |ph: Phase| {
            let st = &self.phases[ph.index()];
            let p = self.current.get(ph);
            report::phase_report(p, st.est.costs(), st.samples, st.probes, st.source)
        };
        PolicyReport {
            prefill: phase(Phase::Prefill),
            decode: phase(Phase::Decode),
            migrations: self.history.iter().map(DecisionReport::from).collect(),
            resident: self.cfg.residency.as_ref().map(|_| {
                self.resident
                    .iter()
                    .map(|&r| if r { 'R' } else { 's' })
                    .collect()
            }),
            shares: self.cfg.residency.as_ref().map(|_| self.shares()),
        }
    }
}
