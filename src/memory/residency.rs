//! Which blocks stay resident under a memory budget, and which stream from storage.
//!
//! Every byte of a dense block that is resident is a byte not read from storage for each
//! token, so blocks are worth the same per byte; what differs is where they sit. The reader
//! keeps reading while resident blocks compute only if the streamed blocks are spread among
//! them, so the resident set is chosen spread out (van der Corput order: every prefix of it is
//! evenly spread), and the ring has room for what a run of resident blocks lets the reader
//! read ahead.

use crate::error::{Error, Result};

/// What a plan costs, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Costs {
    /// Memory that does not depend on residency: the runtime already held (binary, threads,
    /// tokenizer), the KV cache, activation scratch, the dequantized norms.
    pub fixed: u64,
    /// The KV cache's part of `fixed` (named in a refusal: a smaller context needs less).
    pub kv: u64,
    /// The part of `fixed` another model sharing the budget holds (a draft model; named in a
    /// refusal).
    pub shared: u64,
    /// The output head held resident (packed or mapped).
    pub head: u64,
    /// Block `l` held resident (its packed size where it is packed, else its file bytes).
    pub resident: Vec<u64>,
    /// Block `l` read from storage: its file span rounded out to whole 4 KiB blocks.
    pub read: Vec<u64>,
}

/// The residency plan for a budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Residency {
    pub budget: u64,
    /// The smallest budget that can work: fixed memory, the head and a ring of two slots.
    pub minimum: u64,
    pub fixed_bytes: u64,
    /// `[n_layer]`: block l's weights stay in memory.
    pub resident: Vec<bool>,
    /// Weight bytes held in memory (head and resident blocks).
    pub resident_bytes: u64,
    /// Bytes read from storage per forward pass (the streamed blocks).
    pub streamed_bytes: u64,
    /// Slots of the stream ring (0 when nothing streams) and the bytes of each.
    pub slots: usize,
    pub slot_bytes: u64,
    /// Everything planned: fixed + resident + slots.
    pub planned_bytes: u64,
}

impl Residency {
    /// Whether any block streams.
    pub fn streams(&self) -> bool {
        self.resident.iter().any(|&r| !r)
    }
}

/// Layer indices of `n` in van der Corput order (bit-reversed counting): each prefix of the
/// order is spread evenly over 0..n.
pub fn spread_order(n: usize) -> Vec<usize> {
    let bits = usize::BITS - n.next_power_of_two().leading_zeros();
    let bits = bits.saturating_sub(1);
    let mut out: Vec<usize> = (0..n.next_power_of_two())
        .map(|i| {
            if bits == 0 {
                i
            } else {
                i.reverse_bits() >> (usize::BITS - bits)
            }
        })
        .filter(|&i| i < n)
        .collect();
    out.dedup();
    out
}

/// The slots the ring needs. While a run of `L` resident blocks computes, no slot is held by
/// the compute side and one may already hold the next streamed block, so the reader stays busy
/// only with `1 + ceil(L · compute_per_read)` slots; never fewer than two (one block computed
/// while the next is read), at most four. `compute_per_read` is a resident block's compute
/// time over a streamed block's read time (resident blocks compute from memory, so on storage
/// slower than memory it is well below 1).
pub fn ring_depth(resident: &[bool], compute_per_read: f64) -> usize {
    let mut longest = 0usize;
    let mut run = 0usize;
    // The pass is a cycle: a run at the end continues at the start of the next pass.
    for &r in resident.iter().chain(resident.iter()) {
        run = if r { run + 1 } else { 0 };
        longest = longest.max(run.min(resident.len()));
    }
    let ahead = (longest as f64 * compute_per_read.max(0.0)).ceil() as usize;
    (1 + ahead).clamp(2, 4)
}

/// Chooses the resident blocks for `budget`. Everything resident when it fits (no ring).
/// Otherwise blocks in spread order while they fit beside the ring; a budget below
/// [`Residency::minimum`] is refused with the minimum in the message.
/// " (of which N held by a model sharing the budget)" where another model holds part of it.
pub fn shared_note(c: &Costs) -> String {
    if c.shared == 0 {
        String::new()
    } else {
        format!(
            " (of which {} held by a model sharing the budget, e.g. the draft model)",
            crate::ground::format_size(c.shared)
        )
    }
}

pub fn plan(c: &Costs, budget: u64, compute_per_read: f64) -> Result<Residency> {
    let n = c.resident.len();
    let all: u64 = c.fixed + c.head + c.resident.iter().sum::<u64>();
    let slot = c.read.iter().copied().max().unwrap_or(0);
    let minimum = (c.fixed + c.head + 2 * slot).min(all);
    if budget < minimum {
        return Err(Error::MemoryBudget {
            budget,
            minimum,
            detail: format!(
                "{} of KV cache, {} of runtime and scratch{}, {} of output head, 2 stream slots \
                 of {}; a smaller context or a quantized KV cache needs less",
                crate::ground::format_size(c.kv),
                crate::ground::format_size(c.fixed.saturating_sub(c.kv)),
                shared_note(c),
                crate::ground::format_size(c.head),
                crate::ground::format_size(slot)
            ),
        });
    }
    let make = |resident: Vec<bool>, slots: usize| {
        let resident_bytes = c.head
            + (0..n)
                .filter(|&l| resident[l])
                .map(|l| c.resident[l])
                .sum::<u64>();
        let streamed_bytes = (0..n).filter(|&l| !resident[l]).map(|l| c.read[l]).sum();
        let slot_bytes = if slots > 0 { slot } else { 0 };
        Residency {
            budget,
            minimum,
            fixed_bytes: c.fixed,
            resident,
            resident_bytes,
            streamed_bytes,
            slots,
            slot_bytes,
            planned_bytes: c.fixed + resident_bytes + slots as u64 * slot_bytes,
        }
    };
    if all <= budget {
        return Ok(make(vec![true; n], 0));
    }
    // Grow the resident set in spread order with a ring of 2; then give the ring the depth
    // the set needs, dropping resident blocks (last chosen first) until it fits.
    let order = spread_order(n);
    let mut resident = vec![false; n];
    let mut chosen = Vec::new();
    let mut used = c.fixed + c.head + 2 * slot;
    for &l in &order {
        if used + c.resident[l] <= budget {
            used += c.resident[l];
            resident[l] = true;
            chosen.push(l);
        }
    }
    if resident.iter().all(|&r| r) {
        // Only the ring's own size made it not fit: one block streams.
        if let Some(l) = chosen.pop() {
            resident[l] = false;
        }
    }
    loop {
        let depth = ring_depth(&resident, compute_per_read);
        let r = make(resident.clone(), depth);
        if r.planned_bytes <= budget || depth == 2 {
            return Ok(r);
        }
        match chosen.pop() {
            Some(l) => resident[l] = false,
            None => return Ok(make(resident, 2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(n: usize) -> Costs {
        Costs {
            fixed: 100,
            kv: 40,
            shared: 0,
            head: 50,
            resident: vec![10; n],
            read: vec![12; n],
        }
    }

    #[test]
    fn spread_order_visits_every_layer_once_spread_out() {
        for n in [1, 2, 3, 7, 8, 30, 32, 33] {
            let o = spread_order(n);
            let mut s = o.clone();
            s.sort();
            assert_eq!(s, (0..n).collect::<Vec<_>>(), "n={n}");
        }
        assert_eq!(spread_order(8), [0, 4, 2, 6, 1, 5, 3, 7]);
        // Any prefix leaves no gap much wider than n / prefix.
        let o = spread_order(32);
        let mut first: Vec<usize> = o[..8].to_vec();
        first.sort();
        assert!(first.windows(2).all(|w| w[1] - w[0] == 4), "{first:?}");
    }

    #[test]
    fn everything_resident_when_it_fits() {
        let r = plan(&costs(4), 190, 0.1).unwrap();
        assert!(!r.streams());
        assert_eq!((r.slots, r.streamed_bytes, r.resident_bytes), (0, 0, 90));
        assert_eq!(r.planned_bytes, 190);
    }

    #[test]
    fn a_tight_budget_streams_the_rest_and_stays_within_it() {
        let c = costs(8);
        for budget in 174..=229 {
            let r = plan(&c, budget, 0.1).unwrap();
            assert!(r.planned_bytes <= budget, "{budget}: {r:?}");
            assert!(r.streams());
            let k = r.resident.iter().filter(|&&x| x).count() as u64;
            assert_eq!(r.resident_bytes, 50 + 10 * k);
            assert_eq!(r.streamed_bytes, 12 * (8 - k));
            // No budget wasted: one more block would not fit.
            assert!(r.planned_bytes + 10 > budget, "{budget}: {r:?}");
        }
        // 4 of 8 resident: spread one apart.
        let r = plan(&c, 100 + 50 + 24 + 40, 0.1).unwrap();
        assert_eq!(
            r.resident,
            [true, false, true, false, true, false, true, false]
        );
    }

    #[test]
    fn below_the_minimum_is_refused_naming_it() {
        let e = plan(&costs(8), 173, 0.1).unwrap_err().to_string();
        assert!(e.contains("174"), "{e}");
    }

    #[test]
    fn long_resident_runs_deepen_the_ring_when_compute_is_slow() {
        assert_eq!(ring_depth(&[true, true, true, false], 0.1), 2);
        assert_eq!(ring_depth(&[true, false, true, false], 0.1), 2);
        assert_eq!(ring_depth(&[false, false], 5.0), 2);
        assert_eq!(ring_depth(&[true, true, true, false], 0.5), 3);
        assert_eq!(ring_depth(&[true, true, true, false], 2.0), 4);
        // Wrapping: the run at the end continues at the start (a run of 2).
        assert_eq!(ring_depth(&[true, false, false, true], 1.0), 3);
    }
}
