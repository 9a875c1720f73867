"""Low-communication training: the character-level GPT of charlm.py trained with DiLoCo
(hvd.DiLoCo), against data parallelism that syncs every step.

    gcrun -np 4 python3 examples/torch_diloco_charlm.py --sync-every 50 --bits 4      # DiLoCo, 4-bit syncs
    gcrun -np 4 python3 examples/torch_diloco_charlm.py --sync-every 48 --fragments 3 --delay 2   # Streaming
    gcrun -np 4 python3 examples/torch_diloco_charlm.py --mode ddp --backend gloo     # DDP on gloo
    GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 GRADCOMP_ERROR_FEEDBACK=1 \\
        gcrun -np 4 python3 examples/torch_diloco_charlm.py --mode ddp                # 4-bit DDP

Every rank trains on its own stream of text windows with AdamW (warm-up, cosine decay). Modes:

  diloco  hvd.DiLoCo: --sync-every inner steps alone, then the pseudo-gradients averaged (exact,
          or --bits max-min with error feedback) and applied by Nesterov SGD (--outer-lr,
          --outer-momentum); --fragments and --delay make it Streaming DiLoCo.
  ddp     DistributedDataParallel on --backend gradcomp (compressed per the GRADCOMP_* settings)
          or gloo: every step's gradients averaged.

Every --eval-every steps rank 0 prints the validation loss (nats per character, the same held-out
windows on every rank) against the training's wall time (evaluation excluded) and the bytes
each rank sent: its network interfaces' counters (loopback excluded: meaningful when each rank
has a host of its own, as on scripts/cluster.sh's nodes) and what gradcomp's codecs put on the
wire. The last line is a JSON record of the run.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import gradcomp.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charlm import CharGPT, add_training_arguments, corpus, train_step, validation_loss  # noqa: E402


def sent_bytes():
    """Bytes this process's network namespace has sent on its interfaces other than loopback."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, counters = line.split(":", 1)
            if name.strip() != "lo":
                total += int(counters.split()[8])
    return total


def mean_over_ranks(value):
    return sum(hvd.allgather_object(value)) / hvd.size()


def evaluation(model, held_out, args, step, trained, sent0, wire0):
    """The curve's point after `step` steps (every rank at once): the validation loss, the
    slowest rank's training seconds `trained`, the bytes each rank sent a step since `sent0`
    (its interfaces) and `wire0` (gradcomp's codecs); rank 0 prints it."""
    loss = validation_loss(model, held_out, args)
    model.train()
    sent = mean_over_ranks(sent_bytes() - sent0) / step
    wire = mean_over_ranks(hvd.stats()["compressed_bytes_on_wire"] - wire0) / step
    seconds = max(hvd.allgather_object(trained))
    if hvd.rank() == 0:
        print(f"  step {step}: {seconds:7.1f} s, validation loss {loss:.4f}, sent {sent / 1e3:9.1f} kB "
              f"a step and rank (codecs {wire / 1e3:.1f} kB)", flush=True)
    return {"step": step, "seconds": round(seconds, 2), "validation_loss": round(loss, 4),
            "sent_bytes_per_step": round(sent), "codec_bytes_per_step": round(wire)}


def add_diloco_arguments(parser):
    """The flags every DiLoCo run of the char LM takes (torchft's too), with the model's."""
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    add_training_arguments(parser)


def make_optimizer(model, args):
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if args.mode == "ddp":
        return inner
    compression = hvd.Compression.maxmin(bits=args.bits, error_feedback=True) if args.bits else hvd.Compression.none
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                            nesterov=args.outer_momentum > 0)
    return hvd.DiLoCo(model, inner, sync_every=args.sync_every, outer_optimizer=outer, compression=compression,
                      fragments=args.fragments, delay=args.delay)


def describe(args):
    if args.mode == "ddp":
        codec = os.environ.get("GRADCOMP_COMPRESSION", "none") if args.backend == "gradcomp" else "exact"
        return f"DDP on {args.backend} ({codec})"
    how = f"{args.bits}-bit" if args.bits else "exact"
    streaming = f", {args.fragments} fragments, delay {args.delay}" if args.fragments > 1 else ""
    return f"DiLoCo H={args.sync_every} ({how}{streaming})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["diloco", "ddp"], default="diloco")
    p.add_argument("--backend", choices=["gradcomp", "gloo"], default="gradcomp", help="--mode ddp's backend")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--bits", type=int, default=0, help="max-min bits of the outer syncs (0: exact)")
    p.add_argument("--fragments", type=int, default=1)
    p.add_argument("--delay", type=int, default=0)
    add_diloco_arguments(p)
    args = p.parse_args()
    hvd.init()
    if args.mode == "ddp":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("OMPI_MCA_ess_base_jobid", "0")) % 1000))
        dist.init_process_group(args.backend, rank=hvd.rank(), world_size=hvd.size())
    text, held_out = corpus(args.corpus_mb)
    torch.manual_seed(args.seed)
    model = CharGPT(args.layers, args.width, args.heads, args.context)
    if args.mode == "ddp":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed * 1000 + hvd.rank())
    params = sum(q.numel() for q in model.parameters())
    if hvd.rank() == 0:
        print(f"{describe(args)}: {hvd.size()} ranks, {params / 1e6:.2f}M parameters, {args.steps} steps of "
              f"{args.batch_size} windows a rank", flush=True)
    curve, trained, sent0, wire0 = [], 0.0, sent_bytes(), hvd.stats()["compressed_bytes_on_wire"]
    for step in range(args.steps):
        start = time.perf_counter()
        train_step(model, opt, text, args, step, gen)
        trained += time.perf_counter() - start
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append(evaluation(model, held_out, args, step + 1, trained, sent0, wire0))
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"run": describe(args), "ranks": hvd.size(), "parameters": params,
                                      "curve": curve}), flush=True)
    if args.mode == "ddp":
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
