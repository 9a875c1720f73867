"""Horovod-style synthetic throughput benchmark for gradcomp.torch.

    gcrun -np 2 /usr/bin/python3 examples/torch_synthetic_benchmark.py --model resnet20
    gcrun -np 2 --compression maxmin --bits 4 /usr/bin/python3 examples/torch_synthetic_benchmark.py
    gcrun -np 8 python3 examples/torch_synthetic_benchmark.py --model resnet50 --fp16-allreduce

Trains on random data with DistributedOptimizer and prints images/s per rank and in total,
with a 95% confidence interval over the timed iterations (as Horovod's benchmark does). As
Horovod's, it runs on the GPU of each rank's local rank when CUDA is there (--no-cuda: the
CPU), and takes its flags --fp16-allreduce and --use-adasum (the learning rate is scaled by
the ranks, by nothing with Adasum, by the node's ranks with Adasum on GPUs, as Horovod's
examples do). Models: resnet20 (CIFAR-shaped), resnet18 (ImageNet-shaped), mlp, or any
torchvision model by name where torchvision is installed (Horovod's default, resnet50).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import gradcomp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet import ResNet18, ResNet20  # noqa: E402

MODELS = {
    "resnet20": (lambda: ResNet20(), (3, 32, 32)),
    "resnet18": (lambda: ResNet18(), (3, 224, 224)),
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 1024), torch.nn.ReLU(),
                                        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)),
            (3, 32, 32)),
}
COMPRESSIONS = {"none": lambda a: hvd.Compression.none, "fp16": lambda a: hvd.Compression.fp16,
                "maxmin": lambda a: hvd.Compression.maxmin(a.bits), "topk": lambda a: hvd.Compression.topk(a.topk_ratio),
                "powersgd": lambda a: hvd.Compression.powersgd(rank=a.powersgd_rank, start_iter=0)}


def build_model(name):
    """Our models by name, else torchvision's (ImageNet-shaped input)."""
    if name in MODELS:
        build, shape = MODELS[name]
        return build(), shape
    try:
        import torchvision.models
    except ImportError:
        raise SystemExit(f"--model {name}: not one of {sorted(MODELS)}, and torchvision (for its models) is not "
                         "installed") from None
    if not callable(getattr(torchvision.models, name, None)):
        raise SystemExit(f"--model {name}: neither one of {sorted(MODELS)} nor a torchvision model")
    return getattr(torchvision.models, name)(), (3, 224, 224)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet20", help=f"{', '.join(sorted(MODELS))} or a torchvision model")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--compression", choices=sorted(COMPRESSIONS), default=None,
                   help="default: the settings (gcrun --compression ...)")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--fp16-allreduce", action="store_true", help="Horovod's flag: --compression fp16")
    p.add_argument("--use-adasum", action="store_true", help="op=hvd.Adasum (exact values: none or fp16)")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU although CUDA is there")
    args = p.parse_args()
    if args.fp16_allreduce:
        if args.compression not in (None, "fp16"):
            p.error(f"--fp16-allreduce and --compression {args.compression} ask for two compressions")
        args.compression = "fp16"
    if args.use_adasum and args.compression not in (None, "none", "fp16"):
        p.error(f"--use-adasum combines exact values: --compression none or fp16, not {args.compression}")
    cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model, shape = build_model(args.model)
    model.to(device)
    # Horovod's examples: the lr grows with the ranks averaged; Adasum needs no scaling, except
    # on GPUs, where it combines the nodes' averages.
    lr_scaler = hvd.size() if not args.use_adasum else (hvd.local_size() if cuda and hvd.nccl_built() else 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler, momentum=0.9)
    compression = COMPRESSIONS[args.compression](args) if args.compression else None
    if args.use_adasum and compression is None:
        compression = hvd.Compression.none  # Adasum never takes the settings' compression
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression,
                                   op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(args.batch_size, *shape, device=device)
    target = torch.randint(0, 10, (args.batch_size,), device=device)

    def benchmark_step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def timed(number):
        start = time.perf_counter()
        for _ in range(number):
            benchmark_step()
        if cuda:
            torch.cuda.synchronize()  # the last step's update is queued on the GPU
        return time.perf_counter() - start

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} ranks on "
        f"{'GPU' if cuda else 'CPU'}, compression {args.compression or 'from settings'}"
        + (", op Adasum" if args.use_adasum else ""))
    timed(args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        t = timed(args.num_batches_per_iter)
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
