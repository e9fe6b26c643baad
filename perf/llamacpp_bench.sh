#!/usr/bin/env bash
# Tandem's CPU engine against llama.cpp on the same weights, back to back:
# prefill of 512-token prompts, decode of 1 and of 32 concurrent sequences,
# Tandem in its arithmetics (model.cpu_matmul f32, and bf16 and bf16-amx where
# the CPU has AVX512-BF16; for INT8 weights also int8, where it has AVX512-VNNI),
# each engine alternately, twice, the better of each kept (this machine's
# neighbours swing single runs by 10% and more). Prints a table with the
# ratios; then the same for 8-bit weights: llama.cpp Q8_0 against Tandem FP8
# and INT8 (tandem quantize) of the same bf16 weights, in both arithmetics. Figures only: it never
# fails on time.
#
#   perf/llamacpp_bench.sh [BUILD_DIR] [THREADS]
#
# llama.cpp is the CPU build inside the npm package node-llama-cpp (pinned
# below), installed once under BUILD_DIR/llamacpp (outside git, not by `make
# setup`: only this benchmark needs it); perf/gguf_export.py writes the bench
# model (perf/engine_bench's, Qwen3-0.6B's shape, bf16) as a GGUF with the
# same weights.
set -euo pipefail
build=$(readlink -f "${1:-build}")
threads=${2:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
version=3.21.1
deps=$build/llamacpp
if [ ! -d "$deps/node_modules/@node-llama-cpp/linux-x64" ]; then
  echo "installing node-llama-cpp@$version (its prebuilt CPU build) under $deps ..."
  mkdir -p "$deps"
  (cd "$deps" && npm init -y > /dev/null && npm install --ignore-scripts --no-audit --no-fund --omit=optional \
    --loglevel=error "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" > /dev/null)
fi
model=$build/bench-model
[ -f "$model/model.safetensors" ] || "$build/perf/engine_bench" --only decode:1 --quick > /dev/null  # makes it
gguf=$build/bench-model.gguf
[ -f "$gguf" ] && [ "$gguf" -nt "$model/model.safetensors" ] || /usr/bin/python3 "$src/perf/gguf_export.py" "$model" "$gguf"

best() { printf '%s\n' "$@" | sort -g | tail -1; }
declare -A tandem bf16 amxb llama
# model.cpu_matmul = "bf16" (AVX512-BF16 dot products), where the CPU has them; "bf16-amx" on AMX tiles where it
# has AMX-BF16, else on AVX-512 FMAs.
has_bf16=$(grep -qw avx512_bf16 /proc/cpuinfo && echo 1 || echo 0)
amx_table=$(grep -qw amx_bf16 /proc/cpuinfo && echo amx-bf16 || echo avx512-bf16amx)
for run in 1 2; do
  for what in prefill decode:1 decode:32; do
    tandem[$what]="${tandem[$what]:-} $("$build/perf/engine_bench" --threads "$threads" --only "$what" | awk '{print $(NF-1)}')"
    [ "$has_bf16" = 1 ] && bf16[$what]="${bf16[$what]:-} $(TANDEM_CPU_KERNELS=avx512-bf16 "$build/perf/engine_bench" \
      --threads "$threads" --only "$what" | awk '{print $(NF-1)}')"
    [ "$has_bf16" = 1 ] && amxb[$what]="${amxb[$what]:-} $(TANDEM_CPU_KERNELS=$amx_table "$build/perf/engine_bench" \
      --threads "$threads" --only "$what" | awk '{print $(NF-1)}')"
  done
  json=$(node "$src/perf/llamacpp_bench.mjs" "$deps/node_modules" "$gguf" "$threads")
  for key in prefill_512 decode_1 decode_32; do
    llama[$key]="${llama[$key]:-} $(echo "$json" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$key'])")"
  done
done
echo "Tandem against llama.cpp (node-llama-cpp $version, its CPU build), $threads threads, the same bf16 weights,"
echo "the better of two alternated runs each:"
printf '%-28s %13s %13s %8s %13s %8s\n' "workload" "llama.cpp" "Tandem f32" "ratio" "Tandem bf16" "ratio"
row() {  # label, llama.cpp's runs, Tandem's f32 runs, Tandem's bf16 runs (may be empty)
  /usr/bin/python3 -c "
import sys
l, t = float(sys.argv[2]), float(sys.argv[3])
b = f'{float(sys.argv[4]):13.1f} {float(sys.argv[4]) / l:7.2f}x' if sys.argv[4] else f'{\"(no AVX512-BF16)\":>22s}'
print(f'{sys.argv[1]:28s} {l:13.1f} {t:13.1f} {t / l:7.2f}x {b}')" "$1" "$(best $2)" "$(best $3)" "$( [ -n "$4" ] && best $4)"
}
row "prefill, 512-token prompts" "${llama[prefill_512]}" "${tandem[prefill]}" "${bf16[prefill]:-}"
row "decode, 1 sequence" "${llama[decode_1]}" "${tandem[decode:1]}" "${bf16[decode:1]:-}"
row "decode, 32 sequences" "${llama[decode_32]}" "${tandem[decode:32]}" "${bf16[decode:32]:-}"

# 8-bit weights: llama.cpp's Q8_0 of the same bf16 weights (gguf_export.py --q8_0) against Tandem's FP8-block
# and INT8-channel twins (tandem quantize); the embedding / tied LM head stays bf16 in all three.
q8=$build/bench-model-q8_0.gguf
[ -f "$q8" ] && [ "$q8" -nt "$model/model.safetensors" ] || /usr/bin/python3 "$src/perf/gguf_export.py" "$model" "$q8" --q8_0
for scheme in fp8-block int8-channel; do
  [ -f "$model-$scheme/config.json" ] ||
    "$build/launcher/tandem" quantize --model "$model" --out "$model-$scheme" --scheme "$scheme" --quiet
done
declare -A fp8 int8 fp8b int8b int8v fp8a q8l
# model.cpu_matmul = "int8" (activations quantized per token, AVX512-VNNI), where the CPU has it.
has_vnni=$(grep -qw avx512_vnni /proc/cpuinfo && echo 1 || echo 0)
eight() {  # scheme, workload, then the environment's assignments: Tandem's tokens/s
  local scheme=$1 what=$2
  shift 2
  env "$@" "$build/perf/engine_bench" --model "$model-$scheme" --threads "$threads" --only "$what" | awk '{print $(NF-1)}'
}
for run in 1 2; do
  for what in prefill decode:1 decode:32; do
    fp8[$what]="${fp8[$what]:-} $(eight fp8-block "$what")"
    int8[$what]="${int8[$what]:-} $(eight int8-channel "$what")"
    if [ "$has_bf16" = 1 ]; then  # each weight's value rounded to bf16, AVX512-BF16 dot products
      fp8b[$what]="${fp8b[$what]:-} $(eight fp8-block "$what" TANDEM_CPU_KERNELS=avx512-bf16)"
      int8b[$what]="${int8b[$what]:-} $(eight int8-channel "$what" TANDEM_CPU_KERNELS=avx512-bf16)"
      fp8a[$what]="${fp8a[$what]:-} $(eight fp8-block "$what" TANDEM_CPU_KERNELS=$amx_table)"
    fi
    if [ "$has_vnni" = 1 ]; then
      int8v[$what]="${int8v[$what]:-} $(eight int8-channel "$what" TANDEM_CPU_KERNELS=avx512-vnni)"
    fi
  done
  json=$(node "$src/perf/llamacpp_bench.mjs" "$deps/node_modules" "$q8" "$threads")
  for key in prefill_512 decode_1 decode_32; do
    q8l[$key]="${q8l[$key]:-} $(echo "$json" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$key'])")"
  done
done
echo
echo "8-bit weights: llama.cpp Q8_0 against Tandem FP8 (128x128 blocks) and INT8 (per channel), the same bf16 source,"
echo "the better of two alternated runs each:"
printf '%-28s %13s %13s %8s %13s %8s\n' "workload" "llama.cpp Q8_0" "Tandem fp8" "ratio" "Tandem int8" "ratio"
row "prefill, 512-token prompts" "${q8l[prefill_512]}" "${fp8[prefill]}" "${int8[prefill]}"
row "decode, 1 sequence" "${q8l[decode_1]}" "${fp8[decode:1]}" "${int8[decode:1]}"
row "decode, 32 sequences" "${q8l[decode_32]}" "${fp8[decode:32]}" "${int8[decode:32]}"
if [ "$has_bf16" = 1 ]; then
  echo
  echo "The same, Tandem in its bf16 arithmetic (model.cpu_matmul = \"bf16\": code x scale rounded to bf16):"
  printf '%-28s %13s %13s %8s %13s %8s\n' "workload" "llama.cpp Q8_0" "fp8, bf16" "ratio" "int8, bf16" "ratio"
  row "prefill, 512-token prompts" "${q8l[prefill_512]}" "${fp8b[prefill]}" "${int8b[prefill]}"
  row "decode, 1 sequence" "${q8l[decode_1]}" "${fp8b[decode:1]}" "${int8b[decode:1]}"
  row "decode, 32 sequences" "${q8l[decode_32]}" "${fp8b[decode:32]}" "${int8b[decode:32]}"
fi
if [ "$has_vnni" = 1 ]; then
  echo
  echo "INT8 with its activations quantized too (model.cpu_matmul = \"int8\", the W8A8 recipe, as Q8_0 does), beside"
  echo "the weight-only INT8 products above:"
  printf '%-28s %13s %13s %8s %13s %8s\n' "workload" "llama.cpp Q8_0" "int8, W8A8" "ratio" "int8, f32" "ratio"
  row "prefill, 512-token prompts" "${q8l[prefill_512]}" "${int8v[prefill]}" "${int8[prefill]}"
  row "decode, 1 sequence" "${q8l[decode_1]}" "${int8v[decode:1]}" "${int8[decode:1]}"
  row "decode, 32 sequences" "${q8l[decode_32]}" "${int8v[decode:32]}" "${int8[decode:32]}"
fi
if [ "$has_bf16" = 1 ]; then
  echo
  echo "Tandem under model.cpu_matmul = \"bf16-amx\" (activations rounded to bf16, AMX's order of the sums; table"
  echo "$amx_table): bf16 weights against llama.cpp's bf16, FP8 weights against its Q8_0:"
  printf '%-28s %13s %13s %8s %14s %13s %8s\n' "workload" "llama.cpp" "bf16-amx" "ratio" "llama.cpp Q8_0" "fp8 bf16-amx" \
    "ratio"
  pair() {  # label, llama.cpp bf16 runs, Tandem bf16 runs, llama.cpp Q8_0 runs, Tandem fp8 runs
    /usr/bin/python3 -c "
import sys
a, b, c, d = (float(v) for v in sys.argv[2:])
print(f'{sys.argv[1]:28s} {a:13.1f} {b:13.1f} {b / a:7.2f}x {c:14.1f} {d:13.1f} {d / c:7.2f}x')" \
      "$1" "$(best $2)" "$(best $3)" "$(best $4)" "$(best $5)"
  }
  pair "prefill, 512-token prompts" "${llama[prefill_512]}" "${amxb[prefill]}" "${q8l[prefill_512]}" "${fp8a[prefill]}"
  pair "decode, 1 sequence" "${llama[decode_1]}" "${amxb[decode:1]}" "${q8l[decode_1]}" "${fp8a[decode:1]}"
  pair "decode, 32 sequences" "${llama[decode_32]}" "${amxb[decode:32]}" "${q8l[decode_32]}" "${fp8a[decode:32]}"
fi
