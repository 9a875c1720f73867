#!/usr/bin/env bash
# Compressed allreduce on an emulated cluster (scripts/cluster.sh: one network and UTS
# namespace per node, a tc rate limit on every node's link, Open MPI over TCP, mpirun in a
# head namespace). Everything is torn down on exit, also on failure or Ctrl-C.
#
#   sudo bash examples/benchmarks/emulated_cluster.sh [--rate 1gbit] [--nodes 2] [--ranks-per-node 1]
#        [--sizes-mb 1,4,16,64,256] [--reps 3] [--variants mpi,none,fp16,maxmin8,maxmin4,maxmin2,topk1]
#        [--hierarchical] [--no-gloo] [--queue 20ms] [--no-ingress] [--out build/cluster]
# GRADCOMP_* variables in the environment are passed to every rank; GRADCOMP_PYTHON (default
# /usr/bin/python3) runs gloo's side and the plot. --queue sets how much the
# link shaper's queue holds; --no-ingress shapes only each node's egress (default: both ways).
#
# Runs, in the same session: gradcomp none / fp16 / maxmin 8 / 4 / 2 bits / topk 1%, raw
# MPI_Allreduce and torch.distributed gloo allreduce; prints time, effective bandwidth, speedup
# over MPI and percent of the link-bound ideal, and writes a plot (cluster.png).
set -euo pipefail

RATE=1gbit NODES=2 RPN=1 SIZES=1,4,16,64,256 REPS=3 HIER=0 GLOO=1 OUT="" VARIANTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --sizes-mb) SIZES=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --hierarchical) HIER=1; shift ;;
    --no-gloo) GLOO=0; shift ;;
    --queue) export CLUSTER_QUEUE=$2; shift 2 ;;
    --no-ingress) export CLUSTER_INGRESS=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "emulated_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ "$NODES" -ge 2 ] && [ "$NODES" -le 8 ] || { echo "emulated_cluster: --nodes must be 2..8, got $NODES" >&2; exit 2; }
[ "$RPN" -ge 1 ] || { echo "emulated_cluster: --ranks-per-node must be >= 1, got $RPN" >&2; exit 2; }
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null || { echo "emulated_cluster: $tool not found (run scripts/install_deps.sh)" >&2; exit 2; }
done

source "$(dirname "$0")/../../scripts/cluster.sh"
cluster_benchmark emulated_cluster cluster examples/compressed_bench
BENCH=$BUILD/examples/compressed_bench

# ---- the cluster (scripts/cluster.sh) -----------------------------------------------------
cluster_session gcb "$NODES" "$RATE" "$RPN"
NP=$((NODES * RPN))
MPIRUN=("${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_SLOTS" -np "$NP")
echo "emulated cluster: $NODES nodes x $RPN ranks, links of $RATE (queue ${CLUSTER_QUEUE:-20ms}, $([ "${CLUSTER_INGRESS:-1}" = 1 ] && echo "both directions" || echo "egress only") shaped), sizes $SIZES MB"

# ---- gradcomp and MPI_Allreduce -----------------------------------------------------------
ENVS=(-x GRADCOMP_HIERARCHICAL="$HIER")
for var in $(env | grep -o '^GRADCOMP_[A-Z0-9_]*' | grep -v '^GRADCOMP_HIERARCHICAL$' || true); do ENVS+=(-x "$var"); done
"${MPIRUN[@]}" "${ENVS[@]}" "$BENCH" --sizes-mb "$SIZES" --reps "$REPS" ${VARIANTS:+--variants "$VARIANTS"} \
  | tee "$OUT/results.txt"

# ---- torch.distributed gloo ---------------------------------------------------------------
if [ "$GLOO" = 1 ]; then
  "${MPIRUN[@]}" -x MASTER_ADDR="$CLUSTER_SUBNET.11" -x MASTER_PORT=29511 -x GLOO_SOCKET_IFNAME=eth0 \
    "$PY" "$ROOT/examples/benchmarks/gloo_allreduce.py" --sizes-mb "$SIZES" --reps "$REPS" \
    | tee -a "$OUT/results.txt"
fi

"$PY" "$ROOT/examples/benchmarks/plot_cluster.py" "$OUT/results.txt" --rate "$RATE" --ranks "$NP" \
  --ranks-per-node "$RPN" --png "$OUT/cluster.png"
