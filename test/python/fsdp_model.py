"""What the FSDP suites (test_fsdp_mpi.py, test_fsdp2_mpi.py) train: residual MLP blocks, one FSDP
unit or module each, on a batch whose loss falls in a few steps."""
import hashlib

import torch

import gradcomp.torch as hvd


class Block(torch.nn.Module):
    """LayerNorm, up to `hidden`, ReLU, down to `width`, plus the input: ~1M parameters at
    512 x 1000-1024."""

    def __init__(self, width, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def make_model(width, hidden, blocks, seed=0):
    """`blocks` Blocks and a 10-way head, the same weights on every rank."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Block(width, hidden) for _ in range(blocks)], torch.nn.Linear(width, 10))


def batch(width, per_rank):
    """This rank's rows of the batch (the same every step); the label is which of the first 10
    inputs is largest."""
    g = torch.Generator().manual_seed(900)
    x = torch.randn(per_rank * hvd.size(), width, generator=g)
    rows = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
    return x[rows], x[rows, :10].argmax(1)


def digest(tensors):
    """A hash of the tensors' values (as float32: bf16 too)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().clone().numpy().tobytes())  # a copy: a numpy view pins the storage's size
    return h.hexdigest()
