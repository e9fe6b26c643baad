#!/usr/bin/env bash
# KV transfer bandwidth between two nodes of the test cluster (two network
# namespaces joined over veth: real TCP, no shared memory): the MPI RMA
# (osc/pt2pt over TCP), two-sided MPI and libfabric transports against the raw
# TCP link, in one run (kv_link_bench). The cluster is made and removed here.
#   perf/cluster_bench.sh [BUILD_DIR] [MAX_MIB] [PROVIDER] [RATE]
# RATE caps each node's link (tc tbf, e.g. 1gbit); default: uncapped.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(readlink -f "${1:-$here/../build}")
max=${2:-256}
provider=${3:-"tcp;ofi_rxm"}
rate=${4:-}
dir=$(mktemp -d /tmp/tandem-bench-cluster.XXXXXX)
trap '"$here/../tests/cluster/cluster.sh" down "$dir"' EXIT
"$here/../tests/cluster/cluster.sh" up "$dir" 2 "" "$rate" || exit $?
"$here/../tests/cluster/cluster.sh" mpirun "$dir" -np 2 --map-by node "$build/perf/kv_link_bench" "$max" "$provider"
