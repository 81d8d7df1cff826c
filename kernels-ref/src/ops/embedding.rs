//! Token embedding lookup (one row of a quantized table).

use crate::error::{bytes_for, check_len, RefError};
use crate::quant::dequantize;
use crate::GgmlType;

/// Row `row` of an embedding table whose rows have `n_embd` elements in format `ty`.
///
/// `table`: `[n_rows, n_embd]` in format `ty` (its length must be a whole number of rows);
/// `out`: `[n_embd]`. A row past the end is `RowOutOfRange`.
pub fn embedding(
    ty: GgmlType,
    table: &[u8],
    n_embd: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), RefError> {
    if !ty.is_supported() {
        return Err(RefError::Unsupported(ty));
    }
    check_len("embedding", "out", n_embd, out.len())?;
    let row_bytes = bytes_for(ty, n_embd, table.len())?;
    if row_bytes == 0 || !table.len().is_multiple_of(row_bytes) {
        return Err(RefError::BadLength {
            ty,
            n_elements: n_embd,
            n_bytes: table.len(),
        });
    }
    let n_rows = table.len() / row_bytes;
    if row >= n_rows {
        return Err(RefError::RowOutOfRange { row, n_rows });
    }
    dequantize(ty, &table[row * row_bytes..(row + 1) * row_bytes], out)
}
