//! The memory budget on the CPU path: blocks that do not fit stream from storage through the
//! reader, with the same logits as the all-resident model, the measured peak within the
//! budget, and a budget below the minimum refused naming it.

mod common;

use std::process::Command;
use std::sync::Mutex;

use memwall::engine::{DeviceChoice, LoadOptions, Model};
use memwall::memory::IoMode;
use memwall::model::Logits;

/// The plan counts the memory the process holds at load, so loads in this file run one at a
/// time (test threads share the process).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn opts(budget: u64, io: Option<IoMode>, no_repack: bool) -> LoadOptions {
    LoadOptions {
        device: DeviceChoice::Cpu,
        mem_budget: Some(budget),
        stream_io: io,
        no_repack,
        n_ctx: 256,
        ..Default::default()
    }
}

fn load(o: &LoadOptions) -> Model {
    Model::load(common::model_path(), o).unwrap()
}

/// The logits of a 150-token prompt (three prefill batches) and 6 greedy tokens after it.
fn logits(m: &Model) -> Vec<Vec<f32>> {
    let mut s = m.session_with_ctx(256).unwrap();
    let prompt: Vec<u32> = (0..150).map(|i| 100 + (i * 37) % 4000).collect();
    let n_vocab = m.config().n_vocab;
    let mut out = vec![s.eval(&prompt, Logits::All).unwrap()];
    for _ in 0..6 {
        // The last row: the prompt's last token's, then the one token's.
        let last = out.last().unwrap();
        let id = memwall::sampler::argmax(&last[last.len() - n_vocab..]) as u32;
        let l = s.eval(&[id], Logits::Last).unwrap();
        out.push(l);
    }
    out
}

/// The smallest budget a load in this process would take now (the plan counts what the process
/// holds), from the refusal of a budget of one byte.
fn minimum_now(no_repack: bool) -> u64 {
    match Model::load(common::model_path(), &opts(1, None, no_repack)) {
        Err(memwall::Error::MemoryBudget { minimum, .. }) => minimum,
        other => panic!("a one-byte budget was not refused: {other:?}"),
    }
}

#[test]
fn streamed_blocks_give_the_resident_models_logits_bit_for_bit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for no_repack in [false, true] {
        let mut streamed = Vec::new();
        for io in [None, Some(IoMode::DropBehind)] {
            // The minimum and about a quarter of the blocks' 96 MB: the rest stream. The
            // minimum counts what the process holds when it is measured, which the pages the
            // previous loads freed can still move by more than the 24 MB margin before the
            // load: up to three measurements, each followed by its load.
            let mut tries = Vec::new();
            let (budget, m, r, n_streamed) = loop {
                let budget = minimum_now(no_repack) + (24 << 20);
                let m = load(&opts(budget, io, no_repack));
                let r = m
                    .memory()
                    .expect("a memory plan on the CPU")
                    .residency
                    .clone();
                let n_streamed = r.resident.iter().filter(|&&x| !x).count();
                tries.push((n_streamed, budget));
                if (n_streamed > 10 && n_streamed < 30) || tries.len() == 3 {
                    break (budget, m, r, n_streamed);
                }
            };
            assert!(
                n_streamed > 10 && n_streamed < 30,
                "(blocks streamed of 30, budget in bytes) of each try: {tries:?}"
            );
            assert!(r.planned_bytes <= budget, "{r:?}");
            streamed.push((io, logits(&m)));
            // Every streamed block was read for every pass.
            let mut s = m.session_with_ctx(256).unwrap();
            s.eval(&[1, 2, 3], Logits::Last).unwrap();
            let st = s.exec().stream_stats().expect("the session streams");
            assert!(st.blocks_read >= n_streamed as u64, "{st:?}");
            assert!(st.bytes_read >= r.streamed_bytes, "{st:?}");
        }
        let resident = load(&opts(64 << 30, None, no_repack));
        let plan = resident.memory().expect("a memory plan on the CPU");
        assert!(!plan.residency.streams(), "a 64 GiB budget streams nothing");
        let want = logits(&resident);
        for (io, got) in &streamed {
            assert_eq!(got.len(), want.len());
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                let diff = g
                    .iter()
                    .zip(w)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    diff.is_none(),
                    "no_repack {no_repack}, io {io:?}: step {step} differs at {diff:?}"
                );
            }
        }
    }
}

fn memwall(args: &[&str]) -> std::process::Output {
    memwall_on("cpu", args)
}

fn memwall_on(device: &str, args: &[&str]) -> std::process::Output {
    memwall_in(None, device, args)
}

/// As [`memwall_on`], with the adapter's selftest record kept in `cache` (a fresh directory
/// makes the run a first start on the adapter, its selftest included).
fn memwall_in(
    cache: Option<&std::path::Path>,
    device: &str,
    args: &[&str],
) -> std::process::Output {
    let model = common::model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memwall"));
    if let Some(dir) = cache {
        cmd.env("MEMWALL_CACHE_DIR", dir);
    }
    cmd.arg("run")
        .arg("-m")
        .arg(&model)
        .args(["-d", device, "-c", "256", "--temp", "0", "--json"])
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The test model's smallest footprint and its blocks' resident bytes, as the CLI process
/// plans them (a run under a budget nothing streams in).
fn cli_plan() -> (u64, u64) {
    let probe = json_of(&memwall(&["--mem-budget", "64G", "-p", "Hi", "-n", "1"]));
    let m = &probe["memory"];
    (
        m["minimum_bytes"].as_u64().unwrap(),
        m["resident_bytes"].as_u64().unwrap(),
    )
}

/// `memwall run --mem-budget budget` with `args`: it succeeds, plans `budget`, streams some
/// blocks and peaks within the budget. Its JSON report.
fn streamed_run(budget: u64, args: &[&str]) -> serde_json::Value {
    let out = memwall(&[&["--mem-budget", &budget.to_string()][..], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json_of(&out);
    let m = &j["memory"];
    assert_eq!(m["budget_bytes"].as_u64(), Some(budget));
    assert!(m["streamed_blocks"].as_u64().unwrap() > 0, "{m}");
    let peak = m["peak_bytes"].as_u64().unwrap();
    assert!(peak <= budget, "peak {peak} over the budget {budget}: {m}");
    j
}

#[test]
fn a_streamed_run_stays_within_its_budget_and_reports_its_reads() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The minimum as the CLI process plans it.
    let (min, all) = cli_plan();
    let budget = min + all / 3;
    let j = streamed_run(budget, &["-p", "The capital of France is", "-n", "24"]);
    let m = &j["memory"];
    // Each decoded token read the streamed blocks once (read-ahead adds at most a pass).
    let per_token = m["streamed_bytes_per_token"].as_u64().unwrap();
    let read = m["storage"]["bytes_read"].as_u64().unwrap();
    assert!(read >= 24 * per_token, "{m}");
    assert!(m["storage"]["read_gbps"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["floor_fraction"].as_f64().unwrap() > 0.0, "{m}");
    // Same text as the resident run.
    let resident = json_of(&memwall(&["-p", "The capital of France is", "-n", "24"]));
    assert_eq!(j["generated_ids"], resident["generated_ids"]);
}

/// The test model requantized to Q4_0 (once per process): a draft of the same vocabulary.
fn q4_0_draft() -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mem-budget-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("draft-q4_0-{}.gguf", std::process::id()));
    common::kv::write_once(&path, |tmp| {
        memwall::tools::bench::requant::requantize(
            &common::model_path(),
            tmp,
            memwall::GgmlType::Q4_0,
        )
        .unwrap();
    });
    path
}

/// A draft model and the model share one budget: the draft loads first and the model's plan
/// counts what the draft planned to hold, so blocks of the model stream that would fit the
/// budget alone; the process's peak stays within it, and the greedy ids are the resident
/// model's.
#[test]
fn a_draft_model_shares_the_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let draft = q4_0_draft();
    let draft = draft.to_str().unwrap();
    let (min, all) = cli_plan();
    // What the draft alone plans to hold (its own run's plan, its KV cache for -c 256).
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["run", "-m", draft, "-d", "cpu", "-c", "256", "--json"])
        .args(["--mem-budget", "64G", "-p", "Hi", "-n", "1"])
        .output()
        .unwrap();
    let draft_planned = json_of(&out)["memory"]["planned_bytes"].as_u64().unwrap();
    // Enough for the model alone with every block resident; with the draft, about a third.
    let budget = draft_planned + min + all / 3;
    assert!(budget > min + all, "{budget} {min} {all}");
    let prompt = "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn sub(a: i32, b: i32) -> i32 {";
    let args = [
        "-p",
        prompt,
        "-n",
        "24",
        "--draft-model",
        draft,
        "--draft-max",
        "6",
    ];
    let j = streamed_run(budget, &args);
    let m = &j["memory"];
    let planned = m["planned_bytes"].as_u64().unwrap();
    assert!(
        planned >= draft_planned && planned <= budget,
        "the model's plan {planned} does not hold the draft's {draft_planned} within {budget}: {m}"
    );
    assert!(j["speculative"]["drafted"].as_u64().unwrap() > 0, "{j}");
    let resident = json_of(&memwall(&["-p", prompt, "-n", "24"]));
    assert_eq!(j["generated_ids"], resident["generated_ids"]);
}

#[test]
fn a_budget_below_the_minimum_is_refused_with_the_minimum() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = memwall(&["--mem-budget", "20M", "-p", "Hi", "-n", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("memory budget of 20.97 MB is below the") && err.contains("at the least"),
        "{err}"
    );
    // The same through the library: a typed error carrying both numbers.
    match Model::load(common::model_path(), &opts(20 << 20, None, false)) {
        Err(memwall::Error::MemoryBudget {
            budget, minimum, ..
        }) => {
            assert_eq!(budget, 20 << 20);
            assert!(minimum > budget);
        }
        other => panic!("expected a budget error, got {other:?}"),
    }
}

/// On the GPU (lavapipe in CI; no adapter is a failure), blocks without resident weights are
/// read through the same storage reader into the stream ring: the logits equal the resident
/// model's, and the reader counts the reads.
#[test]
fn gpu_streamed_blocks_come_through_the_reader_with_the_resident_logits() {
    use memwall::gpu::{DeviceSelector, GpuLoadOptions};
    use memwall::ground::{Device, Placement};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = DeviceChoice::Gpu(DeviceSelector::Auto);
    let load_gpu = |o: LoadOptions| match Model::load(common::model_path(), &o) {
        Ok(m) => m,
        Err(e) => panic!("cannot load on a GPU ({e}); an adapter (lavapipe) is required"),
    };
    let all = load_gpu(LoadOptions {
        device: gpu.clone(),
        ..Default::default()
    });
    let n_layer = all.config().n_layer;
    let want = logits(&all);
    drop(all);
    // Two of 30 blocks resident; the others stream.
    let mut resident = Placement::all(Device::Gpu, n_layer);
    for (l, d) in resident.layers.iter_mut().enumerate() {
        if l % 15 != 0 {
            *d = Device::Cpu;
        }
    }
    let streamed = load_gpu(LoadOptions {
        device: gpu,
        gpu: GpuLoadOptions {
            resident: Some(resident),
            ..Default::default()
        },
        ..Default::default()
    });
    let mut s = streamed.session_with_ctx(256).unwrap();
    let got = {
        let prompt: Vec<u32> = (0..150).map(|i| 100 + (i * 37) % 4000).collect();
        s.eval(&prompt, Logits::All).unwrap()
    };
    assert_eq!(got.len(), want[0].len());
    let diff = got
        .iter()
        .zip(&want[0])
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert!(diff.is_none(), "streamed GPU logits differ at {diff:?}");
    let st = s
        .exec()
        .stream_stats()
        .expect("the GPU streams through the reader");
    // Three prefill batches, 28 streamed blocks each.
    assert!(st.blocks_read >= 3 * 28, "{st:?}");
}

/// On a unified-memory GPU (lavapipe allocates its buffers from the process's RAM), the budget
/// covers the GPU's buffers too: under a budget below what the all-resident run holds, blocks
/// stream through the ring, the ids are the resident run's, and the measured peak stays within
/// the budget, the adapter's first start (every needed kernel's selftest) included.
#[test]
fn a_unified_memory_gpu_streams_within_the_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let args = ["-p", "The capital of France is", "-n", "12"];
    let all = memwall_on("gpu", &args);
    assert!(
        all.status.success(),
        "a GPU adapter (lavapipe) is required: {}",
        String::from_utf8_lossy(&all.stderr)
    );
    let all = json_of(&all);
    // Lavapipe's all-resident run peaks at ~370 MB (instance, JIT-compiled kernels, 92 MB of
    // weights); 300 MiB leaves room for a few blocks.
    let budget = 300u64 << 20;
    let fresh = std::env::temp_dir().join(format!("memwall-first-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    let out = memwall_in(
        Some(&fresh),
        "gpu",
        &[&args[..], &["--mem-budget", "300M"]].concat(),
    );
    assert!(
        fresh.read_dir().is_ok_and(|mut d| d.next().is_some()),
        "the budgeted run was a first start: it records its selftest"
    );
    let _ = std::fs::remove_dir_all(&fresh);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json_of(&out);
    assert_eq!(j["generated_ids"], all["generated_ids"]);
    let m = &j["memory"];
    assert_eq!(m["budget_bytes"].as_u64(), Some(budget));
    assert!(m["storage"]["blocks_read"].as_u64().unwrap() > 0, "{m}");
    let peak = m["peak_bytes"].as_u64().unwrap();
    assert!(peak <= budget, "peak {peak} over the budget {budget}: {m}");
}
