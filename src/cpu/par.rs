//! The engine's CPU worker threads: rayon's pool for load-time work, and beside it a pool of
//! spinning workers for the forward pass's parallel regions.
//!
//! Why a second pool: decode runs ~5 parallel regions per layer (the QKV and gate/up GEMMs,
//! attention, SwiGLU, the output and down GEMMs), each a fraction of a millisecond on a 1.5B
//! model and tens of microseconds on a 135M one. Rayon's idle workers yield a few dozen times and
//! then sleep on a futex, so most regions began by waking a sleeper (a system call on the
//! posting thread, a context switch on the woken one): measured on the 1.5B Q4_K_M model with 2
//! threads, ~12% of the decode's core time idle and ~5% in the futex and scheduler. Here a
//! worker busy-waits on an epoch counter for `SPIN` after its last region before it parks on a
//! condition variable, so back-to-back regions start within a cache-line transfer; the posting
//! thread takes items too, so `n` threads are the caller and `n - 1` workers.
//!
//! Items are claimed one at a time from an atomic counter (dynamic scheduling: a slow item or a
//! descheduled thread leaves the rest to the others), so which thread runs an item never changes
//! its arithmetic. Kernels call [`for_each_init`]; outside [`Workers::install`] (unit tests, a
//! bare rayon pool) it runs on rayon's current pool instead.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::{Error, Result};

/// How long an idle worker busy-waits for the next region before it parks: longer than the
/// serial work between two regions of a forward pass (norms, RoPE, sampling a token), short
/// enough that an idle engine stops using the cores at once.
const SPIN: Duration = Duration::from_millis(2);

/// A counter on its own cache lines (two, for the adjacent-line prefetcher), so threads
/// taking items from their own runs do not bounce one line between cores.
#[repr(align(128))]
struct Padded(AtomicUsize);

impl std::ops::Deref for Padded {
    type Target = AtomicUsize;
    fn deref(&self) -> &AtomicUsize {
        &self.0
    }
}

/// `Shared::gate`'s closed bit.
const CLOSED: u64 = 1 << 31;
/// `Shared::gate`'s count of workers inside.
const INSIDE: u64 = CLOSED - 1;

/// One region's work as the workers see it: `run(ctx)` claims and runs items until none are
/// left. Type-erased so the pool is not generic; valid while the posting call waits.
#[derive(Clone, Copy)]
struct Job {
    /// run(ctx, participant): participant 0 is the posting thread, 1.. the workers.
    run: unsafe fn(*const (), usize),
    ctx: *const (),
}

// SAFETY: a Job is only dereferenced while `Spin::run` (which owns what ctx points to, a Sync
// closure) waits for every worker to finish with it.
unsafe impl Send for Job {}

struct Shared {
    /// Bumped once per region (and at shutdown); a worker runs the job when it sees a new value.
    epoch: AtomicU64,
    job: Mutex<Option<Job>>,
    /// The current region's gate: its epoch in the high 32 bits, `CLOSED`, and in the low bits
    /// the workers inside it. A worker enters only an open gate of the epoch it woke for, and
    /// the poster closes the gate once the items are all taken and waits only for the workers
    /// inside: a worker that was descheduled (another process on its core) is not waited for,
    /// its share of the items having been taken by the others.
    gate: AtomicU64,
    /// Workers parked on `wake`.
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    /// Set by a worker whose item panicked; the posting thread re-raises it as an error.
    panicked: AtomicBool,
    /// Hands out the workers' participant numbers.
    next_id: AtomicUsize,
}

/// `workers` spinning threads; the thread that calls [`Spin::run`] is one more.
struct Spin {
    /// Held by the thread whose region the workers are serving.
    region: Mutex<()>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Spin {
    fn new(workers: usize) -> Result<Spin> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            gate: AtomicU64::new(CLOSED),
            parked: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            next_id: AtomicUsize::new(0),
        });
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("memwall-spin-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| Error::InvalidArgument(format!("cannot start worker threads: {e}")))?;
            threads.push(h);
        }
        Ok(Spin {
            region: Mutex::new(()),
            shared,
            threads,
        })
    }

    /// Runs `job` on the calling thread and on the workers that join in time; returns once
    /// every item is done and no worker is inside the job any more.
    fn run(&self, job: Job) {
        let s = &*self.shared;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        // Only the thread holding `region` (or Drop) changes the epoch.
        let e = s.epoch.load(Ordering::Acquire).wrapping_add(1);
        s.gate.store((e & 0xffff_ffff) << 32, Ordering::SeqCst);
        // SeqCst with the parking worker's `parked` increment and epoch re-read: either it sees
        // this epoch or this sees it parked.
        s.epoch.store(e, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // SAFETY: ctx is live for this call. A panic is held until the workers are done with
        // ctx, then resumed.
        let mine = catch_unwind(AssertUnwindSafe(|| unsafe { (job.run)(job.ctx, 0) }));
        // Every item is taken; the workers still inside finish theirs.
        s.gate.fetch_or(CLOSED, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.gate.load(Ordering::Acquire) & INSIDE != 0 {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                // A worker was descheduled mid-item: let it have a core.
                std::thread::yield_now();
            }
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::Release);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    let me = s.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    loop {
        let mut since = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) {
                std::hint::spin_loop();
                continue;
            }
            if since.elapsed() < SPIN {
                continue;
            }
            // Park. `parked` is raised before the epoch is read again under the lock, and the
            // poster bumps the epoch before it reads `parked`, so a post is never missed.
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.parked.fetch_add(1, Ordering::SeqCst);
            while s.epoch.load(Ordering::SeqCst) == seen {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.parked.fetch_sub(1, Ordering::AcqRel);
            drop(g);
            since = Instant::now();
        }
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // Enter the gate of the epoch seen, if it is still open.
        let mut g = s.gate.load(Ordering::SeqCst);
        let entered = loop {
            if g >> 32 != seen & 0xffff_ffff || g & CLOSED != 0 {
                break false;
            }
            match s
                .gate
                .compare_exchange_weak(g, g + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break true,
                Err(now) => g = now,
            }
        };
        if !entered {
            continue;
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            // SAFETY: the poster waits for the workers inside the gate before ctx goes away.
            if catch_unwind(AssertUnwindSafe(|| unsafe { (job.run)(job.ctx, me) })).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
        }
        s.gate.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engine's worker threads (see the module comment). One per loaded model, shared by its
/// sessions.
pub struct Workers {
    rayon: rayon::ThreadPool,
    spin: Option<Spin>,
}

impl Workers {
    /// `threads` threads in all (default: one per available core).
    pub fn new(threads: Option<usize>) -> Result<Workers> {
        let mut pb = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("memwall-cpu-{i}"));
        if let Some(n) = threads {
            if n == 0 {
                return Err(Error::InvalidArgument("threads must be at least 1".into()));
            }
            pb = pb.num_threads(n);
        }
        let rayon = pb
            .build()
            .map_err(|e| Error::InvalidArgument(format!("cannot start worker threads: {e}")))?;
        let n = rayon.current_num_threads();
        let spin = if n > 1 { Some(Spin::new(n - 1)?) } else { None };
        Ok(Workers { rayon, spin })
    }

    /// Runs `f` on one of the rayon pool's threads with the spinning workers serving every
    /// [`for_each_init`] inside it.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let spin = self.spin.as_ref().map(|s| s as *const Spin as usize);
        self.rayon.install(move || {
            let _restore = Restore(CURRENT.with(|c| c.replace(spin)));
            f()
        })
    }
}

/// Puts back the thread's previous spinning pool when dropped, also when unwinding.
struct Restore(Option<usize>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

thread_local! {
    /// The spinning pool serving this thread's regions (a `*const Spin`), set by `install`.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Threads a region on this thread would use: the spinning pool's plus the caller's inside
/// [`Workers::install`], else rayon's current pool.
pub(crate) fn threads() -> usize {
    match CURRENT.with(|c| c.get()) {
        // SAFETY: as in `for_each_init`.
        Some(p) => unsafe { &*(p as *const Spin) }.threads.len() + 1,
        None => rayon::current_num_threads().max(1),
    }
}

/// Runs `f(state, i)` for every i < n, spread over the engine's threads; each participating
/// thread makes its `state` once with `init`. Items run in no particular order.
pub(crate) fn for_each_init<S, I, F>(n: usize, init: I, f: F)
where
    I: Fn() -> S + Sync,
    F: Fn(&mut S, usize) + Sync,
{
    // Taken for the region, so an item that opens a region of its own runs it on rayon
    // instead of re-entering the busy workers.
    let spin = CURRENT.with(|c| c.take());
    let _restore = Restore(spin);
    let Some(spin) = spin else {
        (0..n).into_par_iter().for_each_init(&init, |s, i| f(s, i));
        return;
    };
    // SAFETY: set by `Workers::install` around this call, whose Workers outlives it.
    let spin = unsafe { &*(spin as *const Spin) };
    // Two sessions of one model may run regions at once (each inside its own `install`): the
    // workers serve one region at a time, and the other runs on rayon's pool.
    let Ok(_region) = spin.region.try_lock() else {
        (0..n).into_par_iter().for_each_init(&init, |s, i| f(s, i));
        return;
    };
    /// Participant p owns items [bounds[p], bounds[p + 1]) and takes them in order from
    /// cursor[p], so each thread streams through one contiguous run of the weights (the
    /// hardware prefetchers follow it); a thread whose run is done takes items from the
    /// others' cursors.
    struct Ctx<'a, S, I, F> {
        cursor: Vec<Padded>,
        bounds: Vec<usize>,
        init: &'a I,
        f: &'a F,
        _s: std::marker::PhantomData<fn() -> S>,
    }
    unsafe fn run<S, I: Fn() -> S + Sync, F: Fn(&mut S, usize) + Sync>(ctx: *const (), me: usize) {
        // SAFETY: ctx is the Ctx that `for_each_init` keeps alive while the region runs.
        let c = unsafe { &*(ctx as *const Ctx<S, I, F>) };
        let mut state = None;
        let parts = c.cursor.len();
        for k in 0..parts {
            let p = (me + k) % parts;
            loop {
                let i = c.cursor[p].fetch_add(1, Ordering::Relaxed);
                if i >= c.bounds[p + 1] {
                    break;
                }
                let s = state.get_or_insert_with(c.init);
                (c.f)(s, i);
            }
        }
    }
    let parts = spin.threads.len() + 1;
    let bounds: Vec<usize> = (0..=parts).map(|p| p * n / parts).collect();
    let ctx = Ctx {
        cursor: bounds[..parts]
            .iter()
            .map(|&b| Padded(AtomicUsize::new(b)))
            .collect(),
        bounds,
        init: &init,
        f: &f,
        _s: std::marker::PhantomData,
    };
    spin.run(Job {
        run: run::<S, I, F>,
        ctx: &ctx as *const Ctx<S, I, F> as *const (),
    });
    if spin.shared.panicked.swap(false, Ordering::AcqRel) {
        panic!("a CPU worker thread panicked");
    }
}

/// As [`for_each_init`] over owned items (typically disjoint `&mut` slices of one output).
pub(crate) fn for_each_item_init<T, S, I, F>(items: Vec<T>, init: I, f: F)
where
    T: Send,
    I: Fn() -> S + Sync,
    F: Fn(&mut S, T) + Sync,
{
    struct Slots<T>(Vec<std::cell::UnsafeCell<Option<T>>>);
    // SAFETY: each slot is taken by exactly one thread (for_each_init hands every index out
    // once), and T: Send.
    unsafe impl<T: Send> Sync for Slots<T> {}
    impl<T> Slots<T> {
        /// # Safety
        /// Called at most once per index, with no other reference to slot i live.
        unsafe fn take(&self, i: usize) -> Option<T> {
            // SAFETY: forwarded from the caller.
            unsafe { (*self.0[i].get()).take() }
        }
    }
    let slots = Slots(items.into_iter().map(|t| Some(t).into()).collect());
    let n = slots.0.len();
    for_each_init(n, init, |s, i| {
        // SAFETY: for_each_init hands every index out once.
        if let Some(t) = unsafe { slots.take(i) } {
            f(s, t)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_inside_and_outside_install() {
        let w = Workers::new(Some(3)).unwrap();
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            w.install(|| {
                for _ in 0..50 {
                    for_each_init(
                        n,
                        || (),
                        |_, i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        },
                    );
                }
            });
            for_each_init(
                n,
                || (),
                |_, i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                },
            );
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 51),
                "n = {n}"
            );
        }
    }

    #[test]
    fn regions_from_two_threads_at_once_each_run_every_item() {
        let w = Workers::new(Some(2)).unwrap();
        let run = || {
            for n in 1..300usize {
                let sum = AtomicUsize::new(0);
                w.install(|| {
                    for_each_init(
                        n,
                        || (),
                        |_, i| {
                            sum.fetch_add(i + 1, Ordering::Relaxed);
                        },
                    )
                });
                assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
            }
        };
        std::thread::scope(|s| {
            s.spawn(run);
            s.spawn(run);
        });
    }

    #[test]
    fn parked_workers_wake_for_the_next_region() {
        let w = Workers::new(Some(2)).unwrap();
        let sum = AtomicUsize::new(0);
        w.install(|| {
            for_each_init(
                10,
                || (),
                |_, i| {
                    sum.fetch_add(i, Ordering::Relaxed);
                },
            )
        });
        std::thread::sleep(SPIN * 3);
        w.install(|| {
            for_each_init(
                10,
                || (),
                |_, i| {
                    sum.fetch_add(i, Ordering::Relaxed);
                },
            )
        });
        assert_eq!(sum.load(Ordering::Relaxed), 90);
    }
}
