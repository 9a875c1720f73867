"""A character-level GPT-style language model of the Python standard library's sources (which
Debian ships with python3): the corpus, the model and its training windows, shared by
torch_fsdp_charlm.py and benchmarks/accuracy_charlm.py."""
import glob
import math
import os
import statistics
import sys

import torch
import torch.nn as nn


def corpus(megabytes):
    """The standard library's modules, in name order: (train bytes, validation bytes); the last
    tenth of the files is held out."""
    root = os.path.dirname(os.__file__)
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    if not files:
        sys.exit(f"charlm: no Python sources under {root}")
    texts = []
    total = 0
    for path in files:
        with open(path, "rb") as f:
            texts.append(f.read())
        total += len(texts[-1])
        if total >= megabytes * 2**20:
            break
    held = max(1, len(texts) // 10)
    train, val = b"".join(texts[:-held]), b"".join(texts[-held:])
    return torch.frombuffer(bytearray(train), dtype=torch.uint8).long(), \
        torch.frombuffer(bytearray(val), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, layers, width, heads, context, vocab=256):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), diagonal=1))

    def forward(self, idx):
        """Logits, one row per position: (batch * context, vocab). Rows, not (batch, context,
        vocab): a Linear on 3-D input returns a view of its 2-D product, and FSDP2 warns that an
        in-place op on a root module's view output would skip its pre-backward hook."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x).flatten(0, 1))


def windows(text, count, context, generator):
    start = torch.randint(0, len(text) - context - 1, (count,), generator=generator)
    x = torch.stack([text[s:s + context] for s in start.tolist()])
    y = torch.stack([text[s + 1:s + context + 1] for s in start.tolist()])
    return x, y


def add_training_arguments(parser):
    """The model's, the corpus's and the training's flags (with the defaults the docs' figures use)."""
    parser.add_argument("--batch-size", type=int, default=8, help="windows per rank and step")
    parser.add_argument("--context", type=int, default=48)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--corpus-mb", type=float, default=4.0)
    parser.add_argument("--val-batches", type=int, default=20)


def lr_factor(step, steps):
    """The learning rate's share at `step`: warmed up over 20 steps, then a cosine to `steps`."""
    return min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def train_step(model, opt, text, args, step, generator):
    """One Adam step on a batch of windows at args.lr * lr_factor(step, args.steps); the
    training loss."""
    for group in opt.param_groups:
        group["lr"] = args.lr * lr_factor(step, args.steps)
    x, y = windows(text, args.batch_size, args.context, generator)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss


def validation_loss(model, held_out, args):
    """Mean cross-entropy (nats per character) over args.val_batches batches of 64 held-out
    windows, the same windows on every rank and in every run."""
    model.eval()
    vgen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        return statistics.mean(float(nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)))
                               for x, y in (windows(held_out, 64, args.context, vgen) for _ in range(args.val_batches)))
