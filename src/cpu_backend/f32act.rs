//! The CPU backend's validation matmul with f32 activations (`CpuBackend::set_f32_activations`).

use crate::error::{Error, Result};

use rayon::prelude::*;

/// out: [n, rows] = x: [n, cols] · Wᵀ with f32 activations: each weight row is dequantized
/// once (kernels-ref, exact) and dotted with every token in f32. Slower than the integer
/// kernels; used for validation (`f32_activations`).
pub(super) fn matmul_f32_act(
    ty: kernels_ref::GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let rb = ty
        .row_bytes(cols as u64)
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b * rows == data.len())
        .ok_or_else(|| Error::InvalidArgument(format!("[{rows}, {cols}] {}", ty.name())))?;
    // [rows, n], transposed into out below.
    let per_row: Vec<Result<Vec<f32>>> = data
        .par_chunks(rb)
        .map(|row| {
            let mut w = vec![0f32; cols];
            kernels_ref::dequantize(ty, row, &mut w)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            Ok(x.chunks(cols)
                .take(n)
                .map(|xt| w.iter().zip(xt).map(|(a, b)| a * b).sum())
                .collect())
        })
        .collect();
    for (r, v) in per_row.into_iter().enumerate() {
        for (t, y) in v?.into_iter().enumerate() {
            out[t * rows + r] = y;
        }
    }
    Ok(())
}
