//! Paths shared by the C API tests: the repository, the built library, the test model.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the capi crate's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The test model: `MEMWALL_MODEL`, else where scripts/fetch-model.sh caches it.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("MEMWALL_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is not set");
            PathBuf::from(home).join(".cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(p.is_file(), "test model missing at {}", p.display());
    p
}

/// Whether `artifact` is missing or older than any of `inputs` (files or folders, whose
/// files count).
pub fn stale(artifact: &Path, inputs: &[PathBuf]) -> bool {
    fn newest(p: &Path) -> Option<std::time::SystemTime> {
        let m = std::fs::metadata(p).ok()?;
        if m.is_dir() {
            std::fs::read_dir(p)
                .ok()?
                .filter_map(|e| newest(&e.ok()?.path()))
                .max()
        } else {
            m.modified().ok()
        }
    }
    match newest(artifact) {
        None => true,
        Some(t) => inputs.iter().any(|i| newest(i).is_some_and(|n| n > t)),
    }
}

/// The folder holding libmemwall_c.so of this test's profile: `cargo test` builds the
/// library's cdylib with its tests (after the memwall library it links); it is built here
/// when missing or older than its sources or the memwall library.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let lib = profile_dir.join(format!(
        "{}memwall_c{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let inputs = [root().join("capi/src"), profile_dir.join("libmemwall.rlib")];
    if stale(&lib, &inputs) {
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()).unwrap() {
            "debug" => "dev".to_string(),
            p => p.to_string(),
        };
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "memwall-c", "--lib", "--profile", &profile])
            .arg("--target-dir")
            .arg(profile_dir.parent().unwrap())
            .current_dir(root())
            .status()
            .unwrap();
        assert!(st.success(), "cannot build memwall-c");
    }
    assert!(lib.is_file(), "{} missing", lib.display());
    profile_dir
}

/// Compiles examples/c/`name`.c against include/memwall.h and the shared library, with
/// warnings as errors; returns the executable.
pub fn build_c_example(name: &str) -> PathBuf {
    let lib = lib_dir();
    let out_dir = std::env::temp_dir().join(format!("memwall-capi-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join(format!("examples/c/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lmemwall_c")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed on {name}.c:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
