"""FSDP2 on backend gradcomp, compressed: the character-level GPT of examples/charlm.py trained
with torch's fully_shard (one FSDP2 module per transformer block, then the model) on
dist.init_process_group("gradcomp"). hvd.compress_fsdp gives every module a reduce-scatter and an
all-gather under its own name, so error feedback keeps one residual per module.

    GRADCOMP_ALLGATHER_COMPRESSION=maxmin GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 \\
    GRADCOMP_ERROR_FEEDBACK=1 gcrun -np 2 python examples/torch_fsdp2_charlm.py
    ... gcrun -np 4 python examples/torch_fsdp2_charlm.py --replicas 2     # HSDP, 2 replicas x 2

The settings choose the compression (docs/settings.md): GRADCOMP_ALLGATHER_COMPRESSION (and _BITS,
8 by default) for the weights each module all-gathers before its forward and backward,
GRADCOMP_COMPRESSION, _BITS and _ERROR_FEEDBACK for the gradients it reduce-scatters after its
backward (and, under HSDP, all-reduces across the replicas); none of them set is exact. Under
HSDP a shard group within one node stays exact. --backend gloo runs the same training on gloo.
Needs torch 2.9 or newer (pip's torch; FSDP2 on the CPU).

Every rank trains the same model (same initial weights) on its own stream of text windows, Adam
with warm-up and cosine decay; rank 0 prints each seed's validation loss (nats per character),
their mean, and the bytes gradcomp's codecs took in and put on the wire.
"""
import os
import sys

import torch
import torch.distributed as dist

try:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
except Exception:  # noqa: BLE001 - torch 1.13's fsdp fails to import on Python 3.11
    FSDPModule = None
if FSDPModule is None or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
    sys.exit(f"torch_fsdp2_charlm: needs torch 2.9 or newer (FSDP2 on the CPU); this is torch {torch.__version__}")

import gradcomp.torch as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fsdp_charlm import Block, main  # noqa: E402


def arguments(parser):
    parser.add_argument("--replicas", type=int, default=1,
                        help="HSDP: replicas of the sharded model (a 2-D mesh, replicas x ranks/replicas)")


_meshes = {}  # made once: each group of some ranks is a runtime of its own


def device_mesh(replicas):
    if replicas not in _meshes:
        n = dist.get_world_size()
        if n % replicas:
            raise SystemExit(f"torch_fsdp2_charlm: --replicas {replicas} does not divide {n} ranks")
        _meshes[replicas] = (init_device_mesh("cpu", (replicas, n // replicas), mesh_dim_names=("replicate", "shard"))
                             if replicas > 1 else init_device_mesh("cpu", (n,)))
    return _meshes[replicas]


def fsdp2(model, args):
    """fully_shard on each block, then on the model, over a 1-D mesh (or HSDP's 2-D one); on
    backend gradcomp, each module's exchanges named after it."""
    mesh = device_mesh(args.replicas)
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if dist.get_backend() == "gradcomp":
        hvd.compress_fsdp(model)
    return model


def process_sets():
    """The runtimes the meshes' groups run on: the world's (None) and HSDP's groups'."""
    groups = [mesh.get_group(dim) for mesh in _meshes.values() if mesh.ndim == 2 for dim in (0, 1)]
    return [None] + [g.process_set for g in groups if getattr(g, "process_set", None) is not None]


if __name__ == "__main__":
    main(fsdp2, "FSDP2", __doc__, arguments, process_sets)
