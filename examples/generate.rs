//! Generate text with the public embedding API (`memwall::api`) only: a model config, a
//! session, a token stream, and a cancel handle that a second thread could use.
//!
//!     cargo run --release --example generate -- [MODEL.gguf] ["prompt"] [--chat]
//!
//! Without a model argument it uses $MEMWALL_MODEL, else the test model that
//! scripts/fetch-model.sh caches.

use std::io::Write;

use memwall::api::{ChatMessage, Event, ModelConfig};

fn main() -> memwall::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let chat = args.iter().any(|a| a == "--chat");
    let mut rest = args.iter().filter(|a| *a != "--chat");
    let path = rest
        .next()
        .map(Into::into)
        .unwrap_or_else(memwall::api::default_model_path);
    let prompt = rest.next().map_or("The three primary colors are", |s| s);

    let model = ModelConfig::new(&path).n_ctx(1024).load()?;
    eprintln!("device: {}", model.device_name());
    let mut session = model.session()?;
    session.set_max_tokens(48);
    // Clone this into another thread (a UI's stop button) to end the generation early.
    let _cancel = session.cancel_handle();

    let stream = if chat {
        session.chat(&[ChatMessage::new("user", prompt)])?
    } else {
        print!("{prompt}");
        session.prompt(prompt)?
    };
    for event in stream {
        match event? {
            Event::Done(done) => println!(
                "\n[{} tokens, stop: {:?}, prefill {:.1} tok/s, decode {:.1} tok/s, on {}]",
                done.generated_ids.len(),
                done.stop,
                done.timings.prefill_tps,
                done.timings.decode_tps,
                done.device
            ),
            Event::Placement(p) => eprintln!("\n[moved: decode {}]", p.decode.compact()),
            Event::DeviceFallback(f) => eprintln!("\n[{f}]"),
            other => {
                print!("{}", other.text());
                let _ = std::io::stdout().flush();
            }
        }
    }
    Ok(())
}
