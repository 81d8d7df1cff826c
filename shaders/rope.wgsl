// Rotary position embedding in place (twin of kernels-ref's ops::rope), for n_tokens tokens at
// positions pos0, pos0 + 1, ... Standalone module (no reduction fragment).
// One invocation per rotated pair (token, head, i); 2-D dispatch as in matrix/reduce.wgsl.
// One launch rotates the queries and the keys (one launch fewer per layer): the
// pairs of x come first, then those of x2 ([n_tokens, n_heads2, head_dim], same positions);
// n_heads2 = 0 rotates x alone.

override WG: u32 = 64u;

struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    // rotated dims per head (even, <= head_dim)
    n_rot: u32,
    // position of the first token
    pos0: u32,
    // 0: pairs (2i, 2i + 1) (ggml "normal"); otherwise pairs (i, i + n_rot / 2) (NeoX)
    neox: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // heads of x2 (0: none)
    n_heads2: u32,
    // multiplies cos and sin (LongRoPE's attention factor; 1 for most models)
    mscale: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// [n_tokens, n_heads, head_dim]
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
// [n_rot / 2] freq_scale * freq_base^(-2i / n_rot), computed by the host in f64: a GPU pow()
// may be tens of ulp off, and that relative error is multiplied by the position.
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<uniform> P: RopeParams;
// [n_tokens, n_heads2, head_dim]: the keys when one launch rotates both
@group(0) @binding(3) var<storage, read_write> x2: array<f32>;

// 2*pi split so that k * TAU_HI is exact for k < 2^16 (TAU_HI has 8 significant bits), which
// keeps the range reduction's error independent of the angle (Cody-Waite).
const TAU_HI: f32 = 6.28125;
const TAU_LO: f32 = 0.0019353071795864769;
const INV_TAU: f32 = 0.15915494309189535;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let half = P.n_rot / 2u;
    var g = (wid.x + wid.y * P.groups_x) * WG + lid;
    let first = P.n_tokens * P.n_heads * half;
    let second = g >= first;
    var n_heads = P.n_heads;
    if (second) {
        g -= first;
        n_heads = P.n_heads2;
    }
    if (half == 0u || g >= P.n_tokens * n_heads * half) {
        return;
    }
    let i = g % half;
    // token * n_heads + head
    let th = g / half;
    let tok = th / n_heads;
    let base = th * P.head_dim;
    var ia = base + 2u * i;
    var ib = ia + 1u;
    if (P.neox != 0u) {
        ia = base + i;
        ib = base + i + half;
    }
    let theta = f32(P.pos0 + tok) * freqs[i];
    // Reduce to about [-pi, pi]: sin/cos precision is only specified on that range.
    let k = round(theta * INV_TAU);
    let r = (theta - k * TAU_HI) - k * TAU_LO;
    let s = sin(r) * P.mscale;
    let c = cos(r) * P.mscale;
    if (second) {
        let a = x2[ia];
        let b = x2[ib];
        x2[ia] = a * c - b * s;
        x2[ib] = a * s + b * c;
    } else {
        let a = x[ia];
        let b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = a * s + b * c;
    }
}
