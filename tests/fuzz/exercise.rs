// The body shared by the cargo-fuzz target (tests/fuzz/fuzz_targets/gguf_parse.rs) and the
// stable smoke test (tests/gguf_fuzz_smoke.rs): parse, then touch everything a caller could.

/// Parses `data` and, when it parses, calls every getter on every key, reads every tensor's
/// data, and runs `inspect` and `check` on it. Any panic is a bug.
pub fn exercise(data: &[u8]) {
    use memwall::gguf::Gguf;
    let g = match Gguf::from_bytes(data.to_vec()) {
        Ok(g) => g,
        Err(e) => {
            // Formatting the error must not panic either.
            let _ = e.to_string();
            return;
        }
    };
    for (k, v) in g.metadata() {
        let _ = (v.to_string(), v.describe(), v.as_f64());
        let _ = g.get_str(k);
        let _ = g.get_u32(k);
        let _ = g.get_u64(k);
        let _ = g.get_i64(k);
        let _ = g.get_f32(k);
        let _ = g.get_bool(k);
        let _ = g.get_array(k);
        let _ = g.get_str_array(k);
        let _ = g.get_f32_array(k);
        let _ = g.get_i64_array(k);
        let _ = g.opt(k, Gguf::get_u32);
    }
    let mut total = 0u64;
    for t in g.tensors() {
        let d = g.tensor_data(t);
        assert_eq!(d.len() as u64, t.n_bytes, "tensor_data length");
        assert!(g.tensor(&t.name).is_some());
        let _ = (t.ne0(), t.n_rows());
        total += d.iter().map(|&b| u64::from(b)).sum::<u64>();
    }
    std::hint::black_box(total);
    let _ = memwall::tools::inspect::inspect_to_string(&g);
    let _ = memwall::tools::check::check_gguf(&g, std::path::Path::new("<fuzz>"));
}
