#!/usr/bin/env bash
# Low-communication training side by side (examples/torch_diloco_charlm.py) on an emulated
# cluster (scripts/cluster.sh: one network and UTS namespace per node, tc-shaped links, Open MPI
# over TCP): DDP on gloo, gradcomp's 4-bit DDP, DiLoCo (exact and 4-bit), Streaming DiLoCo and
# torchft's DiLoCo (torchft50: torchft_diloco_charlm.py; needs `pip install torchft` and torch 2.7
# or newer in GRADCOMP_PYTHON's environment), one job each, in one cluster session. Prints the
# table of diloco_table.py: validation loss against wall time, the time each run took to reach
# DDP on gloo's final loss, bytes a step.
#
# DDP runs take --steps steps; DiLoCo's, which cost a fraction of the time a step, --diloco-steps
# (default twice as many), so the table shows which reaches DDP on gloo's loss first.
#
#   sudo bash examples/benchmarks/diloco_cluster.sh [--rate 100mbit] [--nodes 4] [--steps 600] [--diloco-steps 1200]
#        [--variants gloo,ddp4,diloco10,diloco10_4,diloco50,diloco50_4,streaming,torchft50] [--out build/diloco]
#        [-- extra flags for torch_diloco_charlm.py]
#
# GRADCOMP_PYTHON picks the interpreter (default /usr/bin/python3), GRADCOMP_BUILD_DIR the build.
set -euo pipefail

RATE=100mbit NODES=4 STEPS=600 LOCAL_STEPS="" OUT=""
VARIANTS=gloo,ddp4,diloco10,diloco10_4,diloco50,diloco50_4,streaming,torchft50
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --diloco-steps) LOCAL_STEPS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "diloco_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done

source "$(dirname "$0")/../../scripts/cluster.sh"
cluster_benchmark diloco_cluster diloco
RECORDS="$OUT/diloco-$RATE-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
cluster_session gcd "$NODES" "$RATE" 1
LINK="$RATE links, $NODES nodes x 1 rank, $(date -u +%FT%TZ), $("$PY" -c 'import torch; print("torch", torch.__version__)')"
echo "DiLoCo side by side: $LINK"

ENVS=(-x MASTER_ADDR="$CLUSTER_SUBNET.11" -x GLOO_SOCKET_IFNAME=eth0 -x USE_LIBUV=0 -x OMP_NUM_THREADS=1
      -x PYTHONPATH="$BUILD/python")
variant() {  # variant NAME: the example's flags and settings for that run
  case "$1" in
    gloo) echo "--mode ddp --backend gloo" ;;
    ddp4) echo "--mode ddp -x GRADCOMP_COMPRESSION=maxmin -x GRADCOMP_BITS=4" ;;
    diloco10) echo "--sync-every 10" ;;
    diloco10_4) echo "--sync-every 10 --bits 4" ;;
    diloco50) echo "--sync-every 50" ;;
    diloco50_4) echo "--sync-every 50 --bits 4" ;;
    streaming) echo "--sync-every 50 --fragments 5 --delay 2 --bits 4" ;;
    torchft50) echo "--sync-every 50" ;;
    *) echo "diloco_cluster: unknown variant $1" >&2; exit 2 ;;
  esac
}
port=29800
for name in ${VARIANTS//,/ }; do
  port=$((port + 1))
  flags=() settings=()
  read -r -a words <<< "$(variant "$name")"
  while [ ${#words[@]} -gt 0 ]; do
    if [ "${words[0]}" = -x ]; then settings+=(-x "${words[1]}"); words=("${words[@]:2}")
    else flags+=("${words[0]}"); words=("${words[@]:1}"); fi
  done
  script=$ROOT/examples/torch_diloco_charlm.py
  steps=${LOCAL_STEPS:-$((2 * STEPS))}
  case "$name" in
    gloo|ddp*) steps=$STEPS ;;
    torchft*) script=$ROOT/examples/benchmarks/torchft_diloco_charlm.py ;;
  esac
  echo "== $name"
  "${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_SLOTS" -np "$NODES" "${ENVS[@]}" "${settings[@]}" -x MASTER_PORT=$port \
    "$PY" "$script" --steps "$steps" "${flags[@]}" "${EXTRA[@]}" 2>&1 |
    grep --line-buffered -v -E '\[warning\]|\[c10d\] The hostname of the client socket' | tee "$OUT/$name.log" |
    grep --line-buffered -v '^RESULT ' || true
  cat "$OUT/$name.log" >> "$OUT/diloco.txt"
  grep '^RESULT ' "$OUT/$name.log" | sed 's/^RESULT //' >> "$RECORDS" ||
    echo "diloco_cluster: $name printed no RESULT (its log: $OUT/$name.log)" >&2
done
"$PY" "$ROOT/examples/benchmarks/diloco_table.py" "$RECORDS" --link "$LINK" | tee -a "$OUT/diloco.txt"
