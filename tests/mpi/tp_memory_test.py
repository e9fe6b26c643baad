#!/usr/bin/env python3
"""Tensor parallelism: a rank's resident memory, measured in a fresh job per
width (tp_group_test --memory) on a model whose layers are 60 MiB in bf16
(8 layers, hidden 512, tied 152k-token embedding, which is replicated):
  - the anonymous memory (the rank's copies) falls by about the layers'
    3/4 from width 1 to width 4;
  - the checkpoint's mapping is not held: file-backed memory stays far under
    the layers' size (what a rank copied from the file was given back).
Usage: tp_memory_test.py TP_GROUP_TEST"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

binary = sys.argv[1]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failed = 0


def check(name, ok, detail=""):
    global failed
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
    failed += not ok


with tempfile.TemporaryDirectory() as d:
    model = Path(d) / "model"
    held = {}
    for width in (1, 2, 4):
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "4", binary, "--memory", str(width), str(model)],
                           env=env, capture_output=True, text=True, timeout=240)
        m = re.search(r"width (\d+): anon (\d+) file (\d+)", p.stdout)
        check(f"width {width}: the job runs", p.returncode == 0 and m is not None, (p.stdout + p.stderr)[-500:])
        if m:
            held[width] = (int(m.group(2)), int(m.group(3)))
    c = json.loads((model / "config.json").read_text())
    hd = c["head_dim"]
    per_layer = c["hidden_size"] * (2 * c["num_attention_heads"] * hd + 2 * c["num_key_value_heads"] * hd) + \
        3 * c["hidden_size"] * c["intermediate_size"]
    layers = 2 * c["num_hidden_layers"] * per_layer  # bf16
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    print("figures: layers " + mib(layers) + "; per width, the largest rank's anonymous / file-backed memory: " +
          "; ".join(f"{w}: {mib(a)} / {mib(f)}" for w, (a, f) in sorted(held.items())))
    if 1 in held and 4 in held:
        fell = held[1][0] - held[4][0]
        check("a rank's own memory falls by about the layers' 3/4 from width 1 to 4",
              fell >= 0.6 * 0.75 * layers, f"fell {mib(fell)}, the layers' 3/4 is {mib(0.75 * layers)}")
        check("the checkpoint's mapping is given back once copied",
              all(f < layers / 2 for _, f in held.values()), f"file-backed at most {mib(max(f for _, f in held.values()))}")
sys.exit(1 if failed else 0)
