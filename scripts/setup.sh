#!/usr/bin/env bash
# Sets gradcomp up on this machine: installs the Debian packages it needs, builds it into
# build/, makes `import gradcomp` work for Debian's /usr/bin/python3 (a .pth file pointing at
# build/python) and puts `gcrun` on PATH (/usr/local/bin). The last two need root; without it
# they are skipped with a note, and `PYTHONPATH=build/python` plus `./gcrun` do the same.
#
#   bash scripts/setup.sh [CMake args]           the library and the Python package: what a job runs
#   bash scripts/setup.sh --tests [CMake args]   everything: tests, fuzz replays, benchmarks too
#
# The CUDA path is built where a GPU is (nvidia-smi lists one) or where asked for
# (-DGRADCOMP_WITH_CUDA=ON); --tests builds it wherever the CUDA toolkit is, GPU or not.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

tests=0
if [ "${1:-}" = --tests ]; then
  tests=1
  shift
fi
bash scripts/install_deps.sh
BUILD_DIR=${GRADCOMP_BUILD_DIR:-build}
if [ "$tests" = 1 ]; then
  everything=ON cuda=AUTO targets=()
else
  everything=OFF cuda=OFF targets=(--target gradcomp_python)
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    cuda=AUTO
  fi
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_TESTS="$everything" \
  -DGRADCOMP_BUILD_BENCHMARKS="$everything" -DGRADCOMP_WITH_CUDA="$cuda" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"

if [ "$(id -u)" = 0 ]; then
  site=$(/usr/bin/python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p "$site"
  echo "$ROOT/$BUILD_DIR/python" > "$site/gradcomp.pth"
  ln -sf "$ROOT/gcrun" /usr/local/bin/gcrun
  echo "setup: gradcomp importable by /usr/bin/python3 ($site/gradcomp.pth), gcrun in /usr/local/bin"
else
  echo "setup: not root; use PYTHONPATH=$ROOT/$BUILD_DIR/python and $ROOT/gcrun"
fi
