"""The allreduce a training step makes, through gradcomp.torch, timed the same way however the
ranks were started (gcrun/mpirun, or torchrun with no MPI): examples/benchmarks/launcher_cluster.sh
runs it under both on one emulated cluster and compares.

    torchrun --nproc_per_node=2 examples/benchmarks/launch_bench.py --sizes-mb 64 --bits 4
    gcrun -np 2 python3 examples/benchmarks/launch_bench.py --sizes-mb 64 --bits 4

Each rank allreduces Gaussian float32 (a gradient's shape: rows of 1024) --reps times after one
warm-up; a repetition's time is the slowest rank's; rank 0 prints the median per size, with the
world the runtime negotiates over, and appends a JSON record per size to --json.
"""
import argparse
import json
import statistics
import time

import torch

import gradcomp.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", default="64")
    p.add_argument("--bits", type=int, default=4, help="max-min bits (0: uncompressed)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--label", default="", help="a label for the records (the driver passes the launcher)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    compression = hvd.Compression.maxmin(args.bits) if args.bits else hvd.Compression.none
    gen = torch.Generator().manual_seed(hvd.rank())
    for mb in (float(s) for s in args.sizes_mb.split(",")):
        rows = max(1, int(mb * (1 << 20) / 4 / 1024))
        grad = torch.randn(rows, 1024, generator=gen)
        times = []
        for rep in range(args.reps + 1):
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce(grad, name=f"grad{mb:g}", op=hvd.Average, compression=compression)
            took = torch.tensor([time.perf_counter() - start])
            slowest = hvd.allreduce(took, name=f"took{mb:g}", op=hvd.Max).item()
            if rep > 0:
                times.append(slowest)
        if hvd.rank() == 0:
            median = statistics.median(times)
            print(f"{args.label or 'allreduce'}: {mb:g} MB, {'maxmin ' + str(args.bits) if args.bits else 'none'}, "
                  f"{hvd.size()} ranks ({hvd.local_size()} a node): median {median:.4f} s "
                  f"(min {min(times):.4f}, max {max(times):.4f})", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"label": args.label, "mb": mb, "bits": args.bits, "ranks": hvd.size(),
                                        "median": median, "min": min(times), "max": max(times)}) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
