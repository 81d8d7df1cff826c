//! The CLI's tool commands: plan, bench, bench-kernels, synth, quantize's arguments,
//! selftest, inspect, check.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{BudgetArgs, CacheTypeArgs, DraftArgs};

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// GGUF model file [default: $MEMWALL_MODEL, else the cached test model]
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Prompt tokens (synthetic ids) per prefill.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
    n_prompt: usize,
    /// Tokens decoded one at a time per repetition.
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    n_gen: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Devices, a comma list of configurations run in turn: cpu, gpu, auto, an adapter index
    /// or a name substring (as --device of `run`).
    #[arg(short = 'd', long, default_value = "auto")]
    device: String,
    /// CPU worker threads [default: all cores]
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Keep matmul activations in f32.
    #[arg(long)]
    f32_activations: bool,
    /// Do not pack the CPU's weights at load (see `run --no-repack`).
    #[arg(long)]
    no_repack: bool,
    #[command(flatten)]
    cache: CacheTypeArgs,
    /// Only measure each device's memory bandwidth (no model).
    #[arg(long)]
    bandwidth: bool,
    /// Skip the bandwidth probes.
    #[arg(long)]
    no_probe: bool,
    /// MiB per bandwidth probe array (CPU) or buffer (GPU, capped by the binding limit)
    /// [default: four times the last-level cache, at least 256, so the CPU probe measures
    /// DRAM, not cache; within the memory limit]
    #[arg(long)]
    probe_mib: Option<u64>,
    #[command(flatten)]
    budget: BudgetArgs,
    // Speculative decoding measured too: greedy runs after --draft-prompt, plain and drafted.
    #[command(flatten)]
    draft: DraftArgs,
    /// The text the drafted runs continue [default: the start of a Rust function].
    #[arg(long = "draft-prompt", value_name = "TEXT")]
    draft_prompt: Option<String>,
    /// Print the results as one JSON object (schema: see `memwall::tools::bench`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct SynthArgs {
    /// Output GGUF file.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Layer widths: tiny, 1b (Llama-3.2-1B), 7b (Llama-2-7B), 35b (CodeLlama-34B), and the
    /// qwen3moe mixtures of experts tiny-moe and 30b-a3b (Qwen3-30B-A3B: 128 experts, 8 per
    /// token).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Layers [default: 2].
    #[arg(long)]
    layers: Option<usize>,
    /// Weight type of every matrix: q4_0, q4_1, q8_0, q4_k, q6_k, f16; or q4_k_m,
    /// llama.cpp's Q4_K_M mix (Q4_K, with Q6_K for the output head and for the attention
    /// value and down projections of an eighth of the layers at each end and every third
    /// between).
    #[arg(long = "type", default_value = "q4_0")]
    ty: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skew a mixture of experts' routing as real routers are: expert e's router row scaled
    /// by (1 + e)^-SKEW (0: uniform, random weights route every expert alike).
    #[arg(long, default_value_t = 0.0)]
    router_skew: f32,
}

#[derive(Args)]
pub(crate) struct UpcycleArgs {
    /// Dense llama or mistral GGUF.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Output GGUF file (Mixtral's layout).
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Experts per block.
    #[arg(long, default_value_t = 4)]
    experts: usize,
    /// Experts each token uses.
    #[arg(long, default_value_t = 2)]
    used: usize,
    /// Make the experts differ (each round-trips through another format and scales its down
    /// projection), so routing matters; without it they are copies and the model computes
    /// what the dense one does.
    #[arg(long)]
    distinct: bool,
    /// Seed of the router's random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
pub(crate) struct QuantizeArgs {
    /// Source GGUF.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Output GGUF file.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Target type of every matrix: q4_0, q4_1, q5_0, q5_1, q8_0, f16, f32.
    #[arg(long = "type")]
    ty: String,
}

/// How `plan` reads and prints sizes (its --help says it).
pub(crate) const SIZE_UNITS: &str =
    "Sizes (--ram, --gpu-mem-budget): K, M, G, T (or KiB, MiB, GiB, TiB) are \
powers of 1024; KB, MB, GB, TB are powers of 1000; a bare number is bytes; fractions round to \
the nearest byte (1.5G). The table prints decimal units (1 GB = 10^9 bytes); --json gives bytes.

Examples:
  memwall plan -m model.gguf --ctx 4096 --ram 8G --gpu-mem-budget 4G
  memwall plan --params 35B --layers 64 --heads 64 --kv-heads 8 --head-dim 128 --ctx 4096 \
      --weight-bits 4 --kv-bits 16 --ram 24G --json";

#[derive(Args)]
pub(crate) struct PlanArgs {
    /// GGUF model file (exact tensor sizes); leave out to plan from architecture numbers.
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// RAM available to memwall: 8G = 8 GiB (powers of 1024), 8GB = 8·10^9 bytes.
    #[arg(long)]
    ram: String,
    /// GPU memory memwall may use (same units as --ram): the plan keeps the most bytes read
    /// per token there.
    #[arg(long = "gpu-mem-budget")]
    gpu_mem_budget: Option<String>,
    /// Context in tokens [with -m, default: the model's, capped at 4096, as `run` does].
    #[arg(short = 'c', long = "ctx")]
    ctx: Option<usize>,
    /// Bits per KV cache element, overriding --cache-type-k/v (e.g. 2.5 for a what-if plan)
    /// [default: the mean of the two cache types' bits].
    #[arg(long = "kv-bits")]
    kv_bits: Option<f64>,
    #[command(flatten)]
    cache: CacheTypeArgs,
    /// Plan as `run --no-repack` loads (with -m): the CPU's weights stay mmap pages only,
    /// instead of packed copies in anonymous memory.
    #[arg(long)]
    no_repack: bool,
    /// Parameter count, e.g. 35B, 135M, 7000000000 (architecture form).
    #[arg(long)]
    params: Option<String>,
    /// Transformer blocks (architecture form).
    #[arg(long)]
    layers: Option<usize>,
    /// Attention heads (architecture form).
    #[arg(long)]
    heads: Option<usize>,
    /// KV heads [default: --heads] (architecture form).
    #[arg(long = "kv-heads")]
    kv_heads: Option<usize>,
    /// Head size [default: n_embd / heads] (architecture form).
    #[arg(long = "head-dim")]
    head_dim: Option<usize>,
    /// Embedding width [default: heads × head_dim] (architecture form).
    #[arg(long = "n-embd")]
    n_embd: Option<usize>,
    /// Feed-forward width [default: solved from --params, else 8/3 n_embd rounded up to 256].
    #[arg(long = "n-ff")]
    n_ff: Option<usize>,
    /// Vocabulary size [default: 32000] (architecture form).
    #[arg(long)]
    vocab: Option<usize>,
    /// Bits per weight, e.g. 4, 4.5 for Q4_0, 16 (architecture form).
    #[arg(long = "weight-bits")]
    weight_bits: Option<f64>,
    /// The output head reuses the token embedding (architecture form).
    #[arg(long)]
    tied_embeddings: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn plan(a: PlanArgs) -> memwall::Result<ExitCode> {
    use memwall::ground::{parse_count, parse_size};
    use memwall::plan::{ArchSpec, MemoryModel};
    let ram = parse_size(&a.ram)?;
    let budget = a.gpu_mem_budget.as_deref().map(parse_size).transpose()?;
    let m = match &a.model {
        Some(path) => {
            let arch_flags = [
                ("--params", a.params.is_some()),
                ("--layers", a.layers.is_some()),
                ("--heads", a.heads.is_some()),
                ("--kv-heads", a.kv_heads.is_some()),
                ("--head-dim", a.head_dim.is_some()),
                ("--n-embd", a.n_embd.is_some()),
                ("--n-ff", a.n_ff.is_some()),
                ("--vocab", a.vocab.is_some()),
                ("--weight-bits", a.weight_bits.is_some()),
                ("--tied-embeddings", a.tied_embeddings),
            ];
            if let Some((flag, _)) = arch_flags.iter().find(|(_, set)| *set) {
                return Err(memwall::Error::InvalidArgument(format!(
                    "{flag} describes an architecture; with -m the file gives it"
                )));
            }
            let (g, cfg) = memwall::config::open_model(path)?;
            let n_ctx = a.ctx.unwrap_or(cfg.n_ctx_train.min(4096));
            let kv_bits = a.kv_bits.unwrap_or(a.cache.types().mean_bits());
            let mut m = MemoryModel::from_gguf(&g, &cfg, n_ctx, kv_bits)?;
            if !a.no_repack {
                m = m.with_cpu_packing(&g, &cfg)?;
            }
            m.source = path.display().to_string();
            m
        }
        None => MemoryModel::from_arch(&ArchSpec {
            params: a.params.as_deref().map(parse_count).transpose()?,
            n_layer: a.layers,
            n_head: a.heads,
            n_head_kv: a.kv_heads,
            head_dim: a.head_dim,
            n_embd: a.n_embd,
            n_ff: a.n_ff,
            n_vocab: a.vocab,
            n_ctx: a.ctx,
            weight_bits: a.weight_bits,
            kv_bits: Some(a.kv_bits.unwrap_or(a.cache.types().mean_bits())),
            tied_embeddings: a.tied_embeddings,
        })?,
    };
    let report = memwall::plan::plan(&m, ram, budget);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn bench(a: BenchArgs) -> memwall::Result<ExitCode> {
    use memwall::tools::bench;
    let devices = bench::parse_devices(&a.device)?;
    let (mem_budget, stream_io) = a.budget.parse()?;
    let source = match (&a.draft.draft_model, a.draft.draft_lookup) {
        (Some(path), _) => Some(bench::DraftSource::Model {
            path: path.clone(),
            device: memwall::engine::DeviceChoice::parse(&a.draft.draft_device)?,
        }),
        (None, true) => Some(bench::DraftSource::Lookup),
        (None, false) => None,
    };
    let draft = source.map(|source| bench::BenchDraft {
        source,
        params: a.draft.params(),
        prompt: a
            .draft_prompt
            .clone()
            .unwrap_or_else(|| bench::speculative::DEFAULT_PROMPT.to_string()),
    });
    let opts = bench::BenchOptions {
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        reps: a.reps,
        threads: a.threads,
        probe: !a.no_probe,
        probe_bytes: match a.probe_mib {
            Some(m) => m.saturating_mul(1 << 20),
            None => bench::bandwidth::default_probe_bytes(),
        },
        f32_activations: a.f32_activations,
        no_repack: a.no_repack,
        cache_type_k: a.cache.k,
        cache_type_v: a.cache.v,
        mem_budget,
        stream_io,
        draft,
        ..Default::default()
    };
    if a.bandwidth {
        let probes = bench::run_probes(&opts, &devices)?;
        if a.json {
            let obj = serde_json::json!({"schema": bench::SCHEMA, "probes": probes});
            println!("{obj}");
        } else {
            print!("{}", bench::report::probes_table(&probes));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let path = a.model.unwrap_or_else(memwall::engine::default_model_path);
    let tty = !a.json && std::io::stderr().is_terminal();
    let report = bench::run_bench(&path, &opts, &devices, |c| {
        if tty {
            eprintln!(
                "{}: decode {:.2} t/s, prefill {:.1} t/s",
                c.device_name, c.decode_tps.mean, c.prefill_tps.mean
            );
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        println!("{}", bench::report::header(&report));
        print!("{}", bench::report::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub(crate) struct BenchKernelsArgs {
    /// Adapters: all, or a comma list of auto|<index>|<name substring> (see `memwall devices`;
    /// WGPU_BACKEND restricts what `all` finds).
    #[arg(short = 'd', long, default_value = "auto")]
    device: String,
    /// Weight shapes, a comma list of test (the test model's), 7b, 35b, all.
    #[arg(long, default_value = "test,7b")]
    shapes: String,
    /// Weight formats, a comma list of ggml names (q4_0,q4_1,q8_0,q4_k,q6_k,f16).
    #[arg(long, default_value = "q4_0,q4_1,q8_0,q4_k,q6_k,f16")]
    formats: String,
    /// Timed submissions per result (the median counts).
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// CI smoke mode: tiny shapes, 2 repetitions, a small bandwidth probe.
    #[arg(long)]
    smoke: bool,
    /// MiB of the read-bandwidth probe's buffer (capped by the binding limit).
    #[arg(long, default_value_t = 256)]
    probe_mib: u64,
    /// Print the report as JSON (schema memwall.bench-kernels/2); progress goes to stderr.
    #[arg(long)]
    json: bool,
    /// Write a roofline chart (SVG) of the results.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Time the kernels by the host's wall clock even where the adapter has GPU timestamps.
    #[arg(long)]
    wall_clock: bool,
    /// Test hook: perturb every reference so that every check must fail.
    #[arg(long, hide = true)]
    inject_fault: bool,
}

pub(crate) fn bench_kernels(a: BenchKernelsArgs) -> memwall::Result<ExitCode> {
    use memwall::tools::bench::kernels as bk;
    let mut shapes = Vec::new();
    let items = if a.smoke { "smoke" } else { a.shapes.as_str() };
    for item in items.split(',').filter(|s| !s.trim().is_empty()) {
        shapes.extend(bk::shapes(item)?);
    }
    let formats = a
        .formats
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|f| {
            bk::FORMATS
                .into_iter()
                .find(|w| w.ggml().name().eq_ignore_ascii_case(f.trim()))
                .ok_or_else(|| {
                    memwall::Error::InvalidArgument(format!(
                        "--formats: {f:?} is not one of q4_0,q4_1,q8_0,q4_k,q6_k,f16"
                    ))
                })
        })
        .collect::<memwall::Result<Vec<_>>>()?;
    let opts = bk::KernelsOptions {
        device: a.device,
        shapes,
        reps: if a.smoke { 2 } else { a.reps },
        formats,
        probe_bytes: if a.smoke { 4 << 20 } else { a.probe_mib << 20 },
        probe_runs: if a.smoke { 2 } else { 5 },
        fault: a.inject_fault,
        wall_clock: a.wall_clock,
    };
    let report = bk::run_kernels_bench(&opts, |line| eprintln!("{line}"))?;
    if let Some(path) = &a.plot {
        std::fs::write(path, memwall::tools::bench::plot::roofline_svg(&report)).map_err(|e| {
            memwall::Error::InvalidArgument(format!("--plot {}: {e}", path.display()))
        })?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print!("{}", bk::report::table(&report));
    }
    Ok(if report.failures() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub(crate) fn synth(a: SynthArgs) -> memwall::Result<ExitCode> {
    use memwall::tools::bench::synth;
    let (ty, q4_k_m) = synth::parse_weights(&a.ty)?;
    let opts = synth::SynthOptions {
        router_skew: a.router_skew,
        q4_k_m,
        ..synth::SynthOptions::new(synth::Preset::parse(&a.preset)?, a.layers, ty, a.seed)
    };
    let tty = std::io::stderr().is_terminal();
    let r = synth::write_synth(&a.output, &opts, &mut |done, total| {
        if tty {
            eprint!("\r{} / {} MiB", done >> 20, total >> 20);
        }
    })?;
    if tty {
        eprintln!();
    }
    let ffn = match r.shape.moe {
        Some(m) => format!(
            "{} experts of width {} ({} per token)",
            m.n_expert, m.n_ff_exp, m.n_expert_used
        ),
        None => format!("n_ff {}", r.shape.n_ff),
    };
    println!(
        "wrote {}: {} layers, n_embd {}, {ffn}, heads {}/{} of {}, vocab {}, {} ({} parameters, {} bytes)",
        a.output.display(),
        r.shape.n_layer,
        r.shape.n_embd,
        r.shape.n_head,
        r.shape.n_head_kv,
        r.shape.head_dim(),
        r.shape.n_vocab,
        r.ty,
        r.n_params,
        r.file_bytes
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn selftest(device: &str, json: bool) -> memwall::Result<ExitCode> {
    if device.trim().eq_ignore_ascii_case("cpu") {
        return Err(memwall::Error::InvalidArgument(
            "selftest checks a GPU driver; --device cpu has no driver to check (the CPU \
             kernels are checked by the test suite). Use auto, gpu, an index or a name from \
             `memwall devices`"
                .into(),
        ));
    }
    let selector = memwall::gpu::DeviceSelector::parse(device)?;
    let ctx = memwall::gpu::GpuContext::new(&selector)?;
    let rows = memwall::gpu::health::selftest::run_selftest(&ctx)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    } else {
        println!(
            "{} ({}, {}): subgroup {}, f16 {}",
            ctx.info.name,
            ctx.info.backend,
            ctx.info.driver_info,
            ctx.has_subgroups(),
            ctx.has_f16()
        );
        print!("{}", memwall::gpu::health::selftest::table(&rows));
    }
    if rows.iter().all(|r| r.pass) {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

pub(crate) fn inspect(file: &PathBuf) -> memwall::Result<ExitCode> {
    let g = memwall::gguf::Gguf::open(file)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A closed pipe (`memwall inspect f | head`) is not an error worth a message.
    let _ = memwall::tools::inspect::inspect(&g, &mut out).and_then(|()| out.flush());
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn check(file: &PathBuf, json: bool) -> memwall::Result<ExitCode> {
    let report = memwall::tools::check::check_file(file);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else if report.is_ok() {
        println!(
            "OK: {} tensors, {} bytes checked",
            report.n_tensors, report.bytes_checked
        );
        if !report.size_checked_only.is_empty() {
            println!(
                "note: {} tensor(s) of types without a scale table were size-checked only",
                report.size_checked_only.len()
            );
        }
    } else {
        for p in &report.problems {
            println!("{}: {p}", file.display());
        }
        println!("FAILED: {} problem(s)", report.problems.len());
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(crate) fn quantize(a: QuantizeArgs) -> memwall::Result<ExitCode> {
    let ty = memwall::tools::bench::requant::parse_target(&a.ty)?;
    let r = memwall::tools::bench::requant::requantize(&a.model, &a.output, ty)?;
    println!(
        "wrote {}: {} matrices as {ty}, {} tensors copied, {} bytes",
        a.output.display(),
        r.converted,
        r.copied,
        r.file_bytes
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn upcycle(a: UpcycleArgs) -> memwall::Result<ExitCode> {
    use memwall::tools::bench::upcycle::{upcycle, UpcycleOptions};
    let o = UpcycleOptions {
        n_expert: a.experts,
        n_expert_used: a.used,
        distinct: a.distinct,
        seed: a.seed,
    };
    let r = upcycle(&a.model, &a.output, &o)?;
    println!(
        "wrote {}: {} blocks of {} {} experts ({} per token{}), {} bytes",
        a.output.display(),
        r.n_layer,
        r.n_expert,
        r.expert_type,
        r.n_expert_used,
        if a.distinct {
            ", distinct"
        } else {
            ", identical"
        },
        r.file_bytes
    );
    Ok(ExitCode::SUCCESS)
}
