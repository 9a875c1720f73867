#!/usr/bin/env bash
# The same jobs started two ways on one emulated cluster (scripts/cluster.sh: a network and UTS
# namespace per node, tc-shaped links): by mpirun (MPI's world), and by torchrun on every node
# with its c10d rendezvous and no MPI (a world connected through torch's store: TCP between the
# nodes, POSIX shared memory inside them). Rounds alternate the launchers, so a drift of the
# machine falls on both alike. Jobs: the 64 MB 4-bit allreduce (launch_bench.py) and the 25M-
# parameter MLP's training step with 4-bit gradients (step_bench.py --variants gc_maxmin4).
#
#   sudo GRADCOMP_PYTHON=venv/bin/python bash examples/benchmarks/launcher_cluster.sh
#        [--rate 1gbit] [--nodes 2] [--ranks-per-node 2] [--rounds 2] [--reps 5] [--steps 8] [--out build/launchers]
#
# GRADCOMP_PYTHON: a Python with torch (default /usr/bin/python3) that imports the build's
# package. Prints each job's figure per launcher and round, then a table of medians and ratios.
set -euo pipefail

RATE=1gbit NODES=2 RPN=2 ROUNDS=2 REPS=5 STEPS=8 OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "launcher_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/../../scripts/cluster.sh"
cluster_benchmark launcher_cluster launchers
: > "$OUT/launchers.jsonl"
: > "$OUT/steps.jsonl"
cluster_session gcl "$NODES" "$RATE" "$RPN"
NP=$((NODES * RPN))
LINK="$RATE, $NODES nodes x $RPN"
echo "launchers: $LINK, $ROUNDS rounds"
ALLREDUCE=("$ROOT/examples/benchmarks/launch_bench.py" --sizes-mb 64 --bits 4 --reps "$REPS" --json "$OUT/launchers.jsonl")
STEP=("$ROOT/examples/benchmarks/step_bench.py" --model mlp --variants gc_maxmin4 --steps "$STEPS" --json "$OUT/steps.jsonl")
port=29700

by_mpirun() {  # by_mpirun SCRIPT ARGS...
  port=$((port + 1))
  "${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_SLOTS" -np "$NP" -x PYTHONPATH="$BUILD/python" -x OMP_NUM_THREADS=1 \
    -x MASTER_ADDR="$CLUSTER_SUBNET.11" -x MASTER_PORT=$port -x GLOO_SOCKET_IFNAME=eth0 \
    "$PY" "$@" 2>&1 | grep --line-buffered -v '\[warning\]'
}

# (is_host and local_addr: the node names are not in /etc/hosts, where torchrun would look up
# whether its node hosts the rendezvous, and its node's address for the workers' store)
by_torchrun() {  # by_torchrun SCRIPT ARGS...: one torchrun per node, in its namespace
  local i pids=()
  port=$((port + 1))
  for i in $(seq 1 "$NODES"); do
    ip netns exec "$CLUSTER_TAG-n$i" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$CLUSTER_TAG-n$i" \
      env PYTHONPATH="$BUILD/python" GLOO_SOCKET_IFNAME=eth0 "$PY" -m torch.distributed.run --nnodes="$NODES" \
      --nproc_per_node="$RPN" --rdzv_backend=c10d --rdzv_endpoint="$CLUSTER_SUBNET.11:$port" --rdzv_id="gc$port" \
      --rdzv_conf="is_host=$([ "$i" = 1 ] && echo 1 || echo 0)" --local_addr="$CLUSTER_SUBNET.$((10 + i))" \
      "$@" 2>&1 | grep --line-buffered -v -E '\[warning\]|^\[?W[0-9]{4} |OMP_NUM_THREADS|^\*+$' &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
}

for round in $(seq 1 "$ROUNDS"); do
  by_mpirun "${ALLREDUCE[@]}" --label mpirun
  by_torchrun "${ALLREDUCE[@]}" --label torchrun
  by_mpirun "${STEP[@]}" --link "mpirun $LINK"
  by_torchrun "${STEP[@]}" --link "torchrun $LINK"
done

"$PY" - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = {}
for line in open(f"{out}/launchers.jsonl"):
    r = json.loads(line)
    rows.setdefault(("64 MB allreduce, 4 bits (s)", r["label"]), []).append(r["median"])
for line in open(f"{out}/steps.jsonl"):
    r = json.loads(line)
    if r["variant"] == "gc_maxmin4":
        rows.setdefault(("MLP 25M step, gc_maxmin4 (s)", r["link"].split()[0]), []).append(r["seconds"])
print("\n| job | mpirun | torchrun | torchrun / mpirun |\n|---|---|---|---|")
for job in dict.fromkeys(j for j, _ in rows):
    m, t = statistics.median(rows[(job, "mpirun")]), statistics.median(rows[(job, "torchrun")])
    print(f"| {job} | {m:.4f} | {t:.4f} | {t / m:.3f} |")
PY
