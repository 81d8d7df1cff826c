//! Test-only block dequantizers, written straight from ggml's `dequantize_row_*` loops (not from
//! memwall's chunk abstraction), used as the oracle until kernels-ref's dequantizer lands.

use half::{bf16, f16};
use memwall::GgmlType;

fn h(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

const IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f32,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f32,
        )
    }
}

/// Dequantizes `data` (whole blocks of `ty`) into a new vector.
pub fn dequant(ty: GgmlType, data: &[u8]) -> Vec<f32> {
    let mut y = Vec::new();
    match ty {
        GgmlType::F32 => {
            for c in data.chunks_exact(4) {
                y.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        GgmlType::F16 => {
            for c in data.chunks_exact(2) {
                y.push(f16::from_le_bytes([c[0], c[1]]).to_f32());
            }
        }
        GgmlType::BF16 => {
            for c in data.chunks_exact(2) {
                y.push(bf16::from_le_bytes([c[0], c[1]]).to_f32());
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL => {
            let bs = ty.type_size();
            for b in data.chunks_exact(bs) {
                let d = h(b, 0);
                let (m, qs) = if ty == GgmlType::Q4_1 {
                    (h(b, 2), &b[4..])
                } else {
                    (0.0, &b[2..])
                };
                let mut out = [0f32; 32];
                for j in 0..16 {
                    let (x0, x1) = ((qs[j] & 0xF) as usize, (qs[j] >> 4) as usize);
                    match ty {
                        GgmlType::Q4_0 => {
                            out[j] = (x0 as f32 - 8.0) * d;
                            out[j + 16] = (x1 as f32 - 8.0) * d;
                        }
                        GgmlType::Q4_1 => {
                            out[j] = x0 as f32 * d + m;
                            out[j + 16] = x1 as f32 * d + m;
                        }
                        _ => {
                            out[j] = IQ4NL[x0] as f32 * d;
                            out[j + 16] = IQ4NL[x1] as f32 * d;
                        }
                    }
                }
                y.extend_from_slice(&out);
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let one = ty == GgmlType::Q5_1;
            for b in data.chunks_exact(ty.type_size()) {
                let d = h(b, 0);
                let m = if one { h(b, 2) } else { 0.0 };
                let o = if one { 4 } else { 2 };
                let qh = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
                let qs = &b[o + 4..];
                let mut out = [0f32; 32];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = ((qs[j] & 0x0F) as u32 | xh0) as f32;
                    let x1 = ((qs[j] >> 4) as u32 | xh1) as f32;
                    if one {
                        out[j] = x0 * d + m;
                        out[j + 16] = x1 * d + m;
                    } else {
                        out[j] = (x0 - 16.0) * d;
                        out[j + 16] = (x1 - 16.0) * d;
                    }
                }
                y.extend_from_slice(&out);
            }
        }
        GgmlType::Q8_0 => {
            for b in data.chunks_exact(34) {
                let d = h(b, 0);
                y.extend(b[2..].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let five = ty == GgmlType::Q5_K;
            for b in data.chunks_exact(ty.type_size()) {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let sc = &b[4..16];
                let (qh, mut ql) = if five {
                    (&b[16..48], &b[48..])
                } else {
                    (&b[0..0], &b[16..])
                };
                let (mut u1, mut u2) = (1u8, 2u8);
                let mut is = 0;
                for _j in (0..256).step_by(64) {
                    let (s1, m1) = scale_min_k4(is, sc);
                    let (s2, m2) = scale_min_k4(is + 1, sc);
                    for l in 0..32 {
                        let hb = if five && qh[l] & u1 != 0 { 16.0 } else { 0.0 };
                        y.push(d * s1 * ((ql[l] & 0xF) as f32 + hb) - dmin * m1);
                    }
                    for l in 0..32 {
                        let hb = if five && qh[l] & u2 != 0 { 16.0 } else { 0.0 };
                        y.push(d * s2 * ((ql[l] >> 4) as f32 + hb) - dmin * m2);
                    }
                    ql = &ql[32..];
                    is += 2;
                    u1 = u1.wrapping_shl(2);
                    u2 = u2.wrapping_shl(2);
                }
            }
        }
        GgmlType::Q6_K => {
            for b in data.chunks_exact(210) {
                let d = h(b, 208);
                let mut out = [0f32; 256];
                for n in 0..2 {
                    let ql = &b[64 * n..];
                    let qh = &b[128 + 32 * n..];
                    let sc = &b[192 + 8 * n..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let o = &mut out[128 * n..];
                        o[l] = d * (sc[is] as i8 as f32) * q1 as f32;
                        o[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
                        o[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
                        o[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
                    }
                }
                y.extend_from_slice(&out);
            }
        }
        GgmlType::Q2_K => {
            for b in data.chunks_exact(84) {
                let (d, dmin) = (h(b, 80), h(b, 82));
                let scales = &b[0..16];
                let mut is = 0;
                for n in 0..2 {
                    let q = &b[16 + 32 * n..];
                    for shift in [0, 2, 4, 6] {
                        for half in 0..2 {
                            let sc = scales[is];
                            is += 1;
                            let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                            for l in 0..16 {
                                y.push(dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml);
                            }
                        }
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            for b in data.chunks_exact(110) {
                let d = h(b, 108);
                let hm = &b[0..32];
                let s = &b[96..108];
                // ggml's kmask packing, spelled out with u32 words.
                let mut aux = [
                    u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                    u32::from_le_bytes([s[4], s[5], s[6], s[7]]),
                    u32::from_le_bytes([s[8], s[9], s[10], s[11]]),
                    0,
                ];
                let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
                let tmp = aux[2];
                aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
                aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
                aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
                aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
                let scales: Vec<i8> = aux
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .map(|v| v as i8)
                    .collect();
                let mut m = 1u8;
                let mut is = 0;
                for n in 0..2 {
                    let q = &b[32 + 32 * n..];
                    for shift in [0, 2, 4, 6] {
                        for half in 0..2 {
                            let dl = d * (scales[is] as f32 - 32.0);
                            is += 1;
                            for l in 16 * half..16 * half + 16 {
                                let hv = if hm[l] & m != 0 { 0 } else { 4 };
                                y.push(dl * (((q[l] >> shift) & 3) as i32 - hv) as f32);
                            }
                        }
                        m = m.wrapping_shl(1);
                    }
                }
            }
        }
        GgmlType::TQ2_0 => {
            for b in data.chunks_exact(66) {
                let d = h(b, 64);
                for j in (0..64).step_by(32) {
                    for l in 0..4 {
                        for m in 0..32 {
                            let q = ((b[j + m] >> (2 * l)) & 3) as i32;
                            y.push((q - 1) as f32 * d);
                        }
                    }
                }
            }
        }
        _ => panic!("test dequant: {ty} not covered"),
    }
    y
}
