#!/usr/bin/env python3
"""KV tiers under tensor-parallel workers: the tiers below a group's pool hold
whole blocks (every KV head), so a prefix store written at one width is read
at any other, and host memory works under a group.

Checks, each against the token ids and logprobs of a tp 1 run without tiers:
 - a store written by a tp 2 job is read by a tp 4 job (2 -> 4) and one written
   by a tp 4 job by a tp 1 job (4 -> 1): identical outputs, hits from disk,
   far fewer prompt tokens computed;
 - the stores hold the same bits whatever width wrote them (h5py: every block
   both a tp 1 and a tp 4 store hold is equal), in the one layout a tp 1 job
   writes (kv_heads = the model's);
 - disaggregated, prefill_tp 2 -> decode_tp 1, reading a tp 4 store;
 - cells under job.mode = "auto" regrouped from width 2 to width 1, reading it;
 - a pool too small for the working set at tp 2 with host memory: blocks go
   down gathered from the group and come back scattered to it, outputs equal.
Usage: tp_tiers_test.py TANDEM SRC_DIR"""
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
check = Checks()
WORDS = "cluster node rank queue token model prefill decode block cache epoch router slurm array".split()


def write_input(path, n=24, docs=4, doc_words=260, seed=7):
    """n chat requests; request i has system prompt i % docs and its own question; greedy and sampled."""
    rng = random.Random(seed)
    systems = [" ".join(rng.choices(WORDS, k=doc_words)) for _ in range(docs)]
    with open(path, "w") as f:
        for i in range(n):
            chat = [{"role": "system", "content": systems[i % docs]},
                    {"role": "user", "content": " ".join(rng.choices(WORDS, k=12))}]
            body = {"messages": chat, "max_tokens": 6, "seed": 10 + i, "temperature": 0 if i % 2 else 0.8,
                    "logprobs": True, "top_logprobs": 2}
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def store_rows(store):
    """hash -> the block's bytes, over every finished file of a store; and the kv datasets' shapes."""
    rows, shapes = {}, set()
    for f in sorted(Path(store).glob("*.h5")):
        with h5py.File(f, "r") as h:
            n = int(h.attrs["blocks"])
            kv, hashes = h["kv"][:n], h["hash"][:n]
            shapes.add(h["kv"].shape[1:])
            for hsh, row in zip(hashes, kv):
                rows[int(hsh)] = np.ascontiguousarray(row).tobytes()
    return rows, shapes


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    model = make_model(tandem, src, tmp / "model", "tiny", 2)  # 4 heads, 2 KV heads
    inp = tmp / "in.jsonl"
    write_input(inp)
    cfg = json.loads((model / "config.json").read_text())

    def run(name, np_, *sets, timeout=300):
        out = tmp / f"{name}.jsonl"
        cmd = ["mpirun", "--oversubscribe", "-np", str(np_), tandem, "run", "--model", str(model), "--input", str(inp),
               "--output", str(out)]
        for s in sets:
            cmd += ["--set", s]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env("info"), timeout=timeout)
            rc, log = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, log = 124, str(e.stdout or "")[-800:] + str(e.stderr or "")[-800:]
        got, summary = {}, {}
        if rc == 0 and out.exists():
            for r in map(json.loads, out.read_text().splitlines()):
                got[r["custom_id"]] = (r["tandem"]["token_ids"], r["response"]["body"]["choices"][0].get("logprobs"))
            summary = json.loads(Path(str(out) + ".summary.json").read_text())
        warnings = [l for l in log.splitlines() if "[warning]" in l and "kv store" in l]
        if rc != 0:
            print(log[-2000:])
        return rc, got, summary, warnings

    rc, ref, ref_s, _ = run("ref", 2)
    check("tp 1 reference without tiers runs", rc == 0 and len(ref) == 24)
    computed_cold = ref_s.get("prompt_tokens_computed", 0)

    def tiers(s):
        return s.get("kv_tiers", {})

    def from_disk(name, s):
        t = tiers(s)
        computed = s.get("prompt_tokens_computed", 1 << 30)
        check(f"{name}: hits from disk, at most a fifth of the prompt tokens computed",
              t.get("hit_tokens", {}).get("disk", 0) > 0 and t.get("disk", {}).get("read_blocks", 0) > 0 and
              computed <= 0.2 * computed_cold, f"{computed} of {computed_cold} computed; {json.dumps(t)}")

    # 2 -> 4: written by workers of 2 ranks, read by workers of 4.
    store24 = tmp / "store24"
    kv24 = [f'kv.store_path="{store24}"', "kv.store_min_hits=1"]
    rc, got, s, w = run("write tp2", 3, "cluster.tp=2", *kv24)
    check("tp 2 job writing a store: outputs equal tp 1, no store warnings", rc == 0 and got == ref and not w,
          "; ".join(w))
    check("tp 2 job wrote blocks", tiers(s).get("disk", {}).get("written_blocks", 0) > 0, json.dumps(tiers(s)))
    rc, got, s, w = run("read tp4", 5, "cluster.tp=4", *kv24)
    check("2 -> 4: a tp 4 job reads the tp 2 store, outputs equal tp 1, no warnings", rc == 0 and got == ref and not w,
          "; ".join(w))
    from_disk("2 -> 4", s)

    # 4 -> 1, and the stores' bits: a tp 4 store and a tp 1 store hold the same blocks.
    store41 = tmp / "store41"
    kv41 = [f'kv.store_path="{store41}"', "kv.store_min_hits=1"]
    rc, got, s, w = run("write tp4", 5, "cluster.tp=4", *kv41)
    check("tp 4 job writing a store: outputs equal tp 1", rc == 0 and got == ref and not w, "; ".join(w))
    rc, got, s, w = run("read tp1", 2, *kv41)
    check("4 -> 1: a tp 1 job reads the tp 4 store, outputs equal, no warnings", rc == 0 and got == ref and not w,
          "; ".join(w))
    from_disk("4 -> 1", s)
    store1 = tmp / "store1"
    rc, _, _, _ = run("write tp1", 2, f'kv.store_path="{store1}"', "kv.store_min_hits=1")
    rows1, shapes1 = store_rows(store1)
    rows4, shapes4 = store_rows(store41)
    common = set(rows1) & set(rows4)
    whole = (cfg["num_hidden_layers"], 2, cfg["num_key_value_heads"], 16, cfg["head_dim"])
    check("the tp 4 store has the tp 1 layout (every KV head)", shapes4 == shapes1 == {whole},
          f"tp4 {shapes4}, tp1 {shapes1}, want {whole}")
    check("the tp 1 and tp 4 stores hold the same blocks, bit for bit",
          rc == 0 and len(common) > 0 and len(common) == len(rows1) and all(rows1[h] == rows4[h] for h in common),
          f"{len(common)} common of {len(rows1)} and {len(rows4)}; "
          f"{sum(rows1[h] != rows4[h] for h in common)} differ")

    # Disaggregated at different widths, reading the tp 4 store on the prefill group.
    rc, got, s, w = run("disagg 2->1 read", 4, "cluster.prefill_tp=2", "cluster.decode_tp=1",
                        "cluster.prefill_ranks=2", 'job.mode="disagg"', "router.local_prefill_tokens=64", *kv41)
    check("disagg prefill_tp 2 -> decode_tp 1 reading the tp 4 store: outputs equal", rc == 0 and got == ref and not w,
          "; ".join(w))
    check("disagg 2 -> 1: hits from disk", tiers(s).get("hit_tokens", {}).get("disk", 0) > 0, json.dumps(tiers(s)))

    # Cells under the planner: the prefill worker of ranks 1-2 regroups into two workers of one rank each (rank 2
    # opened its tiers at start-up for that form), and both read the tp 4 store.
    rc, got, s, w = run("cells regrouped read", 5, "cluster.prefill_tp=2", "cluster.decode_tp=1", 'job.mode="auto"',
                        'planner.policy="agg"', *kv41)
    regrouped = [r for r in s.get("ranks", []) if r["rank"] in (1, 2) and r["tensor_parallel_ranks"] == 1]
    check("cells regrouped at another width read the tp 4 store: outputs equal, hits from disk on both new workers",
          rc == 0 and got == ref and not w and len(regrouped) == 2 and
          all(r["hit_tokens_by_tier"][2] > 0 for r in regrouped), f"{'; '.join(w)} {regrouped}")

    # Host memory under a group: a pool of 24 blocks (each rank's shard) for a working set of ~70.
    shard = cfg["num_hidden_layers"] * 2 * 16 * (cfg["num_key_value_heads"] // 2) * cfg["head_dim"] * 4
    small = f"kv.memory_gib={24 * shard / 2**30:.9f}"
    rc, cold_small, cs, _ = run("small pool tp2", 3, "cluster.tp=2", small)
    rc2, got, s, _ = run("small pool tp2 + host", 3, "cluster.tp=2", small, "kv.host_cache_gib=0.01")
    t = tiers(s)
    check("tp 2, small pool, with and without host memory: outputs equal tp 1",
          rc == 0 and rc2 == 0 and cold_small == ref and got == ref)
    check("tp 2, small pool + host memory: blocks went down and came back up",
          t.get("host", {}).get("offloaded_blocks", 0) > 0 and t.get("host", {}).get("onboarded_blocks", 0) > 0 and
          t.get("hit_tokens", {}).get("host", 0) > 0, json.dumps(t))
    check("tp 2: host memory saves prompt tokens",
          s.get("prompt_tokens_computed", 1 << 30) < cs.get("prompt_tokens_computed", 0),
          f'{s.get("prompt_tokens_computed")} with host memory, {cs.get("prompt_tokens_computed")} without')
sys.exit(check.exit_code())
