//! Pipeline creation: a kernel's bind group layout reflected from its WGSL, its pipeline
//! compiled with the override constants its launches assume, through the on-disk driver
//! pipeline cache where the backend has one ([`DiskPipelineCache`]).

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::attention;
use crate::gpu::kernels::{matvec_q8_rows_per_group, Pipeline, MATVEC_ROWS_PER_WORKGROUP};
use crate::gpu::registry::KernelKey;

/// The bind group 0 layout of a composed kernel, reflected from its WGSL with naga: each
/// `var<storage>` as read-only or read-write as declared, the one `var<uniform>` with a dynamic
/// offset. Anything else (another group, a texture, a second uniform) is a registry bug,
/// reported as an error naming the kernel.
pub fn reflect_bindings(label: &str, src: &str) -> Result<Vec<wgpu::BindGroupLayoutEntry>> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| Error::Gpu(format!("kernel {label}: {}", e.emit_to_string(src))))?;
    let mut entries = Vec::new();
    let mut uniforms = 0;
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let bad =
            |what: &str| Error::Gpu(format!("kernel {label}: binding {}: {what}", rb.binding));
        if rb.group != 0 {
            return Err(bad("only bind group 0 is used"));
        }
        let (ty, dynamic) = match var.space {
            naga::AddressSpace::Uniform => {
                uniforms += 1;
                (wgpu::BufferBindingType::Uniform, true)
            }
            naga::AddressSpace::Storage { access } => (
                wgpu::BufferBindingType::Storage {
                    read_only: !access.contains(naga::StorageAccess::STORE),
                },
                false,
            ),
            _ => return Err(bad("not a buffer")),
        };
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: rb.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: dynamic,
                min_binding_size: None,
            },
            count: None,
        });
    }
    if uniforms != 1 {
        return Err(Error::Gpu(format!(
            "kernel {label}: {uniforms} uniform bindings (the convention is exactly one)"
        )));
    }
    entries.sort_by_key(|e| e.binding);
    Ok(entries)
}

/// Compiles `key`'s pipeline with workgroup size `workgroup_size`, through the context's
/// pipeline cache when it has one.
pub(crate) fn compile(ctx: &GpuContext, key: KernelKey, workgroup_size: u32) -> Result<Pipeline> {
    let label = key.label();
    let mut constants = vec![("WG", f64::from(workgroup_size))];
    if matches!(key, KernelKey::Matvec { .. }) {
        constants.push(("ROWS", f64::from(MATVEC_ROWS_PER_WORKGROUP)));
    }
    if matches!(
        key,
        KernelKey::MatvecQ8 { .. } | KernelKey::MatvecQ8Out { .. }
    ) {
        let rows = matvec_q8_rows_per_group(ctx, workgroup_size);
        constants.push(("ROWS", f64::from(rows)));
    }
    let src = key.source();
    let entries = reflect_bindings(&label, &src)?;
    if matches!(
        key,
        KernelKey::AttentionSplit { .. } | KernelKey::AttentionCombine { .. }
    ) {
        constants.push(("CHUNK", f64::from(attention::ATTENTION_CHUNK)));
    }
    // The KV cache types of the attention and kv_store variants.
    constants.extend(key.kv_constants());
    // The token tile of the 8-bit register-tile layout.
    constants.extend(key.matrix_constants());
    if matches!(key, KernelKey::Matmul { .. }) {
        let (tm, tn) = crate::gpu::kernels::matmul::matmul_tile(workgroup_size);
        constants.extend([("TM", f64::from(tm)), ("TN", f64::from(tn))]);
    }
    ctx.scoped(&format!("compile {label}"), || {
        let layout = ctx
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(&label),
                entries: &entries,
            });
        let pipeline_layout = ctx
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&label),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(Cow::Owned(src.clone())),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    // Every kernel writes its workgroup memory before reading it.
                    zero_initialize_workgroup_memory: false,
                },
                cache: ctx.pipeline_cache.as_ref().map(|c| &c.cache),
            });
        Ok(Pipeline { pipeline, layout })
    })
}

/// Magic of memwall's pipeline cache files: the header guards the driver's blob, which wgpu
/// hands to the driver with only its own header checked (its data hash is reserved, not
/// verified), so a truncated or corrupted file must be caught here.
const CACHE_MAGIC: &[u8; 8] = b"MWPIPE01";

/// A driver pipeline cache (wgpu's `PIPELINE_CACHE`, Vulkan only) backed by a file.
pub struct DiskPipelineCache {
    pub cache: wgpu::PipelineCache,
    pub path: std::path::PathBuf,
    /// Bytes of driver data the cache started from (0: a cold start).
    pub loaded_bytes: usize,
    loaded_hash: u64,
}

/// The driver data in a cache file's bytes, if the file is whole and ours.
fn unwrap_cache_file(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(CACHE_MAGIC)?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    let (hash, data) = rest.split_first_chunk::<8>()?;
    (u64::from_le_bytes(*len) == data.len() as u64
        && u64::from_le_bytes(*hash) == crate::gpu::health::fnv1a(&[data]))
    .then_some(data)
}

fn wrap_cache_file(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 24);
    out.extend_from_slice(CACHE_MAGIC);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&crate::gpu::health::fnv1a(&[data]).to_le_bytes());
    out.extend_from_slice(data);
    out
}

impl DiskPipelineCache {
    /// Opens the cache of `ctx`'s adapter in `dir`: `None` where the device has no
    /// `PIPELINE_CACHE` (GL, or a driver without it). A missing, unreadable or corrupt file
    /// gives an empty cache (with a warning for the last two).
    pub fn open(ctx: &GpuContext, dir: &std::path::Path) -> Option<DiskPipelineCache> {
        let key = ctx.pipeline_cache_key.as_ref()?;
        if !ctx.features.contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let path = dir.join(format!("{key}.bin"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                log::warn!("pipeline cache {}: {e}; starting cold", path.display());
                None
            }
        };
        let data = bytes.as_deref().and_then(|b| {
            let d = unwrap_cache_file(b);
            if d.is_none() {
                log::warn!(
                    "pipeline cache {} is corrupt; starting cold",
                    path.display()
                );
            }
            d
        });
        // SAFETY: `data` is exactly what `PipelineCache::get_data` returned on an earlier run
        // (the file's length and hash are checked above; a file written by anything else is
        // refused), and `fallback: true` makes wgpu start empty when the driver rejects it
        // (another driver version, another device).
        let cache = unsafe {
            ctx.device
                .create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("memwall"),
                    data,
                    fallback: true,
                })
        };
        let d = data.unwrap_or(&[]);
        Some(DiskPipelineCache {
            cache,
            path,
            loaded_bytes: d.len(),
            loaded_hash: crate::gpu::health::fnv1a(&[d]),
        })
    }

    /// Writes the cache's current data to its file (atomically) when it changed since it was
    /// loaded. Failure is a warning: the cache only saves time.
    pub fn save(&self) {
        let Some(data) = self.cache.get_data() else {
            return;
        };
        if data.len() == self.loaded_bytes
            && crate::gpu::health::fnv1a(&[&data]) == self.loaded_hash
        {
            return;
        }
        if let Err(e) = crate::gpu::health::write_atomic(&self.path, &wrap_cache_file(&data)) {
            log::warn!("pipeline cache {}: not written: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_files_round_trip_and_refuse_damage() {
        let data = b"driver blob".to_vec();
        let file = wrap_cache_file(&data);
        assert_eq!(unwrap_cache_file(&file), Some(&data[..]));
        assert_eq!(unwrap_cache_file(&file[..file.len() - 1]), None);
        let mut flipped = file.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(unwrap_cache_file(&flipped), None);
        assert_eq!(unwrap_cache_file(b"junk"), None);
    }
}
