//! Generate text with the public API only.
//!
//!     cargo run --release --example generate -- [MODEL.gguf] ["prompt"]
//!
//! Without arguments it uses the test model that scripts/fetch-model.sh caches.

use std::io::Write;
use std::sync::Arc;

use memwall::engine::{default_model_path, LoadOptions, Model};
use memwall::sampler::{Sampler, SamplerParams};

fn main() -> memwall::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(Into::into)
        .unwrap_or_else(default_model_path);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The three primary colors are".to_string());

    let model = Arc::new(Model::load(&path, &LoadOptions::default())?);
    let ids = model.tokenizer().encode(&prompt, true, true);
    let mut session = model.session(1024)?;
    let mut sampler = Sampler::new(SamplerParams::greedy())?;

    print!("{prompt}");
    let out = session.generate(&ids, 48, &mut sampler, 0, |piece| {
        print!("{piece}");
        std::io::stdout().flush().is_ok()
    })?;
    println!(
        "\n[{} tokens, stop: {:?}, prefill {:.1} tok/s, decode {:.1} tok/s]",
        out.generated_ids.len(),
        out.stop,
        out.timings.prefill_tps,
        out.timings.decode_tps
    );
    Ok(())
}
