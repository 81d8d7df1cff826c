#!/usr/bin/env bash
# Runs memwall on the test model (fetched first if missing). Extra arguments go to `memwall run`,
# e.g. scripts/run.sh -p "The capital of France is" -n 32 --temp 0
set -euo pipefail
cd "$(dirname "$0")/.."
model="$(scripts/fetch-model.sh)"
if [ "$#" -eq 0 ]; then
    set -- -p "Write a haiku about memory bandwidth." --chat -n 64
fi
exec cargo run --release --quiet -- run -m "$model" "$@"
