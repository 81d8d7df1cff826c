// Matrix layout for CPU-like adapters (lavapipe, llvmpipe, SwiftShader) and any device where
// workgroup barriers are expensive: one invocation per output row and token, no reduction, no
// barrier; each invocation walks its row's blocks in order, so a row's weights stream
// contiguously through one core's cache. Composed after a body (the f32 one; the 8-bit body
// has the register tiles of tiles_q8.wgsl instead).
// group = wid.x + wid.y * groups_x; t = group / row_groups; row = (group % row_groups) * WG +
// lid.

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    let row = (group % P.row_groups) * WG + lid;
    if (t >= P.n_tokens || row >= P.rows) {
        return;
    }
    store_y(t, row, row_partial(t, row, 0u, 1u));
}
