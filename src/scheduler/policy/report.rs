//! What the policy reports (`--json` output and `-v` logs): placements as compact strings,
//! per-stage estimates, and the migrations it made.

use super::{Decision, StageCosts, TimeSource};
use crate::ground::{Device, Phase, Placement};

/// One stage's estimates and where it runs now.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StageReport {
    /// `embed`, `layer.N` or `head`.
    pub stage: String,
    pub device: Device,
    pub cpu_ms: f64,
    pub gpu_ms: f64,
}

/// One phase: the placement in force, its predicted cost and the estimates behind it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseReport {
    /// Compact placement (`c|ccGG|G`, see `Placement::compact`).
    pub placement: String,
    pub predicted_ms: f64,
    pub crossing_ms: f64,
    pub samples: usize,
    pub probes: usize,
    /// The clock that timed the latest sample's GPU stages (None before any sample).
    pub timing: Option<TimeSource>,
    pub stages: Vec<StageReport>,
}

/// One migration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DecisionReport {
    pub phase: Phase,
    pub sample: usize,
    pub placement: String,
    pub predicted_ms: f64,
    pub previous_predicted_ms: f64,
    pub reason: String,
}

impl From<&Decision> for DecisionReport {
    fn from(d: &Decision) -> DecisionReport {
        DecisionReport {
            phase: d.phase,
            sample: d.sample,
            placement: d.placement.compact(),
            predicted_ms: d.predicted_ms,
            previous_predicted_ms: d.current_predicted_ms,
            reason: d.reason.clone(),
        }
    }
}

/// The whole policy state for `--json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyReport {
    pub prefill: PhaseReport,
    pub decode: PhaseReport,
    pub migrations: Vec<DecisionReport>,
    /// Residency mode: the resident blocks, `R` resident, `s` streamed when on the GPU (e.g.
    /// `RRRsss`), and the objective's `[prefill, decode]` weights.
    pub resident: Option<String>,
    pub shares: Option<[f64; 2]>,
}

pub(super) fn phase_report(
    p: &Placement,
    est: &StageCosts,
    samples: usize,
    probes: usize,
    timing: Option<TimeSource>,
) -> PhaseReport {
    let n_layer = p.layers.len();
    let name = |k: usize| match k {
        0 => "embed".to_string(),
        k if k == n_layer + 1 => "head".to_string(),
        k => format!("layer.{}", k - 1),
    };
    PhaseReport {
        placement: p.compact(),
        predicted_ms: est.predict(p),
        crossing_ms: est.crossing_ms,
        samples,
        probes,
        timing,
        stages: p
            .stages()
            .zip(&est.stages)
            .enumerate()
            .map(|(k, (device, c))| StageReport {
                stage: name(k),
                device,
                cpu_ms: c[0],
                gpu_ms: c[1],
            })
            .collect(),
    }
}
