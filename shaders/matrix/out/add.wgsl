// Output of the 8-bit matrix layouts that accumulates: y[t][row_offset + row] += W[row] · x[t]
// (the residual add folded into the projection that feeds it: the same f32 addition add.wgsl
// does after a plain store, without the pass over a temporary).

@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn store_y(t: u32, row: u32, v: f32) {
    let i = t * P.y_stride + P.row_offset + row;
    y[i] = y[i] + v;
}
