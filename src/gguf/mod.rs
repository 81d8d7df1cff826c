//! GGUF reader over a memory map (versions 2 and 3).
//!
//! The file is mapped, parsed once and validated; tensor data is never copied: `tensor_data`
//! hands out slices of the map. Parsing is defensive: every length is checked against the bytes
//! that are actually left before anything is allocated, so a file claiming a 2^60-element array
//! is an error, not an allocation attempt, and no input can make the reader panic.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;

use kernels_ref::GgmlType;

mod cursor;
mod parse;
#[cfg(test)]
mod tests;
mod value;
// The writer serves the tools (synthetic models, requantization) and the tests.
#[cfg(any(test, feature = "tools"))]
pub mod writer;

pub use value::{Value, ValueType};

/// "GGUF" as the first four bytes of the file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are refused (real files nest at most once).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Longest metadata key (the GGUF spec caps keys at 2^16 - 1 bytes).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Longest tensor name accepted. ggml itself stops at 63 bytes; memwall is more lenient but
/// still bounded.
pub const MAX_TENSOR_NAME_LEN: u64 = 65_535;
/// Most tensors one file may declare (real models have a few thousand at most).
pub const MAX_TENSORS: u64 = 1 << 20;
/// Budget for decoded metadata: string bytes plus `size_of::<Value>()` per array element. A
/// u8 array costs 1 byte in the file but 32 decoded, so without this a large hostile file could
/// make the reader allocate many times its own size. Real vocabularies of 262k tokens use
/// about 30 MiB.
pub const MAX_METADATA_BYTES: u64 = 512 << 20;

/// What went wrong reading a GGUF file. Each variant names the section, key or tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error(
        "GGUF file is big-endian (version field reads {0:#x}); only little-endian is supported"
    )]
    BigEndian(u32),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated in {section}: needs {need} bytes at offset {offset}, file has {len}")]
    Truncated {
        section: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error("{what}: length {len} is larger than the {left} bytes left in the file")]
    LengthTooLarge { what: String, len: u64, left: u64 },
    #[error("{what}: count {count} cannot fit in the {left} bytes left in the file")]
    CountTooLarge { what: String, count: u64, left: u64 },
    #[error("{what}: string is not valid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("metadata key {key:?}: unknown value type {ty}")]
    UnknownValueType { key: String, ty: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}")]
    NestingTooDeep { key: String },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("general.alignment = {0} is not a power of two between 1 and 2^30")]
    BadAlignment(u64),
    #[error("tensor {tensor:?}: {n} dimensions (at most {MAX_DIMS})")]
    TooManyDims { tensor: String, n: u32 },
    #[error("tensor {tensor:?}: dimensions {dims:?} overflow")]
    DimOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor {tensor:?}: unknown tensor type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error(
        "tensor {tensor:?}: row length {ne0} is not a multiple of the {ty} block size {block}"
    )]
    RowNotBlockAligned {
        tensor: String,
        ty: GgmlType,
        ne0: u64,
        block: usize,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {tensor:?}: data [{start}, {end}) lies outside the file of {len} bytes")]
    DataOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("tensor {tensor:?} cannot be split as asked: {msg}")]
    BadSplit { tensor: String, msg: String },
    #[error("tensors {a:?} and {b:?} overlap in the data section")]
    Overlap { a: String, b: String },
    #[error("tensor name {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("{what}: {value} exceeds the limit of {limit}")]
    LimitExceeded {
        what: String,
        value: u64,
        limit: u64,
    },
}

type Result<T> = std::result::Result<T, GgufError>;

/// One tensor's description. `dims[0]` is the row length (ggml's ne0).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Offset of the data from the start of the file.
    pub file_offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row length (ne0).
    pub fn ne0(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Number of rows (product of dims after the first). Saturates rather than overflowing for
    /// a hand-built info; the parser guarantees it fits.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed, validated GGUF file.
pub struct Gguf {
    bytes: Bytes,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The file the map was made from (`open`), read again by the storage reader and given
    /// page-cache advice; `None` for images held in memory.
    file: Option<(std::path::PathBuf, std::fs::File)>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> crate::Result<Gguf> {
        let path = path.as_ref();
        let io = |source| crate::Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; memwall never writes to model files, and a file that is
        // changed underneath a running process is outside what any mmap-based loader can defend
        // against (llama.cpp makes the same trade).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let mut g = Gguf::parse(Bytes::Mapped(map))?;
        g.file = Some((path.to_path_buf(), file));
        Ok(g)
    }

    /// Parses a GGUF image held in memory (tests, fuzzing, embedded models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::parse(Bytes::Owned(bytes))
    }

    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// File offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    /// The path of the file the model was opened from (`None` for an image in memory).
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|(p, _)| p.as_path())
    }

    /// Drops the page cache of `t`'s bytes (after `release_pages`, so the pages are no longer
    /// mapped here): what the engine holds elsewhere, or reads again from storage, does not
    /// also sit in the page cache, where it would count against the process's memory limit.
    pub fn drop_page_cache(&self, t: &TensorInfo) {
        if let Some((_, f)) = &self.file {
            drop_cache(f, t.file_offset, t.n_bytes);
        }
    }

    /// Drops the page cache of the whole file but the pages mapped here: what reading a tensor
    /// through the map brought in around it (read-ahead reaches megabytes past a small norm
    /// into its neighbours) goes too.
    pub fn drop_file_cache(&self) {
        if let Some((_, f)) = &self.file {
            drop_cache(f, 0, 0);
        }
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.describe(),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(Self::wrong(key, "a string", v)),
        }
    }

    /// An integer value of any stored width that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "an unsigned integer below 2^32", v))
    }

    /// An integer value of any stored width that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "an unsigned integer", v))
    }

    /// An integer value of any stored width that fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| i64::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "an integer", v))
    }

    /// A float value (f32, f64, or an integer).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| Self::wrong(key, "a number", v))
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "a bool", v)),
        }
    }

    /// The elements of an array value.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        match self.require(key)? {
            Value::Array(_, items) => Ok(items),
            v => Err(Self::wrong(key, "an array", v)),
        }
    }

    /// An array of strings, borrowed.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.require(key)?;
        match v {
            Value::Array(ValueType::String, items) => Ok(items
                .iter()
                .map(|it| match it {
                    Value::String(s) => s.as_str(),
                    _ => "",
                })
                .collect()),
            v => Err(Self::wrong(key, "an array of strings", v)),
        }
    }

    /// An array of numbers, converted to f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let v = self.require(key)?;
        match v {
            Value::Array(_, items) => items
                .iter()
                .map(|it| it.as_f64().map(|f| f as f32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Self::wrong(key, "an array of numbers", v)),
            v => Err(Self::wrong(key, "an array of numbers", v)),
        }
    }

    /// An array of integers, converted to i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require(key)?;
        match v {
            Value::Array(_, items) => items
                .iter()
                .map(|it| it.as_i128().and_then(|i| i64::try_from(i).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Self::wrong(key, "an array of integers", v)),
            v => Err(Self::wrong(key, "an array of integers", v)),
        }
    }

    /// `get_*` turned into an `Option`: `Ok(None)` when the key is absent, an error when it is
    /// present with the wrong type.
    pub fn opt<T>(&self, key: &str, f: impl FnOnce(&Gguf, &str) -> Result<T>) -> Result<Option<T>> {
        if self.get(key).is_none() {
            Ok(None)
        } else {
            f(self, key).map(Some)
        }
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor called `name`, or an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor, borrowed from the map (validated in bounds at parse time). An
    /// info that does not describe bytes of this file (one from another file, or built by hand)
    /// gives an empty slice; `try_tensor_data` says so as an error instead.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.try_tensor_data(t).unwrap_or(&[])
    }

    /// The bytes of a tensor, or `DataOutOfBounds` when `t` lies outside this file.
    pub fn try_tensor_data(&self, t: &TensorInfo) -> Result<&[u8]> {
        let buf = self.bytes.as_slice();
        let end = t.file_offset.checked_add(t.n_bytes);
        let range = usize::try_from(t.file_offset)
            .ok()
            .zip(end.and_then(|e| usize::try_from(e).ok()));
        range
            .and_then(|(s, e)| buf.get(s..e))
            .ok_or_else(|| GgufError::DataOutOfBounds {
                tensor: t.name.clone(),
                start: t.file_offset,
                end: end.unwrap_or(u64::MAX),
                len: buf.len() as u64,
            })
    }

    /// Replaces tensor `name` by consecutive ranges of its rows, each a tensor of its own:
    /// `parts` gives each range's name and row count, in order, the counts summing to the
    /// tensor's rows (a 1-D tensor is split along its elements, whole blocks each). The parts
    /// are views of the same file bytes, so a fused projection (phi3's `attn_qkv`, its gate and
    /// up stacked in one `ffn_up`) reads as the separate tensors the forward pass uses, costs no
    /// copy, and counts its bytes once.
    pub fn split_rows(&mut self, name: &str, parts: &[(String, u64)]) -> Result<()> {
        let bad = |msg: String| GgufError::BadSplit {
            tensor: name.to_string(),
            msg,
        };
        let i = *self
            .tensor_index
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let t = self.tensors[i].clone();
        let one_d = t.dims.len() == 1;
        if t.dims.len() > 2 {
            return Err(bad(format!("dimensions {:?} (1-D or 2-D only)", t.dims)));
        }
        let total = if one_d { t.ne0() } else { t.n_rows() };
        let sum = parts.iter().try_fold(0u64, |a, (_, r)| a.checked_add(*r));
        if sum != Some(total) || parts.iter().any(|(_, r)| *r == 0) {
            return Err(bad(format!(
                "parts of {:?} rows do not cover its {total}",
                parts.iter().map(|p| p.1).collect::<Vec<_>>()
            )));
        }
        if let Some((dup, _)) = parts
            .iter()
            .find(|(n, _)| n.as_str() != name && self.tensor_index.contains_key(n.as_str()))
        {
            return Err(bad(format!("a tensor {dup:?} exists already")));
        }
        let mut views = Vec::with_capacity(parts.len());
        let mut at = 0u64;
        for (part, rows) in parts {
            // Bytes before this part and in it: whole rows of a 2-D tensor, whole blocks of a
            // 1-D one.
            let bytes = |n: u64| -> Option<u64> {
                if one_d {
                    t.ty.row_bytes(n)
                } else {
                    t.ty.row_bytes(t.ne0()).and_then(|rb| rb.checked_mul(n))
                }
            };
            let (Some(skip), Some(n_bytes)) = (bytes(at), bytes(*rows)) else {
                return Err(bad(format!(
                    "{rows} elements at {at} are not whole {} blocks",
                    t.ty
                )));
            };
            let dims = if one_d {
                vec![*rows]
            } else {
                vec![t.ne0(), *rows]
            };
            views.push(TensorInfo {
                name: part.clone(),
                n_elements: dims.iter().product(),
                dims,
                ty: t.ty,
                offset: t.offset + skip,
                file_offset: t.file_offset + skip,
                n_bytes,
            });
            at += rows;
        }
        // The views take the fused tensor's place, so file order (which the storage reader's
        // spans follow) is kept.
        self.tensors.splice(i..=i, views);
        self.tensor_index = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(())
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Lets the OS drop `t`'s resident pages now (a tensor whose data has been copied, e.g.
    /// packed for the CPU's GEMM, so the copy does not count twice in the process's memory).
    /// Best effort: the pages come back from the file on the next read, so a refusal (or an
    /// image held in memory, or a non-Unix OS) changes nothing but the memory held.
    pub fn release_pages(&self, t: &TensorInfo) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            let (Ok(off), Ok(len)) = (usize::try_from(t.file_offset), usize::try_from(t.n_bytes))
            else {
                return;
            };
            if off.checked_add(len).is_some_and(|end| end <= m.len()) {
                // SAFETY: the map is a read-only file mapping that memwall never writes, so
                // MADV_DONTNEED only drops clean pages: the next read of any byte in the range
                // (including the neighbours sharing its first and last page) faults the same
                // file contents back in. No slice into the map sees a change.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, off, len)
                };
            }
        }
        #[cfg(not(unix))]
        let _ = t;
    }
}

/// Drops the page cache of a file range (`len` 0: to the end of the file) but the pages mapped
/// somewhere (the pages are clean: memwall never writes model files).
pub fn drop_cache(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: an advisory call on an open descriptor; it reads no memory of ours.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}
