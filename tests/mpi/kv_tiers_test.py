#!/usr/bin/env python3
"""KV tiers in real jobs: host memory (G2) and the HDF5 prefix store (G3).

Checks, each against the tokens of a run without any tier:
 - two consecutive jobs with kv.store_path on a shared-system-prompt input:
   the second computes >= 90% fewer prompt tokens, outputs are identical, and
   its summary says why (hits by tier);
 - the store read back by h5py and h5dump: block count, dtype and shapes as
   the summary and the model say; no unfinished .part file left;
 - the default store_min_hits = 2 stores only blocks used twice;
 - a truncated file, a corrupted block, rows whose hashes were swapped or
   shifted, another model's store, a fine-tune's (two tensors changed) and a
   store without write permission: one warning line each, correct outputs;
 - a pool holding a third of the working set: identical outputs, hits move
   to host memory, and (with the store) to disk; the reorder window groups
   requests by shared prefix, output still in input order;
 - kv.dtype = bf16: the store holds the bf16 bits (uint16, dtype attribute
   "bfloat16"), a second bf16 job reads them back with outputs equal to a
   cold bf16 run, and a float32 job ignores that store with one warning;
   kv.dtype = fp8 the same (uint8 rows of codes and a float32 scale, decoded
   here from the E4M3 definition), its cold run disaggregated.
Usage: kv_tiers_test.py TANDEM SRC_DIR"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env("info")
check = Checks()
WORDS = "cluster node rank queue token model prefill decode block cache epoch router slurm array".split()


def write_input(path, n, docs, doc_words, seed, question_words=128):
    """n chat requests; request i has system prompt i % docs (long) and its own question."""
    rng = random.Random(seed)
    systems = [" ".join(rng.choices(WORDS, k=doc_words)) for _ in range(docs)]
    chats = []
    with open(path, "w") as f:
        for i in range(n):
            chat = [{"role": "system", "content": systems[i % docs]},
                    {"role": "user", "content": " ".join(rng.choices(WORDS, k=question_words))}]
            chats.append(chat)
            body = {"messages": chat, "max_tokens": 8, "temperature": 0}
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")
    return chats


def shared_blocks(model, chats, block=16):
    """Full blocks (as whole prefixes) that at least two of the prompts contain: what store_min_hits = 2 keeps."""
    def tokenize(args, lines):
        p = subprocess.run([tandem, "tokenize", "--model", str(model)] + args, input="\n".join(lines) + "\n",
                           capture_output=True, text=True, check=True)
        return [json.loads(l) for l in p.stdout.splitlines()]
    texts = tokenize(["--chat"], [json.dumps(c) for c in chats])
    ids = tokenize([], [json.dumps(t) for t in texts])
    seen = {}
    for t in ids:
        for b in range(len(t) // block):
            key = tuple(t[:(b + 1) * block])
            seen[key] = seen.get(key, 0) + 1
    return sum(1 for n in seen.values() if n >= 2)


def store_warnings(text):
    return [l for l in text.splitlines() if "[warning]" in l and "kv store" in l]


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    os.chmod(tmp, 0o755)  # the no-permission case runs as nobody
    model = make_model(tandem, src, tmp / "model", "tiny", 2)
    other = make_model(tandem, src, tmp / "other", "tiny", 9)  # same shapes, other weights
    shared = tmp / "shared.jsonl"
    shared_chats = write_input(shared, 48, docs=1, doc_words=400, seed=3)
    reuse = tmp / "reuse.jsonl"
    write_input(reuse, 36, docs=6, doc_words=300, seed=4, question_words=12)

    def run(name, kv="", ranks=1, inp=shared, mdl=model, as_nobody=False, extra=""):
        job = tmp / f"{name}.toml"
        job.write_text(f'[model]\npath = "{mdl}"\n[job]\ninput = "{inp}"\n{extra}[kv]\n{kv}')
        outdir = tmp / "out"
        outdir.mkdir(exist_ok=True)
        os.chmod(outdir, 0o777)
        out = outdir / f"{name}.jsonl"
        cmd = [tandem, "run", "-c", str(job), "--output", str(out)]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        if as_nobody:
            cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
        tokens = {}
        if out.exists():
            for line in out.read_text().splitlines():
                o = json.loads(line)
                if o.get("tandem"):
                    tokens[o["custom_id"]] = o["tandem"]["token_ids"]
        summary = json.loads(Path(str(out) + ".summary.json").read_text()) if p.returncode == 0 else {}
        return p, tokens, summary, store_warnings(p.stdout + p.stderr)

    # The reference: no tier at all.
    p, cold, cold_s, _ = run("cold", ranks=3)
    check("cold run completes", p.returncode == 0 and len(cold) == 48)

    # 1. Two consecutive jobs sharing a store (a rerun: every full block stored).
    store = tmp / "store"
    kv1 = f'store_path = "{store}"\nstore_min_hits = 1\n'
    p, first, s1, w1 = run("first", kv1, ranks=3)
    check("first job with the store: completes, outputs equal the cold run", p.returncode == 0 and first == cold)
    check("first job: no store warnings", not w1, "; ".join(w1))
    written = s1.get("kv_tiers", {}).get("disk", {}).get("written_blocks", 0)
    check("first job wrote blocks to the store", written > 0, json.dumps(s1.get("kv_tiers")))
    p, second, s2, w2 = run("second", kv1, ranks=3)
    c1, c2 = s1.get("prompt_tokens_computed", 0), s2.get("prompt_tokens_computed", 1 << 30)
    check("second job: outputs identical", p.returncode == 0 and second == cold)
    check("second job computes >= 90% fewer prompt tokens", c2 <= 0.1 * c1, f"{c1} -> {c2} prompt tokens computed")
    t2 = s2.get("kv_tiers", {})
    check("second job's summary says why: hits from disk, blocks read",
          t2.get("hit_tokens", {}).get("disk", 0) > 0 and t2.get("disk", {}).get("read_blocks", 0) > 0
          and t2.get("disk", {}).get("blocks_at_open", 0) > 0, json.dumps(t2))
    print(f"     prompt tokens computed: first {c1}, second {c2} ({100 * (1 - c2 / max(c1, 1)):.1f}% fewer); "
          f"second's hits by tier {t2.get('hit_tokens')}")

    # 2. An independent reader: h5py, and the h5dump tool.
    cfg = json.loads((model / "config.json").read_text())
    files = sorted(store.glob("*.h5"))
    rows, hashes, shapes_ok = 0, [], True
    for f in files:
        with h5py.File(f, "r") as h:
            n = int(h.attrs["blocks"])
            rows += n
            kvset = h["kv"]
            shapes_ok &= kvset.dtype == np.float32 and h["hash"].dtype == np.uint64
            shapes_ok &= kvset.shape[1:] == (cfg["num_hidden_layers"], 2, cfg["num_key_value_heads"], 16, cfg["head_dim"])
            shapes_ok &= kvset.shape[0] >= n and h.attrs["dtype"] == "float32" and int(h.attrs["block_size"]) == 16
            shapes_ok &= bool(np.isfinite(kvset[:n]).all()) and bool(np.abs(kvset[:n]).sum() > 0)
            hashes += list(h["hash"][:n])
    check("h5py: blocks in the files = blocks the summary says were written", files and rows == written,
          f"{len(files)} files, {rows} rows, summary {written}")
    check("h5py: float32 [n][layers][2][kv_heads][block][head_dim], uint64 hashes, finite non-zero data", shapes_ok)
    check("no unfinished .part file left", not list(store.glob("*.part")))
    dump = subprocess.run(["h5dump", "-H", "-A", str(files[0])], capture_output=True, text=True) if files else None
    check("h5dump reads the file's header and attributes",
          dump is not None and dump.returncode == 0 and "model_fingerprint" in dump.stdout and
          "H5T_IEEE_F32LE" in dump.stdout, (dump.stderr if dump else "")[-300:])

    # 3. The default filter: only blocks used at least twice reach the store.
    store2 = tmp / "store2"
    p, _, s, _ = run("twice", f'store_path = "{store2}"\n')
    only_shared = s.get("kv_tiers", {}).get("disk", {}).get("written_blocks", 0)
    p1, _, s_all, _ = run("every", f'store_path = "{tmp / "store_all"}"\nstore_min_hits = 1\n')
    every = s_all.get("kv_tiers", {}).get("disk", {}).get("written_blocks", 0)
    want = shared_blocks(model, shared_chats)
    check("store_min_hits = 2 stores exactly the blocks two or more prompts share",
          only_shared == want and every > only_shared, f"{only_shared} blocks with min 2 hits (want {want}), "
          f"{every} with 1")

    # 4. Damaged, foreign and read-only stores: one warning line each, outputs as cold.
    single = tmp / "store_all"  # one file (one worker)

    def copy_store(name):
        dst = tmp / name
        shutil.copytree(single, dst)
        return dst, sorted(dst.glob("*.h5"))[0]

    bad, f = copy_store("truncated")
    os.truncate(f, f.stat().st_size // 2)
    p, tokens, s, w = run("truncated", f'store_path = "{bad}"\n')
    check("truncated file: one warning line, outputs correct", p.returncode == 0 and tokens == cold and len(w) == 1
          and "cannot be read" in w[0], "; ".join(w))

    bad, f = copy_store("flipped")
    with h5py.File(f, "r") as h:
        offset = h["kv"].id.get_chunk_info(3).byte_offset  # the fourth stored block's bytes
    with open(f, "r+b") as fh:
        fh.seek(offset + 100)
        byte = fh.read(1)
        fh.seek(offset + 100)
        fh.write(bytes([byte[0] ^ 0x40]))
    p, tokens, s, w = run("flipped", f'store_path = "{bad}"\n')
    check("corrupted block: one warning line (checksum), outputs correct",
          p.returncode == 0 and tokens == cold and len(w) == 1 and "checksum" in w[0], "; ".join(w))

    # A row's checksum covers its block hash: rows whose /hash entries were swapped or shifted are
    # never served for the wrong prefix (the checksums themselves untouched).
    for name, move in (("swapped", lambda hs: [hs[2], hs[0], hs[1]] + list(hs[3:])),
                       ("rolled", lambda hs: list(hs[1:]) + [hs[0]])):
        bad, f = copy_store(name)
        with h5py.File(f, "r+") as h:
            n = int(h.attrs["blocks"])
            h["hash"][:n] = np.array(move(list(h["hash"][:n])), dtype=np.uint64)
        p, tokens, s, w = run(name, f'store_path = "{bad}"\n')
        check(f"store rows with their hashes {name} (checksums untouched): outputs as cold, one checksum warning",
              p.returncode == 0 and tokens == cold and len(w) == 1 and "checksum" in w[0],
              f"{sum(tokens.get(k) != v for k, v in cold.items())} of {len(cold)} outputs differ; " + "; ".join(w))

    # A "fine-tune" that changes only layer 1's k_proj and v_proj: the same names, shapes and sizes.
    tuned = tmp / "tuned"
    shutil.copytree(model, tuned)
    for st_file in tuned.glob("*.safetensors"):
        raw = bytearray(st_file.read_bytes())
        header_len = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + header_len])
        for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"):
            if name in header:
                a, b = header[name]["data_offsets"]
                bits = np.frombuffer(bytes(raw[8 + header_len + a:8 + header_len + b]), dtype=np.uint16)
                values = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(1.75)
                raw[8 + header_len + a:8 + header_len + b] = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        st_file.write_bytes(bytes(raw))
    p_tc, tuned_cold, _, _ = run("tuned_cold", "", mdl=tuned)
    p, tuned_warm, s, w = run("tuned_on_base_store", f'store_path = "{single}"\n', mdl=tuned)
    check("a fine-tune of 2 tensors on the base model's store: one 'another model' warning, outputs its own",
          p_tc.returncode == 0 and tuned_cold != cold and p.returncode == 0 and tuned_warm == tuned_cold and
          len(w) == 1 and "another model" in w[0] and s.get("kv_tiers", {}).get("hit_tokens", {}).get("disk", 1) == 0,
          f"{sum(tuned_warm.get(k) != v for k, v in tuned_cold.items())} of {len(tuned_cold)} outputs differ from "
          f"its own cold run; " + "; ".join(w))
    hashes_file = single / "weight-hashes.json"
    cached = json.loads(hashes_file.read_text()).get("files", {}) if hashes_file.exists() else {}
    check("the store caches each weight file's hash by path, size and modification time",
          any(str(tuned.resolve()) in k for k in cached) and any(str(model.resolve()) in k for k in cached) and
          all({"size", "mtime_ns", "xxh3"} <= set(v) for v in cached.values()), json.dumps(cached)[:300])

    before = sorted(x.name for x in single.iterdir())
    p, tokens_other, s, w = run("foreign", f'store_path = "{single}"\n', mdl=other)
    p_cold, cold_other, _, _ = run("foreign_cold", "", mdl=other)
    check("another model's store: one warning line, not used, not added to, outputs correct",
          p.returncode == 0 and tokens_other == cold_other and len(tokens_other) == 48 and len(w) == 1 and
          "another model" in w[0] and sorted(x.name for x in single.iterdir()) == before and
          s.get("kv_tiers", {}).get("hit_tokens", {}).get("disk", 1) == 0, "; ".join(w))

    if os.geteuid() == 0 and shutil.which("setpriv"):
        for x in (model, tmp / "shared.jsonl"):
            subprocess.run(["chmod", "-R", "a+rX", str(x)], check=True)
        locked = tmp / "locked"
        locked.mkdir()
        os.chmod(locked, 0o755)  # root's: nobody may not write
        p, tokens, s, w = run("readonly_empty", f'store_path = "{locked}"\n', as_nobody=True)
        check("store without write permission: one warning line, cold run, outputs correct",
              p.returncode == 0 and tokens == cold and len(w) == 1 and "cannot write" in w[0], "; ".join(w))
        readable, _ = copy_store("readable")
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(readable)], check=True)
        p, tokens, s, w = run("readonly_full", f'store_path = "{readable}"\n', as_nobody=True)
        check("a read-only store that holds blocks is still read (warm), with one warning line",
              p.returncode == 0 and tokens == cold and len(w) == 1 and
              s.get("kv_tiers", {}).get("hit_tokens", {}).get("disk", 0) > 0, "; ".join(w))
    else:
        print("skip store without write permission: needs root and setpriv to run the job as nobody")

    # 5. A pool holding a third of the working set (6 documents of ~20 blocks, interleaved).
    p, big, sb, _ = run("reuse_big", inp=reuse)
    block = 2 * 2 * 16 * 2 * 16 * 4  # layers * K,V * tokens * kv_heads * head_dim * float
    small_pool = f"memory_gib = {40 * block / 2**30:.9f}\n"  # 40 blocks of a ~125-block working set
    p1, small, ss, _ = run("reuse_small", small_pool, inp=reuse)
    p2, tiered, st, _ = run("reuse_small_host", small_pool + "host_cache_gib = 0.01\n", inp=reuse)
    computed = {k: s.get("prompt_tokens_computed") for k, s in (("big", sb), ("small", ss), ("small+host", st))}
    check("small pool: completes with identical outputs, with and without host memory",
          p1.returncode == 0 and p2.returncode == 0 and small == big and tiered == big and len(big) == 36)
    ht = st.get("kv_tiers", {})
    check("small pool + host memory: hits move to the host tier, blocks go down and come back",
          ht.get("hit_tokens", {}).get("host", 0) > 0 and ht.get("host", {}).get("offloaded_blocks", 0) > 0 and
          ht.get("host", {}).get("onboarded_blocks", 0) > 0, json.dumps(ht))
    check("host memory saves most of what the small pool recomputes",
          computed["small+host"] < computed["small"] * 0.6, json.dumps(computed))
    reorder = 'output_order = "input"\n[router]\nreorder_window = 64\n'
    p4, grouped, sg, _ = run("reuse_small_reorder", small_pool, inp=reuse, extra=reorder)
    order = [json.loads(l)["custom_id"] for l in (tmp / "out" / "reuse_small_reorder.jsonl").read_text().splitlines()]
    computed["small+reorder"] = sg.get("prompt_tokens_computed")
    check("small pool + reorder window: identical outputs, in input order, each document computed about once",
          p4.returncode == 0 and grouped == big and order == [f"q{i}" for i in range(36)] and
          computed["small+reorder"] < computed["small"] * 0.4, json.dumps(computed))
    store3 = tmp / "store3"
    run("reuse_fill", small_pool + f'store_path = "{store3}"\n', inp=reuse)
    p3, disk, sd, _ = run("reuse_disk", small_pool + f'store_path = "{store3}"\n', inp=reuse)
    dt = sd.get("kv_tiers", {})
    check("small pool + store, second run: identical outputs, hits from disk",
          p3.returncode == 0 and disk == big and dt.get("hit_tokens", {}).get("disk", 0) > 0, json.dumps(dt))
    print(f"     prompt tokens computed: {json.dumps(computed)}; with the store: {sd.get('prompt_tokens_computed')}")

    # 6. bf16 and FP8 KV: a half and about a quarter of the bytes in the store, the same exactly-once reuse. FP8's
    # cold run is disaggregated (1 prefill + 1 decode rank): its KV crosses the transport as rows and scales.
    e4m3 = np.array([(-1.0 if b & 0x80 else 1.0) * ((b & 7) / 8 * 2.0 ** -6 if (b >> 3) & 15 == 0
                     else (1 + (b & 7) / 8) * 2.0 ** (((b >> 3) & 15) - 7)) for b in range(256)], dtype=np.float32)
    e4m3[[0x7F, 0xFF]] = np.nan

    def bf16_values(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32)  # bf16 is float32's upper half

    def fp8_values(raw):  # each row: head_dim E4M3 codes, then its float32 scale (little-endian)
        hd = raw.shape[-1] - 4
        scale = np.ascontiguousarray(raw[..., hd:]).view("<f4")
        return e4m3[raw[..., :hd]] * scale

    for name, setting, dtype, attr, version, row, values, cold_ranks in (
            ("bf16", "bf16", np.uint16, "bfloat16", 6, cfg["head_dim"], bf16_values, 1),
            ("fp8", "fp8", np.uint8, "float8_e4m3fn+scale", 7, cfg["head_dim"] + 4, fp8_values, 3)):
        kv_set = f'dtype = "{setting}"\n'
        store16 = tmp / f"store-{name}"
        kv16 = kv_set + f'store_path = "{store16}"\nstore_min_hits = 1\n'
        p0, cold16, _, _ = run(f"cold-{name}", kv_set, ranks=cold_ranks)
        p1, first16, s1, w1 = run(f"first-{name}", kv16)
        p2, second16, s2, w2 = run(f"second-{name}", kv16)
        check(f"{name}: cold ({cold_ranks} ranks), first and second job with the store complete with equal outputs, "
              "no warnings",
              p0.returncode == 0 and p1.returncode == 0 and p2.returncode == 0 and len(cold16) == 48 and
              first16 == cold16 and second16 == cold16 and not w1 and not w2, "; ".join(w1 + w2))
        t2 = s2.get("kv_tiers", {})
        check(f"{name}: the second job's prompts come from the store",
              t2.get("hit_tokens", {}).get("disk", 0) > 0 and
              s2.get("prompt_tokens_computed", 1 << 30) <= 0.1 * s1.get("prompt_tokens_computed", 0), json.dumps(t2))
        files16 = sorted(store16.glob("*.h5"))
        ok16 = bool(files16)
        for f in files16:
            with h5py.File(f, "r") as h:
                n = int(h.attrs["blocks"])
                raw = h["kv"][:n]
                ok16 &= h["kv"].dtype == dtype and h.attrs["dtype"] == attr and int(h.attrs["layout_version"]) == version
                ok16 &= raw.shape[1:] == (cfg["num_hidden_layers"], 2, cfg["num_key_value_heads"], 16, row)
                v = values(raw)
                ok16 &= bool(np.isfinite(v).all()) and bool(np.abs(v).sum() > 0)
        written16 = s1.get("kv_tiers", {}).get("disk", {}).get("written_blocks", 0)
        check(f"{name}: h5py reads {np.dtype(dtype).name} rows of {row}, dtype = {attr}, layout_version {version}, "
              "finite non-zero values", ok16 and written16 > 0, f"{len(files16)} files, {written16} blocks written")
    store16 = tmp / "store-bf16"
    p, tokens, s, w = run("f32_on_bf16_store", f'store_path = "{store16}"\n')
    check("a float32 job ignores a bf16 store with one warning, outputs as cold",
          p.returncode == 0 and tokens == cold and len(w) == 1 and 'set kv.dtype = "bf16" to use it' in w[0] and
          s.get("kv_tiers", {}).get("hit_tokens", {}).get("disk", 1) == 0, "; ".join(w))

sys.exit(check.exit_code())
