"""ResNet-20 with Deep Gradient Compression (top-k 0.1% with momentum correction).

    gcrun -np 2 /usr/bin/python3 examples/torch_dgc_resnet.py                  # synthetic data
    gcrun -np 4 /usr/bin/python3 examples/torch_dgc_resnet.py --data-dir ~/cifar-10-batches-py

DGC as its paper trains it: SGD with momentum 0.9, top-k sparsification of each gradient with
the momentum moved before sparsification (momentum correction) and momentum-factor masking —
gradcomp.torch.DistributedOptimizer takes the optimizer's momentum and weight decay over
(Compression.topk with momentum=None). Batch-norm weights and biases stay exact (layer filter).
CIFAR-10 comes from the python pickles (data_batch_1..5, test_batch) in --data-dir; without
it the data are random CIFAR-shaped images, which measures the mechanics, not accuracy.
"""
import argparse
import os
import pickle
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import gradcomp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet import ResNet20  # noqa: E402

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


def load_cifar(data_dir):
    def batch(name):
        with open(os.path.join(data_dir, name), "rb") as f:
            d = pickle.load(f, encoding="bytes")
        x = torch.tensor(np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32), dtype=torch.float32) / 255
        return (x - MEAN) / STD, torch.tensor(d[b"labels"], dtype=torch.int64)

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    xte, yte = batch("test_batch")
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), xte, yte


def synthetic(n_train, n_test, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_train, 3, 32, 32, generator=g), torch.randint(0, 10, (n_train,), generator=g),
            torch.randn(n_test, 3, 32, 32, generator=g), torch.randint(0, 10, (n_test,), generator=g))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--ratio", type=float, default=0.001, help="top-k ratio (DGC: 0.001)")
    p.add_argument("--synthetic-size", type=int, default=512, help="training images without --data-dir")
    args = p.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.data_dir and os.path.exists(os.path.join(args.data_dir, "data_batch_1")):
        xtr, ytr, xte, yte = load_cifar(args.data_dir)
        what = f"CIFAR-10 from {args.data_dir}"
    else:
        xtr, ytr, xte, yte = synthetic(args.synthetic_size, 256)
        what = "synthetic CIFAR-shaped data (pass --data-dir for CIFAR-10)"
    torch.manual_seed(0)
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(ResNet20())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.topk(args.ratio))
    if rank == 0:
        print(f"{what}; ResNet-20; {size} ranks; DGC top-k {args.ratio}", flush=True)
    steps = (len(ytr) // size) // args.batch_size
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(epoch))[rank::size]
        t0, total = time.time(), 0.0
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            x = xtr[idx]
            if args.data_dir:  # random crop and flip
                x = F.pad(x, (4, 4, 4, 4), mode="reflect")
                dx, dy = np.random.randint(0, 9, 2)
                x = x[:, :, dy:dy + 32, dx:dx + 32]
                if np.random.rand() < 0.5:
                    x = x.flip(3)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), ytr[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            correct = (model(xte[rank::size]).argmax(1) == yte[rank::size]).sum().double()
        acc = float(hvd.allreduce(correct, op=hvd.Sum, name="eval.correct")) / len(yte) * 100
        s = hvd.stats()
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {total / max(steps, 1):.4f}, test accuracy {acc:.2f}%, "
                  f"{time.time() - t0:.1f} s; top-k sent {s['compressed_bytes_on_wire'] / 1e6:.2f} MB for "
                  f"{s['compressed_bytes_in'] / 1e6:.2f} MB of gradients", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
