#!/usr/bin/env python3
"""gradcomp's allreduces on simulated clusters of 2 to 1024 nodes (SimGrid's SMPI).

Builds the data plane and its driver with SimGrid (cmake -DGRADCOMP_SIMULATION=ON into
build-sim/, once), writes a platform for each world and runs the driver under smpirun: every
rank runs the real algorithm and the real codecs, SMPI times the network and advances each
rank's clock by its encoding and decoding, timed for real (--computation measured: by all the CPU
time measured between its MPI calls; ops/common/simulation.h).

    python3 examples/benchmarks/simulate.py --nodes 16,64,256 [--ranks-per-node 1]
        [--link 25Gbps] [--latency 5us] [--backbone 3.2Tbps] [--topology flat|fattree]
        [--intra-bw 20GBps] [--intra-latency 1us] [--sizes-mb 64]
        [--variants mpi,sra:maxmin4] [--reps 2] [--warmup 1] [--host-slowdown 1] [--out FILE.json]
        [--compose [--cross-columns C1[,C2...]]] [--codec-profile FILE]

Platforms: `flat` is one switch (a SimGrid cluster: each node's full-duplex link to a backbone
of --backbone); `fattree` is a two-level fat tree of 16-port leaves, each leaf's uplinks
carrying what its nodes can send. --ranks-per-node R puts R ranks on every node; they talk
through the node's loopback (--intra-bw, --intra-latency: PCIe or NVLink between GPUs) and
share its network link. --host-slowdown s makes every simulated core s times slower than this
machine's (to compare with an emulation that runs more ranks than it has cores).

Prints, per world and variant, the simulated time, MPI_Allreduce's in the same run, the ratio,
the ratio to float32's link-bound time (what no uncompressed allreduce can beat: a floor under
the ratio to MPI where MPI's world is too large to simulate) and the link-bound ideal (the bytes
each node must send over its link at full rate).

--compose (fat tree) builds the 2-D SRA of a large world (sra2d; sra3d with several ranks a
node) from simulations of two of its rows and of its columns (run_composed): 1024 nodes from
worlds of at most 64. Its grid across nodes is the runtime's (GridShape: rows of 16 nodes at
1024 x 8, whose 64-node columns run an 8 x 8 grid of their own), or --cross-columns' levels.
GRADCOMP_SIM_CODEC_SCALE=0 leaves codec time out (the network alone); the default counts it as
measured on this machine's core, or, with --codec-profile FILE, as a profile of some device prices
the work (examples/benchmarks/codec_profile: a GPU's measured once; ops/common/simulation.h).
examples/benchmarks/plot_simulation.py plots --out files.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GRADCOMP_SIM_BUILD_DIR", os.path.join(ROOT, "build-sim")))
DRIVER = os.path.join(BUILD, "examples", "benchmarks", "simulation", "sim_allreduce")

UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def rate_bytes(text):
    """'25Gbps' -> bytes/s (bps: bits, Bps: bytes), as SimGrid spells rates."""
    m = re.fullmatch(r"([0-9.]+)([kKMGT]?)(bps|Bps)", text)
    if not m:
        sys.exit(f"simulate: rate '{text}' is not like 25Gbps or 20GBps")
    value = float(m.group(1)) * UNITS[m.group(2)]
    return value / 8 if m.group(3) == "bps" else value


def seconds(text):
    m = re.fullmatch(r"([0-9.]+)(s|ms|us|ns)", text)
    if not m:
        sys.exit(f"simulate: latency '{text}' is not like 5us")
    return float(m.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]


def build():
    # Always brought up to date (a no-op when it is): a driver older than the sources would
    # run an older algorithm, or reject a variant, silently.
    if shutil.which("smpirun") is None:
        sys.exit("simulate: smpirun not found (apt-get install libsimgrid-dev, or scripts/install_deps.sh)")
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-DGRADCOMP_SIMULATION=ON", "-DCMAKE_BUILD_TYPE=Release"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)


def platform_xml(args, nodes):
    """A SimGrid platform of `nodes` nodes named node-0..; each core as fast as this machine."""
    speed = f"{1.0 / args.host_slowdown:.6f}Gf"
    common = (f'speed="{speed}" core="{max(2, 2 * args.ranks_per_node)}" bw="{args.link}" lat="{args.latency}" '
              f'loopback_bw="{args.intra_bw}" loopback_lat="{args.intra_latency}" sharing_policy="SPLITDUPLEX"')
    if args.topology == "flat" or nodes <= 16:
        body = (f'<cluster id="c" prefix="node-" suffix="" radical="0-{nodes - 1}" {common} '
                f'bb_bw="{args.backbone}" bb_lat="0us" bb_sharing_policy="SHARED"/>')
    else:
        if nodes % 16:
            sys.exit(f"simulate: a fat tree takes a multiple of 16 nodes (leaves of 16), not {nodes}")
        # Two levels: leaves of 16 nodes; each leaf has as many uplinks (of the node link's rate)
        # as nodes, spread over enough spines: full bisection bandwidth.
        leaves = math.ceil(nodes / 16)
        spines = 16
        params = f"2;16,{leaves};1,{spines};1,1"
        # Inside a zone of its own: SimGrid 4.0 (Debian 13) segfaults building a fat-tree cluster
        # that is the platform's root (NetZone::add_netzone_fatTree, while parsing; a one-rank
        # MPI hello on an 8-host "2;4,2;1,1;1,1" tree is enough). The zone holds the cluster
        # alone: its routes, and every figure, are those of the bare cluster on SimGrid 3.32.
        body = (f'<zone id="world" routing="Full">\n    <cluster id="c" prefix="node-" suffix="" '
                f'radical="0-{nodes - 1}" {common} topology="FAT_TREE" topo_parameters="{params}"/>\n  </zone>')
    return ('<?xml version="1.0"?>\n<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
            f'<platform version="4.1">\n  {body}\n</platform>\n')


def ideal_seconds(args, nodes, size_bytes, wire_ratio):
    """Link-bound time: each node sends 2 (M-1)/M of the (encoded) buffer over its link."""
    if nodes == 1:
        return 0.0
    return 2.0 * (nodes - 1) / nodes * size_bytes * wire_ratio / rate_bytes(args.link)


def wire_ratio(variant):
    codec = variant.split(":")[-1]
    if codec in ("mpi", "none"):
        return 1.0
    if codec in ("fp16", "bf16"):
        return 0.5
    bits = int(codec[len("maxmin"):])
    return (bits * 512 / 8 + 8) / (512 * 4)  # codes plus a float32 min and unit per bucket of 512


def run_world(args, nodes, tmp, variants=None, sizes_mb=None, grid_columns=()):
    variants = variants or args.variants
    sizes_mb = sizes_mb or args.sizes_mb
    ranks = nodes * args.ranks_per_node
    plat = os.path.join(tmp, f"platform-{nodes}.xml")
    hosts = os.path.join(tmp, f"hosts-{nodes}")
    with open(plat, "w") as f:
        f.write(platform_xml(args, nodes))
    with open(hosts, "w") as f:
        # One line per rank (smpirun would otherwise unroll "host:slots" into a file of its own
        # in the working directory).
        for n in range(nodes):
            f.write(f"node-{n}\n" * args.ranks_per_node)
    env = dict(os.environ)
    # Per-rank memory of the buffers: input and output, encodings, working copies.
    per_rank = max(float(s) for s in sizes_mb.split(",")) * 4 * 2**20
    if ranks * per_rank > args.memory_gb * 2**30:
        env["GRADCOMP_SIM_SHARED_MB"] = "1"
    cmd = ["smpirun", "-no-privatize", "-np", str(ranks), "-platform", plat, "-hostfile", hosts,
           "--cfg=smpi/host-speed:1Gf", "--cfg=smpi/test:1e-6",
           f"--cfg=smpi/simulate-computation:{'yes' if args.computation == 'measured' else 'no'}", f"--cfg=network/model:{args.network_model}", f"--cfg=smpi/coll-selector:{args.coll_selector}",
           "--cfg=smpi/shared-malloc:global", "--cfg=smpi/shared-malloc-blocksize:" + str(64 << 20),
           *[f"--cfg={c}" for c in args.cfg], "--log=root.thres:warning", DRIVER, "--sizes-mb", sizes_mb, "--variants", variants,
           "--reps", str(args.reps), "--local-size", str(args.ranks_per_node), "--stripes", str(args.stripes),
           "--warmup", str(args.warmup)]
    if grid_columns:  # else the runtime's shapes
        cmd += ["--grid-columns", ",".join(str(c) for c in grid_columns)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    # smpirun exits 0 even when the simulated program aborted ("Execution failed with code N"):
    # a run without every result line is a failure too.
    expected = len(variants.split(",")) * len(sizes_mb.split(","))
    if proc.returncode != 0 or sum(line.startswith("RESULT ") for line in proc.stdout.splitlines()) < expected:
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.exit(f"simulate: smpirun failed on {nodes} nodes (exit {proc.returncode}): {' '.join(cmd)}")
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "RESULT":
            rows.append({"nodes": nodes, "ranks": ranks, "variant": parts[1], "mb": float(parts[2]),
                         "seconds": float(parts[3]), "bytes_sent": int(parts[4]), "codec_seconds": float(parts[5]),
                         "communicate_seconds": float(parts[6]), "charged_seconds": float(parts[7]),
                         "shared_buffers": "GRADCOMP_SIM_SHARED_MB" in env})
    return rows


# The runtime's defaults of GRADCOMP_GRID_NODE_MESSAGES (kNodeRowMessages) and GRADCOMP_GRID_MIN_RANKS.
NODE_ROW_MESSAGES, GRID_MIN_RANKS = 128, 32


def most_square_columns(n):
    """Row length of MakeGrid's most square grid of n ranks (ops/comm/topology.cc)."""
    return n // max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)


def grid_shape(n, per_node):
    """Row lengths, one per level, of the runtime's nested grid over n ranks when per_node ranks
    of a node run one each at once (GridShape, ops/comm/topology.cc, at its defaults)."""
    longest, shape = max(2, NODE_ROW_MESSAGES // per_node), []
    while True:
        b = most_square_columns(n)
        if b > longest:
            b = next((d for d in range(longest, 1, -1) if n % d == 0), b)
        shape.append(b)
        n //= b
        if n <= longest or n < GRID_MIN_RANKS:
            return shape


def composed_shape(args, nodes):
    """Row lengths of the levels of the grid across `nodes` nodes that --compose simulates:
    --cross-columns, else the runtime's own choice (grid_shape)."""
    return args.cross_columns or grid_shape(nodes, args.ranks_per_node)


def run_composed(args, nodes, variant, tmp):
    """A 2-D SRA across `nodes` nodes of a non-blocking network, from three small runs.

    One rank a node (sra2d): its rows run at once and apart (each node's link carries its own
    row's messages only), then its columns, then its rows again. A world of two rows of the same
    C nodes runs the same row steps on the same buffer with a column SRA of two nodes; so the
    time is that world's, less a 2-node SRA of the column's chunk (size / C), plus an R-node
    allreduce of that chunk (the real column: flat SRA, or the 2-D SRA on the levels below
    when the grid nests). L ranks a node (sra3d: node rows, the 2-D SRA across nodes on rows of
    C nodes): the same with sra3d on two rows of C nodes, and the columns as sra2dnode worlds of
    2 and of R nodes on size / C (sra3d on the levels below when they nest; their steps inside
    the node cancel). Every part is the real code simulated; checked against whole runs
    (docs/benchmarks.md)."""
    shape = composed_shape(args, nodes)
    cols, inner = shape[0], shape[1:]
    rows = nodes // cols
    algorithm, codec = variant.split(":", 1)
    grid_variant, column_variant = (("sra2d", "sra") if algorithm == "sra2d" else ("sra3d", "sra2dnode"))
    out = []
    for mb_text in args.sizes_mb.split(","):
        chunk = f"{float(mb_text) / cols:.9g}"
        two_rows = run_world(args, 2 * cols, tmp, f"{grid_variant}:{codec}", mb_text, grid_columns=[cols])[0]
        if inner:
            column = run_world(args, rows, tmp, f"{grid_variant}:{codec}", chunk, grid_columns=inner)[0]
        else:
            column = run_world(args, rows, tmp, f"{column_variant}:{codec}", chunk)[0]
        pair = run_world(args, 2, tmp, f"{column_variant}:{codec}", chunk)[0]
        row = dict(two_rows)
        row.update(nodes=nodes, ranks=nodes * args.ranks_per_node, variant=variant)
        for key in ("seconds", "bytes_sent", "codec_seconds", "communicate_seconds", "charged_seconds"):
            row[key] = two_rows[key] - pair[key] + column[key]
        row["composed"] = {"grid": [rows, cols], "levels": shape, "two_rows_seconds": two_rows["seconds"],
                           "pair_seconds": pair["seconds"], "column_seconds": column["seconds"]}
        out.append(row)
    return out


def row_lengths(text):
    """--cross-columns C1[,C2...]: the row lengths of the levels across nodes."""
    try:
        return [int(c) for c in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="16,64")
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--link", default="25Gbps")
    ap.add_argument("--latency", default="5us")
    ap.add_argument("--backbone", default="3.2Tbps")
    ap.add_argument("--topology", choices=["flat", "fattree"], default="flat")
    ap.add_argument("--intra-bw", default="20GBps")
    ap.add_argument("--intra-latency", default="1us")
    ap.add_argument("--sizes-mb", default="64")
    ap.add_argument("--variants", default="mpi,sra:maxmin4")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--stripes", type=int, default=0, help="SRA's stripes (0: the runtime's choice across nodes)")
    ap.add_argument("--warmup", type=int, default=1, choices=(0, 1),
                    help="0: no untimed first repetition (halves the wall time of large worlds)")
    ap.add_argument("--host-slowdown", type=float, default=1.0)
    ap.add_argument("--computation", choices=["codec", "measured"], default="codec",
                    help="codec: a rank's time is the network's plus its encoding and decoding, timed for real "
                         "(GRADCOMP_SIM_CODEC_SCALE scales it); measured: SMPI also charges every other CPU "
                         "burst between MPI calls (staging copies, plans), as measured on this machine, where "
                         "other ranks' memory traffic makes them vary from run to run")
    ap.add_argument("--coll-selector", default="ompi")
    ap.add_argument("--network-model", default="SMPI",
                    help="SimGrid's network model: SMPI (calibrated on TCP over Ethernet) or CM02 (no factors)")
    ap.add_argument("--memory-gb", type=float, default=6.0,
                    help="above this much buffer memory for all ranks, buffers are shared (times only)")
    ap.add_argument("--compose", action="store_true",
                    help="sra2d (one rank a node) and sra3d (several) from small runs of their rows and columns "
                         "(run_composed): worlds too large to simulate whole (SimGrid's cost grows ~20x a "
                         "doubling past 128 nodes); needs a non-blocking network (--topology fattree)")
    ap.add_argument("--cross-columns", type=row_lengths, default=[],
                    help="C1[,C2...]: the grids across nodes (sra2d's over the ranks, sra3d's and hier2d's over the "
                         "nodes; --compose's too) have rows of C1, their columns grids of rows of C2, and so on "
                         "(default: the runtime's, GridShape)")
    ap.add_argument("--codec-profile", default=os.environ.get("GRADCOMP_SIM_CODEC_PROFILE", ""),
                    help="price encoding and decoding from this profile (examples/benchmarks/codec_profile's "
                         "output: a GPU's, or this machine's on real data) instead of timing them here "
                         "(GRADCOMP_SIM_CODEC_PROFILE; ops/common/simulation.h)")
    ap.add_argument("--cfg", action="append", default=[],
                    help="a further SimGrid setting (NAME:VALUE), repeatable: e.g. network/crosstraffic:0")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rate_bytes(args.link), rate_bytes(args.intra_bw), seconds(args.latency), seconds(args.intra_latency)
    if args.ranks_per_node < 1:
        sys.exit(f"simulate: --ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.compose and args.topology != "fattree":
        sys.exit("simulate: --compose needs --topology fattree (rows and columns apart on a non-blocking network), "
                 f"got --topology {args.topology}")
    columns_text = ",".join(str(c) for c in args.cross_columns)
    for nodes in [int(n) for n in args.nodes.split(",")] if args.cross_columns else []:
        left = nodes
        for c in args.cross_columns:
            if c < 2 or left % c:
                sys.exit(f"simulate: --cross-columns {columns_text}: each row length must be at least 2 and divide "
                         f"the nodes its level spans ({left} of --nodes {nodes}), got {c}")
            left //= c
    profile_device = ""
    if args.codec_profile:
        args.codec_profile = os.path.abspath(args.codec_profile)
        try:
            with open(args.codec_profile) as f:
                profile_device = next((line.split(None, 1)[1].strip() for line in f if line.startswith("device ")), "?")
        except OSError as e:
            sys.exit(f"simulate: --codec-profile {args.codec_profile}: {e.strerror}")
        os.environ["GRADCOMP_SIM_CODEC_PROFILE"] = args.codec_profile
    else:
        os.environ.pop("GRADCOMP_SIM_CODEC_PROFILE", None)
    build()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradcomp-sim-") as tmp:
        print(f"simulate: {args.topology} cluster, {args.ranks_per_node} rank(s)/node, links {args.link} "
              f"{args.latency}, backbone {args.backbone}, intra-node {args.intra_bw}, sizes {args.sizes_mb} MB, "
              f"computation {args.computation}, codec scale {os.environ.get('GRADCOMP_SIM_CODEC_SCALE', '1')}, "
              "codec " + (f"priced from {args.codec_profile} ({profile_device})" if args.codec_profile
                          else "timed here"))
        print(f"{'nodes':>6} {'ranks':>6} {'variant':<16} {'MB':>5} {'seconds':>9} {'vs mpi':>7} {'vs fp32':>7} "
              f"{'ideal s':>9} {'% ideal':>8} {'codec s':>8} {'charged':>8} {'comm s':>8}")
        for nodes in [int(n) for n in args.nodes.split(",")]:
            composed = [v for v in args.variants.split(",")
                        if args.compose and nodes // composed_shape(args, nodes)[0] > 2
                        and v.startswith("sra2d:" if args.ranks_per_node == 1 else "sra3d:")]
            direct = ",".join(v for v in args.variants.split(",") if v not in composed)
            world = run_world(args, nodes, tmp, direct, grid_columns=args.cross_columns) if direct else []
            for v in composed:
                world += run_composed(args, nodes, v, tmp)
            mpi = {r["mb"]: r["seconds"] for r in world if r["variant"] == "mpi"}
            for r in world:
                r["ideal_seconds"] = ideal_seconds(args, nodes, r["mb"] * 2**20, wire_ratio(r["variant"]))
                r["vs_mpi"] = mpi[r["mb"]] / r["seconds"] if r["mb"] in mpi else None
                # Against any uncompressed allreduce: the least time float32 can take on the links.
                r["vs_fp32_ideal"] = ideal_seconds(args, nodes, r["mb"] * 2**20, 1.0) / r["seconds"]
                vs = f"{r['vs_mpi']:.2f}x" if r["vs_mpi"] else "-"
                pct = 100 * r["ideal_seconds"] / r["seconds"] if r["seconds"] > 0 else 0
                print(f"{nodes:>6} {r['ranks']:>6} {r['variant']:<16} {r['mb']:>5g} {r['seconds']:>9.4f} {vs:>7} "
                      f"{r['vs_fp32_ideal']:>6.2f}x "
                      f"{r['ideal_seconds']:>9.4f} {pct:>7.0f}% {r['codec_seconds']:>8.4f} "
                      f"{r['charged_seconds']:>8.4f} "
                      f"{r['communicate_seconds']:>8.4f}", flush=True)
            rows += world
            if args.out:  # after every world: large ones take long
                with open(args.out, "w") as f:
                    json.dump({"args": vars(args), "codec_scale": os.environ.get("GRADCOMP_SIM_CODEC_SCALE", "1"),
                               "codec_profile_device": profile_device,
                               "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
