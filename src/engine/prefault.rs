//! Paging the weights in at load, so the first token is not slowed by page faults.

use std::collections::HashSet;

use crate::gguf::{Gguf, TensorInfo};

/// The tensors the load pages in: every one but those named in `packed` (read by packing and
/// handed back; the matmuls read the packed copy).
pub(super) fn prefault_plan<'a>(g: &'a Gguf, packed: &HashSet<String>) -> Vec<&'a TensorInfo> {
    let tensors = g.tensors().iter();
    tensors.filter(|t| !packed.contains(&t.name)).collect()
}

/// Reads one byte per page of each tensor of `plan` so the OS maps the weights in now. The
/// progress counts every tensor's bytes, those left out of `plan` as done from the start.
pub(super) fn prefault(g: &Gguf, plan: &[&TensorInfo], progress: &mut dyn FnMut(u64, u64)) {
    const PAGE: usize = 4096;
    let total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    let mut done = total - plan.iter().map(|t| t.n_bytes).sum::<u64>();
    let mut acc = 0u8;
    for t in plan {
        let data = g.tensor_data(t);
        acc ^= data.iter().step_by(PAGE).fold(0u8, |a, &b| a ^ b);
        done += t.n_bytes;
        progress(done, total);
    }
    std::hint::black_box(acc);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::GgufWriter;
    use kernels_ref::GgmlType;

    #[test]
    fn the_plan_leaves_out_the_packed_tensors_and_progress_counts_them_done() {
        let w = GgufWriter::new()
            .tensor("a", GgmlType::F32, &[1024, 2], vec![0u8; 8192])
            .tensor("b", GgmlType::F32, &[1024, 4], vec![0u8; 16384])
            .tensor("c", GgmlType::F32, &[8], vec![0u8; 32]);
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        let packed: HashSet<String> = ["b".to_string()].into();
        let plan = prefault_plan(&g, &packed);
        let names: Vec<&str> = plan.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        let mut seen = Vec::new();
        prefault(&g, &plan, &mut |done, total| seen.push((done, total)));
        let total = 8192 + 16384 + 32;
        assert_eq!(seen, [(16384 + 8192, total), (total, total)]);
        let all = prefault_plan(&g, &HashSet::new());
        assert_eq!(all.len(), 3);
    }
}
