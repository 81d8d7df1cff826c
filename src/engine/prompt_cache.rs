//! Prompt cache files (`memwall run --prompt-cache FILE`): the KV state of a prompt saved by one
//! process and restored by another, so a repeated prompt prefix (a system prompt) is not
//! evaluated again.
//!
//! Layout (little-endian):
//!
//! ```text
//! [8]  magic "MWPCACHE"           u32 version (1)
//! u64  model fingerprint          u32 n_layer, u32 kv_dim
//! u32  length, then the KV signature (e.g. "k=f32,v=f32")
//! u32  n_tokens, then the tokens: [n_tokens] u32
//! per layer: K [n_tokens, kv_dim] f32, then V [n_tokens, kv_dim] f32
//! u64  checksum of every byte before it
//! ```
//!
//! The model fingerprint hashes the GGUF header, metadata and tensor infos (everything before
//! the data section), the file size, and 1 KiB from the start, middle and end of each tensor's
//! data: cheap at every launch (hashing a multi-GB model in full would cost more than the
//! prompt it saves) and still different for a re-quantized or retrained model of the same
//! shape. A file is validated in full (length, checksum, model, KV types, shape, token ids)
//! before anything in the session changes; each refusal is a typed [`PromptCacheError`].

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::engine::context::Context;
use crate::engine::Session;
use crate::error::{Error, Result};
use crate::gguf::Gguf;

const MAGIC: &[u8; 8] = b"MWPCACHE";
const VERSION: u32 = 1;
/// Bytes of each tensor's data the fingerprint samples at its start, middle and end.
const SAMPLE: usize = 1024;

pub use crate::error::PromptCacheError;

/// A validated prompt cache, in memory.
pub struct PromptCache {
    tokens: Vec<u32>,
    kv_dim: usize,
    /// The file image; layer l's K rows start at `kv_start + 2 * l * row_bytes * n_tokens`.
    bytes: Vec<u8>,
    kv_start: usize,
}

/// A 64-bit hash over 8-byte words (the tail zero-padded): every step is a bijection of the
/// state for a fixed word, so changing any one word always changes the result.
pub fn hash64(seed: u64, data: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = seed ^ (data.len() as u64).wrapping_mul(P);
    let mut step = |w: u64| {
        h = (h ^ w).wrapping_mul(P);
        h ^= h >> 29;
    };
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        step(u64::from_le_bytes([
            w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
        ]));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    step(u64::from_le_bytes(tail));
    h
}

/// The model's content fingerprint (see the module documentation for what it covers).
pub fn model_fingerprint(g: &Gguf) -> u64 {
    let bytes = g.bytes();
    let header = &bytes[..(g.data_offset() as usize).min(bytes.len())];
    let mut h = hash64(g.file_len(), header);
    for t in g.tensors() {
        let d = g.tensor_data(t);
        let mid = d.len() / 2;
        for range in [
            0..SAMPLE.min(d.len()),
            mid.saturating_sub(SAMPLE / 2)..(mid + SAMPLE / 2).min(d.len()),
            d.len().saturating_sub(SAMPLE)..d.len(),
        ] {
            h = hash64(h, &d[range]);
        }
    }
    h
}

/// Reads fields in order, naming the first one the file is too short for.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], PromptCacheError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(PromptCacheError::Truncated {
                at: self.b.len() as u64,
                needed: (self.at as u64).saturating_add(n as u64),
                what,
            });
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, PromptCacheError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, PromptCacheError> {
        let s = self.take(8, what)?;
        Ok(u64::from_le_bytes([
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
        ]))
    }
}

impl PromptCache {
    /// The checksum a cache file ends with, of the bytes before it.
    pub fn checksum(image: &[u8]) -> u64 {
        hash64(0, image)
    }

    /// Reads and validates `path` for `session`'s model and KV types.
    pub fn load(path: impl AsRef<Path>, session: &Session) -> Result<PromptCache> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(bytes, session).map_err(|kind| Error::PromptCache {
            path: path.to_path_buf(),
            kind,
        })
    }

    /// Validates a cache image for `session`.
    pub fn parse(bytes: Vec<u8>, session: &Session) -> Result<PromptCache, PromptCacheError> {
        let model = session.model();
        let cfg = model.config();
        let mut r = Reader { b: &bytes, at: 0 };
        let magic = r.take(8, "magic")?;
        if magic != MAGIC {
            return Err(PromptCacheError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(PromptCacheError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let fingerprint = r.u64("model fingerprint")?;
        let n_layer = r.u32("layer count")? as usize;
        let kv_dim = r.u32("KV width")? as usize;
        let sig_len = r.u32("KV signature length")? as usize;
        let sig = String::from_utf8_lossy(r.take(sig_len, "KV signature")?).into_owned();
        let n_tokens = r.u32("token count")? as usize;
        let tok_bytes = r.take(n_tokens.saturating_mul(4), "token list")?;
        let tokens: Vec<u32> = tok_bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let kv_start = r.at;
        let kv_bytes = n_layer
            .saturating_mul(2)
            .saturating_mul(n_tokens)
            .saturating_mul(kv_dim)
            .saturating_mul(4);
        r.take(kv_bytes, "KV rows")?;
        let body_end = r.at;
        let stored = r.u64("checksum")?;
        if r.at < bytes.len() {
            return Err(PromptCacheError::TrailingBytes {
                extra: (bytes.len() - r.at) as u64,
            });
        }
        let computed = hash64(0, &bytes[..body_end]);
        if stored != computed {
            return Err(PromptCacheError::Checksum { stored, computed });
        }
        let mine = model_fingerprint(model.gguf());
        if fingerprint != mine {
            return Err(PromptCacheError::OtherModel {
                file: fingerprint,
                model: mine,
            });
        }
        if sig != session.kv_signature() {
            return Err(PromptCacheError::KvTypes {
                file: sig,
                session: session.kv_signature(),
            });
        }
        if (n_layer, kv_dim) != (cfg.n_layer, cfg.kv_dim()) {
            return Err(PromptCacheError::Shape {
                file: format!("{n_layer}x{kv_dim}"),
                model: format!("{}x{}", cfg.n_layer, cfg.kv_dim()),
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= cfg.n_vocab) {
            return Err(PromptCacheError::Token {
                id,
                n_vocab: cfg.n_vocab,
            });
        }
        Ok(PromptCache {
            tokens,
            kv_dim,
            bytes,
            kv_start,
        })
    }

    /// The tokens whose KV the file holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Rows 0..n of layer l's K (`which` 0) or V (1) as f32: [n, kv_dim].
    fn rows(&self, l: usize, which: usize, n: usize) -> Vec<f32> {
        let block = self.tokens.len() * self.kv_dim * 4;
        let start = self.kv_start + (2 * l + which) * block;
        self.bytes[start..start + n * self.kv_dim * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

impl Context {
    /// Replaces what the session holds with the longest prefix of `cache` that `prompt` starts
    /// with, at most `prompt.len() - 1` tokens (the rest must yield logits) and what the
    /// context holds. Returns its length: evaluate `prompt[n..]` next.
    pub fn restore_prefix(&mut self, cache: &PromptCache, prompt: &[u32]) -> Result<usize> {
        let n = crate::engine::ctx_shift::common_prefix(cache.tokens(), prompt)
            .min(prompt.len().saturating_sub(1))
            .min(self.n_ctx);
        for l in 0..self.model().config().n_layer {
            let (k, v) = (cache.rows(l, 0, n), cache.rows(l, 1, n));
            self.exec.write_layer_kv(l, &k, &v)?;
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(&prompt[..n]);
        Ok(n)
    }

    /// Writes the session's cached tokens and their KV to `path` (a temporary file renamed over
    /// it, so a failed save leaves an existing file as it was). Returns the bytes written.
    pub fn save_prompt_cache(&mut self, path: impl AsRef<Path>) -> Result<u64> {
        let path = path.as_ref();
        let image = self.prompt_cache_image()?;
        let tmp = temp_path(path);
        let io = |source| Error::Io {
            path: tmp.clone(),
            source,
        };
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&image).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(image.len() as u64)
    }

    /// The cache file image of what the session holds.
    pub fn prompt_cache_image(&mut self) -> Result<Vec<u8>> {
        let cfg = self.model().config().clone();
        let n = self.tokens.len();
        let kv_dim = cfg.kv_dim();
        let sig = self.kv_signature();
        let mut out = Vec::with_capacity(64 + n * 4 + cfg.n_layer * 2 * n * kv_dim * 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&model_fingerprint(self.model().gguf()).to_le_bytes());
        for x in [cfg.n_layer, kv_dim, sig.len()] {
            out.extend_from_slice(&(x as u32).to_le_bytes());
        }
        out.extend_from_slice(sig.as_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for &t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        // k, v: [n, kv_dim] of one layer at a time.
        let mut k = vec![0f32; n * kv_dim];
        let mut v = vec![0f32; n * kv_dim];
        for l in 0..cfg.n_layer {
            self.exec.read_layer_kv(l, n, &mut k, &mut v)?;
            out.extend(k.iter().chain(&v).flat_map(|x| x.to_le_bytes()));
        }
        out.extend_from_slice(&hash64(0, &out).to_le_bytes());
        Ok(out)
    }
}

/// `path` with `.tmp.<pid>` appended, in the same directory (so the rename stays on one file
/// system).
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}
