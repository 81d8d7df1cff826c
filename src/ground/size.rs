//! Byte sizes and counts as people write them: `24G`, `1.5GiB`, `800MB`, `35B` parameters.

/// A size or count that does not parse; the message names the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(pub String);

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

type Result<T> = std::result::Result<T, SizeError>;

/// Parses a byte size. Units, any case: none or `B` = bytes; `K`, `M`, `G`, `T` and the same
/// with `iB` (`KiB`, `MiB`, `GiB`, `TiB`) are binary (1024ⁿ), as RAM is sold; `KB`, `MB`, `GB`,
/// `TB` are decimal (1000ⁿ), as [`format_size`] prints. A fraction is allowed (`1.5G`) and the
/// result is rounded to the nearest byte. Errors name the text.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| SizeError(format!("size {s:?}: {why}"));
    let (num, unit) = split_number(s.trim());
    if num.is_empty() {
        return Err(bad("expected a number, then an optional unit"));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u128 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(bad(
                "unknown unit (use K, M, G, T or KiB..TiB for powers of 1024; KB..TB for \
                 powers of 1000)",
            ))
        }
    };
    scaled(num, mult).map_err(|why| bad(&why))
}

/// Parses a count such as a parameter number: a plain integer, or a number with `K`, `M`, `B`
/// or `T` (thousand, million, billion, trillion; any case): `35B`, `1.5T`, `135M`.
pub fn parse_count(s: &str) -> Result<u64> {
    let bad = |why: &str| SizeError(format!("count {s:?}: {why}"));
    let (num, unit) = split_number(s.trim());
    if num.is_empty() {
        return Err(bad("expected a number, then an optional unit"));
    }
    let mult: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "b" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        _ => return Err(bad("unknown unit (use K, M, B or T)")),
    };
    scaled(num, mult).map_err(|why| bad(&why))
}

/// Splits "1.5GiB" into ("1.5", "GiB").
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// `num` (decimal digits with at most one point) times `mult`, rounded to an integer.
fn scaled(num: &str, mult: u128) -> std::result::Result<u64, String> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return Err("no number".into());
    }
    if frac.contains('.') {
        return Err("more than one decimal point".into());
    }
    if frac.len() > 12 {
        return Err("too many decimals".into());
    }
    let too_big = || "too large".to_string();
    let digits = format!("{int}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| too_big())?;
    let denom = 10u128.pow(frac.len() as u32);
    let v = mantissa.checked_mul(mult).ok_or_else(too_big)?;
    // Round half up to a whole byte.
    let v = (v + denom / 2) / denom;
    u64::try_from(v).map_err(|_| too_big())
}

/// Bytes in decimal units with two decimals ("8.59 GB", "512.00 kB"); below 1000, exact
/// ("600 B").
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, f64); 5] = [
        ("PB", 1e15),
        ("TB", 1e12),
        ("GB", 1e9),
        ("MB", 1e6),
        ("kB", 1e3),
    ];
    let b = bytes as f64;
    for (name, scale) in UNITS {
        if b >= scale {
            return format!("{:.2} {name}", b / scale);
        }
    }
    format!("{bytes} B")
}
