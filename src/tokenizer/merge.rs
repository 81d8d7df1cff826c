//! The two merge loops: byte-level BPE over merge ranks (llama.cpp's `llm_tokenizer_bpe_session`)
//! and SentencePiece-style BPE over token scores (`llm_tokenizer_spm_session`).
//!
//! Both keep the word as a doubly linked list of symbols (byte ranges of the word) and a heap of
//! candidate pairs; a popped pair is applied only if both symbols are still what they were when
//! it was pushed.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasher;

#[derive(Clone, Copy)]
struct Sym {
    /// Byte offset of the symbol in the word.
    start: usize,
    /// Byte length; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// One symbol per char of `word`, chained in order.
fn char_symbols(word: &str) -> Vec<Sym> {
    let n = word.chars().count();
    let mut syms = Vec::with_capacity(n);
    for (i, (start, c)) in word.char_indices().enumerate() {
        syms.push(Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: if i + 1 < n { Some(i + 1) } else { None },
        });
    }
    syms
}

/// Folds `right` into `left` and unlinks it.
fn merge_into(syms: &mut [Sym], left: usize, right: usize) {
    syms[left].len += syms[right].len;
    syms[right].len = 0;
    syms[left].next = syms[right].next;
    if let Some(n) = syms[right].next {
        syms[n].prev = Some(left);
    }
}

/// The texts of the surviving symbols, in order.
fn survivors<'w>(word: &'w str, syms: &[Sym]) -> Vec<&'w str> {
    let mut out = Vec::new();
    let mut cur = if syms.is_empty() { None } else { Some(0) };
    while let Some(i) = cur {
        let s = syms[i];
        out.push(&word[s.start..s.start + s.len]);
        cur = s.next;
    }
    out
}

/// Byte-level BPE: merges the pair with the lowest rank (leftmost on ties) until none applies.
/// `ranks` is keyed by the merge line, "left right". Returns the final symbols' texts.
pub fn bpe_merge<'w, S: BuildHasher>(
    word: &'w str,
    ranks: &HashMap<String, u32, S>,
) -> Vec<&'w str> {
    let mut syms = char_symbols(word);
    // (rank, left, right, byte size of the pair); min-heap through Reverse.
    let mut heap: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
    let mut key = String::new();
    let mut push = |syms: &[Sym], l: Option<usize>, r: Option<usize>, heap: &mut BinaryHeap<_>| {
        let (Some(l), Some(r)) = (l, r) else { return };
        let (a, b) = (syms[l], syms[r]);
        key.clear();
        key.push_str(&word[a.start..a.start + a.len]);
        key.push(' ');
        key.push_str(&word[b.start..b.start + b.len]);
        if let Some(&rank) = ranks.get(key.as_str()) {
            heap.push(Reverse((rank, l, r, a.len + b.len)));
        }
    };
    for i in 1..syms.len() {
        push(&syms, Some(i - 1), Some(i), &mut heap);
    }
    while let Some(Reverse((_, l, r, size))) = heap.pop() {
        let (a, b) = (syms[l], syms[r]);
        if a.len == 0 || b.len == 0 || a.next != Some(r) || a.len + b.len != size {
            continue; // stale: one side changed since this pair was pushed
        }
        merge_into(&mut syms, l, r);
        push(&syms, syms[l].prev, Some(l), &mut heap);
        push(&syms, Some(l), syms[l].next, &mut heap);
    }
    survivors(word, &syms)
}

/// A candidate SPM pair: the highest score wins, the leftmost on ties.
struct SpmPair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmPair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for SpmPair {}
impl PartialOrd for SpmPair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for SpmPair {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// SentencePiece BPE: merges the adjacent pair whose concatenation is the highest-scoring token
/// until no adjacent pair forms a token. Returns the final symbols' texts (each either a token
/// or a single char that is not one, left to byte fallback).
pub fn spm_merge(
    text: &str,
    lookup: impl Fn(&str) -> Option<u32>,
    score: impl Fn(u32) -> f32,
) -> Vec<&str> {
    let mut syms = char_symbols(text);
    let mut heap: BinaryHeap<SpmPair> = BinaryHeap::new();
    let push = |syms: &[Sym], l: Option<usize>, r: Option<usize>, heap: &mut BinaryHeap<_>| {
        let (Some(l), Some(r)) = (l, r) else { return };
        let (a, b) = (syms[l], syms[r]);
        let s = &text[a.start..a.start + a.len + b.len];
        if let Some(id) = lookup(s) {
            heap.push(SpmPair {
                score: score(id),
                left: l,
                right: r,
                size: s.len(),
            });
        }
    };
    for i in 1..syms.len() {
        push(&syms, Some(i - 1), Some(i), &mut heap);
    }
    while let Some(p) = heap.pop() {
        let (a, b) = (syms[p.left], syms[p.right]);
        if a.len == 0 || b.len == 0 || a.next != Some(p.right) || a.len + b.len != p.size {
            continue;
        }
        merge_into(&mut syms, p.left, p.right);
        push(&syms, syms[p.left].prev, Some(p.left), &mut heap);
        push(&syms, Some(p.left), syms[p.left].next, &mut heap);
    }
    survivors(text, &syms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpe_applies_lowest_rank_first() {
        let ranks: HashMap<String, u32> = [("a b", 1), ("b c", 0), ("a bc", 2)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        // "b c" (rank 0) beats "a b" (rank 1), then "a bc" applies.
        assert_eq!(bpe_merge("abc", &ranks), ["abc"]);
        assert_eq!(bpe_merge("abd", &ranks), ["ab", "d"]);
        assert_eq!(bpe_merge("", &ranks), Vec::<&str>::new());
    }

    #[test]
    fn spm_prefers_high_scores() {
        let vocab = [("ab", -1.0f32), ("bc", -0.5), ("bcd", -3.0)];
        let lookup = |s: &str| vocab.iter().position(|(t, _)| *t == s).map(|i| i as u32);
        let score = |id: u32| vocab[id as usize].1;
        // "bc" scores higher than "ab"; "a"+"bc" is not a token, so "abc" never forms.
        assert_eq!(spm_merge("abc", lookup, score), ["a", "bc"]);
        assert_eq!(spm_merge("abcd", lookup, score), ["a", "bcd"]);
        assert_eq!(spm_merge("xab", lookup, score), ["x", "ab"]);
    }
}
