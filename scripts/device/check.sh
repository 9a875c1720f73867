#!/usr/bin/env bash
# The GPU checks, in one call of a GPU machine that has CUDA, CMake, ninja and Python with torch
# but no MPI, spdlog, fmt or GoogleTest (the `device` tool's machine):
#
#   here:  bash scripts/device/fetch_deps.sh          (once: the Debian packages into .device/)
#   there: bash scripts/device/check.sh               (device run, carry [".device"], timeout 600)
#
# It unpacks the carried packages into a prefix of their own, builds the CUDA path (kernels for
# the GPU present, NCCL from the CUDA toolkit or from torch's nvidia-nccl wheel), then, most
# needed first, each step under its own time limit so that one stuck step leaves the rest to run:
#   1. codec_profile --device cuda (the GPU's codec times, for simulate.py --codec-profile: the
#      one input the scale simulation's codec-included targets lack);
#   2. the GPU tests: test_cuda_codecs and test_cuda_device (every kernel writes the CPU's bytes),
#      test_nccl_communicator at -np 1, test_runtime_device;
#   3. gradcomp.torch on CUDA tensors, 2 ranks (when the interpreter has the headers to build it):
#      allreduce against the exact average, then training steps through every adapter, the
#      backend's send/recv and Adasum of GPU tensors (torch_training_check.py);
#   4. cuda_codec_bench (the kernels against the device's copy bandwidth);
#   5. compute-sanitizer memcheck and racecheck on the kernels.
# Logs and results go to $OUT (the device tool's; /tmp/gradcomp-device-out elsewhere), at most
# 8 files: summary.txt says what passed. Without a GPU it builds and stops (a dry run).
# STEPS="build profile tests python bench sanitize" chooses steps; CUDA_ARCH the kernels' target.
# A task is lent 15 device minutes in all, a machine's start included, and a machine stays warm
# only ~30 s after a call: plan on one call, `bash scripts/device/check.sh` with timeout_s 590.
# The steps run most needed first, so a call cut short loses the last ones (the sanitizers);
# every step that ran has its line in summary.txt even then. What did not run waits for the
# next task lent a GPU (STEPS= the missing steps, with build first).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gradcomp-device-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build profile tests python bench sanitize}
BUILD=${BUILD_DIR:-build-device}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# Runs "$@" under `timeout SECONDS`, output appended to log FILE, and notes the outcome as NAME.
step() {
  local name=$1 seconds=$2 log=$3
  shift 3
  local t0=$SECONDS
  echo "===== $name: $*" >>"$log"
  timeout --kill-after=10 "$seconds" "$@" >>"$log" 2>&1
  local rc=$?
  local verdict=passed
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="TIMED OUT after ${seconds} s"; elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"; fi
  note "$name: $verdict in $((SECONDS - t0)) s (log: $(basename "$log"))"
  return $rc
}

note "gradcomp device check, $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
note "GPU: ${GPU:-none}; nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none); cores: $(nproc)"

# The carried Debian packages, in a prefix of their own; Open MPI relocated there (OPAL_PREFIX).
CMAKE_ARGS=()
if ls .device/debs/*.deb >/dev/null 2>&1; then
  DEPS=/tmp/gradcomp-deps
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for f in .device/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  export OPAL_PREFIX=$DEPS/usr
  export PATH=$DEPS/usr/bin:$PATH
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  CMAKE_ARGS+=(-DMPI_C_COMPILER="$DEPS/usr/bin/mpicc.openmpi" -DMPIEXEC_EXECUTABLE="$DEPS/usr/bin/mpirun.openmpi")
  PREFIX_PATH="$DEPS/usr"
  note "carried packages: $(ls .device/debs/*.deb | wc -l) unpacked into $DEPS"
else
  PREFIX_PATH=""
  note "no .device/debs (scripts/device/fetch_deps.sh): MPI, spdlog, fmt and GoogleTest from the system"
fi
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun || echo mpirun)
# Open MPI as root; shared memory without cross-memory attach (containers often forbid it).
MPIRUN_ARGS=(--allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)

# NCCL: the toolkit's, else torch's wheel (nvidia-nccl-*: libnccl.so.2 only, so a link is made).
if [ -z "${NCCL_HOME:-}" ] && ! ls /usr/local/cuda/lib64/libnccl.so* >/dev/null 2>&1; then
  wheel=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
    export NCCL_HOME=/tmp/gradcomp-nccl
    mkdir -p $NCCL_HOME/lib
    ln -sfn "$wheel/include" $NCCL_HOME/include
    ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -1)" $NCCL_HOME/lib/libnccl.so
    export LD_LIBRARY_PATH=$wheel/lib:$LD_LIBRARY_PATH
  fi
fi
note "NCCL: ${NCCL_HOME:-from the CUDA toolkit}"

# The Python module when the interpreter has its headers (pybind11: its pip package, or carried).
PYTHON=$(command -v python3)
TARGETS=(gradcomp test_cuda_codecs test_cuda_device test_nccl_communicator test_runtime_device codec_profile
         cuda_codec_bench)
if "$PYTHON" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
  PYBIND=$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null || true)
  PREFIX_PATH="$PREFIX_PATH${PYBIND:+;$PYBIND}"
  CMAKE_ARGS+=(-DGRADCOMP_PYTHON="$PYTHON")
  TARGETS+=(gradcomp_python)
  HAVE_PYTHON=1
else
  CMAKE_ARGS+=(-DGRADCOMP_BUILD_PYTHON=OFF)
  HAVE_PYTHON=0
  note "python: $PYTHON has no Python.h: the module is not built"
fi
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}
ARCH=${ARCH:-90}

if want build; then
  step configure 90 "$OUT/build.log" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGRADCOMP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGRADCOMP_CUDA_EMULATION=OFF \
    -DGRADCOMP_GPU_TESTS=ON -DCMAKE_PREFIX_PATH="$PREFIX_PATH" "${CMAKE_ARGS[@]}" || exit 1
  grep -E "gradcomp: build type|MPI_C_LIB|Found MPI" "$OUT/build.log" | tee -a "$SUMMARY"
  step build 300 "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" || exit 1
fi
if [ -z "$GPU" ]; then
  note "no GPU here: built only (a dry run)"
  exit 0
fi

if want profile; then
  step codec_profile 90 "$OUT/profile.log" "$BUILD/examples/codec_profile" --device cuda \
    --out "$OUT/gpu_codec_profile.txt"
fi
if want tests; then
  LOG=$OUT/tests.log
  step test_cuda_codecs 120 "$LOG" "$BUILD/test/test_cuda_codecs"
  step test_cuda_device 60 "$LOG" "$BUILD/test/test_cuda_device"
  step test_nccl_communicator 60 "$LOG" "$MPIRUN" "${MPIRUN_ARGS[@]}" -np 1 "$BUILD/test/test_nccl_communicator"
  step test_runtime_device 120 "$LOG" "$MPIRUN" "${MPIRUN_ARGS[@]}" -np 1 "$BUILD/test/test_runtime_device"
fi
if want python && [ $HAVE_PYTHON = 1 ]; then
  # Two ranks on the one GPU: gradcomp.torch's allreduce of CUDA tensors (the CUDA codecs, MPI
  # between the ranks), uncompressed, fp16 and 4-bit, against the exact average.
  cat >/tmp/gradcomp-torch-cuda.py <<'PY'
import torch, gradcomp.torch as hvd
hvd.init()
print('rank', hvd.rank(), 'cuda_built', hvd.cuda_built(), 'nccl_built', hvd.nccl_built(), flush=True)
def data(rank):
    return torch.randn(1 << 22, generator=torch.Generator().manual_seed(rank)).cuda()
exact = sum(data(r) for r in range(hvd.size())) / hvd.size()
for name, c, tol in (('none', hvd.Compression.none, 1e-6), ('fp16', hvd.Compression.fp16, 1e-2),
                     ('maxmin4', hvd.Compression.maxmin(bits=4), 0.35)):
    y = hvd.allreduce(data(hvd.rank()), name='x_' + name, compression=c)
    err = ((y - exact).norm() / exact.norm()).item()
    print('rank', hvd.rank(), name, 'on', y.device, 'relative L2 error', err, flush=True)
    assert y.is_cuda and err < tol, (name, err)
print('rank', hvd.rank(), 'allreduce of CUDA tensors: ok', flush=True)
PY
  step torch_cuda_allreduce 90 "$OUT/python.log" env PYTHONPATH="$BUILD/python" "$MPIRUN" "${MPIRUN_ARGS[@]}" \
    -np 2 -x PYTHONPATH -x LD_LIBRARY_PATH -x OPAL_PREFIX "$PYTHON" /tmp/gradcomp-torch-cuda.py
  # Training steps through each adapter on this torch (2.x here): DistributedOptimizer, DDP on
  # backend gradcomp, ddp_hook; uncompressed must equal one process on the whole batch.
  step torch_cuda_training 150 "$OUT/python.log" env PYTHONPATH="$BUILD/python" "$MPIRUN" "${MPIRUN_ARGS[@]}" \
    -np 2 -x PYTHONPATH -x LD_LIBRARY_PATH -x OPAL_PREFIX "$PYTHON" scripts/device/torch_training_check.py
fi
if want bench; then
  step cuda_codec_bench 60 "$OUT/bench.log" "$BUILD/examples/cuda_codec_bench"
fi
if want sanitize; then
  LOG=$OUT/sanitizer.log
  step memcheck 180 "$LOG" compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/test/test_cuda_codecs" --gtest_brief=1
  step racecheck 180 "$LOG" compute-sanitizer --tool racecheck --error-exitcode 3 "$BUILD/test/test_cuda_codecs" --gtest_brief=1
fi
note "done in $SECONDS s"
