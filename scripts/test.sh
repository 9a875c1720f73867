#!/usr/bin/env bash
# The README's test command: installs what is missing, builds gradcomp (warnings are errors)
# and runs the whole suite through ctest (unit, thread-rank and mpirun tests).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
BUILD_DIR=${GRADCOMP_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_WERROR=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
