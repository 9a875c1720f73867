#!/usr/bin/env python3
"""Table and plot of step_bench.py's records (the JSON lines step_cluster.sh writes): scaling
efficiency of every variant, one group of bars per model.

    /usr/bin/python3 examples/benchmarks/plot_steps.py build/steps/steps.jsonl --png docs/steps.png
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records")
    ap.add_argument("--png", help="write the plot here (needs matplotlib)")
    args = ap.parse_args()
    rows = {}  # (link, model) -> {variant: record}; a later record replaces an earlier one
    with open(args.records) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows.setdefault((r["link"], r["model"]), {})[r["variant"]] = r
    variants = []
    for records in rows.values():
        variants += [v for v in records if v not in variants]
    for (link, model), records in rows.items():
        params = next(iter(records.values()))["params"]
        print(f"\n{model} ({params / 1e6:.1f}M parameters), {link}\n")
        print("| variant | s/step | scaling efficiency |\n|---|---|---|")
        for v in variants:
            if v in records:
                print(f"| {v} | {records[v]['seconds']:.3f} | {100 * records[v]['efficiency']:.0f}% |")
    if not args.png:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = list(rows)
    fig, ax = plt.subplots(figsize=(min(16, max(8, 0.25 * len(variants) * len(groups))), 6.5))
    width = 0.8 / len(groups)
    for g, key in enumerate(groups):
        effs = [100 * rows[key][v]["efficiency"] if v in rows[key] else 0 for v in variants]
        ax.bar([i + g * width for i in range(len(variants))], effs, width, label=f"{key[1]}, {key[0]}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(variants))])
    ax.set_xticklabels(variants, rotation=45, ha="right")
    ax.set_ylabel("scaling efficiency (%)")
    ax.axhline(100, color="gray", linewidth=0.5)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
