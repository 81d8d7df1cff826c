use crate::error::{Error, Result};
use kernels_ref::GgmlType;
#[derive(Clone, Copy)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}
impl<'a> WeightView<'a> {
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        Ok(WeightView {
            ty,
            data,
            rows,
            cols,
        })
    }
}
#[derive(Default)]
pub struct MatmulScratch {
    _p: (),
}
pub fn matmul(
    w: &WeightView,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    _s: &mut MatmulScratch,
) -> Result<()> {
    kernels_ref::matmul(w.ty, w.data, w.rows, w.cols, x, n, y)
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}
