//! Builds GGUF images (versions 2 and 3) in memory: synthetic models, prompt-cache files, and
//! test inputs for the reader.
//!
//! ```
//! use memwall::gguf::{Gguf, Value};
//! use memwall::gguf::writer::GgufWriter;
//! use memwall::GgmlType;
//!
//! let w = GgufWriter::new()
//!     .metadata("general.architecture", Value::String("llama".into()))
//!     .metadata("llama.block_count", Value::U32(2))
//!     .tensor("x", GgmlType::F32, &[2, 1], 1.5f32.to_le_bytes().repeat(2));
//! let g = Gguf::from_bytes(w.to_bytes()).unwrap();
//! assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
//! ```
//!
//! The writer writes exactly what it is given: `to_bytes` never refuses, so tests can produce
//! malformed images (five dims, duplicate keys, a wrong data length, an array whose items do not
//! match its element type). `validate` says whether the image would be well formed, and
//! `write_to` validates before writing. `to_bytes_with_layout` also returns where every field
//! landed, so a test can patch a count, a length, a type or an offset at a known place.

use std::collections::HashSet;
use std::path::Path;

use kernels_ref::GgmlType;

use crate::gguf::{Value, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct WriterTensor {
    pub name: String,
    pub ty: GgmlType,
    /// `dims[0]` is the row length (ne0).
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
}

/// A GGUF image under construction.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<WriterTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

/// Where one metadata pair landed in the image (absolute byte offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// The u64 key length.
    pub key_len_at: usize,
    /// The first byte of the key.
    pub key_at: usize,
    /// The u32 value type.
    pub type_at: usize,
    /// The value (for an array: its u32 element type, then the u64 count at `value_at + 4`).
    pub value_at: usize,
    /// One past the value's last byte.
    pub end: usize,
}

/// Where one tensor info landed in the image (absolute byte offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    pub name_len_at: usize,
    pub name_at: usize,
    /// The u32 dimension count.
    pub n_dims_at: usize,
    /// Each u64 dimension.
    pub dims_at: Vec<usize>,
    /// The u32 ggml type id.
    pub type_at: usize,
    /// The u64 offset relative to the data section.
    pub offset_at: usize,
    /// Where the tensor's data starts.
    pub data_at: usize,
}

/// Where every field of an image landed, for tests that corrupt it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version_at: usize,
    /// The u64 tensor count.
    pub n_tensors_at: usize,
    /// The u64 metadata pair count.
    pub n_kv_at: usize,
    pub kvs: Vec<KvLayout>,
    pub tensors: Vec<TensorLayout>,
    /// End of the last tensor info (before padding).
    pub header_end: usize,
    /// Start of the data section.
    pub data_offset: usize,
    pub alignment: u64,
}

/// Why a writer's content is not a well-formed GGUF image.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WriteError {
    #[error("version {0} cannot be written (2 or 3)")]
    Version(u32),
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("metadata key {key:?}: {msg}")]
    BadValue { key: String, msg: String },
    #[error("general.alignment must be a power of two between 1 and 2^30")]
    BadAlignment,
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("tensor {name:?}: {msg}")]
    BadTensor { name: String, msg: String },
}

impl GgufWriter {
    /// An empty version-3 image with the default alignment of 32.
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field (2 and 3 share a layout; anything else is written as given).
    pub fn version(mut self, version: u32) -> GgufWriter {
        self.version = version;
        self
    }

    /// Adds a metadata pair (appended even if the key already exists).
    pub fn metadata(mut self, key: impl Into<String>, value: Value) -> GgufWriter {
        self.metadata.push((key.into(), value));
        self
    }

    /// Sets `general.alignment` (as a u32), replacing an earlier value.
    pub fn alignment(mut self, alignment: u32) -> GgufWriter {
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        self.metadata
            .push((ALIGNMENT_KEY.to_string(), Value::U32(alignment)));
        self
    }

    /// Adds a tensor. `dims[0]` is the row length; `data` is its raw bytes in ggml layout.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> GgufWriter {
        self.tensors.push(WriterTensor {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
            data: data.into(),
        });
        self
    }

    /// Adds an F32 tensor from values.
    pub fn tensor_f32(self, name: impl Into<String>, dims: &[u64], values: &[f32]) -> GgufWriter {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, GgmlType::F32, dims, data)
    }

    /// The metadata pairs so far, in order.
    pub fn metadata_pairs(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The tensors so far, in order.
    pub fn tensors(&self) -> &[WriterTensor] {
        &self.tensors
    }

    /// The alignment the data section will use: `general.alignment` when it is a usable
    /// integer, else the default. (An unusable value is still written; `validate` reports it.)
    pub fn effective_alignment(&self) -> u64 {
        self.metadata
            .iter()
            .rev()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| v.as_i128())
            .filter(|&a| a > 0 && a <= 1 << 30 && a & (a - 1) == 0)
            .map_or(DEFAULT_ALIGNMENT, |a| a as u64)
    }

    /// Checks that the image would be well formed: version, unique keys, arrays whose items
    /// match their element type, alignment, unique tensor names, at most four dims, row
    /// length a whole number of blocks, and data length equal to what dims and type imply.
    pub fn validate(&self) -> Result<(), WriteError> {
        if self.version != 2 && self.version != 3 {
            return Err(WriteError::Version(self.version));
        }
        let mut keys = HashSet::new();
        for (k, v) in &self.metadata {
            if !keys.insert(k.as_str()) {
                return Err(WriteError::DuplicateKey(k.clone()));
            }
            check_value(k, v)?;
        }
        if let Some((_, v)) = self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            let ok = v
                .as_i128()
                .is_some_and(|a| a > 0 && a <= 1 << 30 && a & (a - 1) == 0);
            if !ok {
                return Err(WriteError::BadAlignment);
            }
        }
        let mut names = HashSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(WriteError::DuplicateTensor(t.name.clone()));
            }
            let bad = |msg: String| WriteError::BadTensor {
                name: t.name.clone(),
                msg,
            };
            if t.dims.len() > MAX_DIMS {
                return Err(bad(format!("{} dims (at most {MAX_DIMS})", t.dims.len())));
            }
            let n = t
                .dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
            let ne0 = t.dims.first().copied().unwrap_or(1);
            if ne0 % t.ty.block_size() as u64 != 0 {
                return Err(bad(format!(
                    "row length {ne0} is not a multiple of the {} block size {}",
                    t.ty,
                    t.ty.block_size()
                )));
            }
            let want =
                t.ty.row_bytes(n)
                    .ok_or_else(|| bad("size overflows".into()))?;
            if want != t.data.len() as u64 {
                return Err(bad(format!(
                    "{} bytes of data, {} {:?} needs {want}",
                    t.data.len(),
                    t.ty,
                    t.dims
                )));
            }
        }
        Ok(())
    }

    /// The image, written exactly as given (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_with_layout().0
    }

    /// The image and where each field landed.
    pub fn to_bytes_with_layout(&self) -> (Vec<u8>, Layout) {
        let alignment = self.effective_alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        let version_at = out.len();
        put_u32(&mut out, self.version);
        let n_tensors_at = out.len();
        put_u64(&mut out, self.tensors.len() as u64);
        let n_kv_at = out.len();
        put_u64(&mut out, self.metadata.len() as u64);

        let mut kvs = Vec::with_capacity(self.metadata.len());
        for (k, v) in &self.metadata {
            let key_len_at = out.len();
            put_str(&mut out, k);
            let type_at = out.len();
            put_u32(&mut out, v.value_type().id());
            let value_at = out.len();
            put_value(&mut out, v);
            kvs.push(KvLayout {
                key_len_at,
                key_at: key_len_at + 8,
                type_at,
                value_at,
                end: out.len(),
            });
        }

        // Data offsets: each tensor starts at the next multiple of the alignment.
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut next = 0u64;
        for t in &self.tensors {
            offsets.push(next);
            next = (next + t.data.len() as u64).div_ceil(alignment) * alignment;
        }

        let mut tensors = Vec::with_capacity(self.tensors.len());
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            let name_len_at = out.len();
            put_str(&mut out, &t.name);
            let n_dims_at = out.len();
            put_u32(&mut out, t.dims.len() as u32);
            let mut dims_at = Vec::with_capacity(t.dims.len());
            for &d in &t.dims {
                dims_at.push(out.len());
                put_u64(&mut out, d);
            }
            let type_at = out.len();
            put_u32(&mut out, t.ty.id());
            let offset_at = out.len();
            put_u64(&mut out, off);
            tensors.push(TensorLayout {
                name_len_at,
                name_at: name_len_at + 8,
                n_dims_at,
                dims_at,
                type_at,
                offset_at,
                data_at: 0,
            });
        }
        let header_end = out.len();
        pad_to(&mut out, alignment);
        let data_offset = out.len();
        for ((t, &off), tl) in self.tensors.iter().zip(&offsets).zip(&mut tensors) {
            tl.data_at = data_offset + off as usize;
            out.resize(tl.data_at, 0);
            out.extend_from_slice(&t.data);
        }
        if !self.tensors.is_empty() {
            pad_to(&mut out, alignment);
        }
        let layout = Layout {
            version_at,
            n_tensors_at,
            n_kv_at,
            kvs,
            tensors,
            header_end,
            data_offset,
            alignment,
        };
        (out, layout)
    }

    /// Validates, then writes the image to `path`; returns its size in bytes.
    pub fn write_to(&self, path: impl AsRef<Path>) -> crate::Result<u64> {
        let path = path.as_ref();
        self.validate()
            .map_err(|e| crate::Error::InvalidArgument(format!("GGUF writer: {e}")))?;
        let image = self.to_bytes();
        std::fs::write(path, &image).map_err(|source| crate::Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(image.len() as u64)
    }
}

/// Arrays must hold items of their declared element type (recursively).
fn check_value(key: &str, v: &Value) -> Result<(), WriteError> {
    if let Value::Array(elem, items) = v {
        for it in items {
            if it.value_type() != *elem {
                return Err(WriteError::BadValue {
                    key: key.to_string(),
                    msg: format!(
                        "array of {} holds a {}",
                        elem.name(),
                        it.value_type().name()
                    ),
                });
            }
            check_value(key, it)?;
        }
    }
    Ok(())
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

/// Appends a little-endian u32.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian u64.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a GGUF string (u64 length, then the bytes).
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends a value without its type tag, as GGUF stores it after the tag and inside arrays.
pub fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => put_u32(out, *x),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(elem, items) => {
            put_u32(out, elem.id());
            put_u64(out, items.len() as u64);
            for it in items {
                put_value(out, it);
            }
        }
        Value::U64(x) => put_u64(out, *x),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
