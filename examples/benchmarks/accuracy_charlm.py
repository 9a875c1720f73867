"""Accuracy of compressed data-parallel training on a harder task: a character-level transformer
language model of the Python standard library's sources (which Debian ships with python3).

    gcrun -np 4 /usr/bin/python3 examples/benchmarks/accuracy_charlm.py --steps 300 --seeds 2

(0.14M parameters by default, so that 4 ranks train it on a 2-core machine in about two
minutes a run; --width, --layers, --context and --batch-size make it bigger.)

Digits is too easy to tell compressors apart (every one lands within half a point of exact).
Here every rank trains the same GPT-style model (same initial weights, same hyper-parameters,
its own stream of text windows; only the gradient exchange differs) and the figure is the
validation loss (cross entropy, nats per character, mean over seeds) on held-out files, with
the bytes this rank sent for the compressed layers against what a float32 ring allreduce of
them sends (the runtime's counters).

Configs (--configs, comma-separated): none, maxmin4, maxmin4_ef, maxmin2, maxmin2_ef, maxmin3,
auto (Compression.auto: each layer's bit width chosen every --interval steps, least bytes at no
more total error than uniform 4 bits; the candidates leave out none, since on one machine the
cost model would keep every layer uncompressed), auto_ef (the same with error feedback),
auto_ref3 (the budget of uniform 3 bits), auto_regimes (Accordion's critical regimes: the 4-bit
budget while a layer's summed gradient moves by --critical-change or more between choices, then
one bit less a choice down to maxmin1's budget; candidates down to 1 bit), auto_regimes41 (the
same choosing between 4 bits and 1 only), auto_regimes2 (relaxed down to maxmin2's budget),
auto_n and auto_regimes_n (auto and auto_regimes with normalized=True: each layer's error over
its mean square, as suits Adam, which this model trains with), and fixed schedules of
uniform maxmin widths, "sched:4@100/2@200/1" (4 bits for steps 0-99, 2 bits to 199, then 1 bit):
what a budget that follows the training regime could reach. A schedule switches the optimizer's
per-parameter choice between phases, a private attribute: a measurement, not an API.
"""
import argparse
import math
import os
import re
import statistics
import sys
import time

import torch

import gradcomp.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import CharGPT, add_training_arguments, corpus, train_step, validation_loss  # noqa: E402

BITS = ["fp16", "maxmin8", "maxmin6", "maxmin5", "maxmin4", "maxmin3", "maxmin2"]
# The reference's budget at every choice, absolute errors: what "auto" meant before regimes.
FIXED = {"relaxed": None, "normalized": False}


def configs(interval, critical_change=0.5):
    return {
        "none": lambda: hvd.Compression.none,
        "maxmin4": lambda: hvd.Compression.maxmin(4),
        "maxmin4_ef": lambda: hvd.Compression.maxmin(4, error_feedback=True),
        "maxmin3": lambda: hvd.Compression.maxmin(3),
        "maxmin2": lambda: hvd.Compression.maxmin(2),
        "maxmin2_ef": lambda: hvd.Compression.maxmin(2, error_feedback=True),
        "auto": lambda: hvd.Compression.auto(BITS, interval=interval, **FIXED),
        "auto_ref3": lambda: hvd.Compression.auto(BITS, interval=interval,
                                                  reference=hvd.Compression.maxmin(3), **FIXED),
        "auto_regimes": lambda: hvd.Compression.auto(BITS + ["maxmin1"], interval=interval,
                                                     relaxed=hvd.Compression.maxmin(1),
                                                     critical_change=critical_change, normalized=False),
        "auto_regimes41": lambda: hvd.Compression.auto(["maxmin4", "maxmin1"], interval=interval,
                                                       relaxed=hvd.Compression.maxmin(1),
                                                       critical_change=critical_change, normalized=False),
        "auto_n": lambda: hvd.Compression.auto(BITS, interval=interval, relaxed=None, normalized=True),
        "auto_regimes_n": lambda: hvd.Compression.auto(BITS + ["maxmin1"], interval=interval,
                                                       relaxed=hvd.Compression.maxmin(1),
                                                       critical_change=critical_change, normalized=True),
        "auto_regimes2": lambda: hvd.Compression.auto(BITS, interval=interval, relaxed=hvd.Compression.maxmin(2),
                                                      critical_change=critical_change, normalized=False),
        "auto_ef": lambda: hvd.Compression.auto(BITS, interval=interval,
                                                reference=hvd.Compression.maxmin(4, error_feedback=True), **FIXED),
        # Compression.auto() as it comes (its own interval, not --interval); run with
        # GRADCOMP_AUTO_COST_MODEL=0, as on one machine the cost model keeps every layer raw.
        "auto_defaults": lambda: hvd.Compression.auto(),
    }


def schedule(name):
    """"sched:4@100/2@200/1" -> [(100, 4), (200, 2), (inf, 1)]: (first step after, bits)."""
    phases = []
    for part in name[len("sched:"):].split("/"):
        bits, _, until = part.partition("@")
        phases.append((int(until) if until else math.inf, int(bits)))
    return phases


def run(name, make_compression, seed, args, train, val):
    torch.manual_seed(seed)
    model = CharGPT(args.layers, args.width, args.heads, args.context)
    phases = schedule(name) if name.startswith("sched:") else None
    compression = hvd.Compression.maxmin(phases[0][1]) if phases else make_compression()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                   named_parameters=[(f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}.{seed}.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   compression=compression)
    gen = torch.Generator().manual_seed(seed * 1000 + hvd.rank())
    before = hvd.stats()
    for step in range(args.steps):
        if phases:
            bits = next(b for until, b in phases if step < until)
            for plan in opt._plans.values():
                if plan.choice is not None and plan.choice.name == "maxmin" and plan.choice.bits != bits:
                    plan.choice = hvd.Compression.maxmin(bits)
        train_step(model, opt, train, args, step, gen)
    after = hvd.stats()
    loss = validation_loss(model, val, args)
    n = hvd.size()
    ring = (after["compressed_bytes_in"] - before["compressed_bytes_in"]) * 2 * (n - 1) / n
    wire = after["compressed_bytes_on_wire"] - before["compressed_bytes_on_wire"]
    ratio = 1.0 if name == "none" else (wire / ring if ring else float("nan"))
    return loss, ratio


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=2)
    add_training_arguments(p)
    p.add_argument("--interval", type=int, default=25, help="auto: steps between two choices")
    p.add_argument("--critical-change", type=float, default=0.5,
                   help="auto_regimes: how far a summed gradient's norm moves between choices in a critical regime")
    p.add_argument("--configs", default="none,maxmin4,maxmin2,maxmin2_ef,auto")
    args = p.parse_args()
    table = configs(args.interval, args.critical_change)
    chosen = [c.strip() for c in args.configs.split(",")]
    unknown = [c for c in chosen if c not in table and not re.fullmatch(r"sched:([1-8]@\d+/)*[1-8]", c)]
    if unknown:
        p.error(f"unknown configs {unknown}; choose among {list(table)} or a schedule such as sched:4@100/2@200/1")
    hvd.init()
    train, val = corpus(args.corpus_mb)
    rows = []
    for name in chosen:
        t0 = time.time()
        results = [run(name, table.get(name), seed, args, train, val) for seed in range(args.seeds)]
        losses = [r[0] for r in results]
        rows.append((name, statistics.mean(losses), min(losses), max(losses), statistics.mean(r[1] for r in results)))
        if hvd.rank() == 0:
            print(f"  {name}: validation loss {statistics.mean(losses):.4f} ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
            if name.startswith("auto"):
                last = {k: v for k, v in hvd.compression_choices().items()
                        if k.startswith(f"allreduce.{name}.{args.seeds - 1}.")}
                print("    last choices: " + ", ".join(f"{k.split('.', 3)[3]}={v['setting']}"
                                                       for k, v in sorted(last.items())), file=sys.stderr, flush=True)
                # The last measurement's relative errors, median over the layers (with error
                # feedback also on the gradient plus its residual).
                for key, label in (("relative_error", "without EF"), ("relative_error_ef", "with EF")):
                    if all(v[key] for v in last.values()):
                        print(f"    relative error {label} (median over layers): " + ", ".join(
                            f"{c} {statistics.median(v[key][c] for v in last.values()):.3f}" for c in BITS
                            if all(c in v[key] for v in last.values())),
                            file=sys.stderr, flush=True)
    if hvd.rank() == 0:
        params = sum(q.numel() for q in CharGPT(args.layers, args.width, args.heads, args.context).parameters())
        ref = {r[0]: r for r in rows}.get("maxmin4")
        print(f"\ncharacter LM of the Python standard library ({len(train) / 2**20:.1f} MB train, "
              f"{len(val) / 2**20:.2f} MB held out), {hvd.size()} ranks, {params / 1e6:.2f}M parameters "
              f"({args.layers} layers x {args.width}), context {args.context}, {args.steps} steps of "
              f"{args.batch_size} windows a rank, Adam lr {args.lr}, {args.seeds} seeds\n")
        print("| compression | validation loss (mean) | min..max | vs maxmin4 | traffic of compressed layers vs fp32 ring "
              "| vs maxmin4's |")
        print("|---|---|---|---|---|---|")
        for name, mean, lo, hi, ratio in rows:
            vs = f"{100 * (mean / ref[1] - 1):+.2f}%" if ref else "n/a"
            bytes_vs = f"{ratio / ref[4]:.2f}x" if ref and name != "none" else "n/a"
            print(f"| {name} | {mean:.4f} | {lo:.4f}..{hi:.4f} | {vs} | {ratio:.4f} | {bytes_vs} |")
    hvd.shutdown()


if __name__ == "__main__":
    main()
