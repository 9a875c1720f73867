#!/usr/bin/env python3
"""torch.distributed gloo allreduce of float32 buffers, the peer in emulated_cluster.sh.
Rank and size come from Open MPI's environment; prints "RESULT gloo <MB> <seconds> <bytes>"."""
import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="1,4,16,64,256")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=size)
    for mb in [int(s) for s in args.sizes_mb.split(",")]:
        t = torch.randn(mb * (1 << 20) // 4) * 1e-3
        times = []
        for r in range(args.reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if r:
                times.append(dt.item())
        times.sort()
        if rank == 0:
            wire = int(2 * (size - 1) / size * mb * (1 << 20))
            print(f"RESULT gloo {mb} {times[len(times) // 2]:.6f} {wire}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
