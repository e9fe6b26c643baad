#!/usr/bin/env python3
"""`make run`'s demo (scripts/demo.sh) on the trained demo model (demo/model):
every request answered; the answers are text, at least 90% of their words in
/usr/share/dict/words; most end on their own at a verse's end (the stop
string "\\n", which the model produces); the shared passage of Genesis is
computed once and reused from the prefix cache.
Usage: demo_test.py BUILD_DIR SRC_DIR"""
import json
import re
import subprocess
import sys
from pathlib import Path

build, src = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
failed = 0


def check(what, ok, detail=""):
    global failed
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail else ""))
    failed += 0 if ok else 1


p = subprocess.run(["bash", src / "scripts/demo.sh", build], capture_output=True, text=True, timeout=600, cwd=src)
print(p.stdout[-3000:])
check("make run's demo runs", p.returncode == 0, p.stderr[-1500:])
out = build / "demo-output.jsonl"
records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
answers = [r["response"]["body"]["choices"][0] for r in records if r.get("response")]
check("every one of the 48 requests answered", len(answers) == 48, f"{len(answers)} of {len(records)} lines")
words = set(w.strip().lower() for w in open("/usr/share/dict/words", encoding="utf-8", errors="replace"))
said = [w.lower() for a in answers for w in re.findall(r"[A-Za-z]+", a["text"])]
known = sum(w in words for w in said)
check("at least 90% of the answers' words are English words (/usr/share/dict/words)",
      len(said) >= 200 and known >= 0.9 * len(said), f"{known} of {len(said)} ({100 * known / max(1, len(said)):.1f}%)")
stopped = sum(a["finish_reason"] == "stop" for a in answers)
check("most answers end on their own at a verse's end (stop \"\\n\")", stopped >= len(answers) // 2,
      f"{stopped} of {len(answers)}")
summary = json.loads((build / "demo-output.jsonl.summary.json").read_text()) if out.exists() else {}
check("the shared passage is reused from the prefix cache", summary.get("prefix_hit_rate", 0) > 0.3,
      f"prefix_hit_rate {summary.get('prefix_hit_rate')}")
print("sample:", " | ".join(a["text"].strip() for a in answers[:4]))
sys.exit(1 if failed else 0)
