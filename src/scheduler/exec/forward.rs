//! The forward pass itself: token batches through the placed stages (`run`), the hidden
//! state's crossings between devices, the head, and the public entry points `forward` and
//! `forward_argmax`.

use std::time::Instant;

use super::{phase_of, Exec, StageTimes};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::ground::Device;
use crate::model::{embed_stage, head_stage, layer_stage, Logits};
use crate::scheduler::policy::TimeSource;

impl Exec {
    /// Copies the hidden state of `n` tokens from device `from` to device `to`.
    fn cross(&mut self, from: Device, to: Device, n: usize) -> Result<()> {
        let len = n * self.cfg.n_embd;
        let mut host = std::mem::take(&mut self.host);
        let r = (|| {
            on_dev!(self, from, |b, s| b.read(&s.x, &mut host[..len]))?;
            on_dev!(self, to, |b, s| b.write(&mut s.x, &host[..len]))
        })();
        self.host = host;
        self.stats.crossings += 1;
        r
    }

    /// Runs `tokens` at positions pos0.. through the placed model in batches, calling
    /// `after(exec, device of the hidden state, first index, n)` after each batch.
    pub(super) fn run(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        mut after: impl FnMut(&mut Exec, Device, usize, usize) -> Result<()>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        if pos0 + tokens.len() > self.n_ctx {
            return Err(Error::ContextOverflow {
                n_prompt: pos0 + tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        let phase = phase_of(tokens.len());
        if let Some(d) = self.dynamic.as_mut() {
            d.count(phase, tokens.len());
        }
        let mut measure = std::mem::take(&mut self.measure_next);
        let current = self.placement.get(phase).clone();
        if let Some((due, probe)) = self.dynamic.as_mut().map(|d| d.before(phase, &current)) {
            measure |= due;
            if let Some(pp) = probe {
                match self.check(&pp) {
                    Ok(()) => {
                        *self.placement.get_mut(phase) = pp;
                        // A probe may put a non-resident block on the GPU: it streams.
                        self.enable_streaming_if_needed()?;
                    }
                    Err(e) => {
                        log::warn!("offload policy: probe {pp} not run: {e}");
                        if let Some(d) = self.dynamic.as_mut() {
                            d.take_restore();
                        }
                    }
                }
            }
        }
        self.timed = measure;
        let p = self.placement.get(phase).clone();
        self.migrate(&p, pos0)?;
        self.order_reads(&p)?;
        self.pending = None;
        self.use_stamps = measure && p.uses(Device::Gpu) && self.gpu_side()?.0.has_timestamps();
        self.marks.clear();
        let source = if self.use_stamps {
            TimeSource::GpuTimestamps
        } else {
            TimeSource::WallClock
        };
        let mut times = measure.then(|| StageTimes {
            phase,
            source,
            wall_ms: 0.0,
            tokens: tokens.len(),
            embed: (p.embed, 0.0),
            layers: p.layers.iter().map(|&d| (d, 0.0)).collect(),
            head: None,
            crossing_ms: 0.0,
            crossings: 0,
        });
        let cfg = self.cfg.clone();
        let mut done = 0;
        for chunk in tokens.chunks(self.batch) {
            let n = chunk.len();
            let t_chunk = Instant::now();
            let mut t = Instant::now();
            let s0 = self.stamp_gpu(p.embed)?;
            on_dev!(self, p.embed, |b, s| embed_stage(b, s, chunk))?;
            self.end_stage(times.as_mut(), p.embed, 0, s0, t)?;
            let mut at = p.embed;
            for (l, &d) in p.layers.iter().enumerate() {
                if d != at {
                    self.before_crossing(at)?;
                    t = Instant::now();
                    self.cross(at, d, n)?;
                    if let Some(times) = times.as_mut() {
                        times.crossings += 1;
                        times.crossing_ms += t.elapsed().as_secs_f64() * 1e3;
                    }
                    at = d;
                }
                t = Instant::now();
                if d == Device::Gpu {
                    self.gpu_side()?.0.stream_in(l)?;
                }
                let s0 = self.stamp_gpu(d)?;
                if d == Device::Cpu && self.cpu_streams(l) {
                    self.cpu_block(l, n, pos0 + done)?;
                } else {
                    on_dev!(self, d, |b, s| layer_stage(b, &cfg, s, l, n, pos0 + done))?;
                }
                let s1 = self.stamp_gpu(d)?;
                // A streamed next block loads while this one runs (stream_in submits first).
                if d == Device::Gpu && p.layers.get(l + 1) == Some(&Device::Gpu) {
                    self.gpu_side()?.0.stream_in(l + 1)?;
                }
                self.end_stage_stamped(times.as_mut(), d, 1 + l, s0, s1, t)?;
            }
            // The head (in `after`) adds its time and crossing to the pass being measured.
            self.pending = times.take();
            after(self, at, done, n)?;
            times = self.pending.take();
            if let Some(times) = times.as_mut() {
                times.wall_ms += t_chunk.elapsed().as_secs_f64() * 1e3;
                self.apply_stamps(times)?;
            }
            done += n;
        }
        self.use_stamps = false;
        if measure {
            self.last_times = times;
        }
        Ok(())
    }

    /// Final norm and head on rows first..first+n_rows of the hidden state of a batch of `n`
    /// tokens (now on `at`) in a pass of `n_total` tokens, moving the state to the head's
    /// device first. Returns that device.
    fn head(
        &mut self,
        at: Device,
        n_total: usize,
        n: usize,
        first: usize,
        n_rows: usize,
    ) -> Result<Device> {
        let d = self.placement.get(phase_of(n_total)).head;
        if d != at {
            self.before_crossing(at)?;
            let t = Instant::now();
            self.cross(at, d, n)?;
            if let Some(times) = self.pending.as_mut() {
                times.crossings += 1;
                times.crossing_ms += t.elapsed().as_secs_f64() * 1e3;
            }
        }
        let cfg = self.cfg.clone();
        let s0 = self.stamp_gpu(d)?;
        on_dev!(self, d, |b, s| head_stage(b, &cfg, s, first, n_rows))?;
        let s1 = self.stamp_gpu(d)?;
        if let (Some(a), Some(b)) = (s0, s1) {
            if self.pending.is_some() {
                self.marks.push((self.cfg.n_layer + 1, a, b));
            }
        }
        Ok(d)
    }

    /// Adds the head's time (since `t`, the device synchronized) to a measured pass, unless
    /// GPU timestamps time it.
    fn note_head(&mut self, d: Device, t: Instant) -> Result<()> {
        if self.use_stamps && d == Device::Gpu {
            return Ok(());
        }
        if let Some(mut times) = self.pending.take() {
            let r =
                self.end_stage_stamped(Some(&mut times), d, self.cfg.n_layer + 1, None, None, t);
            self.pending = Some(times);
            r?;
        }
        Ok(())
    }

    /// Appends `tokens` (at positions pos0..) and the wanted logits to `logits_out`
    /// ([rows, n_vocab]).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        want: Logits,
        logits_out: &mut Vec<f32>,
    ) -> Result<()> {
        let pool = self.pool.clone();
        let n_total = tokens.len();
        let n_vocab = self.cfg.n_vocab;
        let start = logits_out.len();
        let r = pool.install(|| {
            self.run(tokens, pos0, |e, at, start_idx, n| {
                if let Some((first, n_rows)) = want.rows(n_total, start_idx, n) {
                    let t = Instant::now();
                    let d = e.head(at, n_total, n, first, n_rows)?;
                    let start = logits_out.len();
                    logits_out.resize(start + n_rows * n_vocab, 0.0);
                    on_dev!(e, d, |b, s| b.read(&s.logits, &mut logits_out[start..]))?;
                    e.note_head(d, t)?;
                }
                Ok(())
            })
        });
        let after = pool.install(|| self.after_pass());
        let r = r.and(after);
        if r.is_err() {
            // A failed pass yields nothing (it may run again after a fallback).
            logits_out.truncate(start);
        }
        r
    }

    /// As [`Exec::forward`], returning only the most likely next token after the last one;
    /// the head's device reduces the logits (a GPU reads back one id).
    pub fn forward_argmax(&mut self, tokens: &[u32], pos0: usize) -> Result<u32> {
        let pool = self.pool.clone();
        let n_total = tokens.len();
        let n_vocab = self.cfg.n_vocab;
        let mut id = None;
        let r = pool.install(|| {
            self.run(tokens, pos0, |e, at, start_idx, n| {
                if start_idx + n == n_total {
                    let t = Instant::now();
                    let d = e.head(at, n_total, n, n - 1, 1)?;
                    id = on_dev!(e, d, |b, s| b.argmax(&s.logits, 1, n_vocab))?
                        .first()
                        .copied();
                    e.note_head(d, t)?;
                }
                Ok(())
            })
        });
        let after = pool.install(|| self.after_pass());
        r.and(after)?;
        id.ok_or_else(|| Error::InvalidArgument("no logits computed".into()))
    }
}
