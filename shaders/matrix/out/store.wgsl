// Output of the 8-bit matrix layouts: y[t][row_offset + row] = W[row] · x[t] into
// y: [n_tokens, y_stride].

@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn store_y(t: u32, row: u32, v: f32) {
    y[t * P.y_stride + P.row_offset + row] = v;
}
