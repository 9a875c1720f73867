"""One rank of a job that creates backend gradcomp's default group again and again, as CGX's test
suite does once per test: init_process_group("gradcomp", init_method="env://") on the same
MASTER_PORT, an allreduce (checked), destroy_process_group(). test_faults.py runs it beside busy
loops, where a rank quick to come back can meet rank 0's previous store. Each rank says when each
generation's group is up, and when it failed, so the test can time the end from the last progress.

    regroup_worker.py GENERATIONS TIMEOUT_SECONDS
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import gradcomp.torch  # noqa: F401  (registers the backend)

rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
generations, timeout = int(sys.argv[1]), float(sys.argv[2])
for generation in range(generations):
    try:
        dist.init_process_group("gradcomp", init_method="env://", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout))
    except Exception as e:
        print(f"regroup rank {rank} at {time.time():.3f}: failed in generation {generation}: "
              f"{type(e).__name__}", flush=True)
        raise
    print(f"regroup rank {rank} at {time.time():.3f}: generation {generation}", flush=True)
    t = torch.full((1 << 16,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == size * (size + 1) / 2), (generation, t[:4])
    dist.destroy_process_group()
print(f"regroup rank {rank} at {time.time():.3f}: finished {generations} generations", flush=True)
