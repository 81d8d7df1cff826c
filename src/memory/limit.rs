//! How much memory this process may really use, and how much it has used: the cgroup limit
//! (v2 `memory.max`, v1 `memory.limit_in_bytes`, the smallest on the path to the root) or, with
//! none, the kernel's `MemAvailable`; the peak from the cgroup (`memory.peak`,
//! `memory.max_usage_in_bytes`) where a limit is the process's own, else `VmHWM`.
//!
//! A phone's low-memory killer and a container's OOM killer both count anonymous memory and
//! the page cache the process brought in, so the budget the engine plans with is the limit
//! minus a margin for what it cannot plan (the kernel's own use, allocator slack).

use std::path::{Path, PathBuf};

/// Where a memory limit was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    /// A cgroup v2 `memory.max` on the process's path.
    CgroupV2,
    /// A cgroup v1 `memory.limit_in_bytes` on the process's path.
    CgroupV1,
    /// No cgroup limit: the kernel's estimate of memory available without swapping.
    MemAvailable,
    /// Given by the caller (`--mem-budget`).
    Given,
}

/// A limit on the memory this process may hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: LimitSource,
    /// The cgroup directory whose limit it is (its peak counter measures this process), if any.
    #[serde(skip)]
    pub cgroup: Option<PathBuf>,
}

/// cgroup v1 writes "no limit" as a page-rounded i64::MAX; anything this large is no limit.
const UNLIMITED: u64 = 1 << 60;

fn read_u64(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// The cgroup paths of this process from `/proc/self/cgroup`: (v2 path, v1 memory path).
fn own_cgroups(text: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// The smallest limit in `file` from `dir` up to `root`: (bytes, the directory holding it).
fn smallest_on_path(root: &Path, rel: &str, file: &str) -> Option<(u64, PathBuf)> {
    let mut best: Option<(u64, PathBuf)> = None;
    let mut dir = root.join(rel.trim_start_matches('/'));
    loop {
        if let Some(v) = read_u64(&dir.join(file)).filter(|&v| v < UNLIMITED) {
            if best.as_ref().is_none_or(|(b, _)| v < *b) {
                best = Some((v, dir.clone()));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_field("MemAvailable:")
}

fn meminfo_field(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, key)
}

/// A `Key:   123 kB` line's value in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The cgroup limit on this process, if it has one.
pub fn cgroup_limit() -> Option<MemoryLimit> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = own_cgroups(&text);
    if let Some(rel) = v1 {
        let root = Path::new("/sys/fs/cgroup/memory");
        if let Some((bytes, dir)) = smallest_on_path(root, &rel, "memory.limit_in_bytes") {
            return Some(MemoryLimit {
                bytes,
                source: LimitSource::CgroupV1,
                cgroup: Some(dir),
            });
        }
    }
    if let Some(rel) = v2 {
        let root = Path::new("/sys/fs/cgroup");
        if let Some((bytes, dir)) = smallest_on_path(root, &rel, "memory.max") {
            return Some(MemoryLimit {
                bytes,
                source: LimitSource::CgroupV2,
                cgroup: Some(dir),
            });
        }
    }
    None
}

/// What this process may use: the cgroup limit, else `MemAvailable` (when neither can be read,
/// `None`).
pub fn detect_limit() -> Option<MemoryLimit> {
    let avail = mem_available();
    match (cgroup_limit(), avail) {
        // A cgroup limit above what the machine has free is not what binds.
        (Some(c), Some(a)) if a < c.bytes => Some(MemoryLimit {
            bytes: a,
            source: LimitSource::MemAvailable,
            cgroup: None,
        }),
        (Some(c), _) => Some(c),
        (None, Some(a)) => Some(MemoryLimit {
            bytes: a,
            source: LimitSource::MemAvailable,
            cgroup: None,
        }),
        (None, None) => None,
    }
}

/// The part of a limit the engine plans with: what it leaves is for the kernel's own use of
/// the process's memory (page tables, socket and pipe buffers), the allocator's slack and the
/// application embedding memwall. 6% and at least 48 MiB.
pub fn budget_of(limit: u64) -> u64 {
    let margin = (limit / 16).max(48 << 20);
    limit.saturating_sub(margin)
}

/// A measured peak of this process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Peak {
    pub bytes: u64,
    /// "cgroup" (the limit's cgroup peak counter: anonymous memory and page cache) or
    /// "vm_hwm" (the process's peak resident set: anonymous memory and mapped file pages).
    pub source: &'static str,
}

/// Whether this process is the only one in the cgroup `dir` (its counters are then ours).
fn alone_in(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    let me = std::process::id().to_string();
    let mut pids = procs.lines().map(str::trim).filter(|l| !l.is_empty());
    pids.next() == Some(me.as_str()) && pids.next().is_none()
}

/// The peak memory of this process: the counter of the cgroup holding the limit where this
/// process is alone in it (as under `memcap.sh`), else `VmHWM`.
pub fn measured_peak(limit: Option<&MemoryLimit>) -> Option<Peak> {
    let own = limit
        .and_then(|l| l.cgroup.as_ref())
        .filter(|dir| alone_in(dir));
    if let Some(dir) = own {
        let file = match limit.map(|l| l.source) {
            Some(LimitSource::CgroupV1) => "memory.max_usage_in_bytes",
            _ => "memory.peak",
        };
        if let Some(bytes) = read_u64(&dir.join(file)).filter(|&b| b < UNLIMITED) {
            return Some(Peak {
                bytes,
                source: "cgroup",
            });
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(Peak {
        bytes: kib_field(&status, "VmHWM:")?,
        source: "vm_hwm",
    })
}

/// This process's resident set now (`VmRSS`): what the runtime already holds before a plan.
pub fn resident_now() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmRSS:")
}

/// The size of the last-level cache in bytes (Linux sysfs), if the kernel reports it.
pub fn last_level_cache() -> Option<u64> {
    let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, u64)> = None;
    for e in std::fs::read_dir(base).ok()?.flatten() {
        let p = e.path();
        let level: Option<u32> = std::fs::read_to_string(p.join("level"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let size = std::fs::read_to_string(p.join("size"))
            .ok()
            .and_then(|s| parse_cache_size(s.trim()));
        if let (Some(l), Some(s)) = (level, size) {
            if best.is_none_or(|(bl, _)| l > bl) {
                best = Some((l, s));
            }
        }
    }
    best.map(|(_, s)| s)
}

/// sysfs cache sizes: "32K", "1024K", "480M".
fn parse_cache_size(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_give_the_v2_path_and_the_v1_memory_path() {
        let text = "9:name=systemd:/\n4:memory:/a/b\n3:cpu,cpuacct:/x\n0::/user.slice/s\n";
        let (v2, v1) = own_cgroups(text);
        assert_eq!(v2.as_deref(), Some("/user.slice/s"));
        assert_eq!(v1.as_deref(), Some("/a/b"));
        let (v2, v1) = own_cgroups("0::/\n");
        assert_eq!((v2.as_deref(), v1), (Some("/"), None));
    }

    #[test]
    fn the_smallest_limit_on_the_path_binds() {
        let root = std::env::temp_dir().join(format!("memwall-cg-{}", std::process::id()));
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("a/memory.max"), "1073741824\n").unwrap();
        std::fs::write(leaf.join("memory.max"), "2147483648\n").unwrap();
        let (b, dir) = smallest_on_path(&root, "/a/b", "memory.max").unwrap();
        assert_eq!((b, dir), (1 << 30, root.join("a")));
        // v1's "no limit" is a page-rounded i64::MAX.
        std::fs::write(root.join("a/memory.max"), "9223372036854771712\n").unwrap();
        let (b, dir) = smallest_on_path(&root, "/a/b", "memory.max").unwrap();
        assert_eq!((b, dir), (2 << 30, leaf.clone()));
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        assert!(smallest_on_path(&root, "/a/b", "memory.max").is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn meminfo_fields_and_cache_sizes_parse() {
        let t = "MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(kib_field(t, "MemAvailable:"), Some(1_024_000));
        assert_eq!(kib_field(t, "Missing:"), None);
        assert_eq!(parse_cache_size("480M"), Some(480 << 20));
        assert_eq!(parse_cache_size("32K"), Some(32 << 10));
        assert_eq!(parse_cache_size("x"), None);
    }

    #[test]
    fn the_budget_leaves_a_margin() {
        assert_eq!(budget_of(2 << 30), (2 << 30) - (128 << 20));
        assert_eq!(budget_of(256 << 20), (256 << 20) - (48 << 20));
        assert_eq!(budget_of(10 << 20), 0);
    }

    #[test]
    fn a_cgroup_counts_as_ours_only_when_we_are_alone_in_it() {
        let dir = std::env::temp_dir().join(format!("memwall-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        std::fs::write(dir.join("cgroup.procs"), format!("{me}\n")).unwrap();
        assert!(alone_in(&dir));
        std::fs::write(dir.join("cgroup.procs"), format!("{me}\n1\n")).unwrap();
        assert!(!alone_in(&dir));
        std::fs::write(dir.join("cgroup.procs"), "1\n").unwrap();
        assert!(!alone_in(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_machine_reports_a_limit_and_a_peak() {
        // Linux exposes both; the values are the machine's, only their presence is checked.
        if cfg!(target_os = "linux") {
            let l = detect_limit().expect("a memory limit");
            assert!(l.bytes > 0);
            let p = measured_peak(None).expect("VmHWM");
            assert!(p.bytes > 0 && p.source == "vm_hwm");
            assert!(resident_now().unwrap() > 0);
        }
    }
}
