"""A byte-level BPE tokenizer trained from text, written as Hugging Face's
tokenizer.json (the format tandem's tokenizer reads), with Qwen2/Qwen3's
pre-tokenizer: the same split pattern, the same byte-to-character map.

No `tokenizers`, no `regex`: the split pattern is implemented by hand below
(the pattern's alternatives in order, leftmost first), and the trainer is the
textbook one (count adjacent pairs within words, merge the most frequent,
ties broken by the pair's text), so the same text gives the same files.
"""

import collections
import unicodedata

# Qwen2/Qwen3's split pattern, as tokenizer.json states it.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _letter(c):
    return unicodedata.category(c).startswith("L")


def _number(c):
    return unicodedata.category(c).startswith("N")


def _space(c):
    return c.isspace()


def _other(c):  # [^\s\p{L}\p{N}]
    return not (_space(c) or _letter(c) or _number(c))


def split(text):
    """SPLIT_PATTERN's matches, in order, covering the text."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        # 's 't 're 've 'm 'll 'd, any case
        if c == "'":
            rest = text[i + 1:i + 3].lower()
            m = next((s for s in ("s", "t", "re", "ve", "m", "ll", "d") if rest.startswith(s)), None)
            if m:
                out.append(text[i:i + 1 + len(m)])
                i += 1 + len(m)
                continue
        # [^\r\n\p{L}\p{N}]?\p{L}+
        j = i
        if c not in "\r\n" and not _letter(c) and not _number(c) and i + 1 < n and _letter(text[i + 1]):
            j = i + 1
        if _letter(text[j]):
            k = j
            while k < n and _letter(text[k]):
                k += 1
            out.append(text[i:k])
            i = k
            continue
        # \p{N}
        if _number(c):
            out.append(c)
            i += 1
            continue
        # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        j = i + 1 if c == " " and i + 1 < n and _other(text[i + 1]) else i
        if _other(text[j]):
            k = j
            while k < n and _other(text[k]):
                k += 1
            while k < n and text[k] in "\r\n":
                k += 1
            out.append(text[i:k])
            i = k
            continue
        # whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
        k = i
        while k < n and _space(text[k]):
            k += 1
        last_newline = max((p for p in range(i, k) if text[p] in "\r\n"), default=-1)
        if last_newline >= 0:
            end = last_newline + 1
        elif k == n or k - i == 1:
            end = k
        else:
            end = k - 1  # leave the last space to the word after it
        out.append(text[i:end])
        i = end
    return out


def byte_chars():
    """GPT-2's map of the 256 bytes to printable characters (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(text, vocab_size):
    """Merges (pairs of token strings) learned from `text` until the vocabulary
    (256 bytes + merges) reaches vocab_size - len(SPECIAL)."""
    bc = byte_chars()
    words = collections.Counter("".join(bc[b] for b in w.encode("utf-8")) for w in split(unicodedata.normalize("NFC", text)))
    seqs = {w: tuple(w) for w in words}
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> words holding it
    for w, s in seqs.items():
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += words[w]
            where[(a, b)].add(w)
    merges = []
    while 256 + len(merges) < vocab_size - len(SPECIAL) and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for w in list(where[best]):
            s, f = seqs[w], words[w]
            for a, b in zip(s, s[1:]):  # the word's old pairs out
                pairs[(a, b)] -= f
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
            new, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    new.append(joined)
                    i += 2
                else:
                    new.append(s[i])
                    i += 1
            seqs[w] = tuple(new)
            for a, b in zip(new, new[1:]):  # and its new ones in
                pairs[(a, b)] += f
                where[(a, b)].add(w)
        del where[best]
        pairs.pop(best, None)
    return merges


def tokenizer_json(merges):
    """tokenizer.json: Qwen3's normalizer, pre-tokenizer and decoder, our vocabulary."""
    bc = byte_chars()
    vocab = {}
    for b in range(256):
        vocab[bc[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = []
    for s in SPECIAL:
        added.append({"id": len(vocab), "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
        vocab[s] = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": False}, byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {k: v for k, v in vocab.items() if k not in SPECIAL}, "merges": [[a, b] for a, b in merges]},
    }


class Encoder:
    """Encodes text with the learned merges (for training; tandem has its own)."""

    def __init__(self, merges):
        self.rank = {m: i for i, m in enumerate(merges)}
        self.bc = byte_chars()
        self.ids = tokenizer_json(merges)["model"]["vocab"]
        self.cache = {}

    def word(self, w):
        if w in self.cache:
            return self.cache[w]
        s = list("".join(self.bc[b] for b in w.encode("utf-8")))
        while len(s) > 1:
            ranked = [(self.rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(s, s[1:]))]
            r, i = min(ranked)
            if r == 1 << 30:
                break
            s[i:i + 2] = [s[i] + s[i + 1]]
        out = [self.ids[t] for t in s]
        self.cache[w] = out
        return out

    def encode(self, text):
        out = []
        for w in split(unicodedata.normalize("NFC", text)):
            out.extend(self.word(w))
        return out
