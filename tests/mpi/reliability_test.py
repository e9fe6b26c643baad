#!/usr/bin/env python3
"""Reliability of `tandem run` under mpirun, each case a way work was lost or
memory ran away before (issue 20):
  - a custom_id that looks like a checkpoint key ("#line:2") next to an
    unparsable line 2: after a stop and --resume both lines are in the output;
  - a 300 MB line: one error record carrying its custom_id, the lines around
    it done, rank 0's peak memory no higher than without it (+ 64 MB);
  - USR1 to every rank while they start (MPI_Init, model loading): each rank
    drains and exits 0, and --resume finishes the input exactly once; one
    process signalled (USR1, TERM) from the moment it holds them (its ELF
    preinit) to 300 ms after exec drains and exits 0;
  - gzip and zstd input: the same outputs as plain, --resume on them works;
    a truncated .gz stops before any work with one line (tests/mpi/
    exactly_once_test.py has the damaged ones); a bzip2 file stops before
    any work, saying what it looks like.
Usage: reliability_test.py TANDEM SRC_DIR"""
import bz2
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2])
env = mpi_env()
check = Checks()


def rows_of(out):
    p = Path(out)
    return [json.loads(l) for l in p.read_text().split("\n") if l] if p.exists() else []


def lines_of(out):
    p = Path(out)
    return p.read_bytes().count(b"\n") if p.exists() else 0


def cmd(job, out, np=3, *extra):
    return ["mpirun", "--oversubscribe", "-np", str(np), tandem, "run", "-c", str(job), "--output", str(out), *extra]


def run(job, out, np=3, *extra, timeout=300):
    return subprocess.run(cmd(job, out, np, *extra), env=env, capture_output=True, text=True, timeout=timeout)


def start(job, out, np=3, *extra):
    return subprocess.Popen(cmd(job, out, np, *extra), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def ranks_of(mpirun):
    """PIDs of the ranks: mpirun's children."""
    p = subprocess.run(["pgrep", "-P", str(mpirun.pid)], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def threads(pid):
    try:
        for l in Path(f"/proc/{pid}/status").read_text().splitlines():
            if l.startswith("Threads:"):
                return int(l.split()[1])
    except OSError:
        pass
    return 0


def summary_of(out):
    p = Path(str(out) + ".summary.json")
    return json.loads(p.read_text()) if p.exists() else {}


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = make_model(tandem, src, tmp / "model", seed=5)

    def job_file(name, inp, extra=""):
        job = tmp / f"{name}.toml"
        job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{inp}"\nmode = "disagg"\nmax_num_seqs = 8\n'
                       f'flush_seconds = 0.2\n{extra}[kv]\nmemory_gib = 0.05\n[router]\nlocal_prefill_tokens = 16\n')
        return job

    # 1. "#line:2" is a custom_id, not the key of the unparsable line 2. The
    # request is long; the error line is committed at once; USR1 with no
    # drain time abandons the request; --resume must run it.
    inp = tmp / "collide.jsonl"
    inp.write_text(json.dumps({"custom_id": "#line:2", "prompt": "x", "max_tokens": 4000, "ignore_eos": True}) +
                   "\nnot json\n")
    job = job_file("collide", inp, "drain_seconds = 0\n")
    out = tmp / "collide.out.jsonl"
    proc = start(job, out)
    t0 = time.time()
    while lines_of(out) < 1 and proc.poll() is None and time.time() - t0 < 60:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGUSR1)
    proc.communicate(timeout=60)
    first = rows_of(out)
    check("'#line:2' case: the stop left only the error line of line 2 written",
          len(first) == 1 and first[0]["error"] is not None, json.dumps(first)[:300])
    p = run(job, out, 3, "--resume")
    rows = rows_of(out)
    ok_ids = sorted(r["custom_id"] for r in rows if r["error"] is None)
    errors = [r for r in rows if r["error"] is not None]
    check("'#line:2' case: after --resume both lines are there, once each (the request ran)",
          p.returncode == 0 and len(rows) == 2 and ok_ids == ["#line:2"] and len(errors) == 1,
          f"rc {p.returncode}, {len(rows)} lines: {[r['custom_id'] for r in rows]} {p.stderr[-300:]}")

    # 2. A 300 MB line between two good ones.
    small = tmp / "small.jsonl"
    big = tmp / "big.jsonl"
    good = [json.dumps({"custom_id": f"g{i}", "prompt": f"line {i}", "max_tokens": 4}) for i in range(3)]
    small.write_text("\n".join(good) + "\n")
    with open(big, "w") as f:
        f.write(good[0] + "\n")
        f.write('{"custom_id":"huge","prompt":"')
        chunk = "word " * 200000
        for _ in range(300):
            f.write(chunk)
        f.write('"}\n')
        f.write(good[1] + "\n" + good[2] + "\n")
    base_out, big_out = tmp / "small.out.jsonl", tmp / "big.out.jsonl"
    pb = run(job_file("small", small), base_out, 2, "--set", "job.mode=agg")
    pg = run(job_file("big", big), big_out, 2, "--set", "job.mode=agg")
    rows = rows_of(big_out)
    huge = [r for r in rows if r["custom_id"] == "huge"]
    check("300 MB line: exit 0, the three good lines done", pg.returncode == 0 and
          sorted(r["custom_id"] for r in rows if r["error"] is None) == ["g0", "g1", "g2"],
          f"rc {pg.returncode}: {pg.stderr[-300:]}")
    check("300 MB line: one error record, with its custom_id, naming job.max_line_bytes",
          len(huge) == 1 and huge[0]["response"]["status_code"] == 400 and
          "job.max_line_bytes" in huge[0]["response"]["body"]["error"]["message"] and
          "300000032 bytes" in huge[0]["response"]["body"]["error"]["message"],
          json.dumps(huge)[:400])
    rss_base, rss_big = summary_of(base_out).get("router_peak_rss_bytes", 0), summary_of(big_out).get("router_peak_rss_bytes", 0)
    check("300 MB line: rank 0's peak memory within 64 MB of the run without it",
          rss_base > 0 and rss_big < rss_base + 64 * 2**20,
          f"{rss_big / 2**20:.0f} MB against {rss_base / 2**20:.0f} MB")
    print(f"figures: rank 0 peak RSS {rss_base / 2**20:.0f} MB without the 300 MB line, {rss_big / 2**20:.0f} MB with it")
    big.unlink()

    # 3. USR1 to every rank while they start up (as Slurm signals each task).
    # A rank with more than one thread is inside MPI_Init or later: main has run.
    workload = tmp / "work.jsonl"
    ids = [f"w{i:02d}" for i in range(24)]
    workload.write_text("".join(json.dumps({"custom_id": c, "prompt": f"request {c} " * 5, "max_tokens": 48,
                                            "ignore_eos": True}) + "\n" for c in ids))
    job = job_file("work", workload, "drain_seconds = 5\n")
    for delay in (0.0, 0.05, 0.15, 0.3):
        out = tmp / f"early{int(delay * 1000)}.jsonl"
        proc = start(job, out)
        t0 = time.time()
        pids = []
        while time.time() - t0 < 30 and proc.poll() is None:
            pids = ranks_of(proc)
            if len(pids) == 3 and all(threads(p) > 1 for p in pids):
                break
            time.sleep(0.003)
        time.sleep(delay)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        _, err = proc.communicate(timeout=120)
        s = summary_of(out)
        check(f"USR1 {delay * 1000:.0f} ms into start-up: every rank drains, exit 0",
              proc.returncode == 0 and len(pids) == 3 and "signal" in err.lower() and s.get("stopped_by_signal") is True,
              f"rc {proc.returncode}, {len(pids)} ranks seen: {err[-300:]}")
        p = run(job, out, 3, "--resume")
        got = sorted(r["custom_id"] for r in rows_of(out))
        check(f"USR1 {delay * 1000:.0f} ms into start-up, then --resume: every line once",
              p.returncode == 0 and got == ids, f"rc {p.returncode}, {len(got)} lines: {p.stderr[-200:]}")

    # 3b. One process (no mpirun), signalled soon after exec. The signals are held from the executable's
    # preinit, before any library's constructor (libfabric's PSM provider once calibrated a timer for ~200 ms
    # in its constructor and installed a SIGTERM handler of its own). Before that only the dynamic loader runs:
    # mapping ~60 libraries, the CUDA ones ~800 MB, takes 25-70 ms here and longer under load, and nothing in
    # a process can catch a signal then. So the earliest case waits until the kernel shows the signals blocked
    # (/proc/PID/status SigBlk) and signals at once; the others at fixed delays. Each drains and exits 0.
    def held_stop_signals(pid):
        mask = 0
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("SigBlk:"):
                    mask = int(line.split()[1], 16)
        except OSError:
            return False
        want = (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGTERM - 1))
        return mask & want == want

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        for delay in (None, 0.08, 0.15, 0.3):
            when = "as soon as held" if delay is None else f"{delay * 1000:.0f} ms after exec"
            out = tmp / f"exec{sig}_{'held' if delay is None else int(delay * 1000)}.jsonl"
            proc = subprocess.Popen([tandem, "run", "-c", str(job), "--output", str(out)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if delay is None:
                deadline = time.monotonic() + 10
                while not held_stop_signals(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.0005)
            else:
                time.sleep(delay)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
            check(f"one process, {signal.Signals(sig).name} {when}: drains, exit 0",
                  proc.returncode == 0 and summary_of(out).get("stopped_by_signal") is True,
                  f"rc {proc.returncode}: {err[-300:]}")

    # 4. Compressed input, read as it streams; --resume on it.
    ref_out = tmp / "plain.out.jsonl"
    p = run(job_file("plain", workload), ref_out)
    ref = {r["custom_id"]: r["tandem"]["token_ids"] for r in rows_of(ref_out)}
    check("plain input: every line", p.returncode == 0 and sorted(ref) == ids, p.stderr[-300:])
    gz = tmp / "work.jsonl.gz"
    gz.write_bytes(gzip.compress(workload.read_bytes()))
    zs = tmp / "work.zst"
    inputs = [("gzip", gz)]
    try:  # zstd input made by our own writer if no zstd tool is here: the unit tests cover zstd too
        subprocess.run(["zstd", "-q", "-f", str(workload), "-o", str(zs)], check=True, capture_output=True)
        inputs.append(("zstd", zs))
    except (OSError, subprocess.CalledProcessError):
        print("note: no zstd command here; zstd input is covered by the unit tests")
    for name, path in inputs:
        out = tmp / f"{name}.out.jsonl"
        job = job_file(name, path, "drain_seconds = 0\n")
        proc = start(job, out)
        t0 = time.time()
        while lines_of(out) < 6 and proc.poll() is None and time.time() - t0 < 60:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGUSR1)
        proc.communicate(timeout=60)
        partial = lines_of(out)
        p = run(job, out, 3, "--resume")
        rows = rows_of(out)
        check(f"{name} input, stopped after {partial} lines then --resume: outputs equal the plain input's, once each",
              p.returncode == 0 and sorted(r["custom_id"] for r in rows) == ids and
              all(r["tandem"]["token_ids"] == ref[r["custom_id"]] for r in rows) and
              summary_of(out).get("input_format") == name, f"rc {p.returncode}: {p.stderr[-300:]}")

    whole = gzip.compress(workload.read_bytes())
    cut = tmp / "cut.jsonl.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    out = tmp / "cut.out.jsonl"
    p = run(job_file("cut", cut), out)
    errs = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
    rows = rows_of(out)
    check("truncated .gz: stops before any work (nothing decoded from it is trusted) with one line saying where",
          p.returncode == 2 and len(errs) == 1 and "truncated at byte" in errs[0] and "nothing was run" in errs[0] and
          not rows, f"rc {p.returncode}: {p.stderr[-300:]}")

    bz = tmp / "work.jsonl.bz2"
    bz.write_bytes(bz2.compress(workload.read_bytes()))
    out = tmp / "bz.out.jsonl"
    p = run(job_file("bz", bz), out)
    errs = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
    check("bzip2 input: stops before any work with one line saying what it looks like",
          p.returncode == 2 and len(errs) == 1 and "bzip2" in errs[0] and not out.exists(), p.stderr[-300:])

sys.exit(check.exit_code())
