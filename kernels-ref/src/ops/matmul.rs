//! Matrix-matrix product for prompt processing (twin of `shaders/matrix/tiles.wgsl`).

use super::matvec::{check_matrix, dot_f64};
use crate::error::{check_len, RefError};
use crate::quant::dequantize;
use crate::GgmlType;

/// `y[t][r] = sum_c W[r][c] * x[t][c]` for each of `n` input rows.
///
/// `w`: as in [`super::matvec`] (`[rows, cols]` in format `ty`); `x`: `[n, cols]`;
/// `y`: `[n, rows]`. f64 accumulation.
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), RefError> {
    let row_bytes = check_matrix(ty, w, rows, cols)?;
    let x_len = n.checked_mul(cols).ok_or(RefError::ShapeMismatch {
        op: "matmul",
        what: "x",
        expected: usize::MAX,
        got: x.len(),
    })?;
    check_len("matmul", "x", x_len, x.len())?;
    let y_len = n.checked_mul(rows).ok_or(RefError::ShapeMismatch {
        op: "matmul",
        what: "y",
        expected: usize::MAX,
        got: y.len(),
    })?;
    check_len("matmul", "y", y_len, y.len())?;
    if row_bytes == 0 {
        // cols == 0: every dot product is empty.
        y.fill(0.0);
        return Ok(());
    }
    // One weight row at a time, so the oracle never holds the whole matrix in f32.
    let mut wr = vec![0.0f32; cols]; // [cols]
    for (r, wbytes) in w.chunks_exact(row_bytes).enumerate() {
        dequantize(ty, wbytes, &mut wr)?;
        for (t, xt) in x.chunks_exact(cols).enumerate() {
            y[t * rows + r] = dot_f64(&wr, xt) as f32;
        }
    }
    Ok(())
}
