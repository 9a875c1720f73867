#!/usr/bin/env bash
# The platform our users have: pip's torch in a venv. Makes a venv of the Python first on PATH,
# installs pip's torch into it (pinned: GRADCOMP_TORCH, default 2.13.0; an unpinned torch is a
# CUDA build of several GB), builds gradcomp once as a wheel by its own pip build (build isolation:
# setuptools, pybind11, CMake and ninja from PyPI) and installs that wheel. Then, with the venv's
# python and the installed package:
#   1. the Python suites (ctest with GRADCOMP_TEST_INSTALLED: test/python/CMakeLists.txt);
#   2. Horovod's own PyTorch suite (../shared/horovod-conformance, where it is);
#   3. the quick start's job through the venv's gcrun.
# Then the same wheel goes into a venv of Debian's /usr/bin/python3 (Python 3.11 too) that sees
# Debian's torch 1.13, and the PyTorch suite runs there: one build serves every torch, since the
# native module is not built against torch.
#
#   bash scripts/test_pip_torch.sh [ctest args]        (e.g. -R torch)
#   bash scripts/test_pip_torch.sh --venv-only         the venv with torch and the suites' packages
#
# Everything goes to build-pip/ (GRADCOMP_PIP_DIR): venvs, the wheel, the ctest trees. A venv made
# for the same interpreter, torch and packages is kept (with --venv-only CI makes it behind the
# Debian 12 stage: a minute of pip's unpacking, mostly one core); the wheel is built every time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TORCH=${GRADCOMP_TORCH:-2.13.0}
WORK=${GRADCOMP_PIP_DIR:-$ROOT/build-pip}
PYTHON=${GRADCOMP_VENV_PYTHON:-$(command -v python3)}
# This script's, not gradcomp settings: the jobs it runs would warn of them (the quick start's
# check fails on a warning).
unset GRADCOMP_TORCH GRADCOMP_PIP_DIR GRADCOMP_VENV_PYTHON
venv=$WORK/venv
# What the suites, Horovod's suite and the examples import beyond torch and gradcomp.
TEST_PACKAGES=(numpy pytest scikit-learn matplotlib cloudpickle psutil packaging mock
               lightning==2.6.6 accelerate==1.16.0 transformers==5.25.0)  # test_frameworks.py

# make_venv: the venv of $PYTHON with pip's torch and TEST_PACKAGES, unless one made for them is there.
make_venv() {
  local made_for
  made_for="$("$PYTHON" --version) torch==$TORCH ${TEST_PACKAGES[*]}"
  [ "$(cat "$venv/.made-for" 2>/dev/null)" = "$made_for" ] && return
  rm -rf "$venv"
  mkdir -p "$WORK"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "torch==$TORCH" "${TEST_PACKAGES[@]}"
  echo "$made_for" > "$venv/.made-for"
}
if [ "${1:-}" = "--venv-only" ]; then
  make_venv
  exit 0
fi

bash scripts/install_deps.sh  # the compiler, Open MPI and spdlog the wheel's build needs
make_venv
rm -rf "$WORK/wheel" "$WORK/venv-debian"
"$venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$WORK/wheel" "$ROOT"
wheel=$(ls "$WORK"/wheel/gradcomp-*.whl)
"$venv/bin/python" -m pip uninstall --quiet --yes gradcomp 2>/dev/null || true  # a kept venv has the last run's
"$venv/bin/python" -m pip install --quiet "$wheel"
echo "test_pip_torch: $(basename "$wheel") into a venv of $("$venv/bin/python" --version) with torch" \
     "$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"

# The suites import the installed package: never the clone's sources or a build tree.
cd "$WORK"
where=$("$venv/bin/python" -c "import gradcomp.torch, gradcomp; print(gradcomp.__file__)")
case "$where" in
  "$venv"/*) ;;
  *) echo "test_pip_torch: gradcomp came from $where, not from the venv" >&2; exit 1 ;;
esac

# installed_suites DIR PYTHON [ctest args]: the Python suites, run by PYTHON.
installed_suites() {
  local dir=$1 python=$2
  shift 2
  cmake -S "$ROOT" -B "$dir" -G Ninja -DGRADCOMP_TEST_INSTALLED=ON -DGRADCOMP_PYTHON="$python" > "$dir.cmake.log" ||
    { cat "$dir.cmake.log"; exit 1; }
  (cd "$dir" && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@")
}
# The fault and elastic matrices (PROCESSORS 1 each) spend most of their ~4 minutes waiting out
# detection timeouts and restarts. In one ctest with the 2-rank suites (two slots each) they held
# two of its slots and the others ran one at a time after them; in a ctest of their own beside
# the others, the cores work on the 2-rank suites meanwhile (they must hold on a loaded machine).
waiting='^pytest_(faults|elastic)$'
if [ $# -eq 0 ]; then
  (installed_suites "$WORK/tests-waiting" "$venv/bin/python" -R "$waiting") > "$WORK/tests-waiting.log" 2>&1 &
  waiting_pid=$!
  status=0
  installed_suites "$WORK/tests" "$venv/bin/python" -E "$waiting" || status=$?
  wait "$waiting_pid" || status=1
  echo "test_pip_torch: the fault and elastic matrices ($WORK/tests-waiting.log):"
  cat "$WORK/tests-waiting.log"
  [ "$status" = 0 ] || exit 1
else
  installed_suites "$WORK/tests" "$venv/bin/python" "$@"
fi

if [ -f "$ROOT/../shared/horovod-conformance/run.sh" ]; then
  bash "$ROOT/scripts/check_horovod.sh" "$WORK/horovod-conformance.log" "$venv/bin/python"
else
  echo "test_pip_torch: no ../shared/horovod-conformance here: Horovod's suite not run"
fi

# The quick start's job, with the venv's gcrun and python, from outside the clone.
out=$(PATH="$venv/bin:$PATH" "$venv/bin/gcrun" -np 4 --compression maxmin --bits 4 python \
      "$ROOT/examples/torch_digits.py" 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | tail -n 2
echo "$out" | grep -q "final test accuracy" || { echo "test_pip_torch: the quick start's job did not finish" >&2; exit 1; }
if echo "$out" | grep -i "warning" | grep -v "OMP_NUM_THREADS"; then
  echo "test_pip_torch: the quick start's job printed warnings (above)" >&2
  exit 1
fi

# The same wheel beside Debian's torch 1.13.
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$WORK/venv-debian"
  "$WORK/venv-debian/bin/python" -m pip install --quiet --no-deps --no-index "$wheel"
  echo "test_pip_torch: the same wheel with Debian's $(/usr/bin/python3 --version), torch" \
       "$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
  installed_suites "$WORK/tests-debian" "$WORK/venv-debian/bin/python" -R "^pytest_(torch_np2|torch_versions)$"
fi
