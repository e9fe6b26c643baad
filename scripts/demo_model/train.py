#!/usr/bin/python3
"""Trains the demo model: a small Qwen3-shaped model with its own byte-level
BPE tokenizer, on the King James Version of the Bible (public domain: the
translation is from 1611; Debian's bible-kjv-text package, read through the
`bible` program of bible-kjv). Deterministic from --seed and --steps: two
runs on one machine write the same bytes (torch on the CPU, no download).

usage: /usr/bin/python3 scripts/demo_model/train.py --tandem build/launcher/tandem
           --out demo/model [--steps 600] [--seed 1]

Needs: apt install bible-kjv (the text and the program that prints it) and
libopenblas0-pthread (Debian's torch otherwise multiplies with the reference
BLAS: 3 GFLOP/s here instead of 100: hours instead of 16 minutes).
A verse in four (of the training split) is seen as a chat in the chat
template's ChatML (its first half from the user, the second answered), so
chat answers end on their own. Writes OUT/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, training.json}: the checkpoint's shape is the one
`tandem make-model` writes (so tandem reads it as any Hugging Face
checkpoint), its weights the trained ones, in bfloat16. training.json records
the held-out perplexity against a unigram model of the same split.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

# OpenBLAS's threads do the products; torch's own threads on top of them only contend (1.6 s a step here, 2-4 s).
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

VOCAB = 2048
SHAPE = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 768}
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def kjv_text():
    """Every verse, book by book, one verse a line, without the references."""
    if not shutil.which("bible"):
        sys.exit("train.py: the `bible` program is missing: apt install bible-kjv")
    p = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"], capture_output=True, text=True)
    if p.returncode != 0 or len(p.stdout) < 1_000_000:
        sys.exit(f"train.py: `bible` printed {len(p.stdout)} characters (want the whole KJV): {p.stderr[-300:]}")
    lines = []
    for line in p.stdout.splitlines():
        line = re.sub(r"^\s*(\d?\s*[A-Za-z]+\d+:\d+)?\s*", "", line).strip()  # "Gen1:1 In the beginning..."
        if line:
            lines.append(line)
    return lines


class Qwen3(torch.nn.Module):
    """Qwen3's decoder (q/k RMSNorm per head, RoPE rotate-half, GQA, SwiGLU, tied embedding), HF's parameter names."""

    def __init__(self, vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, theta=1e6, eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            m = torch.nn.Module()
            m.q = torch.nn.Linear(hidden, heads * head_dim, bias=False)
            m.k = torch.nn.Linear(hidden, kv_heads * head_dim, bias=False)
            m.v = torch.nn.Linear(hidden, kv_heads * head_dim, bias=False)
            m.o = torch.nn.Linear(heads * head_dim, hidden, bias=False)
            m.gate = torch.nn.Linear(hidden, intermediate, bias=False)
            m.up = torch.nn.Linear(hidden, intermediate, bias=False)
            m.down = torch.nn.Linear(intermediate, hidden, bias=False)
            for n, d in (("in_norm", hidden), ("post_norm", hidden), ("q_norm", head_dim), ("k_norm", head_dim)):
                setattr(m, n, torch.nn.Parameter(torch.ones(d)))
            self.layers.append(m)
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, ids):
        B, T = ids.shape
        x = self.embed(ids)
        f = torch.outer(torch.arange(T, dtype=torch.float32), self.inv_freq)
        cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()

        def rope(t):
            a, b = t.chunk(2, -1)
            return t * cos + torch.cat([-b, a], -1) * sin

        for m in self.layers:
            h = self.rms(x, m.in_norm)
            q = self.rms(m.q(h).view(B, T, self.heads, self.head_dim), m.q_norm).transpose(1, 2)
            k = self.rms(m.k(h).view(B, T, self.kv_heads, self.head_dim), m.k_norm).transpose(1, 2)
            v = m.v(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = rope(q), rope(k)
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            a = att @ v
            x = x + m.o(a.transpose(1, 2).reshape(B, T, -1))
            h = self.rms(x, m.post_norm)
            x = x + m.down(torch.nn.functional.silu(m.gate(h)) * m.up(h))
        return self.rms(x, self.norm) @ self.embed.weight.t()

    def hf_tensors(self):
        """HF Qwen3's names for every weight."""
        out = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm}
        for i, m in enumerate(self.layers):
            p = f"model.layers.{i}."
            out.update({p + "self_attn.q_proj.weight": m.q.weight, p + "self_attn.k_proj.weight": m.k.weight,
                        p + "self_attn.v_proj.weight": m.v.weight, p + "self_attn.o_proj.weight": m.o.weight,
                        p + "self_attn.q_norm.weight": m.q_norm, p + "self_attn.k_norm.weight": m.k_norm,
                        p + "mlp.gate_proj.weight": m.gate.weight, p + "mlp.up_proj.weight": m.up.weight,
                        p + "mlp.down_proj.weight": m.down.weight, p + "input_layernorm.weight": m.in_norm,
                        p + "post_attention_layernorm.weight": m.post_norm})
        return out


def write_safetensors(path, tensors, like):
    """tensors (name -> float32 torch tensor) in bf16, in the order and shapes of `like`'s header."""
    with open(like, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    out_header, blobs, at = {}, [], 0
    for k in names:
        if k not in tensors:
            sys.exit(f"train.py: make-model wrote {k}, which the trained model lacks")
        t = tensors[k].detach().float().contiguous()
        if list(t.shape) != header[k]["shape"]:
            sys.exit(f"train.py: {k} is {list(t.shape)}, make-model wrote {header[k]['shape']}")
        raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        out_header[k] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for b in blobs:
            f.write(b)


def training_ids(lines, enc, specials):
    """The training verses as one token stream, in order: three in four as
    text, a verse a line; every fourth as a chat in the ChatML of the chat
    template (the verse's first half from the user, the second from the
    assistant), so that a chat's answer ends on its own with <|im_end|>."""
    start, end = specials["<|im_start|>"], specials["<|im_end|>"]
    newline = enc.encode("\n")
    out, text = [], []
    for i, line in enumerate(lines):
        words = line.split(" ")
        if i % 4 != 1 or len(words) < 4:
            text.append(line)
            continue
        if text:
            out.extend(enc.encode("\n".join(text) + "\n"))
            text = []
        k = len(words) // 2  # the first half asked, the second answered: one task, as the demo's chats ask it
        out += [start] + enc.encode("user\n" + " ".join(words[:k])) + [end] + newline
        out += [start] + enc.encode("assistant\n" + " ".join(words[k:])) + [end] + newline
    if text:
        out.extend(enc.encode("\n".join(text) + "\n"))
    return np.array(out, dtype=np.int32)


def batches(ids, seq, batch, rng):
    starts = list(range(0, len(ids) - seq - 1, seq))
    while True:
        rng.shuffle(starts)
        for i in range(0, len(starts) - batch + 1, batch):
            x = np.stack([ids[s:s + seq + 1] for s in starts[i:i + batch]])
            yield torch.from_numpy(x[:, :-1]).long(), torch.from_numpy(x[:, 1:]).long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps (600: about 16 minutes on 2 cores)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    rng = random.Random(a.seed)
    lines = kjv_text()
    # Held out: every 20th verse.
    train_lines = [l for i, l in enumerate(lines) if i % 20]
    held_text = "\n".join(l for i, l in enumerate(lines) if i % 20 == 0) + "\n"
    merges = bpe.train("\n".join(train_lines) + "\n", VOCAB)
    enc = bpe.Encoder(merges)
    specials = {t["content"]: t["id"] for t in bpe.tokenizer_json(merges)["added_tokens"]}
    train_ids = training_ids(train_lines, enc, specials)
    held_ids = np.array(enc.encode(held_text), dtype=np.int32)
    print(f"{len(lines)} verses; {len(merges)} merges; {len(train_ids)} training tokens, {len(held_ids)} held out "
          f"({time.time() - t0:.0f} s)", flush=True)

    model = Qwen3(VOCAB, **{k: SHAPE[k] for k in SHAPE})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seq, batch = 128, 32
    start = time.time()
    for step, (x, y) in zip(range(a.steps), batches(train_ids, seq, batch, rng)):
        # Warm-up over 50 steps, then a cosine to zero at the last step: a function of the step alone.
        lr = 3e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}, lr {lr:.2e}, {time.time() - start:.0f} s", flush=True)

    # Held-out perplexity, against a unigram model of the training split (add-one smoothed).
    model.eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(held_ids) - seq - 1, seq):
            x = torch.from_numpy(held_ids[s:s + seq][None]).long()
            y = torch.from_numpy(held_ids[s + 1:s + seq + 1][None]).long()
            nll += torch.nn.functional.cross_entropy(model(x).view(-1, VOCAB), y.view(-1), reduction="sum").item()
            n += seq
    plain = enc.encode("\n".join(train_lines) + "\n")  # the split's text as text: no chat markup in the baseline
    counts = np.bincount(plain, minlength=VOCAB).astype(np.float64) + 1
    unigram = float(np.exp(-np.mean(np.log(counts[held_ids] / counts.sum()))))
    report = {"text": "King James Version (Debian bible-kjv-text), public domain", "verses": len(lines),
              "vocab": VOCAB, "shape": SHAPE, "steps": a.steps, "tokens_seen": a.steps * seq * batch,
              "training_tokens": int(len(train_ids)), "held_out_tokens": int(len(held_ids)),
              "held_out_perplexity": math.exp(nll / max(n, 1)), "unigram_perplexity": unigram,
              "seed": a.seed, "torch": torch.__version__}
    # The time stays out of training.json: two runs write the same files.
    print(json.dumps(report), f"({time.time() - t0:.0f} s)", flush=True)

    # The checkpoint: make-model's shape and files, our tokenizer and weights.
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "tok")
        os.makedirs(tok)
        with open(os.path.join(tok, "tokenizer.json"), "w") as f:
            json.dump(bpe.tokenizer_json(merges), f, ensure_ascii=False)
        with open(os.path.join(tok, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
                       "pad_token": "<|endoftext|>", "unk_token": None, "chat_template": CHAT_TEMPLATE,
                       "model_max_length": 4096, "tokenizer_class": "Qwen2Tokenizer"}, f, indent=1)
        s = SHAPE
        subprocess.run([a.tandem, "make-model", "--arch", "qwen3", "--tokenizer", tok, "--out", a.out,
                        "--hidden", str(s["hidden"]), "--layers", str(s["layers"]), "--heads", str(s["heads"]),
                        "--kv-heads", str(s["kv_heads"]), "--head-dim", str(s["head_dim"]),
                        "--intermediate", str(s["intermediate"]), "--max-position", "4096", "--dtype", "bf16",
                        "--tie-embeddings", "--seed", str(a.seed)], check=True)
        st = os.path.join(a.out, "model.safetensors")
        write_safetensors(st + ".tmp", model.hf_tensors(), st)
        os.replace(st + ".tmp", st)
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
