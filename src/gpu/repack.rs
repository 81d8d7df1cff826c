//! Repacking GGUF weight matrices into the GPU layout the `shaders/quant/*.wgsl` fragments read.
//!
//! GGUF blocks are not 4-byte aligned (Q4_0 = 18 bytes, Q4_1 = 20, Q8_0 = 34, Q6_K = 210), and WGSL storage
//! buffers are read in `u32` words, so at upload each block is split: its code bytes become
//! whole little-endian words in one array (`quants`, WGSL binding 0) and its f16 scale(s) go to
//! a second array (`scales`, binding 1). Shapes, for a `[rows, cols]` matrix with
//! `nb = rows * cols / 32` blocks in row-major order (block g = row * cols/32 + blk):
//!
//! | format | `quants` (u32 words)               | `scales` (u32 words)                         |
//! |--------|------------------------------------|----------------------------------------------|
//! | Q4_0   | `[nb, 4]`: 16 nibble-code bytes     | `[ceil(nb / 2)]`: f16 d of block g in half g&1 of word g/2 |
//! | Q4_1   | `[nb, 4]`: 16 nibble-code bytes     | `[nb]`: (d, m) f16 pair, d in the low half    |
//! | Q8_0   | `[nb, 8]`: 32 signed code bytes     | `[ceil(nb / 2)]`: as Q4_0                      |
//! | Q4_K   | `[ns, 32]`: 128 nibble-code bytes  | `[ns, 4]`: (d, dmin) f16 pair (d low), then the 12 packed 6-bit scale/min bytes |
//! | Q6_K   | `[ns, 48]`: ql (128 bytes), qh (64) | `[ceil(ns / 2), 9]`: per pair of super-blocks, the 16 i8 scales of each (4 + 4 words), then their f16 d's (even one low) |
//! | F16    | `[rows, ceil(cols / 2)]`: f16 pairs, odd rows padded with a zero half | empty |
//! | F32    | `[rows, cols]`: f32 bit patterns    | empty                                         |
//!
//! For the K-quants `ns = rows * cols / 256` super-blocks (super-block g = row * cols/256 + s).
//! Q4_K's 144-byte block happens to be word-aligned, but its scales still go apart, so every
//! format reads codes from binding 0 and scales from binding 1. Q6_K pairs its super-blocks so
//! the two f16 d's share a word: 18 bytes of scales per super-block, as in GGUF (an odd last
//! pair is padded with 4 zero words of scales and a zero d).

use crate::error::{Error, Result};
use crate::gpu::registry::WeightFormat;

/// A weight matrix in the GPU layout (see the module docs for the buffer shapes).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    pub ty: WeightFormat,
    pub rows: usize,
    /// Row length (ggml ne0).
    pub cols: usize,
    pub quants: Vec<u32>,
    pub scales: Vec<u32>,
}

fn word(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w[..b.len().min(4)].copy_from_slice(&b[..b.len().min(4)]);
    u32::from_le_bytes(w)
}

/// Packs f16 values (as raw bits) two per word, low half first; an odd count ends with 0.
fn pack_halves(halves: &[u16]) -> Vec<u32> {
    halves
        .chunks(2)
        .map(|p| u32::from(p[0]) | (u32::from(p.get(1).copied().unwrap_or(0)) << 16))
        .collect()
}

/// Repacks `data`, a `[rows, cols]` matrix of `ty` in ggml layout (`rows * ty.row_bytes(cols)`
/// bytes), into the GPU layout.
pub fn repack(ty: WeightFormat, data: &[u8], rows: usize, cols: usize) -> Result<PackedMatrix> {
    let g = ty.ggml();
    let bad = |msg: String| Error::InvalidArgument(format!("repack {}: {msg}", g.name()));
    let row_bytes = g
        .row_bytes(cols as u64)
        .ok_or_else(|| bad(format!("{cols} columns is not a whole number of blocks")))?;
    let expect = usize::try_from(row_bytes)
        .ok()
        .and_then(|r| r.checked_mul(rows))
        .ok_or_else(|| bad("matrix size overflows".into()))?;
    if data.len() != expect {
        return Err(bad(format!(
            "[{rows}, {cols}] needs {expect} bytes, got {}",
            data.len()
        )));
    }
    let mut quants = Vec::new();
    let mut scales = Vec::new();
    match ty {
        WeightFormat::Q4_0 | WeightFormat::Q8_0 => {
            // 2-byte f16 d, then the code bytes.
            let block = g.type_size();
            let mut d = Vec::with_capacity(data.len() / block);
            for b in data.chunks_exact(block) {
                d.push(u16::from_le_bytes([b[0], b[1]]));
                quants.extend(b[2..].chunks_exact(4).map(word));
            }
            scales = pack_halves(&d);
        }
        WeightFormat::Q4_1 => {
            // 2-byte f16 d, 2-byte f16 m, then 16 code bytes.
            for b in data.chunks_exact(g.type_size()) {
                scales.push(word(&b[..4]));
                quants.extend(b[4..].chunks_exact(4).map(word));
            }
        }
        WeightFormat::Q4_K => {
            // d, dmin (2 x f16), 12 scale bytes, 128 code bytes: already word-aligned fields.
            for b in data.chunks_exact(g.type_size()) {
                scales.extend(b[..16].chunks_exact(4).map(word));
                quants.extend(b[16..].chunks_exact(4).map(word));
            }
        }
        WeightFormat::Q6_K => {
            // ql (128 bytes), qh (64), 16 i8 scales, f16 d.
            let blocks: Vec<&[u8]> = data.chunks_exact(g.type_size()).collect();
            for pair in blocks.chunks(2) {
                let mut d = [0u16; 2];
                for (i, di) in d.iter_mut().enumerate() {
                    match pair.get(i) {
                        Some(b) => {
                            quants.extend(b[..192].chunks_exact(4).map(word));
                            scales.extend(b[192..208].chunks_exact(4).map(word));
                            *di = u16::from_le_bytes([b[208], b[209]]);
                        }
                        None => scales.extend([0u32; 4]),
                    }
                }
                scales.extend(pack_halves(&d));
            }
        }
        WeightFormat::F16 => {
            if cols > 0 {
                for r in data.chunks_exact(cols * 2) {
                    let h: Vec<u16> = r
                        .chunks_exact(2)
                        .map(|p| u16::from_le_bytes([p[0], p[1]]))
                        .collect();
                    quants.extend(pack_halves(&h));
                }
            }
        }
        WeightFormat::F32 => {
            quants.extend(data.chunks_exact(4).map(word));
        }
    }
    Ok(PackedMatrix {
        ty,
        rows,
        cols,
        quants,
        scales,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded normal-ish weights (sum of uniforms) with a few large outliers.
    fn weights(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed | 1;
        let mut u = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|i| {
                let v = (u() + u() + u() - 1.5) as f32;
                if i % 41 == 0 {
                    v * 30.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// `n` random K-quant super-blocks (every code and sub-scale bit pattern) with finite f16
    /// super-scales (bytes 0..4 of Q4_K: d, dmin; bytes 208..210 of Q6_K: d).
    fn kquant_bytes(g: kernels_ref::GgmlType, n: usize) -> Vec<u8> {
        let mut s = 0x2545_f491u64;
        let mut v: Vec<u8> = (0..n * g.type_size())
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect();
        let halves: &[usize] = if g == kernels_ref::GgmlType::Q4_K {
            &[0, 2]
        } else {
            &[208]
        };
        for (i, b) in v.chunks_exact_mut(g.type_size()).enumerate() {
            for &at in halves {
                let d = half::f16::from_f32(0.001 + 0.007 * (i + at) as f32);
                b[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        v
    }

    /// Dequantizes one element from the packed layout, reading it the way the WGSL fragments
    /// do, so a layout mistake shows up here without a GPU.
    fn packed_elem(p: &PackedMatrix, r: usize, c: usize) -> f32 {
        let half = |w: u32, i: usize| half::f16::from_bits((w >> (16 * i)) as u16).to_f32();
        let nbr = p.cols / 32;
        let g = r * nbr + c / 32;
        let e = c % 32;
        match p.ty {
            WeightFormat::Q4_0 => {
                let d = half(p.scales[g / 2], g % 2);
                let w = p.quants[g * 4 + (e % 16) / 4];
                let q = (w >> (8 * (e % 4) + 4 * (e / 16))) & 0xF;
                d * (q as f32 - 8.0)
            }
            WeightFormat::Q4_1 => {
                let (d, m) = (half(p.scales[g], 0), half(p.scales[g], 1));
                let w = p.quants[g * 4 + (e % 16) / 4];
                let q = (w >> (8 * (e % 4) + 4 * (e / 16))) & 0xF;
                d * q as f32 + m
            }
            WeightFormat::Q8_0 => {
                let d = half(p.scales[g / 2], g % 2);
                let q = (p.quants[g * 8 + e / 4] >> (8 * (e % 4))) as u8 as i8;
                d * f32::from(q)
            }
            WeightFormat::Q4_K => {
                let g = r * (p.cols / 256) + c / 256;
                let e = c % 256;
                let (j, l) = (e / 32, e % 32);
                let byte = |i: usize| (p.quants[g * 32 + i / 4] >> (8 * (i % 4))) & 0xFF;
                let q = (byte((j / 2) * 32 + l) >> (4 * (j % 2))) & 0xF;
                let sb = |i: usize| ((p.scales[g * 4 + 1 + i / 4] >> (8 * (i % 4))) & 0xFF) as u8;
                let (sc, m) = if j < 4 {
                    (sb(j) & 63, sb(j + 4) & 63)
                } else {
                    (
                        (sb(j + 4) & 0xF) | ((sb(j - 4) >> 6) << 4),
                        (sb(j + 4) >> 4) | ((sb(j) >> 6) << 4),
                    )
                };
                let (d, dmin) = (half(p.scales[g * 4], 0), half(p.scales[g * 4], 1));
                d * f32::from(sc) * q as f32 - dmin * f32::from(m)
            }
            WeightFormat::Q6_K => {
                let g = r * (p.cols / 256) + c / 256;
                let e = c % 256;
                let (hf, jj, l) = (e / 128, (e % 128) / 32, e % 32);
                let byte = |i: usize| (p.quants[g * 48 + i / 4] >> (8 * (i % 4))) & 0xFF;
                let lo = (byte(hf * 64 + 32 * (jj % 2) + l) >> (4 * (jj / 2))) & 0xF;
                let hi = (byte(128 + hf * 32 + l) >> (2 * jj)) & 3;
                let q = (lo | (hi << 4)) as i32 - 32;
                let s = e / 16;
                let sw = p.scales[(g / 2) * 9 + (g % 2) * 4 + s / 4];
                let sc = (sw >> (8 * (s % 4))) as u8 as i8;
                let d = half(p.scales[(g / 2) * 9 + 8], g % 2);
                d * f32::from(sc) * q as f32
            }
            WeightFormat::F16 => half(p.quants[r * p.cols.div_ceil(2) + c / 2], c % 2),
            WeightFormat::F32 => f32::from_bits(p.quants[r * p.cols + c]),
        }
    }

    #[test]
    fn packed_layout_dequantizes_like_kernels_ref() {
        for ty in WeightFormat::ALL {
            let g = ty.ggml();
            // Odd row count; for the float formats an odd column count too.
            let (rows, cols) = match g.block_size() {
                1 => (5, 37),
                32 => (5, 96),
                // An odd number of super-blocks (Q6_K's last pair is half empty).
                _ => (3, 768),
            };
            let data = if kernels_ref::quant::can_quantize(g) {
                kernels_ref::quant::quantize(g, &weights(7, rows * cols)).unwrap()
            } else {
                kquant_bytes(g, rows * cols / 256)
            };
            let want = kernels_ref::quant::dequantize_vec(g, &data, rows * cols).unwrap();
            let p = repack(ty, &data, rows, cols).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    let got = packed_elem(&p, r, c);
                    assert_eq!(got, want[r * cols + c], "{ty:?} at [{r}, {c}]");
                }
            }
        }
    }

    #[test]
    fn rejects_wrong_sizes() {
        assert!(repack(WeightFormat::Q4_0, &[0u8; 17], 1, 32).is_err());
        assert!(repack(WeightFormat::Q8_0, &[0u8; 34], 1, 33).is_err());
        assert!(repack(WeightFormat::F32, &[0u8; 8], 1, 3).is_err());
        assert!(repack(WeightFormat::Q4_K, &[0u8; 144], 1, 128).is_err());
        assert!(repack(WeightFormat::Q6_K, &[0u8; 209], 1, 256).is_err());
    }
}
