//! Token texts in one buffer with an open-addressing index from text to id: a 262,144-token
//! vocabulary loads in a few milliseconds (one allocation for the texts, one for the index, no
//! per-token strings or hashed keys), and the texts are stored once.

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (rustc's hasher): a multiply-rotate over 8-byte words. Fast on short keys such as
/// token texts and merge lines; not resistant to chosen collisions, which a vocabulary file
/// cannot exploit beyond slowing its own load.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `HashMap`'s hasher for the tokenizer's maps.
pub type FxBuild = BuildHasherDefault<FxHasher>;

fn hash(s: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(s);
    // MurmurHash3's finalizer: every input bit reaches the low bits the index takes.
    let mut x = h.finish();
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

const EMPTY: u32 = u32::MAX;

/// The vocabulary's texts, by id, and the id of each text (the first id when a text repeats).
pub struct Vocab {
    buf: String,
    /// `ends[i]` is where text `i` ends in `buf`; it starts where `i - 1` ends.
    ends: Vec<u32>,
    /// Open addressing, linear probing: an id or `EMPTY`. A power of two, at most half full.
    slots: Vec<u32>,
}

impl Vocab {
    /// Stores `texts`. Returns the vocabulary and the ids whose text repeats an earlier one.
    pub fn new<'a>(texts: impl ExactSizeIterator<Item = &'a str> + Clone) -> (Vocab, Vec<u32>) {
        let n = texts.len();
        let total: usize = texts.clone().map(str::len).sum();
        let mut buf = String::with_capacity(total);
        let mut ends = Vec::with_capacity(n);
        for t in texts {
            buf.push_str(t);
            ends.push(buf.len() as u32);
        }
        let size = (2 * n).next_power_of_two().max(16);
        let mut v = Vocab {
            buf,
            ends,
            slots: vec![EMPTY; size],
        };
        let mut repeats = Vec::new();
        for id in 0..n as u32 {
            let mask = v.slots.len() - 1;
            let text = v.text(id);
            let mut i = hash(text.as_bytes()) as usize & mask;
            loop {
                let s = v.slots[i];
                if s == EMPTY {
                    v.slots[i] = id;
                    break;
                }
                if v.text(s) == text {
                    repeats.push(id);
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        (v, repeats)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The text of `id`; panics when out of range.
    #[inline]
    pub fn text(&self, id: u32) -> &str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.buf[start..self.ends[i] as usize]
    }

    /// The text of `id`, `None` when out of range.
    pub fn get(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.len()).then(|| self.text(id))
    }

    /// The id whose text is exactly `text`.
    #[inline]
    pub fn id(&self, text: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = hash(text.as_bytes()) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if self.text(s) == text {
                return Some(s);
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_ids_round_trip() {
        let texts = ["a", "", "▁the", "a", "<0x0A>", "ab"];
        let (v, repeats) = Vocab::new(texts.iter().copied());
        assert_eq!(repeats, [3]);
        assert_eq!(v.len(), 6);
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(v.text(i as u32), *t);
        }
        assert_eq!(v.id("a"), Some(0));
        assert_eq!(v.id(""), Some(1));
        assert_eq!(v.id("ab"), Some(5));
        assert_eq!(v.id("▁the"), Some(2));
        assert_eq!(v.id("b"), None);
        assert_eq!(v.get(6), None);
        let (v, _) = Vocab::new(std::iter::empty::<&str>());
        assert_eq!(v.id("a"), None);
    }
}
