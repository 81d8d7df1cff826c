//! Fault injection for the failover tests: a lost device and out-of-memory allocations, made
//! to happen at chosen points so the executor's recovery (`scheduler::exec::failover`) can be
//! tested on any adapter. Inert unless a test arms it; hidden from the documentation because
//! nothing but tests should reach it.
//!
//! Every [`GpuContext`](super::GpuContext) holds one [`GpuFaults`]; tests reach it through
//! `GpuModel::ctx.faults()`, or hand one to the model load (`GpuLoadOptions::faults`) to hit
//! the uploads of the load itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Never: the value of a disarmed trigger.
const OFF: u64 = u64::MAX;

/// Counters of the points faults can hit, and the triggers armed on them.
#[doc(hidden)]
#[derive(Debug)]
pub struct GpuFaults {
    /// Submissions seen (command buffers about to go to the queue).
    submits: AtomicU64,
    /// The submission count at which the device is destroyed (`OFF`: never).
    lose_at: AtomicU64,
    /// Allocations and uploads seen (buffers made, streamed blocks written).
    allocs: AtomicU64,
    /// Allocations with a count in fail_from..fail_to fail as out of memory.
    fail_from: AtomicU64,
    fail_to: AtomicU64,
    /// Set once the injected loss happened.
    fired: AtomicBool,
}

impl Default for GpuFaults {
    fn default() -> GpuFaults {
        GpuFaults {
            submits: AtomicU64::new(0),
            lose_at: AtomicU64::new(OFF),
            allocs: AtomicU64::new(0),
            fail_from: AtomicU64::new(OFF),
            fail_to: AtomicU64::new(OFF),
            fired: AtomicBool::new(false),
        }
    }
}

/// What happens at a fault point.
pub(crate) enum Fault {
    None,
    /// Destroy the device (the caller does: it holds it) and fail as a lost device.
    LoseDevice,
}

impl GpuFaults {
    /// The device is destroyed (`wgpu::Device::destroy`, the real loss path) at the
    /// submission after the next `n`: that submission and every later GPU operation fail as
    /// on a lost device.
    pub fn lose_device_after_submits(&self, n: u64) {
        let now = self.submits.load(Ordering::SeqCst);
        self.lose_at.store(now.saturating_add(n), Ordering::SeqCst);
    }

    /// The next `skip` allocations succeed, the `count` after them fail as out of memory
    /// (buffer creation, weight uploads, streamed block uploads).
    pub fn fail_allocations(&self, skip: u64, count: u64) {
        let now = self.allocs.load(Ordering::SeqCst);
        let from = now.saturating_add(skip);
        self.fail_to
            .store(from.saturating_add(count), Ordering::SeqCst);
        self.fail_from.store(from, Ordering::SeqCst);
    }

    /// Allocations counted so far (a test counts a load's to aim a failure inside it).
    pub fn allocations(&self) -> u64 {
        self.allocs.load(Ordering::SeqCst)
    }

    /// Submissions counted so far.
    pub fn submissions(&self) -> u64 {
        self.submits.load(Ordering::SeqCst)
    }

    /// Whether the injected device loss happened.
    pub fn device_lost(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Counts a submission; says whether it is the one that loses the device.
    pub(crate) fn on_submit(&self) -> Fault {
        let i = self.submits.fetch_add(1, Ordering::SeqCst);
        if i >= self.lose_at.load(Ordering::SeqCst) && !self.fired.swap(true, Ordering::SeqCst) {
            return Fault::LoseDevice;
        }
        Fault::None
    }

    /// Counts an allocation of `what`; an armed one fails as out of memory.
    pub(crate) fn on_alloc(&self, what: &str) -> Result<()> {
        let i = self.allocs.fetch_add(1, Ordering::SeqCst);
        let (from, to) = (
            self.fail_from.load(Ordering::SeqCst),
            self.fail_to.load(Ordering::SeqCst),
        );
        if (from..to).contains(&i) {
            return Err(Error::OutOfMemory {
                what: format!("{what} (injected)"),
            });
        }
        Ok(())
    }
}
