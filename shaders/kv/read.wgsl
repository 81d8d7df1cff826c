// KV cache decoding for the attention kernels, fused into their loops (no dequantized copy).
// A cache is one layer's keys or values in the GGUF layout of its type (src/kv_type.rs), the
// same bytes as the CPU's cache, read as little-endian u32 words (portable: no f16 or byte
// types needed): K_TYPE / V_TYPE 0 f32, 1 f16, 2 q8_0 (34-byte blocks: f16 scale, 32 int8),
// 3 q4_0 (18-byte blocks: f16 scale, 16 bytes of nibbles: value i < 16 is the low nibble of
// byte i, value i + 16 its high nibble). Blocks run along head_dim (a multiple of 32 for the
// block types), so a block never straddles heads or rows; a block starts on an even byte.
// attention/qkv.wgsl declares `k_cache` and `v_cache` (array<u32>).

// Set per pipeline (src/gpu/kernels/mod.rs); the compiler folds the switch below.
override K_TYPE: u32 = 0u;
override V_TYPE: u32 = 0u;

fn kv_word(is_v: bool, w: u32) -> u32 {
    if (is_v) {
        return v_cache[w];
    }
    return k_cache[w];
}

// The four bytes at even byte offset b, little-endian.
fn kv_bytes4(is_v: bool, b: u32) -> u32 {
    let lo = kv_word(is_v, b >> 2u);
    if ((b & 2u) == 0u) {
        return lo;
    }
    return (lo >> 16u) | (kv_word(is_v, (b >> 2u) + 1u) << 16u);
}

// The f16 at even byte offset b.
fn kv_half(is_v: bool, b: u32) -> f32 {
    return unpack2x16float(kv_word(is_v, b >> 2u) >> ((b & 2u) * 8u)).x;
}

// Values e..e + 3 (e a multiple of 4) of the cache as a flat [n_ctx * n_head_kv * head_dim].
fn kv_vec4(is_v: bool, e: u32) -> vec4<f32> {
    switch (select(K_TYPE, V_TYPE, is_v)) {
        case 0u: {
            return bitcast<vec4<f32>>(vec4<u32>(
                kv_word(is_v, e),
                kv_word(is_v, e + 1u),
                kv_word(is_v, e + 2u),
                kv_word(is_v, e + 3u),
            ));
        }
        case 1u: {
            let w = e >> 1u;
            return vec4<f32>(unpack2x16float(kv_word(is_v, w)), unpack2x16float(kv_word(is_v, w + 1u)));
        }
        case 2u: {
            let base = (e >> 5u) * 34u;
            let d = kv_half(is_v, base);
            let q = vec4<i32>(bitcast<i32>(kv_bytes4(is_v, base + 2u + (e & 31u))));
            // Each byte to the top, then an arithmetic shift down sign-extends it.
            return d * vec4<f32>((q << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
        }
        default: {
            let base = (e >> 5u) * 18u;
            let d = kv_half(is_v, base);
            let j = e & 31u;
            let qs = vec4<u32>(kv_bytes4(is_v, base + 2u + (j & 15u)));
            let sh = select(0u, 4u, j >= 16u);
            let n = (qs >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(15u);
            return d * (vec4<f32>(n) - 8.0);
        }
    }
}
