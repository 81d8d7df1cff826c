//! `memwall inspect`: a readable summary of a GGUF file (metadata, tensors, totals by type).

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::gguf::{Gguf, Value};
use crate::GgmlType;

/// Strings longer than this (chat templates) are cut in the listing.
const MAX_STRING_CHARS: usize = 120;

/// Writes the `inspect` text for `g` to `out`.
pub fn inspect(g: &Gguf, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "GGUF v{}, {} bytes, alignment {}, data at offset {}",
        g.version(),
        g.file_len(),
        g.alignment(),
        g.data_offset()
    )?;
    writeln!(out, "\nmetadata ({} keys):", g.metadata().len())?;
    for (k, v) in g.metadata() {
        writeln!(out, "  {k} = {}", show_value(v))?;
    }

    let tensors = g.tensors();
    writeln!(out, "\ntensors ({}):", tensors.len())?;
    let name_w = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "  {:<name_w$}  {:<7}  {:<24}  {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    let mut total_params = 0u64;
    let mut total_bytes = 0u64;
    for t in tensors {
        let shape = format!("{:?}", t.dims);
        writeln!(
            out,
            "  {:<name_w$}  {:<7}  {:<24}  {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.n_bytes
        )?;
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(t.n_bytes);
        e.2 = e.2.saturating_add(t.n_elements);
        total_params = total_params.saturating_add(t.n_elements);
        total_bytes = total_bytes.saturating_add(t.n_bytes);
    }

    writeln!(out, "\ntotals by type:")?;
    for (ty, (count, bytes, params)) in &by_type {
        writeln!(
            out,
            "  {:<7}  {count:>6} tensors  {bytes:>14} bytes  {params:>14} params",
            ty.name()
        )?;
    }
    writeln!(
        out,
        "  {:<7}  {:>6} tensors  {total_bytes:>14} bytes  {total_params:>14} params",
        "all",
        tensors.len()
    )?;
    writeln!(
        out,
        "\ntotal parameters: {total_params} ({})",
        human_count(total_params)
    )?;
    // What the engine makes of the file: the architecture's differences from llama, or why
    // it would refuse it (with the supported list).
    match crate::config::Config::from_gguf(g) {
        Ok(c) => {
            writeln!(out, "\narchitecture {}:", c.arch)?;
            for line in c.differences() {
                writeln!(out, "  {line}")?;
            }
            // Fusions of the file that `Config::unfuse` reads as row ranges.
            if g.tensor("blk.0.attn_qkv.weight").is_some() {
                writeln!(
                    out,
                    "  Q, K and V stored fused (attn_qkv), read as row ranges"
                )?;
            }
            let stacked = g
                .tensor("blk.0.ffn_up.weight")
                .is_some_and(|t| t.n_rows() == 2 * c.n_ff as u64);
            if stacked && g.tensor("blk.0.ffn_gate.weight").is_none() {
                writeln!(out, "  gate and up stacked in ffn_up, read as row ranges")?;
            }
        }
        Err(e) => writeln!(out, "\narchitecture: {e}")?,
    }
    Ok(())
}

/// The `inspect` text as a string.
pub fn inspect_to_string(g: &Gguf) -> String {
    let mut v = Vec::new();
    // Writing to a Vec cannot fail; the text is built from Rust strings, so it is UTF-8.
    if inspect(g, &mut v).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&v).into_owned()
}

/// A value for the listing: long strings cut, arrays abbreviated by `Value`'s Display.
fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > MAX_STRING_CHARS => {
            let head: String = s.chars().take(MAX_STRING_CHARS).collect();
            format!("{head:?}... ({} bytes)", s.len())
        }
        v => v.to_string(),
    }
}

/// 134515008 -> "134.5M".
fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::GgufWriter;
    use crate::gguf::ValueType;

    #[test]
    fn lists_metadata_tensors_and_totals() {
        let long = "x".repeat(500);
        let toks: Vec<Value> = (0..10).map(|i| Value::String(format!("t{i}"))).collect();
        let w = GgufWriter::new()
            .metadata("general.architecture", Value::String("llama".into()))
            .metadata("tmpl", Value::String(long))
            .metadata("toks", Value::Array(ValueType::String, toks))
            .tensor("a", GgmlType::Q8_0, &[64, 2], vec![0u8; 4 * 34])
            .tensor("b", GgmlType::Q8_0, &[32], vec![0u8; 34])
            .tensor_f32("norm", &[3], &[1.0, 2.0, 3.0]);
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        let s = inspect_to_string(&g);
        assert!(s.contains("general.architecture = \"llama\""), "{s}");
        assert!(s.contains("... (500 bytes)"), "{s}");
        assert!(s.contains("toks = [10 x string: \"t0\", \"t1\", \"t2\", \"t3\", \"t4\", ...]"));
        assert!(s.contains("[64, 2]"), "{s}");
        // a has 4 Q8_0 blocks (136 bytes), b has 1 (34): 170 bytes and 160 params in all.
        let q8 = s
            .lines()
            .find(|l| l.trim_start().starts_with("Q8_0 "))
            .unwrap();
        let nums: Vec<&str> = q8.split_whitespace().collect();
        assert_eq!(
            nums,
            ["Q8_0", "2", "tensors", "170", "bytes", "160", "params"]
        );
        assert!(s.contains("total parameters: 163 (163)"), "{s}");
        // Not a model memwall can run: the reason is named.
        assert!(s.contains("\narchitecture: "), "{s}");
    }

    #[test]
    fn names_the_architectures_differences() {
        let key = |k: &str| format!("qwen3.{k}");
        let mut w = GgufWriter::new()
            .metadata("general.architecture", Value::String("qwen3".into()))
            .metadata(key("block_count"), Value::U32(1))
            .metadata(key("context_length"), Value::U32(64))
            .metadata(key("embedding_length"), Value::U32(64))
            .metadata(key("feed_forward_length"), Value::U32(96))
            .metadata(key("attention.head_count"), Value::U32(4))
            .metadata(key("attention.head_count_kv"), Value::U32(2))
            .metadata(key("attention.key_length"), Value::U32(32))
            .metadata(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
            .tensor_f32("token_embd.weight", &[64, 2], &[0.0; 128]);
        w = w.tensor_f32("blk.0.attn_q_norm.weight", &[32], &[1.0; 32]);
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        let s = inspect_to_string(&g);
        assert!(s.contains("architecture qwen3:"), "{s}");
        assert!(
            s.contains("1 blocks, width 64, 4 heads of 32, grouped-query attention (2 KV heads)")
        );
        assert!(s.contains("head size 32 from attention.key_length (not width / heads = 16)"));
        assert!(s.contains("RoPE: NeoX pairs"), "{s}");
        assert!(
            s.contains("per-head RMS norms of Q and K before RoPE"),
            "{s}"
        );
        assert!(s.contains("output head tied to the token embedding"), "{s}");
    }

    #[test]
    fn human_counts() {
        assert_eq!(human_count(134_515_008), "134.5M");
        assert_eq!(human_count(7_000_000_000), "7.00B");
        assert_eq!(human_count(999), "999");
    }
}
