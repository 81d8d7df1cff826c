//! memwall's GPU work under the Khronos Vulkan validation layer (Debian package
//! `vulkan-validationlayers`): `memwall selftest` on Vulkan must produce zero validation
//! errors or warnings, and the test FAILS unless the layer is proven to be active.
//!
//! How: the binary runs with `WGPU_BACKEND=vulkan` and `WGPU_VALIDATION=1` (wgpu's instance
//! flags come from the environment; VALIDATION enables `VK_LAYER_KHRONOS_validation`), with a
//! layer settings file (`VK_LAYER_SETTINGS_PATH`) that has the layer log errors, warnings and
//! info to a file of its own, which the test reads. `WGPU_DEBUG` stays off on purpose: with it
//! wgpu embeds the WGSL source in the SPIR-V (`OpSource` language 10, WGSL), which the layer of
//! Debian 12 (1.3.239) rejects as invalid SPIR-V, and that error would stop its SPIR-V
//! validation of our shaders at the first instruction. `VK_LOADER_DEBUG=layer` has the Vulkan
//! loader print the layers it inserts, and `MEMWALL_LOG=warn` shows wgpu's own warnings and
//! errors. The layer is proven active when the loader inserted it AND the layer wrote its
//! instance-creation status message ("Khronos Validation Layer Active") naming our settings
//! file to our log file (so it ran, and with our settings).
//!
//! [`run_validated`] runs any memwall subcommand this way, so more of the engine (e.g.
//! `memwall run --device gpu`) can be checked the same way.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The text of the layer's instance-creation status message
/// (`UNASSIGNED-khronos-validation-createinstance-status-message`).
const LAYER_ACTIVE: &str = "Khronos Validation Layer Active";

/// What one validated run printed, split into what the checks need.
pub struct Validated {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// Everything the layer logged.
    pub layer_log: String,
    /// The layer's ERROR and WARN messages, and wgpu's own ERROR/WARN records.
    pub problems: Vec<String>,
}

/// Runs `memwall <args>` on Vulkan with the validation layer, asserts that the layer was
/// active, and returns the output with the errors and warnings picked out.
pub fn run_validated(args: &[&str]) -> Validated {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "vvl-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let settings = dir.join("vk_layer_settings.txt");
    let log = dir.join("validation.log");
    let _ = std::fs::remove_file(&log);
    std::fs::write(
        &settings,
        format!(
            "khronos_validation.report_flags = error,warn,info\n\
             khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG\n\
             khronos_validation.log_filename = {}\n",
            log.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .env("WGPU_BACKEND", "vulkan")
        .env("WGPU_VALIDATION", "1")
        .env("WGPU_DEBUG", "0")
        .env("MEMWALL_LOG", "warn")
        .env("VK_LOADER_DEBUG", "layer")
        .env("VK_LAYER_SETTINGS_PATH", &settings)
        // The layer must come from the system's layer manifest, nothing else.
        .env_remove("VK_INSTANCE_LAYERS")
        .env_remove("VK_LOADER_LAYERS_DISABLE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let layer_log = std::fs::read_to_string(&log).unwrap_or_default();
    let loader_inserted = stderr
        .lines()
        .any(|l| l.contains("Insert instance layer") && l.contains("VK_LAYER_KHRONOS_validation"));
    let layer_reported =
        layer_log.contains(LAYER_ACTIVE) && layer_log.contains(&settings.display().to_string());
    assert!(
        loader_inserted && layer_reported,
        "the Vulkan validation layer is not active (loader inserted it: {loader_inserted}, \
         it logged its status with our settings: {layer_reported}); install \
         vulkan-validationlayers.\nlayer log:\n{layer_log}\nstderr:\n{}",
        tail(&stderr, 60)
    );
    // The layer's messages start `<message id>(SEVERITY / TYPE): msgNum: ...`.
    let mut problems: Vec<String> = layer_messages(&layer_log)
        .into_iter()
        .filter(|m| m.contains("(ERROR /") || m.contains("(WARN /"))
        .collect();
    problems.extend(
        records(&stderr)
            .into_iter()
            .filter(|r| r.starts_with("[ERROR ") || r.starts_with("[WARN ")),
    );
    Validated {
        success: out.status.success(),
        stdout,
        stderr,
        layer_log,
        problems,
    }
}

/// The layer log's messages: a line with `): msgNum:` and its continuation lines.
fn layer_messages(log: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in log.lines() {
        if l.contains("): msgNum:") {
            v.push(l.to_string());
        } else if let Some(last) = v.last_mut() {
            last.push('\n');
            last.push_str(l);
        }
    }
    v
}

/// The logger's records: a line starting `[LEVEL target]` and its continuation lines.
fn records(stderr: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in stderr.lines() {
        let is_record = ["[ERROR ", "[WARN ", "[INFO ", "[DEBUG ", "[TRACE "]
            .iter()
            .any(|p| l.starts_with(p));
        match v.last_mut() {
            Some(last) if !is_record && l.starts_with('\t') => {
                last.push('\n');
                last.push_str(l);
            }
            _ if is_record => v.push(l.to_string()),
            _ => {}
        }
    }
    v
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn selftest_is_clean_under_the_vulkan_validation_layer() {
    let v = run_validated(&["selftest"]);
    eprintln!("{}", v.stdout);
    assert!(
        v.problems.is_empty(),
        "{} validation problems:\n{}",
        v.problems.len(),
        v.problems.join("\n")
    );
    assert!(v.success, "selftest failed:\n{}", tail(&v.stderr, 40));
    assert!(v.stdout.contains(" 0 failed"), "{}", v.stdout);
    eprintln!("layer log:\n{}", v.layer_log);
}

#[test]
fn layer_messages_are_split_by_severity() {
    let log = "A(INFO / SPEC): msgNum: 1 - Khronos Validation Layer Active:\n    more\n\
               B(ERROR / SPEC): msgNum: 2 - bad\n    Objects: 1\n";
    let m = layer_messages(log);
    assert_eq!(m.len(), 2);
    assert!(m[0].ends_with("more") && m[1].contains("(ERROR /"));
}

#[test]
fn records_group_continuation_lines() {
    let s = "noise\n[ERROR wgpu_hal::vulkan::instance] VALIDATION [X]\n\tdetail\n[DEBUG a] b\n";
    let r = records(s);
    assert_eq!(r.len(), 2);
    assert!(r[0].ends_with("\n\tdetail"));
}

/// A full generation on the GPU (`run --device gpu`: weight upload, prefill, decode with the
/// recorder's cached bind groups and uniform ring, argmax readback) reports nothing.
#[test]
fn gpu_run_is_clean_under_the_vulkan_validation_layer() {
    let model = std::env::var("MEMWALL_MODEL").unwrap_or_else(|_| {
        let home = std::env::var("HOME").expect("HOME is not set");
        format!("{home}/.cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(
        std::path::Path::new(&model).is_file(),
        "test model missing at {model}"
    );
    let v = run_validated(&[
        "run",
        "-m",
        &model,
        "--device",
        "gpu",
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    assert!(
        v.problems.is_empty(),
        "{} validation problems:\n{}",
        v.problems.len(),
        v.problems.join("\n")
    );
    assert!(v.success, "run failed:\n{}", tail(&v.stderr, 40));
    assert!(v.stdout.contains("Paris"), "{}", v.stdout);
}
