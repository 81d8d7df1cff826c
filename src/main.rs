//! The `memwall` command line: parses arguments and calls the library.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use memwall::api;
use memwall::chat::ChatMessage;
use memwall::engine::{CtxOverflow, LoadOptions, Session};
use memwall::kv_type::{KvType, KvTypes};
use memwall::prompt_cache::PromptCache;
use memwall::sampler::SamplerParams;

#[derive(Parser)]
#[command(
    name = "memwall",
    version,
    about = "LLM inference through the memory wall: GGUF models on CPU and GPU"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
    /// Log memwall's decisions (placement, offload policy, KV cache moves) to stderr.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// GGUF model file [default: $MEMWALL_MODEL, else the cached test model
    /// ~/.cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// CPU worker threads [default: all cores]
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Where to run: cpu, gpu (any adapter, lavapipe included), auto (a hardware GPU, else
    /// the CPU), an adapter index or a name substring from `memwall devices`. wgpu's
    /// WGPU_BACKEND and WGPU_ADAPTER_NAME narrow what is found.
    #[arg(short = 'd', long, default_value = "auto")]
    device: String,
    /// Keep matmul activations in f32 instead of 8-bit chunks (slower on the CPU; the mode in
    /// which the CPU and GPU paths agree to f32 rounding).
    #[arg(long)]
    f32_activations: bool,
    /// Run the last N transformer blocks and the output head on the GPU and the rest on the
    /// CPU (the hidden state crosses once per token) [default: every stage on the GPU device].
    #[arg(long = "gpu-layers", visible_alias = "ngl", value_name = "N")]
    gpu_layers: Option<usize>,
    /// GPU memory the model may use (weights, KV cache, scratch, staging), e.g. 512M or 6G
    /// (K/M/G = powers of 1024, KB/MB/GB = powers of 1000): the stages that fit go to the GPU,
    /// the others run on the CPU (or, with --stream, on the GPU from the mmap).
    #[arg(long = "gpu-mem-budget", value_name = "SIZE")]
    gpu_mem_budget: Option<String>,
    /// With --gpu-mem-budget: run every block on the GPU, streaming the weights of those that
    /// are not resident through two block-sized slots.
    #[arg(long)]
    stream: bool,
    /// Re-decide the CPU/GPU placement every N decoded tokens (and at each prompt) from
    /// measured stage times; 0 keeps the placement fixed.
    #[arg(long = "resample-every", value_name = "N", default_value_t = 0)]
    resample_every: usize,
    #[command(flatten)]
    cache: CacheTypeArgs,
}

/// KV cache element types, for keys and values separately.
#[derive(Args, Clone)]
struct CacheTypeArgs {
    /// Key cache type: f32, f16, q8_0, q4_0 [default: f16]. Keys are more sensitive to
    /// quantization than values: q8_0 is the usual choice.
    #[arg(long = "cache-type-k", value_name = "TYPE", value_parser = parse_kv_type)]
    k: Option<KvType>,
    /// Value cache type: f32, f16, q8_0, q4_0 [default: f16]; q4_0 costs little quality.
    #[arg(long = "cache-type-v", value_name = "TYPE", value_parser = parse_kv_type)]
    v: Option<KvType>,
}

impl CacheTypeArgs {
    /// The chosen types, the defaults for those left out.
    fn types(&self) -> KvTypes {
        KvTypes {
            k: self.k.unwrap_or_default(),
            v: self.v.unwrap_or_default(),
        }
    }
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    s.parse::<KvType>().map_err(|e| e.to_string())
}

impl ModelArgs {
    fn path(&self) -> PathBuf {
        self.model
            .clone()
            .unwrap_or_else(memwall::engine::default_model_path)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it, then print timings.
    Run(RunArgs),
    /// Print the token ids of TEXT as a JSON array.
    Tokenize {
        #[command(flatten)]
        model: ModelArgs,
        /// Treat special-token text (e.g. "<|im_start|>") as plain text.
        #[arg(long)]
        no_parse_special: bool,
        /// The text to tokenize.
        text: String,
    },
    /// Perplexity over consecutive windows of CTX tokens, scoring each window's second half
    /// (as llama.cpp's llama-perplexity does).
    Perplexity {
        #[command(flatten)]
        model: ModelArgs,
        /// Text file to score.
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Window size in tokens.
        #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
        ctx: usize,
        /// Print {"ppl":..,"n_chunks":..} instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a GGUF file's metadata and tensor table.
    Inspect {
        /// The GGUF file.
        file: PathBuf,
    },
    /// Verify a whole GGUF file (structure, tensor sizes, finite scales and float values);
    /// exits non-zero listing each problem.
    Check {
        /// The GGUF file.
        file: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the GPU adapters wgpu finds (honours WGPU_BACKEND and WGPU_ADAPTER_NAME).
    Devices {
        /// Print the adapters as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Memory plan: weights + KV cache + runtime per device against RAM (and a GPU budget),
    /// whether it fits, and the placement memwall would use. Give a GGUF file (-m) or
    /// architecture numbers (--params/--layers/--heads/...).
    #[command(after_help = SIZE_UNITS)]
    Plan(PlanArgs),
    /// Benchmark prefill and decode per device (as llama-bench does), with the bytes each
    /// decoded token moves, the achieved GB/s and the device's measured bandwidth.
    Bench(BenchArgs),
    /// Benchmark every weight-matrix kernel variant x format x shape on each adapter: time,
    /// GB/s, GFLOP/s, fraction of the measured read bandwidth, and a check against kernels-ref
    /// (exits non-zero when a check fails).
    BenchKernels(BenchKernelsArgs),
    /// Write a synthetic llama-architecture GGUF with random weights at real layer widths.
    Synth(SynthArgs),
    /// Rewrite a GGUF with every weight matrix requantized (kernels-ref) to one type, to
    /// compare formats on the same model.
    Quantize(QuantizeArgs),
    /// Check the GPU driver: run every kernel variant the adapter supports against the
    /// reference kernels and print a table; exits non-zero on any failure or with no adapter.
    Selftest {
        /// The adapter: auto|gpu|<index>|<name substring> (see `memwall devices`).
        #[arg(long, default_value = "auto")]
        device: String,
        /// Print the rows as a JSON array.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct BenchArgs {
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
    #[command(flatten)]
    cache: CacheTypeArgs,
    /// Only measure each device's memory bandwidth (no model).
    #[arg(long)]
    bandwidth: bool,
    /// Skip the bandwidth probes.
    #[arg(long)]
    no_probe: bool,
    /// MiB per bandwidth probe array (CPU) or buffer (GPU, capped by the binding limit).
    #[arg(long, default_value_t = 256)]
    probe_mib: u64,
    /// Print the results as one JSON object (schema: see `memwall::bench`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SynthArgs {
    /// Output GGUF file.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Layer widths: tiny, 1b (Llama-3.2-1B), 7b (Llama-2-7B), 35b (CodeLlama-34B).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Layers [default: 2].
    #[arg(long)]
    layers: Option<usize>,
    /// Weight type of every matrix: q4_0, q4_1, q8_0, f16.
    #[arg(long = "type", default_value = "q4_0")]
    ty: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct QuantizeArgs {
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

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Context size in tokens [default: the model's, capped at 4096].
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx: usize,
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    temp: f32,
    /// Top-k sampling (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) sampling (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p sampling (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty over the last 64 tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// RNG seed [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// Wrap the prompt in the model's own chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Report the K most likely tokens at each step (with --json).
    #[arg(long, default_value_t = 0)]
    n_probs: usize,
    /// Print one JSON object on the last line of stdout instead of streaming text.
    #[arg(long)]
    json: bool,
    /// When the context is full: `shift` keeps the first --keep tokens, drops half of the
    /// rest and goes on (a prompt longer than the context is processed with shifts); `stop`
    /// ends the generation (and refuses a prompt longer than the context).
    #[arg(long = "ctx-overflow", default_value = "shift")]
    ctx_overflow: String,
    /// Tokens a context shift keeps at the start [default: the BOS token, if the model adds
    /// one].
    #[arg(long)]
    keep: Option<usize>,
    /// Restore the longest prefix of the prompt cached in FILE, evaluate the rest, and save
    /// the prompt's KV state there (for another model or KV types, the file is refused).
    #[arg(long = "prompt-cache", value_name = "FILE")]
    prompt_cache: Option<PathBuf>,
}

/// How `plan` reads and prints sizes (its --help says it).
const SIZE_UNITS: &str = "Sizes (--ram, --gpu-mem-budget): K, M, G, T (or KiB, MiB, GiB, TiB) are \
powers of 1024; KB, MB, GB, TB are powers of 1000; a bare number is bytes; fractions round to \
the nearest byte (1.5G). The table prints decimal units (1 GB = 10^9 bytes); --json gives bytes.

Examples:
  memwall plan -m model.gguf --ctx 4096 --ram 8G --gpu-mem-budget 4G
  memwall plan --params 35B --layers 64 --heads 64 --kv-heads 8 --head-dim 128 --ctx 4096 \
      --weight-bits 4 --kv-bits 16 --ram 24G --json";

#[derive(Args)]
struct PlanArgs {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any GPU bring-up: wgpu reads the log level when it creates its instance.
    memwall::logging::init(cli.verbose);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the model for a run with a context of `n_ctx` tokens (0: the model's default; the
/// GPU budget is planned for it).
fn load(args: &ModelArgs, n_ctx: usize, quiet: bool) -> memwall::Result<api::Model> {
    let path = args.path();
    let opts = LoadOptions {
        threads: args.threads,
        device: memwall::engine::DeviceChoice::parse(&args.device)?,
        f32_activations: args.f32_activations,
        gpu_layers: args.gpu_layers,
        gpu_mem_budget: args
            .gpu_mem_budget
            .as_deref()
            .map(memwall::plan::parse_size)
            .transpose()?,
        stream: args.stream,
        resample_every: (args.resample_every > 0).then_some(args.resample_every),
        n_ctx,
        cache_type_k: args.cache.k,
        cache_type_v: args.cache.v,
        ..Default::default()
    };
    let show = !quiet && std::io::stderr().is_terminal();
    let bar = show.then(|| {
        let pb = indicatif::ProgressBar::new(0);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {msg} [{bar:30}] {bytes}/{total_bytes}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb.set_message(path.display().to_string());
        pb
    });
    let model =
        api::ModelConfig::with_options(&path, opts).load_with_progress(&mut |done, total| {
            if let Some(pb) = &bar {
                pb.set_length(total);
                pb.set_position(done);
            }
        });
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let model = model?;
    if let Some(note) = model.device_note() {
        if !quiet {
            eprintln!("{note}");
        }
    }
    if let Some(g) = model.engine().gpu() {
        for w in &g.warnings {
            eprintln!("warning: {w}");
        }
    }
    Ok(model)
}

fn dispatch(cli: Cli) -> memwall::Result<ExitCode> {
    match cli.cmd {
        Command::Run(a) => run(a),
        Command::Tokenize {
            model,
            no_parse_special,
            text,
        } => {
            // The tokenizer alone: works on vocabulary-only files and reads no weights.
            let g = memwall::gguf::Gguf::open(model.path())?;
            let tok = memwall::tokenizer::Tokenizer::from_gguf(&g)?;
            let ids = tok.encode(&text, true, !no_parse_special);
            println!("{}", serde_json::to_string(&ids).unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Command::Perplexity {
            model,
            file,
            ctx,
            json,
        } => {
            let text = std::fs::read_to_string(&file).map_err(|source| memwall::Error::Io {
                path: file.clone(),
                source,
            })?;
            let model = load(&model, ctx, json)?;
            let model = model.engine();
            let ids = model.tokenizer().encode(&text, true, false);
            let tty = !json && std::io::stderr().is_terminal();
            let n_chunks = ids.len() / ctx.max(1);
            let r = memwall::engine::perplexity(model, &ids, ctx, |i, p| {
                if tty {
                    eprint!("\r[{}/{}] running PPL {p:.4}", i + 1, n_chunks);
                }
            })?;
            if tty {
                eprintln!();
            }
            if json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            } else {
                println!(
                    "PPL = {:.4} +/- {:.4} ({} chunks of {ctx}, {} tokens scored)",
                    r.ppl, r.ppl_err, r.n_chunks, r.n_scored
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { file } => inspect(&file),
        Command::Check { file, json } => check(&file, json),
        Command::Devices { json } => {
            let rows = memwall::gpu::list_adapters();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                print!("{}", memwall::gpu::device::adapters_table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Selftest { device, json } => selftest(&device, json),
        Command::Plan(a) => plan(a),
        Command::Bench(a) => bench(a),
        Command::BenchKernels(a) => bench_kernels(a),
        Command::Synth(a) => synth(a),
        Command::Quantize(a) => {
            let ty = memwall::bench::requant::parse_target(&a.ty)?;
            let r = memwall::bench::requant::requantize(&a.model, &a.output, ty)?;
            println!(
                "wrote {}: {} matrices as {ty}, {} tensors copied, {} bytes",
                a.output.display(),
                r.converted,
                r.copied,
                r.file_bytes
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn plan(a: PlanArgs) -> memwall::Result<ExitCode> {
    use memwall::plan::{parse_count, parse_size, ArchSpec, MemoryModel};
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
            let g = memwall::gguf::Gguf::open(path)?;
            let cfg = memwall::config::Config::from_gguf(&g)?;
            let n_ctx = a.ctx.unwrap_or(cfg.n_ctx_train.min(4096));
            let kv_bits = a.kv_bits.unwrap_or(a.cache.types().mean_bits());
            let mut m = MemoryModel::from_gguf(&g, &cfg, n_ctx, kv_bits)?;
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

fn bench(a: BenchArgs) -> memwall::Result<ExitCode> {
    use memwall::bench;
    let devices = bench::parse_devices(&a.device)?;
    let opts = bench::BenchOptions {
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        reps: a.reps,
        threads: a.threads,
        probe: !a.no_probe,
        probe_bytes: a.probe_mib.saturating_mul(1 << 20),
        f32_activations: a.f32_activations,
        cache_type_k: a.cache.k,
        cache_type_v: a.cache.v,
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
struct BenchKernelsArgs {
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
    /// Print the report as JSON (schema memwall.bench-kernels/1); progress goes to stderr.
    #[arg(long)]
    json: bool,
    /// Write a roofline chart (SVG) of the results.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Test hook: perturb every reference so that every check must fail.
    #[arg(long, hide = true)]
    inject_fault: bool,
}

fn bench_kernels(a: BenchKernelsArgs) -> memwall::Result<ExitCode> {
    use memwall::bench::kernels as bk;
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
    };
    let report = bk::run_kernels_bench(&opts, |line| eprintln!("{line}"))?;
    if let Some(path) = &a.plot {
        std::fs::write(path, memwall::bench::plot::roofline_svg(&report)).map_err(|e| {
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

fn synth(a: SynthArgs) -> memwall::Result<ExitCode> {
    use memwall::bench::synth;
    let opts = synth::SynthOptions::new(
        synth::Preset::parse(&a.preset)?,
        a.layers,
        synth::parse_type(&a.ty)?,
        a.seed,
    );
    let tty = std::io::stderr().is_terminal();
    let r = synth::write_synth(&a.output, &opts, &mut |done, total| {
        if tty {
            eprint!("\r{} / {} MiB", done >> 20, total >> 20);
        }
    })?;
    if tty {
        eprintln!();
    }
    println!(
        "wrote {}: {} layers, n_embd {}, n_ff {}, heads {}/{}, vocab {}, {} ({} parameters, {} bytes)",
        a.output.display(),
        r.shape.n_layer,
        r.shape.n_embd,
        r.shape.n_ff,
        r.shape.n_head,
        r.shape.n_head_kv,
        r.shape.n_vocab,
        r.ty,
        r.n_params,
        r.file_bytes
    );
    Ok(ExitCode::SUCCESS)
}

fn selftest(device: &str, json: bool) -> memwall::Result<ExitCode> {
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
    let rows = memwall::gpu::selftest::run_selftest(&ctx)?;
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
        print!("{}", memwall::gpu::selftest::table(&rows));
    }
    if rows.iter().all(|r| r.pass) {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

fn inspect(file: &PathBuf) -> memwall::Result<ExitCode> {
    let g = memwall::gguf::Gguf::open(file)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A closed pipe (`memwall inspect f | head`) is not an error worth a message.
    let _ = memwall::inspect::inspect(&g, &mut out).and_then(|()| out.flush());
    Ok(ExitCode::SUCCESS)
}

fn check(file: &PathBuf, json: bool) -> memwall::Result<ExitCode> {
    let report = memwall::check::check_file(file);
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

/// What `--prompt-cache` did before the generation.
struct CacheUse {
    /// Prompt tokens restored from the file.
    restored: usize,
    /// Prompt tokens in the session when the generation starts (all but the last).
    n_cached: usize,
    /// Bytes saved (0: the file already held this prompt).
    saved_bytes: u64,
    /// Milliseconds spent restoring, evaluating and saving.
    ms: f64,
}

/// Restores the longest cached prefix of `prompt` from `path` (when the file exists), evaluates
/// the prompt but its last token, and saves that state to `path` when it holds more than the
/// file did. The last token is left to `generate`, which needs its logits.
fn prompt_cache_prefill(
    session: &mut Session,
    path: &std::path::Path,
    prompt: &[u32],
) -> memwall::Result<CacheUse> {
    let t0 = std::time::Instant::now();
    let restored = if path.exists() {
        let cache = PromptCache::load(path, session)?;
        session.restore_prefix(&cache, prompt)?
    } else {
        0
    };
    let n_cached = prompt.len().saturating_sub(1);
    if n_cached > restored {
        session.eval(&prompt[restored..n_cached], memwall::model::Logits::None)?;
    }
    let mut saved_bytes = 0;
    if n_cached > restored {
        if session.tokens() == &prompt[..n_cached] {
            saved_bytes = session.save_prompt_cache(path)?;
        } else {
            // The prompt did not fit the context: its state is a shifted one.
            log::warn!(
                "prompt cache not saved: the prompt does not fit the context of {}",
                session.n_ctx()
            );
        }
    }
    Ok(CacheUse {
        restored,
        n_cached,
        saved_bytes,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

fn run(a: RunArgs) -> memwall::Result<ExitCode> {
    let model = load(&a.model, a.ctx, a.json)?;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let mut session = model.session()?;
    session.set_sampler(SamplerParams {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: 64,
        seed,
    })?;
    session.set_max_tokens(a.n_predict);
    session.set_n_probs(a.n_probs);
    if let Some(k) = a.keep {
        if k >= session.n_ctx() {
            return Err(memwall::Error::InvalidArgument(format!(
                "--keep {k} must be smaller than the context of {} tokens",
                session.n_ctx()
            )));
        }
    }
    session.set_ctx_overflow(CtxOverflow::parse(&a.ctx_overflow)?, a.keep);
    let json = a.json;
    let mut stdout = std::io::stdout();
    let message = || [ChatMessage::new("user", a.prompt.clone())];
    // With --prompt-cache, the prompt's tokens but the last come from the file (or are
    // evaluated and saved to it) before the stream starts on what is left.
    let (cache, mut stream) = match &a.prompt_cache {
        Some(path) => {
            let text = if a.chat {
                model.engine().render_chat(&message())?
            } else {
                a.prompt.clone()
            };
            let prompt = model.engine().tokenizer().encode(&text, true, true);
            let c = prompt_cache_prefill(session.engine_mut(), path, &prompt)?;
            let rest = prompt[c.n_cached..].to_vec();
            (Some((c, prompt)), session.prompt_tokens(&rest)?)
        }
        None if a.chat => (None, session.chat(&message())?),
        None => (None, session.prompt(&a.prompt)?),
    };
    let mut gen = None;
    while let Some(ev) = stream.next() {
        match ev? {
            api::Event::Done(done) => gen = Some(*done),
            api::Event::DeviceFallback(f) => eprintln!("warning: {f}; going on on the CPU"),
            // A closed pipe ends the generation instead of failing it.
            ev if !json
                && !ev.text().is_empty()
                && (stdout.write_all(ev.text().as_bytes()).is_err() || stdout.flush().is_err()) =>
            {
                stream.stop()
            }
            _ => {}
        }
    }
    drop(stream);
    let gen = gen.ok_or_else(|| memwall::Error::InvalidArgument("no generation".into()))?;
    let mut t = gen.timings.clone();
    let prompt = match &cache {
        Some((c, prompt)) => {
            // The time to first token counts restoring, evaluating and saving the prompt.
            t.ttft_ms += c.ms;
            t.n_prompt = prompt.len();
            prompt.clone()
        }
        None => gen.prompt_ids.clone(),
    };
    let cache = cache.map(|(c, _)| c);
    let session = session.engine();
    let model = model.engine();
    if json {
        let mut obj = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": gen.generated_ids,
            "text": gen.text,
            "stop": gen.stop,
            "timings": {
                "load_ms": t.load_ms,
                "ttft_ms": t.ttft_ms,
                "prefill_tps": t.prefill_tps,
                "decode_tps": t.decode_tps,
                "weight_bytes_per_token": model.weight_bytes_per_token(),
            },
            "device": session.backend_name(),
            "placement": {
                "prefill": session.exec().placement().prefill.compact(),
                "decode": session.exec().placement().decode.compact(),
            },
            "exec": session.exec().stats,
            "ctx_shift": session.shift_stats(),
            "fallbacks": gen.fallbacks,
        });
        if let Some(c) = &cache {
            obj["prompt_cache"] = serde_json::json!({
                "restored_tokens": c.restored,
                "saved_bytes": c.saved_bytes,
                "ms": c.ms,
            });
        }
        if let Some(g) = model.gpu() {
            // The start-up check: variants tested in this load, the record and pipeline
            // cache used (README "Start-up").
            obj["gpu_startup"] = serde_json::to_value(&g.health).unwrap_or_default();
        }
        if let Some(r) = session.exec().policy_report() {
            obj["policy"] = serde_json::to_value(r).unwrap_or_default();
        }
        if a.n_probs > 0 {
            obj["top_probs"] = gen
                .top_probs
                .iter()
                .map(|step| {
                    step.iter()
                        .map(|&(id, prob)| serde_json::json!({"id": id, "prob": prob}))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
                .into();
        }
        println!("{obj}");
    } else {
        println!();
        let gbps = t.decode_tps * model.weight_bytes_per_token() as f64 / 1e9;
        eprintln!(
            "{} | load {:.0} ms | first token {:.1} ms | prefill {} tokens at {:.1} tok/s | decode {} tokens at {:.1} tok/s ({gbps:.2} GB/s of weights)",
            session.backend_name(),
            t.load_ms,
            t.ttft_ms,
            t.n_prompt,
            t.prefill_tps,
            t.n_decoded,
            t.decode_tps
        );
    }
    Ok(ExitCode::SUCCESS)
}
