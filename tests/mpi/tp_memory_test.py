#!/usr/bin/env python3
"""Tensor parallelism: a rank's resident memory, measured in a fresh job per
width (tp_group_test --memory) on a model whose layers are 60 MiB in bf16
(8 layers, hidden 512, tied 152k-token embedding, which is replicated):
  - the anonymous memory (the rank's copies) falls by about the layers'
    3/4 from width 1 to width 4;
  - the checkpoint's mapping is not held: file-backed memory stays far under
    the layers' size (what a rank copied from the file was given back);
  - the same for a mixture of experts (8 layers of 8 experts of 512 units,
    50 MiB of experts): each rank holds only its experts (expert
    parallelism), or its share of every expert (experts split);
  - the dense model's FP8-block twin (tandem quantize): about half the
    layers' bytes less at width 1 than bf16 (weights stay 8-bit), and its
    memory falls with the width too.
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


mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731


def layer_bytes(c):
    hd = c["head_dim"]
    attention = c["hidden_size"] * (2 * c["num_attention_heads"] * hd + 2 * c["num_key_value_heads"] * hd)
    if "num_experts" in c:  # every layer MoE: the router and the experts
        mlp = c["num_experts"] * (c["hidden_size"] + 3 * c["hidden_size"] * c["moe_intermediate_size"])
    else:
        mlp = 3 * c["hidden_size"] * c["intermediate_size"]
    return (1 if c.get("quantization_config") else 2) * c["num_hidden_layers"] * (attention + mlp)  # 8-bit or bf16


with tempfile.TemporaryDirectory() as d:
    by_what = {}
    for arch, split, what in (("qwen3", "", "dense"), ("qwen3_moe", "whole", "MoE, experts whole on their ranks"),
                              ("qwen3_moe", "split", "MoE, experts split"), ("qwen3+fp8", "", "dense FP8")):
        model = Path(d) / arch
        held = {}
        for width in (1, 2, 4) if split != "split" else (4,):
            p = subprocess.run(["mpirun", "--oversubscribe", "-np", "4", binary, "--memory", str(width), str(model), arch,
                                split or "whole"], env=env, capture_output=True, text=True, timeout=240)
            m = re.search(r"width (\d+): anon (\d+) file (\d+)", p.stdout)
            check(f"{what}, width {width}: the job runs", p.returncode == 0 and m is not None, (p.stdout + p.stderr)[-500:])
            if m:
                held[width] = (int(m.group(2)), int(m.group(3)))
        if split == "whole":
            held_whole = held
        if split == "split" and 1 in held_whole:
            held[1] = held_whole[1]
        by_what[what] = held
        layers = layer_bytes(json.loads((model / "config.json").read_text()))
        print(f"figures ({what}): layers " + mib(layers) + "; per width, the largest rank's anonymous / file-backed "
              "memory: " + "; ".join(f"{w}: {mib(a)} / {mib(f)}" for w, (a, f) in sorted(held.items())))
        if 1 in held and 4 in held:
            fell = held[1][0] - held[4][0]
            check(f"{what}: a rank's own memory falls by about the layers' 3/4 from width 1 to 4",
                  fell >= 0.6 * 0.75 * layers, f"fell {mib(fell)}, the layers' 3/4 is {mib(0.75 * layers)}")
            check(f"{what}: the checkpoint's mapping is given back once copied",
                  all(f < layers / 2 for _, f in held.values()), f"file-backed at most {mib(max(f for _, f in held.values()))}")
    bf16, fp8 = by_what.get("dense", {}), by_what.get("dense FP8", {})
    if 1 in bf16 and 1 in fp8:
        saved = bf16[1][0] - fp8[1][0]
        layers = layer_bytes(json.loads((Path(d) / "qwen3" / "config.json").read_text()))
        check("dense FP8 at width 1: about half the layers' bf16 bytes less than bf16 (weights held 8-bit)",
              saved >= 0.8 * 0.5 * layers, f"bf16 {mib(bf16[1][0])}, fp8 {mib(fp8[1][0])}: {mib(saved)} less, "
              f"half the layers is {mib(0.5 * layers)}")
sys.exit(1 if failed else 0)
