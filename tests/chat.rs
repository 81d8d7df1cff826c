//! Chat templates: the test model's own template and a Llama-3-style one.

use std::path::PathBuf;

use memwall::chat::{apply_chat_template, template_from_gguf, ChatMessage};
use memwall::gguf::Gguf;
use memwall::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    match std::env::var_os("MEMWALL_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var("HOME").expect("HOME"))
            .join(".cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

#[test]
fn smollm_template_adds_default_system_prompt() {
    let g = Gguf::open(model_path()).expect("test model missing: set MEMWALL_MODEL");
    let tmpl = template_from_gguf(&g).expect("the model has a chat template");
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let bos = tok.token_text(tok.bos().unwrap()).to_string();
    let eos = tok.token_text(tok.eos().unwrap()).to_string();
    let msgs = [ChatMessage::new("user", "What is 2+2?")];
    let out = apply_chat_template(&tmpl, &msgs, true, &bos, &eos).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without the generation prompt the assistant header is absent.
    let out2 = apply_chat_template(&tmpl, &msgs, false, &bos, &eos).unwrap();
    assert_eq!(out2, out.strip_suffix("<|im_start|>assistant\n").unwrap());
    // A given system message replaces the default one.
    let msgs = [
        ChatMessage::new("system", "Be terse."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello."),
    ];
    let out = apply_chat_template(&tmpl, &msgs, false, &bos, &eos).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n"
    );
    // The rendered prompt tokenizes with the control tokens recognised.
    let ids = tok.encode(&out, true, true);
    assert_eq!(ids[0], tok.id_of("<|im_start|>").unwrap());
    assert_eq!(ids.iter().filter(|&&i| tok.is_eog(i)).count(), 3);
}

const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

#[test]
fn llama3_style_template() {
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "  Hi there \n"),
    ];
    let out = apply_chat_template(LLAMA3, &msgs, true, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}
