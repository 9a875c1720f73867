#!/usr/bin/env bash
# Training step benchmark (step_bench.py) on an emulated cluster (scripts/cluster.sh: one network
# and UTS namespace per node, tc-shaped links, Open MPI over TCP, --bind-to none). Every variant
# of every model runs in the same session, so the rows compare like with like.
#
#   sudo bash examples/benchmarks/step_cluster.sh [--rate 1gbit] [--nodes 2] [--ranks-per-node 1]
#        [--models mlp,resnet20,resnet18,gpt2] [--variants LIST] [--steps 8] [--warmup 3]
#        [--hierarchical] [--queue 20ms] [--no-ingress] [--auto-interval 3] [--interleave]
#        [--batch-size N] [--out build/steps]
#
# Appends one JSON record per (model, variant) to OUT/steps.jsonl and prints each model's
# table. The runtime's compression setting is maxmin 4 bits (what the backend4 row uses); the
# DistributedOptimizer rows pass their compression explicitly. GRADCOMP_* variables in the
# environment are passed to every rank; GRADCOMP_PYTHON picks the ranks' interpreter (default
# Debian's /usr/bin/python3; a venv's python runs pip's torch).
set -euo pipefail

RATE=1gbit NODES=2 RPN=1 MODELS=mlp,resnet20,resnet18,gpt2 VARIANTS="" STEPS=8 WARMUP=3 HIER=0 OUT="" AUTO=3
INTERLEAVE=() BATCH=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --hierarchical) HIER=1; shift ;;
    --queue) export CLUSTER_QUEUE=$2; shift 2 ;;
    --no-ingress) export CLUSTER_INGRESS=0; shift ;;
    --auto-interval) AUTO=$2; shift 2 ;;
    --interleave) INTERLEAVE=(--interleave); shift ;;  # step_bench.py --interleave
    --batch-size) BATCH=(--batch-size "$2"); shift 2 ;;  # per rank (default: each model's own)
    --out) OUT=$2; shift 2 ;;
    *) echo "step_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ "$RPN" -ge 1 ] || { echo "step_cluster: --ranks-per-node must be >= 1, got $RPN" >&2; exit 2; }

source "$(dirname "$0")/../../scripts/cluster.sh"
cluster_benchmark step_cluster steps
cluster_session gcs "$NODES" "$RATE" "$RPN"
NP=$((NODES * RPN))
SHAPING="queue ${CLUSTER_QUEUE:-20ms}, $([ "${CLUSTER_INGRESS:-1}" = 1 ] && echo both ways || echo egress only)"
LINK="$RATE ($SHAPING), $NODES nodes x $RPN"
[ "$HIER" = 1 ] && LINK="$LINK, hierarchical"
echo "step benchmark: $LINK"

ENVS=(-x GRADCOMP_HIERARCHICAL="$HIER" -x GRADCOMP_COMPRESSION=maxmin -x GRADCOMP_BITS=4
      -x MASTER_ADDR="$CLUSTER_SUBNET.11" -x GLOO_SOCKET_IFNAME=eth0 -x PYTHONPATH="$BUILD/python")
for var in $(env | grep -o '^GRADCOMP_[A-Z0-9_]*' | grep -v -E '^GRADCOMP_(HIERARCHICAL|COMPRESSION|BITS)$' || true); do
  ENVS+=(-x "$var")
done
port=29600
bench() {  # bench MODEL VARIANTS
  port=$((port + 1))
  "${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_SLOTS" -np "$NP" "${ENVS[@]}" -x MASTER_PORT=$port \
    "$PY" "$ROOT/examples/benchmarks/step_bench.py" --model "$1" --steps "$STEPS" --warmup "$WARMUP" --auto-interval "$AUTO" \
    "${INTERLEAVE[@]}" "${BATCH[@]}" --variants "$2" --link "$LINK" --json "$OUT/steps.jsonl" 2>&1 | grep --line-buffered -v '\[warning\]' | tee -a "$OUT/steps.txt"
}
ALL=$(PYTHONPATH="$BUILD/python" "$PY" "$ROOT/examples/benchmarks/step_bench.py" --list-variants)
for model in ${MODELS//,/ }; do
  if [ -n "$VARIANTS" ]; then
    bench "$model" "$VARIANTS"
    continue
  fi
  # torch's PowerSGD hook can abort the whole job inside gloo (step_bench.py, build()): apart.
  bench "$model" "$(echo "$ALL" | tr ',' '\n' | grep -v '^ddp_powersgd$' | paste -sd,)"
  bench "$model" ddp_powersgd || echo "step_cluster: torch's PowerSGD hook failed on $model (see above)" |
    tee -a "$OUT/steps.txt"
done
