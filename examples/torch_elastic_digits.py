"""Elastic training on the digits: goes on when ranks fail, hosts leave or hosts join.

    gcrun --elastic -np 3 --min-np 2 -H localhost:3 /usr/bin/python3 examples/torch_elastic_digits.py
    gcrun --elastic --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh \\
        /usr/bin/python3 examples/torch_elastic_digits.py --epochs 30
    gcrun --elastic -np 3 --min-np 2 -H localhost:3 /usr/bin/python3 examples/torch_elastic_digits.py \\
        --diloco 10

A Horovod elastic script with the import changed: the model, the optimizer, an ElasticSampler
and the epoch live in a TorchState that is committed every --commit-every batches and at the
end of each epoch. When a rank dies, gcrun relaunches on the hosts left and the job goes on
from the last commit; when the discovery script shows more hosts, the ranks stop at their next
commit and gcrun relaunches on all of them. The learning rate follows the number of ranks (a
reset callback). With --diloco H the optimizer is hvd.DiLoCo instead (H steps alone, then an
outer sync): a relaunched job goes on from the last outer sync. Rank 0 prints each epoch's test
accuracy and, at the end, a RESULT line.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import gradcomp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_digits import Net, load_data  # noqa: E402


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum().item()
    model.train()
    return correct / len(y)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank: the optimizer's is lr x ranks (DiLoCo: lr)")
    p.add_argument("--diloco", type=int, default=0, metavar="H", help="DiLoCo, an outer sync every H steps")
    p.add_argument("--bits", type=int, default=4, help="max-min quantization of the gradients (0: none)")
    p.add_argument("--commit-every", type=int, default=5, help="batches between two commits")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--result", help="rank 0 writes the final figures here as JSON")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte, source = load_data(None)
    dataset = TensorDataset(xtr, ytr)

    model = Net()
    scale = (lambda: 1) if args.diloco else hvd.size  # the inner lr of DiLoCo is one rank's
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * scale(), momentum=0.9)
    # DiLoCo's compressed syncs carry their error to the next sync (its memories are committed).
    compression = hvd.Compression.maxmin(args.bits, error_feedback=bool(args.diloco)) if args.bits \
        else hvd.Compression.none
    if args.diloco:
        optimizer = hvd.DiLoCo(model, optimizer, sync_every=args.diloco, compression=compression)
    else:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batches=0)

    def on_reset():  # a relaunch may have changed the number of ranks
        for group in optimizer.param_groups:
            group["lr"] = args.lr * scale()
        if hvd.rank() == 0:
            print(f"reset: {hvd.size()} ranks, learning rate {args.lr * scale():g}, "
                  f"resuming epoch {state.epoch} after {state.batches} batches", flush=True)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
            for i, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(i, args.batch_size)
                state.batches += 1
                if state.batches % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            acc = evaluate(model, xte, yte)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}/{args.epochs}: {hvd.size()} ranks, {state.batches} batches, "
                      f"test accuracy {100 * acc:.2f}%", flush=True)
            state.commit()

    train(state)
    acc = evaluate(model, xte, yte)
    if hvd.rank() == 0:
        result = {"accuracy": acc, "ranks": hvd.size(), "epochs": state.epoch, "batches": state.batches,
                  "commits": state.commits, "resets": hvd.elastic.resets(),
                  "data": source}
        print("RESULT " + json.dumps(result), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
