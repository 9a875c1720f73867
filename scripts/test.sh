#!/usr/bin/env bash
# The README's test command: sets gradcomp up (packages, build with warnings as errors) and
# runs the whole suite through ctest (unit, thread-rank, mpirun, PyTorch, launcher tests).
# Arguments go to ctest, e.g. `bash scripts/test.sh -R torch`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh -DGRADCOMP_WERROR=ON
cd "${GRADCOMP_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
