//! Parsing and validation of a whole GGUF image.
//!
//! Order: header, metadata (then `general.alignment`), tensor infos, then per-tensor checks
//! (type, dims, block alignment, offset alignment, bounds, duplicates) and finally overlaps.
//! The first problem found is returned; nothing after it is looked at.

use std::collections::HashMap;

use kernels_ref::GgmlType;

use super::cursor::Cursor;
use super::*;

/// Initial capacity of the per-file vectors and maps: counts are bounded by the bytes left, but
/// a decoded entry is several times larger than its smallest encoding, so reserve little and
/// let real entries grow the vectors.
const INITIAL_CAPACITY: u64 = 1024;

impl Gguf {
    pub(super) fn parse(bytes: Bytes) -> Result<Gguf> {
        let buf = bytes.as_slice();
        let len = buf.len() as u64;
        let mut c = Cursor::new(buf);
        let magic: [u8; 4] = c.arr(&|| "magic".to_string())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&|| "version".to_string())?;
        if version != 2 && version != 3 {
            if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                return Err(GgufError::BigEndian(version));
            }
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64(&|| "tensor count".to_string())?;
        let n_kv = c.u64(&|| "metadata key count".to_string())?;
        // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
        if n_kv.checked_mul(13).is_none_or(|b| b > c.left()) {
            return Err(GgufError::CountTooLarge {
                what: "metadata key count".into(),
                count: n_kv,
                left: c.left(),
            });
        }
        let cap = n_kv.min(INITIAL_CAPACITY) as usize;
        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(cap);
        let mut meta_index = HashMap::with_capacity(cap);
        for i in 0..n_kv {
            let key = c.string(MAX_KEY_LEN, &|| format!("metadata key #{i}"))?;
            let raw = c.u32(&|| format!("metadata type of {key:?}"))?;
            let ty = ValueType::from_id(raw).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                ty: raw,
            })?;
            let value = c.value(ty, &key, 0)?;
            if meta_index.contains_key(&key) {
                return Err(GgufError::DuplicateKey(key));
            }
            meta_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }

        let alignment = match meta_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_i128().ok_or_else(|| GgufError::WrongType {
                    key: ALIGNMENT_KEY.into(),
                    expected: "an integer",
                    found: v.describe(),
                })?;
                if a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0 {
                    return Err(GgufError::BadAlignment(a.clamp(0, u64::MAX as i128) as u64));
                }
                a as u64
            }
        };

        // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
        if n_tensors.checked_mul(24).is_none_or(|b| b > c.left()) {
            return Err(GgufError::CountTooLarge {
                what: "tensor count".into(),
                count: n_tensors,
                left: c.left(),
            });
        }
        if n_tensors > MAX_TENSORS {
            return Err(GgufError::LimitExceeded {
                what: "tensor count".into(),
                value: n_tensors,
                limit: MAX_TENSORS,
            });
        }
        let cap = n_tensors.min(INITIAL_CAPACITY) as usize;
        let mut raw_infos = Vec::with_capacity(cap);
        for i in 0..n_tensors {
            let name = c.string(MAX_TENSOR_NAME_LEN, &|| format!("name of tensor #{i}"))?;
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
        // header_end <= len < 2^63 and alignment <= 2^30, so this cannot overflow.
        let data_offset = header_end.div_ceil(alignment) * alignment;

        let mut tensors = Vec::with_capacity(raw_infos.len());
        let mut tensor_index = HashMap::with_capacity(raw_infos.len());
        for (name, dims, ty_id, offset) in raw_infos {
            let t = tensor_info(name, dims, ty_id, offset, alignment, data_offset, len)?;
            if tensor_index.contains_key(&t.name) {
                return Err(GgufError::DuplicateTensor(t.name));
            }
            tensor_index.insert(t.name.clone(), tensors.len());
            tensors.push(t);
        }
        check_overlaps(&tensors)?;

        Ok(Gguf {
            bytes,
            version,
            alignment,
            data_offset,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            file: None,
        })
    }
}

/// Validates one raw tensor info and computes its sizes and file offset.
fn tensor_info(
    name: String,
    dims: Vec<u64>,
    ty_id: u32,
    offset: u64,
    alignment: u64,
    data_offset: u64,
    len: u64,
) -> Result<TensorInfo> {
    let Some(ty) = GgmlType::from_id(ty_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            id: ty_id,
        });
    };
    // ggml stores dims as int64: each must be non-negative as one, and so must the product.
    // Zero dims are counted as 1 here so that `n_rows` and friends never overflow even for an
    // empty tensor.
    let fits = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1)))
        .is_some_and(|n| n <= i64::MAX as u64);
    if !fits {
        return Err(GgufError::DimOverflow { tensor: name, dims });
    }
    let n_elements: u64 = dims.iter().product();
    let ne0 = dims.first().copied().unwrap_or(1);
    let block = ty.block_size();
    if !ne0.is_multiple_of(block as u64) {
        return Err(GgufError::RowNotBlockAligned {
            tensor: name,
            ty,
            ne0,
            block,
        });
    }
    // ne0 is a whole number of blocks, so n_elements is too.
    let Some(n_bytes) = ty.row_bytes(n_elements) else {
        return Err(GgufError::DimOverflow { tensor: name, dims });
    };
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedOffset {
            tensor: name,
            offset,
            alignment,
        });
    }
    let start = data_offset.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    let file_offset = match (start, end) {
        (Some(s), Some(e)) if e <= len => s,
        _ => {
            return Err(GgufError::DataOutOfBounds {
                tensor: name,
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                len,
            })
        }
    };
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        file_offset,
        n_elements,
        n_bytes,
    })
}

/// Sorts by start; each tensor must end before the next begins. Zero-sized tensors occupy no
/// bytes and cannot overlap anything.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        // Both ends were checked to lie inside the file, so the sum cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Overlap {
                a: a.name.clone(),
                b: b.name.clone(),
            });
        }
    }
    Ok(())
}
