#!/usr/bin/env python3
"""Cold against warm jobs on a shared-prefix workload, then the tiers' data
paths against plain copies and plain HDF5 (the kv_tier_bench binary).

  perf/kv_tier_bench.py [BUILD_DIR] [NP] [REQUESTS]

Makes the demo model (`small`) if needed and a workload of REQUESTS chat
requests sharing one long system prompt (~1,100 tokens), each with its own
question (~80 tokens), 16 tokens generated greedily. Runs it:
  cold        no store
  warm rerun  after a job that stored every full block (kv.store_min_hits = 1)
  warm shared after a job that stored blocks used twice (the default: the shared prompt)
and prints elapsed time, requests/s, output tokens/s, TTFT p50/p99 and prompt
tokens computed, with warm/cold ratios. Outputs must be equal (checked). Figures
only: it never fails on time.
"""
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_setup import demo_model, env

root = Path(__file__).resolve().parent.parent
build = Path(sys.argv[1] if len(sys.argv) > 1 else root / "build").resolve()
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = int(sys.argv[3]) if len(sys.argv) > 3 else 64
tandem, model = demo_model(build)

with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    rng = random.Random(5)
    words = "cluster node rank queue token model prefill decode block cache epoch router scheduler".split()
    system = " ".join(rng.choices(words, k=1000))
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(n):
            chat = [{"role": "system", "content": system}, {"role": "user", "content": " ".join(rng.choices(words, k=64))}]
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": chat, "max_tokens": 16, "temperature": 0, "ignore_eos": True}}) + "\n")

    def run(name, kv=""):
        job = tmp / f"{name}.toml"
        job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{tmp / "in.jsonl"}"\n[kv]\n{kv}')
        out = tmp / f"{name}.jsonl"
        subprocess.run(["mpirun", "--oversubscribe", "-np", str(np_), tandem, "run", "-c", job, "--output", out],
                       check=True, capture_output=True, env=env, timeout=1800)
        tokens = {json.loads(l)["custom_id"]: json.loads(l)["tandem"]["token_ids"] for l in out.read_text().splitlines()}
        return json.loads(Path(str(out) + ".summary.json").read_text()), tokens

    cold, ref = run("cold")
    results = [("cold", cold)]
    for label, hits in (("warm rerun", 1), ("warm shared", 2)):
        store = tmp / f"store{hits}"
        kv = f'store_path = "{store}"\nstore_min_hits = {hits}\n'
        run(f"fill{hits}", kv)
        s, tokens = run(f"warm{hits}", kv)
        if tokens != ref:
            print(f"ERROR: {label}: outputs differ from the cold run")
            sys.exit(1)
        results.append((label, s))

    print(f"kv_tier_bench: {n} requests sharing a ~1,100-token system prompt, demo model, mpirun -np {np_}")
    print(f"  {'job':<12} {'elapsed s':>9} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'computed':>9} {'disk hits':>9}")
    for label, s in results:
        print(f"  {label:<12} {s['elapsed_s']:9.2f} {s['requests_per_s']:7.2f} {s['output_tokens_per_s']:9.1f} "
              f"{s['ttft_ms']['p50']:7.0f}ms {s['ttft_ms']['p99']:7.0f}ms {s['prompt_tokens_computed']:9d} "
              f"{s['kv_tiers']['hit_tokens']['disk']:9d}")
    for label, s in results[1:]:
        print(f"  {label} / cold: throughput x{s['requests_per_s'] / cold['requests_per_s']:.2f}, "
              f"TTFT p50 x{s['ttft_ms']['p50'] / max(cold['ttft_ms']['p50'], 1e-9):.2f}, "
              f"prompt tokens computed x{s['prompt_tokens_computed'] / max(cold['prompt_tokens_computed'], 1):.3f}; "
              f"store read {s['kv_tiers']['disk']['read_gbps']:.2f} GB/s")
    print("outputs: warm == cold for every request")

bench = build / "perf/kv_tier_bench"
if bench.exists():
    subprocess.run([bench], check=True)
