#!/usr/bin/env bash
# memwall and llama.cpp side by side on the CPU, file by file: prefill and decode tokens/s of
# each engine on the same GGUF files, the ratio memwall / llama.cpp, and the DRAM read
# bandwidth memwall's probe measured in the same run (the ceiling decode is held against).
# Meant for the K-quant formats (Q4_K, Q5_K, Q6_K, mixed with Q5_0/Q5_1/Q8_0 where a row is not
# a multiple of 256) next to the legacy ones.
#
#   scripts/bench-kquant.sh [FILE...]
#
# FILE: GGUF files [default: five files in $MEMWALL_CACHE (default ~/.cache/memwall):
#       Qwen2.5-Coder 1.5B and 0.5B-AWQ Q4_K_M as published (scripts/fetch-models.sh fetches
#       them), and the test model requantized by llama.cpp's llama-quantize --allow-requantize
#       to Q4_K_M, Q5_K_M and Q6_K (made here when llama-quantize is found and they are
#       missing)]. A missing file is skipped.
# ROUNDS (default 3): each round runs every file once on each engine. Within a round the two
#       engines alternate, and which goes first swaps from one round to the next, so a drift in
#       the machine's speed (heat, a background job) weighs on both engines alike.
# PP (128), TG (64): prompt tokens per prefill and tokens decoded; REPS (2): timed
#       repetitions per run, after each engine's own warm-up; THREADS (2).
# LLAMA_BIN_DIR: where llama-bench is [default /work/peer/build/bin: llama.cpp built from
#       PyPI's llama-cpp-python source package, vendor/llama.cpp]; without it only memwall runs.
# MEMWALL: the memwall binary [default: target/release/memwall, built first]; when set, it is
#       used as is, without a build.
#
# Both engines are run as they ship: llama.cpp with its defaults (mmap, weights repacked for
# the CPU at load), memwall with `-d cpu`. The table is printed in markdown once every run
# is done; progress and each engine's errors go to stderr (full logs under $LOG_DIR, default a
# temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
models_dir="${MEMWALL_CACHE:-$HOME/.cache/memwall}"
rounds="${ROUNDS:-3}"
pp="${PP:-128}"
tg="${TG:-64}"
reps="${REPS:-2}"
threads="${THREADS:-2}"
llama_bin="${LLAMA_BIN_DIR:-/work/peer/build/bin}"
llama_bench="$llama_bin/llama-bench"
if [ -n "${MEMWALL:-}" ]; then
    memwall=$MEMWALL
else
    cargo build --release --quiet
    memwall=target/release/memwall
fi
log_dir="${LOG_DIR:-$(mktemp -d -t bench-kquant.XXXXXX)}"
mkdir -p "$log_dir"

if [ $# -gt 0 ]; then
    files=("$@")
else
    files=(
        "$models_dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        "$models_dir/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
    )
    # The test model requantized (most of its tensors fall back to Q5_0/Q5_1/Q8_0: its width,
    # 576, is not a multiple of the K-quants' 256; ffn_down is Q4_K/Q5_K/Q6_K).
    base="$(scripts/fetch-model.sh)"
    for q in Q4_K_M Q5_K_M Q6_K; do
        out="$models_dir/smollm2-135m-${q,,}.gguf"
        if [ ! -f "$out" ] && [ -x "$llama_bin/llama-quantize" ]; then
            "$llama_bin/llama-quantize" --allow-requantize "$base" "$out" "$q" >/dev/null 2>&1 ||
                echo "llama-quantize to $q failed" >&2
        fi
        files+=("$out")
    done
fi
present=()
for f in "${files[@]}"; do
    if [ -f "$f" ]; then present+=("$f"); else echo "skipped (missing): $f" >&2; fi
done
[ ${#present[@]} -gt 0 ] || { echo "no GGUF file to run" >&2; exit 1; }
have_llama=1
if [ ! -x "$llama_bench" ]; then
    echo "no llama-bench at $llama_bench: memwall only" >&2
    have_llama=0
fi

# One line of JSON per run in $results ({"engine", "file", "round", "rc", "pp", "tg", ...}),
# read by the table at the end: a run that fails leaves its rc and no figures, and the
# others carry on.
results="$log_dir/results.jsonl"
: >"$results"

run_llama() { # run_llama FILE ROUND
    local f=$1 round=$2 log="$log_dir/llama-$(basename "$1" .gguf)-r$2"
    local rc=0
    last_log=$log
    "$llama_bench" -m "$f" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -o json \
        >"$log.json" 2>"$log.err" || rc=$?
    python3 - "$f" "$round" "$rc" "$log.json" >>"$results" <<'EOF'
import json, sys
f, rnd, rc, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = {"engine": "llama.cpp", "file": f, "round": rnd, "rc": rc}
try:
    rows = json.load(open(path))
    # llama-bench prints one row per test: pp (n_gen 0) and tg (n_prompt 0).
    r["pp"] = next(x["avg_ts"] for x in rows if x["n_gen"] == 0)
    r["tg"] = next(x["avg_ts"] for x in rows if x["n_prompt"] == 0)
except Exception:
    pass
print(json.dumps(r))
EOF
}

run_memwall() { # run_memwall FILE ROUND
    local f=$1 round=$2 log="$log_dir/memwall-$(basename "$1" .gguf)-r$2"
    local rc=0
    last_log=$log
    # The bandwidth probe is left on (no --no-probe): its read-only figure is the DRAM read
    # bandwidth of this machine at this moment, measured between the two engines' runs.
    "$memwall" bench -m "$f" -d cpu -t "$threads" -p "$pp" -n "$tg" -r "$reps" --json \
        >"$log.json" 2>"$log.err" || rc=$?
    python3 - "$f" "$round" "$rc" "$log.json" >>"$results" <<'EOF'
import json, sys
f, rnd, rc, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = {"engine": "memwall", "file": f, "round": rnd, "rc": rc}
try:
    c = json.load(open(path))["configs"][0]
    # Mean over the timed repetitions, as llama-bench's avg_ts.
    r["pp"] = c["prefill_tps"]["mean"]
    r["tg"] = c["decode_tps"]["mean"]
    r["achieved_gbs"] = c.get("achieved_gbs")
    p = c.get("probe") or {}
    r["read_gbs"] = p.get("read_gbs")
    r["triad_gbs"] = p.get("triad_gbs")
except Exception:
    pass
print(json.dumps(r))
EOF
}

report() { # report: the last run's figures on stderr, as progress; fails when it has none
    python3 - "$results" >&2 <<'EOF'
import json, os, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
figs = ("pp %.2f t/s, tg %.2f t/s" % (r["pp"], r["tg"])) if "pp" in r else "no figures"
print("round %d %-10s %-45s %s (rc %d)" % (r["round"], r["engine"], os.path.basename(r["file"]), figs, r["rc"]))
sys.exit(0 if "pp" in r else 1)
EOF
}

for round in $(seq 1 "$rounds"); do
    for f in "${present[@]}"; do
        if [ $((round % 2)) -eq 1 ]; then order="llama memwall"; else order="memwall llama"; fi
        for engine in $order; do
            if [ "$engine" = llama ]; then
                [ "$have_llama" = 1 ] || continue
                run_llama "$f" "$round"
            else
                run_memwall "$f" "$round"
            fi
            report || tail -3 "$last_log.err" >&2
        done
    done
done

python3 - "$results" "$pp" "$tg" "$threads" "$reps" <<'EOF'
import json, os, statistics, sys
path, pp, tg, threads, reps = sys.argv[1:6]
runs = [json.loads(l) for l in open(path) if l.strip()]
key = lambda r: (r["file"], r["round"])
by = {}
for r in runs:
    by.setdefault(key(r), {})[r["engine"]] = r
files = list(dict.fromkeys(r["file"] for r in runs))

def num(x, fmt="%.2f"):
    return "-" if x is None else fmt % x

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

print("CPU, %s threads, %s timed repetitions per run; t/s are the mean over them; ratio = memwall / llama.cpp."
      % (threads, reps))
print("DRAM read GB/s: memwall's read-only bandwidth probe in the same run (triad in brackets);"
      " achieved GB/s: memwall's decode bytes per token x decode t/s.")
print()
print("| file | round | llama.cpp pp%s | llama.cpp tg%s | memwall pp%s | memwall tg%s | pp ratio | tg ratio | DRAM read GB/s | achieved GB/s |"
      % (pp, tg, pp, tg))
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
summary = {}
for (f, rnd) in sorted(by, key=lambda k: (files.index(k[0]), k[1])):
    l = by[(f, rnd)].get("llama.cpp", {})
    m = by[(f, rnd)].get("memwall", {})
    lp, lt, mp, mt = l.get("pp"), l.get("tg"), m.get("pp"), m.get("tg")
    rp, rt = ratio(mp, lp), ratio(mt, lt)
    bw = num(m.get("read_gbs"), "%.1f")
    if m.get("triad_gbs") is not None:
        bw += " (%.1f)" % m["triad_gbs"]
    print("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        os.path.basename(f), rnd, num(lp), num(lt), num(mp), num(mt),
        num(rp, "%.2fx"), num(rt, "%.2fx"), bw, num(m.get("achieved_gbs"), "%.1f")))
    s = summary.setdefault(f, {"rp": [], "rt": [], "bw": []})
    if rp is not None: s["rp"].append(rp)
    if rt is not None: s["rt"].append(rt)
    if m.get("read_gbs") is not None: s["bw"].append(m["read_gbs"])

# Over rounds: the median ratio, which one slow round does not move.
print()
print("| file | rounds | median pp ratio | median tg ratio | median DRAM read GB/s |")
print("|---|---:|---:|---:|---:|")
for f in files:
    s = summary.get(f, {"rp": [], "rt": [], "bw": []})
    med = lambda xs, fmt: num(statistics.median(xs) if xs else None, fmt)
    print("| %s | %d | %s | %s | %s |" % (os.path.basename(f), len({k[1] for k in by if k[0] == f}),
          med(s["rp"], "%.2fx"), med(s["rt"], "%.2fx"), med(s["bw"], "%.1f")))
failed = [r for r in runs if r["rc"] != 0 or "pp" not in r]
if failed:
    print()
    for r in failed:
        print("- %s on %s, round %d: rc %d, no figures" % (r["engine"], os.path.basename(r["file"]), r["round"], r["rc"]))
EOF
echo "logs: $log_dir" >&2
