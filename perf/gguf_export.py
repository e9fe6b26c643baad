#!/usr/bin/env python3
"""Writes a dense Qwen3 checkpoint (Hugging Face layout, one or more
safetensors files) as a GGUF file that llama.cpp loads, with the same weights
bit for bit (bf16, f16 and f32 matrices are copied as they are; the norms'
vectors are widened to f32, exactly, as llama.cpp wants them), so Tandem and
llama.cpp can be benchmarked on identical models (perf/llamacpp_bench.sh).

    gguf_export.py MODEL_DIR OUT.gguf [--q8_0]

With --q8_0 the linear layers (*_proj.weight) are written in llama.cpp's Q8_0
(blocks of 32 weights along a row: an f16 scale d = max|w| / 127 and 32 int8
codes round(w / d)), as llama.cpp's quantizer makes them; the embedding (the
tied LM head) and norms stay as above, as Tandem keeps them in its 8-bit
checkpoints.

Written from the GGUF format's definition (version 3: header, metadata
key/values, tensor infos, 32-byte aligned data) and llama.cpp's names for the
Qwen3/Llama tensors and hyperparameters. Standard library only."""
import json
import struct
import sys
from pathlib import Path

GGUF_TYPE = {"U32": 4, "I32": 5, "F32": 6, "BOOL": 7, "STRING": 8, "ARRAY": 9, "U64": 10}
GGML_TYPE = {"F32": 0, "F16": 1, "Q8_0": 8, "BF16": 30}
Q8_BLOCK = 32
ALIGN = 32


def s(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, kind, value):
    out = s(key) + struct.pack("<I", GGUF_TYPE[kind])
    if kind == "STRING":
        return out + s(value)
    if kind == "ARRAY":
        elem, items = value
        out += struct.pack("<IQ", GGUF_TYPE[elem], len(items))
        if elem == "STRING":
            return out + b"".join(s(x) for x in items)
        fmt = {"I32": "<i", "U32": "<I", "F32": "<f"}[elem]
        return out + b"".join(struct.pack(fmt, x) for x in items)
    fmt = {"U32": "<I", "I32": "<i", "F32": "<f", "BOOL": "<?", "U64": "<Q"}[kind]
    return out + struct.pack(fmt, value)


def tensors_of(model):
    """name -> (dtype, shape, file, absolute offset, nbytes), from every safetensors file."""
    out = {}
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], f, 8 + n + b, e - b)
    return out


def gguf_name(hf):
    """llama.cpp's tensor name for a Hugging Face one (Qwen3 / Llama dense layouts)."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        raise SystemExit(f"{hf}: not a tensor of a dense Qwen3/Llama checkpoint")
    layer, rest = parts[2], ".".join(parts[3:])
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    if rest not in names:
        raise SystemExit(f"{hf}: no llama.cpp name for it (a dense Qwen3/Llama checkpoint is expected)")
    return f"blk.{layer}.{names[rest]}"


def tokenizer_kvs(model):
    tok = json.loads((model / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    cfg = json.loads((model / "config.json").read_text())
    # As many entries as the embedding has rows (Hugging Face's converter pads with [PAD] tokens too).
    size = max(max(list(vocab.values()) + list(added)) + 1, cfg.get("vocab_size", 0))
    tokens, types = [f"[PAD{i}]" for i in range(size)], [5] * size  # 5: unused
    for text, i in vocab.items():
        tokens[i], types[i] = text, 1  # normal
    for i, a in added.items():
        tokens[i], types[i] = a["content"], 3 if a.get("special") else 4  # control / user-defined
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    out = [kv("tokenizer.ggml.model", "STRING", "gpt2"),
           kv("tokenizer.ggml.pre", "STRING", "qwen2" if cfg["model_type"].startswith("qwen") else "llama-bpe"),
           kv("tokenizer.ggml.tokens", "ARRAY", ("STRING", tokens)),
           kv("tokenizer.ggml.token_type", "ARRAY", ("I32", types)),
           kv("tokenizer.ggml.merges", "ARRAY", ("STRING", merges))]
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    if eos is not None:
        out.append(kv("tokenizer.ggml.eos_token_id", "U32", eos))
    return out, size


def q8_0(raw, dtype, shape):
    """A row-major matrix's bytes in Q8_0: per 32 weights of a row, f16 d then 32 int8 codes."""
    import numpy as np
    if dtype == "BF16":
        w = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        w = np.frombuffer(raw, dtype="<f4" if dtype == "F32" else "<f2").astype(np.float32)
    if shape[-1] % Q8_BLOCK:
        raise SystemExit(f"a row of {shape[-1]} weights is not whole Q8_0 blocks of {Q8_BLOCK}")
    blocks = w.reshape(-1, Q8_BLOCK)
    d = np.abs(blocks).max(axis=1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0)
    q = np.clip(np.rint(blocks * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty(len(blocks), dtype=[("d", "<f2"), ("q", "i1", (Q8_BLOCK,))])
    out["d"], out["q"] = d.astype(np.float16), q
    return out.tobytes()


def main():
    q8 = "--q8_0" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--q8_0"]
    if len(args) != 2:
        raise SystemExit(__doc__)
    model, out_path = Path(args[0]), Path(args[1])
    cfg = json.loads((model / "config.json").read_text())
    arch = {"qwen3": "qwen3", "llama": "llama"}.get(cfg["model_type"])
    if arch is None:
        raise SystemExit(f"{model}/config.json: model_type {cfg['model_type']!r}; this script writes qwen3 and llama")
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    meta = [kv("general.architecture", "STRING", arch), kv("general.name", "STRING", model.name),
            kv("general.alignment", "U32", ALIGN),
            kv(f"{arch}.context_length", "U32", cfg.get("max_position_embeddings", 4096)),
            kv(f"{arch}.embedding_length", "U32", cfg["hidden_size"]),
            kv(f"{arch}.block_count", "U32", cfg["num_hidden_layers"]),
            kv(f"{arch}.feed_forward_length", "U32", cfg["intermediate_size"]),
            kv(f"{arch}.attention.head_count", "U32", heads),
            kv(f"{arch}.attention.head_count_kv", "U32", kv_heads),
            kv(f"{arch}.attention.key_length", "U32", head_dim),
            kv(f"{arch}.attention.value_length", "U32", head_dim),
            kv(f"{arch}.rope.freq_base", "F32", float(cfg.get("rope_theta", 10000.0))),
            kv(f"{arch}.attention.layer_norm_rms_epsilon", "F32", float(cfg["rms_norm_eps"]))]
    if cfg.get("rope_scaling"):
        raise SystemExit("rope_scaling is not written by this script; use a checkpoint without it")
    tok, vocab_size = tokenizer_kvs(model)
    meta += tok + [kv(f"{arch}.vocab_size", "U32", vocab_size)]
    tensors = tensors_of(model)
    if arch == "llama":
        raise SystemExit("llama checkpoints need q/k rows permuted for llama.cpp's rope; only qwen3 is written now")
    infos, offset, order = [], 0, sorted(tensors)
    for name in order:
        dtype, shape, f, at, nbytes = tensors[name]
        if dtype not in GGML_TYPE:
            raise SystemExit(f"{name}: dtype {dtype}; this script copies F32, F16 and BF16 tensors")
        if len(shape) == 1 and dtype == "BF16":  # vectors (norms) in f32: bf16 is f32's upper half
            dtype, nbytes = "F32", nbytes * 2
            tensors[name] = (dtype, shape, f, at, nbytes, "widen")
        elif q8 and name.endswith("_proj.weight"):
            tensors[name] = ("Q8_0", shape, f, at, nbytes // (4 if dtype == "F32" else 2) // Q8_BLOCK * 34, "q8", dtype)
            dtype, nbytes = "Q8_0", tensors[name][4]
        dims = list(reversed(shape))  # GGUF lists the fastest dimension first
        infos.append(s(gguf_name(name)) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", GGML_TYPE[dtype], offset))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    with open(out_path, "wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", 3, len(order), len(meta)))
        for m in meta:
            out.write(m)
        for i in infos:
            out.write(i)
        out.write(b"\0" * (-out.tell() % ALIGN))
        for name in order:
            _, shape, f, at, nbytes, *widen = tensors[name]
            with open(f, "rb") as fh:
                fh.seek(at)
                if widen and widen[0] == "q8":
                    src = widen[1]
                    out.write(q8_0(fh.read(nbytes // 34 * Q8_BLOCK * (4 if src == "F32" else 2)), src, shape))
                elif widen:
                    raw = fh.read(nbytes // 2)
                    out.write(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
                else:
                    left = nbytes
                    while left:
                        chunk = fh.read(min(left, 64 << 20))
                        out.write(chunk)
                        left -= len(chunk)
            out.write(b"\0" * (-nbytes % ALIGN))
    print(f"wrote {out_path}: {len(order)} tensors, {vocab_size} tokens, {out_path.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
