//! The expert cache: under a memory budget too small for a mixture-of-experts model, the
//! experts are the unit of residency. The dense part of every block (attention, norms, router)
//! stays in memory; the rest of the budget holds the experts routed to most (decayed routing
//! counts), and an expert a token needs that is not held is read from storage as its three
//! contiguous slices (gate, up and down rows of the stacked tensors), bypassing the page cache
//! as the block reader does.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::reader::{open_for, BlockSpan, IoMode, Slot};
use crate::error::{Error, Result};

/// A routing count loses this fraction of its weight at each pass of its block, so the cache
/// follows what the recent tokens use (a half-life of ~35 tokens) more than what the prompt did.
const DECAY: f32 = 0.98;

/// Where each block's expert stacks lie in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLayout {
    pub n_expert: usize,
    /// `[n_layer]`: the gate, up and down stacks' (file offset, bytes of one expert).
    pub stacks: Vec<[(u64, u64); 3]>,
}

impl ExpertLayout {
    /// The file range of part `p` (0 gate, 1 up, 2 down) of expert `e` of block `l`.
    fn span(&self, l: usize, e: usize, p: usize) -> BlockSpan {
        let (offset, per) = self.stacks[l][p];
        BlockSpan {
            layer: l,
            offset: offset + e as u64 * per,
            len: per,
        }
    }

    /// Bytes of one expert of block `l` in the file.
    pub fn expert_bytes(&self, l: usize) -> u64 {
        self.stacks[l].iter().map(|&(_, per)| per).sum()
    }

    /// Memory one expert of block `l` takes in the cache: each part read into its own pages,
    /// rounded out to whole 4 KiB blocks.
    pub fn held_bytes(&self, l: usize) -> u64 {
        const A: u64 = 4096;
        (0..3)
            .map(|p| {
                let s = self.span(l, 0, p);
                // The worst case over experts: a slice straddling one more block.
                (s.len.div_ceil(A) + 1) * A
            })
            .sum()
    }
}

/// Experts a pass asked for, each as the cache holds it (`None`: not held).
pub type Held = Vec<Option<Arc<Expert>>>;

/// One expert's bytes as read: its gate, up and down slices.
#[derive(Debug)]
pub struct Expert {
    parts: [Slot; 3],
}

impl Expert {
    /// The `len` bytes at file offset `offset`, if one of the slices holds them.
    pub fn bytes(&self, offset: u64, len: usize) -> Option<&[u8]> {
        self.parts.iter().find_map(|s| s.bytes(offset, len))
    }

    fn footprint(&self) -> u64 {
        self.parts.iter().map(|s| s.footprint() as u64).sum()
    }
}

/// What the cache has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Experts a pass needed that were held.
    pub hits: u64,
    /// Experts a pass needed that were read from storage.
    pub misses: u64,
    /// Bytes read from storage (with `O_DIRECT`, rounded out to whole 4 KiB blocks).
    pub bytes_read: u64,
    /// Seconds spent reading.
    pub read_s: f64,
    /// Of those, the seconds the passes waited for the reads (the rest overlapped compute
    /// with the experts held).
    pub wait_s: f64,
    /// Experts read ahead of their block's router on a guess (the next block's router applied
    /// to this block's input), and of those, the ones the block then needed (each also counted
    /// as a miss: the cache did not hold it).
    pub read_ahead: u64,
    pub read_ahead_used: u64,
    /// Experts held now, and their bytes, of `capacity_bytes`.
    pub held: usize,
    pub held_bytes: u64,
    pub capacity_bytes: u64,
}

impl ExpertStats {
    /// Hits over the experts needed (1 when none was needed).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            1.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// The counters since `earlier` (`held*` and the capacity are now's).
    pub fn since(&self, earlier: &ExpertStats) -> ExpertStats {
        ExpertStats {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            bytes_read: self.bytes_read - earlier.bytes_read,
            read_s: self.read_s - earlier.read_s,
            wait_s: self.wait_s - earlier.wait_s,
            read_ahead: self.read_ahead - earlier.read_ahead,
            read_ahead_used: self.read_ahead_used - earlier.read_ahead_used,
            ..*self
        }
    }
}

/// Slices read at once: on the development machine's virtio disk (`O_DIRECT`) a 30B-A3B-width
/// decode under a 2 GiB budget read its ~290 MB of misses per token at 1.0 GB/s one at a time
/// and 1.2 GB/s eight at a time (2.33 -> 2.58 tok/s). Whole experts (three slices each) are
/// read together so each can be handed on as soon as its group is in.
pub const EXPERTS_IN_FLIGHT: usize = 3;

/// The experts of a pass that the cache does not hold, to be read from storage. Reading needs
/// no lock on the cache: the pass computes with the experts it holds meanwhile.
#[derive(Debug)]
pub struct Misses {
    file: Arc<File>,
    mode: IoMode,
    path: PathBuf,
    /// The missing experts, in the order the pass needs them, and their gate, up and down
    /// slices in the file.
    experts: Vec<usize>,
    spans: Vec<[BlockSpan; 3]>,
}

impl Misses {
    /// The missing experts, in the order they are read.
    pub fn experts(&self) -> &[usize] {
        &self.experts
    }

    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }

    /// Keeps only the missing experts `keep` accepts (the others are had elsewhere).
    pub fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        let (experts, spans) = self
            .experts
            .iter()
            .zip(&self.spans)
            .filter(|(&e, _)| keep(e))
            .map(|(&e, sp)| (e, *sp))
            .unzip();
        self.experts = experts;
        self.spans = spans;
    }

    /// Reads the missing experts in order, a few at a time with their slices in parallel,
    /// handing each to `each` as soon as its group is in (an error names the file); stops
    /// early when `each` returns false. Returns the seconds spent reading.
    pub fn read_each(&self, mut each: impl FnMut(usize, Result<Expert>) -> bool) -> f64 {
        let t0 = Instant::now();
        let (file, mode) = (&*self.file, self.mode);
        let ids = self.experts.chunks(EXPERTS_IN_FLIGHT);
        for (ids, spans) in ids.zip(self.spans.chunks(EXPERTS_IN_FLIGHT)) {
            let got: Vec<std::io::Result<Slot>> = std::thread::scope(|scope| {
                let handles: Vec<_> = spans
                    .iter()
                    .flatten()
                    .map(|sp| scope.spawn(move || Slot::read(file, mode, sp)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(std::io::Error::other("a read panicked")))
                    })
                    .collect()
            });
            let mut got = got.into_iter();
            for &e in ids {
                let mut part = || -> Result<Slot> {
                    got.next()
                        .unwrap_or_else(|| Err(std::io::Error::other("a slice was not read")))
                        .map_err(|source| Error::Io {
                            path: self.path.clone(),
                            source,
                        })
                };
                let x = (|| {
                    Ok(Expert {
                        parts: [part()?, part()?, part()?],
                    })
                })();
                if !each(e, x) {
                    return t0.elapsed().as_secs_f64();
                }
            }
        }
        t0.elapsed().as_secs_f64()
    }
}

/// The model's cache, shared by its sessions.
pub type SharedExpertCache = Arc<std::sync::Mutex<ExpertCache>>;

/// The cache.
#[derive(Debug)]
pub struct ExpertCache {
    file: Arc<File>,
    mode: IoMode,
    path: PathBuf,
    layout: ExpertLayout,
    capacity: u64,
    used: u64,
    entries: HashMap<(usize, usize), Arc<Expert>>,
    /// `[n_layer * n_expert]` decayed routing counts.
    score: Vec<f32>,
    stats: ExpertStats,
}

impl ExpertCache {
    /// A cache of `capacity` bytes (0: every expert is read when needed) over the experts of
    /// the file at `path` (`mode` as [`super::LayerReader::start`] takes it). The experts a
    /// pass uses but the cache does not keep live beside it until the pass is done (the plan
    /// counts that working set apart).
    pub fn open(
        path: &Path,
        mode: Option<IoMode>,
        layout: ExpertLayout,
        capacity: u64,
    ) -> Result<ExpertCache> {
        let n_layer = layout.stacks.len();
        let (file, mode) = open_for(path, mode)?;
        Ok(ExpertCache {
            file: Arc::new(file),
            mode,
            path: path.to_path_buf(),
            score: vec![0.0; n_layer * layout.n_expert],
            layout,
            capacity,
            used: 0,
            entries: HashMap::new(),
            stats: ExpertStats {
                capacity_bytes: capacity,
                ..Default::default()
            },
        })
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }

    pub fn stats(&self) -> ExpertStats {
        ExpertStats {
            held: self.entries.len(),
            held_bytes: self.used,
            ..self.stats
        }
    }

    /// Counts a pass of block `l`: `uses[e]` (`[n_expert]`) tokens routed to expert e. The
    /// block's routing counts decay first.
    pub fn count(&mut self, l: usize, uses: &[u32]) -> Result<()> {
        let n_expert = self.layout.n_expert;
        if l >= self.layout.stacks.len() || uses.len() != n_expert {
            return Err(Error::InvalidArgument(format!(
                "routing counts of {} experts for block {l}: the model has {} blocks of \
                 {n_expert} experts",
                uses.len(),
                self.layout.stacks.len()
            )));
        }
        let scores = &mut self.score[l * n_expert..(l + 1) * n_expert];
        for (s, &u) in scores.iter_mut().zip(uses) {
            *s = *s * DECAY + u as f32;
        }
        Ok(())
    }

    /// Experts `ids` of block `l` (distinct, all needed at once by this pass), held or read
    /// now, in the order asked.
    pub fn fetch(&mut self, l: usize, ids: &[usize]) -> Result<Vec<Arc<Expert>>> {
        let (held, misses) = self.lookup(l, ids)?;
        let mut read = Vec::with_capacity(misses.experts.len());
        let read_s = misses.read_each(|e, x| {
            read.push((e, x));
            true
        });
        // Nothing overlapped the reads: the pass waited for all of them.
        self.add_times(read_s, read_s);
        let mut read = read.into_iter();
        let mut out = Vec::with_capacity(ids.len());
        for (&e, h) in ids.iter().zip(held) {
            match h {
                Some(x) => out.push(x),
                None => {
                    let (got, x) = read.next().ok_or_else(|| {
                        Error::InvalidArgument(format!("expert {e} of block {l} was not read"))
                    })?;
                    debug_assert_eq!(got, e);
                    out.push(self.admit_read(l, e, x?, ids));
                }
            }
        }
        Ok(out)
    }

    /// Experts `ids` of block `l` (distinct, all needed by this pass): those held (`None`
    /// where not), and the misses to read, in the order asked. Counts the hits and misses.
    pub fn lookup(&mut self, l: usize, ids: &[usize]) -> Result<(Held, Misses)> {
        let misses = self.absent(l, ids)?;
        let held: Held = ids
            .iter()
            .map(|&e| self.entries.get(&(l, e)).cloned())
            .collect();
        self.stats.hits += (ids.len() - misses.experts.len()) as u64;
        self.stats.misses += misses.experts.len() as u64;
        Ok((held, misses))
    }

    /// Experts `ids` of block `l` that the cache does not hold, to read ahead of the block's
    /// pass on a guess (nothing is counted: the pass counts what it needs).
    pub fn absent(&self, l: usize, ids: &[usize]) -> Result<Misses> {
        let n_expert = self.layout.n_expert;
        if l >= self.layout.stacks.len() || ids.iter().any(|&e| e >= n_expert) {
            return Err(Error::InvalidArgument(format!(
                "experts {ids:?} of block {l}: the model has {} blocks of {n_expert} experts",
                self.layout.stacks.len()
            )));
        }
        let experts: Vec<usize> = ids
            .iter()
            .copied()
            .filter(|&e| !self.entries.contains_key(&(l, e)))
            .collect();
        let spans = experts
            .iter()
            .map(|&e| [0, 1, 2].map(|p| self.layout.span(l, e, p)))
            .collect();
        Ok(Misses {
            file: self.file.clone(),
            mode: self.mode,
            path: self.path.clone(),
            experts,
            spans,
        })
    }

    /// Counts experts read ahead, and of those, the ones a pass then needed.
    pub fn count_read_ahead(&mut self, read: u64, used: u64) {
        self.stats.read_ahead += read;
        self.stats.read_ahead_used += used;
    }

    /// Expert `e` of block `l` as read for a [`Misses`]: counted, and held if its score earns
    /// a place (`needed`: block `l`'s experts of this pass, which are not dropped for it).
    pub fn admit_read(&mut self, l: usize, e: usize, x: Expert, needed: &[usize]) -> Arc<Expert> {
        self.count_read(l, e);
        self.hold(l, e, x, needed)
    }

    /// [`admit_read`](Self::admit_read) for an expert whose bytes were counted when read.
    pub fn hold(&mut self, l: usize, e: usize, x: Expert, needed: &[usize]) -> Arc<Expert> {
        let x = Arc::new(x);
        self.admit(l, e, needed, &x);
        x
    }

    /// Adds a pass's reading time and the part of it the pass waited for (what compute did
    /// not overlap).
    pub fn add_times(&mut self, read_s: f64, wait_s: f64) {
        self.stats.read_s += read_s;
        self.stats.wait_s += wait_s;
    }

    /// Adds expert `e` of block `l`'s bytes read from storage to the statistics.
    pub fn count_read(&mut self, l: usize, e: usize) {
        self.stats.bytes_read += (0..3)
            .map(|p| {
                let s = self.layout.span(l, e, p);
                match self.mode {
                    IoMode::Direct => {
                        (s.offset + s.len).div_ceil(4096) * 4096 - s.offset / 4096 * 4096
                    }
                    IoMode::DropBehind => s.len,
                }
            })
            .sum::<u64>();
    }

    /// Holds `x` (expert `e` of block `l`) if the cache has room, making room by dropping the
    /// experts of lowest score that this pass does not need (`needed`: block `l`'s experts of
    /// this pass); an expert scoring lower than all it would replace is not held.
    fn admit(&mut self, l: usize, e: usize, needed: &[usize], x: &Arc<Expert>) {
        let size = x.footprint();
        let n_expert = self.layout.n_expert;
        let score = |k: &(usize, usize)| self.score[k.0 * n_expert + k.1];
        let mine = self.score[l * n_expert + e];
        while self.used + size > self.capacity {
            let victim = self
                .entries
                .keys()
                .filter(|k| !(k.0 == l && needed.contains(&k.1)))
                .min_by(|a, b| score(a).total_cmp(&score(b)))
                .copied();
            match victim {
                Some(v) if score(&v) <= mine => {
                    if let Some(old) = self.entries.remove(&v) {
                        self.used -= old.footprint();
                    }
                }
                _ => return,
            }
        }
        self.used += size;
        self.entries.insert((l, e), x.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of 2 blocks x 4 experts x 3 parts of two pages, each byte naming its place.
    /// `name`: the file's, one per test (the tests run in parallel).
    fn file(name: &str) -> (PathBuf, ExpertLayout) {
        let dir = std::env::temp_dir().join(format!("memwall-experts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let per = 8192u64;
        let mut bytes = Vec::new();
        let mut stacks = Vec::new();
        for l in 0..2u8 {
            let mut s = [(0, per); 3];
            for (p, slot) in s.iter_mut().enumerate() {
                slot.0 = bytes.len() as u64;
                for e in 0..4u8 {
                    bytes.extend(std::iter::repeat_n(l * 16 + p as u8 * 4 + e, per as usize));
                }
            }
            stacks.push(s);
        }
        std::fs::write(&path, bytes).unwrap();
        (
            path,
            ExpertLayout {
                n_expert: 4,
                stacks,
            },
        )
    }

    #[test]
    fn holds_the_most_used_experts_and_reads_the_others() {
        let (path, layout) = file("held.bin");
        // Room for 3 experts of 3 page-aligned parts of two pages each.
        let one = 3 * 8192;
        assert!(layout.held_bytes(0) >= one);
        let mut c = ExpertCache::open(&path, None, layout.clone(), 3 * one).unwrap();
        let uses = |pairs: &[(usize, u32)]| {
            let mut u = vec![0u32; 4];
            pairs.iter().for_each(|&(e, n)| u[e] = n);
            u
        };
        c.count(0, &uses(&[(1, 3), (2, 1)])).unwrap();
        let got = c.fetch(0, &[1, 2]).unwrap();
        for (x, e) in got.iter().zip([1u8, 2]) {
            for p in 0..3 {
                let s = layout.span(0, e as usize, p);
                let b = x.bytes(s.offset, s.len as usize).unwrap();
                assert!(b.iter().all(|&v| v == p as u8 * 4 + e), "part {p} of {e}");
            }
        }
        assert_eq!(
            (c.stats().misses, c.stats().hits, c.stats().held),
            (2, 0, 2)
        );
        c.count(0, &uses(&[(1, 1)])).unwrap();
        c.fetch(0, &[1]).unwrap();
        assert_eq!(c.stats().hits, 1);
        // Block 1's expert 0 fits; then expert 3 of block 1 (score 1) replaces the lowest
        // scored one not needed now: block 0's expert 2 (decayed below 1).
        c.count(1, &uses(&[(0, 5)])).unwrap();
        c.fetch(1, &[0]).unwrap();
        c.count(1, &uses(&[(3, 1)])).unwrap();
        c.fetch(1, &[3]).unwrap();
        let s = c.stats();
        assert_eq!((s.held, s.misses), (3, 4));
        assert!(s.held_bytes <= s.capacity_bytes);
        assert!(c.entries.contains_key(&(1, 3)) && !c.entries.contains_key(&(0, 2)));
        assert!(c.entries.contains_key(&(0, 1)) && c.entries.contains_key(&(1, 0)));
        assert!(s.bytes_read >= 4 * layout.expert_bytes(0));
        // No room: every expert is read and none kept.
        let mut c = ExpertCache::open(&path, None, layout, 0).unwrap();
        c.count(0, &uses(&[(1, 1)])).unwrap();
        assert_eq!(c.fetch(0, &[1]).unwrap().len(), 1);
        assert_eq!((c.stats().held, c.stats().misses), (0, 1));
    }

    #[test]
    fn misses_are_read_apart_from_the_cache_and_handed_on_in_order() {
        let (path, layout) = file("apart.bin");
        let one = 3 * 8192;
        let mut c = ExpertCache::open(&path, None, layout.clone(), one).unwrap();
        c.count(1, &[0, 2, 1, 4]).unwrap();
        let (held, misses) = c.lookup(1, &[3, 0, 1, 2]).unwrap();
        assert!(held.iter().all(|h| h.is_none()));
        assert_eq!(misses.experts(), &[3, 0, 1, 2]);
        // Stopping early: only the first expert is handed on.
        let mut seen = Vec::new();
        misses.read_each(|e, _| {
            seen.push(e);
            false
        });
        assert_eq!(seen, [3]);
        let mut got = Vec::new();
        let read_s = misses.read_each(|e, x| {
            got.push((e, x.unwrap()));
            true
        });
        assert!(read_s >= 0.0);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [3, 0, 1, 2]);
        for (e, x) in &got {
            for p in 0..3 {
                let s = layout.span(1, *e, p);
                let b = x.bytes(s.offset, s.len as usize).unwrap();
                assert!(
                    b.iter().all(|&v| v == 16 + p as u8 * 4 + *e as u8),
                    "{e} {p}"
                );
            }
        }
        // Room for one: the best scored of those read (expert 3) is held.
        for (e, x) in got {
            c.admit_read(1, e, x, &[3, 0, 1, 2]);
        }
        c.add_times(0.5, 0.25);
        let s = c.stats();
        assert_eq!((s.misses, s.hits, s.held), (4, 0, 1));
        assert_eq!((s.read_s, s.wait_s), (0.5, 0.25));
        assert!(c.entries.contains_key(&(1, 3)));
        assert_eq!(s.bytes_read, 4 * layout.expert_bytes(1));
        let (held, misses) = c.lookup(1, &[2, 3]).unwrap();
        assert!(held[0].is_none() && held[1].is_some());
        assert_eq!(misses.experts(), &[2]);
        assert_eq!(c.stats().hits, 1);
        assert!(c.lookup(2, &[0]).is_err() && c.lookup(0, &[4]).is_err());
    }
}
