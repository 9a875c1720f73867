"""Hugging Face Accelerate on backend gradcomp, compressed: the character-level GPT of
examples/charlm.py trained in an Accelerate loop, launched by `accelerate launch` (torchrun inside):

    GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 \\
        accelerate launch --multi_gpu --num_processes 2 examples/frameworks/accelerate_charlm.py

The way in is the process group: `dist.init_process_group("gradcomp")` before `Accelerator()`.
Accelerate keeps a group that is up, and `accelerator.prepare` wraps the model in DDP over it, so
DDP's buckets are all-reduced by the runtime, compressed per the settings (GRADCOMP_COMPRESSION,
_BITS, _MIN_SIZE). Naming the backend to Accelerate instead (InitProcessGroupKwargs, or
`--ddp_backend` for the Trainer) is refused on the CPU, where it allows gloo and mpi only.
--backend gloo runs the same training on gloo: the reference. Rank 0 prints the validation loss
(nats per character, over held-out windows) and the bytes gradcomp's codecs took in and sent.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

try:
    from accelerate import Accelerator
except ImportError:
    sys.exit("accelerate_charlm: needs Accelerate (pip install accelerate)")

import gradcomp.torch as hvd  # registers the "gradcomp" backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import CharGPT, add_training_arguments, corpus, lr_factor, validation_loss, windows  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gradcomp", "gloo"], default="gradcomp")
    p.add_argument("--steps", type=int, default=60)
    add_training_arguments(p)
    args = p.parse_args()
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR from the launcher
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)  # the same initial weights on every rank
    model = CharGPT(args.layers, args.width, args.heads, args.context)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.steps))
    text, held_out = corpus(args.corpus_mb)
    world = accelerator.num_processes
    data = torch.utils.data.TensorDataset(*windows(text, args.steps * args.batch_size * world, args.context,
                                                   torch.Generator().manual_seed(0)))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
    model, opt, loader, schedule = accelerator.prepare(model, opt, loader, schedule)
    for x, y in loader:  # each rank its share of the windows (Accelerate shards the loader)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        accelerator.backward(loss)
        opt.step()
        schedule.step()
        opt.zero_grad()
    val = validation_loss(model, held_out, args)
    stats = hvd.total_stats() if args.backend == "gradcomp" else {"compressed_bytes_in": 0,
                                                                  "compressed_bytes_on_wire": 0}
    if accelerator.is_main_process:
        params = sum(q.numel() for q in model.parameters())
        print(f"accelerate on {dist.get_backend()} ({type(model).__name__}), {world} ranks, {params / 1e6:.2f}M "
              f"parameters, {args.steps} steps of {args.batch_size} windows a rank")
        print(f"training loss: {loss.item():.6f}")
        print(f"validation loss: {val:.6f}")
        print(f"compressed: {stats['compressed_bytes_in']} bytes in, {stats['compressed_bytes_on_wire']} bytes on "
              "the wire", flush=True)
    accelerator.end_training()  # and the process group


if __name__ == "__main__":
    main()
