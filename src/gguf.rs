//! GGUF reader over a memory map (versions 2 and 3).
//!
//! The file is mapped, parsed once and validated; tensor data is never copied: `tensor_data`
//! hands out slices of the map. Parsing is defensive: every length is checked against the bytes
//! that are actually left before anything is allocated, so a file claiming a 2^60-element array
//! is an error, not an allocation attempt, and no input can make the reader panic.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use kernels_ref::GgmlType;

/// "GGUF" as the first four bytes of the file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are refused (real files nest at most once).
pub const MAX_ARRAY_DEPTH: usize = 8;

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
}

type Result<T> = std::result::Result<T, GgufError>;

/// The type tag of a metadata value, as GGUF numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    fn from_u32(v: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in the file (used to bound array counts
    /// by what is left, before allocating).
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type and elements (all of that type).
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed integer, if it is an integer of any width.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// A short description for error messages and `inspect` ("u32", "array of 49152 string").
    pub fn describe(&self) -> String {
        match self {
            Value::Array(t, v) => format!("array of {} {}", v.len(), t.name()),
            v => v.value_type().name().to_string(),
        }
    }
}

impl fmt::Display for Value {
    /// Scalars in full; arrays abbreviated to their first few elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(t, items) => {
                write!(f, "[{} x {}: ", items.len(), t.name())?;
                for (i, it) in items.iter().take(5).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{it}")?;
                }
                if items.len() > 5 {
                    write!(f, ", ...")?;
                }
                write!(f, "]")
            }
        }
    }
}

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
    /// Number of rows (product of dims after the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
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

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, section: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(GgufError::Truncated {
                section: section(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, section: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, section)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, section: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(section)?))
    }

    fn u64(&mut self, section: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(section)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(GgufError::LengthTooLarge {
                what: what(),
                len,
                left: self.left(),
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let sec = || format!("metadata value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>(&sec)?[0]),
            ValueType::I8 => Value::I8(self.arr::<1>(&sec)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr(&sec)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr(&sec)?)),
            ValueType::U32 => Value::U32(self.u32(&sec)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr(&sec)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr(&sec)?)),
            ValueType::Bool => Value::Bool(self.arr::<1>(&sec)?[0] != 0),
            ValueType::String => Value::String(self.string(&sec)?),
            ValueType::U64 => Value::U64(self.u64(&sec)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.arr(&sec)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.arr(&sec)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_string(),
                    });
                }
                let raw = self.u32(&sec)?;
                let elem = ValueType::from_u32(raw).ok_or_else(|| GgufError::UnknownValueType {
                    key: key.to_string(),
                    ty: raw,
                })?;
                let count = self.u64(&sec)?;
                // Bound the count by the bytes left before reserving anything.
                if count
                    .checked_mul(elem.min_size())
                    .is_none_or(|b| b > self.left())
                {
                    return Err(GgufError::CountTooLarge {
                        what: format!("metadata array {key:?}"),
                        count,
                        left: self.left(),
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
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
        Ok(Gguf::parse(Bytes::Mapped(map))?)
    }

    /// Parses a GGUF image held in memory (tests, fuzzing, embedded models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Gguf> {
        let buf = bytes.as_slice();
        let len = buf.len() as u64;
        let mut c = Cursor { buf, pos: 0 };
        let hdr = || "header".to_string();
        let magic: [u8; 4] = c.arr(&hdr)?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&hdr)?;
        if version != 2 && version != 3 {
            if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                return Err(GgufError::BigEndian(version));
            }
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64(&hdr)?;
        let n_kv = c.u64(&hdr)?;
        // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
        // least 8 + 4 + 4 + 8.
        if n_kv.checked_mul(13).is_none_or(|b| b > c.left()) {
            return Err(GgufError::CountTooLarge {
                what: "metadata key count".into(),
                count: n_kv,
                left: c.left(),
            });
        }
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let raw = c.u32(&|| format!("metadata type of {key:?}"))?;
            let ty = ValueType::from_u32(raw).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                ty: raw,
            })?;
            let value = c.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_i128().ok_or_else(|| GgufError::WrongType {
                    key: "general.alignment".into(),
                    expected: "an integer",
                    found: v.describe(),
                })?;
                if a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0 {
                    return Err(GgufError::BadAlignment(a.clamp(0, u64::MAX as i128) as u64));
                }
                a as u64
            }
        };

        if n_tensors.checked_mul(24).is_none_or(|b| b > c.left()) {
            return Err(GgufError::CountTooLarge {
                what: "tensor count".into(),
                count: n_tensors,
                left: c.left(),
            });
        }
        let mut raw_infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor #{i}"))?;
            let sec = || format!("info of tensor {name:?}");
            let n_dims = c.u32(&sec)?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    tensor: name,
                    n: n_dims,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&sec)?);
            }
            let ty_id = c.u32(&sec)?;
            let offset = c.u64(&sec)?;
            raw_infos.push((name, dims, ty_id, offset));
        }
        let header_end = c.pos as u64;
        // header_end <= len < 2^63, so this cannot overflow.
        let data_offset = header_end.div_ceil(alignment) * alignment;

        let mut tensors = Vec::with_capacity(raw_infos.len());
        let mut tensor_index = HashMap::with_capacity(raw_infos.len());
        for (name, dims, ty_id, offset) in raw_infos {
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType {
                tensor: name.clone(),
                id: ty_id,
            })?;
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| GgufError::DimOverflow {
                    tensor: name.clone(),
                    dims: dims.clone(),
                })?;
            let ne0 = dims.first().copied().unwrap_or(1);
            if ne0 % ty.block_size() as u64 != 0 {
                return Err(GgufError::RowNotBlockAligned {
                    tensor: name,
                    ty,
                    ne0,
                    block: ty.block_size(),
                });
            }
            let n_bytes = ty
                .row_bytes(n_elements)
                .ok_or_else(|| GgufError::DimOverflow {
                    tensor: name.clone(),
                    dims: dims.clone(),
                })?;
            if offset % alignment != 0 {
                return Err(GgufError::MisalignedOffset {
                    tensor: name,
                    offset,
                    alignment,
                });
            }
            let start = data_offset.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(n_bytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= len => {
                    let _ = s;
                }
                _ => {
                    return Err(GgufError::DataOutOfBounds {
                        tensor: name,
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len,
                    })
                }
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                file_offset: data_offset + offset,
                n_elements,
                n_bytes,
            });
        }

        // Overlap check: sort by start, each must end before the next begins. Zero-sized
        // tensors occupy no bytes and cannot overlap anything.
        let mut order: Vec<usize> = (0..tensors.len())
            .filter(|&i| tensors[i].n_bytes > 0)
            .collect();
        order.sort_by_key(|&i| tensors[i].offset);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.offset + a.n_bytes > b.offset {
                return Err(GgufError::Overlap {
                    a: a.name.clone(),
                    b: b.name.clone(),
                });
            }
        }

        Ok(Gguf {
            bytes,
            version,
            alignment,
            data_offset,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
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

    /// The bytes of a tensor, borrowed from the map (validated in bounds at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let buf = self.bytes.as_slice();
        let start = t.file_offset as usize;
        buf.get(start..start + t.n_bytes as usize).unwrap_or(&[])
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }
}
