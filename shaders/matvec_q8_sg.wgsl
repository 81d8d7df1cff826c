// Batched decode matvec over 8-bit activations for adapters with subgroups: the contract of
// matvec_q8.wgsl (bindings, parameters, the grid of ROWS rows per workgroup and token, the
// chunk arithmetic of src/cpu/scalar.rs `dot_q_row`), with each row summed by one subgroup:
// its lanes stride over the row's chunks and subgroupAdd totals them, so no workgroup memory
// or barrier sits between a row's loads and its result, and a workgroup has as many rows in
// flight as it has subgroups.
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment with an integer path (bindings
// 0..1 for W, fn dq_chunk), and before a matvec_q8_out/*.wgsl fragment (fn store_y).
// The host sets ROWS to WG / the adapter's smallest subgroup size (src/gpu/kernels.rs
// `matvec_q8_rows_per_group`); subgroups claim row slots from a counter rather than assume
// how invocations map to subgroups, and with larger subgroups than that each takes several
// rows in turn.

override WG: u32 = 64u;

struct MatvecQ8Params {
    rows: u32,
    cols: u32,
    // cols / 32: chunks per row
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    n_tokens: u32,
    // row length of y (>= row_offset + rows)
    y_stride: u32,
    // first row of y this matrix writes (a matrix split by rows across bindings)
    row_offset: u32,
    // ceil(rows / ROWS)
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (matvec_q8_out/split*.wgsl): rows below split1 go to y, below split2 to
    // y1, the rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    pad0: u32,
    // row_stride of the row layouts (q8_rows/header.wgsl), unused here
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
}

// [n_tokens, cols / 32, 2] vec4 of words: a chunk's 32 int8 codes (quantize_act.wgsl), four
// per word, byte 0 first.
@group(0) @binding(2) var<storage, read> qx: array<vec4<u32>>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

// Rows per workgroup.
override ROWS: u32 = 8u;

// Row slots handed out to this workgroup's subgroups.
var<workgroup> n_slots: atomic<u32>;

// Lane `lane` of a subgroup of `sg`: its share of row `row`'s dot product with token t's
// chunks, which start at chunk index c0 of qx / qd.
fn lane_partial(row: u32, c0: u32, lane: u32, sg: u32) -> f32 {
    var acc = 0.0;
    for (var b = lane; b < P.blocks_per_row; b += sg) {
        let ch = dq_chunk(P.w_row0 + row, b, P.cols);
        let ci = c0 + b;
        let x0 = qx[ci * 2u];
        let x1 = qx[ci * 2u + 1u];
        let s0 = dot_i8x4(ch.u[0], x0.x) + dot_i8x4(ch.u[1], x0.y) + dot_i8x4(ch.u[2], x0.z)
            + dot_i8x4(ch.u[3], x0.w);
        let s1 = dot_i8x4(ch.u[4], x1.x) + dot_i8x4(ch.u[5], x1.y) + dot_i8x4(ch.u[6], x1.z)
            + dot_i8x4(ch.u[7], x1.w);
        let xd = qd[ci];
        // The CPU's order: (dw * d_x) * isum, then + c0 * xs0, then + c1 * xs1.
        acc += ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg: u32,
) {
    if (lid == 0u) {
        atomicStore(&n_slots, 0u);
    }
    workgroupBarrier();
    var claimed = 0u;
    if (lane == 0u) {
        claimed = atomicAdd(&n_slots, 1u);
    }
    // Every lane of a subgroup takes its lane 0's slot: rows are uniform per subgroup.
    let slot = subgroupBroadcast(claimed, 0u);
    let n_subgroups = (WG + sg - 1u) / sg;
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    // Surplus workgroups of a 2-D dispatch: the whole workgroup leaves together.
    if (t >= P.n_tokens) {
        return;
    }
    let row0 = (group % P.row_groups) * ROWS;
    let c0 = t * P.blocks_per_row;
    for (var r = slot; r < ROWS; r += n_subgroups) {
        let row = row0 + r;
        if (row >= P.rows) {
            break;
        }
        let total = subgroupAdd(lane_partial(row, c0, lane, sg));
        if (lane == 0u) {
            store_y(t, row, total);
        }
    }
}
