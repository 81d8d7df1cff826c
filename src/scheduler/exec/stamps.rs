//! Timing the stages of a measured pass: GPU timestamps around GPU stages where the adapter
//! has them, else (and for CPU stages) the wall clock with the device synchronized.

use std::time::Instant;

use super::{Exec, StageTimes};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::ground::Device;

impl Exec {
    /// A GPU timestamp before or after a stage on `d`, when the measured pass uses them.
    pub(super) fn stamp_gpu(&mut self, d: Device) -> Result<Option<u32>> {
        if self.use_stamps && d == Device::Gpu {
            self.gpu_side()?.0.stamp()
        } else {
            Ok(None)
        }
    }

    /// Ends the timing of a stage on `d` (index `k`) that began at `t` with stamp `s0`.
    pub(super) fn end_stage(
        &mut self,
        times: Option<&mut StageTimes>,
        d: Device,
        k: usize,
        s0: Option<u32>,
        t: Instant,
    ) -> Result<()> {
        let s1 = self.stamp_gpu(d)?;
        self.end_stage_stamped(times, d, k, s0, s1, t)
    }

    /// As `end_stage` with the closing stamp already recorded: a stamped stage is noted for
    /// [`Exec::apply_stamps`]; any other is synchronized and timed by the wall clock.
    pub(super) fn end_stage_stamped(
        &mut self,
        times: Option<&mut StageTimes>,
        d: Device,
        k: usize,
        s0: Option<u32>,
        s1: Option<u32>,
        t: Instant,
    ) -> Result<()> {
        let Some(times) = times else {
            return Ok(());
        };
        if let (Some(a), Some(b)) = (s0, s1) {
            self.marks.push((k, a, b));
            return Ok(());
        }
        on_dev!(self, d, |b, _s| b.sync())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let n_layer = self.cfg.n_layer;
        match k {
            0 => times.embed.1 += ms,
            k if k == n_layer + 1 => {
                let prev = times.head.map_or(0.0, |h| h.1);
                times.head = Some((d, prev + ms));
            }
            k => times.layers[k - 1].1 += ms,
        }
        Ok(())
    }

    /// With timestamps, the GPU's queued stages finish before a crossing is timed, so the
    /// crossing's time is the copy alone (a wall-clock pass has synchronized each stage).
    pub(super) fn before_crossing(&mut self, from: Device) -> Result<()> {
        if self.use_stamps && from == Device::Gpu {
            self.gpu_side()?.0.sync()?;
        }
        Ok(())
    }

    /// Reads back the GPU timestamps of the batch just run and adds each stamped stage's
    /// time to `times`.
    pub(super) fn apply_stamps(&mut self, times: &mut StageTimes) -> Result<()> {
        if self.marks.is_empty() {
            return Ok(());
        }
        let ms = self.gpu_side()?.0.read_stamps()?;
        let n_layer = self.cfg.n_layer;
        for (k, a, b) in std::mem::take(&mut self.marks) {
            let (Some(&ta), Some(&tb)) = (ms.get(a as usize), ms.get(b as usize)) else {
                return Err(Error::Gpu(format!(
                    "GPU timestamps {a} and {b} not read back ({} read)",
                    ms.len()
                )));
            };
            let dt = (tb - ta).max(0.0);
            match k {
                0 => times.embed.1 += dt,
                k if k == n_layer + 1 => {
                    let prev = times.head.map_or(0.0, |h| h.1);
                    times.head = Some((Device::Gpu, prev + dt));
                }
                k => times.layers[k - 1].1 += dt,
            }
        }
        Ok(())
    }
}
