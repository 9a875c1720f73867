"""Data-parallel training with gradient compression on handwritten digits.

    gcrun -np 4 --compression maxmin --bits 4 /usr/bin/python3 examples/torch_digits.py
    gcrun -np 4 /usr/bin/python3 examples/torch_digits.py --mode ddp --compression powersgd_fp16
    gcrun -np 2 /usr/bin/python3 examples/torch_digits.py --mode hvd --compression topk --topk-ratio 0.001
    gcrun -np 4 /usr/bin/python3 examples/torch_digits.py --use-adasum

The seeds' "DDP on MNIST with gradient compression" example on the 8x8 digits that
scikit-learn ships (real MNIST from --data-dir when its idx files are there). Two modes:

  hvd  gradcomp.torch.DistributedOptimizer (Horovod style). --compression none, fp16, maxmin,
       topk (DGC) or powersgd; without --compression the gcrun/GRADCOMP_* settings decide.
       --use-adasum (Horovod's examples' flag): the ranks' updates combined with Adasum, at the
       learning rate of one rank (exact values; --compression none or fp16).
  ddp  torch DistributedDataParallel on --backend gradcomp (default; compresses per the
       settings, as CGX does) or gloo. --compression none, fp16, powersgd, powersgd_fp16,
       batched_powersgd_fp16 (torch's own hooks) or maxmin (gradcomp's per-layer ddp_hook).

Batch norm layers become gradcomp's SyncBatchNorm (works on CPU). Rank 0 shows a progress bar,
logs to --log-dir, and prints top-1/top-5 test accuracy and the gradient bytes compression
saved. Ctrl-C stops every rank cleanly.
"""
import argparse
import gzip
import logging
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import gradcomp.torch as hvd

HVD_CHOICES = ("none", "fp16", "maxmin", "topk", "powersgd")
DDP_CHOICES = ("none", "fp16", "powersgd", "powersgd_fp16", "batched_powersgd_fp16", "maxmin")


class Net(nn.Module):
    """A small CNN for 1-channel images of any size (8x8 digits, 28x28 MNIST)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc1 = nn.Linear(64 * 16, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.pool(x).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def _find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    return None


def load_data(data_dir):
    """(train x, train y, test x, test y, description): MNIST from data_dir if present, else digits."""
    if data_dir:
        files = [_find(data_dir, s) for s in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
        if all(files):
            xtr, ytr, xte, yte = (_read_idx(f) for f in files)
            to_x = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(1) / 255.0  # noqa: E731
            return (to_x(xtr), torch.tensor(ytr, dtype=torch.int64), to_x(xte), torch.tensor(yte, dtype=torch.int64),
                    f"MNIST from {data_dir}")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("torch_digits.py: the digits come with scikit-learn (pip install scikit-learn, or Debian's "
                 "python3-sklearn), or point --data-dir at MNIST's idx files")
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    test, train = order[:360], order[360:]
    note = " (no MNIST idx files in --data-dir)" if data_dir else ""
    return x[train], y[train], x[test], y[test], "digits 8x8 from scikit-learn" + note


def accuracy_counts(output, target, topk=(1, 5)):
    """Correct predictions at each k."""
    _, pred = output.topk(max(topk), 1, True, True)
    correct = pred.t().eq(target.view(1, -1))
    return [float(correct[:k].reshape(-1).float().sum()) for k in topk]


def get_logger(path, rank):
    logger = logging.getLogger("torch_digits")
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    if rank == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        handler = logging.FileHandler(path, mode="w")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    else:
        logger.addHandler(logging.NullHandler())
    return logger


def progress(epoch, epochs, done, total, loss, width=30):
    filled = int(width * done / max(total, 1))
    line = f"\repoch {epoch + 1}/{epochs} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss:.4f}"
    sys.stderr.write(line)
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def ddp_hook_for(args, model):
    """Registers the comm hook the DDP mode's --compression names; returns its state."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as powerSGD
    c = args.compression
    if c in (None, "none"):
        return None
    if c == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if c == "maxmin":
        state = hvd.DDPHookState(None, layer_min_size=args.layer_min_size,
                                 compression_params={"bits": args.bits, "bucket_size": args.bucket_size,
                                                     "error_feedback": args.error_feedback})
        model.register_comm_hook(state, hvd.ddp_hook)
        return state
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.powersgd_start)
    hook = {"powersgd": powerSGD.powerSGD_hook,
            "powersgd_fp16": default_hooks.fp16_compress_wrapper(powerSGD.powerSGD_hook),
            "batched_powersgd_fp16": default_hooks.fp16_compress_wrapper(powerSGD.batched_powerSGD_hook)}[c]
    model.register_comm_hook(state, hook)
    return None


def hvd_compression(args):
    c = args.compression
    if c is None:
        return None  # the settings (gcrun --compression/--bits, GRADCOMP_*) decide
    return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
            "maxmin": hvd.Compression.maxmin(args.bits, args.bucket_size, error_feedback=args.error_feedback),
            "topk": hvd.Compression.topk(args.topk_ratio),
            "powersgd": hvd.Compression.powersgd(rank=args.powersgd_rank, start_iter=args.powersgd_start)}[c]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--mode", choices=("hvd", "ddp"), default="hvd")
    p.add_argument("--backend", choices=("gradcomp", "gloo"), default="gradcomp", help="ddp mode")
    p.add_argument("--compression", default=None, help=f"hvd: {', '.join(HVD_CHOICES)}; ddp: {', '.join(DDP_CHOICES)}")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--bucket-size", type=int, default=512)
    p.add_argument("--error-feedback", action="store_true")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--powersgd-start", type=int, default=10, help="plain allreduce for this many steps first")
    p.add_argument("--layer-min-size", type=int, default=1024, help="ddp + maxmin: smaller layers stay exact")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--data-dir", default="", help="a directory with MNIST idx files (else: digits)")
    p.add_argument("--log-dir", default="./logging", help="rank 0 writes digits_train.log here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--use-adasum", action="store_true", help="hvd mode: op=hvd.Adasum (the lr is not scaled by "
                   "the number of ranks)")
    args = p.parse_args(argv)
    if args.use_adasum and (args.mode != "hvd" or args.compression not in (None, "none", "fp16")):
        p.error("--use-adasum needs --mode hvd and --compression none or fp16 (Adasum combines exact values)")
    choices = HVD_CHOICES if args.mode == "hvd" else DDP_CHOICES
    if args.compression is not None and args.compression not in choices:
        p.error(f"--compression {args.compression} is not available in --mode {args.mode} (choose among "
                f"{', '.join(choices)})")
    if args.compression in ("powersgd_fp16", "batched_powersgd_fp16") and not torch.cuda.is_available():
        p.error(f"--compression {args.compression}: torch's fp16-wrapped PowerSGD hooks multiply float16 "
                "matrices, which torch does not implement on CPU; use --compression powersgd here")
    return args


def train(args):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    log = get_logger(os.path.join(args.log_dir, "digits_train.log"), rank)
    xtr, ytr, xte, yte, what = load_data(args.data_dir)
    torch.manual_seed(args.seed)
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(Net())
    hook_state = None
    if args.mode == "ddp":
        if not dist.is_initialized():
            dist.init_process_group(args.backend, rank=rank, world_size=size)
        net = nn.parallel.DistributedDataParallel(model)
        hook_state = ddp_hook_for(args, net)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr * size, momentum=0.9)
    else:
        net = model
        # Horovod's rule: Adasum adapts the combined update, so the lr stays one rank's.
        opt = torch.optim.SGD(model.parameters(), lr=args.lr * (1 if args.use_adasum else size), momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=hvd_compression(args),
                                       op=hvd.Adasum if args.use_adasum else hvd.Average)
    settings = {k: v for k, v in os.environ.items() if k.startswith(("GRADCOMP_COMPRESSION", "GRADCOMP_BITS"))}
    header = (f"{what}: {len(ytr)} train / {len(yte)} test images; {size} ranks; mode {args.mode}"
              + (f" on {args.backend}" if args.mode == "ddp" else "")
              + f"; compression {args.compression or 'from settings ' + str(settings or '(none)')}"
              + ("; op Adasum" if args.use_adasum else ""))
    if rank == 0:
        print(header, flush=True)
    log.info(header)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    steps_per_epoch = (len(ytr) // size) // args.batch_size
    step = 0
    start = time.time()
    show = rank == 0 and not args.no_progress and sys.stderr.isatty()
    for epoch in range(args.epochs):
        net.train()
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        mine = order[rank::size]
        total_loss = 0.0
        for i in range(steps_per_epoch):
            idx = mine[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total_loss += loss.item()
            step += 1
            if show:
                progress(epoch, args.epochs, i + 1, steps_per_epoch, total_loss / (i + 1))
            if args.max_steps and step >= args.max_steps:
                break
        sched.step()
        top1, top5 = evaluate(model, xte, yte)
        msg = (f"epoch {epoch + 1}: train loss {total_loss / max(i + 1, 1):.4f}, test top-1 {top1:.2f}% "
               f"top-5 {top5:.2f}%")
        log.info(msg)
        if rank == 0:
            print(msg, flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    top1, top5 = evaluate(model, xte, yte)
    report(args, rank, log, top1, top5, time.time() - start, step, hook_state)


def evaluate(model, xte, yte):
    """Top-1/top-5 accuracy on the whole test set; every rank scores its share."""
    model.eval()
    rank, size = hvd.rank(), hvd.size()
    with torch.no_grad():
        counts = torch.tensor(accuracy_counts(model(xte[rank::size]), yte[rank::size]) + [len(yte[rank::size])],
                              dtype=torch.float64)
    counts = hvd.allreduce(counts, op=hvd.Sum, name="eval.counts", compression=hvd.Compression.none)
    model.train()
    return float(counts[0] / counts[2] * 100), float(counts[1] / counts[2] * 100)


def report(args, rank, log, top1, top5, seconds, steps, hook_state):
    stats = hvd.stats()
    if hook_state is not None:
        bytes_in, wire = hook_state.bytes_in, hook_state.bytes_on_wire
        where = "per-layer ddp_hook"
    else:
        bytes_in, wire = stats["compressed_bytes_in"], stats["compressed_bytes_on_wire"]
        where = "gradcomp runtime"
    lines = [f"final test accuracy: top-1 {top1:.2f}%  top-5 {top5:.2f}%  ({steps} steps, {seconds:.1f} s)"]
    if bytes_in:
        # What a float32 ring allreduce of the same gradients would have sent from this rank.
        ring = bytes_in * 2 * (hvd.size() - 1) / hvd.size()
        lines.append(f"compressed gradients ({where}, rank {rank}): {bytes_in / 1e6:.2f} MB reduced, "
                     f"{wire / 1e6:.2f} MB sent where a float32 ring allreduce sends {ring / 1e6:.2f} MB "
                     f"({ring / max(wire, 1):.1f}x less, {(ring - wire) / 1e6:.2f} MB saved)")
    elif args.use_adasum:
        lines.append("Adasum combined the updates as " + ("float16 values (cast before the exchange)"
                                                          if args.compression == "fp16" else "exact float32 values"))
    else:
        lines.append("no gradient was compressed (pass gcrun --compression maxmin --bits 4, or --compression)")
    if hook_state is None and hvd.auto_summary():
        lines.append(hvd.auto_summary())
    for line in lines:
        log.info(line)
        if rank == 0:
            print(line, flush=True)


def main(argv=None):
    args = parse_args(argv)
    try:
        train(args)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted: stopping\n")
        hvd.shutdown()
        return 130
    if dist.is_initialized():
        dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
