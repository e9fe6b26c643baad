#!/usr/bin/env python3
"""A CPU worker's compute threads follow its MPI binding: under `mpirun -np 2`
(each rank bound to one core) the worker computes on one thread and says so
in one warning line naming --bind-to none; with --bind-to none it takes the
CPUs it may run on (this machine's, shared with no other worker) and does
not warn. Outputs are the same either way.
Usage: threads_test.py TANDEM SRC_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env("info")
check = Checks()
cpus = len(os.sched_getaffinity(0))
with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    model = make_model(tandem, src, tmp / "model")
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"custom_id": f"t{i}", "prompt": f"count to {i}", "max_tokens": 4, "temperature": 0}) + "\n")
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{tmp / "in.jsonl"}"\n')
    tokens = {}
    for name, flags in (("bound", []), ("unbound", ["--bind-to", "none"])):
        out = tmp / f"{name}.jsonl"
        p = subprocess.run(["mpirun", "--oversubscribe", *flags, "-np", "2", tandem, "run", "-c", job, "--output", out],
                           capture_output=True, text=True, env=env, timeout=300)
        log = p.stdout + p.stderr
        threads = [int(t) for t in re.findall(r"worker ready: .*?, (\d+) threads", log)]
        warned = [l for l in log.splitlines() if "[warning]" in l and "MPI binding" in l]
        check(f"{name}: the job runs", p.returncode == 0, log[-500:])
        tokens[name] = sorted((r["custom_id"], r["tandem"]["token_ids"]) for r in map(json.loads, out.read_text().splitlines())) \
            if p.returncode == 0 else None
        if name == "bound" and cpus > 1:
            check("bound to a core: one thread, and one warning line naming --bind-to none",
                  threads == [1] and len(warned) == 1 and "--bind-to none" in warned[0], f"{threads}, {warned}")
        if name == "unbound":
            check(f"--bind-to none: the worker computes on the {cpus} CPUs it may use, no warning",
                  threads == [cpus] and not warned, f"{threads}, {warned}")
    check("the same outputs either way", tokens["bound"] is not None and tokens["bound"] == tokens["unbound"])
sys.exit(check.exit_code())
