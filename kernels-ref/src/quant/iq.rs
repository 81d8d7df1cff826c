//! IQ4_NL: 4-bit indices into a fixed non-linear table of 16 levels.

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
