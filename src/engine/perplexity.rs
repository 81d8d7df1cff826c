//! Perplexity over a token sequence, llama.cpp's way.

use super::{Model, Session};
use crate::error::{Error, Result};
use crate::model::Logits;

/// Result of a perplexity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    /// Standard error of the perplexity estimate (as llama-perplexity prints it).
    pub ppl_err: f64,
    pub n_chunks: usize,
    pub n_scored: usize,
}

/// Perplexity the way llama.cpp's llama-perplexity computes it: consecutive windows of
/// `n_ctx` tokens, each evaluated from an empty cache, scoring the predictions of the second
/// half of each window. A model that adds BOS sees BOS as each window's first token, as
/// llama-perplexity replaces it (tools/perplexity/perplexity.cpp: `tokens[batch_start] =
/// llama_vocab_bos(vocab)` for the first batch of each chunk). `on_chunk(i, running_ppl)`
/// reports progress.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    n_ctx: usize,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity> {
    if n_ctx < 8 {
        return Err(Error::InvalidArgument(format!(
            "context {n_ctx} is too small for perplexity"
        )));
    }
    let n_chunks = tokens.len() / n_ctx;
    if n_chunks == 0 {
        return Err(Error::InvalidArgument(format!(
            "the text has {} tokens, fewer than one window of {n_ctx}",
            tokens.len()
        )));
    }
    let n_vocab = model.config().n_vocab;
    let mut session = Session::new(model.clone(), n_ctx)?;
    let first = n_ctx / 2;
    let bos = model
        .tokenizer()
        .bos()
        .filter(|_| model.tokenizer().add_bos());
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut input = Vec::with_capacity(n_ctx);
    for c in 0..n_chunks {
        let window = &tokens[c * n_ctx..(c + 1) * n_ctx];
        input.clear();
        input.extend_from_slice(window);
        if let Some(b) = bos {
            input[0] = b;
        }
        session.reset();
        // [n_ctx - first, n_vocab]: logits of the scored half only.
        let logits = session.eval(&input, Logits::From(first))?;
        for j in first..n_ctx - 1 {
            let r = j - first;
            let row = &logits[r * n_vocab..(r + 1) * n_vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
            let target = window[j + 1] as usize;
            let lp = row[target] as f64 - max - sum.ln();
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        on_chunk(c, (nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    Ok(Perplexity {
        ppl,
        ppl_err: ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt(),
        n_chunks,
        n_scored: count,
    })
}
