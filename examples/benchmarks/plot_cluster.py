#!/usr/bin/env python3
"""Table and plot of emulated_cluster.sh's results: time, effective bandwidth (payload MB/s),
speedup over MPI_Allreduce and percent of the link-bound ideal (the bytes each rank sent,
at the link rate)."""
import argparse
import re
import sys

UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes(text):
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]bit)", text.lower())
    if not m:
        sys.exit(f"plot_cluster: cannot read rate '{text}' (e.g. 1gbit, 500mbit)")
    return float(m.group(1)) * UNITS[m.group(2)] / 8


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--png")
    args = ap.parse_args()
    rate = rate_bytes(args.rate)
    rows = {}
    with open(args.results) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5 and parts[0] == "RESULT":
                rows[(parts[1], int(parts[2]))] = (float(parts[3]), int(parts[4]))
    sizes = sorted({mb for _, mb in rows})
    variants = [v for v in ("mpi", "gloo", "none", "fp16", "maxmin8", "maxmin4", "maxmin2", "topk1")
                if any((v, mb) in rows for mb in sizes)]
    print(f"{'variant':<9}{'MB':>6}{'seconds':>10}{'MB/s':>9}{'vs MPI':>9}{'% ideal':>9}")
    for mb in sizes:
        mpi = rows.get(("mpi", mb), (None, None))[0]
        for v in variants:
            if (v, mb) not in rows:
                continue
            sec, wire = rows[(v, mb)]
            # One rank per node: a rank's bytes are its node's link traffic. With several, the
            # node's ranks share the link; a lower bound on the link time is used.
            ideal = wire * args.ranks_per_node / rate if args.ranks_per_node == 1 else None
            pct = f"{100 * ideal / sec:8.0f}%" if ideal else f"{'-':>9}"
            speed = f"{mpi / sec:8.2f}x" if mpi else f"{'-':>9}"
            print(f"{v:<9}{mb:>6}{sec:>10.4f}{mb * 1.048576 / sec:>9.1f}{speed}{pct}")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5))
        for v in variants:
            xs = [mb for mb in sizes if (v, mb) in rows and ("mpi", mb) in rows]
            ax.plot(xs, [rows[("mpi", mb)][0] / rows[(v, mb)][0] for mb in xs], marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("allreduce size (MB, float32)")
        ax.set_ylabel("speedup over MPI_Allreduce")
        ax.set_title(f"{args.ranks} ranks, {args.ranks_per_node} per node, links of {args.rate}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
