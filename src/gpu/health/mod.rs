//! Safe GPU start-up: on the first use of an adapter the selftest checks the kernel variants
//! a model needs, and the result is kept on disk per adapter, driver and kernel sources so
//! later loads skip it. A variant that fails (or is known bad on the driver, see
//! [`known_bad`](crate::gpu::health::known_bad)) is replaced by its next usable fallback
//! ([`crate::gpu::health::variants`]); an operation with no usable variant keeps the stages that need
//! it on the CPU.
//!
//! Nothing here runs when the library is loaded: only a model load with a GPU device does.

pub mod known_bad;
pub mod layouts;
pub mod selftest;
pub mod startup;
pub mod variants;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::device::{AdapterInfoRow, GpuContext};
use crate::gpu::health::known_bad::KnownBad;
use crate::gpu::health::layouts::AdapterFacts;
use crate::gpu::registry::KernelKey;

/// Version of the record file's layout (a different one is re-tested, never misread).
const RECORD_FORMAT: u32 = 1;

/// How the start-up check runs.
#[derive(Debug, Clone, Default)]
pub struct HealthOptions {
    /// Where the selftest record and the pipeline cache live; `None`: [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Neither read nor write cache files (the selftest runs on every load).
    pub no_cache: bool,
    /// Test hook: variants (by [`KernelKey::label`], e.g. `rmsnorm_sg`) whose selftest is
    /// treated as failed, as a driver bug would make it. Also read, comma-separated, from
    /// `MEMWALL_SELFTEST_FAIL`. Never written to the record.
    pub force_fail: Vec<String>,
    /// Known-bad entries in addition to the built-in list (and to `MEMWALL_KNOWN_BAD`).
    pub known_bad: Vec<KnownBad>,
}

impl HealthOptions {
    /// The cache directory in use: `cache_dir`, else [`default_cache_dir`]; `None` with
    /// `no_cache` or when no directory can be named.
    pub fn dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        self.cache_dir.clone().or_else(default_cache_dir)
    }

    fn forced(&self) -> Vec<String> {
        let mut v = self.force_fail.clone();
        if let Ok(s) = std::env::var("MEMWALL_SELFTEST_FAIL") {
            v.extend(
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(String::from),
            );
        }
        v
    }
}

/// Whether `pattern` (a label, or a label prefix ending in `*`) names `key`.
pub fn label_matches(pattern: &str, key: &KernelKey) -> bool {
    let label = key.label();
    match pattern.strip_suffix('*') {
        Some(prefix) => label.starts_with(prefix),
        None => label == pattern,
    }
}

/// `$MEMWALL_CACHE_DIR`, else `$XDG_CACHE_HOME/memwall`, else `$HOME/.cache/memwall`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("MEMWALL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("memwall")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("memwall")))
}

/// What the start-up check found and did, for the load report and the user.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HealthReport {
    /// Variants whose selftest ran in this load (0 when the record had them all).
    pub tested: usize,
    /// Seconds the selftest took in this load.
    pub selftest_s: f64,
    /// The record file read and written, if any.
    pub record: Option<PathBuf>,
    /// Variants not used here (failed or known bad), by label.
    pub unusable: Vec<String>,
    /// Keys with no usable variant: the stages that need them run on the CPU.
    pub unavailable: Vec<String>,
    /// The driver pipeline cache file compiled kernels went through (`None`: no cache, e.g.
    /// GL).
    pub pipeline_cache: Option<PathBuf>,
    /// Bytes of compiled pipelines the load started from (0: a cold start).
    pub pipeline_cache_loaded_bytes: usize,
    /// One line per thing the user should know (a failed variant and what replaced it).
    pub notes: Vec<String>,
}

/// The result of [`check`]: which variants not to use, and the report.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub unusable: HashSet<KernelKey>,
    /// Needed keys none of whose variants is usable.
    pub unavailable: Vec<KernelKey>,
    pub report: HealthReport,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Record {
    format: u32,
    fingerprint: String,
    adapter: String,
    /// Selftest result by variant label.
    results: BTreeMap<String, RecordRow>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RecordRow {
    pass: bool,
    /// The error against the tolerance, or the GPU error, as text (NaN and infinity have no
    /// JSON form).
    detail: String,
}

/// FNV-1a, 64-bit: a hash that stays the same across builds and Rust versions (the
/// fingerprint names files that outlive the binary).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator: ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Hex fingerprint of everything a selftest result depends on: the adapter (name, vendor and
/// device ids, type, backend), its driver and version, memwall's version and every kernel's
/// composed source (a changed kernel re-tests).
pub fn fingerprint(i: &AdapterInfoRow) -> String {
    let ids = format!("{}:{}", i.vendor, i.device);
    let mut parts: Vec<Vec<u8>> = vec![
        i.name.clone().into_bytes(),
        ids.into_bytes(),
        i.device_type.clone().into_bytes(),
        i.backend.clone().into_bytes(),
        i.driver.clone().into_bytes(),
        i.driver_info.clone().into_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes().to_vec(),
    ];
    for key in KernelKey::all() {
        parts.push(key.label().into_bytes());
        parts.push(key.source().into_bytes());
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    format!("{:016x}", fnv1a(&refs))
}

/// Reads the record at `path`: `None` when there is none; a warning and `None` when it is
/// unreadable, corrupt or for another fingerprint (it is then re-tested and rewritten).
fn read_record(path: &Path, fp: &str) -> Option<Record> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!("GPU selftest record {}: {e}; re-testing", path.display());
            return None;
        }
    };
    match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) if r.format == RECORD_FORMAT && r.fingerprint == fp => Some(r),
        Ok(_) => {
            log::warn!(
                "GPU selftest record {} is for another adapter or version; re-testing",
                path.display()
            );
            None
        }
        Err(e) => {
            log::warn!(
                "GPU selftest record {} is corrupt ({e}); re-testing",
                path.display()
            );
            None
        }
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then a
/// rename, so a crash or a concurrent load never leaves a half-written file behind.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        // Best effort: the rename's error is the one to report.
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The variants a model whose weights are in `formats` needs on an adapter with `facts`
/// with kernels chosen by `opts`: those of [`AdapterFacts::keys`] it
/// [`chooses`](AdapterFacts::chooses) (the bandwidth probe belongs to `memwall bench`; the
/// expert kernels to a mixture of experts, `moe`).
pub fn needed_keys(
    facts: &AdapterFacts,
    opts: crate::gpu::KernelOptions,
    formats: &HashSet<crate::gpu::WeightFormat>,
    kv: crate::kv_type::KvTypes,
    moe: bool,
) -> Vec<KernelKey> {
    facts
        .keys(opts)
        .into_iter()
        .filter(|k| facts.chooses(opts.subgroup, k))
        .filter(|k| *k != KernelKey::BandwidthProbe)
        .filter(|k| variants::weight_format(k).is_none_or(|f| formats.contains(&f)))
        .filter(|k| kv_needed(k, kv))
        .filter(|k| moe || !k.is_moe())
        .collect()
}

/// Whether a model whose caches are of types `kv` uses `key`: only the store and attention
/// variants of its own cache types (the others would only lengthen the first start).
fn kv_needed(key: &KernelKey, kv: crate::kv_type::KvTypes) -> bool {
    match *key {
        KernelKey::KvStore { ty } => ty == kv.k || ty == kv.v,
        KernelKey::AttentionSplit { kv: t, .. }
        | KernelKey::AttentionPrefill { kv: t }
        | KernelKey::AttentionPrefillLanes { kv: t } => t == kv,
        _ => true,
    }
}

/// Checks the variants `needed` asks for on `ctx`: known-bad ones are skipped, the others
/// pass their selftest from the record or from a run now; each needed key falls back through
/// its [`variants::fallbacks`] until one passes. The record is updated (atomically) with what
/// ran. Cache trouble is a warning, never an error; a selftest that cannot even run a variant
/// (compilation or validation error) counts as that variant failing, while a lost device or
/// exhausted memory is returned as the error it is and records nothing.
pub fn check(ctx: &GpuContext, needed: &[KernelKey], opts: &HealthOptions) -> Result<Health> {
    let fp = fingerprint(&ctx.info);
    let path = opts.dir().map(|d| d.join(format!("selftest-{fp}.json")));
    let mut record = path
        .as_deref()
        .and_then(|p| read_record(p, &fp))
        .unwrap_or_else(|| Record {
            format: RECORD_FORMAT,
            fingerprint: fp.clone(),
            adapter: format!("{} ({})", ctx.info.name, ctx.info.backend),
            results: BTreeMap::new(),
        });
    let forced = opts.forced();
    let bad = known_bad::entries(&opts.known_bad)?;
    let t0 = std::time::Instant::now();
    let mut runner = selftest::Runner::new(ctx);
    let mut health = Health::default();
    let mut tested = 0usize;
    // A variant and its selftest partner stand or fall together.
    let group = |k: KernelKey| std::iter::once(k).chain(variants::partner(k));
    for &key in needed {
        let mut chosen = None;
        for v in variants::fallbacks(key) {
            if !selftest::runnable(ctx, &v) {
                continue;
            }
            if health.unusable.contains(&v) {
                continue;
            }
            let label = v.label();
            if let Some(entry) = group(v).find_map(|k| known_bad::matching(&bad, &ctx.info, &k)) {
                health.report.notes.push(format!(
                    "kernel {label} is known bad on {} ({}): not used",
                    ctx.info.name, entry.reason
                ));
                health.unusable.insert(v);
                continue;
            }
            let row = match record.results.get(&label) {
                Some(r) => r.clone(),
                None => {
                    tested += 1;
                    let r = match runner.check(v) {
                        Ok(row) => RecordRow {
                            pass: row.pass,
                            detail: format!("max error {:e}, tolerance {:e}", row.max_err, row.tol),
                        },
                        // A lost device or exhausted memory says nothing about the kernel:
                        // recording it would disable the variant until the driver changes.
                        // The load fails with it (and the engine falls back to the CPU).
                        Err(e @ (Error::DeviceLost { .. } | Error::OutOfMemory { .. })) => {
                            return Err(e)
                        }
                        Err(e) => RecordRow {
                            pass: false,
                            detail: e.to_string(),
                        },
                    };
                    record.results.insert(label.clone(), r.clone());
                    r
                }
            };
            let forced_fail = group(v).any(|k| forced.iter().any(|f| label_matches(f, &k)));
            if row.pass && !forced_fail {
                chosen = Some(v);
                break;
            }
            let why = if forced_fail {
                "forced to fail (test hook)".to_string()
            } else {
                row.detail
            };
            health.report.notes.push(format!(
                "kernel {label} failed its selftest on {}: {why}",
                ctx.info.name
            ));
            health.unusable.insert(v);
        }
        match chosen {
            Some(v) if v != key => health.report.notes.push(format!(
                "kernel {}: using {} instead",
                key.label(),
                v.label()
            )),
            Some(_) => {}
            None => health.unavailable.push(key),
        }
    }
    health.report.tested = tested;
    health.report.selftest_s = t0.elapsed().as_secs_f64();
    if tested > 0 {
        if let Some(p) = &path {
            let write = serde_json::to_vec_pretty(&record)
                .map_err(std::io::Error::other)
                .and_then(|b| write_atomic(p, &b));
            if let Err(e) = write {
                log::warn!("GPU selftest record {}: not written: {e}", p.display());
            }
        }
    }
    health.report.record = path;
    let mut unusable: Vec<String> = health.unusable.iter().map(KernelKey::label).collect();
    unusable.sort();
    health.report.unusable = unusable;
    health.report.unavailable = health.unavailable.iter().map(KernelKey::label).collect();
    for n in &health.report.notes {
        log::warn!("{n}");
    }
    Ok(health)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }

    #[test]
    fn the_fingerprint_changes_with_the_driver() {
        let info = crate::gpu::health::known_bad::tests::info();
        let mut other = info.clone();
        other.driver_info.push_str(" patched");
        assert_eq!(fingerprint(&info), fingerprint(&info));
        assert_ne!(fingerprint(&info), fingerprint(&other));
        other = info.clone();
        other.device = 1;
        assert_ne!(fingerprint(&info), fingerprint(&other));
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = std::env::temp_dir().join(format!("memwall-health-{}", std::process::id()));
        let p = dir.join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
