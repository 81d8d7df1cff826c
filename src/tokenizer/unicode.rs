//! Code point classes as llama.cpp's `unicode.cpp` sees them, and GPT-2's byte-to-unicode map.
//!
//! llama.cpp tags every code point with flags taken from its general category (`\p{N}`, `\p{L}`,
//! `\p{Z}`, `\p{M}`, `\p{P}`, `\p{S}`, `\p{C}`) plus a whitespace bit (the Unicode `White_Space`
//! property, what Python's `regex` module calls `\s`). We build the same table from the Unicode
//! data that `regex-syntax` ships, so no hand-copied tables live here.

use std::sync::OnceLock;

pub const NUMBER: u8 = 1 << 0;
pub const LETTER: u8 = 1 << 1;
pub const SEPARATOR: u8 = 1 << 2;
pub const ACCENT_MARK: u8 = 1 << 3;
pub const PUNCTUATION: u8 = 1 << 4;
pub const SYMBOL: u8 = 1 << 5;
pub const CONTROL: u8 = 1 << 6;
pub const WHITESPACE: u8 = 1 << 7;

const MAX_CODEPOINTS: usize = 0x11_0000;

/// The ranges of one regex-syntax class such as `\p{L}`; empty if it cannot be parsed (it always
/// can: the patterns are fixed).
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    let Ok(hir) = regex_syntax::ParserBuilder::new().build().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(cls)) => cls
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// Flags of every code point. `[MAX_CODEPOINTS]`, one byte each (1.1 MB, built once).
fn table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![0u8; MAX_CODEPOINTS];
        let classes = [
            (r"\p{N}", NUMBER),
            (r"\p{L}", LETTER),
            (r"\p{Z}", SEPARATOR),
            (r"\p{M}", ACCENT_MARK),
            (r"\p{P}", PUNCTUATION),
            (r"\p{S}", SYMBOL),
            (r"\p{C}", CONTROL),
            (r"\s", WHITESPACE),
        ];
        for (pat, flag) in classes {
            for (lo, hi) in class_ranges(pat) {
                for f in &mut t[lo as usize..=hi as usize] {
                    *f |= flag;
                }
            }
        }
        // Surrogates are category Cs; regex-syntax classes hold only `char`s, so they are
        // missing above. They never occur in a `&str`, but keep the table faithful.
        for f in &mut t[0xD800..=0xDFFF] {
            *f |= CONTROL;
        }
        t
    })
}

/// The flags of `c` (never zero for a real code point: unassigned ones are `\p{C}`).
#[inline]
pub fn flags(c: char) -> u8 {
    table().get(c as usize).copied().unwrap_or(0)
}

/// The byte llama.cpp's collapsed-regex path substitutes for a code point of 128 or more:
/// whitespace becomes vertical tab, each category its own marker, anything else 0xD0.
pub fn collapsed(c: char) -> char {
    if (c as u32) < 128 {
        return c;
    }
    let f = flags(c);
    if f & WHITESPACE != 0 {
        '\u{0B}'
    } else if f & NUMBER != 0 {
        '\u{D1}'
    } else if f & LETTER != 0 {
        '\u{D2}'
    } else if f & PUNCTUATION != 0 {
        '\u{D3}'
    } else if f & ACCENT_MARK != 0 {
        '\u{D4}'
    } else if f & SYMBOL != 0 {
        '\u{D5}'
    } else {
        '\u{D0}'
    }
}

/// GPT-2's reversible byte-to-unicode map: printable Latin-1 bytes map to themselves, the rest
/// to U+0100 upwards in byte order. `[256]`.
pub fn byte_to_char() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut n = 0u32;
        for (b, slot) in map.iter_mut().enumerate() {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b as u32
            } else {
                n += 1;
                255 + n
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        map
    })
}

/// The inverse of [`byte_to_char`]: the byte a GPT-2 byte-level char stands for.
pub fn char_to_byte(c: char) -> Option<u8> {
    // All mapped chars are below U+0200. `[512]`, -1 where no byte maps there.
    static INV: OnceLock<[i16; 512]> = OnceLock::new();
    let inv = INV.get_or_init(|| {
        let mut inv = [-1i16; 512];
        for (b, &c) in byte_to_char().iter().enumerate() {
            if let Some(slot) = inv.get_mut(c as usize) {
                *slot = b as i16;
            }
        }
        inv
    });
    inv.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_unicode() {
        assert_eq!(flags('a'), LETTER);
        assert_eq!(flags('7'), NUMBER);
        assert_eq!(flags('½'), NUMBER);
        assert_eq!(flags(' '), SEPARATOR | WHITESPACE);
        assert_eq!(flags('\n'), CONTROL | WHITESPACE);
        assert_eq!(flags('!'), PUNCTUATION);
        assert_eq!(flags('$'), SYMBOL);
        assert_eq!(flags('\u{0301}'), ACCENT_MARK);
        assert_eq!(flags('\u{200D}'), CONTROL); // ZWJ is Cf
        assert_eq!(flags('\u{3000}'), SEPARATOR | WHITESPACE);
        assert_eq!(flags('\u{1C}'), CONTROL); // not White_Space
    }

    #[test]
    fn byte_map_round_trips() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(m[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
