"""The table of a diloco_cluster.sh session: from the RESULT records of
examples/torch_diloco_charlm.py (one a run, appended to a JSON-lines file), each run's final
validation loss, the wall time at which it first reached the reference run's final loss (within
--within), and the bytes each rank sent a step, against the reference (DDP on gloo); then the
validation loss of each run against wall time (--at: the last evaluation by each time).

    python3 examples/benchmarks/diloco_table.py build/diloco/diloco.jsonl [--reference "DDP on gloo (exact)"]
        [--at 30,60,120,300]
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


def loss_by(curve, seconds):
    """The validation loss of the last evaluation at or before `seconds` of training, or None."""
    done = [point["validation_loss"] for point in curve if point["seconds"] <= seconds]
    return done[-1] if done else None


def against_time(records, times):
    rows = ["validation loss by training time (the last evaluation by then: a run that ended shows its final "
            "loss; - none yet)",
            f"{'run':44} " + " ".join(f"{f'{t:g} s':>8}" for t in times)]
    for r in records:
        losses = (loss_by(r["curve"], t) for t in times)
        rows.append(f"{r['run']:44} " + " ".join(f"{x:8.4f}" if x is not None else f"{'-':>8}" for x in losses))
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records")
    p.add_argument("--reference", default="DDP on gloo (exact)")
    p.add_argument("--within", type=float, default=0.02, help="the target's slack over the reference's loss")
    p.add_argument("--link", default="", help="a line naming the link, printed first")
    p.add_argument("--at", default="30,60,120,300", help="the times (s) of the loss-against-time table")
    args = p.parse_args()
    with open(args.records) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if args.link:
        print(args.link)
    print(table(records, args.reference, args.within))
    print(against_time(records, [float(t) for t in args.at.split(",")]))


if __name__ == "__main__":
    main()
