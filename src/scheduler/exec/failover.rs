//! Going on on the CPU when the GPU fails during a session: a lost device or an allocation
//! that ran out of memory (a block uploaded when the placement or residency changes, a
//! streamed block, a KV cache for a layer that moves there).
//!
//! Every GPU stage moves to the CPU (for the rest of the session) and the KV cache of the
//! layers that were on the GPU is rebuilt there: copied from the GPU while the device can
//! still be read (out of memory), else recomputed by running the session's cached tokens
//! again on the CPU (a lost device keeps nothing). The pass that failed then runs again on
//! the CPU (the caller redoes it, see `Session::eval_chunked`), so the step that failed still
//! yields its token.

use super::Exec;
use crate::error::{Error, Result};
use crate::ground::{Device, PhasePlacement, Placement};
use crate::model::Logits;

/// Why a session's stages left the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackCause {
    DeviceLost,
    OutOfMemory,
}

impl FallbackCause {
    /// The cause of `e`, when it is a GPU failure the session can survive on the CPU.
    pub fn of(e: &Error) -> Option<FallbackCause> {
        match e {
            Error::DeviceLost { .. } => Some(FallbackCause::DeviceLost),
            Error::OutOfMemory { .. } => Some(FallbackCause::OutOfMemory),
            _ => None,
        }
    }
}

/// How the KV cache of the layers that moved was rebuilt on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvRebuild {
    /// Nothing was cached on the GPU.
    Empty,
    /// Read back from the GPU (it still answered).
    Copied,
    /// Computed again from the session's tokens on the CPU.
    Recomputed,
}

/// A move of stages from the GPU to the CPU because the GPU failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fallback {
    pub cause: FallbackCause,
    /// The error the GPU backend reported.
    pub reason: String,
    pub from: Device,
    pub to: Device,
    /// Stages (embedding, blocks, head) that moved.
    pub stages: usize,
    /// Cached positions when it happened (0: at load or session start).
    pub position: usize,
    pub kv: KvRebuild,
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kv = match self.kv {
            KvRebuild::Empty => "",
            KvRebuild::Copied => ", KV cache copied",
            KvRebuild::Recomputed => ", KV cache recomputed",
        };
        write!(
            f,
            "{} ({}): {} stages moved {} -> {} at position {}{kv}",
            match self.cause {
                FallbackCause::DeviceLost => "GPU device lost",
                FallbackCause::OutOfMemory => "GPU out of memory",
            },
            self.reason,
            self.stages,
            self.from,
            self.to,
            self.position,
        )
    }
}

/// Stages `p` puts on the GPU.
pub(crate) fn gpu_stages(p: &PhasePlacement) -> usize {
    let on = |a: Device, b: Device| usize::from(a == Device::Gpu || b == Device::Gpu);
    let (a, b) = (&p.prefill, &p.decode);
    on(a.embed, b.embed)
        + on(a.head, b.head)
        + a.layers
            .iter()
            .zip(&b.layers)
            .map(|(&x, &y)| on(x, y))
            .sum::<usize>()
}

impl Exec {
    /// The moves to the CPU this session made, oldest first.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// Whether a stage may still run on the GPU.
    pub fn has_gpu(&self) -> bool {
        self.gpu_model.is_some()
    }

    /// Notes a move to the CPU (made before the executor existed: at load, or when the GPU
    /// backend could not start) and logs it.
    pub fn record_fallback(&mut self, f: Fallback) {
        log::warn!("{f}; the session goes on on the CPU");
        self.fallbacks.push(f);
    }

    /// Notes a move to the CPU logged already (the load's).
    pub(crate) fn push_fallback(&mut self, f: Fallback) {
        self.fallbacks.push(f);
    }

    /// After `err` from a pass, moves every stage to the CPU, rebuilds there the KV cache of
    /// the layers that were on the GPU (positions 0..history.len(), which hold `history`), and
    /// returns what it did; the caller then runs the failed pass again. An error that is not
    /// a GPU failure the CPU can take over (or one without a GPU in use) comes back as it is.
    pub fn fail_over(&mut self, err: Error, history: &[u32]) -> Result<Fallback> {
        let Some(cause) = FallbackCause::of(&err) else {
            return Err(err);
        };
        if self.gpu_model.is_none() {
            return Err(err);
        }
        let n_layer = self.cfg.n_layer;
        let n_past = history.len();
        let cpu = Placement::all(Device::Cpu, n_layer);
        let stages = gpu_stages(&self.placement);
        // The measured pass and the policy's plans died with the pass; no GPU to plan for.
        self.dynamic = None;
        self.pending = None;
        self.marks.clear();
        self.use_stamps = false;
        self.measure_next = false;
        self.residency_budget = None;
        self.own_resident.iter_mut().for_each(|r| *r = false);
        let on_gpu = self.kv_home.contains(&Device::Gpu);
        let mut kv = if on_gpu && n_past > 0 {
            KvRebuild::Recomputed
        } else {
            KvRebuild::Empty
        };
        if cause == FallbackCause::OutOfMemory && kv == KvRebuild::Recomputed {
            // The device still answers: copy the cache (what `migrate` does for a move).
            let pool = self.pool.clone();
            match pool.install(|| self.migrate(&cpu, n_past)) {
                Ok(()) => kv = KvRebuild::Copied,
                Err(e) => log::warn!("cannot read the KV cache back from the GPU ({e})"),
            }
        }
        self.gpu = None;
        self.gpu_model = None;
        self.placement = PhasePlacement::same(cpu);
        // Layers whose cache stayed on the GPU get an empty one here (filled below).
        let moved: Vec<usize> = (0..n_layer)
            .filter(|&l| self.kv_home[l] == Device::Gpu)
            .collect();
        for &l in &moved {
            self.kv_home[l] = Device::Cpu;
        }
        let made = self.cpu.is_none();
        let (b, _) = self.cpu_side()?;
        if !made {
            for &l in &moved {
                crate::backend::Backend::write_kv(b, l, &[], &[])?;
            }
        }
        if kv == KvRebuild::Recomputed {
            // The blocks above the first moved one need the hidden states of the blocks
            // below: run the whole model again over the cached tokens, in the batches a
            // prompt is cut into.
            let mut none = Vec::new();
            for (i, chunk) in history.chunks(self.batch).enumerate() {
                self.forward(chunk, i * self.batch, Logits::None, &mut none)?;
            }
        }
        let reason = match err {
            Error::DeviceLost { reason } => reason,
            Error::OutOfMemory { what } => what,
            other => other.to_string(),
        };
        let f = Fallback {
            cause,
            reason,
            from: Device::Gpu,
            to: Device::Cpu,
            stages,
            position: n_past,
            kv,
        };
        self.record_fallback(f.clone());
        Ok(f)
    }
}

/// `p` with the stages whose weights did not reach the GPU (an upload ran out of memory at
/// load) moved to the CPU, and how many moved. A block without resident weights stays when
/// `streams` (its weights stream through the slots, which need its norms there).
pub(crate) fn fit_uploaded(
    p: &Placement,
    g: &crate::gpu::GpuModel,
    tied: bool,
    streams: bool,
) -> (Placement, usize) {
    use crate::backend::WeightId;
    let mut out = p.clone();
    let mut moved = 0;
    let mut off = |d: &mut Device, ok: bool| {
        if *d == Device::Gpu && !ok {
            *d = Device::Cpu;
            moved += 1;
        }
    };
    off(&mut out.embed, g.has(WeightId::TokEmbd));
    let head = if tied {
        WeightId::TokEmbd
    } else {
        WeightId::Output
    };
    off(&mut out.head, g.has(WeightId::OutputNorm) && g.has(head));
    for (l, d) in out.layers.iter_mut().enumerate() {
        off(
            d,
            g.has_layer(l) || (streams && g.has(WeightId::AttnNorm(l))),
        );
    }
    (out, moved)
}
