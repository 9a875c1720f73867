"""The table of a diloco_cluster.sh session: from the RESULT records of
examples/torch_diloco_charlm.py (one a run, appended to a JSON-lines file), each run's final
validation loss, the wall time at which it first reached the reference run's final loss (within
--within), and the bytes each rank sent a step, against the reference (DDP on gloo).

    python3 examples/benchmarks/diloco_table.py build/diloco/diloco.jsonl [--reference "DDP on gloo (exact)"]
"""
import argparse
import json


def reached(curve, target):
    """The seconds of the first evaluation at or below `target`, or None."""
    return next((point["seconds"] for point in curve if point["validation_loss"] <= target), None)


def table(records, reference, within):
    ref = next((r for r in records if r["run"] == reference), None)
    if ref is None:
        raise SystemExit(f"diloco_table: no run named {reference!r} among {[r['run'] for r in records]}")
    target = ref["curve"][-1]["validation_loss"] * (1 + within)
    ref_time, ref_bytes = reached(ref["curve"], target), ref["curve"][-1]["sent_bytes_per_step"]
    rows = [f"target: {reference}'s final validation loss {ref['curve'][-1]['validation_loss']:.4f} + "
            f"{100 * within:g}% = {target:.4f}",
            f"{'run':44} {'final loss':>10} {'steps':>6} {'train s':>8} {'to target s':>11} {'sooner':>7} "
            f"{'kB/step':>9} {'fewer bytes':>11}"]
    for r in records:
        last, t = r["curve"][-1], reached(r["curve"], target)
        sooner = f"{ref_time / t:.1f}x" if t and ref_time else "-"
        fewer = f"{ref_bytes / last['sent_bytes_per_step']:.0f}x" if last["sent_bytes_per_step"] else "-"
        rows.append(f"{r['run']:44} {last['validation_loss']:10.4f} {last['step']:6d} {last['seconds']:8.1f} "
                    f"{(f'{t:.1f}' if t is not None else 'never'):>11} {sooner:>7} "
                    f"{last['sent_bytes_per_step'] / 1e3:9.1f} {fewer:>11}")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records")
    p.add_argument("--reference", default="DDP on gloo (exact)")
    p.add_argument("--within", type=float, default=0.02, help="the target's slack over the reference's loss")
    p.add_argument("--link", default="", help="a line naming the link, printed first")
    args = p.parse_args()
    with open(args.records) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if args.link:
        print(args.link)
    print(table(records, args.reference, args.within))


if __name__ == "__main__":
    main()
