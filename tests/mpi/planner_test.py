#!/usr/bin/env python3
"""`tandem run` with job.mode = "auto": the planner reads each epoch of a
two-phase input ahead (RAG-like long prompts, then reasoning-like long
answers) and re-splits the workers between epochs. Checks, for the lookahead
and the sla policy: at least one re-split, logged with its prediction; the
summary lists every epoch with its split, predicted and measured seconds; and
every output is token-for-token the one of a static disaggregated run, also
with workers of two ranks whose KV moves two-sided. USR1 while the planner
reads epochs ahead, and while a cell regroups, is seen within 1.5 s.
Usage: planner_test.py TANDEM SRC_DIR. One scenario alone: TANDEM_ONLY=cells (policies, tp2, cells, resume, stop;
several with commas)."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env("info")
check = Checks()

with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    model = make_model(tandem, src, tmp / "model", "tiny", 2)
    rng = random.Random(7)
    words = "cluster node rank queue token model prefill decode block cache epoch router".split()
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(60):
            long_prompt = i < 30
            f.write(json.dumps({"custom_id": f"q{i}", "prompt": " ".join(rng.choices(words, k=600 if long_prompt else 8)),
                                "max_tokens": 4 if long_prompt else 160, "temperature": 0, "ignore_eos": True}) + "\n")

    def run(name, mode, policy, inp="in.jsonl", *extra, np=5):
        job = tmp / f"{name}.toml"
        job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{tmp / inp}"\nmode = "{mode}"\n'
                       f'epoch_requests = 30\nmax_num_seqs = 16\n[kv]\nmemory_gib = 0.05\n[planner]\npolicy = "{policy}"\n')
        out = tmp / f"{name}.jsonl"
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", str(np), tandem, "run", "-c", job, "--output", out, *extra],
                           capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
        tokens = {}
        if out.exists():
            for line in out.read_text().splitlines():
                o = json.loads(line)
                tokens[o["custom_id"]] = o["tandem"]["token_ids"]
        summary = json.loads((tmp / f"{name}.jsonl.summary.json").read_text()) if p.returncode == 0 else {}
        return p, tokens, summary

    static = {}
    if any(check.selected(s) for s in ("policies", "tp2", "cells", "resume")):  # what they compare against
        p, static, _ = run("static", "disagg", "lookahead")
        check("static disaggregated run completes", p.returncode == 0 and len(static) == 60)
    if check.wants("policies"):
        for policy in ("lookahead", "sla"):
            p, tokens, summary = run(policy, "auto", policy)
            log = p.stdout + p.stderr
            resplits = re.findall(r"epoch \d+: \S+ -> \S+, predicted [+-]\d+%", log)
            check(f"{policy}: completes", p.returncode == 0 and len(tokens) == 60)
            check(f"{policy}: re-splits at least once, logged with its prediction", len(resplits) >= 1,
                  "; ".join(resplits) or log[-1500:])
            epochs = summary.get("epochs", [])
            check(f"{policy}: the summary has both epochs, predicted and measured",
                  len(epochs) == 2 and all(e["predicted_s"] > 0 and e["measured_s"] and e["measured_s"] > 0 and
                                           re.fullmatch(r"agg|\d+P:\d+D", e["split"]) for e in epochs), epochs)
            check(f"{policy}: outputs token-for-token those of the static run", tokens == static,
                  f"{sum(tokens.get(k) != v for k, v in static.items())} differ")

    # Workers of two ranks (tensor-parallel) whose KV moves two-sided: a re-split is rank 0's word, taken at
    # once, so no worker waits for another while a transfer to it is still to be received.
    if check.wants("tp2"):
        p, tokens, summary = run("tp2 two-sided", "auto", "lookahead", "in.jsonl", "--set", "cluster.tp=2", "--set",
                                 'transport.backend="mpi_two_sided"')
        log = p.stdout + p.stderr
        resplits = re.findall(r"epoch \d+: \S+ -> \S+, predicted [+-]\d+%", log)
        check("workers of tp 2, two-sided KV: re-split mid-run, outputs token-for-token those of the static run",
              p.returncode == 0 and len(resplits) >= 1 and tokens == static and summary.get("kv_bytes_transferred", 0) > 0,
              f"rc {p.returncode}, re-splits {resplits}, {sum(tokens.get(k) != v for k, v in static.items())} differ")

    # Two widths: 3 cells of 2 ranks, each one prefill worker of 2 ranks or two decode workers of 1. sla splits
    # epoch 0 evenly (1 prefill cell, as the job starts) and the reasoning epoch by the RAG epoch's load, so a
    # cell regroups while the first epoch's requests still run elsewhere; the outputs do not change.
    if check.wants("cells"):
        p, tokens, summary = run("cells", "auto", "sla", "in.jsonl", "--set", "cluster.prefill_tp=2", "--set",
                                 "cluster.decode_tp=1", np=7)
        log = p.stdout + p.stderr
        regroups = re.findall(r"epoch (\d+): ranks [\d, -]+ regroup into \w+", log)
        check("cells of prefill_tp 2 / decode_tp 1 under sla: a cell regrouped after epoch 0, outputs token-for-token "
              "those of the static run", p.returncode == 0 and any(int(e) > 0 for e in regroups) and tokens == static,
              f"rc {p.returncode}, regroups in epochs {regroups}, {sum(tokens.get(k) != v for k, v in static.items())} "
              f"differ; {log[-1500:] if p.returncode else ''}")

    # Resumed: the planner plans only what is left. A first job did lines 0-39;
    # the resumed one's epochs hold the 20 lines still to do, not 60.
    if check.wants("resume"):
        (tmp / "first40.jsonl").write_text("".join((tmp / "in.jsonl").read_text().splitlines(keepends=True)[:40]))
        p1, _, _ = run("resumed", "auto", "lookahead", "first40.jsonl")
        p2, tokens, summary = run("resumed", "auto", "lookahead", "in.jsonl", "--resume")
        planned = sum(e.get("requests", 0) for e in summary.get("epochs", []))
        check("resumed with auto: outputs as the static run, and the epochs plan only the 20 lines left",
              p1.returncode == 0 and p2.returncode == 0 and tokens == static and planned == 20 and
              all(e.get("measured_s") for e in summary.get("epochs", [])),
              f"{planned} requests planned: {summary.get('epochs')}")

    # A stop signal is seen within a fraction of a second whatever the planner is doing: reading and
    # planning epoch after epoch of long prompts (rank 0 read ahead, tokenized and planned several epochs in
    # one go, and saw USR1 13-19 s late in this very job), or while a cell regroups.
    if check.wants("stop"):
        dictionary = Path("/usr/share/dict/words").read_text().split()  # wamerican (make setup): many tokens a word
        with open(tmp / "long.jsonl", "w") as f:
            for i in range(3000):
                f.write(json.dumps({"custom_id": f"l{i}", "prompt": " ".join(rng.choices(dictionary, k=300 + i % 7 * 100)),
                                    "max_tokens": 16 + i % 32}) + "\n")
        with open(tmp / "many.jsonl", "w") as f:  # the two phases of in.jsonl, again and again
            for i in range(3000):
                long_prompt = i % 60 < 30
                f.write(json.dumps({"custom_id": f"m{i}", "prompt": " ".join(rng.choices(words, k=600 if long_prompt else 8)),
                                    "max_tokens": 4 if long_prompt else 160, "ignore_eos": True}) + "\n")
        cells = ["--set", "cluster.prefill_tp=2", "--set", "cluster.decode_tp=1"]
        for name, inp, after, wait, epoch, policy in (("epochs", "long.jsonl", r"epoch 1:", 1.5, 100, "lookahead"),
                                                      ("regroup", "many.jsonl", r"regroup into", 0, 30, "sla")):
            job = tmp / f"stop_{name}.toml"
            job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{tmp / inp}"\nmode = "auto"\n'
                           f'epoch_requests = {epoch}\ndrain_seconds = 2\n[kv]\nmemory_gib = 0.05\n'
                           f'[planner]\npolicy = "{policy}"\n')
            proc = subprocess.Popen(["mpirun", "--oversubscribe", "-np", "7", tandem, "run", "-c", job, "--output",
                                     tmp / f"stop_{name}.jsonl", *cells], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env, start_new_session=True)
            lines, sent, seen, due = [], None, None, None
            deadline = time.time() + 150
            for line in proc.stdout:
                lines.append(line)
                if due is None and re.search(after, line):
                    due = time.time() + wait
                if sent is None and due is not None and time.time() >= due:
                    sent = time.time()
                    os.killpg(proc.pid, signal.SIGUSR1)  # mpirun forwards it to every rank
                if sent is not None and seen is None and "signal 10 received" in line:
                    seen = time.time() - sent
                if time.time() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            rc = proc.wait(timeout=120)
            check(f"auto, USR1 {wait} s after '{after}': rank 0 sees it within 1.5 s, drains, exit 0",
                  sent is not None and seen is not None and seen < 1.5 and rc == 0,
                  f"sent {'yes' if sent else 'never'}, seen after {seen if seen is None else round(seen, 2)} s, rc {rc}: "
                  f"{''.join(lines[-12:])}")

sys.exit(check.exit_code())
