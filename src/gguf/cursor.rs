//! A bounds-checked little-endian cursor over the file image, and the metadata value decoder.
//!
//! Every read checks the bytes left first; every allocation is bounded twice: by what is left in
//! the file (a count that cannot fit is refused before anything is reserved) and by a budget on
//! the decoded metadata, because one byte of file can become a 32-byte `Value`.

use super::{GgufError, Result, Value, ValueType, MAX_ARRAY_DEPTH, MAX_METADATA_BYTES};

pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    /// Bytes of decoded metadata still allowed (see `MAX_METADATA_BYTES`).
    budget: u64,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            budget: MAX_METADATA_BYTES,
        }
    }

    pub(super) fn left(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    pub(super) fn take(&mut self, n: u64, section: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n));
        match end.and_then(|end| self.buf.get(self.pos..end).map(|s| (end, s))) {
            Some((end, s)) => {
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                section: section(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            }),
        }
    }

    pub(super) fn arr<const N: usize>(&mut self, section: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, section)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, section: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(section)?))
    }

    pub(super) fn u64(&mut self, section: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(section)?))
    }

    /// Takes `n` bytes from the decoded-metadata budget.
    pub(super) fn charge(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<()> {
        match self.budget.checked_sub(n) {
            Some(b) => {
                self.budget = b;
                Ok(())
            }
            None => Err(GgufError::LimitExceeded {
                what: what(),
                value: n,
                limit: MAX_METADATA_BYTES,
            }),
        }
    }

    /// A length-prefixed UTF-8 string of at most `max_len` bytes.
    pub(super) fn string(&mut self, max_len: u64, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(GgufError::LengthTooLarge {
                what: what(),
                len,
                left: self.left(),
            });
        }
        if len > max_len {
            return Err(GgufError::LimitExceeded {
                what: format!("{} length", what()),
                value: len,
                limit: max_len,
            });
        }
        self.charge(len, what)?;
        let bytes = self.take(len, what)?;
        // Validate on the borrowed bytes so an invalid string is never copied.
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    /// One value of type `ty`; `depth` counts the arrays it is nested in.
    pub(super) fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let sec = || format!("metadata value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>(&sec)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.arr(&sec)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr(&sec)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr(&sec)?)),
            ValueType::U32 => Value::U32(self.u32(&sec)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr(&sec)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr(&sec)?)),
            // GGUF writes bools as one byte; any non-zero byte reads as true, as in ggml.
            ValueType::Bool => Value::Bool(self.arr::<1>(&sec)?[0] != 0),
            ValueType::String => Value::String(self.string(u64::MAX, &sec)?),
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
                let elem = ValueType::from_id(raw).ok_or_else(|| GgufError::UnknownValueType {
                    key: key.to_string(),
                    ty: raw,
                })?;
                let count = self.u64(&sec)?;
                // Bound the count by the bytes left, then by the budget, before reserving.
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
                let what = || format!("decoded size of metadata array {key:?}");
                self.charge(
                    count.saturating_mul(std::mem::size_of::<Value>() as u64),
                    &what,
                )?;
                // count * min_size <= left <= buf.len(), so it fits in usize.
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}
