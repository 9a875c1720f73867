#!/usr/bin/env python3
"""Plots simulate.py results: speed over MPI_Allreduce against the number of ranks, one line per
variant and codec setting, with the link-bound ideal of 4 bits.

    python3 examples/benchmarks/plot_simulation.py RUN.json [RUN.json ...] --png docs/simulation.png
        [--against mpi|fp32-ideal]

Each JSON is one simulate.py --out file. --against mpi (the default): its rows must include an
`mpi` row per world (the ratio's reference). --against fp32-ideal: the speed over float32's
link-bound time, which no uncompressed allreduce beats (worlds too large to simulate MPI in,
composed ones included; MPI's own rows show its share of that bound). A file's label is its
codec scale (GRADCOMP_SIM_CODEC_SCALE, recorded in the file), its ranks per node, and whether
its rows were composed (simulate.py --compose).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--png", required=True)
    ap.add_argument("--against", choices=["mpi", "fp32-ideal"], default="mpi")
    args = ap.parse_args()
    field = "vs_mpi" if args.against == "mpi" else "vs_fp32_ideal"
    series = {}
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        scale = run.get("codec_scale", "1")
        rpn = run["args"]["ranks_per_node"]
        codec = "network alone" if float(scale) == 0 else "codec measured (1 core)"
        for r in run["rows"]:
            if (r["variant"] == "mpi" and args.against == "mpi") or not r.get(field):
                continue
            how = ", composed" if "composed" in r else ""
            key = f"{r['variant']}, {rpn}/node, {codec}{how}"
            series.setdefault(key, []).append((r["ranks"], r[field]))
    if not series:
        sys.exit(f"plot_simulation: no rows with {field} (simulate.py --out files; vs_mpi needs an mpi variant)")
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
    ax.axhline(7.76, color="grey", linestyle="--", label="4-bit link-bound ideal (7.76x)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, max(9.0, max(p[1] for pts in series.values() for p in pts) * 1.1))
    ax.set_xlabel("ranks")
    ax.set_ylabel("speed over MPI_Allreduce (64 MB float32)" if args.against == "mpi"
                  else "speed over float32's link-bound time (64 MB)")
    ax.set_title("Simulated clusters, 25 Gbit/s links (SimGrid SMPI)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
