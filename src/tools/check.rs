//! `memwall check`: finds everything wrong with a GGUF file, not just the first thing.
//!
//! The reader already refuses structural problems (it stops at the first); this adds the
//! per-tensor checks a loader does not do on its own: every f16/bf16/f32 scale field of every
//! quantized block is finite, and every element of a float tensor is finite. A NaN scale turns a
//! whole block of weights into NaN, which then spreads through the model silently.
//!
//! Scale field offsets come from ggml's block structs (ggml-common.h).

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::gguf::{Gguf, TensorInfo};
use crate::GgmlType;

/// How a scale field is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Half,
    Single,
    /// MXFP4's shared exponent: 0xff is NaN.
    E8M0,
}

/// The scale fields of one block: (name, byte offset in the block, encoding).
pub type Fields = &'static [(&'static str, usize, Field)];

/// Which scale fields each block type has, or `None` when a type has no table (its size is
/// still checked). Float tensors are checked element by element instead.
pub fn scale_fields(ty: GgmlType) -> Option<Fields> {
    use Field::{Half, Single, E8M0};
    use GgmlType::*;
    Some(match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
        | IQ1_S => &[("d", 0, Half)],
        Q4_1 | Q5_1 => &[("d", 0, Half), ("m", 2, Half)],
        Q8_1 => &[("d", 0, Half), ("s", 2, Half)],
        Q2_K => &[("d", 80, Half), ("dmin", 82, Half)],
        Q3_K => &[("d", 108, Half)],
        Q4_K | Q5_K => &[("d", 0, Half), ("dmin", 2, Half)],
        Q6_K => &[("d", 208, Half)],
        Q8_K => &[("d", 0, Single)],
        TQ1_0 => &[("d", 52, Half)],
        TQ2_0 => &[("d", 64, Half)],
        MXFP4 => &[("e", 0, E8M0)],
        // IQ1_M spreads its scale over the scales bytes; integers have no float fields.
        IQ1_M | F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => return None,
    })
}

/// One thing wrong with a file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Problem {
    /// The file could not be opened or parsed; nothing else was checked.
    Unreadable { message: String },
    /// The data slice does not have the size the type and dims imply.
    SizeMismatch {
        tensor: String,
        expected: u64,
        actual: u64,
    },
    /// Some blocks have a NaN or infinite scale field.
    NonFiniteScale {
        tensor: String,
        field: &'static str,
        /// Index of the first bad block, and how many blocks are bad.
        first_block: u64,
        count: u64,
    },
    /// Some elements of a float tensor are NaN or infinite.
    NonFiniteElement {
        tensor: String,
        first_index: u64,
        count: u64,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Unreadable { message } => write!(f, "{message}"),
            Problem::SizeMismatch {
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "tensor {tensor:?}: {actual} bytes of data, type and dims need {expected}"
            ),
            Problem::NonFiniteScale {
                tensor,
                field,
                first_block,
                count,
            } => write!(
                f,
                "tensor {tensor:?}: scale field {field} is NaN or infinite in {count} block(s), \
                 first at block {first_block}"
            ),
            Problem::NonFiniteElement {
                tensor,
                first_index,
                count,
            } => write!(
                f,
                "tensor {tensor:?}: {count} element(s) are NaN or infinite, first at index \
                 {first_index}"
            ),
        }
    }
}

/// What `check_file` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    pub path: PathBuf,
    /// Tensors in the file (0 when it could not be parsed).
    pub n_tensors: usize,
    /// Tensor data bytes looked at.
    pub bytes_checked: u64,
    /// Tensors whose type has no scale table: only their size was checked.
    pub size_checked_only: Vec<String>,
    pub problems: Vec<Problem>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Opens, parses and checks the file at `path`. Never fails: an unreadable file is a problem in
/// the report.
pub fn check_file(path: impl AsRef<Path>) -> CheckReport {
    let path = path.as_ref();
    match Gguf::open(path) {
        Ok(g) => check_gguf(&g, path),
        Err(e) => unreadable(path, e.to_string()),
    }
}

/// Parses and checks an image held in memory.
pub fn check_bytes(bytes: Vec<u8>) -> CheckReport {
    let path = PathBuf::from("<memory>");
    match Gguf::from_bytes(bytes) {
        Ok(g) => check_gguf(&g, &path),
        Err(e) => unreadable(&path, e.to_string()),
    }
}

fn unreadable(path: &Path, message: String) -> CheckReport {
    CheckReport {
        path: path.to_path_buf(),
        n_tensors: 0,
        bytes_checked: 0,
        size_checked_only: Vec::new(),
        problems: vec![Problem::Unreadable { message }],
    }
}

/// Checks every tensor of a parsed file, in parallel. Problems come out in tensor order.
pub fn check_gguf(g: &Gguf, path: &Path) -> CheckReport {
    let per_tensor: Vec<(Vec<Problem>, u64, bool)> =
        g.tensors().par_iter().map(|t| check_tensor(g, t)).collect();
    let mut report = CheckReport {
        path: path.to_path_buf(),
        n_tensors: g.tensors().len(),
        bytes_checked: 0,
        size_checked_only: Vec::new(),
        problems: Vec::new(),
    };
    for (t, (problems, bytes, size_only)) in g.tensors().iter().zip(per_tensor) {
        report.problems.extend(problems);
        report.bytes_checked += bytes;
        if size_only {
            report.size_checked_only.push(t.name.clone());
        }
    }
    report
}

/// Blocks per parallel work item: large enough to amortise scheduling, small enough that one
/// big embedding matrix spreads over all cores.
const CHUNK_BLOCKS: usize = 16 * 1024;

/// Problems of one tensor, bytes looked at, and whether only its size was checked.
fn check_tensor(g: &Gguf, t: &TensorInfo) -> (Vec<Problem>, u64, bool) {
    let data = g.tensor_data(t);
    let expected = t.ty.row_bytes(t.n_elements);
    if expected != Some(data.len() as u64) || t.n_bytes != data.len() as u64 {
        let p = Problem::SizeMismatch {
            tensor: t.name.clone(),
            expected: expected.unwrap_or(u64::MAX),
            actual: data.len() as u64,
        };
        return (vec![p], 0, false);
    }
    let bytes = data.len() as u64;
    let elem = |first_index, count| Problem::NonFiniteElement {
        tensor: t.name.clone(),
        first_index,
        count,
    };
    let problems = match t.ty {
        GgmlType::F32 => scan(data, 4, &[("", 0, Field::Single)])
            .pop()
            .map(|(_, f, c)| elem(f, c)),
        GgmlType::F16 => scan(data, 2, &[("", 0, Field::Half)])
            .pop()
            .map(|(_, f, c)| elem(f, c)),
        GgmlType::BF16 => scan_bf16(data).map(|(f, c)| elem(f, c)),
        GgmlType::F64 => scan_f64(data).map(|(f, c)| elem(f, c)),
        ty => match scale_fields(ty) {
            Some(fields) => {
                let found = scan(data, ty.type_size(), fields);
                let v = found
                    .into_iter()
                    .map(|(field, first_block, count)| Problem::NonFiniteScale {
                        tensor: t.name.clone(),
                        field,
                        first_block,
                        count,
                    })
                    .collect();
                return (v, bytes, false);
            }
            None => {
                let size_only = !matches!(
                    ty,
                    GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64
                );
                return (Vec::new(), bytes, size_only);
            }
        },
    };
    (problems.into_iter().collect(), bytes, false)
}

fn is_finite(field: Field, b: &[u8]) -> bool {
    match field {
        Field::Half => u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00,
        Field::Single => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 != 0x7f80_0000,
        Field::E8M0 => b[0] != 0xff,
    }
}

/// For each field: (name, first bad block, bad block count), only for fields with a bad block.
/// `data` is a whole number of `block_bytes` blocks (checked by the caller).
fn scan(data: &[u8], block_bytes: usize, fields: Fields) -> Vec<(&'static str, u64, u64)> {
    let chunk = CHUNK_BLOCKS * block_bytes;
    // Per chunk and field: (first bad block within the tensor, count).
    let per_chunk: Vec<Vec<(u64, u64)>> = data
        .par_chunks(chunk)
        .enumerate()
        .map(|(ci, bytes)| {
            let base = (ci * CHUNK_BLOCKS) as u64;
            fields
                .iter()
                .map(|&(_, off, field)| {
                    let mut first = u64::MAX;
                    let mut count = 0u64;
                    for (bi, block) in bytes.chunks_exact(block_bytes).enumerate() {
                        if !is_finite(field, &block[off..]) {
                            first = first.min(base + bi as u64);
                            count += 1;
                        }
                    }
                    (first, count)
                })
                .collect()
        })
        .collect();
    fields
        .iter()
        .enumerate()
        .filter_map(|(fi, &(name, _, _))| {
            let (first, count) = per_chunk
                .iter()
                .fold((u64::MAX, 0), |(f, c), v| (f.min(v[fi].0), c + v[fi].1));
            (count > 0).then_some((name, first, count))
        })
        .collect()
}

fn scan_bf16(data: &[u8]) -> Option<(u64, u64)> {
    bad_elements(data, 2, |b| {
        u16::from_le_bytes([b[0], b[1]]) & 0x7f80 != 0x7f80
    })
}

fn scan_f64(data: &[u8]) -> Option<(u64, u64)> {
    bad_elements(data, 8, |b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        f64::from_le_bytes(a).is_finite()
    })
}

fn bad_elements(data: &[u8], size: usize, ok: impl Fn(&[u8]) -> bool + Sync) -> Option<(u64, u64)> {
    let chunk = CHUNK_BLOCKS * size;
    let (first, count) = data
        .par_chunks(chunk)
        .enumerate()
        .map(|(ci, bytes)| {
            let base = (ci * CHUNK_BLOCKS) as u64;
            let mut first = u64::MAX;
            let mut count = 0u64;
            for (i, e) in bytes.chunks_exact(size).enumerate() {
                if !ok(e) {
                    first = first.min(base + i as u64);
                    count += 1;
                }
            }
            (first, count)
        })
        .reduce(|| (u64::MAX, 0), |a, b| (a.0.min(b.0), a.1 + b.1));
    (count > 0).then_some((first, count))
}
