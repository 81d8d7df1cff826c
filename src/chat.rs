//! Chat templates: renders a model's `tokenizer.chat_template` (Jinja) with minijinja, the way
//! Hugging Face's `apply_chat_template` does (`trim_blocks` and `lstrip_blocks` on, Python string
//! methods such as `.strip()` available, `raise_exception` defined).

use minijinja::{context, Environment, ErrorKind, Value};
use serde::Serialize;

use crate::gguf::Gguf;
use crate::{Error, Result};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The model's chat template, if its metadata has one.
pub fn template_from_gguf(g: &Gguf) -> Option<String> {
    g.get_str("tokenizer.chat_template")
        .ok()
        .map(str::to_string)
}

/// The template's `raise_exception(msg)`: fails the render with `msg`.
fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// Renders `g_template` for `messages`. `add_generation_prompt` asks the template to end with
/// the start of an assistant turn; `bos_token` and `eos_token` are the texts templates may
/// insert themselves.
pub fn apply_chat_template(
    g_template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let err = |e: minijinja::Error| {
        // Include the cause chain (e.g. the message given to raise_exception).
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        Error::ChatTemplate(msg)
    };
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    let tmpl = env.template_from_str(g_template).map_err(err)?;
    tmpl.render(context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_methods_and_exceptions() {
        let t =
            "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no ' + m.role) }}\
                 {% endif %}[{{ m.content.strip() }}]{% endfor %}";
        let msgs = [ChatMessage::new("user", "  hi  ")];
        assert_eq!(
            apply_chat_template(t, &msgs, false, "", "").unwrap(),
            "[hi]"
        );
        let e = apply_chat_template(t, &[ChatMessage::new("bad", "x")], false, "", "").unwrap_err();
        assert!(
            matches!(&e, Error::ChatTemplate(m) if m.contains("no bad")),
            "{e}"
        );
        let e = apply_chat_template("{% for %}", &msgs, false, "", "").unwrap_err();
        assert!(matches!(e, Error::ChatTemplate(_)));
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        // trim_blocks drops the newline after a tag; lstrip_blocks the indentation before it.
        let t = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}|\n    {% endif %}\n{% endfor %}";
        let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert_eq!(
            apply_chat_template(t, &msgs, false, "", "").unwrap(),
            "a|\nb|\n"
        );
    }
}
