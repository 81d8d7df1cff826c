#!/usr/bin/env bash
# Time to first token with and without --prompt-cache on a repeated 300-token system prompt
# (CPU). Run 1 without a cache; run 2 fills the cache (question A); runs 3-5 ask other
# questions after the same system prompt: the cache restores the system prompt and only the
# question is evaluated. Prints each run's ttft_ms and whether its ids equal the uncached run's.
# Usage: scripts/bench-prompt-cache.sh [memwall binary] (default target/ci/memwall).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-${CARGO_TARGET_DIR:-target}/ci/memwall}"
MODEL="${MEMWALL_MODEL:-$(scripts/fetch-model.sh)}"
CACHE="$(mktemp -d)/system.mwpc"
SYSTEM="You are Memwall Assistant, a careful and friendly helper for people who run language models on their own phones and laptops. Follow these rules. Answer in plain English and keep each answer short unless the user asks for detail. When you are not sure, say so and explain what would settle the question. Never invent numbers, file names or commands; if a figure matters, tell the user how to measure it. Prefer concrete steps over general advice, and number the steps when there are more than two. When the user asks about memory, give sizes in bytes with the unit and say whether they are powers of 1000 or 1024. When the user asks about speed, ask which device, which model and which quantization they use before comparing figures. Be polite, do not repeat the question back, and do not apologise more than once. If the user writes in another language, answer in that language. Keep code blocks short and complete, with the language named after the fence. When a question is about safety or privacy, explain the trade-offs plainly and let the user decide. When you finish, stop; do not add a summary of what you said. If the user pastes an error message, quote the line that matters, say what it means, and give the smallest change that fixes it. If the user asks for a comparison, use a short table with the same units in every row. Mention the version of any tool whose behaviour changed between releases."
run() { # $1 question, $2.. extra flags; prints ttft_ms and the generated ids
  "$BIN" run -m "$MODEL" --device cpu --temp 0 -n 16 --json -p "$SYSTEM

Question: $1
Answer:" "${@:2}" 2>/dev/null | tail -n 1 |
    python3 -c 'import json,sys; o=json.load(sys.stdin); print(len(o["prompt_ids"]), round(o["timings"]["ttft_ms"],1), o.get("prompt_cache",{}).get("restored_tokens","-"), json.dumps(o["generated_ids"]))'
}
printf "%-44s %7s %9s %9s %s\n" run prompt ttft_ms restored same_ids
for q in "How much memory does a 7B model need at 4 bits?" "What is a KV cache?" "Why is my phone slower than my laptop?"; do
  read -r n0 t0 _ ids0 <<<"$(run "$q")"
  read -r n1 t1 r1 ids1 <<<"$(run "$q" --prompt-cache "$CACHE")"
  printf "%-44s %7s %9s %9s %s\n" "no cache: ${q:0:30}" "$n0" "$t0" "-" "-"
  printf "%-44s %7s %9s %9s %s\n" "--prompt-cache: ${q:0:24}" "$n1" "$t1" "$r1" "$([ "$ids0" = "$ids1" ] && echo yes || echo NO)"
done
