#!/usr/bin/env bash
# Runs every check CI runs: formatting, clippy, and all tests (unit, kernels against
# kernels-ref, GGUF robustness, tokenizer vectors, end-to-end against llama.cpp's references,
# GPU kernels on the default adapter and again on wgpu's GL backend).
set -euo pipefail
cd "$(dirname "$0")/.."
export MEMWALL_MODEL="${MEMWALL_MODEL:-$(scripts/fetch-model.sh)}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --profile ci
# The portable path (no f16, no subgroups) through GL on llvmpipe.
WGPU_BACKEND=gl cargo test --profile ci --test gpu_kernels
WGPU_BACKEND=gl cargo test --profile ci --test gpu_ops
WGPU_BACKEND=gl cargo test --profile ci --test gpu_attention
WGPU_BACKEND=gl cargo test --profile ci --test gpu_matmul
WGPU_BACKEND=gl cargo test --profile ci --test gpu_kquants
WGPU_BACKEND=gl cargo test --profile ci --test gpu_selftest
WGPU_BACKEND=gl cargo test --profile ci --test gpu_q8act
WGPU_BACKEND=gl cargo test --profile ci --test gpu_backend
WGPU_BACKEND=gl cargo test --profile ci --test stage_timing
WGPU_BACKEND=gl cargo test --profile ci --test bench_smoke
WGPU_BACKEND=gl cargo test --profile ci --test bench_kernels
WGPU_BACKEND=gl cargo test --profile ci --test gpu_fused
WGPU_BACKEND=gl cargo test --profile ci --test ctx_shift -- gpu_shift gpu_decoding
WGPU_BACKEND=gl cargo test --profile ci --test failover device_lost_mid
WGPU_BACKEND=gl cargo test --profile ci --test gpu_startup -- a_failing_variant the_pipeline_cache
WGPU_BACKEND=gl cargo test --profile ci --test gpu_kv_types -- gpu_store gpu_read_write
WGPU_BACKEND=gl cargo test --profile ci --test mem_budget gpu_
# The whole model on GL: the greedy agreement with llama.cpp (the other end-to-end GPU checks
# run on the default adapter above; each pass over the 8 prompts costs minutes on llvmpipe).
WGPU_BACKEND=gl cargo test --profile ci --test gpu_forward gpu_greedy
