// Four f32 activations at a time for the kernels that take them unquantized (the f32 matrix
// body matrix/f32.wgsl, experts/header.wgsl). The kernel declares `x: array<f32>` and a uniform
// `P` with the row length `P.cols` (WGSL resolves module-scope names in any order).

// x[xo + c..xo + c + 4], with columns >= cols read as 0 (a partial last block of an F16/F32
// row).
fn load_x4(xo: u32, c: u32) -> vec4<f32> {
    if (c + 3u < P.cols) {
        return vec4<f32>(x[xo + c], x[xo + c + 1u], x[xo + c + 2u], x[xo + c + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (c + j < P.cols) {
            v[j] = x[xo + c + j];
        }
    }
    return v;
}
