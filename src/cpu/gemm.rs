//! Dispatch to the AVX-512 GEMM (`gemm512`, x86_64 only): which calls take it, and the call.

#[cfg(target_arch = "x86_64")]
use super::gemm512;
use super::{Isa, MatmulScratch, Part, WeightView};

/// Whether `isa` runs the AVX-512 GEMM for this call (it also needs `gemm_fmt` weights).
pub(super) fn use_gemm(isa: Isa, ws: &[WeightView], n_tokens: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512Vnni
            && n_tokens >= gemm512::MIN_TOKENS
            && ws.iter().any(|w| gemm_fmt(w).is_some())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, ws, n_tokens);
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) fn gemm_fmt(w: &WeightView) -> Option<gemm512::Fmt> {
    gemm512::Fmt::of(w.ty).filter(|_| w.cols > 0)
}
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn gemm_fmt(_: &WeightView) -> Option<()> {
    None
}

/// The AVX-512 GEMM over `parts` (all `gemm_fmt`, same cols) with `scratch.act` quantized.
pub(super) fn run_gemm(
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
                    fmt: gemm_fmt(w)?,
                    data: w.data,
                    rows: w.rows,
                    rb,
                })
            })
            .collect();
        let nch = parts.first().map_or(0, |(w, _)| w.cols / 32);
        // SAFETY: use_gemm returned true only for Isa::Avx512Vnni, whose availability
        // check_args verified; check_args also verified every part's byte size (rows x rb
        // bytes, rb = cols / 32 blocks) and ys' lengths; all parts share x's cols.
        unsafe { gemm512::run(&gparts, nch, &scratch.act, n_tokens, ys, &mut scratch.yt) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (parts, n_tokens, ys, scratch);
}
