//! End to end against llama.cpp on the real test model (CPU path), by the agreement rule of
//! ../shared/reference/README.md (tests/common/agreement.rs): greedy ids equal over the
//! decisive prefix, probabilities close there, and perplexity within 1% of llama.cpp's.

mod common;

use std::sync::OnceLock;

use memwall::engine::{DeviceChoice, LoadOptions, Model};

fn model() -> Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let opts = LoadOptions {
            device: DeviceChoice::Cpu,
            ..Default::default()
        };
        Model::load(common::model_path(), &opts).unwrap()
    })
    .clone()
}

#[test]
fn greedy_agrees_with_llama_cpp() {
    common::agreement::check_greedy(&model());
}

#[test]
fn perplexity_within_one_percent_of_llama_cpp() {
    common::agreement::check_perplexity(&model());
}
