"""gcrun --torchrun: the torchrun command that starts the same job without MPI (gradcomp's ranks
then meet through torch's store and run on gradcomp's own TCP connections and shared memory)."""

import re
import shlex

from gcrun_hosts import parse_hosts, read_hostfile  # the sibling module (launcher/gcrun_hosts.py)


def _per_node(np_, hosts, error):
    """Ranks per node, the same on every node (torchrun's --nproc_per_node), and the nodes."""
    if not hosts:
        return np_, ["localhost"]
    counts, left = [], np_
    for _, slots in hosts:  # as mpirun --map-by slot fills them
        counts.append(min(slots, left))
        left -= counts[-1]
    if left > 0:
        counts[-1] += left  # oversubscribed, as gcrun allows
    used = [(h, c) for (h, _), c in zip(hosts, counts) if c > 0]
    if len({c for _, c in used}) != 1:
        raise error("torchrun starts the same number of ranks on every node (--nproc_per_node); -np "
                    f"{np_} over {', '.join(f'{h}:{c}' for h, c in used)} is not")
    return used[0][1], [h for h, _ in used]


def torchrun_line(opts, command, error):
    """The shell line (for every node) that runs `command` as gcrun would, under torchrun;
    `error` is the exception class to raise for what torchrun cannot express."""
    hosts = parse_hosts(opts["hosts"]) if opts.get("hosts") else None
    if opts.get("hostfile"):
        hosts = read_hostfile(opts["hostfile"])
    np_ = opts.get("np")
    if np_ is None or np_ < 1:
        raise error("-np is required (the number of ranks)")
    per_node, nodes = _per_node(np_, hosts, error)
    env = dict(opts["settings"])
    nics = opts.get("network_interface")
    if nics:
        env["GRADCOMP_CONTROLLER_IFACE"] = nics
        env["NCCL_SOCKET_IFNAME"] = nics
    if re.fullmatch(r"(.*/)?python[\d.]*", command[0]):
        launcher = [command[0], "-m", "torch.distributed.run"]
        rest = list(command[1:])
    else:
        launcher = ["torchrun", "--no-python"]
        rest = list(command)
    args = launcher + [f"--nproc_per_node={per_node}"]
    if opts.get("elastic"):
        lo = (opts.get("min_np") or np_) // per_node
        hi = (opts.get("max_np") or np_) // per_node
        args.append(f"--nnodes={max(lo, 1)}:{max(hi, 1)}")
        if opts.get("reset_limit") is not None:
            args.append(f"--max_restarts={opts['reset_limit']}")
    elif len(nodes) > 1:
        args.append(f"--nnodes={len(nodes)}")
    if len(nodes) > 1 or opts.get("elastic"):
        args += ["--rdzv_backend=c10d", f"--rdzv_endpoint={nodes[0]}:29400", "--rdzv_id=gradcomp-job"]
    else:
        args.append("--standalone")
    line = " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())] + [shlex.quote(a) for a in args + rest])
    if len(nodes) > 1:
        return f"# on each of {', '.join(nodes)}:\n{line}"
    return line

