//! BPE pre-tokenizers: llama.cpp's `regex_exprs` per `tokenizer.ggml.pre`, applied in sequence
//! (each regex splits the pieces the previous one produced).
//!
//! Like llama.cpp, the GPT-2 and Llama-3 expressions run as hand-written scanners (their exact
//! behaviour, quirks included, is what the reference token ids encode). Every other expression
//! runs as a backtracking regex (fancy-regex stands in for `std::regex`) either over a
//! "collapsed" text, where each code point of 128 or more becomes one marker char for its
//! category and `\p{..}` in the pattern becomes a class of that marker plus its ASCII members,
//! or, for patterns without categories, over the code points with non-ASCII whitespace turned
//! into vertical tab. Unmatched stretches between matches are pieces too.

use super::unicode::{self, LETTER, NUMBER, WHITESPACE};
use crate::{Error, Result};

/// GPT-2's pattern; llama.cpp recognises it by its exact text.
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama-3's pattern (case-insensitive contractions spelled out), also recognised by text.
pub const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
pub const MINICPM5: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const DEEPSEEK3: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
pub const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const PORO: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";

/// The `\p{..}` names llama.cpp understands and what each collapses to: its marker char and the
/// ASCII members of the category, written for a regex class body.
const CATEGORIES: [(&str, &str); 10] = [
    (r"\p{N}", "\u{D1}0-9"),
    (r"\p{L}", "\u{D2}A-Za-z"),
    (r"\p{P}", "\u{D3}!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    (r"\p{M}", "\u{D4}"),
    (r"\p{S}", "\u{D5}\\$\\+<->\\^`\\|"),
    (r"\p{Lu}", "\u{D2}A-Za-z"),
    (r"\p{Ll}", "\u{D2}A-Za-z"),
    (r"\p{Lt}", "\u{D2}A-Za-z"),
    (r"\p{Lm}", "\u{D2}A-Za-z"),
    (r"\p{Lo}", "\u{D2}A-Za-z"),
];

enum Splitter {
    Gpt2,
    Llama3,
    Regex {
        re: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// A compiled sequence of pre-tokenizer expressions.
pub struct PreTokenizer {
    splitters: Vec<Splitter>,
}

/// Rewrites a pattern that uses `\p{..}` for the collapsed text, as llama.cpp does: outside a
/// class the category becomes a class, inside one its members are inlined.
fn collapse_pattern(expr: &str) -> String {
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && !escaped {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if let Some((pat, body)) = CATEGORIES.iter().find(|(p, _)| expr[i..].starts_with(p)) {
            if !inside {
                out.push('[');
            }
            out.push_str(body);
            if !inside {
                out.push(']');
            }
            i += pat.len();
            continue;
        }
        // Copy one whole char (patterns with categories are ASCII, but stay safe).
        let ch_len = expr[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&expr[i..i + ch_len]);
        i += ch_len;
    }
    out
}

impl PreTokenizer {
    pub fn new(exprs: &[&str]) -> Result<PreTokenizer> {
        let mut splitters = Vec::with_capacity(exprs.len());
        for &e in exprs {
            let s = if e == GPT2 {
                Splitter::Gpt2
            } else if e == LLAMA3 || e == LLAMA3_ORIG {
                Splitter::Llama3
            } else {
                let collapsed = CATEGORIES.iter().any(|(p, _)| e.contains(p));
                let pat = if collapsed {
                    collapse_pattern(e)
                } else {
                    e.to_string()
                };
                let re = fancy_regex::Regex::new(&pat)
                    .map_err(|err| Error::Tokenizer(format!("pre-tokenizer regex {e:?}: {err}")))?;
                Splitter::Regex { re, collapsed }
            };
            splitters.push(s);
        }
        Ok(PreTokenizer { splitters })
    }

    /// Splits `text` into words (plain UTF-8, not yet byte-encoded).
    pub fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        // Lengths (in code points) of consecutive pieces covering `cpts`.
        let mut offsets = vec![cpts.len()];
        for s in &self.splitters {
            offsets = match s {
                Splitter::Gpt2 => scan_pieces(&cpts, &offsets, gpt2_piece),
                Splitter::Llama3 => scan_pieces(&cpts, &offsets, llama3_piece),
                Splitter::Regex { re, collapsed } => regex_pieces(&cpts, &offsets, re, *collapsed),
            };
        }
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for len in offsets {
            if len > 0 {
                words.push(cpts[start..start + len].iter().collect());
            }
            start += len;
        }
        words
    }
}

fn regex_pieces(
    cpts: &[char],
    offsets: &[usize],
    re: &fancy_regex::Regex,
    collapsed: bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let mut s = String::new();
    for &len in offsets {
        let piece = &cpts[start..start + len];
        start += len;
        s.clear();
        for &c in piece {
            s.push(if collapsed {
                unicode::collapsed(c)
            } else if (c as u32) > 0x7F && unicode::flags(c) & WHITESPACE != 0 {
                '\u{0B}'
            } else {
                c
            });
        }
        // Match boundaries are byte offsets into `s`; count chars to get code point offsets.
        let mut last_byte = 0;
        let mut last_cp = 0;
        let to_cp = |byte: usize, last_byte: &mut usize, last_cp: &mut usize| {
            *last_cp += s[*last_byte..byte].chars().count();
            *last_byte = byte;
            *last_cp
        };
        let mut done = 0; // code points of this piece already emitted
        for m in re.find_iter(&s) {
            let Ok(m) = m else { break };
            let m_start = to_cp(m.start(), &mut last_byte, &mut last_cp);
            let m_end = to_cp(m.end(), &mut last_byte, &mut last_cp);
            if m_start > done {
                out.push(m_start - done);
            }
            if m_end > m_start {
                out.push(m_end - m_start);
            }
            done = m_end;
        }
        if done < len {
            out.push(len - done);
        }
    }
    out
}

/// Runs a hand-written scanner over each piece. The scanner gets the piece and a position and
/// returns where the word starting there ends.
fn scan_pieces(cpts: &[char], offsets: &[usize], scan: fn(&[char], usize) -> usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let piece = &cpts[start..start + len];
        start += len;
        let mut pos = 0;
        while pos < piece.len() {
            let end = scan(piece, pos).clamp(pos + 1, piece.len());
            out.push(end - pos);
            pos = end;
        }
    }
    out
}

/// Flags of the code point at `i`, zero past the end of the piece.
#[inline]
fn fl(p: &[char], i: usize) -> u8 {
    p.get(i).map_or(0, |&c| unicode::flags(c))
}

#[inline]
fn is_contraction_start(p: &[char], pos: usize) -> Option<usize> {
    // 's 't 'm 'd (2 chars) or 're 've 'll (3 chars), case-insensitively as Llama-3 wants.
    // ASCII folding is enough: no other code point lower-cases to one of these letters.
    if p.get(pos) != Some(&'\'') || pos + 1 >= p.len() {
        return None;
    }
    let n = p[pos + 1].to_ascii_lowercase();
    if matches!(n, 's' | 't' | 'm' | 'd') {
        return Some(pos + 2);
    }
    if pos + 2 < p.len() {
        let nn = p[pos + 2].to_ascii_lowercase();
        if matches!((n, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return Some(pos + 3);
        }
    }
    None
}

/// The end of the whitespace-run word at `pos` (`\s+(?!\S)` then `\s+`), or `pos + 1` when
/// nothing matches there.
#[inline]
fn whitespace_end(p: &[char], pos: usize) -> usize {
    let mut n = 0;
    while fl(p, pos + n) & WHITESPACE != 0 {
        n += 1;
    }
    if n > 1 && pos + n < p.len() {
        // Leave the last whitespace to prefix the following word.
        pos + n - 1
    } else if n > 0 {
        pos + n
    } else {
        pos + 1
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn gpt2_piece(p: &[char], pos: usize) -> usize {
    let c = p[pos];
    if c == '\'' && pos + 1 < p.len() {
        let n = p[pos + 1];
        if matches!(n, 's' | 't' | 'm' | 'd') {
            return pos + 2;
        }
        if pos + 2 < p.len() && matches!((n, p[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return pos + 3;
        }
    }
    let skip = usize::from(c == ' ');
    let f2 = fl(p, pos + skip);
    let mut end = pos + skip;
    if f2 & LETTER != 0 {
        while fl(p, end) & LETTER != 0 {
            end += 1;
        }
        return end;
    }
    if f2 & NUMBER != 0 {
        while fl(p, end) & NUMBER != 0 {
            end += 1;
        }
        return end;
    }
    let other = |f: u8| f & (WHITESPACE | LETTER | NUMBER) == 0 && f != 0;
    if other(f2) {
        while other(fl(p, end)) {
            end += 1;
        }
        return end;
    }
    whitespace_end(p, pos)
}

/// The Llama-3 pattern (see [`LLAMA3`]).
fn llama3_piece(p: &[char], pos: usize) -> usize {
    let c = p[pos];
    let f = fl(p, pos);
    if let Some(end) = is_contraction_start(p, pos) {
        return end;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if !(c == '\r' || c == '\n' || f & NUMBER != 0)
        && (f & LETTER != 0 || fl(p, pos + 1) & LETTER != 0)
    {
        let mut end = pos + 1;
        while fl(p, end) & LETTER != 0 {
            end += 1;
        }
        return end;
    }
    // \p{N}{1,3}
    if f & NUMBER != 0 {
        let mut end = pos;
        while fl(p, end) & NUMBER != 0 && end - pos < 3 {
            end += 1;
        }
        return end;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the flags of the first char, not the one
    // after the optional space, for the "defined" condition; all real code points are defined)
    let skip = usize::from(c == ' ');
    let f2 = fl(p, pos + skip);
    let other = |f: u8| f & (WHITESPACE | LETTER | NUMBER) == 0 && f != 0;
    if f2 & (WHITESPACE | LETTER | NUMBER) == 0 && f != 0 {
        let mut end = pos + skip;
        while other(fl(p, end)) {
            end += 1;
        }
        while matches!(p.get(end), Some('\r' | '\n')) {
            end += 1;
        }
        return end;
    }
    // \s*[\r\n]+
    let mut n = 0;
    let mut last_nl_end = None;
    while fl(p, pos + n) & WHITESPACE != 0 {
        if matches!(p[pos + n], '\r' | '\n') {
            last_nl_end = Some(pos + n + 1);
        }
        n += 1;
    }
    if let Some(end) = last_nl_end {
        return end;
    }
    whitespace_end(p, pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(exprs: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(exprs).unwrap().split(text)
    }

    #[test]
    fn gpt2_scanner_matches_the_regex_on_plain_text() {
        let text = "Hello world's  3.14 tests!!  \n\tok ";
        let scanned = split(&[GPT2], text);
        // The same pattern through the regex path (a copy that is not recognised by text).
        let via_regex = split(&[&format!("(?:{GPT2})")], text);
        assert_eq!(scanned, via_regex);
        assert_eq!(scanned.concat(), text);
    }

    #[test]
    fn llama3_scanner_matches_the_regex_path() {
        let text = "I'M here:\r\n  12345 apples\t\tand   Über-cool?!\n\n x";
        let scanned = split(&[LLAMA3], text);
        let via_regex = split(&[&format!("(?:{LLAMA3})")], text);
        assert_eq!(scanned, via_regex);
    }

    #[test]
    fn digits_split_one_by_one() {
        assert_eq!(
            split(&[r"\p{N}", GPT2], "ab 123"),
            ["ab", " ", "1", "2", "3"]
        );
    }
}
