#!/usr/bin/env bash
# The first thing to run: sets the machine up (scripts/setup.sh), builds the kiln library and the quick start
# program, and runs it. scripts/test.sh builds everything else (the tests, benchmarks, examples).
#
#   scripts/quickstart.sh                 arguments go to scripts/setup.sh (e.g. -DKILN_CUDA=OFF)
#
# KILN_BUILD_DIR picks the build folder (default: build).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${KILN_BUILD_DIR:-build}"
export KILN_BUILD_DIR="$build_dir"

# Only what the quick start needs: the library and the program (no tests, benchmarks or test-only packages;
# scripts/test.sh builds and installs the rest).
echo "quickstart.sh: installing what is missing, then building the kiln library and the quick start program:" \
  "about 8 minutes on a 2-core machine the first time (much less with a warm compiler cache)"
scripts/setup.sh --no-test-deps --target quickstart "$@"
program="$build_dir/examples/quickstart/quickstart"
if [[ ! -x "$program" ]]; then
  echo "quickstart.sh: $program was not built (is KILN_BUILD_EXAMPLES off in $build_dir?)" >&2
  exit 1
fi
echo "quickstart.sh: running $program"
exec "$program"
