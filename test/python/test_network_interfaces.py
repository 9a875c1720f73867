"""gradcomp's TCP connections (the negotiation's, and the data's between nodes by default) on
hosts with several networks, on an emulated cluster (scripts/cluster.sh; needs root).

Every node gets, listed by the system before its eth0 (the network the nodes share):
- docker0 with 172.17.0.1/16, the address every Docker host has;
- eth1 on 10.198.X.1/16: a subnet the nodes seem to share, but each eth1 is cabled to nothing,
  so a dial there waits for ARP to give up (seconds);
- eth2 on a network of its own (10.197.X.1/24, a storage network, say), which the other nodes
  route through a host that drops the packets (no forwarding): a dial there waits until it
  times out.
Trying a peer's addresses one by one in the order its system lists them would dial this node's
own docker0, then wait seconds on eth1's and eth2's addresses for each peer before reaching eth0;
gradcomp skips its own addresses, tries addresses on its own networks first and starts the next
address beside a silent one after 250 ms (ops/comm/net_interfaces.h, tcp_connect.cc), so
it reaches eth0 at once and says which address it gave up on.
"""
import os
import re
import subprocess
import uuid

import pytest

from paths import FORWARD_PACKAGE, PY, ROOT

CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
NODES = 3
SETUP = ("ip link add docker0 type veth peer name docker0p && ip addr add 172.17.0.1/16 dev docker0 && "
         "ip link add eth1 type veth peer name eth1p && ip addr add 10.198.$1.1/16 dev eth1 && "
         "ip link add eth2 type veth peer name eth2p && ip addr add 10.197.$1.1/24 dev eth2 && "
         "for i in docker0 docker0p eth1 eth1p eth2 eth2p; do ip link set $i up; done")


@pytest.fixture
def cluster():
    tag = "ni" + uuid.uuid4().hex[:6]
    up = subprocess.run(["bash", CLUSTER, "up", tag, str(NODES), "1gbit"], capture_output=True, text=True,
                        env=dict(os.environ, CLUSTER_NODE_SETUP=SETUP))
    try:
        assert up.returncode == 0, f"the emulated cluster did not come up (needs root, ip, tc):\n{up.stderr}"
        for node in range(1, NODES + 1):
            # The other nodes' own networks: through the head namespace, which does not forward.
            subprocess.run(["ip", "netns", "exec", f"{tag}-n{node}", "ip", "route", "add", "10.197.0.0/16", "via",
                            "10.199.0.2"], check=True)
        yield tag, up.stdout.split("\n")[:-1]
    finally:
        subprocess.run(["bash", CLUSTER, "down", tag], check=True)


def in_node(tag, node, code):
    return subprocess.run(["ip", "netns", "exec", f"{tag}-n{node}", PY, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_ranks_connect_over_the_network_their_nodes_share(cluster):
    tag, prefix = cluster
    # The emulation is what the docstring says: eth1, eth2 and docker0 come before eth0, and dials
    # to a node's eth1 and eth2 get no answer. Checked from node 1, whose rank (0) dials nobody in
    # the job: a failed ARP lookup stays in a node's neighbour cache for a while, so the same
    # check from a node that dials would turn that node's later dial into an immediate "No route
    # to host".
    links = subprocess.run(["ip", "netns", "exec", f"{tag}-n1", "ip", "-o", "-4", "addr"], capture_output=True,
                           text=True, check=True).stdout
    order = [line.split()[1] for line in links.splitlines()]
    assert max(order.index(i) for i in ("docker0", "eth1", "eth2")) < order.index("eth0"), links
    for address in ("10.198.12.1", "10.197.12.1"):
        dial = in_node(tag, 1, f"import socket; s = socket.socket(); s.settimeout(1.0); s.connect(('{address}', 9))")
        assert "timed out" in dial.stderr, (address, dial.stderr)

    code = ("import numpy as np, gradcomp.numpy as g; g.init(); r = g.rank(); "
            "x = g.allreduce(np.arange(1 << 20, dtype=np.float32) * (r + 1), name='big', op=g.Sum); "
            "assert (x == np.arange(1 << 20, dtype=np.float32) * 6).all(), x[:4]; "
            "w = np.sin(np.arange(300000, dtype=np.float32)); "
            "z = g.allreduce(w + r, name='q', op=g.Average, compression={'codec': 'maxmin', 'bits': 4}); "
            "err = np.linalg.norm(z - (w + 1)) / np.linalg.norm(w + 1); assert 0 < err < 0.1, err; "
            "print('sums ok', r, flush=True); g.shutdown()")
    job = subprocess.run(prefix + ["-np", str(NODES), "-x", "GRADCOMP_LOG_LEVEL=info", *FORWARD_PACKAGE,
                                   PY, "-c", code], capture_output=True, text=True, timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0 and out.count("sums ok") == NODES, out[-3000:]
    assert out.count("between nodes over tcp; TCP to other hosts on eth0") == NODES, out[-3000:]
    # Node 1's eth1 address is on a network every node seems to share and listed first: tried
    # first, given up on after 250 ms, with a warning; docker0's and eth2's are never tried.
    detours = [line for line in out.splitlines() if "only after" in line]
    assert len(detours) == NODES, out[-3000:]  # rank 1 -> 0, rank 2 -> 0 and 1
    for line in detours:
        assert re.search(r"only after 10\.198\.1[12]\.1:\d+: no answer within 250 ms", line), line
        assert "172.17." not in line, line


def test_ranks_sharing_a_network_under_other_host_names_connect():
    # Two ranks in this host's network namespace, each with a host name of its own (containers
    # sharing the host's network under names of their own): every address a peer advertises is
    # also this rank's own. Tried last, not skipped: the ranks connect over them.
    code = ("import numpy as np, gradcomp.numpy as g; g.init(); r = g.rank(); "
            "x = g.allreduce(np.full(1 << 20, r + 1.0, dtype=np.float32), name='big', op=g.Sum); "
            "assert (x == 3).all(), x[:4]; print('sum ok', r, flush=True); g.shutdown()")
    rank = (f'exec unshare --uts sh -c "hostname gcuts$OMPI_COMM_WORLD_RANK && exec {PY} -c \\"$0\\""')
    job = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                          *FORWARD_PACKAGE, "-x", "GRADCOMP_LOCAL_SIZE=1", "-x", "GRADCOMP_LOG_LEVEL=info",
                          "sh", "-c", rank, code], capture_output=True, text=True, timeout=120)
    out = job.stdout + job.stderr
    assert job.returncode == 0 and out.count("sum ok") == 2, out[-3000:]
    assert out.count("negotiating over tcp, between nodes over tcp") == 2, out[-3000:]
    assert "[warning]" not in out, out[-3000:]
