//! The one error type of kernels-ref.
//!
//! Reference kernels are called with lengths that come from files (tensor shapes, byte counts),
//! so a length that does not add up is an error value, never a panic.

use crate::GgmlType;

/// Why a reference kernel refused its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefError {
    /// kernels-ref cannot dequantize (or quantize) this type.
    Unsupported(GgmlType),
    /// `n_bytes` bytes cannot hold exactly `n_elements` elements of type `ty` (wrong byte
    /// count, an element count that is not a whole number of blocks, or one that overflows).
    BadLength {
        ty: GgmlType,
        n_elements: usize,
        n_bytes: usize,
    },
    /// `n_elements` values to quantize are not a whole number of `ty` blocks.
    PartialBlock { ty: GgmlType, n_elements: usize },
    /// A float buffer of an op has the wrong length for the shape it was given.
    ShapeMismatch {
        op: &'static str,
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// An embedding row past the end of the table.
    RowOutOfRange { row: usize, n_rows: usize },
}

impl std::fmt::Display for RefError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefError::Unsupported(ty) => write!(f, "kernels-ref does not support type {ty}"),
            RefError::BadLength {
                ty,
                n_elements,
                n_bytes,
            } => write!(
                f,
                "{n_bytes} bytes cannot hold {n_elements} elements of type {ty} \
                 (block size {}, {} bytes per block)",
                ty.block_size(),
                ty.type_size()
            ),
            RefError::PartialBlock { ty, n_elements } => write!(
                f,
                "{n_elements} elements are not a whole number of {ty} blocks of {}",
                ty.block_size()
            ),
            RefError::ShapeMismatch {
                op,
                what,
                expected,
                got,
            } => write!(f, "{op}: {what} has {got} elements, expected {expected}"),
            RefError::RowOutOfRange { row, n_rows } => {
                write!(f, "row {row} is out of range for a table of {n_rows} rows")
            }
        }
    }
}

impl std::error::Error for RefError {}

/// Bytes that `n` elements of `ty` take, or `BadLength` (reporting `n_bytes`, the length the
/// caller has) when `n` is not a whole number of blocks or the count overflows `usize`.
pub(crate) fn bytes_for(ty: GgmlType, n: usize, n_bytes: usize) -> Result<usize, RefError> {
    let bad = RefError::BadLength {
        ty,
        n_elements: n,
        n_bytes,
    };
    let n64 = u64::try_from(n).map_err(|_| bad.clone())?;
    ty.row_bytes(n64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(bad)
}

/// Checks that `data` holds exactly `n` elements of `ty`.
pub(crate) fn check_bytes(ty: GgmlType, n: usize, data: &[u8]) -> Result<(), RefError> {
    let need = bytes_for(ty, n, data.len())?;
    if need != data.len() {
        return Err(RefError::BadLength {
            ty,
            n_elements: n,
            n_bytes: data.len(),
        });
    }
    Ok(())
}

/// Checks that a float buffer has the length its shape implies.
pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), RefError> {
    if expected != got {
        return Err(RefError::ShapeMismatch {
            op,
            what,
            expected,
            got,
        });
    }
    Ok(())
}
