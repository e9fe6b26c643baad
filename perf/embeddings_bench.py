#!/usr/bin/env python3
"""Embeddings per second against completions with max_tokens 1 of the same
prompts (the goal: not slower), on the bench model (Qwen3-0.6B's shape, bf16).

  perf/embeddings_bench.py [BUILD_DIR] [NP] [PROMPTS] [TOKENS]

Writes PROMPTS prompts of TOKENS random token ids twice: as /v1/embeddings
lines (one input each) and as /v1/completions lines with max_tokens 1 (a
prefill and one drawn token), and runs `tandem run` on each, alternated
twice (this machine's speed drifts), with the prefix cache of no use (every
prompt its own). Prints prompts/s and prompt tokens/s of each from the job
summaries (the work, not the model's loading) and their ratio. With NP > 1
the jobs are disaggregated (1 prefill worker). Figures only: it never fails
on time. The bench model is made once under BUILD_DIR/bench-model by
`engine_bench` (run it first) or here by `tandem make-model --preset bench`.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

root = Path(__file__).resolve().parent.parent
build = Path(sys.argv[1] if len(sys.argv) > 1 else root / "build").resolve()
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 1
n = int(sys.argv[3]) if len(sys.argv) > 3 else 32
tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 96
tandem = build / "launcher/tandem"
model = build / "bench-model"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="warn")
if not (model / "config.json").exists():
    subprocess.run([tandem, "make-model", "--preset", "bench", "--out", model], check=True)

rng = random.Random(5)
prompts = [[rng.randrange(1000, 150000) for _ in range(tokens)] for _ in range(n)]
with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    files = {"embeddings": tmp / "emb.jsonl", "completions, max_tokens 1": tmp / "cmp.jsonl"}
    files["embeddings"].write_text("".join(json.dumps({"custom_id": f"e{i}", "input": p}) + "\n"
                                           for i, p in enumerate(prompts)))
    files["completions, max_tokens 1"].write_text("".join(
        json.dumps({"custom_id": f"c{i}", "prompt": p, "max_tokens": 1, "temperature": 0}) + "\n"
        for i, p in enumerate(prompts)))
    rate = {k: [] for k in files}
    for round_ in range(2):
        for name, inp in (files.items() if round_ == 0 else reversed(list(files.items()))):
            out = tmp / f"out-{round_}-{inp.stem}.jsonl"
            cmd = [tandem, "run", "--model", model, "--input", inp, "--output", out]
            if np_ > 1:
                cmd = ["mpirun", "--oversubscribe", "-np", str(np_)] + cmd + ["--set", "job.mode=disagg",
                                                                             "--set", "cluster.prefill_ranks=1"]
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            s = json.loads(Path(str(out) + ".summary.json").read_text())
            assert s["requests_ok"] == n, s
            rate[name].append(n / s["elapsed_s"])
    print(f"bench model, {n} prompts of {tokens} tokens, {'one process' if np_ == 1 else f'{np_} ranks, 1P+{np_ - 2}D'}:")
    for name, r in rate.items():
        print(f"  {name:28s} {max(r):7.2f} prompts/s = {max(r) * tokens:8.1f} prompt tokens/s (best of {len(r)}: "
              + ", ".join(f"{x:.2f}" for x in r) + ")")
    e, c = max(rate["embeddings"]), max(rate["completions, max_tokens 1"])
    print(f"  embeddings / completions: {e / c:.2f}x (goal: at least 1)")
