#!/usr/bin/env bash
# The simulator at cluster scale, two sizes. Never fails on time.
#   1. 1,000,000 requests (a RAG-like phase, then a reasoning-like one) on
#      1,024 simulated H100s with the lookahead policy, against the 60 s budget
#      of the planner issue.
#   2. The oracle (evaluation only: it simulates the rest of the run ahead for
#      the splits it searches, every epoch) on 110,000 requests whose mix
#      shifts (RAG-like, reasoning-like, RAG-like) on 64 H100s with the default
#      epochs of 1,024 requests, against the 120 s budget of issue 20; before it
#      searched, it simulated all 64 splits every epoch: about 20 min of CPU.
#      Baseline in the same run: lookahead on the same workload (one simulation).
# Usage: perf/sim_bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tandem="$build/launcher/tandem"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }

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
start=$(now)
"$tandem" simulate --workload "$tmp/w.toml" --model-config jobs/sim/qwen3-8b.json --hardware h100 \
  --gpus 1024 --policy lookahead --epoch-requests 100000 > "$tmp/big.txt"
end=$(now)
head -3 "$tmp/big.txt"
python3 -c "w = $end - $start; print(f'wall time {w:.1f} s for 1,000,000 requests on 1,024 GPUs = {w / 60 * 100:.0f}% of the 60 s budget')"

cat > "$tmp/shifting.toml" <<'TOML'
seed = 7
[[phase]]
requests = 40000
isl = { dist = "lognormal", mean = 6000, sigma = 0.4 }
osl = { dist = "lognormal", mean = 150, sigma = 0.3 }
[[phase]]
requests = 30000
isl = { dist = "lognormal", mean = 400, sigma = 0.4 }
osl = { dist = "lognormal", mean = 2000, sigma = 0.3 }
[[phase]]
requests = 40000
isl = { dist = "lognormal", mean = 6000, sigma = 0.4 }
osl = { dist = "lognormal", mean = 150, sigma = 0.3 }
TOML
shifting() {
  "$tandem" simulate --workload "$tmp/shifting.toml" --model-config jobs/sim/qwen3-8b.json --hardware h100 \
    --gpus 64 --policy "$1" > "$tmp/$1.txt"
}
start=$(now); shifting lookahead; mid=$(now); shifting oracle; end=$(now)
sed -n 2p "$tmp/lookahead.txt" | sed 's/^/lookahead: /'
sed -n 2p "$tmp/oracle.txt" | sed 's/^/oracle:    /'
python3 -c "
base, w = $mid - $start, $end - $mid
print(f'wall time {w:.1f} s for the oracle on 110,000 requests on 64 GPUs = {w / 120 * 100:.0f}% of the 120 s budget;'
      f' {w / base:.0f}x one lookahead run ({base:.2f} s)')"
