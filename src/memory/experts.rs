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
            ..*self
        }
    }
}

/// The model's cache, shared by its sessions.
pub type SharedExpertCache = Arc<std::sync::Mutex<ExpertCache>>;

/// The cache.
#[derive(Debug)]
pub struct ExpertCache {
    file: File,
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
            file,
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
        let n_expert = self.layout.n_expert;
        if l >= self.layout.stacks.len() || ids.iter().any(|&e| e >= n_expert) {
            return Err(Error::InvalidArgument(format!(
                "experts {ids:?} of block {l}: the model has {} blocks of {n_expert} experts",
                self.layout.stacks.len()
            )));
        }
        let missing: Vec<usize> = ids
            .iter()
            .copied()
            .filter(|&e| !self.entries.contains_key(&(l, e)))
            .collect();
        self.stats.hits += (ids.len() - missing.len()) as u64;
        self.stats.misses += missing.len() as u64;
        let read = self.read_all(l, &missing)?;
        let mut out = Vec::with_capacity(ids.len());
        let mut read = missing.iter().zip(read);
        for &e in ids {
            if let Some(x) = self.entries.get(&(l, e)) {
                out.push(x.clone());
                continue;
            }
            let (_, x) = read.next().ok_or_else(|| {
                Error::InvalidArgument(format!("expert {e} of block {l} was not read"))
            })?;
            let x = Arc::new(x);
            self.admit(l, e, ids, &x);
            out.push(x);
        }
        Ok(out)
    }

    /// Reads experts `es` of block `l` from storage, their slices in parallel (a few reads
    /// in flight keep the storage busier than one: a decoded token's misses are up to
    /// `n_expert_used` experts of ~1 MB slices).
    fn read_all(&mut self, l: usize, es: &[usize]) -> Result<Vec<Expert>> {
        /// Reads in flight at once: on the development machine's virtio disk (O_DIRECT) a
        /// 30B-A3B-width decode under a 2 GiB budget read its ~290 MB of misses per token at
        /// 1.0 GB/s one at a time and 1.2 GB/s eight at a time (2.33 -> 2.58 tok/s).
        const IN_FLIGHT: usize = 8;
        let t0 = Instant::now();
        let spans: Vec<BlockSpan> = es
            .iter()
            .flat_map(|&e| (0..3).map(move |p| (e, p)))
            .map(|(e, p)| self.layout.span(l, e, p))
            .collect();
        let (file, mode) = (&self.file, self.mode);
        let mut slots: Vec<std::io::Result<Slot>> = Vec::with_capacity(spans.len());
        for chunk in spans.chunks(IN_FLIGHT) {
            let got: Vec<std::io::Result<Slot>> = std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
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
            slots.extend(got);
        }
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        let mut slots = slots.into_iter();
        let mut out = Vec::with_capacity(es.len());
        for _ in es {
            let mut part = || -> Result<Slot> {
                slots
                    .next()
                    .unwrap_or_else(|| Err(std::io::Error::other("a slice was not read")))
                    .map_err(io)
            };
            out.push(Expert {
                parts: [part()?, part()?, part()?],
            });
        }
        self.stats.read_s += t0.elapsed().as_secs_f64();
        for &e in es {
            self.count_read(l, e);
        }
        Ok(out)
    }

    /// Adds expert `e` of block `l`'s bytes read from storage to the statistics.
    fn count_read(&mut self, l: usize, e: usize) {
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
    fn file() -> (PathBuf, ExpertLayout) {
        let dir = std::env::temp_dir().join(format!("memwall-experts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.bin");
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
        let (path, layout) = file();
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
}
