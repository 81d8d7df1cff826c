//! The report of `memwall bench` (the `memwall.bench/1` JSON schema in the parent module's
//! docs): per-configuration results, their statistics and the run's summary. The terminal
//! tables are in [`super::report`].

use super::bandwidth::ProbeResult;

/// Summary statistics of repeated measurements.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stat {
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator; 0 for one sample).
    pub sd: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stat {
    pub fn new(samples: Vec<f64>) -> Stat {
        let n = samples.len();
        if n == 0 {
            return Stat {
                mean: 0.0,
                sd: 0.0,
                median: 0.0,
                min: 0.0,
                max: 0.0,
                samples,
            };
        }
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Stat {
            mean,
            sd: var.sqrt(),
            median,
            min: sorted[0],
            max: sorted[n - 1],
            samples,
        }
    }
}

/// The model a report is about.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelSummary {
    pub path: String,
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub file_bytes: u64,
    pub weight_bytes_per_token: u64,
    /// KV cache bytes per position: K and V, f32, every layer.
    pub kv_bytes_per_position: u64,
}

/// Bytes one decoded token must move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BytesPerToken {
    pub weights: u64,
    /// The KV cache read at the mean context.
    pub kv: u64,
    pub total: u64,
}

/// Memory a configuration used.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// The process's peak resident set (VmHWM), when /proc has it.
    pub peak_rss_bytes: Option<u64>,
    /// Bytes of tensor data in the mapped GGUF file.
    pub mapped_weight_bytes: u64,
    /// The session's KV cache.
    pub kv_bytes: u64,
    pub gpu_weight_bytes: Option<u64>,
    pub gpu_session_bytes: Option<u64>,
    pub gpu_total_bytes: Option<u64>,
}

/// A configuration under the memory budget: what stayed resident, what streamed, what the
/// reader achieved, and the storage floor (`read GB/s / streamed bytes per token`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageResult {
    pub budget_bytes: u64,
    pub limit_source: crate::memory::LimitSource,
    pub resident_bytes: u64,
    pub resident_blocks: usize,
    pub streamed_blocks: usize,
    /// Bytes a token reads from storage, as planned (the streamed blocks).
    pub streamed_bytes_per_token: u64,
    /// Bytes read from storage per decoded token, measured over the timed decode runs.
    pub read_bytes_per_token: f64,
    /// Storage bandwidth the reader achieved over those runs, GB/s.
    pub read_gbps: f64,
    /// Seconds per decoded token the compute waited for a block.
    pub wait_s_per_token: f64,
    /// Decode tokens/s the storage allows at that bandwidth, and the fraction reached.
    pub storage_floor_tps: Option<f64>,
    pub floor_fraction: Option<f64>,
    pub slots: usize,
    pub io_mode: Option<crate::memory::IoMode>,
    /// The measured peak (cgroup counter where the limit is the process's cgroup's, else
    /// VmHWM).
    pub peak_bytes: Option<u64>,
    pub peak_source: Option<&'static str>,
}

/// The expert cache over the timed decode runs (a mixture of experts that does not fit).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExpertResult {
    /// Experts needed that were held.
    pub hit_rate: f64,
    /// Bytes of experts read from storage per decoded token.
    pub read_bytes_per_token: f64,
    /// Seconds per decoded token reading missed experts (overlapping the held experts'
    /// compute), and the token's time split: waiting for those reads, and the rest.
    pub read_s_per_token: f64,
    pub wait_s_per_token: f64,
    pub compute_s_per_token: f64,
    /// Experts read from storage per decoded token (the misses).
    pub misses_per_token: f64,
    /// Experts read ahead of their block's router on a guess per decoded token, and the
    /// fraction of those the block then needed.
    pub read_ahead_per_token: f64,
    pub read_ahead_used: f64,
    /// Experts held at the end, their bytes, and the cache's capacity.
    pub held: usize,
    pub held_bytes: u64,
    pub capacity_bytes: u64,
}

/// Greedy generations after a text prompt, plain and with drafts (`--draft-model`,
/// `--draft-lookup`; [`super::speculative`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpecResult {
    /// `model:<path>` or `lookup`.
    pub drafter: String,
    pub draft_max: usize,
    pub prompt_tokens: usize,
    /// Tokens each run generated (fewer than `-n` when the model ended the text).
    pub tokens: usize,
    pub plain_tps: Stat,
    pub draft_tps: Stat,
    /// Mean drafted tokens/s over mean plain tokens/s.
    pub speedup: f64,
    /// Over the timed drafted runs: verification passes, drafted and kept tokens, kept per
    /// drafted, tokens per verification pass (its kept drafts plus its own token).
    pub passes: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance: f64,
    pub tokens_per_pass: f64,
    /// Every drafted run gave the plain run's ids (greedy decoding must).
    pub same_ids: bool,
    /// What the draft model's plan holds of the memory budget (a draft model under a budget).
    pub draft_planned_bytes: Option<u64>,
    /// Bytes read from storage per generated token, plain and drafted (when blocks stream).
    pub plain_read_bytes_per_token: Option<f64>,
    pub draft_read_bytes_per_token: Option<f64>,
}

/// One configuration's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConfigResult {
    pub device: String,
    pub device_name: String,
    /// The decode placement (`Placement::compact`: embed|blocks|head, `G` GPU, `c` CPU),
    /// with " (streamed)" when blocks stream their weights.
    pub placement: String,
    pub threads: Option<usize>,
    pub load_ms: f64,
    pub ttft_ms: f64,
    pub prefill_tps: Stat,
    pub decode_tps: Stat,
    pub mean_ctx: f64,
    pub bytes_per_token: BytesPerToken,
    pub achieved_gbs: f64,
    pub memory: Memory,
    pub probe: Option<ProbeResult>,
    pub fraction_of_probe: Option<f64>,
    /// The memory plan and storage reads, on the CPU path (`None` with a GPU).
    pub storage: Option<StorageResult>,
    /// The expert cache, when the model holds its experts in one.
    pub experts: Option<ExpertResult>,
    /// Plain and drafted greedy runs, with `--draft-model` or `--draft-lookup`.
    pub speculative: Option<SpecResult>,
    /// This configuration's speed over memwall's own all-CPU path (`-d cpu`) in the same run,
    /// when the run has one: how much the GPU (or a split) gains on this machine.
    pub vs_cpu: Option<SpeedRatio>,
}

/// Mean tokens/s of one configuration divided by the all-CPU configuration's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SpeedRatio {
    pub prefill: f64,
    pub decode: f64,
}

/// Fills every configuration's [`ConfigResult::vs_cpu`] from the first `cpu` configuration
/// (none when the run has no such configuration).
pub(super) fn fill_vs_cpu(configs: &mut [ConfigResult]) {
    let Some((p, d)) = configs
        .iter()
        .find(|c| c.device == "cpu")
        .map(|c| (c.prefill_tps.mean, c.decode_tps.mean))
    else {
        return;
    };
    for c in configs.iter_mut() {
        c.vs_cpu = Some(SpeedRatio {
            prefill: c.prefill_tps.mean / p.max(1e-12),
            decode: c.decode_tps.mean / d.max(1e-12),
        });
    }
}

/// What `memwall bench` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    pub schema: &'static str,
    pub model: ModelSummary,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    pub configs: Vec<ConfigResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_matches_hand_computed_values() {
        let s = Stat::new(vec![2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.mean, 5.0);
        // Sum of squared deviations 32 over n - 1 = 7.
        assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!((s.median, s.min, s.max), (4.5, 2.0, 9.0));
        assert_eq!(Stat::new(vec![3.0]).sd, 0.0);
    }
}
