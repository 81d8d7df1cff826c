//! Which special tokens occur in a text, found in one pass over it. Splitting special tokens out
//! goes over the special tokens one at a time (llama.cpp's order, longest first); a vocabulary
//! such as Gemma's has over 6,000 of them, nearly all absent from any given text, and searching
//! the text for each one cost more than the rest of tokenizing. A special token absent from the
//! whole text is absent from each of its fragments, so skipping those changes nothing.

use std::collections::{HashMap, HashSet};

use super::vocab::{FxBuild, Vocab};

pub struct SpecialIndex {
    /// Whether some special token starts with this byte.
    first: [bool; 256],
    /// Special tokens of one byte.
    single: [bool; 256],
    /// The distinct byte lengths (2 or more) of the special tokens starting with these two bytes.
    lens: HashMap<[u8; 2], Vec<usize>, FxBuild>,
    texts: HashSet<String, FxBuild>,
}

impl SpecialIndex {
    pub fn new(vocab: &Vocab, special: &[u32]) -> SpecialIndex {
        let mut ix = SpecialIndex {
            first: [false; 256],
            single: [false; 256],
            lens: HashMap::default(),
            texts: HashSet::default(),
        };
        for &id in special {
            let t = vocab.text(id);
            let b = t.as_bytes();
            if b.is_empty() {
                continue;
            }
            ix.first[b[0] as usize] = true;
            if b.len() == 1 {
                ix.single[b[0] as usize] = true;
            } else {
                let lens = ix.lens.entry([b[0], b[1]]).or_default();
                if !lens.contains(&b.len()) {
                    lens.push(b.len());
                }
            }
            ix.texts.insert(t.to_string());
        }
        ix
    }

    /// The texts of the special tokens that occur in `text`.
    pub fn present<'t>(&self, text: &'t str) -> HashSet<&'t str, FxBuild> {
        let b = text.as_bytes();
        let mut found = HashSet::default();
        for i in 0..b.len() {
            if !self.first[b[i] as usize] {
                continue;
            }
            if self.single[b[i] as usize] {
                found.insert(&text[i..i + 1]);
            }
            let Some(lens) = b.get(i + 1).and_then(|&b1| self.lens.get(&[b[i], b1])) else {
                continue;
            };
            for &len in lens {
                if let Some(sub) = text.get(i..i + len) {
                    if self.texts.contains(sub) {
                        found.insert(sub);
                    }
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_overlapping_and_single_byte_specials() {
        let texts = ["x", "\n", "ab", "bcd", "<u>", "<unused1>", "▁▁"];
        let (vocab, _) = Vocab::new(texts.iter().copied());
        let ix = SpecialIndex::new(&vocab, &[1, 2, 3, 4, 5, 6]);
        let mut got: Vec<&str> = ix.present("xabcd\n<unused1>").into_iter().collect();
        got.sort();
        assert_eq!(got, ["\n", "<unused1>", "ab", "bcd"]);
        assert!(ix.present("no specials, <u> ▁ here").contains("<u>"));
        assert!(ix.present("▁▁▁").contains("▁▁"));
        assert!(ix.present("plain").is_empty());
    }
}
