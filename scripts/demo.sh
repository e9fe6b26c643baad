#!/usr/bin/env bash
# make run: the main job on the built-in demo: the demo model (demo/model, a
# small Qwen3-shaped model trained on the King James Bible, committed; see
# docs/demo.md) in a disaggregated job with mpirun -np 3 (rank 0 routes, one
# prefill rank, one decode rank) over jobs/examples/demo.jsonl (48
# completions, half of them continuing one shared passage of Genesis, each
# ending at its verse's end, and 8 chats whose answers end on their own),
# then a few of its answers and the summary.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
tandem="$build/launcher/tandem"
model=demo/model
[ -f "$model/model.safetensors" ] || { echo "demo: $model/model.safetensors is missing from this checkout" >&2; exit 1; }
out="$build/demo-output.jsonl"
rm -f "$out" "$out.ckpt" "$out.summary.json"
# As root (containers, CI) Open MPI wants these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== mpirun -np 3 tandem run -c jobs/examples/demo.toml   (1 router, 1 prefill rank, 1 decode rank)"
timeout 600 mpirun --oversubscribe -np 3 "$tandem" run -c jobs/examples/demo.toml --set log.level=warn
echo "== first output line ($out)"
head -n 1 "$out" | cut -c1-400
echo "== a few answers (prompt ... completion; a chat: user > assistant)"
/usr/bin/python3 - jobs/examples/demo.jsonl "$out" <<'PY'
import json, sys
asked = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    b = r["body"]
    asked[r["custom_id"]] = b["prompt"].splitlines()[-1] if "prompt" in b else b["messages"][-1]["content"]
shown = {"text": 0, "message": 0}
for line in open(sys.argv[2]):
    r = json.loads(line)
    if not r.get("response"):
        continue
    c = r["response"]["body"]["choices"][0]
    kind = "message" if "message" in c else "text"
    if shown[kind] < (4 if kind == "text" else 2):
        shown[kind] += 1
        q = asked.get(r["custom_id"], "")
        print(f"  {q}{c['text']}" if kind == "text" else f"  {q} > {c['message']['content']}")
PY
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
