//! The storage reader: the weights of blocks that are not resident, read from the model file
//! into a ring of slots by one thread, ahead of the compute that needs them.
//!
//! Each streamed block is one large sequential read (its tensors sit together in a GGUF
//! file). The reader cycles through the streamed blocks in the order a forward pass uses them,
//! so while block `l` is computed the next ones are read, and after the last block of a pass the
//! first ones of the next pass are. The compute side waits only when a block is late.
//!
//! Streamed bytes must not pile up in the page cache, where they would count against the
//! process's memory and push out what is resident: reads bypass it (`O_DIRECT`) or drop what
//! they brought in right behind them (`posix_fadvise(DONTNEED)`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::gguf::drop_cache;

/// `O_DIRECT` needs file offsets, lengths and buffer addresses aligned to the logical block
/// size; 4 KiB covers every block device memwall meets.
const DIRECT_ALIGN: usize = 4096;
/// Bytes per read call: the device's full sequential rate, small enough that drop-behind
/// frees the page cache as it goes. (`dd iflag=direct` of 1 GiB on a virtio disk: 1.7-2.0
/// GB/s with 1-4 MiB requests, 1.4-1.5 with 8 MiB, 1.3 with 32 MiB.)
const CHUNK: usize = 2 << 20;

/// How streamed reads keep out of the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// `O_DIRECT`: storage to the slot, no page cache at all.
    Direct,
    /// Buffered reads, each chunk's pages dropped from the page cache right after it is copied.
    DropBehind,
}

impl IoMode {
    pub fn parse(s: &str) -> Result<IoMode> {
        match s {
            "direct" => Ok(IoMode::Direct),
            "drop-behind" | "buffered" => Ok(IoMode::DropBehind),
            _ => Err(Error::InvalidArgument(format!(
                "stream I/O mode {s:?}: expected direct or drop-behind"
            ))),
        }
    }
}

/// One block's weights in the file: the byte range covering all of its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    pub layer: usize,
    pub offset: u64,
    pub len: u64,
}

/// Memory of its own anonymous mapping (Unix), page-aligned for `O_DIRECT` and handed back to
/// the OS when dropped whatever the allocator does with its heap: the expert cache frees and
/// makes MB-sized buffers all the time, and through the heap (glibc raises its mmap threshold
/// after such frees) that fragmented ~8% past the budget. Elsewhere a `Vec` with an aligned
/// start.
struct PageBuf {
    #[cfg(unix)]
    ptr: std::ptr::NonNull<u8>,
    #[cfg(not(unix))]
    vec: Vec<u8>,
    #[cfg(not(unix))]
    start: usize,
    len: usize,
}

// SAFETY: the buffer is owned memory with no interior sharing: `&PageBuf` only reads it and
// `&mut PageBuf` is needed to write it, as for a `Vec<u8>`.
unsafe impl Send for PageBuf {}
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// `len` zeroed bytes (touched now, so they are counted where they are made).
    fn new(len: usize) -> Result<PageBuf> {
        let oom = || Error::OutOfMemory {
            what: format!("stream buffer of {len} bytes"),
        };
        #[cfg(unix)]
        {
            let map_len = len.max(1);
            // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(oom());
            }
            let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or_else(oom)?;
            // SAFETY: the mapping is map_len writable bytes.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, map_len) };
            Ok(PageBuf { ptr, len })
        }
        #[cfg(not(unix))]
        {
            let mut vec = Vec::new();
            vec.try_reserve_exact(len + DIRECT_ALIGN)
                .map_err(|_| oom())?;
            vec.resize(len + DIRECT_ALIGN, 0);
            let start = vec.as_ptr().align_offset(DIRECT_ALIGN);
            Ok(PageBuf { vec, start, len })
        }
    }

    fn bytes(&self) -> &[u8] {
        #[cfg(unix)]
        // SAFETY: ptr is a live mapping of at least len bytes, owned by self.
        return unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) };
        #[cfg(not(unix))]
        &self.vec[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        #[cfg(unix)]
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        return unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        #[cfg(not(unix))]
        &mut self.vec[self.start..self.start + self.len]
    }
}

#[cfg(unix)]
impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}

/// A slot of the ring, holding one block's bytes as read from the file.
pub struct Slot {
    layer: usize,
    /// The slot's memory: `capacity` bytes, 4 KiB aligned.
    buf: PageBuf,
    /// File offset of `buf[0]`.
    base: u64,
    /// Bytes of the file held from `base`.
    len: usize,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("layer", &self.layer)
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

impl Slot {
    fn new(capacity: usize) -> Result<Slot> {
        // Touched now, so the slot is counted where it is made and never faults in a token.
        let buf = PageBuf::new(capacity)?;
        Ok(Slot {
            layer: usize::MAX,
            buf,
            base: 0,
            len: 0,
        })
    }

    /// The block whose bytes the slot holds.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// The `len` bytes at file offset `offset`, if the slot holds them.
    pub fn bytes(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let rel = usize::try_from(offset.checked_sub(self.base)?).ok()?;
        let end = rel.checked_add(len)?;
        (end <= self.len).then(|| &self.buf.bytes()[rel..end])
    }

    fn capacity(&self) -> usize {
        self.buf.len
    }
}

/// Counters of the reader, shared with its thread.
#[derive(Debug, Default)]
struct Counters {
    bytes: AtomicU64,
    reads: AtomicU64,
    read_ns: AtomicU64,
    wait_ns: AtomicU64,
    waits: AtomicU64,
    skipped: AtomicU64,
}

/// What the reader has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ReaderStats {
    /// Bytes read from storage (with `O_DIRECT`, rounded out to whole 4 KiB blocks).
    pub bytes_read: u64,
    /// Blocks read.
    pub blocks_read: u64,
    /// Seconds the reader thread spent in reads.
    pub read_s: f64,
    /// Storage bandwidth achieved while reading, GB/s (bytes / read time).
    pub read_gbps: f64,
    /// Seconds the compute side waited for a block that was late.
    pub wait_s: f64,
    /// Times the compute side found its block not yet read.
    pub waits: u64,
    /// Blocks read but not used (the compute side asked for another one first).
    pub skipped: u64,
}

/// The blocks the reader cycles through, shared with its thread.
#[derive(Debug, Default)]
struct Order {
    /// Streamed blocks in pass order.
    layers: Vec<usize>,
    /// Bumped by every change: the thread starts the new cycle from its first block.
    generation: u64,
    /// The reader is being dropped.
    closed: bool,
}

type SharedOrder = Arc<(std::sync::Mutex<Order>, std::sync::Condvar)>;

/// The reader thread and the ring of slots between it and the compute side.
pub struct LayerReader {
    /// Streamed blocks in pass order (the thread's copy is in `shared`).
    order: Vec<usize>,
    shared: SharedOrder,
    ready: Receiver<std::io::Result<Slot>>,
    free: Option<Sender<Slot>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    mode: IoMode,
    depth: usize,
    slot_bytes: usize,
    path: PathBuf,
}

impl std::fmt::Debug for LayerReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerReader")
            .field("order", &self.order)
            .field("mode", &self.mode)
            .field("depth", &self.depth)
            .finish()
    }
}

/// The model's one reader, shared by the CPU executor and a GPU's stream ring.
pub type SharedReader = Arc<std::sync::Mutex<LayerReader>>;

/// Locks a shared reader; a reader poisoned by a panic elsewhere is an error, not a panic.
pub fn lock(r: &std::sync::Mutex<LayerReader>) -> Result<std::sync::MutexGuard<'_, LayerReader>> {
    r.lock()
        .map_err(|_| Error::InvalidArgument("the stream reader was poisoned".into()))
}

/// `span` rounded out to `DIRECT_ALIGN` (start down, end up): (aligned start, length).
fn aligned(offset: u64, len: u64) -> (u64, usize) {
    let a = DIRECT_ALIGN as u64;
    let start = offset / a * a;
    let end = (offset + len).div_ceil(a) * a;
    (start, (end - start) as usize)
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_: &Path) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "O_DIRECT is Linux-only",
    ))
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, off)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, off)
}

/// Reads `span` into `slot` (whole, or an error naming the shortfall). Returns bytes read.
fn read_block(f: &File, mode: IoMode, span: &BlockSpan, slot: &mut Slot) -> std::io::Result<u64> {
    let (base, len) = match mode {
        IoMode::Direct => aligned(span.offset, span.len),
        IoMode::DropBehind => (span.offset, span.len as usize),
    };
    if len > slot.capacity() {
        return Err(std::io::Error::other(format!(
            "block {} needs {len} bytes, the slot holds {}",
            span.layer,
            slot.capacity()
        )));
    }
    let dst = &mut slot.buf.bytes_mut()[..len];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK);
        let got = read_at(f, &mut dst[done..done + n], base + done as u64)?;
        if mode == IoMode::DropBehind && got > 0 {
            drop_cache(f, base + done as u64, got as u64);
        }
        if got == 0 {
            break;
        }
        done += got;
    }
    // An aligned read may stop at the end of the file, past the block's last byte.
    let need = (span.offset + span.len - base) as usize;
    if done < need {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "block {} ends at byte {}, the file ends at {}",
                span.layer,
                span.offset + span.len,
                base + done as u64
            ),
        ));
    }
    slot.layer = span.layer;
    slot.base = base;
    slot.len = done;
    Ok(done as u64)
}

/// Whether `O_DIRECT` reads work on this file: some file systems (tmpfs, some overlay and
/// network ones) refuse the open, others the first read.
fn direct_works(f: &File) -> bool {
    let mut buf = vec![0u8; 2 * DIRECT_ALIGN];
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
    read_at(f, &mut buf[start..start + DIRECT_ALIGN], 0).is_ok()
}

/// Opens `path` for reads that keep out of the page cache: `O_DIRECT` where the file system
/// takes it (`mode` `None`), else drop-behind; an explicit `Direct` the file system refuses
/// is an error.
pub(crate) fn open_for(path: &Path, mode: Option<IoMode>) -> Result<(File, IoMode)> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let direct = match mode {
        Some(IoMode::DropBehind) => None,
        _ => open_direct(path).ok().filter(direct_works),
    };
    match (direct, mode) {
        (Some(f), _) => Ok((f, IoMode::Direct)),
        (None, Some(IoMode::Direct)) => Err(io(std::io::Error::other(
            "the file system refuses direct I/O (O_DIRECT)",
        ))),
        (None, _) => Ok((File::open(path).map_err(io)?, IoMode::DropBehind)),
    }
}

impl Slot {
    /// A slot holding `span` of `f`, read now (`mode` as `f` was opened).
    pub(crate) fn read(f: &File, mode: IoMode, span: &BlockSpan) -> std::io::Result<Slot> {
        let (_, len) = aligned(span.offset, span.len);
        let mut slot = Slot::new(len).map_err(std::io::Error::other)?;
        read_block(f, mode, span, &mut slot)?;
        Ok(slot)
    }

    /// Bytes of memory the slot holds (whole pages).
    pub(crate) fn footprint(&self) -> usize {
        self.buf.len.div_ceil(4096) * 4096
    }
}

impl LayerReader {
    /// Starts the reader of the file at `path`, which knows every block's span (`spans`) and
    /// cycles through the blocks of `order` (pass order; it may be empty until
    /// [`LayerReader::set_order`]), with `depth` slots each large enough for the largest
    /// block. `mode` `None` uses `O_DIRECT` where the file system takes it, else drop-behind.
    pub fn start(
        path: &Path,
        spans: Vec<BlockSpan>,
        order: Vec<usize>,
        depth: usize,
        mode: Option<IoMode>,
    ) -> Result<LayerReader> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if spans.is_empty() || depth == 0 {
            return Err(Error::InvalidArgument(
                "a stream reader needs at least one block and one slot".into(),
            ));
        }
        if let Some(l) = order.iter().find(|&&l| !spans.iter().any(|s| s.layer == l)) {
            return Err(Error::InvalidArgument(format!(
                "block {l} has no span in the file"
            )));
        }
        let slot_bytes = spans
            .iter()
            .map(|s| aligned(s.offset, s.len).1)
            .max()
            .unwrap_or(0);
        let mut slots = Vec::with_capacity(depth);
        for _ in 0..depth {
            slots.push(Slot::new(slot_bytes)?);
        }
        let (file, mode) = open_for(path, mode)?;
        let counters = Arc::new(Counters::default());
        let (ready_tx, ready) = channel();
        let (free, free_rx) = channel::<Slot>();
        for s in slots {
            let _ = free.send(s);
        }
        let shared: SharedOrder = Arc::default();
        if let Ok(mut o) = shared.0.lock() {
            o.layers = order.clone();
        }
        let (c, sh) = (counters.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("memwall-reader".into())
            .spawn(move || {
                let (mut i, mut seen) = (0usize, 0u64);
                while let Ok(mut slot) = free_rx.recv() {
                    // The next block of the cycle, waiting while there is none.
                    let span = {
                        let Ok(mut o) = sh.0.lock() else { break };
                        while o.layers.is_empty() && !o.closed {
                            o = match sh.1.wait(o) {
                                Ok(o) => o,
                                Err(_) => return,
                            };
                        }
                        if o.closed {
                            break;
                        }
                        if o.generation != seen {
                            (i, seen) = (0, o.generation);
                        }
                        let l = o.layers[i % o.layers.len()];
                        i += 1;
                        spans.iter().find(|s| s.layer == l).copied()
                    };
                    let Some(span) = span else { break };
                    let t = Instant::now();
                    let r = read_block(&file, mode, &span, &mut slot);
                    c.read_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    let r = r.map(|n| {
                        c.bytes.fetch_add(n, Ordering::Relaxed);
                        c.reads.fetch_add(1, Ordering::Relaxed);
                        slot
                    });
                    let failed = r.is_err();
                    if ready_tx.send(r).is_err() || failed {
                        break;
                    }
                }
            })
            .map_err(io)?;
        Ok(LayerReader {
            order,
            shared,
            ready,
            free: Some(free),
            thread: Some(thread),
            counters,
            mode,
            depth,
            slot_bytes,
            path: path.to_path_buf(),
        })
    }

    /// Makes the reader cycle through `order` from now on, starting from its first block (a
    /// placement or residency change between passes). Blocks already read that the new cycle
    /// does not ask for next are skipped when the compute side passes them.
    pub fn set_order(&mut self, order: &[usize]) {
        if order == self.order.as_slice() {
            return;
        }
        self.order = order.to_vec();
        if let Ok(mut o) = self.shared.0.lock() {
            o.layers = order.to_vec();
            o.generation += 1;
        }
        self.shared.1.notify_all();
    }

    /// The I/O mode the reader settled on.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Slots in the ring.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Bytes of one slot (the largest block, rounded out to whole 4 KiB blocks).
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The streamed blocks, in the order the reader reads them.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The slot holding block `layer`, waiting for the reader if it is not there yet. Blocks
    /// read ahead that the caller skips (a pass cut short) go back to the reader.
    pub fn acquire(&mut self, layer: usize) -> Result<Slot> {
        if !self.order.contains(&layer) {
            return Err(Error::InvalidArgument(format!(
                "block {layer} is not streamed"
            )));
        }
        let lost = |path: &Path, e: std::io::Error| Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(e.kind(), format!("streaming a block: {e}")),
        };
        loop {
            let got = match self.ready.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => {
                    let t = Instant::now();
                    let r = self.ready.recv();
                    let c = &self.counters;
                    c.wait_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    c.waits.fetch_add(1, Ordering::Relaxed);
                    match r {
                        Ok(r) => r,
                        Err(_) => {
                            return Err(lost(
                                &self.path,
                                std::io::Error::other("the reader thread stopped"),
                            ))
                        }
                    }
                }
                Err(TryRecvError::Disconnected) => {
                    return Err(lost(
                        &self.path,
                        std::io::Error::other("the reader thread stopped"),
                    ))
                }
            };
            let slot = got.map_err(|e| lost(&self.path, e))?;
            if slot.layer == layer {
                return Ok(slot);
            }
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            self.release(slot);
        }
    }

    /// Gives a slot back to the reader, which fills it with the next block in its cycle.
    pub fn release(&mut self, slot: Slot) {
        if let Some(f) = &self.free {
            let _ = f.send(slot);
        }
    }

    pub fn stats(&self) -> ReaderStats {
        let c = &self.counters;
        let bytes = c.bytes.load(Ordering::Relaxed);
        let read_s = c.read_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        ReaderStats {
            bytes_read: bytes,
            blocks_read: c.reads.load(Ordering::Relaxed),
            read_s,
            read_gbps: if read_s > 0.0 {
                bytes as f64 / read_s / 1e9
            } else {
                0.0
            },
            wait_s: c.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            waits: c.waits.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for LayerReader {
    fn drop(&mut self) {
        // Closed, and without a sender of free slots: the thread ends after its read in
        // progress.
        if let Ok(mut o) = self.shared.0.lock() {
            o.closed = true;
        }
        self.shared.1.notify_all();
        self.free = None;
        while self.ready.try_recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file of `len` patterned bytes, named by the test (tests run in parallel).
    fn file_of(tag: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let p =
            std::env::temp_dir().join(format!("memwall-reader-{}-{tag}.bin", std::process::id()));
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        (p, data)
    }

    fn spans() -> Vec<BlockSpan> {
        // Unaligned starts and lengths, the last block ending at the end of the file.
        vec![
            BlockSpan {
                layer: 1,
                offset: 100,
                len: 9000,
            },
            BlockSpan {
                layer: 3,
                offset: 20_000,
                len: 33_333,
            },
            BlockSpan {
                layer: 4,
                offset: 60_001,
                len: 5_535,
            },
        ]
    }

    #[test]
    fn blocks_come_in_pass_order_with_the_file_bytes_in_both_modes() {
        let (p, data) = file_of("order", 65_536);
        for mode in [None, Some(IoMode::DropBehind)] {
            let order = spans().iter().map(|s| s.layer).collect();
            let mut r = LayerReader::start(&p, spans(), order, 2, mode).unwrap();
            for _pass in 0..3 {
                for s in spans() {
                    let slot = r.acquire(s.layer).unwrap();
                    assert_eq!(slot.layer(), s.layer);
                    let (o, n) = (s.offset as usize, s.len as usize);
                    assert_eq!(slot.bytes(s.offset, n).unwrap(), &data[o..o + n]);
                    assert!(slot.bytes(s.offset + 1, n + 4096).is_none());
                    r.release(slot);
                }
            }
            let st = r.stats();
            assert!(st.blocks_read >= 9, "{st:?}");
            assert_eq!(st.skipped, 0);
        }
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_skipped_block_goes_back_and_unknown_blocks_are_refused() {
        let (p, data) = file_of("skip", 65_536);
        let mut r =
            LayerReader::start(&p, spans(), vec![1, 3, 4], 3, Some(IoMode::DropBehind)).unwrap();
        // A pass cut short after block 1: the next pass asks for block 1 again.
        let s = r.acquire(1).unwrap();
        r.release(s);
        let s = r.acquire(1).unwrap();
        assert_eq!(s.bytes(100, 10).unwrap(), &data[100..110]);
        r.release(s);
        assert!(r.stats().skipped >= 2);
        assert!(r.acquire(2).is_err());
        // A new order: block 4 alone, then blocks 3 and 1.
        r.set_order(&[4]);
        for _ in 0..3 {
            let s = r.acquire(4).unwrap();
            assert_eq!(s.bytes(60_001, 5).unwrap(), &data[60_001..60_006]);
            r.release(s);
        }
        r.set_order(&[3, 1]);
        for l in [3, 1, 3, 1] {
            let s = r.acquire(l).unwrap();
            assert_eq!(s.layer(), l);
            r.release(s);
        }
        // An empty order parks the thread; dropping the reader still ends it.
        r.set_order(&[]);
        drop(r);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_block_past_the_end_of_the_file_is_an_error_not_a_hang() {
        let (p, _) = file_of("eof", 10_000);
        let bad = vec![BlockSpan {
            layer: 0,
            offset: 8_000,
            len: 4_000,
        }];
        for mode in [None, Some(IoMode::DropBehind)] {
            match LayerReader::start(&p, bad.clone(), vec![0], 2, mode) {
                Ok(mut r) => {
                    let e = r.acquire(0).unwrap_err().to_string();
                    assert!(e.contains("ends at byte 12000"), "{e}");
                    assert!(r.acquire(0).is_err());
                }
                Err(e) => panic!("start failed: {e}"),
            }
        }
        std::fs::remove_file(p).unwrap();
    }
}
