//! include/memwall.h is in sync with the library: every `#[no_mangle]` function of
//! capi/src/lib.rs has a prototype with the same parameter count and vice versa, the
//! `memwall_config` and `memwall_message` fields are the same in the same order, and the status codes have the
//! values the library returns.

mod common;

use std::collections::BTreeMap;

fn read(rel: &str) -> String {
    std::fs::read_to_string(common::root().join(rel)).unwrap()
}

/// Removes /* */ and // comments.
fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn count_params(list: &str) -> usize {
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return 0;
    }
    list.split(',').filter(|p| !p.trim().is_empty()).count()
}

/// name -> parameter count of each function prototype in the header.
fn header_functions(h: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for stmt in strip_comments(h).split(';') {
        let stmt = stmt.trim();
        if stmt.starts_with("typedef") || stmt.starts_with('#') {
            continue;
        }
        let Some(open) = stmt.find('(') else { continue };
        let name: String = stmt[..open]
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if name.starts_with("memwall_") {
            let close = stmt.rfind(')').unwrap();
            out.insert(name, count_params(&stmt[open + 1..close]));
        }
    }
    out
}

/// name -> parameter count of each exported function of the crate.
fn exported_functions(src: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for part in src.split("#[no_mangle]").skip(1) {
        let fn_at = part.find("fn ").unwrap();
        let sig = &part[fn_at + 3..];
        let open = sig.find('(').unwrap();
        let name = sig[..open].trim().to_string();
        // Parameters hold no parentheses (function types are named by aliases).
        let close = sig.find(')').unwrap();
        out.insert(name, count_params(&sig[open + 1..close]));
    }
    out
}

/// The field names of `struct name { ... }` (C or Rust), in order.
fn struct_fields(src: &str, name: &str, rust: bool) -> Vec<String> {
    let src = strip_comments(src);
    let at = src.find(&format!("struct {name} {{")).unwrap();
    let body = &src[at..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    let sep = if rust { ',' } else { ';' };
    body.split(sep)
        .map(str::trim)
        .filter(|f| !f.is_empty() && !f.starts_with("#["))
        .map(|f| {
            if rust {
                let f = f.trim_start_matches("pub ");
                f.split(':').next().unwrap().trim().to_string()
            } else {
                let f = f.trim_end_matches(';');
                f.rsplit([' ', '*']).next().unwrap().to_string()
            }
        })
        .collect()
}

#[test]
fn prototypes_match_exports() {
    let h = header_functions(&read("include/memwall.h"));
    let rs = exported_functions(&read("capi/src/lib.rs"));
    assert!(rs.len() >= 10, "found only {rs:?}");
    assert_eq!(h, rs, "include/memwall.h (left) vs capi/src/lib.rs (right)");
}

#[test]
fn struct_fields_match() {
    let c = struct_fields(&read("include/memwall.h"), "memwall_config", false);
    let r = struct_fields(&read("capi/src/lib.rs"), "memwall_config", true);
    assert!(c.len() >= 5, "{c:?}");
    assert_eq!(c, r);
    let c = struct_fields(&read("include/memwall.h"), "memwall_message", false);
    let r = struct_fields(&read("capi/src/lib.rs"), "memwall_message", true);
    assert_eq!(c, ["role", "content"]);
    assert_eq!(c, r);
}

#[test]
fn status_codes_match() {
    let h = strip_comments(&read("include/memwall.h"));
    let g = read("capi/src/guard.rs");
    let mut n = 0;
    for line in h.lines() {
        let line = line.trim().trim_end_matches(',');
        let Some(rest) = line.strip_prefix("MEMWALL_ERR_") else {
            continue;
        };
        let (name, value) = rest.split_once('=').unwrap();
        let rust = format!("pub const ERR_{}: i32 = {};", name.trim(), value.trim());
        assert!(g.contains(&rust), "guard.rs lacks {rust}");
        n += 1;
    }
    assert!(n >= 10, "found {n} codes");
    let codes = g.matches("pub const ERR_").count();
    assert_eq!(codes, n, "guard.rs has codes the header lacks");
}
