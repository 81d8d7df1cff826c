//! The tools around the engine: benchmarks and synthetic models (`bench`), the file checker
//! (`check`) and the tensor listing (`inspect`). The `memwall` command's `bench`,
//! `bench-kernels`, `synth`, `quantize`, `upcycle`, `check` and `inspect` run them. They are
//! behind the `tools` feature (on by default): an app that links the engine alone builds with
//! `default-features = false`, as the C API crate does.

pub mod bench;
pub mod check;
pub mod inspect;
