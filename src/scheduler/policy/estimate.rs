//! Running per-stage cost estimates of one phase.
//!
//! A stage's cost on a device is modelled as `shape[stage][device] × scale[device]`: the shape
//! is what the stage costs relative to the device's other stages (it changes with the model,
//! rarely), the scale is the device's current speed (it changes with throttling, contention,
//! recovery, and affects all its work at once). Separating them is what lets the stages that
//! run on a device tell how fast the *others* would run there: when only the head runs on a
//! throttled GPU, its timings show the recovery for every block.
//!
//! Noise vs change. Each sample gives one observation of a device's scale: `o = Σ measured /
//! Σ shape` over the stages that ran there. Deviations within the noise band (`ln(1 + noise)`)
//! move the scale with gain `smoothing × k / n_stage` (k stages timed: one stage's timing is
//! 1/n_stage of the evidence a whole forward pass gives), so one noisy timing of a lone stage
//! cannot shift a whole device's estimates by the ±20 % it may carry. A deviation beyond the
//! band seen in two consecutive samples, in the same direction, is a change (a throttle, a
//! recovery): the scale jumps to the geometric mean of the two observations, so a migration
//! can follow at the second re-sample. A lone outlier (a preempted thread) is ignored.
//!
//! Shapes learn from the residual of each timed stage after dividing out this sample's device
//! level (`o`), with EWMA weight `smoothing`, so they never absorb a device-wide change.

use super::StageCosts;
use crate::ground::Device;

/// Observations further than this factor from the estimate are clamped (a stalled timer).
const MAX_RATIO: f64 = 8.0;

#[derive(Debug, Clone)]
pub(super) struct Estimator {
    /// `[n_stage][cpu, gpu]` relative stage costs (ms per token at scale 1).
    shape: Vec<[f64; 2]>,
    /// `[cpu, gpu]` device speed factors.
    scale: [f64; 2],
    /// `[cpu, gpu]` log-deviation of the last sample if it was beyond the noise band.
    pending: [Option<f64>; 2],
    /// `shape × scale` and the crossing cost: what the solver sees.
    est: StageCosts,
}

impl Estimator {
    pub(super) fn new(prior: &StageCosts) -> Estimator {
        Estimator {
            shape: prior.stages.clone(),
            scale: [1.0; 2],
            pending: [None; 2],
            est: prior.clone(),
        }
    }

    pub(super) fn costs(&self) -> &StageCosts {
        &self.est
    }

    /// Folds one sample in. `timed[k]` is where stage k ran and its per-token ms; `regular[k]`
    /// where it runs in the current placement (a stage timed elsewhere is a probe). Unusable
    /// timings (negative, non-finite) are skipped.
    pub(super) fn observe(
        &mut self,
        timed: &[(Device, f64)],
        regular: &[Device],
        crossing_ms: Option<f64>,
        smoothing: f64,
        noise: f64,
    ) {
        let n_stage = self.shape.len();
        let usable = |ms: f64| ms.is_finite() && ms >= 0.0;
        let band = noise.ln_1p();
        let max_dev = MAX_RATIO.ln();
        for d in [Device::Cpu, Device::Gpu] {
            let di = d.index();
            let on_d: Vec<usize> = (0..n_stage)
                .filter(|&k| timed.get(k).is_some_and(|t| t.0 == d && usable(t.1)))
                .collect();
            if on_d.is_empty() {
                continue;
            }
            // The device's level comes from the stages that run there regularly; a device used
            // only by a probe has that one stage.
            let reg: Vec<usize> = on_d
                .iter()
                .copied()
                .filter(|&k| regular.get(k) == Some(&d))
                .collect();
            let probe_only = reg.is_empty();
            let level_set = if probe_only { &on_d } else { &reg };
            let sum_ms: f64 = level_set.iter().map(|&k| timed[k].1).sum();
            let sum_shape: f64 = level_set.iter().map(|&k| self.shape[k][di]).sum();
            if sum_ms <= 0.0 || sum_shape <= 0.0 {
                continue;
            }
            // [this sample's device level] observation of scale[d]
            let o = sum_ms / sum_shape;
            let dev = (o / self.scale[di]).ln().clamp(-max_dev, max_dev);
            let quiet_gain = smoothing * level_set.len() as f64 / n_stage as f64;
            if probe_only {
                // One stage once: no change detection, little weight (see the module docs).
                self.scale[di] *= (quiet_gain * dev).exp();
                self.pending[di] = None;
            } else if dev.abs() > band {
                match self.pending[di] {
                    Some(prev) if prev.signum() == dev.signum() => {
                        self.scale[di] *= ((prev + dev) / 2.0).exp();
                        self.pending[di] = None;
                    }
                    _ => self.pending[di] = Some(dev),
                }
            } else {
                self.scale[di] *= (quiet_gain * dev).exp();
                self.pending[di] = None;
            }
            // Shapes: residual after the device level. A lone probe has no level of its own
            // beyond its timing, so its residual is taken against the (updated) scale.
            let level = if probe_only { self.scale[di] } else { o };
            for &k in &on_d {
                let s = &mut self.shape[k][di];
                if *s > 0.0 && timed[k].1 > 0.0 {
                    let r = (timed[k].1 / (*s * level)).ln().clamp(-max_dev, max_dev);
                    *s *= (smoothing * r).exp();
                } else {
                    // A zero on either side: plain EWMA, which can leave zero.
                    *s = (1.0 - smoothing) * *s + smoothing * timed[k].1 / level.max(1e-12);
                }
            }
        }
        if let Some(c) = crossing_ms.filter(|&c| usable(c)) {
            self.est.crossing_ms = (1.0 - smoothing) * self.est.crossing_ms + smoothing * c;
        }
        for (e, s) in self.est.stages.iter_mut().zip(&self.shape) {
            *e = [s[0] * self.scale[0], s[1] * self.scale[1]];
        }
    }
}
