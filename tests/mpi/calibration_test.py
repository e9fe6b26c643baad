#!/usr/bin/env python3
"""Calibration: a real small CPU job (the demo model, 4 worker ranks, a fixed
2P:2D split) fits its hardware profile to the engine steps it measured; the
simulator, replaying the same requests with that profile, predicts the job's
makespan within 25% (14-21% on the 2-core test machine, 5 ranks sharing
its cores: the one-roofline-per-step model does not see that contention).
Usage: calibration_test.py TANDEM SRC_DIR"""
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env("warn")
check = Checks()

with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    model = make_model(tandem, src, tmp / "model", "small", 1)
    rng = random.Random(11)
    words = "cluster node rank queue token model prefill decode block cache epoch router".split()
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(192):
            f.write(json.dumps({"custom_id": f"q{i}", "prompt": " ".join(rng.choices(words, k=rng.randint(20, 400))),
                                "max_tokens": rng.choice([16, 32, 64]), "temperature": 0, "ignore_eos": True}) + "\n")
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{tmp / "in.jsonl"}"\nmode = "auto"\n'
                   f'epoch_requests = 1000\nmax_num_seqs = 16\nmax_batched_tokens = 512\n[kv]\nmemory_gib = 0.25\n'
                   f'[router]\nlocal_prefill_tokens = 64\n[planner]\npolicy = "static:2:2"\n')
    out = tmp / "out.jsonl"
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "5", tandem, "run", "-c", job, "--output", out],
                       capture_output=True, text=True, env=env, timeout=600)
    check("the job runs", p.returncode == 0, (p.stdout + p.stderr)[-2000:])
    summary = json.loads((tmp / "out.jsonl.summary.json").read_text()) if p.returncode == 0 else {}
    prof = summary.get("planner_profile", {})
    check("the summary has a profile fitted to measured steps", prof.get("fitted_from_steps", 0) >= 32, prof)
    profile_file = Path(prof.get("file", tmp / "missing"))
    check("the profile file exists", profile_file.exists(), profile_file)
    measured = summary.get("elapsed_s", 0)
    sim = subprocess.run([tandem, "simulate", "--trace", out, "--model-config", model, "--hardware", profile_file,
                          "--gpus", "4", "--policy", "static:2:2", "--max-num-seqs", "16", "--max-batched-tokens", "512",
                          "--local-prefill-tokens", "64", "--epoch-requests", "1000", "--json"],
                         capture_output=True, text=True, timeout=120)
    predicted = json.loads(sim.stdout)["makespan_s"] if sim.returncode == 0 else 0
    err = abs(predicted - measured) / measured if measured else 1
    check("the simulator with the fitted profile predicts the makespan within 25%", err <= 0.25,
          f"measured {measured:.2f} s, predicted {predicted:.2f} s ({100 * err:.0f}%); fit {prof}")

sys.exit(check.exit_code())
