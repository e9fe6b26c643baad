#!/usr/bin/env python3
"""Exactly once against damaged and changed files (issue 32), under mpirun:
  - a .gz of 20,000 lines with 20 bytes flipped in its middle, and a small
    one (8 KB), stop before any work with one line saying where (gzip checks
    its data only at the end: nothing decoded from a damaged file is run);
    the fixed file then runs every line once, --resume or not;
  - --resume with an input whose answered lines hold other prompts, or that
    lacks lines the output answers, stops before any work saying what
    differs, the output and its checkpoint untouched; the same lines in
    another order, and lines added, resume;
  - a checkpoint with 8 bytes inserted into one record, or committed_bytes
    -5, is refused with one line (no Open MPI noise), the output untouched.
Usage: exactly_once_test.py TANDEM SRC_DIR"""
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from testlib import Checks, make_model, mpi_env  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2])
env = mpi_env()
check = Checks()


def run(job, out, inp, *extra, np=3, timeout=300):
    return subprocess.run(["mpirun", "--oversubscribe", "-np", str(np), tandem, "run", "-c", str(job), "--output",
                           str(out), "--input", str(inp), *extra], env=env, capture_output=True, text=True,
                          timeout=timeout)


def errors(p):
    return [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]


def one_line_error(p, *words):
    """rc 2, exactly one error line holding every word, and none of MPI's abort noise."""
    errs = errors(p)
    noise = any(w in p.stderr for w in ("MPI_ABORT", "internal error", "please report", "Traceback"))
    return p.returncode == 2 and len(errs) == 1 and all(w in errs[0] for w in words) and not noise


def ids_of(out):
    return [json.loads(l)["custom_id"] for l in Path(out).read_text().splitlines() if l]


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def requests(n, word, start=0):
    return [{"custom_id": f"q{i}", "prompt": f"{word} {i} " * (1 + i % 4), "max_tokens": 2}
            for i in range(start, start + n)]


def flip_middle(data, count, step):
    b = bytearray(data)
    mid = len(b) // 2
    for k in range(count):
        b[mid + k * step] ^= 0x5A
    return bytes(b)


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = make_model(tandem, src, tmp / "model", seed=5)
    job = tmp / "job.toml"
    job.write_text(f'[model]\npath = "{model}"\n[job]\ninput = "unused"\nmode = "disagg"\nmax_num_seqs = 16\n'
                   f'flush_seconds = 0.2\n[kv]\nmemory_gib = 0.05\n')

    # 1. Damaged gzip: nothing decoded from it runs; the fixed file runs once.
    big = write_lines(tmp / "big.jsonl", requests(20000, "hello"))
    bad = tmp / "big_bad.jsonl.gz"
    bad.write_bytes(flip_middle(gzip.compress(big.read_bytes()), 20, 37))
    out = tmp / "big.out.jsonl"
    p = run(job, out, bad)
    check("gzip of 20,000 lines, 20 bytes flipped mid-file: stops before any work with one line saying where",
          one_line_error(p, "gzip data is corrupt at byte", "nothing was run") and not out.exists(),
          f"rc {p.returncode}: {p.stderr[-400:]}")
    words = random.Random(1).choices(["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"], k=4000)
    small_rows = [{"custom_id": f"s{i}", "prompt": " ".join(words[i * 40:(i + 1) * 40]), "max_tokens": 2}
                  for i in range(100)]
    small = write_lines(tmp / "small.jsonl", small_rows)
    small_gz = gzip.compress(small.read_bytes())
    bad_small = tmp / "small_bad.jsonl.gz"
    bad_small.write_bytes(flip_middle(small_gz, 20, 37))
    p = run(job, tmp / "small.out.jsonl", bad_small)
    decoded = re.search(r"after (\d+) bytes of decoded input", p.stderr)
    check(f"a small damaged .gz ({len(small_gz)} bytes): one line naming how far it decoded (not 'after 0 bytes')",
          one_line_error(p, "gzip data is corrupt at byte", "nothing was run") and decoded and int(decoded[1]) > 0 and
          not (tmp / "small.out.jsonl").exists(), errors(p))
    mid = write_lines(tmp / "mid.jsonl", requests(2000, "middle"))
    mid_gz = tmp / "mid.jsonl.gz"
    mid_gz.write_bytes(flip_middle(gzip.compress(mid.read_bytes()), 20, 13))
    out = tmp / "mid.out.jsonl"
    p1 = run(job, out, mid_gz)
    mid_gz.write_bytes(gzip.compress(mid.read_bytes()))  # what the message says: restore it, rerun
    p2 = run(job, out, mid_gz, "--resume")
    got = ids_of(out) if out.exists() else []
    check("a damaged .gz of 2,000 lines is refused; restored, --resume answers every line exactly once",
          one_line_error(p1, "corrupt") and p2.returncode == 0 and sorted(got) == sorted(f"q{i}" for i in range(2000)),
          f"rc {p1.returncode}/{p2.returncode}, {len(got)} lines, {len(set(got))} ids: {p2.stderr[-300:]}")

    # 2. --resume with another input: refused before any work, nothing changed.
    first = write_lines(tmp / "first.jsonl", requests(200, "first"))
    out = tmp / "two.out.jsonl"
    p = run(job, out, first)
    before, ckpt_before = out.read_bytes(), Path(f"{out}.ckpt").read_bytes()
    check("200 lines run", p.returncode == 0 and len(ids_of(out)) == 200, p.stderr[-300:])
    other = write_lines(tmp / "other.jsonl", requests(2000, "second"))
    p = run(job, out, other, "--resume")
    check("--resume with 2,000 lines whose q0..q199 hold other prompts: refused, naming line 1 and q0; output untouched",
          one_line_error(p, "hold other text", "line 1, custom_id 'q0'", "nothing was run") and
          out.read_bytes() == before and Path(f"{out}.ckpt").read_bytes() == ckpt_before, p.stderr[-400:])
    subset = write_lines(tmp / "subset.jsonl", requests(100, "first"))
    p = run(job, out, subset, "--resume")
    check("--resume with an input lacking 100 answered lines: refused, naming them; output untouched",
          one_line_error(p, "100 line(s) it answered are not there") and out.read_bytes() == before, p.stderr[-400:])
    grown = requests(200, "first") + requests(300, "later", start=200)
    random.Random(3).shuffle(grown)
    p = run(job, out, write_lines(tmp / "grown.jsonl", grown), "--resume")
    got = ids_of(out)
    check("--resume with the same 200 lines reordered and 300 added: every line once, the old answers kept as written",
          p.returncode == 0 and sorted(got) == sorted(f"q{i}" for i in range(500)) and
          out.read_bytes().startswith(before), f"rc {p.returncode}, {len(got)} lines: {p.stderr[-300:]}")

    # 3. A damaged checkpoint: refused with one line, never a line done twice.
    before, ckpt = out.read_bytes(), Path(f"{out}.ckpt")
    good = ckpt.read_bytes()
    lines = good.split(b"\n")
    lines[7] = lines[7][:4] + b"ABCDEFGH" + lines[7][4:]
    ckpt.write_bytes(b"\n".join(lines))
    p = run(job, out, tmp / "grown.jsonl", "--resume")
    check("8 bytes inserted into one checkpoint record: refused with one line naming it; output untouched",
          one_line_error(p, "damaged at line 8", "changed outside Tandem") and out.read_bytes() == before,
          p.stderr[-400:])
    ckpt.write_bytes(re.sub(rb'"committed_bytes":\d+', b'"committed_bytes":-5', good, count=1))
    p = run(job, out, tmp / "grown.jsonl", "--resume")
    check("committed_bytes -5: one line saying the checkpoint is damaged, no Open MPI noise, rc 2",
          one_line_error(p, "damaged at line", "committed_bytes -5"), p.stderr[-400:])
    ckpt.write_bytes(good)
    p = run(job, out, tmp / "grown.jsonl", "--resume")
    check("the restored checkpoint resumes: nothing left to do, every line once",
          p.returncode == 0 and sorted(ids_of(out)) == sorted(f"q{i}" for i in range(500)), p.stderr[-300:])

sys.exit(check.exit_code())
