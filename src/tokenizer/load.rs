//! Building a [`Tokenizer`] from GGUF metadata, following llama.cpp's `llama_vocab::impl::load`:
//! vocabulary type defaults, the pre-tokenizer table, special token ids, the text-based
//! auto-detection of end-of-generation and fill-in-the-middle tokens, and per-token attributes.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};

use super::pretok::{self, PreTokenizer};
use super::special::SpecialIndex;
use super::vocab::{FxBuild, Vocab};
use super::{attr, Kind, Tokenizer};
use crate::gguf::Gguf;
use crate::{Error, Result};

/// What a `tokenizer.ggml.pre` name selects.
struct PreConfig {
    exprs: &'static [&'static str],
    clean_spaces: bool,
    ignore_merges: bool,
    /// Forces add_bos to true before metadata is consulted.
    add_bos: bool,
}

/// Gemma 4's: spaces are already `▁`, so only runs of newlines are split from the rest.
const GEMMA4_EXPRS: &[&str] = &["[^\\n]+|[\\n]+"];

const DEFAULT_EXPRS: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    pretok::GPT2,
    r"\p{N}+",
    "[0-9][0-9][0-9]",
];

/// The pre-tokenizer for `name` (None when unknown), as llama.cpp maps it.
fn pre_config(name: &str) -> Option<PreConfig> {
    let c = |exprs, clean_spaces, ignore_merges, add_bos| PreConfig {
        exprs,
        clean_spaces,
        ignore_merges,
        add_bos,
    };
    const LLAMA3: &[&str] = &[pretok::LLAMA3];
    const GPT2: &[&str] = &[pretok::GPT2];
    const STARCODER: &[&str] = &[r"\p{N}", pretok::GPT2];
    const QWEN2: &[&str] = &[pretok::QWEN2];
    Some(match name {
        "default" => c(DEFAULT_EXPRS, true, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => c(LLAMA3, true, true, true),
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => c(LLAMA3, true, false, false),
        "deepseek-coder" => c(
            &[
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
            false,
            false,
        ),
        "deepseek-llm" => c(
            &[
                "[\\r\\n]",
                "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\
                \u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\
                \u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\
                \u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\
                \u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\
                \u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\
                \u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\
                \u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\
                \u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\
                \u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\
                \u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\
                \u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\
                \u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\
                \u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\
                \u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\
                \u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\
                \u{1E900}-\u{1E943}]+",
                "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]\
                +",
                "\\s+$",
                "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
                "\\p{N}+",
            ],
            false,
            false,
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => c(
            &[r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", pretok::DEEPSEEK3],
            false,
            false,
            false,
        ),
        "falcon" => c(
            &[r"[\p{P}\$\+<=>\^~\|`]+", pretok::GPT2, "[0-9][0-9][0-9]"],
            true,
            false,
            false,
        ),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            c(STARCODER, true, false, false)
        }
        "command-r" | "smollm" => c(STARCODER, false, false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "mpt" | "olmo" | "jais" | "exaone4" => c(GPT2, true, false, false),
        "trillion" | "granite-docling" => c(GPT2, false, false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => c(QWEN2, false, false, false),
        "stablelm2" | "megrez" => c(QWEN2, true, false, false),
        "qwen35" => c(&[pretok::QWEN35], false, false, false),
        "gemma4" | "granite-embed-multi-311m" => c(GEMMA4_EXPRS, true, false, false),
        "seed-coder" => c(&[pretok::SEED_CODER], false, false, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => c(&[pretok::BAILINGMOE], false, false, false),
        "minicpm5" => c(&[r"\p{N}{1,3}", pretok::MINICPM5], true, true, false),
        "poro-chat" => c(&[pretok::PORO], false, false, false),
        "bloom" | "gpt3-finnish" => c(&[pretok::PORO], true, false, false),
        "viking" => c(&[pretok::PORO, r"\p{N}"], false, false, false),
        "tekken" => c(&[pretok::TEKKEN], false, true, true),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
            c(&[pretok::GPT4O], false, false, false)
        }
        _ => return None,
    })
}

/// Token texts llama.cpp treats as end of generation whatever their type.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Metadata keys of special ids that llama.cpp finds by text when absent, with those texts.
const DETECTED: &[(&str, &[&str])] = &[
    (
        "tokenizer.ggml.eot_token_id",
        &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ],
    ),
    ("tokenizer.ggml.eom_token_id", &["<|eom_id|>"]),
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// A string value, `None` when the key is absent.
fn opt_str<'g>(g: &'g Gguf, key: &str) -> Result<Option<&'g str>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(g.get_str(key)?))
}

/// A special id from metadata, if present and inside the vocabulary.
fn meta_id(g: &Gguf, key: &str, n: usize, warnings: &mut Vec<String>) -> Result<Option<u32>> {
    match g.opt(key, Gguf::get_u32)? {
        Some(id) if (id as usize) < n => Ok(Some(id)),
        Some(id) => {
            warnings.push(format!("{key} = {id} is outside the vocabulary; ignored"));
            Ok(None)
        }
        None => Ok(None),
    }
}

pub(super) fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
    let mut warnings = Vec::new();
    let model = g.get_str("tokenizer.ggml.model")?;
    let kind = match model {
        "llama" => Kind::Spm,
        // gemma4: BPE merges over SentencePiece-style text (see `Tokenizer::spm_bpe`).
        "gpt2" | "gemma4" => Kind::Bpe,
        other => {
            return Err(Error::Tokenizer(format!(
                "tokenizer model {other:?} is not supported (only \"llama\", \"gpt2\" and \
                 \"gemma4\")"
            )))
        }
    };

    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    let n = tokens.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(Error::Tokenizer(format!("vocabulary of {n} tokens")));
    }
    let scores = match g.opt("tokenizer.ggml.scores", Gguf::get_f32_array)? {
        Some(s) if s.len() >= n => s,
        Some(s) => {
            return Err(Error::Tokenizer(format!(
                "{} scores for {n} tokens",
                s.len()
            )))
        }
        None => vec![0.0; n],
    };
    let types = match g.opt("tokenizer.ggml.token_type", Gguf::get_i64_array)? {
        Some(t) if t.len() >= n => Some(t),
        Some(t) => {
            return Err(Error::Tokenizer(format!(
                "{} token types for {n} tokens",
                t.len()
            )))
        }
        None => None,
    };

    let texts: Vec<Cow<str>> = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if t.is_empty() {
                warnings.push(format!("empty token at index {i}"));
                Cow::Owned(format!("[EMPTY_{i}]"))
            } else {
                Cow::Borrowed(t)
            }
        })
        .collect();
    let (vocab, repeats) = Vocab::new(texts.iter().map(|t| t.as_ref()));
    drop(texts);
    for i in repeats {
        warnings.push(format!(
            "duplicate token {:?} at index {i}; first one kept",
            vocab.text(i)
        ));
    }
    let mut attrs: Vec<u16> = (0..n)
        .map(|i| match types.as_ref().map(|t| t[i]) {
            None | Some(1) => attr::NORMAL,
            Some(2) => attr::UNKNOWN,
            Some(3) => attr::CONTROL,
            Some(4) => attr::USER_DEFINED,
            Some(5) => attr::UNUSED,
            Some(6) => attr::BYTE,
            Some(_) => attr::UNDEFINED,
        })
        .collect();

    // Type defaults, then the pre-tokenizer (BPE only), then metadata overrides.
    let mut clean_spaces = false;
    let mut ignore_merges = false;
    let mut spm_bpe = false;
    let (mut add_bos, mut bos, mut eos, unk, pre, merges);
    match kind {
        Kind::Spm => {
            (add_bos, bos, eos, unk) = (true, Some(1), Some(2), Some(0));
            pre = None;
            merges = HashMap::default();
        }
        Kind::Bpe => {
            (add_bos, bos, eos, unk) = (false, Some(11), Some(11), None);
            let mut name = opt_str(g, "tokenizer.ggml.pre")?;
            if model == "gemma4" {
                // llama.cpp sets the pre-tokenizer of this model itself, and no default ids.
                name = Some("gemma4");
                (bos, eos) = (None, None);
            }
            let cfg = match name {
                None => {
                    warnings.push("missing tokenizer.ggml.pre; using 'default'".into());
                    None
                }
                Some(name) => {
                    let cfg = pre_config(name);
                    if cfg.is_none() {
                        warnings.push(format!(
                            "unknown pre-tokenizer {name:?}; using 'default' (tokenization \
                             may differ from the model's)"
                        ));
                    }
                    if matches!(name, "glm4" | "chatglm-bpe") {
                        bos = None;
                    }
                    cfg
                }
            }
            .unwrap_or(PreConfig {
                exprs: DEFAULT_EXPRS,
                clean_spaces: true,
                ignore_merges: false,
                add_bos: false,
            });
            clean_spaces = cfg.clean_spaces;
            ignore_merges = cfg.ignore_merges;
            spm_bpe = cfg.exprs == GEMMA4_EXPRS;
            add_bos |= cfg.add_bos;
            pre = Some(PreTokenizer::new(cfg.exprs)?);
            let lines = g.get_str_array("tokenizer.ggml.merges")?;
            let mut m = HashMap::with_capacity_and_hasher(lines.len(), FxBuild::default());
            for (rank, line) in lines.iter().enumerate() {
                // llama.cpp splits at the first space after the first byte; a line without one
                // becomes the pair ("", "") and can never match.
                if line.bytes().skip(1).any(|b| b == b' ') {
                    m.entry(line.to_string()).or_insert(rank as u32);
                }
            }
            merges = m;
        }
    }
    let mut add_space_prefix = kind == Kind::Spm;
    if let Some(v) = g.opt("tokenizer.ggml.add_space_prefix", Gguf::get_bool)? {
        add_space_prefix = v;
    }
    // Default ids that fall outside the vocabulary are disabled, as llama.cpp does.
    let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    let (mut bos, mut eos, mut unk) = (in_vocab(bos), in_vocab(eos), in_vocab(unk));
    if let Some(id) = meta_id(g, "tokenizer.ggml.bos_token_id", n, &mut warnings)? {
        bos = Some(id);
    }
    if let Some(id) = meta_id(g, "tokenizer.ggml.eos_token_id", n, &mut warnings)? {
        eos = Some(id);
    }
    if let Some(id) = meta_id(g, "tokenizer.ggml.unknown_token_id", n, &mut warnings)? {
        unk = Some(id);
    }
    if let Some(v) = g.opt("tokenizer.ggml.add_bos_token", Gguf::get_bool)? {
        add_bos = v;
    }
    // llama.cpp adds Gemma 4's BOS whatever the metadata says.
    add_bos |= spm_bpe;
    let add_eos = g
        .opt("tokenizer.ggml.add_eos_token", Gguf::get_bool)?
        .unwrap_or(false);
    if add_bos && bos.is_none() {
        return Err(Error::Tokenizer(
            "add_bos_token is true but there is no BOS token".into(),
        ));
    }
    if add_eos && eos.is_none() {
        return Err(Error::Tokenizer(
            "add_eos_token is true but there is no EOS token".into(),
        ));
    }

    // eot, eom and the FIM ids: from metadata, else found by text (and then forced to control).
    let mut detected = Vec::with_capacity(DETECTED.len());
    for (key, names) in DETECTED {
        let mut id = meta_id(g, key, n, &mut warnings)?;
        if id.is_none() {
            // The lowest id among the texts the vocabulary has.
            id = names.iter().filter_map(|t| vocab.id(t)).min();
            if let Some(i) = id {
                attrs[i as usize] |= attr::CONTROL;
            }
        }
        detected.push(id);
    }
    let (eot, eom) = (detected[0], detected[1]);

    // Control tokens named "unused" are unused.
    for (i, a) in attrs.iter_mut().enumerate() {
        if *a & attr::CONTROL != 0 && vocab.text(i as u32).contains("unused") {
            *a |= attr::UNUSED;
        }
    }

    // End of generation: FIM pad/repo/sep, the known texts, eos, eot, eom.
    let mut eog: BTreeSet<u32> = detected[5..].iter().flatten().copied().collect();
    for i in EOG_TEXTS.iter().filter_map(|t| vocab.id(t)) {
        eog.insert(i);
        attrs[i as usize] |= attr::CONTROL;
    }
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(i) = vocab.id(t) {
            attrs[i as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    let has = |eog: &BTreeSet<u32>, s: &str| eog.iter().any(|&i| vocab.text(i) == s);
    // gpt-oss and solar-open end a message with <|end|> but do not stop there.
    if (has(&eog, "<|return|>") || has(&eog, "<|flush|>"))
        && (has(&eog, "<|call|>") || has(&eog, "<|calls|>"))
    {
        if let Some(&end) = eog.iter().find(|&&i| vocab.text(i) == "<|end|>") {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    if has(&eog, "<|tool_response>") {
        if let Some(&s) = eog.iter().find(|&&i| vocab.text(i) == "</s>") {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }
    }

    // Special tokens, longest text first: the order in which they are split out of raw text.
    let mut special: Vec<u32> = (0..n as u32)
        .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
        .collect();
    special.sort_by_key(|&i| std::cmp::Reverse(vocab.text(i).len()));

    // Per-model attributes llama.cpp sets by name.
    let model_name = opt_str(g, "general.name")?.unwrap_or("").to_lowercase();
    let pre_name = opt_str(g, "tokenizer.ggml.pre")?.unwrap_or("");
    let arch = opt_str(g, "general.architecture")?.unwrap_or("");
    let id = |s: &str| vocab.id(s).map(|i| i as usize);
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
        .iter()
        .any(|p| pre_name.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"]
            .iter()
            .any(|p| arch.contains(p))
    {
        if let Some(i) = id("<mask>") {
            attrs[i] |= attr::LSTRIP;
        }
    } else if model_name.contains("phi-3") || model_name.contains("phi3") {
        for &i in &special {
            attrs[i as usize] |= attr::RSTRIP;
        }
        if let Some(i) = id("</s>") {
            attrs[i] |= attr::RSTRIP;
        }
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(i) = id(t) {
                attrs[i] &= !attr::RSTRIP;
            }
        }
    } else if model_name.contains("modern-bert") {
        if let Some(i) = id("[MASK]") {
            attrs[i] |= attr::LSTRIP;
        }
    }

    let special_index = SpecialIndex::new(&vocab, &special);
    Ok(Tokenizer {
        kind,
        vocab,
        scores,
        attrs,
        merges,
        pre,
        special_index,
        special,
        bos,
        eos,
        unk,
        eog,
        add_bos,
        add_eos,
        add_space_prefix,
        ignore_merges,
        spm_bpe,
        clean_spaces,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_tokenizer_compiles() {
        let names = [
            "default",
            "llama-bpe",
            "dbrx",
            "deepseek-coder",
            "deepseek-llm",
            "deepseek-v3",
            "falcon",
            "starcoder",
            "smollm",
            "gpt-2",
            "trillion",
            "qwen2",
            "stablelm2",
            "qwen35",
            "gemma4",
            "seed-coder",
            "bailingmoe",
            "minicpm5",
            "poro-chat",
            "bloom",
            "viking",
            "tekken",
            "gpt-4o",
        ];
        for name in names {
            let cfg = pre_config(name).unwrap();
            let pre = PreTokenizer::new(cfg.exprs).unwrap_or_else(|e| panic!("{name}: {e}"));
            let text = "Hello world's 12345 ünïcödé 你好 🙂\n\n  x";
            assert_eq!(pre.split(text).concat(), text, "{name} loses text");
        }
        assert!(pre_config("no-such-thing").is_none());
    }
}
