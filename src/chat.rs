//! Chat templates: renders a model's `tokenizer.chat_template` (Jinja) with minijinja.
