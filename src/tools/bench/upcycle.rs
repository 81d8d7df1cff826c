//! Upcycling: a dense llama-architecture GGUF turned into a mixture of experts (Mixtral's
//! layout: `llama.expert_count`, a router `ffn_gate_inp` and the stacked `ffn_*_exps` tensors
//! per block), so the MoE path can be checked on real text against the dense model and
//! against llama.cpp without a real MoE download (`memwall upcycle`).
//!
//! Every expert starts as the block's dense feed-forward. With identical experts the mixture
//! equals the dense model (the kept weights are normalized to sum 1), whatever the router.
//! With distinct experts, expert e's matrices round-trip through another format (Q4_0, Q5_0,
//! Q8_0, Q4_1 in turn) and its down projection is scaled by a factor between 0.7 and 1.3, so
//! which experts a token picks changes the result: the router decides.
//!
//! The output is built in memory (it is a test tool for small models).

use std::path::Path;

use kernels_ref::GgmlType;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gguf::writer::GgufWriter;
use crate::gguf::{Gguf, TensorInfo, Value, ALIGNMENT_KEY};

/// How to upcycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpcycleOptions {
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Experts differ (see the module comment); else each is a byte copy of the dense one.
    pub distinct: bool,
    /// Seeds the router's random weights.
    pub seed: u64,
}

/// What `upcycle` wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UpcycleSummary {
    pub n_layer: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// The experts' storage type (the dense feed-forward's).
    pub expert_type: String,
    pub file_bytes: u64,
}

/// The formats distinct experts round-trip through, expert e taking entry e % 4.
const THROUGH: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_1,
];

/// The factor expert e of `n` scales its down projection by: 0.7 to 1.3, evenly.
fn down_scale(e: usize, n: usize) -> f32 {
    if n < 2 {
        return 1.0;
    }
    0.7 + 0.6 * e as f32 / (n - 1) as f32
}

/// A dense matrix (`t`'s values, rows of `ne0`) as expert e stores it: a byte copy, or
/// dequantized, round-tripped, scaled and quantized back to `t`'s type.
fn expert_bytes(g: &Gguf, t: &TensorInfo, e: usize, o: &UpcycleOptions) -> Result<Vec<u8>> {
    let data = g.tensor_data(t);
    if !o.distinct {
        return Ok(data.to_vec());
    }
    let bad = |msg: String| Error::Tensor {
        name: t.name.clone(),
        msg,
    };
    let ne0 = t.ne0() as usize;
    let rb =
        t.ty.row_bytes(ne0 as u64)
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b > 0 && data.len().is_multiple_of(b))
            .ok_or_else(|| {
                bad(format!(
                    "rows of {ne0} {} values do not tile its data",
                    t.ty
                ))
            })?;
    let through = THROUGH[e % THROUGH.len()];
    let scale = if t.name.ends_with("ffn_down.weight") {
        down_scale(e, o.n_expert)
    } else {
        1.0
    };
    let rows: Vec<Vec<u8>> = data
        .par_chunks(rb)
        .map(|row| {
            let q = |ty, x: &[f32]| kernels_ref::quantize(ty, x).map_err(|e| bad(e.to_string()));
            let dq = |ty, b: &[u8]| {
                kernels_ref::dequantize_vec(ty, b, ne0).map_err(|e| bad(e.to_string()))
            };
            let mut x = dq(through, &q(through, &dq(t.ty, row)?)?)?;
            x.iter_mut().for_each(|v| *v *= scale);
            q(t.ty, &x)
        })
        .collect::<Result<_>>()?;
    Ok(rows.concat())
}

/// Writes `src`'s llama-architecture model to `out` with every block's feed-forward made
/// `o.n_expert` experts of which each token uses `o.n_expert_used`.
pub fn upcycle(src: &Path, out: &Path, o: &UpcycleOptions) -> Result<UpcycleSummary> {
    if o.n_expert == 0 || o.n_expert_used == 0 || o.n_expert_used > o.n_expert {
        return Err(Error::InvalidArgument(format!(
            "{} experts of which {} used per token",
            o.n_expert, o.n_expert_used
        )));
    }
    let g = Gguf::open(src)?;
    let arch = g.get_str("general.architecture")?.to_string();
    if !matches!(arch.as_str(), "llama" | "mistral") {
        return Err(Error::InvalidArgument(format!(
            "upcycling needs a llama or mistral model (experts in Mixtral's layout), not {arch}"
        )));
    }
    let expert_key = format!("{arch}.expert_count");
    if g.get(&expert_key).is_some() {
        return Err(Error::InvalidArgument(format!(
            "{} already has experts ({expert_key})",
            src.display()
        )));
    }
    let n_embd = g.get_u32(&format!("{arch}.embedding_length"))? as usize;
    let n_layer = g.get_u32(&format!("{arch}.block_count"))? as usize;
    let mut w = GgufWriter::new().version(g.version());
    for (k, v) in g.metadata() {
        if k == ALIGNMENT_KEY {
            continue;
        }
        w = w.metadata(k.clone(), v.clone());
    }
    w = w
        .metadata(expert_key, Value::U32(o.n_expert as u32))
        .metadata(
            format!("{arch}.expert_used_count"),
            Value::U32(o.n_expert_used as u32),
        )
        .alignment(u32::try_from(g.alignment()).map_err(|_| {
            Error::InvalidArgument(format!("alignment {} does not fit u32", g.alignment()))
        })?);
    let mut expert_type = None;
    for t in g.tensors() {
        let stacked = ["ffn_gate", "ffn_up", "ffn_down"]
            .iter()
            .find(|p| t.name.ends_with(&format!(".{p}.weight")) && t.name.starts_with("blk."));
        let Some(part) = stacked else {
            w = w.tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec());
            continue;
        };
        let block = &t.name[..t.name.len() - format!("{part}.weight").len()];
        if *part == "ffn_gate" {
            // The router, [n_embd, n_expert] f32: uniform in ±2/sqrt(n_embd), so a
            // normalized input gives logits of about unit spread.
            let mut st = o.seed ^ crate::tools::bench::synth::hash_name(&t.name);
            let a = 2.0 / (n_embd as f32).sqrt();
            let r: Vec<f32> = (0..n_embd * o.n_expert)
                .map(|_| crate::tools::bench::synth::uniform(&mut st) * a)
                .collect();
            w = w.tensor_f32(
                format!("{block}ffn_gate_inp.weight"),
                &[n_embd as u64, o.n_expert as u64],
                &r,
            );
        }
        let mut data = Vec::with_capacity(t.n_bytes as usize * o.n_expert);
        for e in 0..o.n_expert {
            data.extend_from_slice(&expert_bytes(&g, t, e, o)?);
        }
        let mut dims = t.dims.clone();
        dims.push(o.n_expert as u64);
        w = w.tensor(format!("{block}{part}_exps.weight"), t.ty, &dims, data);
        expert_type = Some(t.ty);
    }
    let expert_type = expert_type.ok_or_else(|| Error::Tensor {
        name: "blk.0.ffn_gate.weight".into(),
        msg: "no dense feed-forward to upcycle".into(),
    })?;
    let file_bytes = w.write_to(out)?;
    Ok(UpcycleSummary {
        n_layer,
        n_expert: o.n_expert,
        n_expert_used: o.n_expert_used,
        expert_type: expert_type.name().to_lowercase(),
        file_bytes,
    })
}
