#!/usr/bin/env bash
# The first thing to run: sets the machine up (scripts/setup.sh), builds kiln and runs the quick start.
#
#   scripts/quickstart.sh                 arguments go to scripts/setup.sh (e.g. -DKILN_CUDA=OFF)
#
# KILN_BUILD_DIR picks the build folder (default: build).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${KILN_BUILD_DIR:-build}"
export KILN_BUILD_DIR="$build_dir"

scripts/setup.sh "$@"
program="$build_dir/examples/quickstart/quickstart"
if [[ ! -x "$program" ]]; then
  echo "quickstart.sh: $program was not built (is KILN_BUILD_EXAMPLES off in $build_dir?)" >&2
  exit 1
fi
echo "quickstart.sh: running $program"
exec "$program"
