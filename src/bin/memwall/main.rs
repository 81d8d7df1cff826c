//! The `memwall` command line: parses arguments and calls the library.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use memwall::api::{
    self, ChatMessage, CtxOverflow, DraftParams, KvType, KvTypes, LoadOptions, PromptCache,
    SamplerParams, Session,
};

mod tools;
use tools::{
    bench, bench_kernels, check, inspect, plan, quantize, selftest, synth, upcycle, BenchArgs,
    BenchKernelsArgs, PlanArgs, QuantizeArgs, SynthArgs, UpcycleArgs, SIZE_UNITS,
};

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
    /// Do not pack the CPU's weights at load for its AVX-512 GEMM (saves their size in
    /// anonymous memory; the GEMM then rearranges them per call, slower decode).
    #[arg(long)]
    no_repack: bool,
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
    budget: BudgetArgs,
    #[command(flatten)]
    cache: CacheTypeArgs,
}

/// The memory budget and how streamed blocks are read.
#[derive(Args, Clone)]
struct BudgetArgs {
    /// Memory the process may hold (anonymous memory, mapped weights, KV cache, stream slots;
    /// a unified-memory GPU's buffers), e.g. 2G: blocks that do not fit stream from storage,
    /// read ahead of the compute [default: the cgroup limit, else available memory, less a
    /// margin].
    #[arg(long = "mem-budget", value_name = "SIZE")]
    mem_budget: Option<String>,
    /// How streamed blocks keep out of the page cache: direct (O_DIRECT) or drop-behind
    /// (buffered reads, dropped after use) [default: direct where the file system takes it].
    #[arg(long = "stream-io", value_name = "MODE")]
    stream_io: Option<String>,
}

impl BudgetArgs {
    /// The budget in bytes and the I/O mode, parsed.
    fn parse(&self) -> memwall::Result<(Option<u64>, Option<api::IoMode>)> {
        let budget = self.mem_budget.as_deref().map(api::parse_size);
        let io = self.stream_io.as_deref().map(api::IoMode::parse);
        Ok((budget.transpose()?, io.transpose()?))
    }
}

/// Speculative decoding's drafter and draft sizes (`run`, `bench`).
#[derive(Args, Clone)]
struct DraftArgs {
    /// Speculative decoding with a draft model of the same vocabulary (a smaller model of the
    /// family): it proposes up to --draft-max tokens and each pass of the model verifies them
    /// at once. Greedy output is plain decoding's; sampled output has its distribution. It
    /// loads first and shares the memory budget.
    #[arg(long = "draft-model", value_name = "FILE")]
    draft_model: Option<PathBuf>,
    /// Where the draft model runs (as --device).
    #[arg(long = "draft-device", default_value = "cpu")]
    draft_device: String,
    /// Speculative decoding by prompt lookup: the latest earlier occurrence of the context's
    /// last 4, 3 or 2 tokens proposes what followed it (code, edits, quoting).
    #[arg(long = "draft-lookup", conflicts_with = "draft_model")]
    draft_lookup: bool,
    /// Most tokens drafted per pass.
    #[arg(long = "draft-max", default_value_t = 16)]
    draft_max: usize,
    /// Fewer drafted tokens than this decode plainly.
    #[arg(long = "draft-min", default_value_t = 0)]
    draft_min: usize,
    /// The draft model stops proposing when its top token's probability is below this.
    #[arg(long = "draft-p-min", default_value_t = 0.75)]
    draft_p_min: f64,
}

impl DraftArgs {
    /// The draft sizes and stop rule.
    fn params(&self) -> DraftParams {
        DraftParams {
            max: self.draft_max,
            min: self.draft_min,
            p_min: self.draft_p_min,
        }
    }
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
        self.model.clone().unwrap_or_else(api::default_model_path)
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
    /// Turn a dense llama GGUF into a mixture of experts (Mixtral's layout) whose experts are
    /// its feed-forward, copied or made distinct: a real-text check of the MoE path.
    Upcycle(UpcycleArgs),
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
    #[command(flatten)]
    draft: DraftArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any GPU bring-up: wgpu reads the log level when it creates its instance.
    api::init_logging(cli.verbose);
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
    load_sharing(args, n_ctx, quiet, None)
}

/// `load`, sharing the memory budget with `shares_with` (a draft model loaded first).
fn load_sharing(
    args: &ModelArgs,
    n_ctx: usize,
    quiet: bool,
    shares_with: Option<&api::Model>,
) -> memwall::Result<api::Model> {
    let path = args.path();
    let (mem_budget, stream_io) = args.budget.parse()?;
    let opts = LoadOptions {
        threads: args.threads,
        device: api::DeviceChoice::parse(&args.device)?,
        f32_activations: args.f32_activations,
        no_repack: args.no_repack,
        gpu_layers: args.gpu_layers,
        gpu_mem_budget: args
            .gpu_mem_budget
            .as_deref()
            .map(api::parse_size)
            .transpose()?,
        stream: args.stream,
        mem_budget,
        stream_io,
        resample_every: (args.resample_every > 0).then_some(args.resample_every),
        n_ctx,
        cache_type_k: args.cache.k,
        cache_type_v: args.cache.v,
        mem_held: shares_with.and_then(api::Model::planned_bytes).unwrap_or(0),
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
    for w in model.warnings() {
        eprintln!("warning: {w}");
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
            let tok = api::open_tokenizer(model.path())?;
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
            // As llama-perplexity tokenizes: special tokens written in the text stay text.
            let ids = model.tokenizer().encode(&text, true, false);
            let tty = !json && std::io::stderr().is_terminal();
            let n_chunks = ids.len() / ctx.max(1);
            let r = api::perplexity(&model, &ids, ctx, |i, p| {
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
            let rows = api::list_adapters();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                print!("{}", api::adapters_table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Selftest { device, json } => selftest(&device, json),
        Command::Plan(a) => plan(a),
        Command::Bench(a) => bench(a),
        Command::BenchKernels(a) => bench_kernels(a),
        Command::Synth(a) => synth(a),
        Command::Quantize(a) => quantize(a),
        Command::Upcycle(a) => upcycle(a),
    }
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
        session.eval(&prompt[restored..n_cached], api::Logits::None)?;
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

/// The memory report of `run --json`: the plan, what the reader did, the measured peak and
/// the fraction of the storage floor decode reached.
fn memory_json(
    m: &api::MemoryReport,
    reads: Option<api::ReaderStats>,
    decode_tps: f64,
) -> serde_json::Value {
    let r = &m.residency;
    let limit = api::detect_limit();
    let peak = api::measured_peak(limit.as_ref());
    let mut v = serde_json::json!({
        "budget_bytes": m.budget_bytes,
        "limit_bytes": m.limit_bytes,
        "limit_source": m.limit_source,
        "minimum_bytes": r.minimum,
        "planned_bytes": r.planned_bytes,
        "resident_bytes": r.resident_bytes,
        "streamed_bytes_per_token": r.streamed_bytes,
        "resident_blocks": r.resident.iter().filter(|&&x| x).count(),
        "streamed_blocks": r.resident.iter().filter(|&&x| !x).count(),
        "slots": r.slots,
        "slot_bytes": r.slot_bytes,
        "prefill_batch": m.prefill_batch,
        "io_mode": m.io_mode,
        "peak_bytes": peak.map(|p| p.bytes),
        "peak_source": peak.map(|p| p.source),
    });
    if let Some(x) = &m.experts {
        v["experts"] = serde_json::to_value(x).unwrap_or_default();
    }
    if let Some(s) = reads {
        v["storage"] = serde_json::to_value(s).unwrap_or_default();
        // The floor: a token can go no faster than its streamed bytes arrive.
        if r.streamed_bytes > 0 && s.read_gbps > 0.0 {
            let floor = s.read_gbps * 1e9 / r.streamed_bytes as f64;
            v["storage_floor_tps"] = floor.into();
            v["floor_fraction"] = (decode_tps / floor).into();
        }
    }
    v
}

fn run(a: RunArgs) -> memwall::Result<ExitCode> {
    // A draft model loads first: it stays resident, and the model's plan gets what the
    // draft leaves of the one memory budget.
    let draft_model = match &a.draft.draft_model {
        Some(path) => {
            let args = ModelArgs {
                model: Some(path.clone()),
                device: a.draft.draft_device.clone(),
                ..a.model.clone()
            };
            Some(load(&args, a.ctx, true)?)
        }
        None => None,
    };
    let model = load_sharing(&a.model, a.ctx, a.json, draft_model.as_ref())?;
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
    session.set_ctx_overflow(CtxOverflow::parse(&a.ctx_overflow)?);
    session.set_keep(a.keep);
    let draft = a.draft.params();
    if let Some(d) = &draft_model {
        session.set_draft_model(d, draft)?;
    } else if a.draft.draft_lookup {
        session.set_draft_lookup(2, 4, draft)?;
    }
    let json = a.json;
    let mut stdout = std::io::stdout();
    let message = || [ChatMessage::new("user", a.prompt.clone())];
    // With --prompt-cache, the prompt's tokens but the last come from the file (or are
    // evaluated and saved to it) before the stream starts on what is left.
    let (cache, mut stream) = match &a.prompt_cache {
        Some(path) => {
            let text = if a.chat {
                model.render_chat(&message())?
            } else {
                a.prompt.clone()
            };
            let prompt = model.tokenize(&text, true);
            let c = prompt_cache_prefill(&mut session, path, &prompt)?;
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
                "prefill": session.placement().prefill.compact(),
                "decode": session.placement().decode.compact(),
            },
            "exec": session.exec_stats(),
            "ctx_shift": session.shift_stats(),
            "fallbacks": gen.fallbacks,
        });
        if let Some(sp) = &gen.speculative {
            obj["speculative"] = serde_json::json!({
                "passes": sp.passes,
                "drafted": sp.drafted,
                "accepted": sp.accepted,
                "acceptance": sp.acceptance(),
                "tokens_per_pass": sp.tokens_per_pass(),
            });
        }
        if let Some(x) = model.expert_stats() {
            // Since the load: the prompt's passes and the decoded tokens'.
            obj["experts"] = serde_json::json!({
                "hits": x.hits,
                "misses": x.misses,
                "hit_rate": x.hit_rate(),
                "bytes_read": x.bytes_read,
                "read_s": x.read_s,
                "wait_s": x.wait_s,
                "read_ahead": x.read_ahead,
                "read_ahead_used": x.read_ahead_used,
                "held": x.held,
                "held_bytes": x.held_bytes,
                "capacity_bytes": x.capacity_bytes,
            });
        }
        if let Some(c) = &cache {
            obj["prompt_cache"] = serde_json::json!({
                "restored_tokens": c.restored,
                "saved_bytes": c.saved_bytes,
                "ms": c.ms,
            });
        }
        if let Some(h) = model.gpu_startup() {
            // The start-up check: variants tested in this load, the record and pipeline
            // cache used (docs/embedding.md, "Start-up").
            obj["gpu_startup"] = serde_json::to_value(h).unwrap_or_default();
        }
        if let Some(r) = session.policy_report() {
            obj["policy"] = serde_json::to_value(r).unwrap_or_default();
        }
        if let Some(m) = model.memory() {
            obj["memory"] = memory_json(m, session.stream_stats(), t.decode_tps);
        } else if model.mem_budget().is_some() || session.stream_stats().is_some() {
            let s = session.stream_stats();
            // A GPU streaming its non-resident blocks through the storage reader.
            let limit = api::detect_limit();
            let peak = api::measured_peak(limit.as_ref());
            obj["memory"] = serde_json::json!({
                "budget_bytes": model.mem_budget(),
                "storage": s,
                "peak_bytes": peak.map(|p| p.bytes),
                "peak_source": peak.map(|p| p.source),
            });
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
        if let Some(x) = model.expert_stats() {
            eprintln!(
                "experts: {:.1}% of {} needed were held ({} of {} cached), {:.1} MB read from \
                 storage in {:.2} s ({:.2} s of it waited for); {} read ahead on a guess, {} of \
                 them used",
                100.0 * x.hit_rate(),
                x.hits + x.misses,
                x.held,
                api::format_size(x.capacity_bytes),
                x.bytes_read as f64 / 1e6,
                x.read_s,
                x.wait_s,
                x.read_ahead,
                x.read_ahead_used
            );
        }
        if let Some(sp) = &gen.speculative {
            eprintln!(
                "drafts: {} of {} accepted ({:.0}%), {:.2} tokens per pass of the model",
                sp.accepted,
                sp.drafted,
                100.0 * sp.acceptance(),
                sp.tokens_per_pass()
            );
        }
        if let (Some(m), Some(st)) = (model.memory(), session.stream_stats()) {
            let r = &m.residency;
            let n_streamed = r.resident.iter().filter(|&&x| !x).count();
            eprintln!(
                "memory budget {}: {} of {} blocks streamed from storage, {} per token, read at \
                 {:.2} GB/s ({} waits for storage)",
                api::format_size(m.budget_bytes),
                n_streamed,
                r.resident.len(),
                api::format_size(r.streamed_bytes),
                st.read_gbps,
                st.waits
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
