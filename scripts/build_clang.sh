#!/usr/bin/env bash
# Builds everything (library, module, tests, benchmarks) with clang under warnings as errors into
# build-clang/, unoptimized (a minute on two cores): a second compiler catches what GCC lets
# through (a structured binding captured by a lambda, an unused private field). The tests run
# from GCC's builds (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
command -v clang++ >/dev/null || {
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang
}
CC=clang CXX=clang++ cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=None -DGRADCOMP_WERROR=ON \
  -DGRADCOMP_WITH_CUDA=OFF
cmake --build build-clang -j "$(nproc)"
