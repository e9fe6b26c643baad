#!/usr/bin/env bash
# The simulator at cluster scale: 1,000,000 requests (a RAG-like phase, then a
# reasoning-like one) on 1,024 simulated H100s with the lookahead policy.
# Prints the wall time against the 60 s budget of the planner issue, and the
# simulated figures. Never fails on time.   Usage: perf/sim_bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/w.toml" <<'TOML'
seed = 3
[[phase]]
requests = 500000
isl = { dist = "lognormal", mean = 3000, sigma = 0.5 }
osl = { dist = "lognormal", mean = 200, sigma = 0.4 }
[[phase]]
requests = 500000
isl = { dist = "lognormal", mean = 500, sigma = 0.5 }
osl = { dist = "lognormal", mean = 800, sigma = 0.4 }
TOML
start=$(date +%s.%N)
"$build/launcher/tandem" simulate --workload "$tmp/w.toml" --model-config jobs/sim/qwen3-8b.json --hardware h100 \
  --gpus 1024 --policy lookahead --epoch-requests 100000 | head -3
end=$(date +%s.%N)
python3 -c "w = $end - $start; print(f'wall time {w:.1f} s for 1,000,000 requests on 1,024 GPUs = {w / 60 * 100:.0f}% of the 60 s budget')"
