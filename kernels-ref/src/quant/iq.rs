//! IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 levels; IQ4_XS adds a
//! 6-bit scale per 32 elements in 256-element super-blocks.

use super::{bytes_at, f16_to_f32, u16_at, Block};

/// ggml's `kvalues_iq4nl`: the 16 levels, denser near zero.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `block_iq4_nl`: `x = d * KVALUES_IQ4NL[q]`; nibble order as Q4_0 (byte j: element j low,
/// element j + 16 high).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockIq4Nl {
    pub d: u16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

impl Block for BlockIq4Nl {
    const SIZE: usize = 18;
    const QK: usize = 32;

    fn read(b: &[u8]) -> Self {
        BlockIq4Nl {
            d: u16_at(b, 0),
            qs: bytes_at(b, 2),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, o) in out.iter_mut().enumerate() {
            let q = if i < 16 {
                self.qs[i] & 0x0f
            } else {
                self.qs[i - 16] >> 4
            };
            *o = d * f32::from(KVALUES_IQ4NL[usize::from(q)]);
        }
    }
}

/// `block_iq4_xs` (136 bytes, 256 elements): 8 sub-blocks of 32, sub-block `ib` scaled by
/// `d * (ls - 32)` where the 6-bit `ls` is `scales_l`'s nibble `ib` (low nibble first) with
/// `scales_h`'s bits `2 ib..2 ib + 2` above it; its 16 bytes of `qs` hold the levels' indices
/// in IQ4_NL's nibble order (byte j: element j low, element j + 16 high). As ggml's
/// `dequantize_row_iq4_xs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockIq4Xs {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

impl BlockIq4Xs {
    /// Sub-block `ib`'s 6-bit scale `ls` (0..64); the scale is `d * (ls - 32)`.
    pub fn sub_scale(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((self.scales_h >> (2 * ib)) & 3) as u8;
        i32::from(lo | (hi << 4))
    }
}

impl Block for BlockIq4Xs {
    const SIZE: usize = 136;
    const QK: usize = 256;

    fn read(b: &[u8]) -> Self {
        BlockIq4Xs {
            d: u16_at(b, 0),
            scales_h: u16_at(b, 2),
            scales_l: bytes_at(b, 4),
            qs: bytes_at(b, 8),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * (self.sub_scale(ib) - 32) as f32;
            let qs = &self.qs[16 * ib..16 * ib + 16];
            for (i, v) in o.iter_mut().enumerate() {
                let q = if i < 16 {
                    qs[i] & 0x0f
                } else {
                    qs[i - 16] >> 4
                };
                *v = dl * f32::from(KVALUES_IQ4NL[usize::from(q)]);
            }
        }
    }
}
