//! The whole forward pass of the CPU backend against one built from kernels-ref's reference
//! ops alone, on the real test model: same logits for a prompt evaluated in one batch, and the
//! same again when the tokens come one at a time (decode) or in uneven batches.

mod common;

use common::{reference_forward, rel_err};
use memwall::engine::{LoadOptions, Model};
use memwall::gguf::Gguf;
use memwall::model::Logits;

#[test]
fn cpu_forward_matches_the_reference_forward() {
    let path = common::model_path();
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let g = Gguf::open(&path).unwrap();
    let c = model.config().clone();
    let ids = model
        .tokenizer()
        .encode("The capital of France is", true, true);
    let n = ids.len();
    let want = reference_forward(&g, &c, &ids, 64);

    // One batch.
    let mut s = model.session_with_ctx(64).unwrap();
    let batch = s.eval(&ids, Logits::All).unwrap();
    // The fast path quantizes activations to 8 bits for its dot products (as llama.cpp
    // does), so it is close to, not equal to, the f64-accumulating reference: through 30
    // layers that moves the logits by a few percent of their range (measured: 4.0e-2), while
    // a wrong op (a rope pairing, a missing norm weight) moves them by their whole range. The
    // probabilities are what sampling sees; those must agree to 0.1 (measured: 0.066; llama.cpp CPU vs Vulkan differ by up to 0.14).
    let e = rel_err(&batch, &want);
    eprintln!("batched prefill vs reference: max relative error {e:.2e}");
    assert!(e < 0.06, "batched logits differ from the reference by {e}");
    for t in 0..n {
        let row = |v: &[f32]| v[t * c.n_vocab..(t + 1) * c.n_vocab].to_vec();
        let (p, q) = (
            memwall::sampler::softmax_f64(&row(&batch)),
            memwall::sampler::softmax_f64(&row(&want)),
        );
        let d = p
            .iter()
            .zip(&q)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(d < 0.1, "token {t}: probabilities differ by up to {d}");
    }
    for t in 0..n {
        let row = |v: &[f32]| v[t * c.n_vocab..(t + 1) * c.n_vocab].to_vec();
        assert_eq!(
            memwall::sampler::argmax(&row(&batch)),
            memwall::sampler::argmax(&row(&want)),
            "argmax at token {t}"
        );
    }

    // Token by token: same logits as the batch, up to summation order.
    let mut s = model.session_with_ctx(64).unwrap();
    let mut step = Vec::new();
    for &id in &ids {
        step.extend(s.eval(&[id], Logits::All).unwrap());
    }
    let e = rel_err(&step, &batch);
    eprintln!("decode vs batched prefill: max relative error {e:.2e}");
    assert!(e < 1e-3, "decode logits differ from batched ones by {e}");

    // Uneven batches (2 + rest) with only the last row asked for.
    let mut s = model.session_with_ctx(64).unwrap();
    s.eval(&ids[..2], Logits::None).unwrap();
    let last = s.eval(&ids[2..], Logits::Last).unwrap();
    let e = rel_err(&last, &batch[(n - 1) * c.n_vocab..]);
    assert!(e < 1e-3, "split prefill differs by {e}");
    assert_eq!(s.tokens(), &ids[..]);
}
