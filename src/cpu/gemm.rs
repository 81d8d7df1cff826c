//! Dispatch to the AVX-512 GEMM (`gemm512`, x86_64 only): which calls take it, the call, and
//! the weights packed for it once at load (`PackedWeight`).

#[cfg(target_arch = "x86_64")]
use super::{gemm512, lanes_avx2};
use super::{Isa, MatmulScratch, Part, WeightView};
use crate::{Error, GgmlType, Result};

/// How a matmul call's weights go to the AVX-512 GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gemm {
    /// Not this ISA, too few tokens, or no weight in a GEMM format.
    No,
    /// Every weight is in a GEMM format: one `run_gemm` for all of them.
    All,
    /// Some are and some are not: one matmul each, so every weight's values do not depend on
    /// what it is fused with.
    Mixed,
}

/// The one predicate for the GEMM: which of `Gemm` a call of `ws` over `n_tokens` takes.
pub(super) fn gemm_plan(isa: Isa, ws: &[WeightView], n_tokens: usize) -> Gemm {
    #[cfg(target_arch = "x86_64")]
    {
        if n_tokens < gemm512::MIN_TOKENS {
            return Gemm::No;
        }
        let n = ws.iter().filter(|w| gemm_fmt(isa, w).is_some()).count();
        match n {
            0 => Gemm::No,
            n if n == ws.len() => Gemm::All,
            _ => Gemm::Mixed,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, ws, n_tokens);
        Gemm::No
    }
}

/// The GEMM layout `w` runs in on `isa`, if any: a format `isa` has a packed layout for
/// (`PackedWeight::supported`). The formats of `lanes` are packed by a portable packer that is
/// too slow to run per call, so they take the GEMM only with a copy packed at load; without
/// one (`--no-repack`, blocks streamed from storage) they run the row kernels for every batch
/// size alike.
#[cfg(target_arch = "x86_64")]
fn gemm_fmt(isa: Isa, w: &WeightView) -> Option<gemm512::Kind> {
    let k = gemm512::Kind::of(w.ty).filter(|_| w.cols > 0 && PackedWeight::supported(isa, w.ty))?;
    (matches!(k, gemm512::Kind::Gathered(_)) || w.packed.is_some()).then_some(k)
}

/// The GEMM over `parts` on `isa` (`gemm_plan` returned `All`, same cols) with `scratch.act`
/// quantized.
pub(super) fn run_gemm(
    isa: Isa,
    parts: &[Part],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let gparts: Vec<gemm512::Part> = parts
            .iter()
            .filter_map(|&(w, rb)| {
                Some(gemm512::Part {
                    fmt: gemm_fmt(isa, w)?,
                    data: w.data,
                    packed: w.packed,
                    rows: w.rows,
                    rb,
                })
            })
            .collect();
        let nch = parts.first().map_or(0, |(w, _)| w.cols / 32);
        // SAFETY: gemm_plan returned All only for formats `isa` has a GEMM for (AVX2 and
        // AVX-VNNI: packed `lanes` formats it supports, each with its packed copy), and
        // check_args verified `isa`'s availability; check_args also verified every part's byte
        // size (rows x rb bytes, rb = cols / 32 blocks) and ys' lengths; all parts share x's cols; a packed
        // copy's size was checked by `WeightView::with_packed`.
        unsafe {
            gemm512::run(
                isa,
                &gparts,
                nch,
                &scratch.act,
                n_tokens,
                ys,
                &mut scratch.yt,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, parts, n_tokens, ys, scratch);
}

/// A weight rearranged once (at load) into the layout the ISA's GEMM reads, so its matmuls
/// skip the per-call rearrangement (`gemm512`): `data` is [rows.div_ceil(16) panels][cols / 32
/// chunks][16 x block bytes] (as many bytes as the GGUF rows rounded up to 16 rows), anonymous
/// memory that replaces reading the weight's mmap pages.
#[derive(Debug)]
pub struct PackedWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl PackedWeight {
    /// Whether `isa` has a packed layout for `ty`: `Isa::Avx512Vnni` for Q4_0, Q4_1, Q8_0,
    /// Q5_0, Q5_1, IQ4_NL and Q2_K..Q6_K; `Isa::AvxVnni` for those but the first three, and
    /// `Isa::Avx2` for those but IQ4_NL too (`lanes_avx2`). `pack` returns `None` for the others.
    pub fn supported(isa: Isa, ty: GgmlType) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use gemm512::Kind;
            match (isa, Kind::of(ty)) {
                (Isa::Avx512Vnni, Some(_)) => true,
                (Isa::Avx2 | Isa::AvxVnni, Some(Kind::Packed(l))) => {
                    lanes_avx2::supported(l, isa == Isa::AvxVnni)
                }
                _ => false,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, ty);
            false
        }
    }

    /// Bytes `pack` would allocate for `rows` x `cols` of `ty` on `isa` (0 where unsupported):
    /// what the memory plan counts.
    pub fn bytes_for(isa: Isa, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = gemm512::Kind::of(ty).filter(|_| Self::supported(isa, ty)) {
            return gemm512::packed_bytes(f, rows, cols / 32) as u64;
        }
        let _ = (isa, ty, rows, cols);
        0
    }

    /// `w` packed for `isa`'s GEMM (all threads of the current rayon pool), or `None` where
    /// `isa` has no packed layout for it or this CPU lacks `isa`.
    pub fn pack(isa: Isa, w: &WeightView) -> Result<Option<PackedWeight>> {
        if !Self::supported(isa, w.ty) || !isa.available() || w.cols == 0 {
            return Ok(None);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let Some(fmt) = gemm512::Kind::of(w.ty) else {
                return Ok(None);
            };
            let nch = w.cols / 32;
            let n = gemm512::packed_bytes(fmt, w.rows, nch);
            let mut data = Vec::new();
            data.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
                what: format!("packed {} weight of {}x{} ({n} B)", w.ty, w.rows, w.cols),
            })?;
            advise_huge_pages(data.as_ptr(), data.capacity());
            data.resize(n, 0);
            let part = gemm512::Part {
                fmt,
                data: w.data,
                packed: None,
                rows: w.rows,
                rb: w.row_bytes(),
            };
            // SAFETY: isa is available (checked above), AVX-512 where the format is gathered
            // (Avx512Vnni is the only ISA that supports those); WeightView::new checked
            // that data holds rows rows of cols / 32 blocks, and data is packed_bytes long.
            unsafe { gemm512::pack(&part, nch, &mut data) };
            Ok(Some(PackedWeight {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
                data,
            }))
        }
        #[cfg(not(target_arch = "x86_64"))]
        Ok(None)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Asks the kernel to back the 2 MiB-aligned part of a fresh (untouched) allocation with huge
/// pages where transparent huge pages are in `madvise` mode: decode streams every packed weight
/// once per token, and with 4 KiB pages each page costs a TLB walk that stalls the stream (a
/// Qwen2.5-1.5B decode went from 20.5 to ~22 tok/s on 2 threads). Advice only: where the
/// kernel declines, the memory works as before.
fn advise_huge_pages(ptr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside an allocation this function's caller owns; the
            // advice changes how its pages are backed, never their contents.
            let _ = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE)
            };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

impl<'a> WeightView<'a> {
    /// This view with `p` (the same weight packed) for the GEMM to read instead of `data`.
    pub fn with_packed(mut self, p: &'a PackedWeight) -> Result<Self> {
        if (p.ty, p.rows, p.cols) != (self.ty, self.rows, self.cols) {
            return Err(Error::InvalidArgument(format!(
                "packed {} {}x{} weight given for a {} {}x{} one",
                p.ty, p.rows, p.cols, self.ty, self.rows, self.cols
            )));
        }
        self.packed = Some(&p.data);
        Ok(self)
    }
}
