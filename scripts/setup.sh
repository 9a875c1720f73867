#!/usr/bin/env bash
# Sets gradcomp up on this machine: installs the Debian packages it needs, builds it into
# build/ (extra arguments go to CMake), makes `import gradcomp` work for Debian's
# /usr/bin/python3 (a .pth file pointing at build/python) and puts `gcrun` on PATH
# (/usr/local/bin). The last two need root; without it they are skipped with a note, and
# `PYTHONPATH=build/python` plus `./gcrun` do the same.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

bash scripts/install_deps.sh
BUILD_DIR=${GRADCOMP_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"

if [ "$(id -u)" = 0 ]; then
  site=$(/usr/bin/python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p "$site"
  echo "$ROOT/$BUILD_DIR/python" > "$site/gradcomp.pth"
  ln -sf "$ROOT/gcrun" /usr/local/bin/gcrun
  echo "setup: gradcomp importable by /usr/bin/python3 ($site/gradcomp.pth), gcrun in /usr/local/bin"
else
  echo "setup: not root; use PYTHONPATH=$ROOT/$BUILD_DIR/python and $ROOT/gcrun"
fi
