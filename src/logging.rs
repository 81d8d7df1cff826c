//! A minimal stderr logger for the `log` crate, so that what wgpu reports through `log` (among
//! it the Vulkan validation layer's messages, when `WGPU_VALIDATION=1 WGPU_DEBUG=1` enable the
//! layer and wgpu's debug messenger) is seen. `MEMWALL_LOG` sets the level: a default level
//! and/or `target=level` items, comma-separated (levels `off`, `error`, `warn`, `info`,
//! `debug`, `trace`; a target matches itself and its submodules), e.g.
//! `warn,wgpu_hal=debug`. Default `error`: errors always show, the rest on request.
//!
//! Lines look like `[ERROR wgpu_hal::vulkan::instance] message`, one record per line prefix, so
//! a test can count error records.
//!
//! wgpu decides which validation-layer severities to forward from `log::max_level()` when the
//! instance is created: call [`init_from_env`] before any GPU bring-up.

use std::io::Write;

/// A parsed `MEMWALL_LOG`: the default level and per-target overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct LogSpec {
    pub default: log::LevelFilter,
    /// (target prefix, level); the longest matching prefix wins.
    pub targets: Vec<(String, log::LevelFilter)>,
}

impl LogSpec {
    /// Parses `level` and `target=level` items separated by commas.
    pub fn parse(s: &str) -> Option<LogSpec> {
        let mut spec = LogSpec {
            default: log::LevelFilter::Error,
            targets: Vec::new(),
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                Some((t, l)) => spec.targets.push((t.trim().to_string(), parse_level(l)?)),
                None => spec.default = parse_level(item)?,
            }
        }
        Some(spec)
    }

    /// The level for records of `target`.
    pub fn level_for(&self, target: &str) -> log::LevelFilter {
        self.targets
            .iter()
            .filter(|(t, _)| {
                target == t
                    || (target.starts_with(t.as_str()) && target[t.len()..].starts_with("::"))
            })
            .max_by_key(|(t, _)| t.len())
            .map_or(self.default, |(_, l)| *l)
    }

    /// The most verbose level of any target.
    pub fn max(&self) -> log::LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::max)
    }
}

struct StderrLogger {
    spec: LogSpec,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.spec.level_for(metadata.target())
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // A closed stderr is no reason to fail: the message is lost either way.
        let _ = writeln!(
            std::io::stderr().lock(),
            "[{} {}] {}",
            record.level(),
            record.target(),
            record.args()
        );
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// Parses a `MEMWALL_LOG` value (case-insensitive); `None` for anything else.
pub fn parse_level(s: &str) -> Option<log::LevelFilter> {
    match s.trim().to_ascii_lowercase().as_str() {
        "off" => Some(log::LevelFilter::Off),
        "error" => Some(log::LevelFilter::Error),
        "warn" => Some(log::LevelFilter::Warn),
        "info" => Some(log::LevelFilter::Info),
        "debug" => Some(log::LevelFilter::Debug),
        "trace" => Some(log::LevelFilter::Trace),
        _ => None,
    }
}

/// Installs the logger with `MEMWALL_LOG`'s levels (default `error`; an invalid value is
/// reported and ignored). Does nothing if a logger is already installed.
pub fn init_from_env() {
    init(false)
}

/// As [`init_from_env`]; `verbose` (the CLI's `-v`) makes memwall's own decisions (placement,
/// policy, KV moves) show at `info` when `MEMWALL_LOG` does not say otherwise.
pub fn init(verbose: bool) {
    let raw = std::env::var("MEMWALL_LOG").ok();
    let default = if verbose {
        "error,memwall=info"
    } else {
        "error"
    };
    let spec = match raw.as_deref().map(LogSpec::parse) {
        None => LogSpec::parse(default),
        Some(Some(s)) => Some(s),
        Some(None) => {
            eprintln!(
                "warning: MEMWALL_LOG={:?} is not LEVEL[,TARGET=LEVEL...] with levels \
                 off|error|warn|info|debug|trace; using error",
                raw.unwrap_or_default()
            );
            LogSpec::parse("error")
        }
    };
    let Some(spec) = spec else {
        return;
    };
    let max = spec.max();
    let logger = Box::leak(Box::new(StderrLogger { spec }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_level, LogSpec};
    use log::LevelFilter as L;

    #[test]
    fn levels_parse() {
        assert_eq!(parse_level(" Debug "), Some(L::Debug));
        assert_eq!(parse_level("off"), Some(L::Off));
        assert_eq!(parse_level("loud"), None);
    }

    #[test]
    fn spec_picks_the_longest_matching_target() {
        let s = LogSpec::parse("warn, wgpu_hal=debug,wgpu_hal::gles=off").unwrap();
        assert_eq!(s.level_for("naga::front"), L::Warn);
        assert_eq!(s.level_for("wgpu_hal"), L::Debug);
        assert_eq!(s.level_for("wgpu_hal::vulkan::instance"), L::Debug);
        assert_eq!(s.level_for("wgpu_hal::gles::egl"), L::Off);
        // A prefix of a name is not a parent module.
        assert_eq!(s.level_for("wgpu_hall"), L::Warn);
        assert_eq!(s.max(), L::Debug);
        assert!(LogSpec::parse("warn,x=loud").is_none());
        assert_eq!(LogSpec::parse("").unwrap().default, L::Error);
    }
}
