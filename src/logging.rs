//! A minimal stderr logger for the `log` crate, so that what wgpu reports through `log` (among
//! it the Vulkan validation layer's messages, when `WGPU_VALIDATION=1` enables the layer) is
//! seen. The level comes from `MEMWALL_LOG` (`off`, `error`, `warn`, `info`, `debug`, `trace`;
//! default `error`): errors always show, the rest on request.
//!
//! Lines look like `[ERROR wgpu_hal::vulkan::instance] message`, one record per line prefix, so
//! a test can count error records.
//!
//! wgpu decides which validation-layer severities to forward from `log::max_level()` when the
//! instance is created: call [`init_from_env`] before any GPU bring-up.

use std::io::Write;

struct StderrLogger {
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
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

/// Installs the logger at `MEMWALL_LOG`'s level (default `error`; an unknown value is reported
/// and ignored). Does nothing if a logger is already installed.
pub fn init_from_env() {
    let raw = std::env::var("MEMWALL_LOG").ok();
    let level = match raw.as_deref().map(parse_level) {
        None => log::LevelFilter::Error,
        Some(Some(l)) => l,
        Some(None) => {
            eprintln!(
                "warning: MEMWALL_LOG={:?} is not off|error|warn|info|debug|trace; using error",
                raw.unwrap_or_default()
            );
            log::LevelFilter::Error
        }
    };
    let logger = Box::leak(Box::new(StderrLogger { level }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_level;

    #[test]
    fn levels_parse() {
        assert_eq!(parse_level(" Debug "), Some(log::LevelFilter::Debug));
        assert_eq!(parse_level("off"), Some(log::LevelFilter::Off));
        assert_eq!(parse_level("loud"), None);
    }
}
