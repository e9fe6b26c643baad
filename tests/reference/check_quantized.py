#!/usr/bin/python3
"""Checks what `tandem quantize` wrote against the public formats' definitions.

usage: check_quantized.py ORIG_DIR QUANT_DIR SCHEME [TANDEM_STDOUT]

SCHEME is fp8-block (config "quant_method": "fp8", e4m3 weights, f32
`weight_scale_inv` per 128 x 128 block) or int8-channel (compressed-tensors
"int-quantized", I8 weights, f32 `weight_scale` [out, 1]).  It reads both
checkpoints with the reference's own safetensors reader and checks, knowing
only the format and the documented rule (scale = block amax / 448 or row amax /
127; q = the nearest code to w / scale, ties to even, int8 clamped to +-127):
  - config.json is the input's plus the scheme's quantization_config;
  - the index (when sharded) maps every tensor to a shard that holds it, and
    its total_size is the sum of the tensors' bytes;
  - every linear weight is 8-bit with its scale, each scale and each code
    exactly as the rule gives; every other tensor is the input's, byte for byte;
  - the errors tandem printed per tensor (max and RMS relative) are the ones
    recomputed here.
Exit status 0 when all hold; a line per check.
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import E4M3, Checkpoint, read_safetensors_header  # noqa: E402  the reference's reader

orig_dir, quant_dir, scheme = sys.argv[1], sys.argv[2], sys.argv[3]
report = open(sys.argv[4]).read() if len(sys.argv) > 4 else None
fp8 = scheme == "fp8-block"
failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print("FAIL " + what)
    return ok


def raw(ckpt, name):
    path, dtype, shape, offset, nbytes = ckpt.entries[name]
    with open(path, "rb") as f:
        f.seek(offset)
        return dtype, shape, f.read(nbytes)


def quantized_name(name):
    return name.endswith("_proj.weight") or re.search(r"\.experts\.\d+\.w[123]\.weight$", name) is not None


orig_cfg = json.load(open(os.path.join(orig_dir, "config.json")))
cfg = json.load(open(os.path.join(quant_dir, "config.json")))
q = cfg.pop("quantization_config", None)
check(cfg == orig_cfg, "config.json is the input's plus quantization_config")
if fp8:
    check(q is not None and q.get("quant_method") == "fp8" and q.get("fmt") == "e4m3"
          and q.get("weight_block_size") == [128, 128], "fp8 quantization_config: %s" % q)
else:
    ok = q is not None and q.get("quant_method") == "compressed-tensors" and q.get("format") == "int-quantized"
    if ok:
        (group,) = q["config_groups"].values()
        w = group["weights"]
        ok = w["num_bits"] == 8 and w["type"] == "int" and w["symmetric"] and w["strategy"] == "channel" \
            and "Linear" in group["targets"] and "lm_head" in q["ignore"]
    check(ok, "compressed-tensors quantization_config: %s" % q)

orig, quant = Checkpoint(orig_dir), Checkpoint(quant_dir)
index = os.path.join(quant_dir, "model.safetensors.index.json")
if os.path.exists(os.path.join(orig_dir, "model.safetensors.index.json")):
    idx = json.load(open(index))
    sizes = 0
    for shard in set(idx["weight_map"].values()):
        for name, (_, _, _, _, nbytes) in read_safetensors_header(os.path.join(quant_dir, shard)).items():
            check(idx["weight_map"].get(name) == shard, "index maps %s to its shard %s" % (name, shard))
            sizes += nbytes
    check(idx["metadata"]["total_size"] == sizes, "index total_size %s = %d" % (idx["metadata"].get("total_size"), sizes))
    check(set(idx["weight_map"]) == set(quant.entries), "index names every tensor")

reported = {}
if report is not None:
    for m in re.finditer(r"^(\S+) \[\d+, \d+\]: max rel err (\S+), rms rel err (\S+)$", report, re.M):
        reported[m.group(1)] = (float(m.group(2)), float(m.group(3)))

suffix = "weight_scale_inv" if fp8 else "weight_scale"
expected = set()
n_quantized = 0
finite = np.sort(E4M3[np.isfinite(E4M3)])
for name in sorted(orig.entries):
    expected.add(name)
    dtype0, shape0, _ = orig.entries[name][1], orig.entries[name][2], None
    if not (quantized_name(name) and len(shape0) == 2):
        check(raw(orig, name) == raw(quant, name), "%s kept byte for byte" % name)
        continue
    n_quantized += 1
    sname = name[: -len("weight")] + suffix
    expected.add(sname)
    dtype, shape, _ = quant.entries[name][1], quant.entries[name][2], None
    if not check(dtype == ("F8_E4M3" if fp8 else "I8") and shape == shape0, "%s is %s %s" % (name, dtype, shape)):
        continue
    w = orig.get_raw(name).numpy().astype(np.float32)
    codes = np.frombuffer(raw(quant, name)[2], dtype=np.uint8 if fp8 else np.int8).reshape(shape)
    sdtype, sshape, sbytes = raw(quant, sname)
    rows, cols = shape
    br, bc = (128, 128) if fp8 else (1, cols)
    grid = (-(-rows // br), -(-cols // bc))
    if not check(sdtype == "F32" and tuple(sshape) == grid, "%s is F32 %s (got %s %s)" % (sname, list(grid), sdtype, sshape)):
        continue
    scales = np.frombuffer(sbytes, dtype="<f4").reshape(grid)
    amax = np.zeros(grid, dtype=np.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            amax[i, j] = np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max()
    want = np.where(amax == 0, np.float32(1), amax / np.float32(448 if fp8 else 127)).astype(np.float32)
    check(np.array_equal(scales, want), "%s: scale = amax / %d" % (sname, 448 if fp8 else 127))
    full = np.repeat(np.repeat(scales, br, 0), bc, 1)[:rows, :cols]
    x = (w / full).astype(np.float32)
    if fp8:
        v = E4M3[codes]
        check(np.isfinite(v).all(), "%s holds no NaN code" % name)
        # the nearest finite e4m3 value to each x (either neighbour on an exact tie)
        k = np.clip(np.searchsorted(finite, x), 1, len(finite) - 1)
        best = np.minimum(np.abs(x - finite[k - 1]), np.abs(x - finite[k]))
        check((np.abs(x - v) <= best).all(), "%s: every code is the nearest e4m3 to w / scale" % name)
    else:
        v = codes.astype(np.float32)
        check(np.array_equal(v, np.clip(np.rint(x), -127, 127)), "%s: every code is rint(w / scale)" % name)
    back = (v * full).astype(np.float32)
    err = back.astype(np.float64) - w.astype(np.float64)
    max_rel = np.abs(err).max() / np.abs(w).max() if np.abs(w).max() > 0 else 0.0
    rms_rel = np.sqrt((err ** 2).sum() / (w.astype(np.float64) ** 2).sum()) if np.abs(w).max() > 0 else 0.0
    if report is not None:
        got = reported.get(name)
        check(got is not None and abs(got[0] - max_rel) <= 1e-3 * max_rel + 1e-12
              and abs(got[1] - rms_rel) <= 1e-3 * rms_rel + 1e-12,
              "%s: tandem reported %s, recomputed max %.3e rms %.3e" % (name, got, max_rel, rms_rel))
check(set(quant.entries) == expected, "no tensor beyond the input's and their scales")
check(n_quantized > 0, "%d linear weights quantized" % n_quantized)
for f in os.listdir(orig_dir):
    if f.startswith("tokenizer"):
        check(open(os.path.join(orig_dir, f), "rb").read() == open(os.path.join(quant_dir, f), "rb").read(),
              "%s copied" % f)
print("%s: %d tensors quantized, %s" % (quant_dir, n_quantized, "all checks hold" if failures == 0 else "%d failed" % failures))
sys.exit(1 if failures else 0)
