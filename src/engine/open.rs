//! Opening the GPU a load asks for: where the stages start, which blocks are resident, the
//! start-up check of the adapter, and what happens when the upload fails.

use std::sync::Arc;

use super::{resolve_kv_types, DeviceChoice, LoadOptions};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::{DeviceSelector, GpuContext, GpuLoadOptions, GpuModel};
use crate::ground::{Device, PhasePlacement, Placement};
use crate::scheduler::exec::{fit_uploaded, gpu_stages};
use crate::scheduler::{Fallback, FallbackCause, KvRebuild};

/// Whether the offload policy decides which blocks are resident (streaming under a budget,
/// re-decided): the model then uploads no block itself, each session uploads and frees them.
/// Not for a mixture of experts, whose blocks run on the GPU only when resident there.
pub(super) fn managed(opts: &LoadOptions, cfg: &Config) -> bool {
    opts.stream
        && opts.resample_every.is_some()
        && opts.gpu_mem_budget.is_some()
        && opts.gpu.resident.is_none()
        && cfg.moe.is_none()
}

/// `run` with every mixture-of-experts block that `resident` does not hold on the GPU moved
/// to the CPU: a block's experts are far too many bytes to stream through the GPU's ring for
/// every pass (the CPU reads only the routed ones).
fn experts_resident(cfg: &Config, run: Placement, resident: &Placement) -> Placement {
    if cfg.moe.is_none() {
        return run;
    }
    let layers = run
        .layers
        .iter()
        .enumerate()
        .map(|(l, &d)| match resident.layers.get(l) {
            Some(Device::Gpu) => d,
            _ => Device::Cpu,
        })
        .collect();
    Placement { layers, ..run }
}

/// Where the stages run and which ones have resident GPU weights, for the options, on a
/// model of `cfg` with a GPU.
pub(super) fn initial_placement(
    gguf: &Gguf,
    cfg: &Config,
    opts: &LoadOptions,
) -> Result<(Placement, Placement)> {
    let n_layer = cfg.n_layer;
    let (run, resident) = match (opts.gpu_layers, opts.gpu_mem_budget) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(
                "--gpu-layers and --gpu-mem-budget are alternatives; give one".into(),
            ))
        }
        (Some(n), None) => {
            let p = Placement::gpu_layers(n, n_layer);
            (p.clone(), p)
        }
        (None, Some(budget)) => {
            let n_ctx = if opts.n_ctx == 0 {
                cfg.n_ctx_train.min(4096)
            } else {
                opts.n_ctx
            };
            let kv_bits = resolve_kv_types(opts, cfg.head_dim)?.mean_bits();
            let fit = crate::scheduler::fit_budget(gguf, cfg, n_ctx, budget, opts.stream, kv_bits)?;
            if opts.stream {
                // Blocks stream; the embedding and head run where their weights are.
                let run = Placement {
                    embed: fit.embed,
                    layers: vec![Device::Gpu; n_layer],
                    head: fit.head,
                };
                (run, fit)
            } else {
                (fit.clone(), fit)
            }
        }
        (None, None) => {
            let p = Placement::all(Device::Gpu, n_layer);
            (p.clone(), p)
        }
    };
    if managed(opts, cfg) {
        // Sessions own the blocks (see `Model::managed_residency`).
        let model_resident = Placement {
            layers: vec![Device::Cpu; n_layer],
            ..resident
        };
        return Ok((run, model_resident));
    }
    // Tests pin the resident set to exercise streaming without a budget.
    Ok((run, opts.gpu.resident.clone().unwrap_or(resident)))
}

/// Whether a GPU of this type allocates from the same RAM as the CPU (phones, integrated
/// GPUs, CPU adapters such as lavapipe): its buffers count against the process's memory.
pub(super) fn unified_memory(device_type: &str) -> bool {
    matches!(device_type, "IntegratedGpu" | "Cpu")
}

/// Memory a GPU process holds besides the model's GPU buffers that the GPU plan cannot see:
/// the driver's shader compiles at the first dispatches (llvmpipe JIT-compiles each kernel
/// variant lazily: 100-130 MB measured on lavapipe, the first start with its selftest the most)
/// and allocator slack.
const GPU_HOST_OVERHEAD: u64 = 160 << 20;

/// With `--mem-budget` on a unified-memory GPU: the options the GPU plan runs with. The GPU
/// budget is what the budget leaves after what the process holds now (the instance, the
/// tokenizer), the storage reader's two host slots and the driver's overhead; blocks that do
/// not fit stream through the ring (`stream`). `None` without a budget, or on a discrete GPU
/// (its memory is its own; the host holds only the reader's slots).
fn unified_options(
    gguf: &Gguf,
    cfg: &Config,
    opts: &LoadOptions,
    device_type: &str,
) -> Result<Option<LoadOptions>> {
    let Some(budget) = opts.mem_budget else {
        return Ok(None);
    };
    if !unified_memory(device_type) {
        return Ok(None);
    }
    if opts.gpu_mem_budget.is_some() || opts.gpu_layers.is_some() {
        return Err(Error::InvalidArgument(
            "--mem-budget plans a unified-memory GPU itself; leave out --gpu-mem-budget and \
             --gpu-layers"
                .into(),
        ));
    }
    let slot = (0..cfg.n_layer)
        .filter_map(|l| super::budget::block_span(gguf, l))
        .map(|s| s.len)
        .max()
        .unwrap_or(0);
    let held = crate::memory::limit::resident_now()
        .unwrap_or(0)
        .max(opts.mem_held);
    let host = held + 2 * slot + GPU_HOST_OVERHEAD;
    let gpu = budget
        .checked_sub(host)
        .filter(|&g| g > 0)
        .ok_or_else(|| Error::MemoryBudget {
            budget,
            minimum: host,
            detail: format!(
                "a unified-memory GPU: {} held by the process, 2 stream slots of {}, {} for the \
                 driver, before any GPU buffer",
                crate::ground::format_size(held),
                crate::ground::format_size(slot),
                crate::ground::format_size(GPU_HOST_OVERHEAD)
            ),
        })?;
    Ok(Some(LoadOptions {
        gpu_mem_budget: Some(gpu),
        stream: true,
        ..opts.clone()
    }))
}

pub(super) type Opened = (
    Option<Arc<GpuModel>>,
    Option<String>,
    PhasePlacement,
    Option<Fallback>,
);

/// Opens the GPU the options ask for and uploads the weights of the stages placed there;
/// `auto` falls back to the CPU with a note, an explicit GPU choice fails with the reason. A
/// GPU that runs out of memory (or is lost) during the upload is not a failure: the stages
/// whose weights did not fit run on the CPU, and the returned `Fallback` says so.
pub(super) fn open_gpu(gguf: &Gguf, cfg: &Config, opts: &LoadOptions) -> Result<Opened> {
    let all_cpu = || PhasePlacement::same(Placement::all(Device::Cpu, cfg.n_layer));
    type Loaded = (Arc<GpuModel>, PhasePlacement, Option<Fallback>);
    let load = |sel: &DeviceSelector| -> Result<Loaded> {
        let mut ctx = GpuContext::new(sel)?;
        let unified = unified_options(gguf, cfg, opts, &ctx.info.device_type)?;
        let opts = unified.as_ref().unwrap_or(opts);
        let (placement, resident) = initial_placement(gguf, cfg, opts)?;
        // Test hooks cover the whole start, the selftest included.
        if let Some(f) = &opts.gpu.faults {
            ctx.set_faults(f.clone());
        }
        if let Some(dir) = opts.health.dir() {
            ctx.open_pipeline_cache(&dir);
        }
        // The first use of an adapter: the variants the model needs are checked (or their
        // record read); stages with no working variant of something stay on the CPU.
        let kv = resolve_kv_types(opts, cfg.head_dim)?;
        let (health, capable) =
            crate::gpu::health::startup::check_model(&ctx, gguf, cfg, kv, &opts.health)?;
        let placement = crate::gpu::health::startup::restrict(&placement, &capable);
        let resident = crate::gpu::health::startup::restrict(&resident, &capable);
        let placement = experts_resident(cfg, placement, &resident);
        let gopts = GpuLoadOptions {
            f32_activations: opts.gpu.f32_activations || opts.f32_activations,
            resident: Some(resident),
            unusable_kernels: health.unusable,
            kv_types: Some(kv),
            ..opts.gpu.clone()
        };
        let mut g = GpuModel::load(ctx, gguf, cfg, &gopts)?;
        g.ctx.save_pipeline_cache();
        g.health = health.report;
        g.health.pipeline_cache = g.ctx.pipeline_cache.as_ref().map(|c| c.path.clone());
        g.health.pipeline_cache_loaded_bytes =
            g.ctx.pipeline_cache.as_ref().map_or(0, |c| c.loaded_bytes);
        let Some(why) = g.upload_failure.clone() else {
            return Ok((Arc::new(g), PhasePlacement::same(placement), None));
        };
        // A mixture-of-experts block whose upload failed runs on the CPU, never streamed.
        let streams = (opts.stream || opts.gpu.resident.is_some()) && cfg.moe.is_none();
        let (fit, moved) = fit_uploaded(&placement, &g, cfg.tied_embeddings, streams);
        let f = Fallback {
            cause: FallbackCause::OutOfMemory,
            reason: why,
            from: Device::Gpu,
            to: Device::Cpu,
            stages: moved,
            position: 0,
            kv: KvRebuild::Empty,
        };
        log::warn!("{f}; those stages run on the CPU");
        Ok((Arc::new(g), PhasePlacement::same(fit), Some(f)))
    };
    // The GPU failed as a whole while loading (out of memory or lost before any stage could
    // run there): everything on the CPU, reported.
    let whole = |e: Error| -> Result<Opened> {
        let Some(cause) = FallbackCause::of(&e) else {
            return Err(e);
        };
        let p = initial_placement(gguf, cfg, opts)?.0;
        let f = Fallback {
            cause,
            reason: e.to_string(),
            from: Device::Gpu,
            to: Device::Cpu,
            stages: gpu_stages(&PhasePlacement::same(p)),
            position: 0,
            kv: KvRebuild::Empty,
        };
        log::warn!("{f}; running on the CPU");
        Ok((None, None, all_cpu(), Some(f)))
    };
    let gpu_asked = opts.gpu_layers.is_some() || opts.gpu_mem_budget.is_some();
    match &opts.device {
        DeviceChoice::Cpu if gpu_asked => Err(Error::InvalidArgument(
            "--gpu-layers and --gpu-mem-budget need a GPU device, not --device cpu".into(),
        )),
        DeviceChoice::Cpu => Ok((None, None, all_cpu(), None)),
        DeviceChoice::Gpu(sel) => match load(sel) {
            Ok((g, p, f)) => Ok((Some(g), None, p, f)),
            Err(e) => whole(e),
        },
        DeviceChoice::Auto => {
            let rows = crate::gpu::list_adapters();
            let hw = rows.iter().find(|r| {
                matches!(
                    r.device_type.as_str(),
                    "DiscreteGpu" | "IntegratedGpu" | "VirtualGpu"
                )
            });
            let Some(hw) = hw else {
                let found: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
                let note = if found.is_empty() {
                    "device auto: no GPU adapter found; running on the CPU".to_string()
                } else {
                    format!(
                        "device auto: no hardware GPU (only {}, slower than the CPU path); \
                         running on the CPU",
                        found.join(", ")
                    )
                };
                return Ok((None, Some(note), all_cpu(), None));
            };
            match load(&DeviceSelector::Index(hw.index)) {
                Ok((g, p, f)) => Ok((Some(g), None, p, f)),
                Err(e) => Ok((
                    None,
                    Some(format!(
                        "device auto: {} failed ({e}); running on the CPU",
                        hw.name
                    )),
                    all_cpu(),
                    None,
                )),
            }
        }
    }
}
