#!/usr/bin/env python3
"""The HTTP path against the batch path on the same requests, in one run.

  perf/http_bench.py [BUILD_DIR] [NP] [REQUESTS] [CONCURRENCY]

Makes the demo model (`small`) if needed and a mixed workload (short and
long prompts, greedy, ignore_eos so every request generates its max_tokens).
Runs it once with `tandem run` (mpirun -np NP, the batch path: every request
known at once) and once through `tandem serve` on the same ranks with
CONCURRENCY streaming HTTP clients. Prints requests/s, output tokens/s, and
TTFT p50/p99 for each, and the HTTP/batch ratios; checks that both paths gave
the same texts. Figures only: it never fails on time.

TTFT is not measured at the same place: the batch figure is the workers'
(arrival on a worker to first token; a batch job queues on the workers), the
HTTP figure is the client's (request sent to first streamed text, through
HTTP, the router and the transport).
"""
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_setup import demo_model, env, mixed_workload, stop_serve

root = Path(__file__).resolve().parent.parent
build = Path(sys.argv[1] if len(sys.argv) > 1 else root / "build").resolve()
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = int(sys.argv[3]) if len(sys.argv) > 3 else 256
conc = int(sys.argv[4]) if len(sys.argv) > 4 else 32
tandem, model = demo_model(build)
reqs = mixed_workload(n)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    inp = tmp / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    port_no = port.getsockname()[1]
    port.close()
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{inp}"\noutput = "{tmp / "out.jsonl"}"\n'
                   f'max_num_seqs = 64\n[kv]\nmemory_gib = 0.25\n[http]\nport = {port_no}\nmax_in_flight = 512\n')
    mpirun = ["mpirun", "--oversubscribe", "-np", str(np_)]

    # Batch path.
    subprocess.run(mpirun + [tandem, "run", "-c", job], check=True, env=env, timeout=1800)
    summary = json.loads((tmp / "out.jsonl.summary.json").read_text())
    batch_text = {}
    for line in (tmp / "out.jsonl").read_text().splitlines():
        o = json.loads(line)
        batch_text[o["custom_id"]] = o["response"]["body"]["choices"][0]["text"]

    # HTTP path: the same requests, CONCURRENCY clients streaming.
    server = subprocess.Popen(mpirun + [tandem, "serve", "-c", job], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port_no, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    queue = list(range(n))
    lock = threading.Lock()
    ttft, texts, tokens, errors = [], {}, [0], [0]

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port_no, timeout=600)
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            r = dict(reqs[i])
            del r["custom_id"]
            r.update(stream=True, stream_options={"include_usage": True})
            t0 = time.perf_counter()
            first, text = None, ""
            try:
                conn.request("POST", "/v1/completions", json.dumps(r), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        with lock:
                            tokens[0] += chunk["usage"]["completion_tokens"]
                    for ch in chunk["choices"]:
                        if ch["text"] and first is None:
                            first = time.perf_counter() - t0
                        text += ch["text"]
            except Exception:  # noqa: BLE001 - counted and reported
                with lock:
                    errors[0] += 1
                conn = http.client.HTTPConnection("127.0.0.1", port_no, timeout=600)
                continue
            with lock:
                texts[reqs[i]["custom_id"]] = text
                if first is not None:
                    ttft.append(first * 1e3)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    http_s = time.perf_counter() - t0
    stop_serve(job, server)

    batch_rps = summary["requests_ok"] / summary["elapsed_s"]
    http_rps = len(texts) / http_s
    same = sum(texts.get(k) == v for k, v in batch_text.items())
    print(f"{n} requests, mpirun -np {np_} ({summary.get('mode', 'disagg')}), demo model; HTTP with {conc} streaming clients")
    print(f"{'':24}{'batch (run)':>14}{'HTTP (serve)':>14}{'HTTP/batch':>12}")
    print(f"{'requests/s':24}{batch_rps:14.2f}{http_rps:14.2f}{http_rps / batch_rps:12.2f}")
    print(f"{'output tokens/s':24}{summary['output_tokens_per_s']:14.1f}{tokens[0] / http_s:14.1f}"
          f"{tokens[0] / http_s / summary['output_tokens_per_s']:12.2f}")
    print(f"{'TTFT p50 (ms)':24}{summary['ttft_ms']['p50']:14.1f}{pct(ttft, 0.5):14.1f}"
          f"{pct(ttft, 0.5) / summary['ttft_ms']['p50']:12.2f}")
    print(f"{'TTFT p99 (ms)':24}{summary['ttft_ms']['p99']:14.1f}{pct(ttft, 0.99):14.1f}"
          f"{pct(ttft, 0.99) / summary['ttft_ms']['p99']:12.2f}")
    print(f"HTTP errors: {errors[0]}; texts equal to the batch output: {same}/{len(batch_text)}")
