#!/usr/bin/python3
"""Writes a checkpoint's linear weights in quantized layouts `tandem quantize` does not write.

usage: write_quantized.py ORIG_DIR OUT_DIR FORM

FORM:
  fp8-block-bf16   quant_method "fp8", e4m3 weights, `weight_scale_inv` per 128 x 128
                   block stored as BF16 (as some releases ship it)
  ct-fp8-channel   compressed-tensors "float-quantized", channel strategy, f32
                   `weight_scale` [out, 1]
  ct-fp8-tensor    compressed-tensors "float-quantized", tensor strategy, one BF16
                   `weight_scale` [1]
so that Tandem's loader is tested on forms written by code that is not ours: this
file knows only the formats (e4m3 codes chosen as the nearest value of the
reference's own table). One model.safetensors; tokenizer files copied.
"""
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import E4M3, Checkpoint  # noqa: E402

orig_dir, out_dir, form = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out_dir)
orig = Checkpoint(orig_dir)
codes = np.where(np.isfinite(E4M3))[0]
values = E4M3[codes]
order = np.argsort(values)
codes, values = codes[order], values[order]


def to_e4m3(x):
    k = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lower = np.abs(x - values[k - 1]) <= np.abs(x - values[k])
    return np.where(lower, codes[k - 1], codes[k]).astype(np.uint8)


def bf16_round(x):
    """float32 -> the bf16 value (round to nearest even), returned as (float32 value, uint16 bits)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32), b


def linear(name):
    return name.endswith("_proj.weight") or re.search(r"\.experts\.\d+\.w[123]\.weight$", name) is not None


tensors = []  # (name, dtype, shape, bytes)
for name in sorted(orig.entries):
    path, dtype, shape, offset, nbytes = orig.entries[name]
    if not (linear(name) and len(shape) == 2):
        with open(path, "rb") as f:
            f.seek(offset)
            tensors.append((name, dtype, shape, f.read(nbytes)))
        continue
    w = orig.get_raw(name).numpy().astype(np.float32)
    rows, cols = shape
    if form == "fp8-block-bf16":
        grid = (-(-rows // 128), -(-cols // 128))
        amax = np.zeros(grid, np.float32)
        for i in range(grid[0]):
            for j in range(grid[1]):
                amax[i, j] = np.abs(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]).max()
        scale, bits = bf16_round(np.maximum(amax / np.float32(448), np.float32(1e-12)))
        full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:rows, :cols]
        tensors.append((name, "F8_E4M3", shape, to_e4m3(w / full).tobytes()))
        tensors.append((name[:-6] + "weight_scale_inv", "BF16", list(grid), bits.tobytes()))
    elif form == "ct-fp8-channel":
        scale = np.maximum(np.abs(w).max(axis=1, keepdims=True) / np.float32(448), np.float32(1e-12)).astype(np.float32)
        tensors.append((name, "F8_E4M3", shape, to_e4m3(w / scale).tobytes()))
        tensors.append((name[:-6] + "weight_scale", "F32", [rows, 1], scale.tobytes()))
    elif form == "ct-fp8-tensor":
        scale, bits = bf16_round(np.array([np.abs(w).max() / np.float32(448)], np.float32))
        tensors.append((name, "F8_E4M3", shape, to_e4m3(w / scale[0]).tobytes()))
        tensors.append((name[:-6] + "weight_scale", "BF16", [1], bits.tobytes()))
    else:
        sys.exit("unknown form " + form)

header, offset = {}, 0
for name, dtype, shape, data in tensors:
    header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h)
    for _, _, _, data in tensors:
        f.write(data)

cfg = json.load(open(os.path.join(orig_dir, "config.json")))
if form == "fp8-block-bf16":
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
else:
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                      "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                                                  "strategy": "channel" if form == "ct-fp8-channel" else "tensor",
                                                  "group_size": None, "block_structure": None, "actorder": None}}},
        "ignore": ["lm_head", "re:.*mlp\\.gate$"], "kv_cache_scheme": None}
json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
for f in os.listdir(orig_dir):
    if f.startswith("tokenizer"):
        shutil.copy(os.path.join(orig_dir, f), out_dir)
print("wrote %s (%s)" % (out_dir, form))
