#!/usr/bin/python3
"""Independent float32 PyTorch reference for Hugging Face decoder-only checkpoints.

Tandem's C++ engine is tested against this file; it shares no code with it and
does not use `transformers` or `safetensors`.  Run it with Debian's Python
(`/usr/bin/python3`, torch >= 1.13, numpy).

usage: torch_forward.py MODEL_DIR --ids 1,2,3 [--greedy N] [--kv fp8] [--act int8]
       torch_forward.py MODEL_DIR --ids "1,2;3,4" --embed last|mean|cls [--normalize]
                        [--out-logits FILE.npy] [--out-json FILE.json]

Supported `architectures[0]`: LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, and the mixtures of experts
Qwen3MoeForCausalLM and MixtralForCausalLM.  Everything is computed in float32
on the CPU, whatever the checkpoint's dtype (F32 / F16 / BF16 weights are upcast).

Conventions (matching Hugging Face's modeling code):
  * RoPE is the "rotate_half" layout: dimension i of a head is paired with
    dimension i + head_dim/2, and cos/sin = cat(freqs, freqs).
  * inv_freq[i] = 1 / theta^(2i / head_dim), computed in float32 exactly as
    HF's _compute_default_rope_parameters; "linear" scaling divides inv_freq by
    `factor`; "llama3" follows _compute_llama3_parameters.
  * GQA: query head h uses kv head h // (n_heads / n_kv_heads) (HF repeat_kv).
  * Qwen3: q_norm / k_norm are RMSNorms over head_dim applied to each head
    after the projection and before RoPE.
  * Sliding-window attention is applied where HF applies it (Mistral and
    Mixtral with a non-null `sliding_window`; Qwen2/3 with `use_sliding_window`
    on layers >= `max_window_layers`): query i sees key j iff j <= i and i - j < window.
  * Mixture of experts (as the configs define it): Qwen3-MoE layer L is sparse
    when L is not in `mlp_only_layers` and (L + 1) % `decoder_sparse_step` == 0,
    else a dense MLP of `intermediate_size`; its router is `mlp.gate`, its
    experts `mlp.experts.E.{gate,up,down}_proj` of `moe_intermediate_size`.
    Mixtral: every layer, `block_sparse_moe.gate` and `experts.E.{w1,w3,w2}`
    (gate, up, down) of `intermediate_size`.  Per token: softmax of the router
    logits over all experts (float32), the `num_experts_per_tok` most probable
    (ties to the lower expert id), their probabilities renormalised to sum to
    one (Mixtral always; Qwen3-MoE when `norm_topk_prob`), and the token's
    output the sum of weight x expert SwiGLU(token) in that order.
  * Quantized checkpoints (config.json's `quantization_config`), weights
    dequantized to float32 as W = float(q) * scale, one float32 product:
      - "fp8" (DeepSeek-V3 / Qwen -FP8 layout): `weight` F8_E4M3 [out, in],
        `weight_scale_inv` one scale per `weight_block_size` block
        ([ceil(out/br), ceil(in/bc)]); it multiplies, despite its name.
      - "compressed-tensors", format "float-quantized" (F8_E4M3) or
        "int-quantized" (I8): `weight_scale` per channel ([out, 1]), per
        tensor ([1]) or per `block_structure` block; symmetric only.
    F8_E4M3 is decoded from the OCP definition (1 sign bit, 4 exponent bits
    of bias 7, 3 mantissa bits, subnormals at exponent 0, 0x7F/0xFF NaN, no
    infinities) by a 256-entry table built here, not by any library.
  * --embed last|mean|cls [--normalize] (embeddings): the final-normed
    hidden states of each ';'-separated input of --ids, from one pass over
    it, pooled by its last token, the mean over its tokens or its first,
    divided by their L2 norm when asked. A checkpoint saved from the inner
    model (tensor names without "model.") and one without lm_head load.
  * --act int8 (Tandem's model.cpu_matmul = "int8", the W8A8 recipe of INT8
    checkpoints with a scale per channel or tensor): a product with an I8
    weight quantizes each row of its input x on its own: amax = max |x|,
    codes q = round-half-even(x * (127 / amax)) (float32 operations), scale
    amax / 127 (a row of zeros: codes 0, scale 0); y = float32(the exact
    integer sum of q * code) * (x's scale * the weight row's scale), each
    float32 operation rounding once. o_proj and down_proj (an expert's too)
    are cut into 8 column chunks (chunk c: columns [c K / 8, (c + 1) K / 8)),
    each quantized and multiplied on its own, the 8 results added as
    ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) in float32.
  * --kv fp8 (Tandem's kv.dtype = "fp8"): every key and value row (one token,
    one kv head, after RoPE) is stored as E4M3 codes with one float32 scale,
    scale = max|row| / 448, code = the E4M3 value nearest row / scale (ties to
    the even code, saturating at 448), and read back as E4M3[code] * scale
    (one float32 product); a row of zeros has scale 0, a row with a NaN or an
    infinity a NaN scale.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

PROG = "torch_forward.py"

SUPPORTED_ARCHS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
)


class RefError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------
# Minimal safetensors reader
#   file = u64 little-endian header length N | N bytes of JSON header | data
#   header = {name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
#             "__metadata__": {...}}   (offsets relative to the data start)
# ----------------------------------------------------------------------------

# safetensors dtype -> (numpy dtype used to read the raw bytes, bytes per item)
_ST_DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "F8_E4M3": (np.dtype("u1"), 1),
    "I8": (np.dtype("i1"), 1),
}


def _e4m3_table():
    """The 256 values of OCP FP8 E4M3 ("e4m3fn"), from the format's definition."""
    t = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()


def fp8_kv_rows(x):
    """x: float32 tensor [..., hd] -> the values its rows read back as after FP8 storage (see --kv)."""
    a = x.numpy().astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        amax = np.abs(a).max(axis=-1, keepdims=True)
        finite = np.isfinite(a).all(axis=-1, keepdims=True)
        scale = np.where(finite, amax / np.float32(448), np.float32(np.nan)).astype(np.float32)
        y = np.where(scale > 0, a / np.where(scale > 0, scale, np.float32(1)), np.float32(0)).astype(np.float32)
    mag = np.minimum(np.abs(y).astype(np.float64), 448.0)
    grid = E4M3[:127].astype(np.float64)              # codes 0x00..0x7E, increasing
    hi = np.clip(np.searchsorted(grid, mag), 0, 126)  # first code whose value >= mag
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = mag - grid[lo], grid[hi] - mag       # exact in float64
    code = np.where(d_hi < d_lo, hi, np.where(d_lo < d_hi, lo, np.where(hi % 2 == 0, hi, lo)))
    code = code | np.where(np.signbit(y), 0x80, 0)
    values = (E4M3[code].astype(np.float32) * scale).astype(np.float32)
    return torch.from_numpy(values)


def read_safetensors_header(path):
    """Returns {name: (path, dtype, shape, absolute_byte_offset, nbytes)}."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise RefError("%s: too short for a safetensors file" % path)
        header_len = int.from_bytes(raw_len, "little")
        if header_len <= 0 or 8 + header_len > file_size:
            raise RefError("%s: bad safetensors header length %d" % (path, header_len))
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise RefError("%s: bad safetensors JSON header (%s)" % (path, e))
    data_start = 8 + header_len
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        if dtype in _ST_DTYPES:
            numel = int(np.prod(shape)) if shape else 1
            if end - begin != numel * _ST_DTYPES[dtype][1]:
                raise RefError("%s: tensor %s: data_offsets %d..%d do not match %s%s"
                               % (path, name, begin, end, dtype, list(shape)))
        if data_start + end > file_size:
            raise RefError("%s: tensor %s runs past the end of the file" % (path, name))
        entries[name] = (path, dtype, shape, data_start + begin, end - begin)
    return entries


def load_tensor_f32(entry, name):
    """Reads one tensor from disk and returns it as a float32 torch tensor."""
    path, dtype, shape, offset, nbytes = entry
    if dtype not in _ST_DTYPES:
        raise RefError("tensor %s has unsupported dtype %s (want F32, F16, BF16, F8_E4M3 or I8)" % (name, dtype))
    np_dtype, _ = _ST_DTYPES[dtype]
    numel = int(np.prod(shape)) if shape else 1
    if numel == 0:
        return torch.zeros(shape, dtype=torch.float32)
    raw = np.memmap(path, dtype=np_dtype, mode="r", offset=offset, shape=(numel,))
    raw = np.array(raw)  # copy out of the mapping (writable, owned by numpy)
    if dtype == "BF16":
        t = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).float()
    elif dtype == "F8_E4M3":
        t = torch.from_numpy(E4M3[raw])
    else:
        t = torch.from_numpy(raw.astype(np.float32))
    return t.reshape(shape)


class Quantization:
    """How a quantized checkpoint's 8-bit weights are scaled (see the module docstring)."""

    def __init__(self, q):
        method = q.get("quant_method")
        if method == "fp8":
            if q.get("fmt", "e4m3") != "e4m3" or not q.get("weight_block_size"):
                raise RefError("fp8 quantization without e4m3 block scales is not supported here")
            self.dtypes = ("F8_E4M3",)
            self.suffix = "weight_scale_inv"
            self.block = tuple(int(x) for x in q["weight_block_size"])
        elif method == "compressed-tensors":
            (group,) = q["config_groups"].values()
            w = group["weights"]
            if w["num_bits"] != 8 or not w.get("symmetric", True):
                raise RefError("compressed-tensors: only symmetric 8-bit weights are supported here")
            self.dtypes = ("F8_E4M3",) if w["type"] == "float" else ("I8",)
            self.suffix = "weight_scale"
            strategy = w["strategy"]
            if strategy == "channel":
                self.block = (1, None)
            elif strategy == "tensor":
                self.block = (None, None)
            elif strategy == "block":
                self.block = tuple(int(x) for x in w["block_structure"])
            else:
                raise RefError("compressed-tensors strategy %r is not supported here" % strategy)
        else:
            raise RefError("quant_method %r is not supported here" % method)

    def dequantize(self, ckpt, name, q):
        """q: [out, in] float32 holding the 8-bit values; returns q * scale, each element's block scale."""
        out_dim, in_dim = q.shape
        br = self.block[0] or out_dim
        bc = self.block[1] or in_dim
        scale = ckpt.get_raw(name[: -len("weight")] + self.suffix)
        grid = (-(-out_dim // br), -(-in_dim // bc))
        if scale.numel() != grid[0] * grid[1]:
            raise RefError("scale of %s has %d elements, expected %s" % (name, scale.numel(), list(grid)))
        full = scale.reshape(grid).repeat_interleave(br, 0).repeat_interleave(bc, 1)[:out_dim, :in_dim]
        return q * full


class Int8Weight:
    """An I8 weight kept as its codes and its rows' scales, for --act int8."""

    def __init__(self, codes, row_scale):
        self.codes, self.row_scale, self.shape = codes, row_scale, codes.shape

    def numel(self):
        return self.codes.numel()


def quantize_int8_rows(x):
    """x: [T, K] float32 -> (codes [T, K] float64 holding integers, scales [T] float32), per row."""
    amax = x.abs().amax(dim=1)
    finite = torch.isfinite(x).all(dim=1)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.tensor(127.0, dtype=torch.float32) / safe
    q = torch.round(x * inv[:, None]).clamp(-127, 127)
    keep = (finite & (amax > 0))[:, None]
    q = torch.where(keep, q, torch.zeros_like(q)).double()
    scale = amax / torch.tensor(127.0, dtype=torch.float32)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    return q, scale


def int8_product(x, w, chunks):
    """--act int8's product of x [T, K] with an Int8Weight, in `chunks` column chunks added in the tree."""
    K = x.shape[1]
    parts = []
    for c in range(chunks):
        a, b = K * c // chunks, K * (c + 1) // chunks
        q, xs = quantize_int8_rows(x[:, a:b])
        acc = (q @ w.codes[:, a:b].double().t()).float()         # exact integers, rounded once to float32
        parts.append(acc * (xs[:, None] * w.row_scale[None, :]))
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


class Checkpoint:
    """All tensors of MODEL_DIR: model.safetensors or the shards of an index."""

    act_int8 = False  # --act int8: I8 weights kept as codes and row scales (Int8Weight)

    def __init__(self, model_dir, quant=None):
        self.quant = quant
        single = os.path.join(model_dir, "model.safetensors")
        index = os.path.join(model_dir, "model.safetensors.index.json")
        self.entries = {}
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            headers = {}
            for name, shard in weight_map.items():
                shard_path = os.path.join(model_dir, shard)
                if shard_path not in headers:
                    if not os.path.exists(shard_path):
                        raise RefError("shard %s listed in model.safetensors.index.json is missing" % shard)
                    headers[shard_path] = read_safetensors_header(shard_path)
                if name not in headers[shard_path]:
                    raise RefError("index maps %s to %s but that shard lacks it" % (name, shard))
                self.entries[name] = headers[shard_path][name]
        elif os.path.exists(single):
            self.entries = read_safetensors_header(single)
        else:
            raise RefError("%s has neither model.safetensors nor model.safetensors.index.json" % model_dir)

    def has(self, name):
        return name in self.entries

    def strip_model_prefix(self):
        """A checkpoint of the inner model alone (sentence-transformers: embed_tokens.weight, layers.N...):
        its tensors answer to the "model."-prefixed names too."""
        if "model.embed_tokens.weight" not in self.entries and "embed_tokens.weight" in self.entries:
            self.entries = {("model." + k if not k.startswith("lm_head") else k): v for k, v in self.entries.items()}

    def get_raw(self, name):
        if name not in self.entries:
            raise RefError("missing tensor %s" % name)
        return load_tensor_f32(self.entries[name], name)

    def get(self, name, shape=None):
        t = self.get_raw(name)
        if self.entries[name][1] in ("F8_E4M3", "I8"):
            if self.quant is None or self.entries[name][1] not in self.quant.dtypes:
                raise RefError("tensor %s is %s but the config says no such quantization" % (name, self.entries[name][1]))
            if self.act_int8 and self.entries[name][1] == "I8":
                if self.quant.block[1] is not None:
                    raise RefError("--act int8 needs a scale per channel or tensor; %s has blocks" % name)
                full = self.quant.dequantize(self, name, torch.ones_like(t))   # each element's scale
                t = Int8Weight(t, full[:, 0].contiguous())
            else:
                t = self.quant.dequantize(self, name, t)
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise RefError("tensor %s has shape %s, expected %s" % (name, list(t.shape), list(shape)))
        return t


# ----------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------

class Config:
    def __init__(self, cfg):
        archs = cfg.get("architectures") or []
        self.arch = archs[0] if archs else None
        if self.arch not in SUPPORTED_ARCHS:
            raise RefError("unsupported architecture %r (supported: %s)"
                           % (self.arch, ", ".join(SUPPORTED_ARCHS)))
        try:
            self.dim = int(cfg["hidden_size"])
            self.hidden_dim = int(cfg["intermediate_size"])
            self.n_layers = int(cfg["num_hidden_layers"])
            self.n_heads = int(cfg["num_attention_heads"])
            self.vocab_size = int(cfg["vocab_size"])
        except KeyError as e:
            raise RefError("config.json lacks %s" % e)
        self.n_kv_heads = int(cfg.get("num_key_value_heads") or self.n_heads)
        self.head_dim = int(cfg.get("head_dim") or self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads != 0:
            raise RefError("num_attention_heads %d is not a multiple of num_key_value_heads %d"
                           % (self.n_heads, self.n_kv_heads))
        if self.head_dim % 2 != 0:
            raise RefError("head_dim %d is odd; RoPE needs an even head_dim" % self.head_dim)
        self.norm_eps = float(cfg.get("rms_norm_eps", 1e-6))
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise RefError("unsupported hidden_act %r (only silu)" % act)
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        self.torch_dtype = cfg.get("torch_dtype", cfg.get("dtype"))

        # RoPE. Older configs: rope_theta + rope_scaling; newer (transformers v5)
        # may put both inside rope_parameters.
        rope = cfg.get("rope_scaling")
        rope_params = cfg.get("rope_parameters")
        if rope is None and isinstance(rope_params, dict):
            rope = rope_params
        theta = cfg.get("rope_theta")
        if theta is None and isinstance(rope_params, dict):
            theta = rope_params.get("rope_theta")
        self.rope_theta = float(theta if theta is not None else 10000.0)
        self.rope_scaling = None
        if rope:
            rtype = rope.get("rope_type", rope.get("type", "default"))
            if rtype not in ("default", "linear", "llama3"):
                raise RefError("unsupported rope_scaling type %r (supported: linear, llama3)" % rtype)
            if rtype != "default":
                self.rope_scaling = dict(rope, rope_type=rtype)

        # Biases.  Qwen2: q/k/v always carry a bias, o_proj never.  Llama /
        # Mistral / Qwen3: `attention_bias` adds a bias to q, k, v and o.
        attention_bias = bool(cfg.get("attention_bias", False))
        if self.arch == "Qwen2ForCausalLM":
            self.qkv_bias, self.o_bias = True, False
        else:
            self.qkv_bias, self.o_bias = attention_bias, attention_bias
        self.mlp_bias = bool(cfg.get("mlp_bias", False)) and self.arch == "LlamaForCausalLM"
        self.qk_norm = self.arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")

        # Mixture of experts: which layers, how many experts, how wide, how routed.
        self.sparse = [False] * self.n_layers
        self.n_experts = self.top_k = self.expert_dim = 0
        self.norm_topk = True
        if self.arch == "Qwen3MoeForCausalLM":
            self.n_experts = int(cfg["num_experts"])
            self.expert_dim = int(cfg["moe_intermediate_size"])
            self.norm_topk = bool(cfg.get("norm_topk_prob", False))
            step = int(cfg.get("decoder_sparse_step", 1))
            dense = set(int(x) for x in cfg.get("mlp_only_layers") or [])
            self.sparse = [i not in dense and (i + 1) % step == 0 for i in range(self.n_layers)]
        elif self.arch == "MixtralForCausalLM":
            self.n_experts = int(cfg["num_local_experts"])
            self.expert_dim = self.hidden_dim
            self.sparse = [True] * self.n_layers
        if self.n_experts:
            self.top_k = int(cfg["num_experts_per_tok"])

        # Sliding window per layer (None = full causal attention).
        self.window = [None] * self.n_layers
        sw = cfg.get("sliding_window")
        if sw is not None:
            if self.arch in ("MistralForCausalLM", "MixtralForCausalLM"):
                self.window = [int(sw)] * self.n_layers
            elif self.arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and cfg.get("use_sliding_window", False):
                first = int(cfg.get("max_window_layers", self.n_layers))
                self.window = [int(sw) if i >= first else None for i in range(self.n_layers)]


# ----------------------------------------------------------------------------
# RoPE frequencies
# ----------------------------------------------------------------------------

def rope_inv_freq(cfg):
    """inv_freq: [head_dim/2] float32, as HF computes it."""
    d = cfg.head_dim
    # 1 / theta^(2i/d), i = 0..d/2-1, in float32 (same op order as HF)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = cfg.rope_scaling
    if rs is None:
        return inv_freq
    if rs["rope_type"] == "linear":
        # HF: inv_freq /= factor   (same as dividing the positions by factor)
        return inv_freq / float(rs["factor"])
    # llama3 (Llama 3.1+): keep high frequencies, divide low frequencies by
    # `factor`, and blend linearly (in 1/wavelength) in between.
    factor = float(rs["factor"])
    low_freq_factor = float(rs["low_freq_factor"])
    high_freq_factor = float(rs["high_freq_factor"])
    old_context_len = float(rs["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(inv_freq, positions):
    """positions: [T] int -> cos, sin: [T, head_dim] (cat(freqs, freqs) layout)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)                # [T, head_dim]
    return emb.cos(), emb.sin()


def rotate_half(x):
    """[..., d] -> cat(-x[d/2:], x[:d/2])"""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x: [n_heads, T, head_dim]; cos, sin: [T, head_dim]."""
    return x * cos[None] + rotate_half(x) * sin[None]


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

def rmsnorm(x, weight, eps):
    """x: [..., n], weight: [n].  x * rsqrt(mean(x^2) + eps) * weight, fp32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def linear(x, w, b=None, chunks=1):
    """x: [T, in], w: [out, in], b: [out] or None -> [T, out].  An Int8Weight (--act int8) is multiplied
    with quantized activations, its input cut into `chunks` column chunks (8 for o_proj and down_proj)."""
    y = int8_product(x, w, chunks) if isinstance(w, Int8Weight) else x @ w.t()
    if b is not None:
        y = y + b
    return y


class Layer:
    pass


class Model:
    kv_fp8 = False  # --kv fp8: keys and values stored as FP8 rows
    def __init__(self, cfg, ckpt):
        self.cfg = cfg
        D, H, KV, hd, F, V = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_dim, cfg.vocab_size
        self.n_params = 0

        def get(name, shape):
            t = ckpt.get(name, shape)
            self.n_params += t.numel()
            return t

        self.embed = get("model.embed_tokens.weight", (V, D))          # [V, D]
        self.layers = []
        for i in range(cfg.n_layers):
            p = "model.layers.%d." % i
            L = Layer()
            L.attn_norm = get(p + "input_layernorm.weight", (D,))
            L.wq = get(p + "self_attn.q_proj.weight", (H * hd, D))      # [H*hd, D]
            L.wk = get(p + "self_attn.k_proj.weight", (KV * hd, D))     # [KV*hd, D]
            L.wv = get(p + "self_attn.v_proj.weight", (KV * hd, D))     # [KV*hd, D]
            L.wo = get(p + "self_attn.o_proj.weight", (D, H * hd))      # [D, H*hd]
            L.bq = L.bk = L.bv = L.bo = None
            if cfg.qkv_bias:
                L.bq = get(p + "self_attn.q_proj.bias", (H * hd,))
                L.bk = get(p + "self_attn.k_proj.bias", (KV * hd,))
                L.bv = get(p + "self_attn.v_proj.bias", (KV * hd,))
            if cfg.o_bias:
                L.bo = get(p + "self_attn.o_proj.bias", (D,))
            L.q_norm = L.k_norm = None
            if cfg.qk_norm:
                L.q_norm = get(p + "self_attn.q_norm.weight", (hd,))
                L.k_norm = get(p + "self_attn.k_norm.weight", (hd,))
            L.ffn_norm = get(p + "post_attention_layernorm.weight", (D,))
            L.router = None
            if cfg.sparse[i]:
                mixtral = cfg.arch == "MixtralForCausalLM"
                m = p + ("block_sparse_moe." if mixtral else "mlp.")
                E, U = cfg.n_experts, cfg.expert_dim
                L.router = get(m + "gate.weight", (E, D))                  # [E, D]
                L.experts = []
                for e in range(E):
                    x = m + "experts.%d." % e
                    L.experts.append((get(x + ("w1" if mixtral else "gate_proj") + ".weight", (U, D)),
                                      get(x + ("w3" if mixtral else "up_proj") + ".weight", (U, D)),
                                      get(x + ("w2" if mixtral else "down_proj") + ".weight", (D, U))))
                self.layers.append(L)
                continue
            L.w_gate = get(p + "mlp.gate_proj.weight", (F, D))          # [F, D]
            L.w_up = get(p + "mlp.up_proj.weight", (F, D))              # [F, D]
            L.w_down = get(p + "mlp.down_proj.weight", (D, F))          # [D, F]
            L.b_gate = L.b_up = L.b_down = None
            if cfg.mlp_bias:
                L.b_gate = get(p + "mlp.gate_proj.bias", (F,))
                L.b_up = get(p + "mlp.up_proj.bias", (F,))
                L.b_down = get(p + "mlp.down_proj.bias", (D,))
            self.layers.append(L)
        self.final_norm = get("model.norm.weight", (D,))
        if cfg.tie_word_embeddings:
            self.lm_head = self.embed                                   # counted once
        elif ckpt.has("lm_head.weight"):
            self.lm_head = get("lm_head.weight", (V, D))                # [V, D]
        else:
            self.lm_head = None                                         # an embedding model: hidden states only
        self.inv_freq = rope_inv_freq(cfg)                              # [hd/2]

    def new_cache(self):
        """Per layer: keys/values [KV, S, hd] after RoPE, S = tokens seen so far."""
        KV, hd = self.cfg.n_kv_heads, self.cfg.head_dim
        return [[torch.zeros(KV, 0, hd), torch.zeros(KV, 0, hd)] for _ in self.layers]

    def experts(self, L, h):
        """h: [T, D] -> [T, D]: each token's top-k experts, weighted, summed in rank order."""
        cfg = self.cfg
        probs = torch.softmax(linear(h, L.router), dim=-1)            # [T, E] float32
        # Most probable first; a stable sort keeps the lower expert id first among equals.
        order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :cfg.top_k]  # [T, k]
        weights = probs.gather(1, order)                               # [T, k]
        if cfg.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for slot in range(cfg.top_k):
                w_gate, w_up, w_down = L.experts[int(order[t, slot])]
                y = linear(torch.nn.functional.silu(linear(h[t:t + 1], w_gate)) * linear(h[t:t + 1], w_up), w_down,
                           chunks=8)
                out[t] += weights[t, slot] * y[0]
        return out

    def forward(self, tokens, cache, hidden=False):
        """Runs T new tokens at positions S..S+T-1 (S = cache length); appends
        their keys/values to `cache`.  Returns logits [T, V] float32."""
        cfg = self.cfg
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        group = H // KV                       # query heads per kv head
        T = len(tokens)
        S = cache[0][0].shape[1]              # positions already in the cache
        pos = torch.arange(S, S + T)          # [T] absolute positions
        cos, sin = rope_cos_sin(self.inv_freq, pos)   # [T, hd]
        key_pos = torch.arange(0, S + T)      # [S+T]
        # kv head serving each query head (HF repeat_kv: consecutive groups)
        kv_of_head = torch.arange(H) // group  # [H]

        x = self.embed[torch.tensor(tokens, dtype=torch.long)]  # [T, D]

        for li, L in enumerate(self.layers):
            # ---- attention ----
            h = rmsnorm(x, L.attn_norm, cfg.norm_eps)            # [T, D]
            q = linear(h, L.wq, L.bq)                             # [T, H*hd]
            k = linear(h, L.wk, L.bk)                             # [T, KV*hd]
            v = linear(h, L.wv, L.bv)                             # [T, KV*hd]
            q = q.view(T, H, hd).transpose(0, 1)                  # [H, T, hd]
            k = k.view(T, KV, hd).transpose(0, 1)                 # [KV, T, hd]
            v = v.view(T, KV, hd).transpose(0, 1)                 # [KV, T, hd]
            if cfg.qk_norm:                                       # Qwen3: per head, before RoPE
                q = rmsnorm(q, L.q_norm, cfg.norm_eps)
                k = rmsnorm(k, L.k_norm, cfg.norm_eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)

            if self.kv_fp8:                                       # stored as FP8 rows, read back as their values
                k, v = fp8_kv_rows(k), fp8_kv_rows(v)
            cache[li][0] = torch.cat((cache[li][0], k), dim=1)    # [KV, S+T, hd]
            cache[li][1] = torch.cat((cache[li][1], v), dim=1)
            keys = cache[li][0][kv_of_head]                       # [H, S+T, hd]
            vals = cache[li][1][kv_of_head]                       # [H, S+T, hd]

            scores = q @ keys.transpose(1, 2) / math.sqrt(hd)     # [H, T, S+T]
            visible = key_pos[None, :] <= pos[:, None]            # [T, S+T] causal
            if cfg.window[li] is not None:
                visible = visible & (pos[:, None] - key_pos[None, :] < cfg.window[li])
            scores = scores.masked_fill(~visible[None], float("-inf"))
            att = torch.softmax(scores, dim=-1)                   # [H, T, S+T]
            o = att @ vals                                        # [H, T, hd]
            o = o.transpose(0, 1).reshape(T, H * hd)              # [T, H*hd]
            x = x + linear(o, L.wo, L.bo, chunks=8)               # [T, D]

            # ---- SwiGLU MLP, or the mixture of experts ----
            h = rmsnorm(x, L.ffn_norm, cfg.norm_eps)              # [T, D]
            if L.router is not None:
                x = x + self.experts(L, h)
                continue
            gate = linear(h, L.w_gate, L.b_gate)                  # [T, F]
            up = linear(h, L.w_up, L.b_up)                        # [T, F]
            x = x + linear(torch.nn.functional.silu(gate) * up, L.w_down, L.b_down, chunks=8)  # [T, D]

        x = rmsnorm(x, self.final_norm, cfg.norm_eps)             # [T, D]
        if hidden:
            return x                                              # [T, D]: the final-normed hidden states
        if self.lm_head is None:
            raise RefError("the checkpoint has no lm_head: only --embed works")
        return linear(x, self.lm_head)                            # [T, V]


def argmax_lowest(row):
    """Index of the largest logit; ties go to the lowest id."""
    row = row.numpy()
    if not np.all(np.isfinite(row)):
        raise RefError("non-finite logits")
    return int(np.flatnonzero(row == row.max())[0])


def generate(model, prompt, n_new):
    """Returns (prompt logits [T, V], greedy ids [n_new]), using a KV cache."""
    cache = model.new_cache()
    prompt_logits = model.forward(prompt, cache)
    out = []
    last = prompt_logits[-1]
    for step in range(n_new):
        tok = argmax_lowest(last)
        out.append(tok)
        if step + 1 < n_new:
            last = model.forward([tok], cache)[-1]
    return prompt_logits, out


def load_model(model_dir, act_int8=False):
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(cfg_path):
        raise RefError("%s not found" % cfg_path)
    with open(cfg_path) as f:
        raw = json.load(f)
    cfg = Config(raw)
    quant = Quantization(raw["quantization_config"]) if raw.get("quantization_config") else None
    ckpt = Checkpoint(model_dir, quant)
    ckpt.act_int8 = act_int8
    ckpt.strip_model_prefix()
    return Model(cfg, ckpt)


def embed(model, prompt, pooling, normalize):
    """One input's embedding: the final-normed hidden states of the whole prompt (one pass), pooled by
    the last token, the mean over tokens or the first (CLS), then divided by its L2 norm when asked."""
    h = model.forward(prompt, model.new_cache(), hidden=True)     # [T, D]
    v = {"last": h[-1], "mean": h.mean(dim=0), "cls": h[0]}[pooling]
    if normalize:
        v = v / torch.linalg.vector_norm(v)
    return v


def parse_ids(s):
    try:
        ids = [int(t) for t in s.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise RefError("--ids must be comma-separated integers, got %r" % s)
    if not ids:
        raise RefError("--ids is empty")
    return ids


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description="float32 reference forward pass for HF decoder-only checkpoints")
    ap.add_argument("model_dir", metavar="MODEL_DIR")
    ap.add_argument("--ids", required=True, help="prompt token ids, comma-separated")
    ap.add_argument("--greedy", type=int, default=0, metavar="N", help="greedy-generate N tokens after the prompt")
    ap.add_argument("--out-logits", metavar="FILE.npy", help="save the prompt's logits, float32 [T, vocab]")
    ap.add_argument("--kv", choices=("f32", "fp8"), default="f32", help="KV cache storage (fp8: see above)")
    ap.add_argument("--act", choices=("f32", "int8"), default="f32",
                    help="int8: I8 weights' products with activations quantized per row (see above)")
    ap.add_argument("--embed", choices=("last", "mean", "cls"),
                    help="print the pooled embedding of each ';'-separated input of --ids, as JSON, instead")
    ap.add_argument("--normalize", action="store_true", help="with --embed: L2-normalise each vector")
    ap.add_argument("--out-json", metavar="FILE.json", help='write {"greedy": [...], "arch": ..., "n_params": ...}')
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    try:
        ids = parse_ids(args.ids) if not args.embed else []
        if args.greedy < 0:
            raise RefError("--greedy must be >= 0")
        with torch.no_grad():
            model = load_model(args.model_dir, act_int8=args.act == "int8")
            model.kv_fp8 = args.kv == "fp8"
            if args.embed:
                vectors = [embed(model, parse_ids(part), args.embed, args.normalize).tolist()
                           for part in args.ids.split(";")]
                print(json.dumps({"embeddings": vectors}))
                return 0
            bad = [t for t in ids if not 0 <= t < model.cfg.vocab_size]
            if bad:
                raise RefError("token id %d out of range [0, %d)" % (bad[0], model.cfg.vocab_size))
            logits, greedy = generate(model, ids, args.greedy)
    except RefError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2

    if args.out_logits:
        np.save(args.out_logits, logits.numpy().astype(np.float32))
    result = {
        "greedy": greedy,
        "arch": model.cfg.arch,
        "n_params": int(model.n_params),
        "prompt": ids,
        "vocab_size": model.cfg.vocab_size,
        "torch_dtype": model.cfg.torch_dtype,
    }
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f)
            f.write("\n")
    print(json.dumps({"arch": result["arch"], "prompt_len": len(ids), "greedy": greedy}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
