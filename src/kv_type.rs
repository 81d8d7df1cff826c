//! KV cache element types, chosen separately for keys and values (`--cache-type-k`,
//! `--cache-type-v`).
//!
//! A cache row (one position: `n_head_kv * head_dim` values) is stored in the type's GGUF
//! layout: F32 and F16 element by element, Q8_0 and Q4_0 as GGUF blocks of 32 values along
//! head_dim (34 and 18 bytes: an f16 scale, then the quants). A head's slice of a row starts on a
//! block boundary because head_dim is a multiple of 32 for the quantized types. Rows are
//! quantized with kernels-ref's quantizers, so every backend's cache holds the same bytes.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use kernels_ref::GgmlType;

/// The element type of a KV cache (keys or values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// 32-bit floats: the exact cache, kept for validating the others against.
    F32,
    /// IEEE half floats (the default: half the memory of f32 at no measurable quality cost).
    #[default]
    F16,
    /// GGUF Q8_0 blocks: 8.5 bits per value.
    Q8_0,
    /// GGUF Q4_0 blocks: 4.5 bits per value (values tolerate it better than keys).
    Q4_0,
}

impl KvType {
    /// Every type, in the order the CLI lists them.
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

    /// The CLI / llama.cpp name ("f16", "q8_0", ...).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The GGUF tensor type whose layout the cache uses.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_values(self) -> usize {
        match self {
            KvType::F32 | KvType::F16 => 1,
            KvType::Q8_0 | KvType::Q4_0 => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
            KvType::Q8_0 => 34,
            KvType::Q4_0 => 18,
        }
    }

    /// Storage bits per value (memory accounting).
    pub fn bits(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_values() as f64
    }

    /// Bytes of `n` values; `n` must be a whole number of blocks.
    pub fn bytes(self, n: usize) -> usize {
        n / self.block_values() * self.block_bytes()
    }

    /// Checks that a head of `head_dim` values splits into whole blocks of this type.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(self.block_values()) {
            return Err(Error::InvalidArgument(format!(
                "KV cache type {self} needs a head_dim that is a multiple of {} (the model's is \
                 {head_dim}); use --cache-type-k/--cache-type-v f16",
                self.block_values()
            )));
        }
        Ok(())
    }

    /// Appends `x` (a whole number of blocks) in this type's layout to `out`: kernels-ref's
    /// quantizer, so the bytes are the reference's.
    pub fn quantize_into(self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let q = kernels_ref::quantize(self.ggml_type(), x)
            .map_err(|e| Error::InvalidArgument(format!("KV cache {self}: {e}")))?;
        if q.len() != out.len() {
            return Err(Error::InvalidArgument(format!(
                "KV cache {self}: {} values need {} bytes, the destination has {}",
                x.len(),
                q.len(),
                out.len()
            )));
        }
        out.copy_from_slice(&q);
        Ok(())
    }

    /// Decodes `out.len()` values (a whole number of blocks) from `data` in this type's layout
    /// (`data.len() == self.bytes(out.len())`, checked by the caller). Exact, and equal to
    /// kernels-ref's dequantizer; fast enough for the attention's inner loop.
    pub fn dequantize_into(self, data: &[u8], out: &mut [f32]) {
        let lut = f16_table();
        let f16 = |b: &[u8]| lut[usize::from(u16::from_le_bytes([b[0], b[1]]))];
        match self {
            KvType::F32 => {
                for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            KvType::F16 => {
                for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                    *o = f16(b);
                }
            }
            KvType::Q8_0 => {
                for (o, b) in out.chunks_exact_mut(32).zip(data.chunks_exact(34)) {
                    let d = f16(b);
                    for (ov, &q) in o.iter_mut().zip(&b[2..]) {
                        *ov = d * f32::from(q as i8);
                    }
                }
            }
            KvType::Q4_0 => {
                // Nibbles: value i < 16 is the low nibble of qs[i], value i + 16 the high one.
                for (o, b) in out.chunks_exact_mut(32).zip(data.chunks_exact(18)) {
                    let d = f16(b);
                    let (lo, hi) = o.split_at_mut(16);
                    for (i, &q) in b[2..].iter().enumerate() {
                        lo[i] = d * (i32::from(q & 15) - 8) as f32;
                        hi[i] = d * (i32::from(q >> 4) - 8) as f32;
                    }
                }
            }
        }
    }
}

/// Every f16 bit pattern as f32 ([65536], 256 KiB, built once): a load instead of the
/// software conversion on CPUs without F16C, in the attention's inner loop.
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = Error;

    fn from_str(s: &str) -> Result<KvType> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown KV cache type '{s}' (expected one of f32, f16, q8_0, q4_0)"
                ))
            })
    }
}

/// The types of the keys and of the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Both caches in f32 (validation).
    pub const F32: KvTypes = KvTypes {
        k: KvType::F32,
        v: KvType::F32,
    };

    /// "k=q8_0,v=q4_0": identifies the cache format (prompt-cache files record it).
    pub fn signature(self) -> String {
        format!("k={},v={}", self.k, self.v)
    }

    /// Mean storage bits per cached value over K and V (memory accounting).
    pub fn mean_bits(self) -> f64 {
        (self.k.bits() + self.v.bits()) / 2.0
    }

    /// Checks both types against the model's head_dim.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        self.k.check_head_dim(head_dim)?;
        self.v.check_head_dim(head_dim)
    }
}
