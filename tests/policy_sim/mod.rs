//! The simulated cost model and the executor loop the policy tests drive (shared helpers of
//! tests/policy.rs; a directory module so cargo does not build it as a test of its own).

#[path = "../common/rng.rs"]
mod rng;
pub use rng::Rng;

use memwall::ground::{Device, Phase, Placement};
use memwall::scheduler::policy::{Policy, PolicyConfig, Sample, StageCosts, TimeSource};

/// Devices of the stages in execution order (embed, layers, head).
pub fn devs(p: &Placement) -> Vec<Device> {
    let mut v = vec![p.embed];
    v.extend(&p.layers);
    v.push(p.head);
    v
}

pub fn from_devs(d: &[Device]) -> Placement {
    Placement {
        embed: d[0],
        layers: d[1..d.len() - 1].to_vec(),
        head: d[d.len() - 1],
    }
}

/// Ground truth of one phase: `[cpu, gpu]` ms per token per stage, ms per crossing.
#[derive(Clone)]
pub struct Truth {
    pub stages: Vec<[f64; 2]>,
    pub crossing: f64,
}

impl Truth {
    /// True per-token cost of `p`, written out without the library: stage times + crossings.
    pub fn cost(&self, p: &Placement, gpu_slow: f64) -> f64 {
        let d = devs(p);
        let mut t = 0.0;
        for (k, dev) in d.iter().enumerate() {
            t += match dev {
                Device::Cpu => self.stages[k][0],
                Device::Gpu => self.stages[k][1] * gpu_slow,
            };
        }
        t + self.crossing * d.windows(2).filter(|w| w[0] != w[1]).count() as f64
    }
    pub fn as_costs(&self) -> StageCosts {
        StageCosts {
            stages: self.stages.clone(),
            crossing_ms: self.crossing,
        }
    }
}

/// GPU bytes `p` needs, written out independently of the library.
pub fn bytes_needed(p: &Placement, cfg: &PolicyConfig) -> u64 {
    let d = devs(p);
    if !d.contains(&Device::Gpu) {
        return 0;
    }
    let mut sizes = vec![cfg.embed_gpu_bytes];
    sizes.extend(&cfg.layer_gpu_bytes);
    sizes.push(cfg.head_gpu_bytes);
    cfg.fixed_gpu_bytes
        + d.iter()
            .zip(sizes)
            .filter(|(d, _)| **d == Device::Gpu)
            .map(|(_, b)| b)
            .sum::<u64>()
}

pub fn allowed(p: &Placement, cfg: &PolicyConfig) -> bool {
    !devs(p).contains(&Device::Gpu)
        || (cfg.gpu_available && bytes_needed(p, cfg) <= cfg.gpu_budget_bytes)
}

/// Brute force over all 2^(n+2) placements: the cheapest that is allowed.
pub fn brute(truth: &Truth, cfg: &PolicyConfig, gpu_slow: f64) -> (Placement, f64) {
    let n = cfg.n_layer + 2;
    let mut best = (Placement::all(Device::Cpu, cfg.n_layer), f64::INFINITY);
    for mask in 0u32..(1 << n) {
        let d: Vec<Device> = (0..n)
            .map(|k| {
                if mask >> k & 1 == 1 {
                    Device::Gpu
                } else {
                    Device::Cpu
                }
            })
            .collect();
        let p = from_devs(&d);
        let c = truth.cost(&p, gpu_slow);
        if allowed(&p, cfg) && c < best.1 {
            best = (p, c);
        }
    }
    best
}

/// Times `p` in the simulator: every stage and the crossing cost get independent uniform
/// multiplicative noise in [1 - noise, 1 + noise].
pub fn simulate(
    truth: &Truth,
    phase: Phase,
    p: &Placement,
    gpu_slow: f64,
    noise: f64,
    rng: &mut Rng,
) -> Sample {
    let mut jitter = || 1.0 + noise * (2.0 * rng.f() - 1.0);
    let timed: Vec<(Device, f64)> = devs(p)
        .into_iter()
        .enumerate()
        .map(|(k, d)| {
            let base = match d {
                Device::Cpu => truth.stages[k][0],
                Device::Gpu => truth.stages[k][1] * gpu_slow,
            };
            (d, base * jitter())
        })
        .collect();
    let crossing_ms = (p.crossings() > 0).then(|| truth.crossing * jitter());
    Sample {
        phase,
        source: TimeSource::WallClock,
        tokens: 16,
        embed: timed[0],
        layers: timed[1..timed.len() - 1].to_vec(),
        head: timed[timed.len() - 1],
        crossing_ms,
    }
}

/// One re-sample of the executor loop; checks that what ran fits. Returns whether the
/// placement changed.
pub fn step(
    pol: &mut Policy,
    truth: &Truth,
    phase: Phase,
    gpu_slow: f64,
    noise: f64,
    rng: &mut Rng,
) -> bool {
    let cfg = pol.config().clone();
    let run = pol
        .probe(phase)
        .unwrap_or_else(|| pol.placement(phase).clone());
    assert!(
        allowed(&run, &cfg),
        "ran {} over budget ({} > {})",
        run,
        bytes_needed(&run, &cfg),
        cfg.gpu_budget_bytes
    );
    pol.observe(&simulate(truth, phase, &run, gpu_slow, noise, rng))
        .unwrap();
    let d = pol.decide(phase);
    assert!(
        allowed(&d.placement, &cfg),
        "chose {} over budget",
        d.placement
    );
    assert_eq!(&d.placement, pol.placement(phase));
    d.changed
}

pub fn config(n_layer: usize, layer_bytes: u64, budget: u64) -> PolicyConfig {
    PolicyConfig::new(
        n_layer,
        50,
        vec![layer_bytes; n_layer],
        150,
        20,
        budget,
        true,
    )
}

/// Eight blocks with different GPU gains, a head the GPU runs 5x faster, a budget of 670 bytes
/// (20 fixed + head 150 + five blocks of 100, or the embedding 50 and four blocks instead of one):
/// which blocks go where depends on their gains and on the crossings, so the best split is
/// non-trivial.
pub fn budget_scenario() -> (Truth, PolicyConfig) {
    let gpu = [0.5, 0.3, 0.6, 0.4, 0.5, 0.35, 0.45, 0.55];
    let mut stages = vec![[0.05, 0.05]];
    stages.extend(gpu.iter().map(|&g| [1.0, g]));
    stages.push([2.0, 0.4]);
    let truth = Truth {
        stages,
        crossing: 0.1,
    };
    (truth, config(8, 100, 20 + 150 + 500))
}
