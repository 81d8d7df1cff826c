//! Requantization: a GGUF's weight matrices rewritten in another format, so the CPU path can be
//! compared with llama.cpp on the same model in Q4_0, Q4_1 or Q8_0 (`memwall quantize`).
//!
//! Every 2-D quantized or float matrix is dequantized with kernels-ref and quantized again with
//! kernels-ref's quantizer for the target type (as `llama-quantize --pure` does, the embedding
//! included); 1-D tensors (norms, biases) and the metadata are copied unchanged, except
//! `general.file_type`, which is set to the target's llama.cpp file type where one exists.
//! Requantizing an already quantized model adds the target format's rounding to the source's.

use std::path::Path;

use kernels_ref::GgmlType;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gguf::writer::GgufWriter;
use crate::gguf::{Gguf, Value, ALIGNMENT_KEY};

const FILE_TYPE_KEY: &str = "general.file_type";

/// What `requantize` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequantSummary {
    /// Matrices converted to the target type.
    pub converted: usize,
    /// Tensors copied unchanged.
    pub copied: usize,
    pub file_bytes: u64,
}

/// llama.cpp's `general.file_type` for a model whose matrices are all `ty`.
fn file_type(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::F32 => Some(0),
        GgmlType::F16 => Some(1),
        GgmlType::Q4_0 => Some(2),
        GgmlType::Q4_1 => Some(3),
        GgmlType::Q8_0 => Some(7),
        GgmlType::Q5_0 => Some(8),
        GgmlType::Q5_1 => Some(9),
        _ => None,
    }
}

/// Parses a target type name (q4_0, q4_1, q5_0, q5_1, q8_0, f16, f32).
pub fn parse_target(s: &str) -> Result<GgmlType> {
    let ty = match s.trim().to_lowercase().as_str() {
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q5_0" => GgmlType::Q5_0,
        "q5_1" => GgmlType::Q5_1,
        "q8_0" => GgmlType::Q8_0,
        "f16" => GgmlType::F16,
        "f32" => GgmlType::F32,
        other => {
            return Err(Error::InvalidArgument(format!(
                "target type {other:?} is not one quantize writes (q4_0, q4_1, q5_0, q5_1, q8_0, f16, f32)"
            )))
        }
    };
    Ok(ty)
}

/// Dequantizes one matrix ([rows][ne0] of `ty`) and quantizes it to `target`, rows in parallel.
fn convert(name: &str, ty: GgmlType, data: &[u8], ne0: usize, target: GgmlType) -> Result<Vec<u8>> {
    let bad = |msg: String| Error::Tensor {
        name: name.to_string(),
        msg,
    };
    let rb = ty
        .row_bytes(ne0 as u64)
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b > 0 && data.len().is_multiple_of(b))
        .ok_or_else(|| bad(format!("rows of {ne0} {ty} values do not tile its data")))?;
    let rows: Vec<Vec<u8>> = data
        .par_chunks(rb)
        .map(|row| {
            let x = kernels_ref::dequantize_vec(ty, row, ne0).map_err(|e| bad(e.to_string()))?;
            kernels_ref::quantize(target, &x).map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<_>>()?;
    Ok(rows.concat())
}

/// Writes `src`'s model to `out` with every matrix in `target`.
pub fn requantize(src: &Path, out: &Path, target: GgmlType) -> Result<RequantSummary> {
    let g = Gguf::open(src)?;
    let ft = file_type(target);
    let mut w = GgufWriter::new().version(g.version());
    for (k, v) in g.metadata() {
        if k == ALIGNMENT_KEY || (k == FILE_TYPE_KEY && ft.is_some()) {
            continue;
        }
        w = w.metadata(k.clone(), v.clone());
    }
    if let Some(ft) = ft {
        w = w.metadata(FILE_TYPE_KEY, Value::U32(ft));
    }
    w = w.alignment(u32::try_from(g.alignment()).map_err(|_| {
        Error::InvalidArgument(format!("alignment {} does not fit u32", g.alignment()))
    })?);
    let (mut converted, mut copied) = (0, 0);
    for t in g.tensors() {
        let data = g.tensor_data(t);
        let ne0 = t.ne0() as usize;
        let is_matrix = t.dims.len() >= 2 && t.n_rows() > 1;
        if is_matrix && t.ty != target && target.row_bytes(ne0 as u64).is_some() {
            let q = convert(&t.name, t.ty, data, ne0, target)?;
            w = w.tensor(t.name.clone(), target, &t.dims, q);
            converted += 1;
        } else {
            w = w.tensor(t.name.clone(), t.ty, &t.dims, data.to_vec());
            copied += 1;
        }
    }
    let file_bytes = w.write_to(out)?;
    Ok(RequantSummary {
        converted,
        copied,
        file_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny synthetic Q4_1 model requantized to Q8_0: every matrix changes type and keeps
    /// its values within Q8_0's rounding, the norms are copied byte for byte.
    #[test]
    fn q4_1_model_to_q8_0() {
        use crate::tools::bench::synth::{write_synth, Preset, SynthOptions};
        let dir = std::env::temp_dir().join(format!("memwall-requant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        let o = SynthOptions::new(Preset::Tiny, Some(1), GgmlType::Q4_1, 7);
        write_synth(&a, &o, &mut |_, _| {}).unwrap();
        let s = requantize(&a, &b, GgmlType::Q8_0).unwrap();
        let (ga, gb) = (Gguf::open(&a).unwrap(), Gguf::open(&b).unwrap());
        assert_eq!(ga.tensors().len(), gb.tensors().len());
        assert!(s.converted > 0 && s.copied > 0);
        for (ta, tb) in ga.tensors().iter().zip(gb.tensors()) {
            assert_eq!((&ta.name, &ta.dims), (&tb.name, &tb.dims));
            let (da, db) = (ga.tensor_data(ta), gb.tensor_data(tb));
            if ta.dims.len() < 2 {
                assert_eq!((ta.ty, da), (tb.ty, db), "{}", ta.name);
                continue;
            }
            assert_eq!(tb.ty, GgmlType::Q8_0, "{}", ta.name);
            let n = ta.n_elements as usize;
            let xa = kernels_ref::dequantize_vec(ta.ty, da, n).unwrap();
            let xb = kernels_ref::dequantize_vec(tb.ty, db, n).unwrap();
            for (blk_a, blk_b) in xa.chunks(32).zip(xb.chunks(32)) {
                // Half a step of d = amax / 127, plus the f16 rounding of d (2^-11 relative)
                // times |q| <= 127.
                let amax = blk_a.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = amax / 127.0 * 0.5 + amax / 1024.0 + 1e-6;
                for (u, v) in blk_a.iter().zip(blk_b) {
                    assert!((u - v).abs() <= tol, "{}: {u} vs {v}", ta.name);
                }
            }
        }
        assert_eq!(gb.get_u32("general.file_type").ok(), Some(7));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parse_target_names() {
        assert_eq!(parse_target("Q8_0").unwrap(), GgmlType::Q8_0);
        assert!(parse_target("q3_k").is_err());
    }
}
