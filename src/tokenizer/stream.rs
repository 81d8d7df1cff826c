//! Incremental detokenization for streaming generated text.

use super::Tokenizer;

/// Streaming detokenizer: push ids, get back only complete UTF-8 text. Bytes of a multi-byte
/// character split across tokens are held until the character is complete; bytes that can never
/// form valid UTF-8 come out as U+FFFD. Pieces are joined as they are (no SentencePiece
/// leading-space removal and no clean-up of spaces, unlike [`Tokenizer::decode`]), as a server
/// streams llama.cpp's `token_to_piece` output.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    special: bool,
    bytes: Utf8Stream,
}

impl<'a> StreamDecoder<'a> {
    /// `special`: whether control tokens contribute their text.
    pub fn new(tok: &'a Tokenizer, special: bool) -> Self {
        StreamDecoder {
            tok,
            special,
            bytes: Utf8Stream::default(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.bytes.push(&self.tok.decode_token(id, self.special))
    }

    /// Returns whatever is still held, lossily (an incomplete sequence becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        self.bytes.flush()
    }
}

/// The byte half of [`StreamDecoder`], owning no tokenizer (a generator that lives next to
/// its model keeps one): push bytes, get back only complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    /// Undecoded bytes: at most an incomplete UTF-8 sequence between calls.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is UTF-8 by the error's contract.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that no continuation can fix.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Returns whatever is still held, lossily (an incomplete sequence becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
