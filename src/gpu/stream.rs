//! Layer streaming: blocks placed on the GPU whose weights are not resident there are copied
//! into a ring of two slots of GPU buffers just before they run, from the model's storage
//! reader (`memory::reader`: read ahead, out of the page cache) or, without one, the mmap.
//!
//! Each slot holds one block's matrices in the GPU layout (the same parts split as a resident
//! copy would be). The executor loads block l into the slot the previous block is not using and
//! submits block l's work before it loads block l + 1 into the other slot, so the host-side
//! repack and copy of the next block overlap the GPU's work on the current one. wgpu applies a
//! queue write after all previously submitted work, so a slot is never overwritten under a
//! block that still reads it. The slots' buffers are made once; the bind groups that name them
//! stay cached, so streaming creates nothing in the token loop.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::WeightId;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::device::GpuContext;
use crate::gpu::repack::repack;
use crate::gpu::weights::{gpu_format, upload_split, GpuWeightMatrix};
use crate::memory::reader::lock;
use crate::memory::SharedReader;

/// Slots in the ring: the block running and the block being loaded.
pub const RING_SLOTS: usize = 2;

/// The matrices of a block, by role (the block's ids with the layer index set to 0).
fn role(id: WeightId) -> WeightId {
    use WeightId::*;
    match id {
        Wq(_) => Wq(0),
        Wk(_) => Wk(0),
        Wv(_) => Wv(0),
        Wo(_) => Wo(0),
        Gate(_) => Gate(0),
        Up(_) => Up(0),
        Down(_) => Down(0),
        other => other,
    }
}

pub(crate) fn layer_matrices(l: usize) -> [WeightId; 7] {
    use WeightId::*;
    [Wq(l), Wk(l), Wv(l), Wo(l), Gate(l), Up(l), Down(l)]
}

struct Slot {
    /// The block whose weights the slot holds now.
    layer: Option<usize>,
    /// Its matrices by role.
    mats: HashMap<WeightId, GpuWeightMatrix>,
}

/// The ring of slots and where it reads from.
pub struct StreamRing {
    gguf: Arc<Gguf>,
    /// The storage reader blocks come through (`None`: the mmap).
    source: Option<SharedReader>,
    slots: Vec<Slot>,
    /// The slot loaded last (the next load goes to another one).
    last: usize,
    /// Blocks loaded and bytes copied so far.
    pub n_loads: u64,
    pub bytes_loaded: u64,
    /// Host milliseconds those loads took (repack + queue write): the upload bandwidth the
    /// residency policy weighs streaming with.
    pub load_ms: f64,
    /// GPU bytes of the slots.
    pub bytes: u64,
}

impl StreamRing {
    /// A ring whose slots fit the model's blocks (all blocks of a llama model have the same
    /// shapes; a block that does not fit its slot is an error when it is loaded). Binding
    /// parts are at most `limit` bytes.
    pub fn new(ctx: &GpuContext, gguf: Arc<Gguf>, limit: u64) -> Result<Self> {
        let mut slots = Vec::with_capacity(RING_SLOTS);
        let mut bytes = 0u64;
        for _ in 0..RING_SLOTS {
            // Made from block 0's weights: the buffers get their final sizes and split; the
            // slot is marked empty, so nothing reads these contents as block 0's by mistake.
            let mut mats = HashMap::new();
            for id in layer_matrices(0) {
                let m = upload(ctx, &gguf, id, limit)?;
                bytes += matrix_bytes(&m);
                mats.insert(role(id), m);
            }
            slots.push(Slot { layer: None, mats });
        }
        Ok(StreamRing {
            gguf,
            source: None,
            slots,
            last: RING_SLOTS - 1,
            n_loads: 0,
            bytes_loaded: 0,
            load_ms: 0.0,
            bytes,
        })
    }

    /// Reads blocks through `source` from now on (`None`: from the mmap).
    pub fn set_source(&mut self, source: Option<SharedReader>) {
        self.source = source;
    }

    /// Whether block `l` is in a slot.
    pub fn holds(&self, l: usize) -> bool {
        self.slots.iter().any(|s| s.layer == Some(l))
    }

    /// Copies block `l`'s matrices into the slot after the one loaded last (no-op when a slot
    /// holds it already). The caller has submitted all recorded work that reads that slot.
    pub fn load(&mut self, ctx: &GpuContext, l: usize) -> Result<()> {
        if self.holds(l) {
            return Ok(());
        }
        // The queue writes stage the block in memory the driver allocates.
        ctx.before_alloc(&format!("stream block {l}"))?;
        let t = std::time::Instant::now();
        let i = (self.last + 1) % self.slots.len();
        let slot = &mut self.slots[i];
        slot.layer = None;
        let read = match &self.source {
            Some(r) => Some((r, lock(r)?.acquire(l)?)),
            None => None,
        };
        let mut r: Result<u64> = Ok(0);
        for id in layer_matrices(l) {
            r = r.and_then(|n| {
                let dst = slot.mats.get(&role(id)).ok_or_else(|| {
                    Error::Gpu(format!("stream slot has no {}", id.tensor_name()))
                })?;
                let host = read.as_ref().map(|(_, s)| s);
                Ok(n + write(ctx, &self.gguf, host, id, dst)?)
            });
        }
        if let Some((reader, s)) = read {
            // The queue writes copied the bytes out: the host slot can be refilled.
            lock(reader)?.release(s);
        }
        self.bytes_loaded += r?;
        slot.layer = Some(l);
        self.last = i;
        self.n_loads += 1;
        self.load_ms += t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// The streamed copy of matrix `id`, if its block is in a slot.
    pub fn matrix(&self, id: WeightId) -> Option<&GpuWeightMatrix> {
        let l = id.layer_index()?;
        self.slots
            .iter()
            .find(|s| s.layer == Some(l))
            .and_then(|s| s.mats.get(&role(id)))
    }
}

/// GPU bytes of a matrix's buffers.
pub(crate) fn matrix_bytes(m: &GpuWeightMatrix) -> u64 {
    m.parts
        .iter()
        .map(|p| p.m.quants.size() + p.m.scales.as_ref().map_or(0, |s| s.size()))
        .sum()
}

/// Uploads matrix `id` as a resident copy would be (the slot's initial contents, and a block
/// a session makes resident).
pub(crate) fn upload(
    ctx: &GpuContext,
    g: &Gguf,
    id: WeightId,
    limit: u64,
) -> Result<GpuWeightMatrix> {
    let t = g.require_tensor(&id.tensor_name())?;
    let (cols, rows) = dims(t)?;
    let (ty, bytes, _) = gpu_format(t.ty, &t.name, g.tensor_data(t), rows, cols)?;
    upload_split(ctx, &t.name, ty, &bytes, rows, cols, limit)
}

fn dims(t: &crate::gguf::TensorInfo) -> Result<(usize, usize)> {
    match t.dims.as_slice() {
        [c, r] => Ok((*c as usize, *r as usize)),
        _ => Err(Error::Tensor {
            name: t.name.clone(),
            msg: format!("expected a matrix, found dims {:?}", t.dims),
        }),
    }
}

/// Repacks matrix `id` into `dst`'s buffers (same shape and split), from the reader's slot
/// `host` when given, else the mmap; returns the bytes written.
fn write(
    ctx: &GpuContext,
    g: &Gguf,
    host: Option<&crate::memory::Slot>,
    id: WeightId,
    dst: &GpuWeightMatrix,
) -> Result<u64> {
    let t = g.require_tensor(&id.tensor_name())?;
    let (cols, rows) = dims(t)?;
    let data = match host {
        Some(s) => s
            .bytes(t.file_offset, t.n_bytes as usize)
            .ok_or_else(|| Error::Gpu(format!("{}: not in the block read from storage", t.name)))?,
        None => g.tensor_data(t),
    };
    let (ty, bytes, _) = gpu_format(t.ty, &t.name, data, rows, cols)?;
    let shape_err = || Error::Gpu(format!("{}: does not fit its stream slot", t.name));
    if rows != dst.rows || cols != dst.cols {
        return Err(shape_err());
    }
    let row_bytes = bytes.len() / rows.max(1);
    let mut written = 0u64;
    for p in &dst.parts {
        if p.m.ty != ty {
            return Err(shape_err());
        }
        let range = p.row0 * row_bytes..(p.row0 + p.m.rows) * row_bytes;
        let src = bytes.get(range).ok_or_else(shape_err)?;
        let packed = repack(ty, src, p.m.rows, cols)?;
        let q: &[u8] = bytemuck::cast_slice(&packed.quants);
        if q.len() as u64 > p.m.quants.size() {
            return Err(shape_err());
        }
        ctx.queue.write_buffer(&p.m.quants, 0, q);
        written += q.len() as u64;
        if let Some(sb) = &p.m.scales {
            let sc: &[u8] = bytemuck::cast_slice(&packed.scales);
            if sc.len() as u64 > sb.size() {
                return Err(shape_err());
            }
            ctx.queue.write_buffer(sb, 0, sc);
            written += sc.len() as u64;
        }
    }
    Ok(written)
}
