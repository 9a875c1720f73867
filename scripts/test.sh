#!/usr/bin/env bash
# The README's test command: sets gradcomp up (packages, build with warnings as errors) and
# runs the whole suite through ctest (unit, thread-rank, mpirun, PyTorch, launcher tests).
# Arguments go to ctest, e.g. `bash scripts/test.sh -R torch`.
#
#   bash scripts/test.sh --sanitize address,undefined [--python] [ctest args]
#   bash scripts/test.sh --sanitize thread [--python] [ctest args]
#
# builds with those sanitizers into build-asan-ubsan/ or build-tsan/ and runs the C++ suites
# (unit, thread ranks, mpirun) under them with the suppressions in test/sanitizers/ (each one
# justified there); --python also runs the mpirun Python suites with the sanitizer runtime
# preloaded into Debian's interpreter (under TSan the NumPy ones: see below).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

sanitize=""
python_too=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=${2:?--sanitize needs address,undefined or thread}; shift 2 ;;
    --sanitize=*) sanitize=${1#--sanitize=}; shift ;;
    --python) python_too=1; shift ;;
    *) break ;;
  esac
done

if [ -z "$sanitize" ]; then
  bash scripts/setup.sh --tests -DGRADCOMP_WERROR=ON
  cd "${GRADCOMP_BUILD_DIR:-build}"
  unset GRADCOMP_BUILD_DIR  # this script's, not a gradcomp setting: the suites' jobs would warn of it
  exec ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
fi

case "$sanitize" in
  address,undefined|undefined,address) dir=build-asan-ubsan ;;
  address) dir=build-asan ;;
  undefined) dir=build-ubsan ;;
  thread) dir=build-tsan ;;
  *) echo "test.sh: --sanitize takes address,undefined, address, undefined or thread, not '$sanitize'" >&2; exit 2 ;;
esac
dir=${GRADCOMP_BUILD_DIR:-$dir}
unset GRADCOMP_BUILD_DIR
bash scripts/install_deps.sh
# Benchmarks are left out (nothing runs them here), and the Python module without --python;
# optimized with debug info, so the reports have lines and the suites run at a useful speed.
python_module=OFF
[ "$python_too" = 1 ] && python_module=ON
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADCOMP_WERROR=ON \
  -DGRADCOMP_SANITIZE="$sanitize" -DGRADCOMP_BUILD_BENCHMARKS=OFF -DGRADCOMP_WITH_CUDA=OFF \
  -DGRADCOMP_BUILD_PYTHON="$python_module"
cmake --build "$dir" -j "$(nproc)"

supp="$ROOT/test/sanitizers"
# Every report fails its test: a nonzero exit code, never a warning that scrolls by. ASan's fast
# unwind, but in full for the tests that start MPI (test/CMakeLists.txt).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0:exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=86:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:exitcode=86:second_deadlock_stack=1:history_size=4"

cd "$dir"
labels="cxx"
if [ "$python_too" = 1 ]; then
  # The Python suites run Debian's interpreter with the sanitizer runtime preloaded (the
  # build registers them so). The interpreter, torch and numpy are not instrumented and keep
  # memory until exit by design: leak checking is for the C++ suites.
  labels="cxx|mpi_python"
  export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
  if [ "$sanitize" = thread ]; then
    # torch 1.13 is not built for TSan: its own threads (gloo's, DDP's Reducer, autograd)
    # synchronize through atomics TSan cannot see, so it reports races inside torch that no
    # Open MPI or glibc suppression covers. Under TSan the Python suites are the NumPy ones;
    # the torch suites run under ASan+UBSan (--sanitize address,undefined --python).
    exec ctest --output-on-failure -j "$(nproc)" --timeout 1800 -L "$labels" \
      -E "pytest_(torch|ddp_hook|nonfinite)" "$@"
  fi
fi
exec ctest --output-on-failure -j "$(nproc)" --timeout 1800 -L "$labels" "$@"
