#!/usr/bin/env python3
"""How often gradcomp's background thread wakes, and how much CPU it uses, per allreduce.

Allreduces of float32 tensors through gradcomp.numpy (uncompressed and 4-bit max-min by
default); rank 0 prints, per size and compression, the time per allreduce and what each of
gradcomp's threads (gc-*) did per allreduce: voluntary context switches (wake-ups) from
/proc/self/task/*/status and CPU time from schedstat. Run it on the emulated cluster, e.g.

    sudo bash scripts/cluster.sh up wk 2 1gbit > /tmp/prefix   # prints the mpirun prefix
    $(cat /tmp/prefix | tr '\\n' ' ') -np 2 -x GRADCOMP_CROSS_COMMUNICATOR=tcp \\
        /usr/bin/python3 examples/benchmarks/exchange_wakeups.py
    sudo bash scripts/cluster.sh down wk
"""
import argparse
import glob
import os
import time

import numpy as np

import gradcomp.numpy as g


def thread_counters():
    """{thread name: [voluntary switches, CPU seconds]} over gradcomp's live threads."""
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/comm") as f:
                name = f.read().strip()
            with open(task + "/status") as f:
                status = f.read()
            with open(task + "/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
        except OSError:  # the thread ended meanwhile
            continue
        if not name.startswith("gc-"):
            continue
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        counters = out.setdefault(name, [0, 0.0])
        counters[0] += switches
        counters[1] += cpu
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="16,1")
    ap.add_argument("--compressions", default="maxmin4,none", help="comma-separated: none, maxminB (B bits)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    g.init()
    rank = g.rank()
    for mb in [float(s) for s in args.sizes_mb.split(",")]:
        for name in args.compressions.split(","):
            spec = "none" if name == "none" else {"codec": "maxmin", "bits": int(name[len("maxmin"):])}
            count = int(mb * (1 << 18)) // 1000 * 1000
            x = np.random.RandomState(rank).randn(count // 1000, 1000).astype(np.float32)
            tensor = f"w.{mb}.{name}"
            for _ in range(3):  # negotiated, cached, warm
                g.allreduce(x, name=tensor, op=g.Average, compression=spec)
            before = thread_counters()
            start = time.perf_counter()
            for _ in range(args.reps):
                g.allreduce(x, name=tensor, op=g.Average, compression=spec)
            seconds = (time.perf_counter() - start) / args.reps
            after = thread_counters()
            if rank == 0:
                threads = ", ".join(
                    f"{t} {(after[t][0] - before[t][0]) / args.reps:.0f} switches "
                    f"{1e3 * (after[t][1] - before[t][1]) / args.reps:.1f} ms CPU"
                    for t in sorted(after) if t in before)
                print(f"{os.environ.get('GRADCOMP_CROSS_COMMUNICATOR', 'auto')} {mb:g} MB {name}: "
                      f"{seconds * 1e3:.1f} ms per allreduce; {threads}", flush=True)
    g.shutdown()


if __name__ == "__main__":
    main()
