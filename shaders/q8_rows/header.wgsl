// Shared head of the row-layout integer kernels for CPU-like adapters (matvec_q8_rows.wgsl,
// matmul_q8_rows*.wgsl): the workgroup size and the token cap, so both take the same grid as
// src/gpu/kernels/q8act.rs plans it. Composed after q8_params.wgsl (the parameters and bindings of
// every integer kernel) and before the kernel.

override WG: u32 = 64u;
// Tokens per launch (the host splits larger batches).
const MAX_TOKENS: u32 = 64u;
