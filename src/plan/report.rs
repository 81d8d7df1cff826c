//! The `memwall plan` report: the budget table, whether it fits, the placement and what
//! streams.

use std::fmt;

use crate::ground::{Device, Placement};

use super::{account, fit, format_size, DeviceUse, MemoryModel};

/// One row of the budget table, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub cpu: u64,
    pub gpu: u64,
    pub total: u64,
}

/// Everything `memwall plan` prints, as data (`--json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanReport {
    pub source: String,
    pub n_layer: usize,
    pub n_ctx: usize,
    pub kv_bits: f64,
    /// Every weight byte of the model (what a single device would hold).
    pub weights_bytes: u64,
    /// The KV cache of every layer for `n_ctx` positions.
    pub kv_bytes: u64,
    pub kv_bytes_per_layer: u64,
    pub ram_bytes: u64,
    pub gpu_budget_bytes: Option<u64>,
    /// The placement memwall would use, as `embed|blocks|head` with `G`/`c` per stage.
    pub placement: String,
    pub crossings: usize,
    pub cpu: DeviceUse,
    pub gpu: DeviceUse,
    /// weights, KV cache, scratch, staging, total (per device and together).
    pub rows: Vec<Row>,
    /// CPU memory the plan needs: mapped weight pages plus anonymous memory.
    pub ram_needed: u64,
    /// The CPU's anonymous memory (KV cache, scratch) fits in RAM.
    pub anonymous_fits: bool,
    /// Everything on the CPU, mapped weights included, fits in RAM.
    pub ram_fits: bool,
    /// The GPU's peak fits the budget (None without a budget).
    pub gpu_fits: Option<bool>,
    /// CPU and GPU together fit in RAM: what a unified-memory device (a phone) needs.
    pub unified_fits: bool,
    /// Weight bytes re-read from storage each token when the mapped weights do not fit in RAM
    /// beside the anonymous memory (the page cache holds the rest).
    pub storage_stream_bytes: u64,
    pub resident_layers: usize,
    /// Blocks that would stream to the GPU each token to run every block there (0 without a
    /// GPU budget).
    pub streamed_layers: usize,
    pub streamed_bytes_per_token: u64,
    /// The model runs with everything resident: RAM (and the GPU budget) suffice.
    pub fits: bool,
    /// "fits", "runs with weights paged from storage" or "does not fit".
    pub verdict: String,
    /// Without a GPU budget: the CPU path's residency under a memory budget of `ram` (what
    /// `run --mem-budget` would keep resident and stream), or why none works.
    pub cpu_stream: Option<Result<crate::memory::Residency, String>>,
}

/// What the process holds before a model loads (binary, threads, tokenizer), as a plan
/// without the process counts it; `run` measures it instead (`VmRSS` at load).
pub const RUNTIME_ESTIMATE: u64 = 48 << 20;

/// The CPU residency a budget of `budget` bytes gives `m` (see `memory::residency`).
fn cpu_stream(m: &MemoryModel, budget: u64) -> Result<crate::memory::Residency, String> {
    let n = m.n_layer;
    let pick = |packed: u64, file: u64| if packed > 0 { packed } else { file };
    let head_file = if m.tied_embeddings {
        m.embed_bytes
    } else {
        m.head_bytes
    };
    let costs = crate::memory::Costs {
        fixed: RUNTIME_ESTIMATE + m.kv_total() + m.cpu_scratch_bytes,
        kv: m.kv_total(),
        shared: 0,
        head: pick(m.cpu_packed_head_bytes, head_file),
        resident: (0..n)
            .map(|l| pick(m.cpu_packed_layer_bytes[l], m.layer_weight_bytes[l]))
            .collect(),
        read: m.layer_weight_bytes.clone(),
    };
    crate::memory::plan(&costs, budget, 0.1).map_err(|e| e.to_string())
}

/// The plan for `m` on a machine with `ram` bytes of RAM and, when given, a GPU with
/// `gpu_budget` bytes for memwall ([`fit`] picks the placement). Without a budget everything
/// runs on the CPU.
pub fn plan(m: &MemoryModel, ram: u64, gpu_budget: Option<u64>) -> PlanReport {
    let (placement, resident, streamed, streamed_bytes) = match gpu_budget {
        Some(b) => {
            let f = fit(m, b);
            (
                f.placement,
                f.resident_layers,
                f.streamed_layers,
                f.streamed_bytes,
            )
        }
        None => (Placement::all(Device::Cpu, m.n_layer), 0, 0, 0),
    };
    let [cpu, gpu] = account(m, &placement);
    let row = |name: &str, f: fn(&DeviceUse) -> u64| Row {
        name: name.to_string(),
        cpu: f(&cpu),
        gpu: f(&gpu),
        total: f(&cpu) + f(&gpu),
    };
    let rows = vec![
        row("weights", |u| u.weights),
        row("KV cache", |u| u.kv),
        row("scratch", |u| u.scratch),
        row("staging", |u| u.staging),
        row("packed", |u| u.packed),
        row("total", |u| u.peak),
    ];
    let anonymous_fits = cpu.anonymous() <= ram;
    let ram_fits = cpu.peak <= ram;
    let gpu_fits = gpu_budget.map(|b| gpu.peak <= b);
    let storage_stream_bytes = if anonymous_fits {
        cpu.weights.saturating_sub(ram - cpu.anonymous())
    } else {
        cpu.weights
    };
    let fits = ram_fits && gpu_fits != Some(false);
    let stream = gpu_budget.is_none().then(|| cpu_stream(m, ram));
    let verdict = if fits {
        "fits"
    } else if matches!(&stream, Some(Ok(r)) if r.streams()) {
        "runs with blocks streamed from storage"
    } else if anonymous_fits && gpu_fits != Some(false) {
        "runs with weights paged from storage"
    } else {
        "does not fit"
    };
    PlanReport {
        source: m.source.clone(),
        n_layer: m.n_layer,
        n_ctx: m.n_ctx,
        kv_bits: m.kv_bits,
        weights_bytes: m.weights_total(),
        kv_bytes: m.kv_total(),
        kv_bytes_per_layer: m.kv_bytes_per_layer,
        ram_bytes: ram,
        gpu_budget_bytes: gpu_budget,
        crossings: placement.crossings(),
        placement: placement.compact(),
        cpu,
        gpu,
        rows,
        ram_needed: cpu.peak,
        anonymous_fits,
        ram_fits,
        gpu_fits,
        unified_fits: cpu.peak + gpu.peak <= ram,
        storage_stream_bytes,
        resident_layers: resident,
        streamed_layers: streamed,
        streamed_bytes_per_token: streamed_bytes,
        fits,
        verdict: verdict.to_string(),
        cpu_stream: stream,
    }
}

impl fmt::Display for PlanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "model: {}", self.source)?;
        writeln!(
            f,
            "context: {} tokens, KV cache at {} bits ({} B per layer, {} layers)",
            self.n_ctx, self.kv_bits, self.kv_bytes_per_layer, self.n_layer
        )?;
        writeln!(f)?;
        writeln!(f, "{:<10} {:>12} {:>12} {:>12}", "", "CPU", "GPU", "total")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<10} {:>12} {:>12} {:>12}",
                r.name,
                format_size(r.cpu),
                format_size(r.gpu),
                format_size(r.total)
            )?;
        }
        let budget = self
            .gpu_budget_bytes
            .map_or_else(|| "-".to_string(), format_size);
        writeln!(
            f,
            "{:<10} {:>12} {:>12}",
            "available",
            format_size(self.ram_bytes),
            budget
        )?;
        writeln!(
            f,
            "(CPU weights are pages of the memory-mapped file; the rest is anonymous memory)"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "exact: weights {} B, KV cache {} B, CPU needs {} B of {} B RAM",
            self.weights_bytes, self.kv_bytes, self.ram_needed, self.ram_bytes
        )?;
        write!(f, "verdict: {}", self.verdict)?;
        if !self.ram_fits {
            write!(
                f,
                " (CPU needs {}, RAM is {}: short by {})",
                format_size(self.ram_needed),
                format_size(self.ram_bytes),
                format_size(self.ram_needed.saturating_sub(self.ram_bytes))
            )?;
        }
        writeln!(f)?;
        if self.storage_stream_bytes > 0 && self.anonymous_fits && self.cpu_stream.is_none() {
            writeln!(
                f,
                "  {} of weights per token would be re-read from storage (mmap paging)",
                format_size(self.storage_stream_bytes)
            )?;
        }
        if self.gpu_budget_bytes.is_some() {
            writeln!(
                f,
                "unified memory (GPU allocations from the same RAM): {}",
                if self.unified_fits {
                    "fits"
                } else {
                    "does not fit"
                }
            )?;
        }
        writeln!(
            f,
            "placement: {} ({} crossing{})",
            self.placement,
            self.crossings,
            if self.crossings == 1 { "" } else { "s" }
        )?;
        match (&self.cpu_stream, self.gpu_budget_bytes) {
            (Some(Ok(r)), _) if r.streams() => {
                let k = r.resident.iter().filter(|&&x| x).count();
                writeln!(
                    f,
                    "memory budget {} (run --mem-budget): {k} of {} blocks resident ({}), {} \
                     stream from storage: {} per token through {} slots of {}; at least {}",
                    format_size(r.budget),
                    self.n_layer,
                    format_size(r.resident_bytes),
                    self.n_layer - k,
                    format_size(r.streamed_bytes),
                    r.slots,
                    format_size(r.slot_bytes),
                    format_size(r.minimum)
                )?;
            }
            (Some(Err(e)), _) => writeln!(f, "memory budget (run --mem-budget): {e}")?,
            _ => {}
        }
        match self.gpu_budget_bytes {
            None => writeln!(
                f,
                "GPU streaming: none (no GPU budget: every stage on the CPU)"
            ),
            Some(_) if self.streamed_layers == 0 => writeln!(
                f,
                "streaming: none ({} of {} blocks resident on the GPU)",
                self.resident_layers, self.n_layer
            ),
            Some(_) => writeln!(
                f,
                "streaming: {} of {} blocks resident on the GPU; all on the GPU would stream \
                 {} blocks, {} per token",
                self.resident_layers,
                self.n_layer,
                self.streamed_layers,
                format_size(self.streamed_bytes_per_token)
            ),
        }
    }
}
