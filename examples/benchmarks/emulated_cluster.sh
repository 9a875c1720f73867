#!/usr/bin/env bash
# Compressed allreduce on an emulated cluster: one network namespace per node, veth pairs into
# a bridge in the root namespace, a tc rate limit on every node's link, Open MPI over TCP.
# mpirun runs in a head namespace on the same bridge and starts its daemons inside the node
# namespaces through a launch agent (--mca plm_rsh_agent) that runs `ip netns exec NODE ...`.
# Only addresses inside these namespaces are used (10.199.0.0/24); everything is torn down
# on exit, also on failure or Ctrl-C.
#
#   sudo bash examples/benchmarks/emulated_cluster.sh [--rate 1gbit] [--nodes 2] [--ranks-per-node 1]
#        [--sizes-mb 1,4,16,64,256] [--reps 3] [--variants mpi,none,fp16,maxmin8,maxmin4,maxmin2,topk1]
#        [--hierarchical] [--no-gloo] [--out build/cluster]
# GRADCOMP_* variables in the environment are passed to every rank.
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
    --out) OUT=$2; shift 2 ;;
    *) echo "emulated_cluster: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "emulated_cluster: needs root (network namespaces and tc)" >&2; exit 2; }
[ "$NODES" -ge 2 ] && [ "$NODES" -le 8 ] || { echo "emulated_cluster: --nodes must be 2..8, got $NODES" >&2; exit 2; }
[ "$RPN" -ge 1 ] || { echo "emulated_cluster: --ranks-per-node must be >= 1, got $RPN" >&2; exit 2; }
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null || { echo "emulated_cluster: $tool not found (run scripts/install_deps.sh)" >&2; exit 2; }
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${GRADCOMP_BUILD_DIR:-$ROOT/build}
BENCH=$BUILD/examples/compressed_bench
[ -x "$BENCH" ] || { echo "emulated_cluster: $BENCH not built (bash scripts/test.sh builds it)" >&2; exit 2; }
OUT=${OUT:-$BUILD/cluster}
mkdir -p "$OUT"
TAG="gc$$"           # unique per run: parallel runs never collide
BR="${TAG}br"
SUBNET=10.199.0
WORK=$(mktemp -d)

cleanup() {
  set +e
  for ns in $(ip netns list | awk '{print $1}' | grep "^${TAG}-"); do
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null
    ip netns del "$ns"
  done
  ip link del "$BR" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the cluster --------------------------------------------------------------------------
ip link add "$BR" type bridge
ip link set "$BR" up
add_host() {  # add_host NAME LAST_OCTET LIMIT(0|1)
  local ns="${TAG}-$1" peer="${TAG}$2"
  ip netns add "$ns"
  ip link add "$peer" type veth peer name eth0 netns "$ns"
  ip link set "$peer" master "$BR"
  ip link set "$peer" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$SUBNET.$2/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  if [ "$3" = 1 ]; then
    # The node's link: RATE in each direction (node egress, and the bridge port towards it).
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 20ms
    tc qdisc add dev "$peer" root tbf rate "$RATE" burst 256kb latency 20ms
  fi
}
add_host head 2 0
HOSTS=""
for i in $(seq 1 "$NODES"); do
  add_host "n$i" $((10 + i)) 1
  HOSTS="${HOSTS:+$HOSTS,}$SUBNET.$((10 + i)):$RPN"
done

# Wait until every node answers (bridge ports take a moment to forward).
for i in $(seq 1 "$NODES"); do
  for try in $(seq 1 50); do
    ip netns exec "${TAG}-head" ping -c1 -W1 "$SUBNET.$((10 + i))" >/dev/null 2>&1 && break
    [ "$try" = 50 ] && { echo "emulated_cluster: node $i unreachable" >&2; exit 1; }
    sleep 0.1
  done
done

# The launch agent: mpirun calls `agent HOST command...`; run it in HOST's namespace.
cat > "$WORK/agent.sh" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
while [ "\${host#-}" != "\$host" ]; do host=\$1; shift; done  # skip rsh-style options
octet=\${host##*.}
node="${TAG}-n\$((octet - 10))"
# Its own UTS namespace too: each node needs its own host name (Open MPI names shared-memory
# segments after it).
exec ip netns exec "\$node" unshare --uts /bin/sh -c "hostname \$node && \$*"
AGENT
chmod +x "$WORK/agent.sh"

NP=$((NODES * RPN))
MPIRUN=(ip netns exec "${TAG}-head" mpirun --allow-run-as-root --oversubscribe --bind-to none
        --mca plm_rsh_agent "$WORK/agent.sh" --mca routed direct --mca btl tcp,self,vader
        --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
        -H "$HOSTS" -np "$NP" -x PATH -x LD_LIBRARY_PATH -x PYTHONPATH)
echo "emulated cluster: $NODES nodes x $RPN ranks, links of $RATE, sizes $SIZES MB"

# ---- gradcomp and MPI_Allreduce -----------------------------------------------------------
ENVS=(-x GRADCOMP_HIERARCHICAL="$HIER")
for var in $(env | grep -o '^GRADCOMP_[A-Z0-9_]*' | grep -v '^GRADCOMP_HIERARCHICAL$' || true); do ENVS+=(-x "$var"); done
"${MPIRUN[@]}" "${ENVS[@]}" "$BENCH" --sizes-mb "$SIZES" --reps "$REPS" ${VARIANTS:+--variants "$VARIANTS"} \
  | tee "$OUT/results.txt"

# ---- torch.distributed gloo ---------------------------------------------------------------
if [ "$GLOO" = 1 ]; then
  "${MPIRUN[@]}" -x MASTER_ADDR="$SUBNET.11" -x MASTER_PORT=29511 -x GLOO_SOCKET_IFNAME=eth0 \
    /usr/bin/python3 "$ROOT/examples/benchmarks/gloo_allreduce.py" --sizes-mb "$SIZES" --reps "$REPS" \
    | tee -a "$OUT/results.txt"
fi

/usr/bin/python3 "$ROOT/examples/benchmarks/plot_cluster.py" "$OUT/results.txt" --rate "$RATE" --ranks "$NP" \
  --ranks-per-node "$RPN" --png "$OUT/cluster.png"
