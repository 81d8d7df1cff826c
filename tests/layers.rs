//! The library's top-level modules form floors without a circle: each module's `crate::`
//! references are read from its source files; a module may name modules of its own floor or
//! below (`FLOORS`, the table of docs/ARCHITECTURE.md), the graph between top-level modules
//! must be acyclic, and the ground floor (`ground`) imports nothing of the crate. Also checks
//! that the README's list of `src/` entries is what `src/` holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, from the ground up (docs/ARCHITECTURE.md, "Layers").
const FLOORS: &[&[&str]] = &[
    &["ground", "logging"],
    &["gguf", "error", "kv_type"],
    &["config", "tokenizer", "chat", "sampler", "memory"],
    &["cpu", "backend"],
    &["cpu_backend", "gpu", "model"],
    &["plan", "scheduler"],
    &["engine"],
    &["api", "tools"],
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Top-level modules of the library: the entries of `src/` but the crate root and the binary.
fn top_modules() -> BTreeSet<String> {
    fs::read_dir(root().join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lib.rs" && n != "bin")
        .map(|n| n.trim_end_matches(".rs").to_string())
        .collect()
}

fn rust_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if p.is_file() && p.extension().is_some_and(|e| e == "rs") {
        out.push(p.to_path_buf());
    }
}

/// Source without `//` comments (line and doc comments), so a comment naming a module is not an
/// import.
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal ("http://") is rare in this crate and only ever
            // hides text after it, which can only drop an edge from a string: harmless here.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate modules `src` names: `crate::m` paths and `m` inside `use crate::{...}` groups.
fn referenced(src: &str, tops: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in src.match_indices("crate::") {
        let rest = &src[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b, c::{..}}`: the first path segment of each item at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| tops.contains(m));
    out
}

/// module -> (module it references -> one file that does), for every top-level module.
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let tops = top_modules();
    let mut g: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &tops {
        let mut files = Vec::new();
        rust_files(&root().join("src").join(m), &mut files);
        rust_files(&root().join("src").join(format!("{m}.rs")), &mut files);
        let edges = g.entry(m.clone()).or_default();
        for f in files {
            let src = strip_comments(&fs::read_to_string(&f).unwrap());
            for r in referenced(&src, &tops) {
                if &r != m {
                    let rel = f.strip_prefix(root()).unwrap().display().to_string();
                    edges.entry(r).or_insert(rel);
                }
            }
        }
    }
    g
}

/// A circle in `g`, as the modules along it, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    // 0: unseen, 1: on the current path, 2: done.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeMap<String, String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for next in g.get(m).into_iter().flat_map(|e| e.keys()) {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = path.iter().position(|p| p == next).unwrap();
                    let mut c = path[at..].to_vec();
                    c.push(next.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(next, g, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn top_level_modules_import_without_a_circle() {
    let g = graph();
    assert!(g.len() > 10, "found only {:?} under src/", g.keys());
    if let Some(c) = find_cycle(&g) {
        let steps: Vec<String> = c
            .windows(2)
            .map(|w| format!("{} -> {} ({})", w[0], w[1], g[&w[0]][&w[1]]))
            .collect();
        panic!(
            "import circle between top-level modules:\n  {}",
            steps.join("\n  ")
        );
    }
    for (m, edges) in &g {
        println!("{m} -> {:?}", edges.keys().collect::<Vec<_>>());
    }
}

#[test]
fn every_module_imports_only_its_floor_and_below() {
    let floor = |m: &str| FLOORS.iter().position(|f| f.contains(&m));
    let g = graph();
    let mut wrong = Vec::new();
    for (m, edges) in &g {
        let Some(fm) = floor(m) else {
            wrong.push(format!(
                "{m} is on no floor (add it to FLOORS and the architecture doc)"
            ));
            continue;
        };
        for (to, file) in edges {
            if floor(to).is_none_or(|ft| ft > fm) {
                wrong.push(format!(
                    "{m} (floor {fm}) -> {to} (floor {:?}) in {file}",
                    floor(to)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports upwards:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_ground_floor_imports_nothing_of_the_crate() {
    let g = graph();
    let ground = g.get("ground").expect("src/ground");
    assert!(ground.is_empty(), "ground imports {ground:?}");
}

#[test]
fn the_checker_sees_circles_and_grouped_imports() {
    // The graph reader itself: a grouped import is an edge, a comment is not, a circle is found.
    let tops: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let src = strip_comments("use crate::{a::X, b};\n// crate::c\nfn f() { crate::c::g() }");
    assert_eq!(
        referenced(&src, &tops),
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect()
    );
    let src = strip_comments("use std::io; // crate::c");
    assert!(referenced(&src, &tops).is_empty());
    let edge = |to: &str| (to.to_string(), String::new());
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeMap::from([edge("b")]));
    g.insert("b".to_string(), BTreeMap::from([edge("c")]));
    g.insert("c".to_string(), BTreeMap::new());
    assert_eq!(find_cycle(&g), None);
    g.insert("c".to_string(), BTreeMap::from([edge("a")]));
    assert_eq!(
        find_cycle(&g).map(|c| c.len()),
        Some(4),
        "a -> b -> c -> a expected"
    );
}

#[test]
fn the_readme_lists_what_src_holds() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("\n`src/`:\n")
        .expect("README has a `src/`: list");
    let listed: BTreeSet<String> = readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    let actual: BTreeSet<String> = fs::read_dir(root().join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, actual, "README's src/ list against ls src");
}
