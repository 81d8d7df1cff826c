//! Kernel variants known to be wrong on some (vendor, driver, driver version): they are not
//! used there, without running their selftest (a miscompiling driver can also hang or lose the
//! device, which a selftest would not survive gracefully).
//!
//! The built-in list [`BUILTIN`] is empty: no driver bug has been confirmed against these
//! kernels yet. An entry belongs there only with a source (a bug report, or a failing
//! `memwall selftest` on a named driver); add it as
//! `KnownBad { vendor: Some(0x1234), driver: Some("name".into()), min_version: .., max_version:
//! .., variant: "matvec_q4_0_sg".into(), reason: "<link>".into() }`.
//!
//! Apps and tests add entries with [`crate::gpu::HealthOptions::known_bad`] or the
//! `MEMWALL_KNOWN_BAD` variable: entries separated by `;`, each a comma-separated list of
//! `variant=<label or prefix*>`, and optionally `vendor=<id, 0x hex or decimal>`,
//! `driver=<substring of the driver name or info>`, `min=<version>`, `max=<version>` (the first
//! dotted number in the driver info, inclusive bounds), `reason=<text>`.

use crate::error::{Error, Result};
use crate::gpu::device::AdapterInfoRow;
use crate::gpu::registry::KernelKey;

/// One entry: every given condition must hold for the variant to be disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownBad {
    /// PCI vendor id (`AdapterInfo::vendor`), if the entry is vendor-specific.
    pub vendor: Option<u32>,
    /// Case-insensitive substring of the adapter's driver name or driver info.
    pub driver: Option<String>,
    /// Lowest affected driver version (inclusive), e.g. `23.1`.
    pub min_version: Option<String>,
    /// Highest affected driver version (inclusive).
    pub max_version: Option<String>,
    /// A [`KernelKey::label`], or a prefix of labels ending in `*` (`matvec_q4_1*`).
    pub variant: String,
    /// Why (a link to the bug), shown to the user.
    pub reason: String,
}

/// The built-in list (see the module documentation for what may go in it).
pub const BUILTIN: &[fn() -> KnownBad] = &[];

/// The dotted number a version string starts with, or the first one in it: `Mesa 24.0.5` →
/// `[24, 0, 5]`.
fn version(s: &str) -> Option<Vec<u64>> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let v: Vec<u64> = s[start..]
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .next()?
        .split('.')
        .filter(|p| !p.is_empty())
        .map_while(|p| p.parse().ok())
        .collect();
    (!v.is_empty()).then_some(v)
}

impl KnownBad {
    /// Whether this entry disables `key` on the adapter `info`.
    pub fn matches(&self, info: &AdapterInfoRow, key: &KernelKey) -> bool {
        let variant = crate::gpu::health::label_matches(&self.variant, key);
        let vendor = self.vendor.is_none_or(|v| v == info.vendor);
        let driver = self.driver.as_ref().is_none_or(|d| {
            let d = d.to_lowercase();
            info.driver.to_lowercase().contains(&d) || info.driver_info.to_lowercase().contains(&d)
        });
        let have = version(&info.driver_info);
        let in_range = |bound: &Option<String>, ok: fn(std::cmp::Ordering) -> bool| match bound {
            None => true,
            Some(b) => match (&have, version(b)) {
                (Some(h), Some(b)) => ok(h.cmp(&b)),
                // An unknown version cannot be shown to be in range.
                _ => false,
            },
        };
        variant
            && vendor
            && driver
            && in_range(&self.min_version, |o| o.is_ge())
            && in_range(&self.max_version, |o| o.is_le())
    }

    /// Parses one entry of `MEMWALL_KNOWN_BAD` (see the module documentation).
    pub fn parse(s: &str) -> Result<KnownBad> {
        let bad = |msg: String| Error::InvalidArgument(format!("known-bad entry {s:?}: {msg}"));
        let mut e = KnownBad {
            vendor: None,
            driver: None,
            min_version: None,
            max_version: None,
            variant: String::new(),
            reason: "listed by MEMWALL_KNOWN_BAD".into(),
        };
        for field in s.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| bad(format!("{field:?} is not key=value")))?;
            let v = v.trim().to_string();
            match k.trim() {
                "variant" => e.variant = v,
                "vendor" => {
                    let n = match v.strip_prefix("0x") {
                        Some(h) => u32::from_str_radix(h, 16),
                        None => v.parse(),
                    };
                    e.vendor = Some(n.map_err(|_| bad(format!("vendor {v:?} is not a number")))?);
                }
                "driver" => e.driver = Some(v),
                "min" => e.min_version = Some(v),
                "max" => e.max_version = Some(v),
                "reason" => e.reason = v,
                other => return Err(bad(format!("unknown field {other:?}"))),
            }
        }
        if e.variant.is_empty() {
            return Err(bad("no variant=".into()));
        }
        Ok(e)
    }
}

/// The built-in entries, `extra` and `MEMWALL_KNOWN_BAD`'s (a malformed one is an error).
pub fn entries(extra: &[KnownBad]) -> Result<Vec<KnownBad>> {
    let mut v: Vec<KnownBad> = BUILTIN.iter().map(|f| f()).collect();
    v.extend_from_slice(extra);
    if let Ok(s) = std::env::var("MEMWALL_KNOWN_BAD") {
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            v.push(KnownBad::parse(part)?);
        }
    }
    Ok(v)
}

/// The first of `list` that disables `key` on `info`.
pub fn matching<'a>(
    list: &'a [KnownBad],
    info: &AdapterInfoRow,
    key: &KernelKey,
) -> Option<&'a KnownBad> {
    list.iter().find(|e| e.matches(info, key))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn info() -> AdapterInfoRow {
        AdapterInfoRow {
            index: 0,
            backend: "Vulkan".into(),
            name: "llvmpipe (LLVM 15.0.7, 256 bits)".into(),
            vendor: 0x10005,
            device: 0,
            device_type: "Cpu".into(),
            driver: "llvmpipe".into(),
            driver_info: "Mesa 23.2.1-1ubuntu3.1~22.04.2 (LLVM 15.0.7)".into(),
            shader_f16: true,
            subgroup: true,
            subgroup_min_size: 8,
            subgroup_max_size: 8,
            timestamp_query: true,
            max_storage_buffer_binding_size: 1 << 27,
            max_buffer_size: 1 << 30,
            max_compute_workgroup_storage_size: 32768,
            max_compute_invocations_per_workgroup: 1024,
        }
    }

    #[test]
    fn entries_match_on_every_condition() {
        let key = KernelKey::RmsNorm { subgroup: true };
        let e =
            KnownBad::parse("variant=rmsnorm_sg,vendor=0x10005,driver=LLVMPIPE,min=23,max=23.2.1")
                .unwrap();
        assert!(e.matches(&info(), &key));
        assert!(!e.matches(&info(), &KernelKey::RmsNorm { subgroup: false }));
        for other in [
            "variant=rmsnorm_sg,vendor=4318",
            "variant=rmsnorm_sg,driver=nvidia",
            "variant=rmsnorm_sg,min=23.2.2",
            "variant=rmsnorm_sg,max=22",
        ] {
            assert!(
                !KnownBad::parse(other).unwrap().matches(&info(), &key),
                "{other}"
            );
        }
        let prefix = KnownBad::parse("variant=rms*").unwrap();
        assert!(prefix.matches(&info(), &key));
        assert_eq!(version("Mesa 24.0.5 (git)"), Some(vec![24, 0, 5]));
    }

    #[test]
    fn malformed_entries_are_errors() {
        for s in [
            "vendor=1",
            "variant=x,vendor=zz",
            "variant=x,colour=red",
            "junk",
        ] {
            assert!(KnownBad::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn the_builtin_list_parses_and_has_reasons() {
        for f in BUILTIN {
            assert!(!f().reason.is_empty() && !f().variant.is_empty());
        }
    }
}
