//! The residency side of the offload policy (pure, simulated costs): which blocks keep their
//! weights on the GPU when the budget holds only some, the others streamed at
//! `max(gpu compute, upload)` per pass, with both phases' placements solved together.

#[path = "common/rng.rs"]
mod rng;

use memwall::ground::{Device, Phase, PhasePlacement, Placement};
use memwall::scheduler::policy::{
    joint_bytes, solve_joint, Joint, JointCosts, Policy, PolicyConfig, Prior, ResidencyConfig,
    Sample, StageCosts, TimeSource,
};
use rng::Rng;

const MIB: u64 = 1 << 20;

/// Five blocks of different sizes and speeds; embedding and head small. Sizes are whole MiB and
/// the budgets powers of two MiB past the fixed bytes, so the solver's memory units are exact.
fn scenario(budget_mib: u64) -> (PolicyConfig, StageCosts, StageCosts) {
    let n = 5;
    let mut cfg = PolicyConfig::new(n, MIB, vec![0; n], MIB, MIB, MIB + budget_mib * MIB, true);
    cfg.residency = Some(ResidencyConfig {
        weight_bytes: [1, 2, 1, 3, 2].iter().map(|&m| m * MIB).collect(),
        kv_bytes: vec![0; n],
        ring_bytes: 4 * MIB,
        // 1 MiB uploads in ~1 ms.
        upload_gbps: 1.048576,
        prefill_batch: 16,
    });
    let dec = StageCosts {
        stages: vec![
            [0.01, 0.02],
            [2.0, 0.3],
            [3.0, 0.9],
            [1.5, 0.2],
            [4.0, 1.0],
            [2.5, 0.6],
            [3.0, 0.4],
        ],
        crossing_ms: 0.2,
    };
    let pre = StageCosts {
        stages: dec
            .stages
            .iter()
            .map(|c| [c[0] * 0.3, c[1] * 0.1])
            .collect(),
        crossing_ms: 0.05,
    };
    (cfg, pre, dec)
}

/// Per-token ms of one phase, written out without the library.
fn cost(c: &StageCosts, r: &ResidencyConfig, p: &Placement, res: &[bool], tpp: f64) -> f64 {
    let devs: Vec<Device> = p.stages().collect();
    let mut t = 0.0;
    for (k, &d) in devs.iter().enumerate() {
        let here = c.stages[k][d.index()];
        let streamed = d == Device::Gpu && k >= 1 && k <= res.len() && !res[k - 1];
        t += if streamed {
            let upload = r.weight_bytes[k - 1] as f64 / (r.upload_gbps * 1e6) / tpp;
            here.max(upload)
        } else {
            here
        };
    }
    t + c.crossing_ms * devs.windows(2).filter(|w| w[0] != w[1]).count() as f64
}

/// GPU bytes, written out without the library.
fn bytes(cfg: &PolicyConfig, r: &ResidencyConfig, j: &Joint) -> u64 {
    let (a, b) = (&j.placements.prefill, &j.placements.decode);
    let on = |x: Device, y: Device| x == Device::Gpu || y == Device::Gpu;
    let mut t = 0;
    let mut any = on(a.embed, b.embed) || on(a.head, b.head);
    let mut ring = false;
    if on(a.embed, b.embed) {
        t += cfg.embed_gpu_bytes;
    }
    if on(a.head, b.head) {
        t += cfg.head_gpu_bytes;
    }
    for l in 0..cfg.n_layer {
        if j.resident[l] {
            t += r.weight_bytes[l];
        }
        if on(a.layers[l], b.layers[l]) {
            any = true;
            t += r.kv_bytes[l];
            ring |= !j.resident[l];
        }
    }
    if ring {
        t += r.ring_bytes;
    }
    if any {
        t += cfg.fixed_gpu_bytes;
    }
    t
}

/// Every (prefill device, decode device, resident) of every stage.
fn brute_force(
    cfg: &PolicyConfig,
    r: &ResidencyConfig,
    pre: &StageCosts,
    dec: &StageCosts,
    shares: [f64; 2],
    tpp: f64,
) -> (f64, Joint) {
    let n = cfg.n_layer;
    let d = |b: usize| if b == 1 { Device::Gpu } else { Device::Cpu };
    let mut best = (f64::INFINITY, None);
    // Blocks: 8 codes (prefill, decode, resident); embedding and head: 4 each.
    let total = 8usize.pow(n as u32) * 16;
    for code in 0..total {
        let mut c = code;
        let mut take = |m: usize| {
            let x = c % m;
            c /= m;
            x
        };
        let e = take(4);
        let h = take(4);
        let mut lp = Vec::new();
        let mut ld = Vec::new();
        let mut res = Vec::new();
        for _ in 0..n {
            let x = take(8);
            lp.push(d(x & 1));
            ld.push(d((x >> 1) & 1));
            res.push(x >> 2 == 1);
        }
        let j = Joint {
            placements: PhasePlacement {
                prefill: Placement {
                    embed: d(e & 1),
                    layers: lp,
                    head: d(h & 1),
                },
                decode: Placement {
                    embed: d(e >> 1),
                    layers: ld,
                    head: d(h >> 1),
                },
            },
            resident: res,
        };
        if bytes(cfg, r, &j) > cfg.gpu_budget_bytes {
            continue;
        }
        let ms = shares[0] * cost(pre, r, &j.placements.prefill, &j.resident, tpp)
            + shares[1] * cost(dec, r, &j.placements.decode, &j.resident, 1.0);
        if ms < best.0 - 1e-12 {
            best = (ms, Some(j));
        }
    }
    (best.0, best.1.unwrap())
}

#[test]
fn joint_solve_matches_brute_force_and_never_exceeds_the_budget() {
    for budget_mib in [4, 8, 16] {
        for shares in [[0.5, 0.5], [0.9, 0.1], [0.05, 0.95]] {
            let (cfg, pre, dec) = scenario(budget_mib);
            let r = cfg.residency.clone().unwrap();
            let jc = JointCosts {
                costs: [&pre, &dec],
                shares,
                tokens_per_pass: [8.0, 1.0],
            };
            let (j, ms) = solve_joint(&jc, &cfg, &r).unwrap();
            let (want, bj) = brute_force(&cfg, &r, &pre, &dec, shares, 8.0);
            let got = shares[0] * cost(&pre, &r, &j.placements.prefill, &j.resident, 8.0)
                + shares[1] * cost(&dec, &r, &j.placements.decode, &j.resident, 1.0);
            assert!(
                (got - want).abs() < 1e-9 && (ms - want).abs() < 1e-9,
                "budget {budget_mib} MiB shares {shares:?}: solver {ms} ({got} recomputed) \
                 {j:?}, brute force {want} {bj:?}"
            );
            assert!(bytes(&cfg, &r, &j) <= cfg.gpu_budget_bytes);
            assert_eq!(bytes(&cfg, &r, &j), joint_bytes(&j, &cfg, &r));
        }
    }
}

/// Six equal blocks the GPU runs far faster than the CPU, uploads of 1 ms, room for the ring
/// and two blocks: the resident ones must be those whose streaming would cost most over
/// their compute (upload − gpu largest: the ones with the least GPU work). The 4 MiB left
/// past the fixed bytes and the ring keep the solver's memory units exact.
fn keep_scenario() -> (PolicyConfig, StageCosts) {
    let n = 6;
    let gpu = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7];
    let mut cfg = PolicyConfig::new(n, MIB, vec![0; n], MIB, MIB, 0, true);
    cfg.gpu_budget_bytes = MIB + 2 * MIB + 2 * MIB + 2 * MIB; // fixed, embed+head, ring, 2 blocks
    cfg.residency = Some(ResidencyConfig {
        weight_bytes: vec![MIB; n],
        kv_bytes: vec![0; n],
        ring_bytes: 2 * MIB,
        upload_gbps: 1.048576,
        prefill_batch: 1,
    });
    let mut stages = vec![[0.05, 0.05]];
    stages.extend(gpu.iter().map(|&g| [5.0, g]));
    stages.push([5.0, 0.5]);
    // A crossing (1 ms) costs more than a third resident block saves (0.7 ms), so the embedding
    // stays on the GPU rather than making room for one.
    (
        cfg,
        StageCosts {
            stages,
            crossing_ms: 1.0,
        },
    )
}

#[test]
fn residency_goes_to_the_blocks_whose_streaming_costs_most() {
    let (cfg, c) = keep_scenario();
    let r = cfg.residency.clone().unwrap();
    let jc = JointCosts {
        costs: [&c, &c],
        shares: [0.5, 0.5],
        tokens_per_pass: [1.0, 1.0],
    };
    let (j, _) = solve_joint(&jc, &cfg, &r).unwrap();
    assert_eq!(
        j.resident,
        vec![true, false, true, false, false, false],
        "{j:?}"
    );
    assert_eq!(j.placements.decode, Placement::all(Device::Gpu, 6), "{j:?}");
    assert!(joint_bytes(&j, &cfg, &r) <= cfg.gpu_budget_bytes);
}

#[test]
fn residency_is_stable_under_noise_and_within_budget() {
    let (cfg, truth) = keep_scenario();
    let r = cfg.residency.clone().unwrap();
    let n = cfg.n_layer;
    // A flat prior (every block alike): the estimates must come from the samples.
    let flat = StageCosts {
        stages: truth.stages.iter().map(|_| [1.0, 0.5]).collect(),
        crossing_ms: 0.1,
    };
    let start = PhasePlacement::same(Placement::all(Device::Cpu, n));
    let mut pol = Policy::new(cfg.clone(), Prior::new(flat.clone(), flat), start).unwrap();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut changes_late = 0;
    let mut prev = pol.resident().to_vec();
    for step in 0..200 {
        let phase = if step % 10 == 0 {
            Phase::Prefill
        } else {
            Phase::Decode
        };
        let p = pol
            .probe(phase)
            .unwrap_or_else(|| pol.placement(phase).clone());
        let j = Joint {
            placements: {
                let mut pp = pol.placements().clone();
                *pp.get_mut(phase) = p.clone();
                pp
            },
            resident: pol.resident().to_vec(),
        };
        assert!(
            bytes(&cfg, &r, &j) <= cfg.gpu_budget_bytes,
            "step {step}: over budget"
        );
        // Timestamps time compute only: a streamed block's upload is not in its sample.
        let mut timed = p.stages().enumerate().map(|(k, d)| {
            (
                d,
                truth.stages[k][d.index()] * (1.0 + 0.2 * (2.0 * rng.f() - 1.0)),
            )
        });
        let embed = timed.next().unwrap();
        let mut layers: Vec<(Device, f64)> = timed.collect();
        let head = layers.pop().unwrap();
        pol.observe(&Sample {
            phase,
            source: TimeSource::GpuTimestamps,
            tokens: 1,
            embed,
            layers,
            head,
            crossing_ms: (p.crossings() > 0).then(|| 1.0 * (1.0 + 0.2 * (2.0 * rng.f() - 1.0))),
        })
        .unwrap();
        pol.count_tokens(phase, 1);
        pol.decide(phase);
        let now = pol.resident().to_vec();
        if now != prev && step >= 40 {
            changes_late += 1;
        }
        prev = now;
    }
    assert_eq!(
        pol.resident(),
        &[true, false, true, false, false, false],
        "{:?}",
        pol.report()
    );
    assert!(
        changes_late <= 1,
        "residency changed {changes_late} times after step 40"
    );
}
