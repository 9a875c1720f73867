#!/usr/bin/env bash
# An emulated cluster on this machine: one network namespace (and UTS namespace: its own host
# name) per node, veth pairs into a bridge in the root namespace, a tc rate limit on every
# node's link, and a head namespace for mpirun, which starts its daemons inside the node
# namespaces through a launch agent. Only addresses inside these namespaces are used
# (10.199.0.0/24). Needs root.
#
#   bash scripts/cluster.sh up TAG NODES RATE   # prints the mpirun prefix, one word per line
#   bash scripts/cluster.sh cut TAG NODE        # drop every packet on node NODE's link (1-based)
#   bash scripts/cluster.sh heal TAG NODE       # give it back its rate-limited link
#   bash scripts/cluster.sh unplug TAG NODE     # set node NODE's link down (a cable pulled)
#   bash scripts/cluster.sh plug TAG NODE       # set it up again
#   bash scripts/cluster.sh down TAG            # kill what runs in the namespaces, delete them
#
# TAG (letters and digits, at most 8) names everything, so parallel clusters never collide.
# CLUSTER_QUEUE (default 20ms) is how much the shaper's queue holds; CLUSTER_INGRESS=0 shapes
# only each node's egress (the default shapes both directions). CLUSTER_NODE_SETUP, if set, is a
# bash command run inside each new node's namespace before its eth0 exists, with the node's last
# address octet as $1 (tests give nodes other interfaces, listed before eth0).
# Scripts may instead `source` this file and call cluster_up / cluster_cut / cluster_heal /
# cluster_unplug / cluster_plug / cluster_down;
# cluster_up then fills the array CLUSTER_MPIRUN. The benchmarks' scripts start with
# cluster_benchmark (their settings and checks) and cluster_session (a cluster for their run).
set -euo pipefail

CLUSTER_SUBNET=10.199.0

cluster_down() {  # cluster_down TAG
  local tag=$1 ns
  set +e
  for ns in $(ip netns list | awk '{print $1}' | grep "^${tag}-"); do
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null
    ip netns del "$ns"
  done
  ip link del "${tag}br" 2>/dev/null
  rm -rf "/tmp/${tag}-cluster"
  set -e
}

_cluster_add_host() {  # TAG NAME LAST_OCTET RATE(""=unlimited)
  local tag=$1 ns="$1-$2" peer="$1$3"
  ip netns add "$ns"
  if [ -n "${CLUSTER_NODE_SETUP:-}" ] && [ "$2" != head ]; then
    ip netns exec "$ns" bash -c "$CLUSTER_NODE_SETUP" node "$3"
  fi
  ip link add "$peer" type veth peer name eth0 netns "$ns"
  ip link set "$peer" master "${tag}br"
  ip link set "$peer" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$CLUSTER_SUBNET.$3/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  [ -n "$4" ] && _cluster_shape "$tag" "$3" "$4" add
  return 0
}

# The node's link: RATE on the node's egress and, unless CLUSTER_INGRESS=0, on the bridge port
# towards it (its ingress); a token bucket whose queue holds CLUSTER_QUEUE (default 20ms) of it.
_cluster_shape() {  # TAG LAST_OCTET RATE add|replace
  local ns="$1-n$(($2 - 10))" peer="$1$2" queue=${CLUSTER_QUEUE:-20ms}
  ip netns exec "$ns" tc qdisc "$4" dev eth0 root handle 1: tbf rate "$3" burst 256kb latency "$queue"
  if [ "${CLUSTER_INGRESS:-1}" = 1 ]; then
    tc qdisc "$4" dev "$peer" root handle 1: tbf rate "$3" burst 256kb latency "$queue"
  elif [ "$4" = replace ]; then
    tc qdisc del dev "$peer" root 2>/dev/null || true
  fi
}

cluster_up() {  # cluster_up TAG NODES RATE: sets CLUSTER_MPIRUN
  local tag=$1 nodes=$2 rate=$3 i try hosts="" work="/tmp/$1-cluster"
  [ "$(id -u)" -eq 0 ] || { echo "cluster: needs root (network namespaces and tc)" >&2; return 2; }
  [[ "$tag" =~ ^[a-z0-9]{1,8}$ ]] || { echo "cluster: TAG must be 1-8 lowercase letters or digits, got '$tag'" >&2; return 2; }
  [ "$nodes" -ge 2 ] && [ "$nodes" -le 8 ] || { echo "cluster: NODES must be 2..8, got $nodes" >&2; return 2; }
  ip link add "${tag}br" type bridge
  ip link set "${tag}br" up
  _cluster_add_host "$tag" head 2 ""
  for i in $(seq 1 "$nodes"); do
    _cluster_add_host "$tag" "n$i" $((10 + i)) "$rate"
    hosts="${hosts:+$hosts,}$CLUSTER_SUBNET.$((10 + i))"
  done
  # Wait until every node answers (bridge ports take a moment to forward).
  for i in $(seq 1 "$nodes"); do
    for try in $(seq 1 50); do
      ip netns exec "${tag}-head" ping -c1 -W1 "$CLUSTER_SUBNET.$((10 + i))" >/dev/null 2>&1 && break
      [ "$try" = 50 ] && { echo "cluster: node $i unreachable" >&2; return 1; }
      sleep 0.1
    done
  done
  # The launch agent: mpirun calls `agent [options] HOST command...`; run it in HOST's
  # namespace, with its own UTS namespace (Open MPI names shared-memory segments after the
  # host name, so each node needs its own).
  mkdir -p "$work"
  echo "$rate" > "$work/rate"
  cat > "$work/agent.sh" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
while [ "\${host#-}" != "\$host" ]; do host=\$1; shift; done  # skip rsh-style options
octet=\${host##*.}
node="${tag}-n\$((octet - 10))"
exec ip netns exec "\$node" unshare --uts /bin/sh -c "hostname \$node && \$*"
AGENT
  chmod +x "$work/agent.sh"
  CLUSTER_HOSTS=$hosts
  CLUSTER_MPIRUN=(ip netns exec "${tag}-head" mpirun --allow-run-as-root --oversubscribe --bind-to none
                  --mca plm_rsh_agent "$work/agent.sh" --mca routed direct --mca btl tcp,self,vader
                  --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
                  -x PATH -x LD_LIBRARY_PATH -x PYTHONPATH)
}

cluster_session() {  # cluster_session PREFIX NODES RATE RANKS_PER_NODE: for scripts that source this
  # A cluster for the rest of the calling script, torn down when it exits (also on failure or
  # Ctrl-C), named PREFIX plus the script's pid (parallel runs never collide). Sets CLUSTER_TAG,
  # CLUSTER_MPIRUN, and CLUSTER_SLOTS (mpirun's -H value: every node with RANKS_PER_NODE slots).
  CLUSTER_TAG="$1$(($$ % 100000))"
  trap 'cluster_down "$CLUSTER_TAG"' EXIT
  trap 'exit 130' INT TERM
  cluster_up "$CLUSTER_TAG" "$2" "$3"
  local host
  CLUSTER_SLOTS=""
  for host in ${CLUSTER_HOSTS//,/ }; do CLUSTER_SLOTS="${CLUSTER_SLOTS:+$CLUSTER_SLOTS,}$host:$4"; done
}

cluster_cut() {  # cluster_cut TAG NODE: the node's link drops everything, both ways
  local ns="$1-n$2" peer="$1$((10 + $2))"
  # A FIFO that holds no packet drops each one (netem is not in every kernel; pfifo is).
  ip netns exec "$ns" tc qdisc replace dev eth0 root pfifo limit 0
  tc qdisc replace dev "$peer" root pfifo limit 0
}

cluster_heal() {  # cluster_heal TAG NODE: the node's link as cluster_up made it
  _cluster_shape "$1" $((10 + $2)) "$(cat "/tmp/$1-cluster/rate")" replace
}

cluster_unplug() {  # cluster_unplug TAG NODE: the node's link down at the bridge (no reset reaches anyone)
  ip link set "$1$((10 + $2))" down
}

cluster_plug() {  # cluster_plug TAG NODE: the node's link up again
  ip link set "$1$((10 + $2))" up
}

cluster_benchmark() {  # cluster_benchmark NAME OUT_DIR_NAME [module | BINARY]: the benchmarks' preamble
  # For examples/benchmarks/*_cluster.sh, which source this file: sets ROOT (the clone), BUILD
  # (GRADCOMP_BUILD_DIR, default build/), PY (GRADCOMP_PYTHON, default Debian's /usr/bin/python3)
  # and OUT (the caller's --out, default $BUILD/OUT_DIR_NAME, made), and checks that BUILD has
  # what the benchmark runs: gradcomp's Python package (module, the default) or BINARY under it.
  local name=$1 what=${3:-module}
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  BUILD=${GRADCOMP_BUILD_DIR:-$ROOT/build}
  PY=${GRADCOMP_PYTHON:-/usr/bin/python3}
  if [ "$what" = module ]; then
    ls "$BUILD"/python/gradcomp/_core*.so >/dev/null 2>&1 ||
      { echo "$name: $BUILD/python has no gradcomp build (bash scripts/setup.sh)" >&2; exit 2; }
  else
    [ -x "$BUILD/$what" ] || { echo "$name: $BUILD/$what not built (bash scripts/test.sh builds it)" >&2; exit 2; }
  fi
  OUT=${OUT:-$BUILD/$2}
  mkdir -p "$OUT"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    up)
      cluster_down "$2"
      cluster_up "$2" "$3" "$4" || { cluster_down "$2"; exit 1; }
      printf '%s\n' "${CLUSTER_MPIRUN[@]}" -H "$CLUSTER_HOSTS" ;;
    cut) cluster_cut "$2" "$3" ;;
    heal) cluster_heal "$2" "$3" ;;
    unplug) cluster_unplug "$2" "$3" ;;
    plug) cluster_plug "$2" "$3" ;;
    down) cluster_down "$2" ;;
    *) echo "usage: cluster.sh up TAG NODES RATE | cut|heal|unplug|plug TAG NODE | down TAG" >&2; exit 2 ;;
  esac
fi
