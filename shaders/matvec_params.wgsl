// Parameters and bindings of the f32-activation matvecs (matvec.wgsl, matvec_rows.wgsl), one
// declaration for both so they keep one contract (src/gpu/registry/params.rs `MatvecParams`).

struct MatvecParams {
    rows: u32,
    cols: u32,
    // ceil(cols / QK)
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    n_tokens: u32,
    // row length of y (>= row_offset + rows)
    y_stride: u32,
    // first row of y this matrix writes (a matrix split by rows across bindings)
    row_offset: u32,
    // ceil(rows / rows per workgroup): workgroups per token
    row_groups: u32,
}

// [n_tokens, cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [n_tokens, y_stride]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> P: MatvecParams;
