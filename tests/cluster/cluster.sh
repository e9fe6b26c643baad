#!/usr/bin/env bash
# A cluster of N nodes on this one machine, for tests: each node a network
# namespace with its own hostname (a UTS namespace per process started on
# it), its own address on a private subnet, joined to the others through a
# bridge (a namespace of its own), so Open MPI and Slurm see separate hosts
# that share no memory and talk TCP. Optionally a real Slurm: one munged (in
# the root namespace, on its own socket), slurmctld on node1, one slurmd per
# node; partitions `debug` (every node, the default), `first` (node1) and
# `others` (the rest), for heterogeneous jobs; the backfill scheduler, which
# alone starts those, runs every second.
#
#   cluster.sh up DIR N [slurm] [RATE]   nodes node1..nodeN; RATE (e.g. 1gbit) caps each node's link
#   cluster.sh on DIR NODE CMD...        runs CMD on NODE (its network and hostname), environment kept
#                                        (with SLURM_CONF set to the cluster's)
#   cluster.sh mpirun DIR ARGS...        mpirun from node1 across the nodes (DIR/mpi.env's settings,
#                                        unless the caller's environment has its own)
#   cluster.sh down DIR                  stops every daemon, deletes every namespace, veth and DIR
#
# `up` writes DIR/cluster.env (TAG, NODES, SUBNET, SLURM_CONF) and the Open MPI
# settings a TCP-only network needs (DIR/mpi.env). Every namespace is named
# after DIR's tag, so `down` removes exactly what `up` made, and runs clean
# after a failed `up`. Exit 77 from `up`: this machine cannot make namespaces
# (not root, no CAP_SYS_ADMIN), with the reason on stderr.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: skipped: $*" >&2; exit 77; }

# The tag of DIR's cluster: short (interface names are at most 15 bytes).
tag_of() { echo "tc$(echo -n "$(readlink -f "$1")" | cksum | cut -c1-6)"; }

up() {
  local dir=$1 n=$2 slurm=${3:-} rate=${4:-}
  [ "$(id -u)" = 0 ] || skip "not root: network namespaces need root"
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(readlink -f "$dir")
  local tag; tag=$(tag_of "$dir")
  local subnet=10.250.$(( $(echo -n "$tag" | cksum | cut -d' ' -f1) % 200 + 20 ))
  ip netns add "$tag-br" 2>/dev/null || skip "ip netns add fails here (no CAP_SYS_ADMIN?)"
  # A node's commands enter its network and get a hostname and mounts of their own: can they here?
  if ! nsenter --net="/run/netns/$tag-br" unshare --uts --mount --propagation private true 2>/dev/null; then
    ip netns del "$tag-br"
    skip "nsenter/unshare into a network namespace fails here (a container without the capabilities?)"
  fi
  ip -n "$tag-br" link add br0 type bridge && ip -n "$tag-br" link set br0 up && ip -n "$tag-br" link set lo up ||
    die "cannot make the bridge"
  : > "$dir/hostfile"
  for i in $(seq 1 "$n"); do
    local ns="$tag-node$i"
    ip netns add "$ns" || die "cannot add namespace $ns"
    ip link add "$tag-v$i" type veth peer name "$tag-p$i" || die "cannot add a veth pair for node$i"
    ip link set "$tag-v$i" netns "$ns" && ip link set "$tag-p$i" netns "$tag-br" || die "cannot move node$i's veths"
    ip -n "$ns" link set "$tag-v$i" name eth0
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up
    ip -n "$tag-br" link set "$tag-p$i" master br0 && ip -n "$tag-br" link set "$tag-p$i" up
    if [ -n "$rate" ]; then  # both directions of the node's link
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms ||
        die "tc tbf on node$i failed"
      ip netns exec "$tag-br" tc qdisc add dev "$tag-p$i" root tbf rate "$rate" burst 256kb latency 50ms
    fi
    echo "node$i slots=16" >> "$dir/hostfile"
  done
  # Every node knows every other by name: a hosts file of their own, bound over /etc/hosts in each command's mount namespace.
  { echo "127.0.0.1 localhost"; for i in $(seq 1 "$n"); do echo "$subnet.$((i + 1)) node$i"; done; } > "$dir/hosts"
  # mpirun reaches the other nodes through this agent (in place of ssh).
  cat > "$dir/agent" <<AGENT
#!/bin/sh
# Open MPI's rsh agent: AGENT HOST CMD... runs CMD on HOST.
host=\$1; shift
exec "$here/cluster.sh" on "$dir" "\$host" sh -c "\$*"
AGENT
  chmod +x "$dir/agent"
  # The "nodes" share this machine's cores: binding each node's first rank to
  # its first core would put them all on one.
  cat > "$dir/mpi.env" <<ENV
OMPI_MCA_plm_rsh_agent=$dir/agent
OMPI_MCA_orte_default_hostfile=$dir/hostfile
OMPI_MCA_oob_tcp_if_include=$subnet.0/24
OMPI_MCA_btl_tcp_if_include=$subnet.0/24
OMPI_MCA_btl=self,vader,tcp
OMPI_MCA_osc=pt2pt
OMPI_MCA_mpi_yield_when_idle=1
OMPI_MCA_hwloc_base_binding_policy=none
OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
  { echo "TAG=$tag"; echo "NODES=$n"; echo "SUBNET=$subnet.0/24"; } > "$dir/cluster.env"
  [ "$slurm" = slurm ] && start_slurm "$dir" "$n" "$subnet"
  return 0
}

start_slurm() {
  local dir=$1 n=$2 subnet=$3
  command -v slurmctld > /dev/null || skip "slurm-wlm is not installed (make setup installs it)"
  mkdir -p "$dir/munge" "$dir/state" "$dir/tmp" && chown munge:munge "$dir/munge" || die "cannot make $dir/munge"
  chmod 755 "$dir"
  runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" --force || skip "munged does not start"
  local cpus; cpus=$(nproc)
  local mem; mem=$(awk -v n="$n" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=tandemcluster
SlurmctldHost=node1($subnet.2)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/tmp/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
MinJobAge=300
KillWait=5
SchedulerParameters=bf_interval=1,sched_interval=2
NodeName=node[1-$n] NodeAddr=$subnet.[2-$((n + 1))] CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=first Nodes=node1 MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=others Nodes=node[2-$n] MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  echo "SLURM_CONF=$dir/slurm.conf" >> "$dir/cluster.env"
  export SLURM_CONF=$dir/slurm.conf
  for i in $(seq 1 "$n"); do mkdir -p "$dir/spool/node$i" "$dir/tmp/node$i"; done
  ("$0" on "$dir" node1 slurmctld -f "$SLURM_CONF") || skip "slurmctld does not start"
  for i in $(seq 1 "$n"); do ("$0" on "$dir" "node$i" slurmd -f "$SLURM_CONF") || skip "slurmd does not start on node$i"; done
  local state
  for _ in $(seq 1 150); do
    state=$("$0" on "$dir" node1 sinfo -h -o %t 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$state" = "idle " ] && return 0
    case "$state" in *down*) "$0" on "$dir" node1 scontrol update NodeName="node[1-$n]" State=RESUME 2>/dev/null ;; esac
    sleep 0.2
  done
  skip "the nodes never became idle ($state)"
}

down() {
  local dir; dir=$(readlink -f "$1")
  local tag; tag=$(tag_of "$dir")
  local f
  for f in "$dir"/slurmd-node*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 0.5
  for f in "$dir"/slurmd-node*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  # Whatever still runs on a node (a step's leftovers) goes with it.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$tag-"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$dir"
  return 0
}

cmd=${1:-}; shift || true
case "$cmd" in
  up) [ $# -ge 2 ] || die "usage: cluster.sh up DIR N [slurm] [RATE]"; up "$@" ;;
  on)
    [ $# -ge 3 ] || die "usage: cluster.sh on DIR NODE CMD..."
    dir=$(readlink -f "$1"); node=$2; shift 2
    tag=$(tag_of "$dir")
    [ -e "/run/netns/$tag-$node" ] || die "no node $node in $dir"
    slurm_conf=$(sed -n 's/^SLURM_CONF=//p' "$dir/cluster.env")
    [ -n "$slurm_conf" ] && export SLURM_CONF=$slurm_conf
    # Not `ip netns exec` (it remounts /sys, hiding the cgroup filesystem slurmd needs). A mount
    # namespace of the command's own: the cluster's hosts file over /etc/hosts.
    exec nsenter --net="/run/netns/$tag-$node" unshare --uts --mount --propagation private sh -c \
      'hostname "$0"; mount --bind "$1" /etc/hosts; shift; exec "$@"' "$node" "$dir/hosts" "$@" ;;
  mpirun)
    [ $# -ge 1 ] || die "usage: cluster.sh mpirun DIR ARGS..."
    dir=$(readlink -f "$1"); shift
    while IFS= read -r setting; do  # the cluster's Open MPI settings, where the caller set none of its own
      [ -z "$(printenv "${setting%%=*}")" ] && export "${setting?}"
    done < "$dir/mpi.env"
    exec "$0" on "$dir" node1 mpirun "$@" ;;
  down) [ $# -ge 1 ] || die "usage: cluster.sh down DIR"; down "$1" ;;
  *) die "usage: cluster.sh up|on|mpirun|down DIR ..." ;;
esac
