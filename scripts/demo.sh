#!/usr/bin/env bash
# make run: the newest real piece of Tandem on the built-in demo.
# Until `tandem run` lands (issue: the main job), this checks the example job
# configuration and prints its effective form, every default filled in.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "== tandem config -c jobs/example.toml"
"$build/launcher/tandem" config -c jobs/example.toml
