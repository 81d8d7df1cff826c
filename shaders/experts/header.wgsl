// Shared head of the routed experts' kernels (matvec_experts.wgsl over f32 inputs,
// experts_q8.wgsl over 8-bit ones): the parameters and the expert ids, as src/gpu/kernels/moe.rs plans
// them. Composed after the weight format's fragments and before the kernel, which declares
// its inputs and its output y.
// Pair p of a routing (ids from moe_route.wgsl) computes y[p] = W_e x[p / x_div] with W_e the
// rows of expert e = ids[p] in a stack of every expert's matrix ([n_expert * rows, cols],
// expert e at rows e * rows..). A stack split across bindings by whole experts is one launch
// per part: a pair whose expert is outside the part's e_lo..e_hi is left to the other
// launches.

override WG: u32 = 64u;

struct MatvecExpertsParams {
    // rows of one expert's matrix
    rows: u32,
    cols: u32,
    // ceil(cols / QK)
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // (token, slot) pairs: n_tokens * k
    n_pairs: u32,
    // pairs per x row: k when every slot of a token reads the token's input (gate, up), 1
    // when each pair has its own (down)
    x_div: u32,
    // ceil(rows / WG)
    row_groups: u32,
    // the experts this launch's weight binding holds: e_lo..e_hi
    e_lo: u32,
    e_hi: u32,
    // experts_q8.wgsl: pairs scanned by one workgroup, and the number of such chunks
    chunk: u32,
    n_chunks: u32,
    pad0: u32,
}

@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<uniform> P: MatvecExpertsParams;
