#!/usr/bin/env python3
"""A deterministic test workload for `tandem run`: N requests mixing chat and
completion forms (full Batch lines and the short form), prompts from 1 token
to many KV blocks, shared prefixes, greedy and seeded sampling, stop strings,
and (with --bad) the bad lines a user might write.
Usage: make_workload.py OUT.jsonl [N] [--bad]"""
import json
import random
import sys

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else 200
bad = "--bad" in sys.argv
rng = random.Random(17)
shared = "Background for every question: " + " ".join(f"fact {i} is that batch jobs run in queues." for i in range(30))
words = "cluster node rank queue token model prefill decode block cache epoch router scheduler".split()

lines = []
for i in range(n):
    cid = f"req-{i:04d}"
    kind = i % 6
    sampled = i % 4 == 0
    params = {"max_tokens": rng.choice([1, 3, 8, 16, 24]),
              "temperature": 0.9 if sampled else 0}
    if sampled:
        params["seed"] = i
        params["top_p"] = 0.9
    if kind == 0:  # one-token prompt, as ids
        lines.append({"custom_id": cid, "prompt_token_ids": [rng.randrange(1, 1000)], **params})
    elif kind == 1:  # chat with the long shared system prompt
        body = {"model": "test", "messages": [{"role": "system", "content": shared},
                                               {"role": "user", "content": " ".join(rng.choices(words, k=6))}], **params}
        lines.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
    elif kind == 2:  # long completion prompt (many blocks)
        text = " ".join(rng.choices(words, k=rng.randrange(60, 200)))
        lines.append({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                      "body": {"model": "test", "prompt": text, **params}})
    elif kind == 3:  # short form with a shared prefix and a stop string
        lines.append({"custom_id": cid, "prompt": shared + " Question: " + rng.choice(words) + "?",
                      "stop": ["\n"], **params})
    elif kind == 4:  # short chat, short form
        lines.append({"custom_id": cid, "messages": [{"role": "user", "content": rng.choice(words)}], **params})
    elif i % 12 == 5:  # the shared prefix, then a long tail of its own: only the tail's KV needs to travel
        lines.append({"custom_id": cid, "prompt": shared + " " + " ".join(rng.choices(words, k=120)), **params})
    else:  # medium completion with penalties
        text = " ".join(rng.choices(words, k=rng.randrange(5, 40)))
        lines.append({"custom_id": cid, "prompt": text, "presence_penalty": 0.5, "repetition_penalty": 1.1, **params})

text_lines = [json.dumps(l) for l in lines]
if bad:
    text_lines += [
        "this is not json",
        json.dumps({"prompt": "no custom id"}),
        json.dumps({"custom_id": "req-0001", "prompt": "a duplicate custom_id"}),
        json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}}),
        json.dumps({"custom_id": "bad-max-tokens", "prompt": "x", "max_tokens": 0}),
        json.dumps({"custom_id": "bad-type", "prompt": "x", "temperature": "hot"}),
        json.dumps({"custom_id": "too-long", "prompt_token_ids": [5] * 5000}),
        json.dumps({"custom_id": "bad-n", "prompt": "x", "n": 3}),
    ]
    rng.shuffle(text_lines)
with open(out, "w") as f:
    f.write("\n".join(text_lines) + "\n")
