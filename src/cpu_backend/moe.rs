//! The CPU's mixture-of-experts feed-forward: the router picks each token's experts, the
//! batch's tokens are grouped by expert, and each chosen expert's gate, up and down matrices
//! run over its own tokens only, read as that expert's rows of the stacked tensors (the other
//! experts' bytes are never touched).

use std::sync::Arc;

use super::{matmul_f32_act, CpuBackend, MatRef};
use crate::backend::{Backend, WeightId};
use crate::cpu::WeightView;
use crate::error::{Error, Result};
use crate::memory::experts::Expert;

/// Buffers of the expert step, grown to the largest batch seen and then reused.
#[derive(Default)]
pub(super) struct MoeScratch {
    /// [n, n_expert] router logits.
    logits: Vec<f32>,
    /// [n, n_expert_used] each token's experts, most probable first, and their weights.
    ids: Vec<u32>,
    weights: Vec<f32>,
    /// [m, n_embd] the tokens routed to one expert, gathered.
    xs: Vec<f32>,
    /// [m, n_ff_exp] (for all chosen experts at once in decode: [n_expert_used, n_ff_exp]) the
    /// gate projections, then the activations, and the up projections.
    g: Vec<f32>,
    u: Vec<f32>,
    /// [m, n_embd] one expert's output (decode: [n_expert_used, n_embd], each routed
    /// expert's; the shared expert's: [n, n_embd]).
    y: Vec<f32>,
    /// The expert matmuls' own scratch (the backend's is borrowed by the weight views).
    mm: crate::cpu::MatmulScratch,
}

fn lock(
    c: &crate::memory::experts::SharedExpertCache,
) -> Result<std::sync::MutexGuard<'_, crate::memory::experts::ExpertCache>> {
    c.lock()
        .map_err(|_| Error::InvalidArgument("the expert cache was poisoned".into()))
}

fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// Expert `e`'s rows of a stacked matrix `m` (`[cols, rows, n_expert]` seen as `n_expert *
/// rows` rows): (first row, rows).
fn expert_rows(m: &MatRef, n_expert: usize, e: usize) -> (usize, usize) {
    let rows = m.rows / n_expert;
    (e * rows, rows)
}

impl CpuBackend {
    /// Expert `e`'s view of the stacked matrix `w`: its rows as the expert cache read them
    /// (`held`), else of the file (or stream slot).
    fn expert_view<'a>(
        &'a self,
        w: WeightId,
        e: usize,
        held: Option<&'a Expert>,
    ) -> Result<WeightView<'a>> {
        let m = self.mat(w)?;
        let n_expert = self.cfg.moe.as_ref().map_or(1, |c| c.n_expert);
        let (r0, rows) = expert_rows(&m, n_expert, e);
        let rb = m.n_bytes / m.rows;
        let outside = || Error::Tensor {
            name: w.tensor_name(),
            msg: format!("expert {e} lies outside the tensor"),
        };
        let bytes = match held {
            Some(x) => x
                .bytes((m.offset + r0 * rb) as u64, rows * rb)
                .ok_or_else(outside)?,
            None => {
                let data = Self::bytes_of(&self.gguf, self.slot.as_ref(), &self.streamed, w, m)?;
                data.get(r0 * rb..(r0 + rows) * rb).ok_or_else(outside)?
            }
        };
        WeightView::new(m.ty, bytes, rows, m.cols)
    }

    /// Counts this pass's routing (`ids`: [n, k]) in the expert cache, if there is one.
    fn count_routing(&self, l: usize, n_expert: usize, ids: &[u32]) -> Result<()> {
        let Some(cache) = &self.experts else {
            return Ok(());
        };
        let mut uses = vec![0u32; n_expert];
        for &e in ids {
            uses[e as usize] += 1;
        }
        lock(cache)?.count(l, &uses)
    }

    /// Experts `ids` of block `l` as the expert cache holds or reads them (all needed at once);
    /// `None` each without a cache (the experts are read from the map).
    fn held_experts(&self, l: usize, ids: &[usize]) -> Result<Vec<Option<Arc<Expert>>>> {
        match &self.experts {
            None => Ok(vec![None; ids.len()]),
            Some(cache) => Ok(lock(cache)?.fetch(l, ids)?.into_iter().map(Some).collect()),
        }
    }

    /// ys[i]: [n, views[i].rows] = x: [n, cols] · views[i]ᵀ, the fast kernels or (with
    /// `f32_activations`) f32 dot products.
    fn matmul_views(
        f32_act: bool,
        mm: &mut crate::cpu::MatmulScratch,
        views: &[WeightView],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<()> {
        if !f32_act {
            return crate::cpu::matmul_many(views, x, n, ys, mm);
        }
        for (v, y) in views.iter().zip(ys.iter_mut()) {
            matmul_f32_act(v.ty, v.data, v.rows, v.cols, x, n, y)?;
        }
        Ok(())
    }

    /// [`Backend::moe`] on the CPU.
    pub(super) fn moe_ffn(
        &mut self,
        l: usize,
        x: &Vec<f32>,
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let moe = self.cfg.moe.clone().ok_or_else(|| {
            Error::InvalidArgument(format!("block {l} of this model has no experts"))
        })?;
        // The scratch leaves `self` while the matmuls borrow it.
        let mut s = std::mem::take(&mut self.moe);
        let r = self.moe_with(l, &moe, x, n, out, &mut s);
        self.moe = s;
        r
    }

    fn moe_with(
        &mut self,
        l: usize,
        moe: &crate::config::Moe,
        xv: &Vec<f32>,
        n: usize,
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        use WeightId::*;
        let (n_expert, k, ff, d) = (
            moe.n_expert,
            moe.n_expert_used,
            moe.n_ff_exp,
            self.cfg.n_embd,
        );
        // Route: logits [n, n_expert], then each token's k experts and weights.
        grow(&mut s.logits, n * n_expert);
        self.matmul(GateInp(l), xv, n, &mut s.logits)?;
        let (x, out) = (&xv[..n * d], &mut out[..n * d]);
        s.ids.resize(n * k, 0);
        s.weights.resize(n * k, 0.0);
        for t in 0..n {
            kernels_ref::route_experts(
                &s.logits[t * n_expert..(t + 1) * n_expert],
                moe.norm_weights,
                &mut s.ids[t * k..(t + 1) * k],
                &mut s.weights[t * k..(t + 1) * k],
            );
        }
        out.fill(0.0);
        self.count_routing(l, n_expert, &s.ids[..n * k])?;
        if n == 1 {
            self.experts_of_one_token(l, moe, x, out, s)?;
        } else {
            // Group the batch by expert: each expert's tokens and their weights.
            let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
            for t in 0..n {
                for j in 0..k {
                    let e = s.ids[t * k + j] as usize;
                    groups[e].push((t, s.weights[t * k + j]));
                }
            }
            for (e, toks) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
                let m = toks.len();
                grow(&mut s.xs, m * d);
                for (i, &(t, _)) in toks.iter().enumerate() {
                    s.xs[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
                }
                grow(&mut s.g, m * ff);
                grow(&mut s.u, m * ff);
                grow(&mut s.y, m * d);
                // One expert at a time: a prefill's working set is one expert, not all.
                let held = self.held_experts(l, &[e])?;
                let h = held[0].as_deref();
                let gate = self.expert_view(GateExps(l), e, h)?;
                let up = self.expert_view(UpExps(l), e, h)?;
                let down = self.expert_view(DownExps(l), e, h)?;
                let f32_act = self.f32_activations;
                Self::matmul_views(
                    f32_act,
                    &mut s.mm,
                    &[gate, up],
                    &s.xs[..m * d],
                    m,
                    &mut [&mut s.g[..m * ff], &mut s.u[..m * ff]],
                )?;
                crate::cpu::glu_in_place(self.cfg.ffn_act, &mut s.g[..m * ff], &s.u[..m * ff])?;
                Self::matmul_views(
                    f32_act,
                    &mut s.mm,
                    &[down],
                    &s.g[..m * ff],
                    m,
                    &mut [&mut s.y[..m * d]],
                )?;
                for (i, &(t, w)) in toks.iter().enumerate() {
                    let row = &mut out[t * d..(t + 1) * d];
                    row.iter_mut()
                        .zip(&s.y[i * d..(i + 1) * d])
                        .for_each(|(o, y)| *o += w * y);
                }
            }
        }
        if moe.n_ff_shared.is_some() {
            self.shared_expert(l, xv, n, out, s)?;
        }
        Ok(())
    }

    /// Decode: the k experts of one token all read the same input, so their gate and up
    /// projections run as one `matmul_many` (one activation quantization, one parallel
    /// region); their down projections, each over its own activations, as one `matmul_each`.
    fn experts_of_one_token(
        &mut self,
        l: usize,
        moe: &crate::config::Moe,
        x: &[f32],
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        use WeightId::*;
        let (k, ff, d) = (moe.n_expert_used, moe.n_ff_exp, self.cfg.n_embd);
        grow(&mut s.g, k * ff);
        grow(&mut s.u, k * ff);
        let ids: Vec<usize> = s.ids[..k].iter().map(|&e| e as usize).collect();
        let held = self.held_experts(l, &ids)?;
        let mut views = Vec::with_capacity(2 * k);
        for (&e, h) in ids.iter().zip(&held) {
            views.push(self.expert_view(GateExps(l), e, h.as_deref())?);
            views.push(self.expert_view(UpExps(l), e, h.as_deref())?);
        }
        {
            let mut ys: Vec<&mut [f32]> = Vec::with_capacity(2 * k);
            for (g, u) in s.g[..k * ff]
                .chunks_mut(ff)
                .zip(s.u[..k * ff].chunks_mut(ff))
            {
                ys.push(g);
                ys.push(u);
            }
            let f32_act = self.f32_activations;
            Self::matmul_views(f32_act, &mut s.mm, &views, x, 1, &mut ys)?;
        }
        crate::cpu::glu_in_place(self.cfg.ffn_act, &mut s.g[..k * ff], &s.u[..k * ff])?;
        let downs = ids
            .iter()
            .zip(&held)
            .map(|(&e, h)| self.expert_view(DownExps(l), e, h.as_deref()))
            .collect::<Result<Vec<_>>>()?;
        grow(&mut s.y, k * d);
        {
            let mut ys: Vec<&mut [f32]> = s.y[..k * d].chunks_mut(d).collect();
            if self.f32_activations {
                for (j, (v, y)) in downs.iter().zip(ys.iter_mut()).enumerate() {
                    matmul_f32_act(
                        v.ty,
                        v.data,
                        v.rows,
                        v.cols,
                        &s.g[j * ff..(j + 1) * ff],
                        1,
                        y,
                    )?;
                }
            } else {
                crate::cpu::matmul_each(&downs, &s.g[..k * ff], &mut ys, &mut s.mm)?;
            }
        }
        for (j, y) in s.y[..k * d].chunks(d).enumerate() {
            let w = s.weights[j];
            out.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
        }
        Ok(())
    }

    /// out += sigmoid(x · gate_inp_shexp) * shared_ffn(x) for every token (qwen2moe's shared
    /// expert: llama.cpp's src/models/qwen2moe.cpp forms the sigmoid as silu(v) / v).
    fn shared_expert(
        &mut self,
        l: usize,
        x: &Vec<f32>,
        n: usize,
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        use WeightId::*;
        let d = self.cfg.n_embd;
        let fs = self.mat(GateShexp(l))?.rows;
        grow(&mut s.g, n * fs);
        grow(&mut s.u, n * fs);
        grow(&mut s.y, n * d);
        self.matmul_many(&[GateShexp(l), UpShexp(l)], x, n, &mut [&mut s.g, &mut s.u])?;
        crate::cpu::glu_in_place(self.cfg.ffn_act, &mut s.g[..n * fs], &s.u[..n * fs])?;
        self.matmul(DownShexp(l), &s.g, n, &mut s.y)?;
        let gate = self.vec(GateInpShexp(l))?;
        for t in 0..n {
            let xt = &x[t * d..(t + 1) * d];
            let v: f64 = xt
                .iter()
                .zip(gate)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let sig = (1.0 / (1.0 + (-v).exp())) as f32;
            out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&s.y[t * d..(t + 1) * d])
                .for_each(|(o, y)| *o += sig * y);
        }
        Ok(())
    }
}
