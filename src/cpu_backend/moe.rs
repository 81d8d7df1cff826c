//! The CPU's mixture-of-experts feed-forward: the router picks each token's experts, the
//! batch's tokens are grouped by expert, and each chosen expert's gate, up and down matrices
//! run over its own tokens only, read as that expert's rows of the stacked tensors (the other
//! experts' bytes are never touched).

use std::sync::Arc;

use super::{matmul_f32_act, CpuBackend, MatRef};
use crate::backend::{Backend, WeightId};
use crate::cpu::WeightView;
use crate::error::{Error, Result};
use crate::memory::experts::{Expert, Held, Misses};
use std::time::Instant;

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
    /// Decode under an expert cache: the next block's likely experts, being read.
    ahead: Option<ReadAhead>,
}

/// Experts of block `l` read on a guess while the block before it finishes: block `l`'s
/// router applied to the previous block's FFN input (the residual stream changes little from
/// one block to the next), its `n_expert_used` most probable experts that the cache does not
/// hold. A right guess turns the miss's wait into reading done during the previous block's
/// experts and this block's attention.
pub(super) struct ReadAhead {
    l: usize,
    /// The experts being read, most probable first.
    experts: Vec<usize>,
    /// Each expert as it comes in; dropped to stop the reader after its group in flight.
    rx: Option<std::sync::mpsc::Receiver<(usize, Result<Expert>)>>,
    /// The reader: its seconds reading and the experts it read (handed on or not).
    reader: Option<std::thread::JoinHandle<(f64, Vec<usize>)>>,
}

impl ReadAhead {
    /// Starts reading `misses` (experts of block `l`) on a thread of its own.
    fn start(l: usize, misses: Misses) -> ReadAhead {
        let experts = misses.experts().to_vec();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut read = Vec::new();
            let s = misses.read_each(|e, x| {
                if x.is_ok() {
                    read.push(e);
                }
                tx.send((e, x)).is_ok()
            });
            (s, read)
        });
        ReadAhead {
            l,
            experts,
            rx: Some(rx),
            reader: Some(reader),
        }
    }

    /// Stops the reader after its group in flight: its seconds reading and the experts it
    /// read.
    fn finish(&mut self) -> (f64, Vec<usize>) {
        self.rx = None;
        self.reader
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.finish();
    }
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

    /// Experts `ids` of block `l` (all needed by this pass): those the expert cache holds
    /// (`None` where not), and the misses to read; without a cache every expert is read from
    /// the map and there are no misses.
    fn lookup_experts(&self, l: usize, ids: &[usize]) -> Result<(Held, Option<Misses>)> {
        match &self.experts {
            None => Ok((vec![None; ids.len()], None)),
            Some(cache) => {
                let (held, misses) = lock(cache)?.lookup(l, ids)?;
                Ok((held, (!misses.is_empty()).then_some(misses)))
            }
        }
    }

    /// Counts and (if its score earns a place) holds expert `e` of block `l` as read, and the
    /// pass's read and wait times when given.
    fn admit_read(
        &self,
        l: usize,
        e: usize,
        x: Result<Expert>,
        needed: &[usize],
    ) -> Result<Arc<Expert>> {
        let cache = self.experts.as_ref().ok_or_else(|| {
            Error::InvalidArgument("an expert was read without an expert cache".into())
        })?;
        Ok(lock(cache)?.admit_read(l, e, x?, needed))
    }

    fn add_read_times(&self, read_s: f64, wait_s: f64) -> Result<()> {
        if let Some(cache) = &self.experts {
            lock(cache)?.add_times(read_s, wait_s);
        }
        Ok(())
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
        let (n_expert, k, d) = (moe.n_expert, moe.n_expert_used, self.cfg.n_embd);
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
            let guess = self.guess_next(l, moe, xv, s)?;
            self.experts_of_one_token(l, moe, x, &guess, out, s)?;
        } else {
            // A batch reads its experts itself; a guess made for a token is stale.
            self.end_read_ahead(s.ahead.take(), 0)?;
            // Group the batch by expert: each expert's tokens and their weights.
            let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
            for t in 0..n {
                for j in 0..k {
                    let e = s.ids[t * k + j] as usize;
                    groups[e].push((t, s.weights[t * k + j]));
                }
            }
            let chosen: Vec<usize> = (0..n_expert).filter(|&e| !groups[e].is_empty()).collect();
            let (held, misses) = self.lookup_experts(l, &chosen)?;
            match misses {
                None => {
                    for (&e, h) in chosen.iter().zip(&held) {
                        self.expert_over_tokens(l, e, h.as_deref(), &groups[e], x, out, s)?;
                    }
                }
                Some(misses) => {
                    self.experts_reading_ahead(l, &chosen, &groups, held, &misses, x, out, s)?
                }
            }
        }
        if moe.n_ff_shared.is_some() {
            self.shared_expert(l, xv, n, out, s)?;
        }
        Ok(())
    }

    /// Expert `e` of block `l` (`h`: as the expert cache holds it) over its tokens `toks`
    /// (token, routing weight): out[t] += w * expert(x[t]).
    #[allow(clippy::too_many_arguments)]
    fn expert_over_tokens(
        &self,
        l: usize,
        e: usize,
        h: Option<&Expert>,
        toks: &[(usize, f32)],
        x: &[f32],
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        use WeightId::*;
        let (d, m) = (self.cfg.n_embd, toks.len());
        let ff = self.cfg.moe.as_ref().map_or(0, |c| c.n_ff_exp);
        grow(&mut s.xs, m * d);
        for (i, &(t, _)) in toks.iter().enumerate() {
            s.xs[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        grow(&mut s.g, m * ff);
        grow(&mut s.u, m * ff);
        grow(&mut s.y, m * d);
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
        Ok(())
    }

    /// A batch's experts `chosen` (in order; `held` as the cache holds them) while a reader
    /// thread reads the `misses` ahead: each expert runs as soon as it is in, so the reads
    /// overlap the held experts' and the earlier misses' compute. The order, and so every sum,
    /// is the one without a cache. At most `n_expert_used` experts the cache does not hold
    /// are alive at once (the working set the memory plan counts).
    #[allow(clippy::too_many_arguments)]
    fn experts_reading_ahead(
        &self,
        l: usize,
        chosen: &[usize],
        groups: &[Vec<(usize, f32)>],
        held: Held,
        misses: &Misses,
        x: &[f32],
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        let k = self.cfg.moe.as_ref().map_or(1, |c| c.n_expert_used);
        // Alive: one expert computing, the queue, and the reader's group in flight.
        let queue = k.saturating_sub(1 + crate::memory::experts::EXPERTS_IN_FLIGHT);
        let (tx, rx) = std::sync::mpsc::sync_channel(queue);
        std::thread::scope(|scope| {
            let reader = scope.spawn(move || misses.read_each(|e, x| tx.send((e, x)).is_ok()));
            let mut wait_s = 0.0;
            let run = (|| -> Result<()> {
                for (&e, h) in chosen.iter().zip(held) {
                    let h = match h {
                        Some(h) => h,
                        None => {
                            let t = Instant::now();
                            let (got, xr) = rx.recv().map_err(|_| {
                                Error::InvalidArgument(format!(
                                    "expert {e} of block {l} was not read"
                                ))
                            })?;
                            wait_s += t.elapsed().as_secs_f64();
                            if got != e {
                                return Err(Error::InvalidArgument(format!(
                                    "expert {got} of block {l} was read for expert {e}"
                                )));
                            }
                            self.admit_read(l, e, xr, chosen)?
                        }
                    };
                    self.expert_over_tokens(l, e, Some(&h), &groups[e], x, out, s)?;
                }
                Ok(())
            })();
            // On an error the reader stops at its next hand-over (the receiver is gone).
            drop(rx);
            let read_s = reader.join().unwrap_or(0.0);
            run?;
            self.add_read_times(read_s, wait_s)
        })
    }

    /// Block `l + 1`'s likely experts for the token whose FFN input of block `l` is `xv`, most
    /// probable first: its router's top `n_expert_used` over `xv`. Empty without an expert
    /// cache, after the last block, or when block `l + 1` is not this backend's to run.
    fn guess_next(
        &mut self,
        l: usize,
        moe: &crate::config::Moe,
        xv: &Vec<f32>,
        s: &mut MoeScratch,
    ) -> Result<Vec<usize>> {
        let next = l + 1;
        let ours = next < self.cfg.n_layer
            && self.experts.is_some()
            && !self.streamed.get(next).copied().unwrap_or(false)
            && self.mat(WeightId::GateInp(next)).is_ok();
        if !ours {
            return Ok(Vec::new());
        }
        let n_expert = moe.n_expert;
        grow(&mut s.logits, n_expert);
        self.matmul(WeightId::GateInp(next), xv, 1, &mut s.logits)?;
        let mut by: Vec<usize> = (0..n_expert).collect();
        let lg = &s.logits[..n_expert];
        by.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]).then(a.cmp(&b)));
        by.truncate(moe.n_expert_used);
        Ok(by)
    }

    /// Starts reading block `l`'s guessed experts that the cache does not hold.
    fn start_read_ahead(&self, l: usize, guess: &[usize]) -> Result<Option<ReadAhead>> {
        let Some(cache) = &self.experts else {
            return Ok(None);
        };
        if guess.is_empty() {
            return Ok(None);
        }
        let misses = lock(cache)?.absent(l, guess)?;
        Ok((!misses.is_empty()).then(|| ReadAhead::start(l, misses)))
    }

    /// Stops a read-ahead and counts what it read (`used`: of its experts, those a pass took).
    fn end_read_ahead(&self, a: Option<ReadAhead>, used: u64) -> Result<()> {
        let (Some(mut a), Some(cache)) = (a, &self.experts) else {
            return Ok(());
        };
        let (read_s, read) = a.finish();
        let mut c = lock(cache)?;
        for &e in &read {
            c.count_read(a.l, e);
        }
        c.count_read_ahead(read.len() as u64, used);
        c.add_times(read_s, 0.0);
        Ok(())
    }

    /// Takes from the read-ahead `a` (if it is block `l`'s) the experts this pass misses
    /// (`misses`, narrowed to the rest), into `held` (`ids`: the pass's experts); the others it
    /// read are held if their scores earn a place. Returns how many it supplied.
    fn take_read_ahead(
        &self,
        l: usize,
        a: &mut Option<ReadAhead>,
        ids: &[usize],
        held: &mut Held,
        misses: &mut Option<Misses>,
    ) -> Result<u64> {
        let (Some(ra), Some(m)) = (a.as_mut(), misses.as_mut()) else {
            return Ok(0);
        };
        if ra.l != l {
            return Ok(0);
        }
        let mut want: Vec<usize> = m
            .experts()
            .iter()
            .copied()
            .filter(|e| ra.experts.contains(e))
            .collect();
        let Some(rx) = ra.rx.take() else {
            return Ok(0);
        };
        let (mut used, t) = (0u64, Instant::now());
        while !want.is_empty() {
            let Ok((e, xr)) = rx.recv() else { break };
            let cache = self.experts.as_ref().ok_or_else(|| {
                Error::InvalidArgument("experts were read ahead without an expert cache".into())
            })?;
            match want.iter().position(|&w| w == e) {
                Some(i) => {
                    want.swap_remove(i);
                    let j = ids.iter().position(|&i| i == e).ok_or_else(|| {
                        Error::InvalidArgument(format!("expert {e} of block {l} was not asked"))
                    })?;
                    held[j] = Some(lock(cache)?.hold(l, e, xr?, ids));
                    used += 1;
                }
                // A wrong guess, read all the same: the cache may keep it.
                None => {
                    if let Ok(x) = xr {
                        lock(cache)?.hold(l, e, x, ids);
                    }
                }
            }
        }
        // Dropping the receiver stops the reader after the group in flight.
        drop(rx);
        self.add_read_times(0.0, t.elapsed().as_secs_f64())?;
        let got: Vec<usize> = ids
            .iter()
            .zip(held.iter())
            .filter(|(_, h)| h.is_some())
            .map(|(&e, _)| e)
            .collect();
        m.retain(|e| !got.contains(&e));
        if m.is_empty() {
            *misses = None;
        }
        Ok(used)
    }

    /// Decode: the k experts of one token all read the same input, so their gate and up
    /// projections run as one `matmul_many` (one activation quantization, one parallel
    /// region); their down projections, each over its own activations, as one `matmul_each`.
    /// Under an expert cache the held experts run first while a reader thread reads the
    /// misses, which run when they are in; every expert's output is summed in routing order,
    /// so the result is the one without a cache bit for bit. Misses the read-ahead of the block
    /// before guessed are taken from it; once this block's own misses are in, the read-ahead
    /// of the next block (`guess`) starts.
    #[allow(clippy::too_many_arguments)]
    fn experts_of_one_token(
        &mut self,
        l: usize,
        moe: &crate::config::Moe,
        x: &[f32],
        guess: &[usize],
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        let (k, ff, d) = (moe.n_expert_used, moe.n_ff_exp, self.cfg.n_embd);
        grow(&mut s.g, k * ff);
        grow(&mut s.u, k * ff);
        grow(&mut s.y, k * d);
        let ids: Vec<usize> = s.ids[..k].iter().map(|&e| e as usize).collect();
        let (mut held, mut misses) = self.lookup_experts(l, &ids)?;
        let mut before = s.ahead.take();
        let used = self.take_read_ahead(l, &mut before, &ids, &mut held, &mut misses)?;
        // Its reader stops after the group in flight; joined once this block's compute is done.
        let before = before.map(|mut a| {
            a.rx = None;
            a
        });
        let mut next = None;
        if misses.is_none() {
            next = self.start_read_ahead(l + 1, guess)?;
        }
        // Slot i of the scratch holds routed expert order[i]: those at hand first.
        let now: Vec<usize> = match &misses {
            None => (0..k).collect(),
            Some(_) => (0..k).filter(|&j| held[j].is_some()).collect(),
        };
        let mut order = now.clone();
        order.extend((0..k).filter(|j| !now.contains(j)));
        match &misses {
            None => self.token_experts(l, &ids, &held, &order, 0, x, s)?,
            Some(m) => {
                std::thread::scope(|scope| -> Result<()> {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let reader = scope.spawn(move || m.read_each(|e, x| tx.send((e, x)).is_ok()));
                    let first = self.token_experts(l, &ids, &held, &order[..now.len()], 0, x, s);
                    let t = Instant::now();
                    let got: Vec<_> = rx.iter().take(m.experts().len()).collect();
                    let read_s = reader.join().unwrap_or(0.0);
                    let wait_s = t.elapsed().as_secs_f64();
                    // The storage is free: the next block's guesses read during this one's
                    // misses' compute and the next block's attention.
                    next = self.start_read_ahead(l + 1, guess)?;
                    first?;
                    self.add_read_times(read_s, wait_s)?;
                    if got.len() != m.experts().len() {
                        return Err(Error::InvalidArgument(format!(
                            "{} of the {} experts block {l} missed were read",
                            got.len(),
                            m.experts().len()
                        )));
                    }
                    for (e, xr) in got {
                        let j = ids.iter().position(|&i| i == e).ok_or_else(|| {
                            Error::InvalidArgument(format!("expert {e} of block {l} was not asked"))
                        })?;
                        held[j] = Some(self.admit_read(l, e, xr, &ids)?);
                    }
                    let rest = &order[now.len()..];
                    self.token_experts(l, &ids, &held, rest, now.len(), x, s)
                })?;
            }
        }
        for (j, &w) in s.weights[..k].iter().enumerate() {
            let i = order.iter().position(|&o| o == j).unwrap_or(j);
            let y = &s.y[i * d..(i + 1) * d];
            out.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
        }
        self.end_read_ahead(before, used)?;
        s.ahead = next;
        Ok(())
    }

    /// The routed experts `order` (indices into `ids`; `held` as the cache holds them, else
    /// read from the map) of one token, into scratch slots `i0..`: gate and up into s.g/s.u
    /// ([k, n_ff_exp]), the GLU in place, down into s.y ([k, n_embd]).
    #[allow(clippy::too_many_arguments)]
    fn token_experts(
        &self,
        l: usize,
        ids: &[usize],
        held: &[Option<Arc<Expert>>],
        order: &[usize],
        i0: usize,
        x: &[f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        use WeightId::*;
        if order.is_empty() {
            return Ok(());
        }
        let (ff, d) = (
            self.cfg.moe.as_ref().map_or(0, |c| c.n_ff_exp),
            self.cfg.n_embd,
        );
        let (a, b) = (i0, i0 + order.len());
        let mut views = Vec::with_capacity(2 * order.len());
        for &j in order {
            views.push(self.expert_view(GateExps(l), ids[j], held[j].as_deref())?);
            views.push(self.expert_view(UpExps(l), ids[j], held[j].as_deref())?);
        }
        {
            let mut ys: Vec<&mut [f32]> = Vec::with_capacity(2 * order.len());
            for (g, u) in s.g[a * ff..b * ff]
                .chunks_mut(ff)
                .zip(s.u[a * ff..b * ff].chunks_mut(ff))
            {
                ys.push(g);
                ys.push(u);
            }
            let f32_act = self.f32_activations;
            Self::matmul_views(f32_act, &mut s.mm, &views, x, 1, &mut ys)?;
        }
        crate::cpu::glu_in_place(
            self.cfg.ffn_act,
            &mut s.g[a * ff..b * ff],
            &s.u[a * ff..b * ff],
        )?;
        let downs = order
            .iter()
            .map(|&j| self.expert_view(DownExps(l), ids[j], held[j].as_deref()))
            .collect::<Result<Vec<_>>>()?;
        let mut ys: Vec<&mut [f32]> = s.y[a * d..b * d].chunks_mut(d).collect();
        if self.f32_activations {
            for (i, (v, y)) in downs.iter().zip(ys.iter_mut()).enumerate() {
                let g = &s.g[(a + i) * ff..(a + i + 1) * ff];
                matmul_f32_act(v.ty, v.data, v.rows, v.cols, g, 1, y)?;
            }
        } else {
            crate::cpu::matmul_each(&downs, &s.g[a * ff..b * ff], &mut ys, &mut s.mm)?;
        }
        Ok(())
    }

    /// out += sigmoid(x · gate_inp_shexp) * shared_ffn(x) for every token (qwen2moe's shared
    /// expert: llama.cpp's src/models/qwen2moe.cpp forms the sigmoid as silu(v) / v), or
    /// out += shared_ffn(x) where the shared expert has no gate (granitemoe).
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
        if !self.cfg.moe.as_ref().is_some_and(|m| m.shared_gate) {
            out[..n * d]
                .iter_mut()
                .zip(&s.y[..n * d])
                .for_each(|(o, y)| *o += y);
            return Ok(());
        }
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
