#!/usr/bin/env bash
# Speculative decoding side by side with llama.cpp on the same files, prompt and threads:
# plain decode and decode with a draft model (and prompt lookup for memwall), greedy.
#   scripts/bench-speculative.sh TARGET.gguf DRAFT.gguf [ROUNDS]
# LLAMA_BIN: the directory of llama.cpp's llama-bench and llama-speculative (built from PyPI's
# llama-cpp-python==0.3.36 source package) [default: ../peer/build/bin].
set -euo pipefail
target=$1 draft=$2 rounds=${3:-2}
bin=${LLAMA_BIN:-$(dirname "$0")/../../peer/build/bin}
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mw=${MEMWALL:-target/release/memwall}
n=96 threads=2 dmax=8
prompt='// A function that sorts a vector of integers with quicksort, in Rust.
fn quicksort(v: &mut Vec<i32>) {'
tps() { python3 -c 'import json,sys,hashlib; o=json.loads(sys.stdin.readlines()[-1]); s=o.get("speculative") or {}; print("%.2f tok/s  accepted %s/%s  ids %s" % (o["timings"]["decode_tps"], s.get("accepted","-"), s.get("drafted","-"), hashlib.md5(str(o["generated_ids"]).encode()).hexdigest()[:8]))'; }
for r in $(seq 1 "$rounds"); do
  echo "round $r"
  echo -n "  memwall plain:          "
  $mw run -m "$target" -d cpu -t $threads -p "$prompt" -n $n --temp 0 --json 2>/dev/null | tps
  echo -n "  memwall draft model:    "
  $mw run -m "$target" -d cpu -t $threads -p "$prompt" -n $n --temp 0 --json \
    --draft-model "$draft" --draft-max $dmax 2>/dev/null | tps
  echo -n "  memwall prompt lookup:  "
  $mw run -m "$target" -d cpu -t $threads -p "$prompt" -n $n --temp 0 --json \
    --draft-lookup --draft-max $dmax 2>/dev/null | tps
  echo -n "  llama.cpp plain (tg64): "
  "$bin/llama-bench" -m "$target" -t $threads -p 0 -n 64 -r 1 -o csv 2>/dev/null \
    | tail -1 | awk -F, '{gsub(/"/,"",$0); print $(NF-1) " tok/s"}'
  echo -n "  llama.cpp draft model:  "
  "$bin/llama-speculative" -m "$target" -md "$draft" -p "$prompt" -n $n -t $threads \
    -td $threads --spec-draft-n-max $dmax --spec-draft-n-min 0 --spec-draft-p-min 0.75 \
    --temp 0 -c 2048 2>&1 | awk '/decoded/ {s=$(NF-1)} /n_drafted/ {d=$NF} /n_accept/ {a=$NF}
      END {print s " tok/s  accepted " a "/" d}'
done
