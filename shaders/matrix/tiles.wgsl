// Matrix layout for prefill over the f32 body: workgroup-memory tiles (twin of kernels-ref's
// ops::matmul), dequantization fused in, no reduction: every output is summed by one
// invocation. Composed after a quant/*.wgsl fragment, load_x4.wgsl and f32.wgsl (P, x, fn
// store_y; P.row_groups is the number of row tiles, ceil(rows / TM)).
//
// One workgroup computes a TM x TN tile of y (TM weight rows x TN tokens). For each block of
// QK = 32 columns it stages the TM rows' dequantized block and the TN tokens' 32 inputs in
// workgroup memory, so each weight is decoded once per tile (not once per token) and each
// input read once per tile. Each invocation then accumulates a 4 x 4 micro-tile: rows
// tr + i * TR and tokens tt + j * TT (i, j < 4) with TR = TM / 4, TT = TN / 4; the host picks
// TM, TN with TR * TT <= WG (see matmul_tile in src/gpu/kernels/matmul.rs). Workgroup memory:
// (TM + TN) * 32 * 4 bytes.
//
// Tiles are numbered row tile first: tile = wid.x + wid.y * groups_x (2-D dispatch when there
// are more than the per-dimension limit), row tile = tile % row_groups, token tile = tile /
// row_groups. Surplus workgroups of the last dispatch line return at once (uniformly).

// Invocations per workgroup: at least (TM / 4) * (TN / 4) (any extra ones only stage).
override WG: u32 = 64u;
// Weight rows per tile (a multiple of 4).
override TM: u32 = 64u;
// Tokens per tile (a multiple of 4).
override TN: u32 = 16u;

// [TM, 8] vec4: the current block of the tile's weight rows, dequantized.
var<workgroup> w_tile: array<vec4<f32>, TM * 8u>;
// [TN, 8] vec4: the current 32 inputs of the tile's tokens.
var<workgroup> x_tile: array<vec4<f32>, TN * 8u>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tile = wid.x + wid.y * P.groups_x;
    let token_tiles = (P.n_tokens + TN - 1u) / TN;
    if (tile >= P.row_groups * token_tiles) {
        return;
    }
    let row0 = (tile % P.row_groups) * TM;
    let tok0 = (tile / P.row_groups) * TN;
    let tr_n = TM / 4u;
    let tt_n = TN / 4u;
    // This invocation's micro-tile (invocations past TR * TT, if any, only help staging).
    let tr = lid % tr_n;
    let tt = lid / tr_n;

    // acc[i][j]: row tr + i * TR, token tt + j * TT. Kept as four vec4 (not an indexed
    // array) so that compilers keep them in registers.
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    for (var b = 0u; b < P.blocks_per_row; b++) {
        // Stage: one dq_block per weight row of the tile; rows past the matrix read as 0.
        for (var r = lid; r < TM; r += WG) {
            let row = row0 + r;
            var w: array<vec4<f32>, 8>;
            if (row < P.rows) {
                w = dq_block(row, b, P.cols);
            }
            for (var k = 0u; k < 8u; k++) {
                w_tile[r * 8u + k] = w[k];
            }
        }
        let c0 = b * QK;
        for (var i = lid; i < TN * 8u; i += WG) {
            let t = tok0 + i / 8u;
            var v = vec4<f32>(0.0);
            if (t < P.n_tokens) {
                v = load_x4(t * P.cols, c0 + 4u * (i % 8u));
            }
            x_tile[i] = v;
        }
        workgroupBarrier();

        if (tt < tt_n) {
            for (var k = 0u; k < 8u; k++) {
                // Columns = the four tokens' 4 inputs; a * X = the four dot products.
                let xm = mat4x4<f32>(
                    x_tile[tt * 8u + k],
                    x_tile[(tt + tt_n) * 8u + k],
                    x_tile[(tt + 2u * tt_n) * 8u + k],
                    x_tile[(tt + 3u * tt_n) * 8u + k],
                );
                acc0 += w_tile[tr * 8u + k] * xm;
                acc1 += w_tile[(tr + tr_n) * 8u + k] * xm;
                acc2 += w_tile[(tr + 2u * tr_n) * 8u + k] * xm;
                acc3 += w_tile[(tr + 3u * tr_n) * 8u + k] * xm;
            }
        }
        // Everyone has read the tiles before the next block overwrites them.
        workgroupBarrier();
    }

    if (tt < tt_n) {
        let acc = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
        for (var i = 0u; i < 4u; i++) {
            let row = row0 + tr + i * tr_n;
            for (var j = 0u; j < 4u; j++) {
                let t = tok0 + tt + j * tt_n;
                if (row < P.rows && t < P.n_tokens) {
                    store_y(t, row, acc[i][j]);
                }
            }
        }
    }
}
