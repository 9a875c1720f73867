"""Horovod-style synthetic throughput benchmark for gradcomp.torch.

    gcrun -np 2 /usr/bin/python3 examples/torch_synthetic_benchmark.py --model resnet20
    gcrun -np 2 --compression maxmin --bits 4 /usr/bin/python3 examples/torch_synthetic_benchmark.py

Trains on random data with DistributedOptimizer and prints images/s per rank and in total,
with a 95% confidence interval over the timed iterations (as Horovod's benchmark does).
"""
import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import gradcomp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet import ResNet20  # noqa: E402

MODELS = {
    "resnet20": (lambda: ResNet20(), (3, 32, 32)),
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 1024), torch.nn.ReLU(),
                                        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)),
            (3, 32, 32)),
}
COMPRESSIONS = {"none": lambda a: hvd.Compression.none, "fp16": lambda a: hvd.Compression.fp16,
                "maxmin": lambda a: hvd.Compression.maxmin(a.bits), "topk": lambda a: hvd.Compression.topk(a.topk_ratio),
                "powersgd": lambda a: hvd.Compression.powersgd(rank=a.powersgd_rank, start_iter=0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet20")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--compression", choices=sorted(COMPRESSIONS), default=None,
                   help="default: the settings (gcrun --compression ...)")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--powersgd-rank", type=int, default=2)
    args = p.parse_args()

    hvd.init()
    build, shape = MODELS[args.model]
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=COMPRESSIONS[args.compression](args) if args.compression else None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} ranks, compression "
        f"{args.compression or 'from settings'}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per rank: {mean:.1f} +- {conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +- {hvd.size() * conf:.1f}")
    s = hvd.stats()
    if s["compressed_bytes_in"]:
        log(f"compressed gradients: {s['compressed_bytes_in'] / 1e6:.1f} MB reduced, "
            f"{s['compressed_bytes_on_wire'] / 1e6:.1f} MB sent by rank 0")
    hvd.shutdown()


if __name__ == "__main__":
    main()
