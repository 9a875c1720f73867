"""Soak: long digits training through gradcomp, watching what the process holds.

    gcrun -np 2 /usr/bin/python3 examples/benchmarks/soak_digits.py --steps 10000
    gcrun -np 2 /usr/bin/python3 examples/benchmarks/soak_digits.py --steps 10000 --timeline /tmp/soak.json

Trains an MLP on sklearn's digits with DistributedOptimizer, first with 4-bit max-min and error
feedback, then with DGC top-k (each --steps steps), and samples every rank's resident memory
(VmRSS) and the runtime's gauges (operations queued, tensors in negotiation, response cache
entries, tensors with compression memories, timeline rows and queued events) after a warm-up of
--warmup steps and then every --every steps. It prints one row per sample and, per phase, the
growth after warm-up; it exits with status 1 on any rank where RSS grew by more than --max-rss-growth
(percent, default 1) or a gauge grew at all.
"""
import argparse
import sys
import time

import torch
from sklearn.datasets import load_digits

import gradcomp.torch as hvd

GAUGES = ("queued_operations", "negotiating_tensors", "cache_entries", "compression_memories", "timeline_rows",
          "timeline_queued")
PHASES = {
    "maxmin 4 bits + EF": lambda: hvd.Compression.maxmin(4, error_feedback=True),
    "topk 1% (DGC)": lambda: hvd.Compression.topk(0.01),
}


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def sample():
    # The timeline's writer thread empties its queue in the background: a busy machine can
    # catch it mid-batch. Give it up to 5 s to drain, so what is compared is what stays queued
    # (a queue that never drains is still reported as grown).
    deadline = time.monotonic() + 5.0
    s = hvd.stats()
    while s["timeline_queued"] > 0 and time.monotonic() < deadline:
        time.sleep(0.01)
        s = hvd.stats()
    return dict({"rss_kib": rss_kib()}, **{g: int(s[g]) for g in GAUGES})


def soak(name, compression, args, x, y):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=[(f"{name}.{n}", p) for n, p in model.named_parameters()],
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def sync():
        # After each sample: no rank starts anything new (the report's collectives) while
        # another still samples, which would count the newcomer's request in that rank's
        # gauges. Run once before the loop, so its own row and cache entry are there already.
        hvd.allreduce(torch.zeros(1), name="soak.sync")

    sync()
    g = torch.Generator().manual_seed(hvd.rank())
    samples = []
    loss = torch.tensor(0.0)
    for step in range(1, args.steps + 1):
        rows = torch.randint(0, len(y), (args.batch_size,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        if step >= args.warmup and (step - args.warmup) % args.every == 0 or step == args.steps:
            samples.append((step, sample()))
            sync()
    del opt  # the optimizer's hooks and handles go with it
    return samples, loss.item()


def report(name, samples, loss, args):
    """Prints rank 0's rows and every rank's growth; returns the failures of this rank."""
    first, last = samples[0][1], samples[-1][1]
    growth = 100.0 * (last["rss_kib"] - first["rss_kib"]) / first["rss_kib"]
    everyone = hvd.allgather_object((hvd.rank(), growth, first, last))
    if hvd.rank() == 0:
        print(f"\n## {name}: {args.steps} steps, warm-up {args.warmup}, final loss {loss:.3f}")
        print("| step | RSS MiB | " + " | ".join(GAUGES) + " |")
        print("|---" * (2 + len(GAUGES)) + "|")
        for step, s in samples:
            print(f"| {step} | {s['rss_kib'] / 1024:.1f} | " + " | ".join(str(s[g]) for g in GAUGES) + " |")
        for rank, grow, a, b in everyone:
            print(f"rank {rank}: RSS {a['rss_kib'] / 1024:.1f} -> {b['rss_kib'] / 1024:.1f} MiB ({grow:+.2f}%)")
        sys.stdout.flush()
    failures = []
    if growth > args.max_rss_growth:
        failures.append(f"{name}: rank {hvd.rank()} RSS grew {growth:.2f}% after warm-up (limit "
                        f"{args.max_rss_growth}%)")
    for gauge in GAUGES:
        if last[gauge] > first[gauge]:
            failures.append(f"{name}: rank {hvd.rank()} {gauge} grew from {first[gauge]} to {last[gauge]}")
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10000, help="steps per phase")
    p.add_argument("--warmup", type=int, default=500, help="steps before the first sample")
    p.add_argument("--every", type=int, default=1000, help="steps between samples")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--max-rss-growth", type=float, default=1.0, help="percent allowed after warm-up")
    p.add_argument("--timeline", default="", help="record a timeline to this file during the soak")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated: " + ", ".join(PHASES))
    args = p.parse_args()
    if args.warmup >= args.steps:
        p.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    hvd.init()
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    torch.set_num_threads(1)
    if args.timeline:
        hvd.start_timeline(args.timeline)
    failures = []
    for name in args.phases.split(","):
        if name not in PHASES:
            p.error(f"--phases: unknown phase '{name}' ({', '.join(PHASES)})")
        samples, loss = soak(name, PHASES[name](), args, x, y)
        failures += report(name, samples, loss, args)
    if args.timeline:
        hvd.stop_timeline()
    everyone = sum(hvd.allgather_object(failures), [])
    rank = hvd.rank()
    hvd.shutdown()
    if everyone:
        print("\n".join(["soak FAILED:"] + everyone), file=sys.stderr)
        sys.exit(1)
    if rank == 0:
        print("soak passed: no RSS growth beyond the limit, no gauge grew")


if __name__ == "__main__":
    main()
