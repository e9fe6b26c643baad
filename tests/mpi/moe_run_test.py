#!/usr/bin/env python3
"""`tandem run` with mixture-of-experts checkpoints (Qwen3-MoE with a dense
layer, Mixtral): the same token ids in one process, aggregated over 2
workers and disaggregated 1P+1D (the KV handoff is attention's and does not
change), greedy and sampled; the summary counts the prompts' KV that moved,
and the rows each expert computed: top-k for every row a worker computed.
Workers of 2 and 4 ranks, experts whole on their ranks (expert
parallelism) or split, give the same token ids, aggregated and with the
prefill and decode widths mismatched; a width that does not divide the
experts is refused before any work with one line. Under bf16 dot products
(model.cpu_matmul = "bf16", and "bf16-amx") the token ids differ from f32's and are the same
bits in one process, expert-parallel and disaggregated. So are an FP8-block
checkpoint's (written by `tandem quantize`), against its bf16 source, and
under INT8 activations (model.cpu_matmul = "int8") an INT8-on-load model's,
experts whole and split.
Usage: moe_run_test.py TANDEM SRC_DIR"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env, run_job  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env()
check = Checks()

with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    words = "expert router token layer prefill decode cluster node rank queue".split()
    with open(tmp / "in.jsonl", "w") as f:
        for i in range(24):
            f.write(json.dumps({"custom_id": f"m{i}", "prompt": " ".join(words[(i + k) % len(words)] for k in range(5 + i * 3)),
                                "max_tokens": 8 + i % 5, "temperature": 0 if i % 2 else 0.8, "seed": i,
                                "ignore_eos": True}) + "\n")

    def run(model, name, np, *sets, timeout=300):
        p, records, summary = run_job(tandem, env, tmp / "in.jsonl", tmp / f"{name}.jsonl", model, np, *sets,
                                      timeout=timeout)
        return p, {c: o["tandem"]["token_ids"] for c, o in records.items()}, summary

    singles = {}
    for arch in ("qwen3_moe", "mixtral"):
        if not check.wants(arch):
            continue
        model = make_model(tandem, src, tmp / arch, "tiny", 5, arch, "--dtype", "f32")
        p, single, summary = run(model, f"{arch}-single", 1)
        singles[arch] = single
        check(f"{arch}: one process completes every line", p.returncode == 0 and len(single) == 24,
              f"rc {p.returncode}, {len(single)} lines")
        experts = summary.get("experts", {})
        rows = sum(r["prefill_tokens"] + r["decode_tokens"] for r in summary.get("ranks", []))
        layers = experts.get("tokens_per_expert", [])
        check(f"{arch}: the summary counts each MoE layer's rows per expert, top 2 of every row computed",
              experts.get("experts_per_layer") == 8 and len(layers) == (1 if arch == "qwen3_moe" else 2) and
              all(len(l) == 8 and sum(l) == 2 * rows for l in layers) and
              all(h >= 1 for h in experts.get("hottest_over_mean", [])) and experts.get("busiest_worker_share") == 1,
              f"{rows} rows computed: {experts}")
        p, agg, summary = run(model, f"{arch}-agg", 3, 'job.mode="agg"')
        check(f"{arch}: aggregated over 2 workers, the same token ids", p.returncode == 0 and agg == single,
              f"rc {p.returncode}, {sum(agg.get(k) != v for k, v in single.items())} differ")
        experts = summary.get("experts", {})
        rows = sum(r["prefill_tokens"] + r["decode_tokens"] for r in summary.get("ranks", []))
        check(f"{arch}: two workers' expert rows add up, neither worker did all of them",
              all(sum(l) == 2 * rows for l in experts.get("tokens_per_expert", [None])) and
              0.5 <= experts.get("busiest_worker_share", 0) < 1, f"{rows} rows computed: {experts}")
        p, dis, summary = run(model, f"{arch}-disagg", 3, 'job.mode="disagg"', "router.local_prefill_tokens=1")
        check(f"{arch}: disaggregated 1P+1D, the same token ids, the prompts' KV moved",
              p.returncode == 0 and dis == single and summary.get("kv_bytes_transferred", 0) > 0,
              f"rc {p.returncode}, {sum(dis.get(k) != v for k, v in single.items())} differ, "
              f"{summary.get('kv_bytes_transferred')} KV bytes")

    # Expert parallelism: workers of 2 ranks (4 experts each) and of 4 (2 each), experts whole or split; the
    # same token ids as one process, aggregated and disaggregated with the prefill and decode widths mismatched.
    model = tmp / "qwen3_moe"
    if (check.wants("ep") or check.wants("refused")) and not model.exists():
        make_model(tandem, src, model, "tiny", 5, "qwen3_moe", "--dtype", "f32")
    if check.wants("ep"):
        single = singles.get("qwen3_moe") or run(model, "qwen3_moe-single", 1)[1]
        for name, np, ranks, sets in (("agg tp=2, experts whole", 5, 2, ['job.mode="agg"', "cluster.tp=2"]),
                                      ("agg tp=2, experts split", 3, 1, ['job.mode="agg"', "cluster.tp=2",
                                                                         "cluster.expert_parallel=false"]),
                                      ("1P+1D, prefill 1 rank, decode 4 ranks", 6, 4,
                                       ['job.mode="disagg"', "cluster.prefill_tp=1", "cluster.decode_tp=4",
                                        "cluster.prefill_ranks=1", "router.local_prefill_tokens=1"]),
                                      ("2P+1D, prefill 2 ranks each, decode 1 rank", 6, 2,
                                       ['job.mode="disagg"', "cluster.prefill_tp=2", "cluster.decode_tp=1",
                                        "cluster.prefill_ranks=4", "router.local_prefill_tokens=1"])):
            tag = name.split(",")[0].replace(" ", "_").replace("=", "").replace("+", "")
            p, got, summary = run(model, f"ep-{tag}-{np}", np, *sets)
            rows = sum(r["prefill_tokens"] + r["decode_tokens"] for r in summary.get("ranks", []))
            experts = summary.get("experts", {})
            layers = experts.get("tokens_per_expert", [])
            share = experts.get("busiest_rank_share", 0)
            check(f"expert parallel, {name}: the same token ids as one process, every row's experts counted once",
                  p.returncode == 0 and got == single and len(layers) == 1 and sum(layers[0]) == 2 * rows,
                  f"rc {p.returncode}, {sum(got.get(k) != v for k, v in single.items())} differ, {rows} rows, {layers}")
            check(f"expert parallel, {name}: the summary shows experts on {ranks} rank(s), the busiest rank's share",
                  experts.get("expert_parallel_ranks") == ranks and
                  (share == 1 if ranks == 1 else 1 / ranks <= share < 1), f"{experts}")

    # bf16 dot products (model.cpu_matmul = "bf16", AVX512-BF16) and bf16 in AMX's order ("bf16-amx": AMX tiles from
    # 16 rows where the CPU has AMX-BF16, AVX-512 FMAs otherwise): other bits than f32's, but the same bits in one
    # process, expert-parallel at width 2 and disaggregated; refused with one line where the CPU lacks AVX512-BF16.
    if check.wants("bf16"):
        bf = make_model(tandem, src, tmp / "moe-bf16", "tiny", 5, "qwen3_moe", "--dtype", "bf16")
        _, f32, _ = run(bf, "bf16-f32", 1)
        for mode, tables in (("bf16", ("avx512-bf16",)), ("bf16-amx", ("amx-bf16", "avx512-bf16amx"))):
            p, one, summary = run(bf, mode + "-single", 1, f'model.cpu_matmul="{mode}"')
            if p.returncode != 0 and "needs a CPU with AVX512-BF16" in p.stderr:
                print(f"skipped {mode}: no AVX512-BF16 on this CPU")
                continue
            check(f"{mode}: one process completes, the summary names the arithmetic, other bits than f32's",
                  p.returncode == 0 and len(one) == 24 and summary.get("kernels") in tables and one != f32,
                  f"rc {p.returncode}, kernels {summary.get('kernels')}, {sum(one[k] != f32.get(k) for k in one)} of 24 differ")
            for name, np, sets in (("agg tp=2, experts whole", 3, ['job.mode="agg"', "cluster.tp=2"]),
                                   ("1P+1D", 3, ['job.mode="disagg"', "router.local_prefill_tokens=1"])):
                tag = name.split(",")[0].replace(" ", "_").replace("=", "").replace("+", "")
                p, got, _ = run(bf, f"{mode}-{tag}", np, f'model.cpu_matmul="{mode}"', *sets)
                check(f"{mode}, {name}: the same token ids as one process", p.returncode == 0 and got == one,
                      f"rc {p.returncode}, {sum(got.get(k) != v for k, v in one.items())} differ")

    # An FP8-block checkpoint written by `tandem quantize`: other bits than its bf16 source, the same bits in one
    # process, expert-parallel at width 2 and disaggregated with mismatched widths.
    if check.wants("fp8"):
        source = tmp / "moe-bf16"
        if not source.exists():
            make_model(tandem, src, source, "tiny", 5, "qwen3_moe", "--dtype", "bf16")
        fp8 = tmp / "moe-fp8"
        q = subprocess.run([tandem, "quantize", "--model", str(source), "--out", str(fp8), "--scheme", "fp8-block",
                            "--quiet"], capture_output=True, text=True, timeout=120)
        p, one, _ = run(fp8, "fp8-single", 1)
        _, plain, _ = run(source, "fp8-source", 1)
        check("fp8 block: quantized, one process completes, other bits than the bf16 source's",
              q.returncode == 0 and p.returncode == 0 and len(one) == 24 and one != plain,
              f"quantize rc {q.returncode} {q.stderr.strip()[-200:]}, run rc {p.returncode}, "
              f"{sum(one[k] != plain.get(k) for k in one)} of 24 differ")
        # model.dtype = "fp8" quantizes the bf16 source as it loads, as tandem quantize wrote it: the same bits
        p, at_load, _ = run(source, "fp8-at-load", 1, 'model.dtype="fp8"')
        check("model.dtype = \"fp8\": the bf16 checkpoint quantized as it loads gives the quantized checkpoint's ids",
              p.returncode == 0 and at_load == one, f"rc {p.returncode}, {sum(at_load.get(k) != v for k, v in one.items())} differ")
        p, _, _ = run(fp8, "fp8-again", 1, 'model.dtype="int8"', timeout=60)
        errors = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
        check("model.dtype = \"int8\" on an FP8 checkpoint is refused with one line",
              p.returncode != 0 and len(errors) == 1 and "is already quantized (fp8 128x128 block)" in errors[0],
              f"rc {p.returncode}: {p.stderr.strip()[-300:]}")
        # model.gpu_matmul = "fp8" (Hopper's FP8 tensor cores) is the CUDA backend's, for FP8-block checkpoints only
        for label, model, sets, want in (
                ("on the CPU backend", fp8, ['model.gpu_matmul="fp8"'], "sets the CUDA backend's arithmetic"),
                ("on a bf16 checkpoint", source, ['model.backend="cuda"', 'model.gpu_matmul="fp8"'],
                 "multiplies checkpoints of FP8 weights in 128x128 blocks")):
            p, _, _ = run(model, "gpu-matmul-" + label.split()[-2], 1, *sets, timeout=60)
            errors = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
            check(f"model.gpu_matmul = \"fp8\" {label} is refused with one line",
                  p.returncode != 0 and len(errors) == 1 and want in errors[0], f"rc {p.returncode}: {p.stderr.strip()[-300:]}")
        p, widened, _ = run(source, "f32-at-load", 1, 'model.dtype="f32"')
        check("model.dtype = \"f32\": bf16 weights widened as they load, exactly: the checkpoint's own ids",
              p.returncode == 0 and widened == plain, f"rc {p.returncode}, {sum(widened.get(k) != v for k, v in plain.items())} differ")
        for name, np, sets in (("agg tp=2, experts whole", 3, ['job.mode="agg"', "cluster.tp=2"]),
                               ("1P+1D, prefill 1 rank, decode 2 ranks", 4,
                                ['job.mode="disagg"', "cluster.prefill_tp=1", "cluster.decode_tp=2",
                                 "cluster.prefill_ranks=1", "router.local_prefill_tokens=1"])):
            p, got, _ = run(fp8, "fp8-" + name.split(",")[0].replace(" ", "_").replace("=", "").replace("+", ""), np,
                            *sets)
            check(f"fp8 block, {name}: the same token ids as one process", p.returncode == 0 and got == one,
                  f"rc {p.returncode}, {sum(got.get(k) != v for k, v in one.items())} differ")

    # INT8 activations (model.cpu_matmul = "int8", AVX512-VNNI) on the bf16 source quantized to INT8 as it loads:
    # other bits than the weight-only INT8 products, the same bits in one process, at width 2 with experts whole
    # and split, and disaggregated with mismatched widths; refused with one line on weights that are not INT8.
    if check.wants("int8 activations"):
        source = tmp / "moe-bf16"
        if not source.exists():
            make_model(tandem, src, source, "tiny", 5, "qwen3_moe", "--dtype", "bf16")
        w8a8 = ['model.dtype="int8"', 'model.cpu_matmul="int8"']
        p, one, summary = run(source, "int8-single", 1, *w8a8)
        if p.returncode != 0 and "needs a CPU with AVX512-VNNI" in p.stderr:
            print("skipped INT8 activations: no AVX512-VNNI on this CPU")
        else:
            _, weight_only, _ = run(source, "int8-weight-only", 1, 'model.dtype="int8"')
            check("INT8 activations: one process completes, the summary names the arithmetic, other bits than "
                  "weight-only INT8's",
                  p.returncode == 0 and len(one) == 24 and summary.get("kernels") in ("avx512-vnni", "amx-int8") and
                  one != weight_only,
                  f"rc {p.returncode}, kernels {summary.get('kernels')}, "
                  f"{sum(one[k] != weight_only.get(k) for k in one)} of 24 differ")
            for name, np, sets in (("agg tp=2, experts whole", 3, ['job.mode="agg"', "cluster.tp=2"]),
                                   ("agg tp=2, experts split", 3,
                                    ['job.mode="agg"', "cluster.tp=2", "cluster.expert_parallel=false"]),
                                   ("1P+1D, prefill 2 ranks, decode 1 rank", 4,
                                    ['job.mode="disagg"', "cluster.prefill_tp=2", "cluster.decode_tp=1",
                                     "cluster.prefill_ranks=2", "router.local_prefill_tokens=1"])):
                tag = "int8-" + name.replace(",", "").replace(" ", "_").replace("=", "").replace("+", "")
                p, got, _ = run(source, tag, np, *w8a8, *sets)
                check(f"INT8 activations, {name}: the same token ids as one process", p.returncode == 0 and got == one,
                      f"rc {p.returncode}, {sum(got.get(k) != v for k, v in one.items())} differ")
            p, _, _ = run(source, "int8-on-bf16", 1, 'model.cpu_matmul="int8"', timeout=60)
            errors = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
            check("model.cpu_matmul = \"int8\" on bf16 weights is refused with one line naming the way out",
                  p.returncode != 0 and len(errors) == 1 and "multiplies INT8 weights" in errors[0] and
                  'model.dtype = \"int8\"' in errors[0] and not (tmp / "int8-on-bf16.jsonl").exists(),
                  f"rc {p.returncode}: {p.stderr.strip()[-300:]}")

    if check.wants("refused"):
        six = make_model(tandem, src, tmp / "six", "tiny", 5, "qwen3_moe", "--dtype", "f32", "--experts", "6")
        p, _, _ = run(six, "tp4", 5, "cluster.tp=4", timeout=60)
        errors = [l for l in p.stderr.splitlines() if l.startswith("tandem: error:")]
        check("a worker width that does not divide the experts is refused before any work, with one line",
              p.returncode != 0 and len(errors) == 1 and "does not divide the model's 6 experts" in errors[0] and
              "cluster.expert_parallel = false" in errors[0] and not (tmp / "tp4.jsonl").exists(),
              f"rc {p.returncode}: {p.stderr.strip()[-300:]}")

sys.exit(check.exit_code())
