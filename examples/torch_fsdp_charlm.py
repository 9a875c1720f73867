"""FSDP on backend gradcomp, compressed: a character-level GPT of the Python standard library's
sources trained with torch's FullyShardedDataParallel (one FSDP unit per transformer block) on
dist.init_process_group("gradcomp"), its weights allgathered and its gradients reduce-scattered
through gradcomp's codecs.

    GRADCOMP_ALLGATHER_COMPRESSION=maxmin GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 \\
        gcrun -np 2 python3 examples/torch_fsdp_charlm.py          # 8-bit weights, 4-bit gradients

The settings choose the compression (docs/settings.md): GRADCOMP_ALLGATHER_COMPRESSION (and
_BITS, 8 by default) for the weights FSDP unshards before each unit's forward and backward,
GRADCOMP_COMPRESSION (and GRADCOMP_BITS) for the gradients it reduce-scatters after each unit's
backward; none of them set is exact. --backend gloo runs the same training on torch's gloo
backend, for comparison. Needs torch 2 (FSDP on the CPU).

Every rank trains the same model (same initial weights) on its own stream of text windows, Adam
with warm-up and cosine decay; at the end every rank evaluates the same held-out windows and
rank 0 prints the validation loss (nats per character) of each seed, their mean, and the bytes
gradcomp's codecs took in and put on the wire.
"""
import argparse
import os
import statistics
import sys

import torch

if int(torch.__version__.split(".")[0]) < 2:
    sys.exit(f"torch_fsdp_charlm: needs torch 2 (FSDP with device_id=cpu and ModuleWrapPolicy); this is torch "
             f"{torch.__version__}")
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402

import gradcomp.torch as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charlm import Block, CharGPT, add_training_arguments, corpus, train_step, validation_loss  # noqa: E402


def fsdp(model, args):
    """`model` under FullyShardedDataParallel on the default group, one FSDP unit per block."""
    del args
    return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}))


def train(seed, args, text, held_out, wrap):
    """One seed's run: the model as `wrap` shards it, args.steps Adam steps; the validation loss."""
    torch.manual_seed(seed)
    model = wrap(CharGPT(args.layers, args.width, args.heads, args.context), args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    for step in range(args.steps):
        loss = train_step(model, opt, text, args, step, gen)
        if dist.get_rank() == 0 and args.log_every and (step + 1) % args.log_every == 0:
            print(f"  seed {seed} step {step + 1}: training loss {loss.item():.4f}", flush=True)
    return validation_loss(model, held_out, args)


def main(wrap=fsdp, label="FSDP", doc=__doc__, arguments=None, process_sets=lambda: [None]):
    """Trains --seeds runs of the model as `wrap(model, args)` shards it (`arguments(parser)` adds
    its flags) and prints their validation losses and the bytes the codecs took in and sent in
    the runtimes of `process_sets()` (None: the world's), `label` naming it."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--backend", choices=["gradcomp", "gloo"], default="gradcomp")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=1)
    add_training_arguments(p)
    if arguments is not None:
        arguments(p)
    p.add_argument("--log-every", type=int, default=100, help="steps between two training-loss lines (0: none)")
    args = p.parse_args()
    hvd.init()  # the ranks come from MPI (gcrun / mpirun), for both backends
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("OMPI_MCA_ess_base_jobid", "0")) % 1000))
    dist.init_process_group(args.backend, rank=hvd.rank(), world_size=hvd.size())
    text, held_out = corpus(args.corpus_mb)
    before = hvd.stats()
    losses = [train(seed, args, text, held_out, wrap) for seed in range(args.seeds)]
    into, wire = (sum(hvd.stats(ps)[key] for ps in process_sets()) - before[key]
                  for key in ("compressed_bytes_in", "compressed_bytes_on_wire"))
    if dist.get_rank() == 0:
        params = sum(q.numel() for q in CharGPT(args.layers, args.width, args.heads, args.context).parameters())
        codecs = (f"weights {os.environ.get('GRADCOMP_ALLGATHER_COMPRESSION', 'none')}, gradients "
                  f"{os.environ.get('GRADCOMP_COMPRESSION', 'none')}" if args.backend == "gradcomp" else "exact")
        print(f"{label} on {args.backend} ({codecs}), {dist.get_world_size()} ranks, {params / 1e6:.2f}M parameters, "
              f"{args.steps} steps of {args.batch_size} windows a rank")
        print("validation loss by seed: " + ", ".join(f"{v:.4f}" for v in losses))
        print(f"validation loss: {statistics.mean(losses):.4f} (mean of {len(losses)} seeds)")
        print(f"compressed: {into / 2**20:.1f} MiB in, {wire / 2**20:.1f} MiB on the wire", flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
