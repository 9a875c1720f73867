#!/usr/bin/env bash
# `pip install .` into a user's own environment, as ML users keep torch: a venv that sees the
# system's torch (--system-site-packages), offline (--no-build-isolation: CMake, pybind11 and the
# compiler come from the system). Then gcrun from that venv trains the digits example on 2 ranks
# with the venv's python, from outside the clone, and the package it imports is the installed one.
#   bash scripts/check_pip_install.sh [VENV_DIR]      (default: a new temporary directory)
# The venv is made from Debian's /usr/bin/python3 (the interpreter with torch), or $PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
venv=${1:-$(mktemp -d)/venv}
rm -rf "$venv"
"${PYTHON:-/usr/bin/python3}" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --no-build-isolation --no-index --quiet "$ROOT"
cd "$(dirname "$venv")"
where=$("$venv/bin/python" -c "import gradcomp.torch, gradcomp; print(gradcomp.__file__)")
case "$where" in
  "$venv"/*) echo "check_pip_install: gradcomp imported from $where" ;;
  *) echo "check_pip_install: gradcomp came from $where, not from the venv $venv" >&2; exit 1 ;;
esac
[ "$(command -v "$venv/bin/gcrun")" = "$venv/bin/gcrun" ] || { echo "check_pip_install: no gcrun in $venv/bin" >&2; exit 1; }
out=$(PATH="$venv/bin:$PATH" "$venv/bin/gcrun" -np 2 --compression maxmin --bits 4 python \
      "$ROOT/examples/torch_digits.py" --epochs 1 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | tail -3
echo "$out" | grep -q "final test accuracy" || { echo "check_pip_install: the job did not finish" >&2; exit 1; }
