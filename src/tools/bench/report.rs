//! The terminal tables of `memwall bench`.

use std::fmt::Write;

use super::bandwidth::ProbeResult;
use super::{BenchReport, ConfigResult};

const MIB: f64 = 1024.0 * 1024.0;

/// `v` bytes as MiB with one decimal.
fn mib(v: u64) -> String {
    format!("{:.1}", v as f64 / MIB)
}

/// The header line describing the model and the run.
pub fn header(r: &BenchReport) -> String {
    let m = &r.model;
    format!(
        "model {} ({}, {} layers, n_embd {}, n_vocab {}, {} MiB); {} MiB of weights + {} KiB of \
         KV per position read per token; -p {} -n {} -r {} (+1 warm-up)",
        m.path,
        m.arch,
        m.n_layer,
        m.n_embd,
        m.n_vocab,
        mib(m.file_bytes),
        mib(m.weight_bytes_per_token),
        m.kv_bytes_per_position / 1024,
        r.n_prompt,
        r.n_gen,
        r.reps
    )
}

const COLUMNS: [&str; 10] = [
    "device",
    "threads",
    "ttft ms",
    "prefill t/s",
    "decode t/s",
    "MiB/token",
    "GB/s",
    "probe GB/s",
    "of probe",
    "memory MiB",
];

fn row(c: &ConfigResult) -> [String; 10] {
    let m = &c.memory;
    let memory = match m.gpu_total_bytes {
        Some(t) => format!(
            "gpu {} (weights {} + session {})",
            mib(t),
            mib(m.gpu_weight_bytes.unwrap_or(0)),
            mib(m.gpu_session_bytes.unwrap_or(0))
        ),
        None => format!(
            "rss {} (map {}, kv {})",
            m.peak_rss_bytes.map_or("?".into(), mib),
            mib(m.mapped_weight_bytes),
            mib(m.kv_bytes)
        ),
    };
    [
        format!("{} {}", c.device, c.placement),
        c.threads.map_or("-".into(), |t| t.to_string()),
        format!("{:.1}", c.ttft_ms),
        format!("{:.1} ± {:.1}", c.prefill_tps.mean, c.prefill_tps.sd),
        format!("{:.2} ± {:.2}", c.decode_tps.mean, c.decode_tps.sd),
        mib(c.bytes_per_token.total),
        format!("{:.2}", c.achieved_gbs),
        c.probe
            .as_ref()
            .map_or("-".into(), |p| format!("{:.1}", p.read_gbs)),
        c.fraction_of_probe
            .map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
        memory,
    ]
}

/// Rows under a header, columns padded to their widest cell.
fn grid(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let v: Vec<String> = cells
            .zip(&w)
            .map(|(c, &n)| format!("{c}{}", " ".repeat(n.saturating_sub(c.chars().count()))))
            .collect();
        format!("| {} |", v.join(" | ")).trim_end().to_string()
    };
    let mut s = String::new();
    let _ = writeln!(s, "{}", line(&mut head.iter().map(|h| h.to_string())));
    let _ = writeln!(s, "{}", line(&mut w.iter().map(|&n| "-".repeat(n))));
    for r in rows {
        let _ = writeln!(s, "{}", line(&mut r.iter().cloned()));
    }
    s
}

/// The results table (Markdown-compatible), one row per configuration, with the load times
/// and the probes' method below it.
pub fn table(r: &BenchReport) -> String {
    let rows: Vec<Vec<String>> = r.configs.iter().map(|c| row(c).to_vec()).collect();
    let mut s = grid(&COLUMNS, &rows);
    for c in &r.configs {
        let _ = writeln!(
            s,
            "{}: load {:.1} ms; prefill median {:.1} t/s, decode median {:.2} t/s; decode moves \
             {} MiB weights + {} MiB KV (mean context {:.1}) per token",
            c.device_name,
            c.load_ms,
            c.prefill_tps.median,
            c.decode_tps.median,
            mib(c.bytes_per_token.weights),
            mib(c.bytes_per_token.kv),
            c.mean_ctx
        );
        if let Some(p) = &c.probe {
            let _ = writeln!(s, "  probe: {}", probe_line(p));
        }
        if let Some(st) = c.storage.as_ref().filter(|st| st.streamed_blocks > 0) {
            let floor = st
                .storage_floor_tps
                .zip(st.floor_fraction)
                .map_or(String::new(), |(f, x)| {
                    format!("; storage floor {f:.3} t/s, reached {:.0}%", 100.0 * x)
                });
            let _ = writeln!(
                s,
                "  memory budget {} MiB: {} blocks resident ({} MiB), {} streamed ({} MiB per \
                 token planned, {} MiB read per decoded token at {:.2} GB/s, {} reads, {} slots){floor}; \
                 peak {} MiB ({})",
                mib(st.budget_bytes),
                st.resident_blocks,
                mib(st.resident_bytes),
                st.streamed_blocks,
                mib(st.streamed_bytes_per_token),
                mib(st.read_bytes_per_token as u64),
                st.read_gbps,
                match st.io_mode {
                    Some(crate::memory::IoMode::Direct) => "direct",
                    Some(crate::memory::IoMode::DropBehind) => "drop-behind",
                    None => "no",
                },
                st.slots,
                st.peak_bytes.map_or("-".into(), mib),
                st.peak_source.unwrap_or("-"),
            );
        } else if let Some(st) = &c.storage {
            let _ = writeln!(
                s,
                "  memory budget {} MiB: every block resident; peak {} MiB ({})",
                mib(st.budget_bytes),
                st.peak_bytes.map_or("-".into(), mib),
                st.peak_source.unwrap_or("-"),
            );
        }
        if let Some(sp) = &c.speculative {
            let reads = sp
                .plain_read_bytes_per_token
                .zip(sp.draft_read_bytes_per_token)
                .map_or(String::new(), |(p, d)| {
                    format!(
                        "; {} -> {} MiB read per token",
                        mib(p as u64),
                        mib(d as u64)
                    )
                });
            let _ = writeln!(
                s,
                "  speculative ({}, up to {} per pass; {} tokens after a {}-token text prompt): \
                 plain {:.2} ± {:.2} t/s, with drafts {:.2} ± {:.2} t/s ({:.2}x); {} of {} \
                 drafts kept ({:.0}%), {:.2} tokens per pass{reads}; {}",
                sp.drafter,
                sp.draft_max,
                sp.tokens,
                sp.prompt_tokens,
                sp.plain_tps.mean,
                sp.plain_tps.sd,
                sp.draft_tps.mean,
                sp.draft_tps.sd,
                sp.speedup,
                sp.accepted,
                sp.drafted,
                100.0 * sp.acceptance,
                sp.tokens_per_pass,
                if sp.same_ids {
                    "the plain run's ids"
                } else {
                    "IDS DIFFER from the plain run's"
                }
            );
        }
        if let (Some(v), false) = (c.vs_cpu, c.device == "cpu") {
            let _ = writeln!(
                s,
                "  vs memwall's CPU path in this run: prefill {:.2}x, decode {:.2}x",
                v.prefill, v.decode
            );
        }
    }
    s
}

fn probe_line(p: &ProbeResult) -> String {
    let triad = p
        .triad_gbs
        .map_or(String::new(), |t| format!(", triad {t:.1} GB/s"));
    let threads = p
        .threads
        .map_or(String::new(), |t| format!(", {t} threads"));
    format!(
        "read {:.1} GB/s{triad} over {} MiB{threads}, {} ({} runs)",
        p.read_gbs,
        mib(p.bytes),
        p.method,
        p.runs
    )
}

/// The table of `memwall bench --bandwidth`.
pub fn probes_table(probes: &[ProbeResult]) -> String {
    let rows: Vec<Vec<String>> = probes
        .iter()
        .map(|p| {
            vec![
                p.device.clone(),
                format!("{:.1}", p.read_gbs),
                p.triad_gbs.map_or("-".into(), |t| format!("{t:.1}")),
                mib(p.bytes),
                p.threads.map_or("-".into(), |t| t.to_string()),
            ]
        })
        .collect();
    let mut s = grid(
        &["device", "read GB/s", "triad GB/s", "MiB", "threads"],
        &rows,
    );
    for p in probes {
        let _ = writeln!(s, "{}: {}", p.device, p.method);
    }
    s
}
