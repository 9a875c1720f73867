#!/usr/bin/env bash
# Horovod's own PyTorch suite (../shared/horovod-conformance/run.sh) against gradcomp.torch, with
# test/horovod/optimizers_compat.py (its optimizer sweep without torch 2.9's Muon, which takes 2-D
# parameters only); passes when it shows 82 passed, 9 skipped.
#
#   bash scripts/check_horovod.sh LOG [PYTHON]
#
# PYTHON: an interpreter with gradcomp installed (a venv's); without it, Debian's /usr/bin/python3
# with the package in build/python (run.sh's defaults). The whole output goes to LOG.
set -euo pipefail
# LOG and PYTHON as the caller names them (made absolute, a venv's python left unresolved).
absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
log=$(absolute "$1")
python=${2:+$(absolute "$2")}
cd "$(dirname "$0")/.."
suite=../shared/horovod-conformance/run.sh
[ -f "$suite" ] || { echo "check_horovod: Horovod's suite is not in ../shared/horovod-conformance" >&2; exit 2; }
status=0
if [ -n "$python" ]; then
  export PY=$python
fi
PYTHONPATH="$PWD/test/horovod" bash "$suite" -p optimizers_compat > "$log" 2>&1 || status=$?
tail -n 3 "$log"
[ "$status" = 0 ] && grep -q "^82 passed, 9 skipped" "$log" ||
  { echo "check_horovod: Horovod's suite did not pass 82 tests (exit $status; $log)" >&2; exit 1; }
