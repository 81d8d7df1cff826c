//! Matrix-vector product with a quantized weight matrix (twin of the GPU's matrix layouts over `shaders/matrix/f32.wgsl`).

use crate::error::{bytes_for, check_len, RefError};
use crate::quant::dequantize;
use crate::GgmlType;

/// Dot product accumulated in f64. `a` and `b` are zipped (the shorter one sets the length).
pub fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Bytes per row and total bytes of a `[rows, cols]` matrix of `ty`, checked against `w`.
pub(super) fn check_matrix(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
) -> Result<usize, RefError> {
    let bad = RefError::BadLength {
        ty,
        n_elements: rows.saturating_mul(cols),
        n_bytes: w.len(),
    };
    if !ty.is_supported() {
        return Err(RefError::Unsupported(ty));
    }
    let row_bytes = bytes_for(ty, cols, w.len()).map_err(|_| bad.clone())?;
    let total = row_bytes.checked_mul(rows).ok_or(bad.clone())?;
    if total != w.len() {
        return Err(bad);
    }
    Ok(row_bytes)
}

/// `y[r] = sum_c W[r][c] * x[c]`.
///
/// `w`: `rows` rows of `cols` elements in format `ty` (ggml layout: row-major, ne0 = cols),
/// so `w.len() == rows * ty.row_bytes(cols)`; `x`: `[cols]`; `y`: `[rows]`. Each row is
/// dequantized to f32 and the dot product is accumulated in f64.
pub fn matvec(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), RefError> {
    let row_bytes = check_matrix(ty, w, rows, cols)?;
    check_len("matvec", "x", cols, x.len())?;
    check_len("matvec", "y", rows, y.len())?;
    let mut row = vec![0.0f32; cols]; // [cols]
    if row_bytes == 0 {
        // cols == 0: every dot product is empty.
        y.fill(0.0);
        return Ok(());
    }
    for (wr, yr) in w.chunks_exact(row_bytes).zip(y.iter_mut()) {
        dequantize(ty, wr, &mut row)?;
        *yr = dot_f64(&row, x) as f32;
    }
    Ok(())
}
