//! The GPU backend's mixture-of-experts step: the router's logits, the routing, each routed
//! expert's gate, up and down products read from the stacks by the ids the routing left on
//! the GPU (over 8-bit activations as the dense matmuls, else f32), the shared expert, and the
//! weighted sum, all recorded into the pass's command buffer (nothing is read back).

use std::sync::Arc;

use super::{GpuAct, GpuBackend};
use crate::backend::{Backend, WeightId};
use crate::config::Moe;
use crate::error::{Error, Result};
use crate::gpu::kernels::moe::ExpertsInput;

/// Buffers of the expert step for batches of up to `tokens` tokens, made at the first mixture
/// block a session runs here.
pub(super) struct MoeBufs {
    tokens: usize,
    /// [tokens, n_expert] router logits.
    logits: GpuAct,
    /// [tokens, k] each token's expert ids (u32), most probable first, and their weights.
    ids: GpuAct,
    weights: GpuAct,
    /// [tokens * k, n_ff_exp] the routed experts' gate projections (then their activations)
    /// and up projections, a token's k rows together.
    g: GpuAct,
    u: GpuAct,
    /// [tokens * k, n_embd] each routed expert's output.
    y: GpuAct,
    /// The shared expert's gate and up projections [tokens, n_ff_shexp], its output [tokens,
    /// n_embd] and its gate logit [tokens] (unused where the shared expert has no gate).
    shared: Option<[GpuAct; 4]>,
}

impl GpuBackend {
    fn moe_bufs(&mut self, moe: &Moe) -> Result<MoeBufs> {
        let (t, k, d) = (self.max_tokens, moe.n_expert_used, self.m.cfg.n_embd);
        let pairs = t * k;
        let shared = match moe.n_ff_shared {
            Some(fs) => Some([
                self.alloc(t * fs)?,
                self.alloc(t * fs)?,
                self.alloc(t * d)?,
                self.alloc(t)?,
            ]),
            None => None,
        };
        Ok(MoeBufs {
            tokens: t,
            logits: self.alloc(t * moe.n_expert)?,
            ids: self.alloc(pairs)?,
            weights: self.alloc(pairs)?,
            g: self.alloc(pairs * moe.n_ff_exp)?,
            u: self.alloc(pairs * moe.n_ff_exp)?,
            y: self.alloc(pairs * d)?,
            shared,
        })
    }

    /// [`Backend::moe`] on the GPU.
    pub(super) fn moe_ffn(&mut self, l: usize, x: &GpuAct, n: usize, out: &GpuAct) -> Result<()> {
        let moe = self.m.cfg.moe.clone().ok_or_else(|| {
            Error::InvalidArgument(format!("block {l} of this model has no experts"))
        })?;
        let mut b = match self.moe.take() {
            Some(b) => b,
            None => self.moe_bufs(&moe)?,
        };
        let r = self.moe_with(l, &moe, x, n, out, &mut b);
        self.moe = Some(b);
        r
    }

    /// Whether block `l`'s expert stacks take the 8-bit kernel: every part in a format with
    /// an integer path and 8-bit activations on (as the dense matmuls decide).
    fn experts_q8(&mut self, l: usize) -> Result<bool> {
        use WeightId::*;
        for w in [GateExps(l), UpExps(l), DownExps(l)] {
            let mat = self.weight(w)?;
            if !mat.parts.iter().all(|p| self.q8_path(&p.m)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The routed experts of `stack` (GateExps, UpExps or DownExps of a block) over the
    /// routing in `ids`: y[p] = W_{ids[p]} x[p / x_div] for the `pairs` pairs, one launch per
    /// part of the stack (each holds whole experts of `rows` rows).
    #[allow(clippy::too_many_arguments)]
    fn experts_matvec(
        &mut self,
        stack: WeightId,
        rows: usize,
        ids: &GpuAct,
        x: ExpertsInput,
        y: &GpuAct,
        pairs: usize,
        x_div: usize,
    ) -> Result<()> {
        let m = Arc::clone(&self.m);
        let mat = self.weight(stack)?;
        for p in &mat.parts {
            if p.w_row0 != 0 || !p.row0.is_multiple_of(rows) {
                return Err(Error::Gpu(format!(
                    "{}: a part from row {} is not whole experts of {rows} rows",
                    stack.tensor_name(),
                    p.row0
                )));
            }
            let launch = m.kernels.matvec_experts_launch(
                &p.m,
                rows,
                p.row0 / rows,
                &ids.buf,
                x,
                &y.buf,
                pairs,
                x_div,
            )?;
            self.record(launch)?;
        }
        self.written(&y.buf);
        Ok(())
    }

    fn moe_with(
        &mut self,
        l: usize,
        moe: &Moe,
        x: &GpuAct,
        n: usize,
        out: &GpuAct,
        b: &mut MoeBufs,
    ) -> Result<()> {
        use WeightId::*;
        let (ne, k, ff, d) = (
            moe.n_expert,
            moe.n_expert_used,
            moe.n_ff_exp,
            self.m.cfg.n_embd,
        );
        if n == 0 || n > b.tokens || x.len < n * d || out.len < n * d {
            return Err(Error::Gpu(format!(
                "moe of block {l}: {n} tokens (at most {}) of {d} in buffers of {} and {}",
                b.tokens, x.len, out.len
            )));
        }
        let m = Arc::clone(&self.m);
        // Route: logits [n, ne], then each token's k experts and weights, on the GPU.
        self.matmul_parts(GateInp(l), x, n, &b.logits, false)?;
        let launch = m.kernels.moe_route_launch(
            &b.logits.buf,
            &b.ids.buf,
            &b.weights.buf,
            n,
            ne,
            k,
            moe.norm_weights,
        )?;
        self.record(launch)?;
        self.written(&b.ids.buf);
        self.written(&b.weights.buf);
        let pairs = n * k;
        // Every slot of a token reads the token's input (x_div = k); each pair's down
        // projection its own activations (x_div = 1).
        if self.experts_q8(l)? {
            // The CPU's scheme: the input to int8 chunks once for the gate and up stacks, the
            // activations (quantized by the fused GLU) for the down stack.
            self.quantize_input(x, n, d)?;
            let (qx, qd) = (self.qx.clone(), self.qd.clone());
            let input = ExpertsInput::Q8 { qx: &qx, qd: &qd };
            self.experts_matvec(GateExps(l), ff, &b.ids, input, &b.g, pairs, k)?;
            self.experts_matvec(UpExps(l), ff, &b.ids, input, &b.u, pairs, k)?;
            self.glu(&mut b.g, &b.u, pairs * ff)?;
            self.quantize_input(&b.g, pairs, ff)?;
            let (qx, qd) = (self.qx.clone(), self.qd.clone());
            let input = ExpertsInput::Q8 { qx: &qx, qd: &qd };
            self.experts_matvec(DownExps(l), d, &b.ids, input, &b.y, pairs, 1)?;
        } else {
            let xin = ExpertsInput::F32(&x.buf);
            self.experts_matvec(GateExps(l), ff, &b.ids, xin, &b.g, pairs, k)?;
            self.experts_matvec(UpExps(l), ff, &b.ids, xin, &b.u, pairs, k)?;
            self.glu(&mut b.g, &b.u, pairs * ff)?;
            let gin = ExpertsInput::F32(&b.g.buf);
            self.experts_matvec(DownExps(l), d, &b.ids, gin, &b.y, pairs, 1)?;
        }
        if let Some([sg, su, sy, gate]) = b.shared.as_mut() {
            let fs = moe.n_ff_shared.unwrap_or(0);
            self.matmul_parts(GateShexp(l), x, n, sg, false)?;
            self.matmul_parts(UpShexp(l), x, n, su, false)?;
            self.glu(sg, su, n * fs)?;
            self.matmul_parts(DownShexp(l), sg, n, sy, false)?;
            if moe.shared_gate {
                self.matmul_parts(GateInpShexp(l), x, n, gate, false)?;
            }
        }
        let shared = b
            .shared
            .as_ref()
            .map(|[_, _, sy, gate]| (&sy.buf, moe.shared_gate.then_some(&gate.buf)));
        let launch =
            m.kernels
                .moe_combine_launch(&b.y.buf, &b.weights.buf, shared, &out.buf, n, d, k)?;
        self.record(launch)?;
        self.written(&out.buf);
        Ok(())
    }
}
