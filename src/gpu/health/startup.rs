//! The start-up check of a model load on a GPU: which kernel variants the model's weight
//! formats need, their health ([`crate::gpu::health`]), and which stages must stay on the CPU
//! because an operation they need has no usable variant on this adapter.

use std::collections::HashSet;

use crate::config::Config;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::gpu::device::GpuContext;
use crate::gpu::health::layouts::AdapterFacts;
use crate::gpu::health::{self, Health, HealthOptions};
use crate::gpu::registry::{KernelKey, WeightFormat};
use crate::gpu::weights::gpu_weight_format;
use crate::gpu::{health::variants, KernelOptions};
use crate::ground::{Device, Placement};
use crate::kv_type::KvTypes;

/// The weight formats each stage decodes on the GPU (after any load-time conversion).
#[derive(Debug, Clone, Default)]
pub struct StageFormats {
    pub embed: HashSet<WeightFormat>,
    pub layers: Vec<HashSet<WeightFormat>>,
    pub head: HashSet<WeightFormat>,
}

impl StageFormats {
    pub fn of(gguf: &Gguf, cfg: &Config) -> Result<StageFormats> {
        let mut f = StageFormats {
            layers: vec![HashSet::new(); cfg.n_layer],
            ..StageFormats::default()
        };
        for (id, dims) in crate::backend::expected_weights(cfg) {
            if dims.len() < 2 {
                continue;
            }
            let t = gguf.require_tensor(&id.tensor_name())?;
            let ty = gpu_weight_format(t.ty, dims[0]);
            match id {
                crate::backend::WeightId::TokEmbd => {
                    f.embed.insert(ty);
                    if cfg.tied_embeddings {
                        f.head.insert(ty);
                    }
                }
                crate::backend::WeightId::Output => {
                    f.head.insert(ty);
                }
                other => {
                    if let Some(set) = other.layer_index().and_then(|l| f.layers.get_mut(l)) {
                        set.insert(ty);
                    }
                }
            }
        }
        Ok(f)
    }

    fn all(&self) -> HashSet<WeightFormat> {
        let mut all = self.embed.clone();
        all.extend(self.head.iter().copied());
        for l in &self.layers {
            all.extend(l.iter().copied());
        }
        all
    }
}

/// The kernel choice a model load makes on `ctx`: every reduction through subgroups where the
/// device has them; the u32-packed weight decoding (see [`crate::gpu::Kernels::new`]).
pub fn kernel_options(ctx: &GpuContext) -> KernelOptions {
    KernelOptions {
        subgroup: ctx.has_subgroups(),
        f16: false,
    }
}

/// Whether a stage decoding `formats` (the embedding stage when `embed`, the head when
/// `head`) needs `key`.
fn stage_needs(key: &KernelKey, formats: &HashSet<WeightFormat>, embed: bool, head: bool) -> bool {
    if key.is_moe() && (embed || head) {
        // The expert kernels: the blocks only (a dense model's set never holds them).
        return false;
    }
    let lookup = matches!(key, KernelKey::Embedding { .. });
    match variants::weight_format(key) {
        Some(ty) => lookup == embed && formats.contains(&ty),
        // Norms, attention, activations: every block and the head; the lookup needs none.
        None => !embed,
    }
}

/// The stages that cannot run on `ctx` because `unavailable` keys they need have no usable
/// variant: `Device::Cpu` for those, `Device::Gpu` for the others.
pub fn gpu_capable(formats: &StageFormats, unavailable: &[KernelKey]) -> Placement {
    // A key whose launch fallback is available does not keep a stage off the GPU.
    let missing =
        |k: &KernelKey| variants::launch_fallback(*k).is_none_or(|f| unavailable.contains(&f));
    let ok = |set: &HashSet<WeightFormat>, embed: bool, head: bool| {
        if unavailable
            .iter()
            .any(|k| missing(k) && stage_needs(k, set, embed, head))
        {
            Device::Cpu
        } else {
            Device::Gpu
        }
    };
    Placement {
        embed: ok(&formats.embed, true, false),
        layers: formats.layers.iter().map(|s| ok(s, false, false)).collect(),
        head: ok(&formats.head, false, true),
    }
}

/// `p` with every stage `capable` puts on the CPU moved there.
pub fn restrict(p: &Placement, capable: &Placement) -> Placement {
    let pick = |d: Device, c: Device| if c == Device::Cpu { Device::Cpu } else { d };
    Placement {
        embed: pick(p.embed, capable.embed),
        layers: p
            .layers
            .iter()
            .zip(capable.layers.iter().chain(std::iter::repeat(&Device::Gpu)))
            .map(|(&d, &c)| pick(d, c))
            .collect(),
        head: pick(p.head, capable.head),
    }
}

/// The kernels `gguf`'s model with caches of types `kv` uses on `ctx` (what
/// [`Kernels::with_health_for`](crate::gpu::Kernels::with_health_for) compiles at start-up;
/// the check below tests the same list).
pub fn model_keys(
    ctx: &GpuContext,
    gguf: &Gguf,
    cfg: &Config,
    kv: KvTypes,
) -> Result<HashSet<KernelKey>> {
    let formats = StageFormats::of(gguf, cfg)?;
    Ok(needed_keys(ctx, &formats, kv, cfg.moe.is_some())
        .into_iter()
        .collect())
}

/// [`health::needed_keys`] on `ctx` with the options and layouts a model load chooses there.
fn needed_keys(ctx: &GpuContext, formats: &StageFormats, kv: KvTypes, moe: bool) -> Vec<KernelKey> {
    let facts = AdapterFacts::of(ctx);
    health::needed_keys(&facts, kernel_options(ctx), &formats.all(), kv, moe)
}

/// Runs (or reads from the record) the health check of the variants `gguf`'s model needs on
/// `ctx`; returns it with the stages able to run on the GPU. A note per stage group moved to
/// the CPU is added to the report.
pub fn check_model(
    ctx: &GpuContext,
    gguf: &Gguf,
    cfg: &Config,
    kv: KvTypes,
    opts: &HealthOptions,
) -> Result<(Health, Placement)> {
    let formats = StageFormats::of(gguf, cfg)?;
    let needed = needed_keys(ctx, &formats, kv, cfg.moe.is_some());
    let mut h = health::check(ctx, &needed, opts)?;
    let capable = gpu_capable(&formats, &h.unavailable);
    let cpu_layers = capable.layers.iter().filter(|&&d| d == Device::Cpu).count();
    if !h.unavailable.is_empty() {
        let keys: Vec<String> = h.unavailable.iter().map(KernelKey::label).collect();
        let note = format!(
            "no working GPU variant of {} on {}: {cpu_layers} of {} blocks{}{} run on the CPU",
            keys.join(", "),
            ctx.info.name,
            cfg.n_layer,
            if capable.embed == Device::Cpu {
                ", the embedding"
            } else {
                ""
            },
            if capable.head == Device::Cpu {
                ", the head"
            } else {
                ""
            },
        );
        log::warn!("{note}");
        h.report.notes.push(note);
    }
    Ok((h, capable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::registry::MatvecOut;

    #[test]
    fn an_unavailable_format_moves_only_its_stages() {
        let set = |v: &[WeightFormat]| v.iter().copied().collect::<HashSet<_>>();
        let f = StageFormats {
            embed: set(&[WeightFormat::Q8_0]),
            layers: vec![set(&[WeightFormat::Q4_1]), set(&[WeightFormat::Q8_0])],
            head: set(&[WeightFormat::Q8_0]),
        };
        let q41 = [KernelKey::MatvecRows {
            ty: WeightFormat::Q4_1,
        }];
        let p = gpu_capable(&f, &q41);
        assert_eq!(p.layers, vec![Device::Cpu, Device::Gpu]);
        assert_eq!((p.embed, p.head), (Device::Gpu, Device::Gpu));
        let attn = [KernelKey::AttentionPrefill { kv: KvTypes::F32 }];
        let p = gpu_capable(&f, &attn);
        assert_eq!(p.layers, vec![Device::Cpu, Device::Cpu]);
        assert_eq!((p.embed, p.head), (Device::Gpu, Device::Cpu));
        let lookup = [KernelKey::Embedding {
            ty: WeightFormat::Q8_0,
            f16: false,
        }];
        let p = gpu_capable(&f, &lookup);
        assert_eq!((p.embed, p.head), (Device::Cpu, Device::Gpu));
        let moved = restrict(&Placement::all(Device::Gpu, 2), &p);
        assert_eq!(moved.embed, Device::Cpu);
    }

    #[test]
    fn an_unavailable_prefill_matmul_falls_back_to_the_batched_matvec() {
        let set = |v: &[WeightFormat]| v.iter().copied().collect::<HashSet<_>>();
        let q41 = set(&[WeightFormat::Q4_1]);
        let f = StageFormats {
            embed: q41.clone(),
            layers: vec![q41.clone()],
            head: q41,
        };
        let ty = WeightFormat::Q4_1;
        let prefill = KernelKey::MatmulQ8Rows {
            ty,
            out: Some(MatvecOut::Add),
            subgroup: false,
        };
        // The batched matvec still works: the stages stay on the GPU.
        assert_eq!(gpu_capable(&f, &[prefill]).layers, vec![Device::Gpu]);
        // Both broken: nothing on the GPU can run the matrix.
        let matvec = KernelKey::MatvecQ8RowsOut {
            ty,
            out: MatvecOut::Add,
        };
        assert_eq!(
            gpu_capable(&f, &[prefill, matvec]).layers,
            vec![Device::Cpu]
        );
    }
}
