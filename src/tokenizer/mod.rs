//! The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp
//! token for token: byte-level BPE (`gpt2`) with llama.cpp's pre-tokenizers, and
//! SentencePiece-style BPE over scores (`llama`) with byte fallback. Special tokens are split out
//! of the text first, longest first, as llama.cpp's `tokenizer_st_partition` does.

mod load;
mod merge;
mod pretok;
mod special;
mod stream;
mod unicode;
mod vocab;

use std::collections::{BTreeSet, HashMap};

pub use stream::{StreamDecoder, Utf8Stream};

/// Token attributes, the same bits as llama.cpp's `llama_token_attr`.
mod attr {
    pub const UNDEFINED: u16 = 0;
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `tokenizer.ggml.model = "llama"`.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`.
    Bpe,
}

/// A piece of the input after special tokens are split out.
enum Fragment {
    /// Byte range of the input still to be tokenized.
    Text(usize, usize),
    Token(u32),
}

/// A GGUF model's tokenizer. See the module docs.
pub struct Tokenizer {
    kind: Kind,
    /// Token texts as stored in the file, and the id of each text.
    vocab: vocab::Vocab,
    /// SentencePiece scores (0 when absent). `[n_vocab]`.
    scores: Vec<f32>,
    /// `attr::*` bits. `[n_vocab]`.
    attrs: Vec<u16>,
    /// BPE merge line ("left right") to rank; empty for SPM.
    merges: HashMap<String, u32, vocab::FxBuild>,
    pre: Option<pretok::PreTokenizer>,
    /// Control, user-defined and unknown tokens, longest text first.
    special: Vec<u32>,
    special_index: special::SpecialIndex,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    eog: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    ignore_merges: bool,
    /// SentencePiece-style BPE (Gemma 4, llama.cpp's `escape_whitespaces` without
    /// `byte_encode`): spaces become `▁` before the pre-tokenizer, words stay plain UTF-8, a run
    /// of newlines that is a token is taken whole, and text no merge covers falls back to
    /// `<0xNN>` byte tokens.
    spm_bpe: bool,
    clean_spaces: bool,
    warnings: Vec<String>,
}

impl Tokenizer {
    /// Reads the tokenizer from GGUF metadata. Vocabulary types other than `llama` and `gpt2`
    /// are an error; an unknown pre-tokenizer falls back to llama.cpp's default with a warning
    /// (see [`Tokenizer::warnings`]).
    pub fn from_gguf(g: &crate::gguf::Gguf) -> crate::Result<Tokenizer> {
        load::from_gguf(g)
    }

    /// Things worth telling the user that did not stop loading (unknown pre-tokenizer, ...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Tokenizes `text`. `add_special` adds BOS/EOS as the metadata asks
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`, with llama.cpp's defaults);
    /// `parse_special` maps control-token text (such as `<|im_start|>`) to those tokens instead
    /// of tokenizing it as plain text. User-defined tokens are always split out.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match self.kind {
            Kind::Spm => {
                // SentencePiece adds a space before the text and after every special token.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Fragment::Text(start, end) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[start..end].chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            self.spm_tokenize(&buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe => {
                for f in &frags {
                    match *f {
                        Fragment::Text(start, end) => {
                            self.bpe_tokenize(&text[start..end], &mut out)
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits special tokens out of `text`, one special token at a time, longest first, each
    /// over all remaining text fragments (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let present = self.special_index.present(text);
        if present.is_empty() {
            return frags;
        }
        let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r');
        for &id in &self.special {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = self.vocab.text(id);
            if !present.contains(pat) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Text(mut start, end) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = text[start..end].find(pat) {
                    let m = start + pos;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_space(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = m + pat.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_space(text.as_bytes()[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            frags = next;
        }
        frags
    }

    fn bpe_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let Some(pre) = &self.pre else { return };
        if self.spm_bpe {
            return self.spm_bpe_tokenize(pre, text, out);
        }
        let byte_map = unicode::byte_to_char();
        let mut word = String::new();
        for w in pre.split(text) {
            word.clear();
            word.extend(w.bytes().map(|b| byte_map[b as usize]));
            if self.ignore_merges {
                if let Some(id) = self.vocab.id(&word) {
                    out.push(id);
                    continue;
                }
            }
            for sym in merge::bpe_merge(&word, &self.merges) {
                if let Some(id) = self.vocab.id(sym) {
                    out.push(id);
                    continue;
                }
                // Not a token: llama.cpp tries each byte of the symbol's text on its own; only
                // ASCII bytes can name a token.
                for b in sym.bytes().filter(u8::is_ascii) {
                    let mut one = [0u8; 4];
                    if let Some(id) = self.vocab.id(char::from(b).encode_utf8(&mut one)) {
                        out.push(id);
                    }
                }
            }
        }
    }

    fn spm_bpe_tokenize(&self, pre: &pretok::PreTokenizer, text: &str, out: &mut Vec<u32>) {
        let text = text.replace(' ', "▁");
        for w in pre.split(&text) {
            let whole = self.ignore_merges || w.bytes().all(|b| b == b'\n');
            if let Some(id) = whole.then(|| self.vocab.id(&w)).flatten() {
                out.push(id);
                continue;
            }
            for sym in merge::bpe_merge(&w, &self.merges) {
                if let Some(id) = self.vocab.id(sym) {
                    out.push(id);
                    continue;
                }
                for b in sym.bytes() {
                    out.extend(self.vocab.id(&format!("<0x{b:02X}>")));
                }
            }
        }
    }

    fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let lookup = |s: &str| self.vocab.id(s);
        let score = |id: u32| self.scores.get(id as usize).copied().unwrap_or(0.0);
        for sym in merge::spm_merge(text, lookup, score) {
            if let Some(id) = lookup(sym) {
                out.push(id);
                continue;
            }
            // Byte fallback: <0xNN> tokens, else a token that is the byte itself.
            for b in sym.bytes() {
                let hex = format!("<0x{b:02X}>");
                let id = lookup(&hex)
                    .or_else(|| b.is_ascii().then(|| lookup(&char::from(b).to_string()))?)
                    .or(self.unk);
                out.extend(id);
            }
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether generation should stop at `id`: EOS, EOT, EOM, the FIM pad/repo/separator tokens
    /// and the end-of-turn texts llama.cpp knows (`<|im_end|>`, `<|eot_id|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether BOS is added by `encode(.., add_special = true, ..)`.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The token's text as stored in the vocabulary ("" for an out-of-range id).
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.get(id).unwrap_or("")
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// The bytes `id` stands for, control tokens included (as their text).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.decode_token(id, true)
    }

    /// The bytes `id` decodes to (llama.cpp's `token_to_piece`): byte-level decoding for BPE,
    /// `▁` to space and `<0xNN>` to its byte for SPM; control and unknown tokens give their text
    /// only when `special`, unused and undefined ones nothing.
    pub fn decode_token(&self, id: u32, special: bool) -> Vec<u8> {
        let (Some(text), Some(&a)) = (self.vocab.get(id), self.attrs.get(id as usize)) else {
            return Vec::new();
        };
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Vec::new();
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                Kind::Spm => text.replace('▁', " ").into_bytes(),
                Kind::Bpe if self.spm_bpe => text.replace('▁', " ").into_bytes(),
                Kind::Bpe => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => out.push(b),
                            // Not a byte-level char: pass it through as UTF-8.
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                }
            };
        }
        if a & attr::BYTE != 0 {
            return text
                .strip_prefix("<0x")
                .and_then(|h| h.get(..2))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map_or_else(Vec::new, |b| vec![b]);
        }
        Vec::new()
    }

    /// Detokenizes `ids` as llama.cpp's `llama_detokenize` does (no special-token removal):
    /// the pieces of [`Tokenizer::decode_token`] joined, the leading space SentencePiece added
    /// removed, and for vocabularies that ask for it (`clean_up_tokenization_spaces`) spaces
    /// before punctuation and contractions removed. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut out = Vec::new();
        let mut strip_space = self.add_space_prefix;
        for &id in ids {
            let piece = self.decode_token(id, special);
            let p = match piece.split_first() {
                Some((b' ', rest)) if strip_space => rest,
                _ => &piece[..],
            };
            out.extend_from_slice(p);
            strip_space = false;
        }
        if self.clean_spaces {
            out = clean_up_spaces(&out);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// llama.cpp's three clean-up passes: " ?" " !" " ." " ," lose the space; a lone apostrophe
/// between spaces loses both spaces; " 's" " 'm" " 're" " 've" lose the space.
fn clean_up_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1.
    let mut a: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // Pass 2. A space dropped after an apostrophe is marked so it cannot start another match.
    let mut src = a;
    let mut b: Vec<u8> = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            b.pop();
            src[i + 1] = 0;
            b.push(x);
            i += 2;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // Pass 3.
    let mut c: Vec<u8> = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let drop = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < b.len() && matches!((x1, b[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::clean_up_spaces;

    #[test]
    fn clean_up_matches_llama_cpp_rules() {
        let f = |s: &str| String::from_utf8(clean_up_spaces(s.as_bytes())).unwrap();
        assert_eq!(f("Hello , world !"), "Hello, world!");
        assert_eq!(f("a ' b"), "a'b");
        assert_eq!(f("it 's he 'll we 're I 'd"), "it's he 'll we're I 'd");
        assert_eq!(f(""), "");
    }
}
