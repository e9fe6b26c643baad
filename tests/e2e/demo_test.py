#!/usr/bin/env python3
"""`make run`'s demo (scripts/demo.sh) on the trained demo model (demo/model):
every request answered; the answers are text, at least 90% of their words in
/usr/share/dict/words; most end on their own at a verse's end (the stop
string "\\n", which the model produces); most chat answers end on their own
(the model's <|im_end|>); the shared passage of Genesis is computed once and
reused from the prefix cache. Then `tandem serve` on the
demo's job file answers docs/serve.md's example request with the text the
page shows.
Usage: demo_test.py BUILD_DIR SRC_DIR"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
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
choices = [r["response"]["body"]["choices"][0] for r in records if r.get("response")]
answers = [c for c in choices if "text" in c]
chats = [c for c in choices if "message" in c]
check("every one of the 56 requests answered (48 completions, 8 chats)", len(answers) == 48 and len(chats) == 8,
      f"{len(answers)} completions and {len(chats)} chats of {len(records)} lines")
words = set(w.strip().lower() for w in open("/usr/share/dict/words", encoding="utf-8", errors="replace"))
said = [w.lower() for a in answers for w in re.findall(r"[A-Za-z]+", a["text"])]
said += [w.lower() for c in chats for w in re.findall(r"[A-Za-z]+", c["message"]["content"])]
known = sum(w in words for w in said)
check("at least 90% of the answers' words are English words (/usr/share/dict/words)",
      len(said) >= 200 and known >= 0.9 * len(said), f"{known} of {len(said)} ({100 * known / max(1, len(said)):.1f}%)")
stopped = sum(a["finish_reason"] == "stop" for a in answers)
check("most answers end on their own at a verse's end (stop \"\\n\")", stopped >= len(answers) // 2,
      f"{stopped} of {len(answers)}")
ended = sum(c["finish_reason"] == "stop" and c["message"]["content"].strip() != "" for c in chats)
check("most chat answers end on their own (the model's <|im_end|>, no stop string asked), with no markup in them",
      ended >= 6 and not any(re.search(r"<\|im_|\bassistant\b", c["message"]["content"]) for c in chats),
      f"{ended} of {len(chats)}: " + " | ".join(c["message"]["content"] for c in chats[:3]))
summary = json.loads((build / "demo-output.jsonl.summary.json").read_text()) if out.exists() else {}
check("the shared passage is reused from the prefix cache", summary.get("prefix_hit_rate", 0) > 0.3,
      f"prefix_hit_rate {summary.get('prefix_hit_rate')}")
print("sample:", " | ".join(a["text"].strip() for a in answers[:4]))

# docs/serve.md's example: its request, sent to tandem serve on the demo's job file, gets the text it shows.
page = (src / "docs/serve.md").read_text()
request = json.loads(re.search(r"-d '(\{.*?\})'", page).group(1))
shown = json.loads(re.search(r"```json\n(\{.*?\})\n```", page, re.S).group(1))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
server = subprocess.Popen(["mpirun", "--oversubscribe", "-np", "3", build / "launcher/tandem", "serve", "-c",
                           "jobs/examples/demo.toml", "--port", str(port)], cwd=src, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
got = {}
try:
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    post = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(request).encode(),
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(post, timeout=60) as r:
        got = json.loads(r.read())
except OSError as e:
    got = {"error": str(e)}
finally:
    server.terminate()
    try:
        log = server.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        server.kill()
        log = server.communicate()[0]
want = shown["choices"][0]
have = (got.get("choices") or [{}])[0]
check("tandem serve on the demo answers docs/serve.md's example as the page shows",
      have.get("text") == want["text"] and have.get("finish_reason") == want["finish_reason"] and
      got.get("model") == shown["model"], f"{json.dumps(got)[:300]}; server log: {log[-800:] if not have else ''}")
sys.exit(1 if failed else 0)
