#!/usr/bin/env bash
# The memory wall, side by side: memwall and llama.cpp on a model larger than the memory they
# may use, each run capped as a phone caps an app (../shared/tools/memcap.sh: anonymous memory
# and page cache together) with the model file dropped from the page cache first, so every
# byte a run reads comes from storage. Prints prefill and decode tokens/s per cap, memwall's
# bytes read per token and the fraction of the storage floor it reached (for a mixture of
# experts: the expert cache's hit rate and the expert bytes read per token).
#
#   scripts/bench-memwall.sh [MODEL] [CAPS]
#
# MODEL: a GGUF file [default: the 7B synth, made by `memwall synth --preset 7b --layers 32
#        --type q4_0` under $MEMWALL_CACHE (default ~/.cache/memwall) if missing].
# CAPS:  comma list [default: 2G,3G,none]; "none" runs uncapped (the resident speed).
# LLAMA_BENCH: llama.cpp's llama-bench (built from PyPI's llama-cpp-python source package,
#        vendor/llama.cpp); without it only memwall runs. THREADS (default 2), PP (128), TG (64).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${MEMWALL_SHARED:-../shared}"
cache="${MEMWALL_CACHE:-$HOME/.cache/memwall}"
model="${1:-$cache/synth-7b-q4_0.gguf}"
caps="${2:-2G,3G,none}"
threads="${THREADS:-2}"
pp="${PP:-128}"
tg="${TG:-64}"
cargo build --release --quiet
memwall=target/release/memwall
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    "$memwall" synth -o "$model" --preset 7b --layers 32 --type q4_0 >&2
fi
capped() { # capped CAP CMD...: CMD under the cap (none: as is), cold.
    local cap=$1; shift
    python3 "$shared/tools/dropcache.py" "$model"
    if [ "$cap" = none ]; then "$@"; else bash "$shared/tools/memcap.sh" "$cap" "$@"; fi
}
printf '%-6s %-34s %10s %10s %12s %9s %s\n' cap engine "pp$pp t/s" "tg$tg t/s" "GB read/tok" "of floor" "peak / rc"
for cap in ${caps//,/ }; do
    out=$(capped "$cap" "$memwall" bench -m "$model" -d cpu -t "$threads" -p "$pp" -n "$tg" -r 1 \
        --no-probe --json 2>/tmp/memwall-bench.err) && rc=0 || rc=$?
    peak=$(grep -o 'peak [^,]*' /tmp/memwall-bench.err | tail -1 || true)
    echo "$out" | python3 -c '
import json, sys
cap, rc, peak = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    c = json.loads(sys.stdin.read())["configs"][0]
except Exception:
    print("%-6s %-34s %10s %10s %12s %9s %s rc %s" % (cap, "memwall", "-", "-", "-", "-", peak, rc)); sys.exit()
s = c.get("storage") or {}
frac = s.get("floor_fraction")
x = c.get("experts")
if x:
    # A mixture of experts holding its experts in a cache: hit rate, expert bytes read.
    name = "memwall (experts: %.0f%% hits)" % (100 * x["hit_rate"])
    read = x["read_bytes_per_token"]
else:
    name = "memwall (%d/%d blocks resident)" % (s.get("resident_blocks", 0), s.get("resident_blocks", 0) + s.get("streamed_blocks", 0))
    read = s.get("read_bytes_per_token", 0)
print("%-6s %-34s %10.2f %10.3f %12.2f %9s %s rc %s" % (cap, name,
    c["prefill_tps"]["median"], c["decode_tps"]["median"], read / 1e9,
    "-" if frac is None else "%.0f%%" % (100 * frac), peak, rc))
' "$cap" "$rc" "$peak"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        for mode in "mmap, --repack 0:-lm mmap --repack 0" "defaults:"; do
            name=${mode%%:*}; flags=${mode#*:}
            # shellcheck disable=SC2086
            out=$(capped "$cap" "$LLAMA_BENCH" -m "$model" -t "$threads" -p "$pp" -n "$tg" -r 1 \
                $flags -o json 2>/tmp/llama-bench.err) && rc=0 || rc=$?
            peak=$(grep -o 'peak [^,]*' /tmp/llama-bench.err | tail -1 || true)
            echo "$out" | python3 -c '
import json, sys
cap, name, rc, peak = sys.argv[1:5]
try:
    rows = json.loads(sys.stdin.read())
    pp = next(r["avg_ts"] for r in rows if r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_prompt"] == 0)
    print("%-6s %-34s %10.2f %10.3f %12s %9s %s rc %s" % (cap, "llama.cpp (" + name + ")", pp, tg, "-", "-", peak, rc))
except Exception:
    print("%-6s %-34s %10s %10s %12s %9s %s rc %s" % (cap, "llama.cpp (" + name + ")", "-", "-", "-", "-", peak, rc))
' "$cap" "$name" "$rc" "$peak"
        done
    fi
done
