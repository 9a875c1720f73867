"""The DiLoCo suites' training (test_diloco_mpi.py, test_diloco_nodes_mpi.py): a 1.2M-parameter
MLP on sklearn's digits, each rank training on its own share, with fingerprints of the weights
to compare replicas across ranks."""
import hashlib

import torch

import gradcomp.torch as hvd


def digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def make_model(seed):
    torch.manual_seed(seed)  # a different start on every rank: DiLoCo broadcasts rank 0's
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def fingerprint(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_on_every_rank(tensors):
    return len(set(hvd.allgather_object(fingerprint(tensors)))) == 1


def evaluate(model, x, y):
    with torch.no_grad():
        out = model(x)
        return torch.nn.functional.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def batches(x, y, steps, batch=32):
    """This rank's third of the training set, `steps` batches, reshuffled each pass."""
    mine = torch.arange(hvd.rank(), len(x), hvd.size())
    g = torch.Generator().manual_seed(hvd.rank())
    order = mine[torch.randperm(len(mine), generator=g)]
    for s in range(steps):
        i = (s * batch) % (len(order) - batch)
        idx = order[i:i + batch]
        yield x[idx], y[idx]


def run(opt, model, steps):
    """One optimizer step per (inputs, labels) batch of `steps`."""
    for bx, by in steps:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(bx), by).backward()
        opt.step()


def train(sync_every, steps, compression=None, fragments=1, delay=0, name="diloco", check=None, workers="rank"):
    """Trains with DiLoCo; `check(opt, step)` runs after every step. Returns (model, losses)."""
    x, y, xt, yt = digits()
    model = make_model(hvd.rank())
    # DiLoCo's outer Nesterov (lr 0.7, momentum 0.9) with a faster inner lr overfits 500 images
    # per rank within 150 steps (the validation loss turns up while the accuracy holds).
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    opt = hvd.DiLoCo(model, inner, sync_every=sync_every, compression=compression, fragments=fragments,
                     delay=delay, name=name, workers=workers)
    assert same_on_every_rank(model.parameters())  # rank 0's start, broadcast
    start = evaluate(model, xt, yt)
    if check:
        check(opt, 0)
    for step, (bx, by) in enumerate(batches(x, y, steps), 1):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(bx), by).backward()
        opt.step()
        if check:
            check(opt, step)
    return model, start, evaluate(model, xt, yt)
