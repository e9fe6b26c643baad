#!/usr/bin/env python3
"""A batch through `tandem serve`'s Batches API against the same file through `tandem run`, in one run.

  perf/batch_api_bench.py [BUILD_DIR] [NP] [REQUESTS]

Makes the demo model (`small`) if needed and http_bench.py's mixed workload
(short and long prompts, greedy, ignore_eos so every request generates its
max_tokens). Runs it once with `tandem run` (mpirun -np NP) and once as a
batch uploaded to `tandem serve` on the same ranks and settings (files.create,
batches.create, polled until completed, as a client does). Prints requests/s
and output tokens/s for each and the API/run ratio (the API's time runs from
batches.create to "completed": reading the input through, the lines, and
splitting the output), and checks that both gave the same texts. Figures only:
it never fails on time.
"""
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_setup import demo_model, env, mixed_workload, stop_serve

root = Path(__file__).resolve().parent.parent
build = Path(sys.argv[1] if len(sys.argv) > 1 else root / "build").resolve()
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = int(sys.argv[3]) if len(sys.argv) > 3 else 256
tandem, model = demo_model(build)
reqs = mixed_workload(n)


def call(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def texts_of(jsonl):
    return {o["custom_id"]: o["response"]["body"]["choices"][0]["text"] for o in map(json.loads, jsonl.splitlines())}


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    inp = tmp / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{inp}"\noutput = "{tmp / "out.jsonl"}"\n'
                   f'max_num_seqs = 64\n[kv]\nmemory_gib = 0.25\n[http]\nport = {port}\nbatch_dir = "{tmp / "b"}"\n')
    mpirun = ["mpirun", "--oversubscribe", "-np", str(np_)]

    subprocess.run(mpirun + [tandem, "run", "-c", job], check=True, env=env, timeout=1800, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    summary = json.loads((tmp / "out.jsonl.summary.json").read_text())
    run_text = texts_of((tmp / "out.jsonl").read_text())

    server = subprocess.Popen(mpirun + [tandem, "serve", "-c", job], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if json.loads(call("GET", base + "/health"))["status"] == "ok":
                    break
            except OSError:
                time.sleep(0.2)
        boundary = "bench-boundary"
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}\r\n'
                'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n').encode() + inp.read_bytes() + \
            f"\r\n--{boundary}--\r\n".encode()
        f = json.loads(call("POST", base + "/v1/files", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}))
        t0 = time.perf_counter()
        b = json.loads(call("POST", base + "/v1/batches", json.dumps(
            {"input_file_id": f["id"], "endpoint": "/v1/completions", "completion_window": "24h"}).encode()))
        while b["status"] not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(0.1)
            b = json.loads(call("GET", base + f"/v1/batches/{b['id']}"))
        api_s = time.perf_counter() - t0
        api_text = texts_of(call("GET", base + f"/v1/files/{b['output_file_id']}/content").decode()) \
            if b.get("output_file_id") else {}
    finally:
        stop_serve(job, server)

    run_rps = summary["requests_ok"] / summary["elapsed_s"]
    api_rps = len(api_text) / api_s
    api_tps = b["usage"]["output_tokens"] / api_s
    same = sum(api_text.get(k) == v for k, v in run_text.items())
    print(f"{n} requests, mpirun -np {np_} ({summary.get('mode', 'disagg')}), demo model; batch status {b['status']}")
    print(f"{'':24}{'tandem run':>14}{'Batches API':>14}{'API/run':>10}")
    print(f"{'requests/s':24}{run_rps:14.2f}{api_rps:14.2f}{api_rps / run_rps:10.2f}")
    print(f"{'output tokens/s':24}{summary['output_tokens_per_s']:14.1f}{api_tps:14.1f}"
          f"{api_tps / summary['output_tokens_per_s']:10.2f}")
    print(f"texts equal to tandem run's: {same}/{len(run_text)}")
