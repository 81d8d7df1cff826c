//! GPU bring-up: adapter listing and device creation. Lazy (nothing happens until called) and
//! fallible: no adapter, a failed device request, and later validation or out-of-memory errors
//! are `Error::Gpu` values, never panics, so the caller can go on on the CPU.
//!
//! Honours wgpu's environment variables: `WGPU_BACKEND` (e.g. `vulkan`, `gl`) restricts the
//! backends; `WGPU_ADAPTER_NAME` (a case-insensitive substring) picks the adapter for `auto`.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::gpu::faults::{Fault, GpuFaults};

/// One adapter, as `memwall devices` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterInfoRow {
    /// Position in [`list_adapters`]'s order (what `--device <index>` selects).
    pub index: usize,
    pub backend: String,
    pub name: String,
    /// PCI vendor and device ids (0 where the backend has none).
    pub vendor: u32,
    pub device: u32,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub shader_f16: bool,
    pub subgroup: bool,
    /// Subgroup size range the adapter reports (0 when unknown).
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamp_query: bool,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
}

/// Which adapter to use: parsed from `gpu`, `auto`, an index, or a name substring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// `gpu` / `auto`: `WGPU_ADAPTER_NAME` if set, else wgpu's high-performance choice.
    Auto,
    /// Index into [`list_adapters`].
    Index(usize),
    /// Case-insensitive substring of the adapter name.
    Name(String),
}

impl DeviceSelector {
    /// Parses `gpu|auto|<index>|<name substring>` (`cpu` is the caller's business).
    pub fn parse(s: &str) -> Result<DeviceSelector> {
        let t = s.trim();
        if t.is_empty() {
            return Err(Error::InvalidArgument("empty device selector".into()));
        }
        let lower = t.to_lowercase();
        if lower == "gpu" || lower == "auto" {
            return Ok(DeviceSelector::Auto);
        }
        if let Ok(i) = t.parse::<usize>() {
            return Ok(DeviceSelector::Index(i));
        }
        Ok(DeviceSelector::Name(lower))
    }
}

/// Optional features memwall uses when the adapter has them.
pub fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::TIMESTAMP_QUERY
        // Driver pipeline caches (Vulkan): compiled kernels kept on disk between runs.
        | wgpu::Features::PIPELINE_CACHE
}

/// An instance on every backend (wgpu's default), or on `WGPU_BACKEND`'s; instance flags such
/// as `WGPU_VALIDATION` also come from the environment.
fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(backends()))
}

fn row(index: usize, adapter: &wgpu::Adapter) -> AdapterInfoRow {
    let info = adapter.get_info();
    let f = adapter.features();
    let l = adapter.limits();
    AdapterInfoRow {
        index,
        backend: format!("{:?}", info.backend),
        name: info.name,
        vendor: info.vendor,
        device: info.device,
        device_type: format!("{:?}", info.device_type),
        driver: info.driver,
        driver_info: info.driver_info,
        shader_f16: f.contains(wgpu::Features::SHADER_F16),
        subgroup: f.contains(wgpu::Features::SUBGROUP),
        subgroup_min_size: info.subgroup_min_size,
        subgroup_max_size: info.subgroup_max_size,
        timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        max_buffer_size: l.max_buffer_size,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
    }
}

/// Every adapter on the enabled backends (all, or `WGPU_BACKEND`'s). Empty when there is none.
pub fn list_adapters() -> Vec<AdapterInfoRow> {
    let inst = instance();
    adapters(&inst)
        .iter()
        .enumerate()
        .map(|(i, a)| row(i, a))
        .collect()
}

/// A device with the adapter's real limits and the optional features it has.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// Features enabled on `device` (a subset of [`wanted_features`]).
    pub features: wgpu::Features,
    /// The adapter's limits, requested in full.
    pub limits: wgpu::Limits,
    pub info: AdapterInfoRow,
    /// wgpu's name for this adapter's pipeline cache (`None` where the backend has none).
    pub pipeline_cache_key: Option<String>,
    /// The on-disk pipeline cache kernels compile through, once opened
    /// ([`GpuContext::open_pipeline_cache`]).
    pub pipeline_cache: Option<crate::gpu::kernels::pipelines::DiskPipelineCache>,
    /// Errors no error scope caught (from the `on_uncaptured_error` handler).
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost, once it was (set by wgpu's device-lost callback, or by an
    /// injected loss): every later operation fails with `Error::DeviceLost` without touching
    /// the device (wgpu panics on some calls on a lost device, e.g. mapped creation).
    lost: Arc<Mutex<Option<String>>>,
    /// Fault injection for tests (inert unless armed).
    faults: Arc<GpuFaults>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn pick(inst: &wgpu::Instance, selector: &DeviceSelector) -> Result<(usize, wgpu::Adapter)> {
    let all = adapters(inst);
    if all.is_empty() {
        return Err(Error::Gpu(format!(
            "no GPU adapter found on backends {:?} (is a Vulkan/GL driver installed?)",
            backends()
        )));
    }
    let by_name = |needle: &str| {
        all.iter()
            .position(|a| a.get_info().name.to_lowercase().contains(needle))
    };
    let index = match selector {
        DeviceSelector::Index(i) if *i < all.len() => *i,
        DeviceSelector::Index(i) => {
            return Err(Error::Gpu(format!(
                "no adapter {i}: there are {} (see `memwall devices`)",
                all.len()
            )))
        }
        DeviceSelector::Name(n) => by_name(n).ok_or_else(|| {
            Error::Gpu(format!(
                "no adapter name contains {n:?} (see `memwall devices`)"
            ))
        })?,
        DeviceSelector::Auto => match std::env::var("WGPU_ADAPTER_NAME") {
            Ok(n) if !n.trim().is_empty() => by_name(&n.trim().to_lowercase())
                .ok_or_else(|| Error::Gpu(format!("WGPU_ADAPTER_NAME={n:?} matches no adapter")))?,
            _ => {
                let opts = wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    // The real limits, not a privacy bucket of them.
                    apply_limit_buckets: false,
                };
                match pollster::block_on(inst.request_adapter(&opts)) {
                    Ok(chosen) => {
                        let ci = chosen.get_info();
                        all.iter()
                            .position(|a| {
                                let i = a.get_info();
                                i.name == ci.name && i.backend == ci.backend
                            })
                            .unwrap_or(0)
                    }
                    // wgpu declined to choose (e.g. only a CPU adapter): take the first.
                    Err(_) => 0,
                }
            }
        },
    };
    let adapter = all
        .into_iter()
        .nth(index)
        .ok_or_else(|| Error::Gpu(format!("adapter {index} vanished")))?;
    Ok((index, adapter))
}

impl GpuContext {
    /// Opens the adapter `selector` names, with its full limits and the optional features of
    /// [`wanted_features`] it has.
    pub fn new(selector: &DeviceSelector) -> Result<GpuContext> {
        let inst = instance();
        let (index, adapter) = pick(&inst, selector)?;
        let info = row(index, &adapter);
        let pipeline_cache_key = wgpu::util::pipeline_cache_key(&adapter.get_info());
        let mut features = adapter.features() & wanted_features();
        // Memory the CPU writes directly (CPU adapters, integrated GPUs: one memory for
        // host and device): buffers created with contents are written in place, with no
        // staging copy that would hold a second copy of the weights during a load.
        if matches!(
            adapter.get_info().device_type,
            wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
        ) {
            features |= adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("memwall"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| Error::Gpu(format!("request device on {}: {e}", info.name)))?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_sink.lock() {
                let why = if msg.is_empty() {
                    format!("{reason:?}")
                } else {
                    format!("{reason:?}: {msg}")
                };
                l.get_or_insert(why);
            }
        });
        Ok(GpuContext {
            device,
            queue,
            features,
            limits,
            info,
            pipeline_cache_key,
            pipeline_cache: None,
            uncaptured,
            lost,
            faults: Arc::new(GpuFaults::default()),
        })
    }

    /// Compiles kernels through the pipeline cache file in `dir` from now on (nothing where
    /// the backend has no pipeline cache). Lazy like the rest: only a model load calls it.
    pub fn open_pipeline_cache(&mut self, dir: &std::path::Path) {
        self.pipeline_cache = crate::gpu::kernels::pipelines::DiskPipelineCache::open(self, dir);
    }

    /// Saves the pipeline cache (after the kernels are compiled), if one is open.
    pub fn save_pipeline_cache(&self) {
        if let Some(c) = &self.pipeline_cache {
            c.save();
        }
    }

    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }

    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    /// Runs `f` inside validation and out-of-memory error scopes; an out-of-memory error
    /// becomes `Error::OutOfMemory`, another error either scope catches (or one that reached
    /// the uncaptured handler meanwhile) `Error::Gpu`. On a lost device `f` does not run:
    /// `Error::DeviceLost`.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_lost(what)?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        // A loss during `f` shows as validation errors ("device is invalid"): say what it is.
        self.check_lost(what)?;
        if let Some(e) = o {
            return Err(Error::OutOfMemory {
                what: format!("{what}: {e}"),
            });
        }
        if let Some(e) = v {
            return Err(Error::Gpu(format!("{what}: {e}")));
        }
        self.check_uncaptured(what)?;
        out
    }

    /// `Error::DeviceLost` once the device is lost.
    pub fn check_lost(&self, what: &str) -> Result<()> {
        let reason = self
            .lost
            .lock()
            .map_err(|_| Error::Gpu("device-lost flag poisoned".into()))?
            .clone();
        match reason {
            Some(reason) => Err(Error::DeviceLost {
                reason: format!("{what}: {reason}"),
            }),
            None => Ok(()),
        }
    }

    /// `e`, or `Error::DeviceLost` when the device is lost (what a failed wait or map on a
    /// lost device really means).
    pub fn lost_or(&self, what: &str, e: Error) -> Error {
        match self.check_lost(what) {
            Err(lost) => lost,
            Ok(()) => e,
        }
    }

    /// Whether the device is lost.
    pub fn is_lost(&self) -> bool {
        self.lost.lock().map_or(true, |l| l.is_some())
    }

    /// The fault injection of this context (tests).
    #[doc(hidden)]
    pub fn faults(&self) -> &Arc<GpuFaults> {
        &self.faults
    }

    /// Uses `f` as this context's fault injection (tests: before the model's upload).
    #[doc(hidden)]
    pub fn set_faults(&mut self, f: Arc<GpuFaults>) {
        self.faults = f;
    }

    /// A fault point before each queue submission: an armed loss destroys the device here.
    pub(crate) fn before_submit(&self) -> Result<()> {
        if let Fault::LoseDevice = self.faults.on_submit() {
            // The real path: wgpu marks the device invalid and later calls the lost callback.
            self.device.destroy();
            if let Ok(mut l) = self.lost.lock() {
                l.get_or_insert_with(|| "destroyed (injected device loss)".into());
            }
        }
        self.check_lost("submit")
    }

    /// A fault point before each buffer allocation or weight upload of `what`.
    pub(crate) fn before_alloc(&self, what: &str) -> Result<()> {
        self.check_lost(what)?;
        self.faults.on_alloc(what)
    }

    /// Returns (and clears) errors the uncaptured-error handler collected.
    pub fn check_uncaptured(&self, what: &str) -> Result<()> {
        self.check_lost(what)?;
        let mut v = self
            .uncaptured
            .lock()
            .map_err(|_| Error::Gpu("uncaptured-error list poisoned".into()))?;
        if v.is_empty() {
            return Ok(());
        }
        let msg = v.join("; ");
        v.clear();
        Err(Error::Gpu(format!("{what}: {msg}")))
    }
}

/// `rows` as a human-readable table (one block per adapter), as `memwall devices` prints it.
pub fn adapters_table(rows: &[AdapterInfoRow]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if rows.is_empty() {
        s.push_str(
            "no GPU adapters found (WGPU_BACKEND selects backends; is a driver installed?)\n",
        );
        return s;
    }
    let yn = |b: bool| if b { "yes" } else { "no" };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    for r in rows {
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "[{}] {} ({}, {})\n    driver: {} {}\n    shader_f16: {}  subgroup: {}{}  timestamp_query: {}\n    \
             max_storage_buffer_binding_size: {:.0} MiB  max_buffer_size: {:.0} MiB\n    \
             max_compute_workgroup_storage_size: {} B  max_compute_invocations_per_workgroup: {}",
            r.index,
            r.name,
            r.backend,
            r.device_type,
            r.driver,
            r.driver_info,
            yn(r.shader_f16),
            yn(r.subgroup),
            // Sizes mean nothing without the feature (GL reports a range anyway).
            if r.subgroup {
                format!(" (size {}..{})", r.subgroup_min_size, r.subgroup_max_size)
            } else {
                String::new()
            },
            yn(r.timestamp_query),
            mib(r.max_storage_buffer_binding_size),
            mib(r.max_buffer_size),
            r.max_compute_workgroup_storage_size,
            r.max_compute_invocations_per_workgroup,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_parses_every_form() {
        assert_eq!(DeviceSelector::parse("auto").unwrap(), DeviceSelector::Auto);
        assert_eq!(
            DeviceSelector::parse(" GPU ").unwrap(),
            DeviceSelector::Auto
        );
        assert_eq!(
            DeviceSelector::parse("0").unwrap(),
            DeviceSelector::Index(0)
        );
        assert_eq!(
            DeviceSelector::parse("12").unwrap(),
            DeviceSelector::Index(12)
        );
        assert_eq!(
            DeviceSelector::parse("LLVMpipe").unwrap(),
            DeviceSelector::Name("llvmpipe".into())
        );
        assert!(DeviceSelector::parse("  ").is_err());
    }

    #[test]
    fn empty_adapter_table_says_so() {
        assert!(adapters_table(&[]).contains("no GPU adapters"));
    }
}
