#!/usr/bin/env bash
# FSDP step benchmark (fsdp_step_bench.py) on an emulated cluster (scripts/cluster.sh: one network
# and UTS namespace per node, tc-shaped links, Open MPI over TCP, --bind-to none). FSDP (--fsdp 1,
# the default) needs torch 2: the Debian 13 root's, or pip's; FSDP2 (--fsdp 2) torch 2.9 or newer:
# pip's, in a venv (GRADCOMP_PYTHON=that venv's python).
#
#   bash scripts/debian13.sh run bash examples/benchmarks/fsdp_cluster.sh [--rate 1gbit] [--nodes 2]
#        [--ranks-per-node 1] [--rounds 2] [--variants compute,gloo,gc_none,gc_w8,gc_g4,gc_w8g4]
#        [--steps 8] [--warmup 3] [--queue 20ms] [--no-ingress] [--out build/fsdp]
#   GRADCOMP_PYTHON=venv/bin/python bash examples/benchmarks/fsdp_cluster.sh --fsdp 2 [--hsdp] [...]
#
# --hsdp (FSDP2): HSDP with one replica a node (each node's ranks shard the model; the replicas'
# all-reduce alone crosses nodes).
#
# One job a variant (the compression settings are read when the runtime starts), every variant in
# turn, --rounds times over, in one cluster session: rounds put the machine's drift on every
# variant alike. Appends one JSON record a job to OUT/fsdp.jsonl and prints the table of this
# run's records (medians over the rounds).
set -euo pipefail

RATE=1gbit NODES=2 RPN=1 ROUNDS=2 VARIANTS=compute,gloo,gc_none,gc_w8,gc_g4,gc_w8g4 STEPS=8 WARMUP=3 OUT="" FSDP=1
REPLICAS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --fsdp) FSDP=$2; shift 2 ;;
    --hsdp) REPLICAS=hsdp; shift ;;
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --queue) export CLUSTER_QUEUE=$2; shift 2 ;;
    --no-ingress) export CLUSTER_INGRESS=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "fsdp_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ "$RPN" -ge 1 ] || { echo "fsdp_cluster: --ranks-per-node must be >= 1, got $RPN" >&2; exit 2; }
if [ "$REPLICAS" = hsdp ]; then
  [ "$FSDP" = 2 ] || { echo "fsdp_cluster: --hsdp is FSDP2's (--fsdp 2)" >&2; exit 2; }
  REPLICAS=$NODES
fi

source "$(dirname "$0")/../../scripts/cluster.sh"
cluster_benchmark fsdp_cluster fsdp
if [ "$FSDP" = 2 ]; then
  "$PY" -c "from torch.distributed.fsdp import FSDPModule; FSDPModule.set_custom_reduce_scatter" 2>/dev/null ||
    { echo "fsdp_cluster: $PY has no torch with FSDP2's custom collectives (2.9 or newer: pip's, GRADCOMP_PYTHON=)" >&2; exit 2; }
else
  "$PY" -c "import torch.distributed.fsdp, sys; sys.exit(int(torch.__version__.split('.')[0]) < 2)" 2>/dev/null ||
    { echo "fsdp_cluster: $PY has no torch 2 (run it in the Debian 13 root: bash scripts/debian13.sh run ...)" >&2; exit 2; }
fi

cluster_session gcf "$NODES" "$RATE" "$RPN"
SHAPING="queue ${CLUSTER_QUEUE:-20ms}, $([ "${CLUSTER_INGRESS:-1}" = 1 ] && echo both ways || echo egress only)"

ENVS=(-x MASTER_ADDR="$CLUSTER_SUBNET.11" -x GLOO_SOCKET_IFNAME=eth0 -x USE_LIBUV=0 -x OMP_NUM_THREADS=1
      -x PYTHONPATH="$BUILD/python")
# Debian's torch calls whatever libblas.so.3 is: the reference BLAS multiplies ~25x slower than
# OpenBLAS, which would leave a GPU-less rank's compute far larger than a GPU's against the same
# link. The ranks load OpenBLAS (one thread each) where libopenblas0-pthread is installed.
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ -e "$OPENBLAS/libblas.so.3" ]; then
  ENVS+=(-x LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" -x OPENBLAS_NUM_THREADS=1)
  BLAS=OpenBLAS
else
  BLAS="reference BLAS"
  echo "fsdp_cluster: no OpenBLAS ($OPENBLAS): compute will dwarf the link (apt-get install libopenblas0-pthread)" >&2
fi
LINK="$RATE ($SHAPING), $NODES nodes x $RPN, $BLAS, $(date -u +%FT%TZ)"
echo "FSDP step benchmark: $LINK"
# GRADCOMP_* variables in the environment reach every rank (the variant's own settings win).
for var in $(env | grep -o '^GRADCOMP_[A-Z0-9_]*' | grep -v -E '^GRADCOMP_(BUILD_DIR|PYTHON)$' || true); do
  ENVS+=(-x "$var")
done
port=29700
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round of $ROUNDS"
  for variant in ${VARIANTS//,/ }; do
    port=$((port + 1))
    "${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_SLOTS" -np $((NODES * RPN)) "${ENVS[@]}" -x MASTER_PORT=$port \
      "$PY" "$ROOT/examples/benchmarks/fsdp_step_bench.py" --fsdp "$FSDP" --replicas "$REPLICAS" --variant "$variant" \
      --steps "$STEPS" --warmup "$WARMUP" \
      --link "$LINK" --json "$OUT/fsdp.jsonl" 2>&1 | grep --line-buffered -v -E '\[warning\]|\[c10d\] The hostname of the client socket' | tee -a "$OUT/fsdp.txt"
  done
done
PYTHONPATH="$BUILD/python" "$PY" "$ROOT/examples/benchmarks/fsdp_step_bench.py" --table "$OUT/fsdp.jsonl" --link "$LINK" --fsdp "$FSDP" | tee -a "$OUT/fsdp.txt"
