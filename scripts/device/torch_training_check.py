"""Training steps through each of gradcomp's PyTorch adapters, on a GPU when there is one.

    mpirun -np 2 python3 scripts/device/torch_training_check.py [--device cuda|cpu] [--steps N]

For scripts/device/check.sh (ranks started by mpirun, no gcrun, torch 2.x on the GPU machine),
and runnable anywhere. A 1.6M-parameter MLP, each rank its own half of a fixed batch, DDP
buckets of 1 MB (several a step), through:

  hvd_none      DistributedOptimizer, uncompressed: must equal one process training on the
                whole batch (same steps, same seed) to float32 rounding
  hvd_maxmin4   DistributedOptimizer, 4-bit max-min with error feedback
  ddp_backend   DDP on backend gradcomp (the settings' compression: none unless GRADCOMP_*)
  ddp_hook4     DDP on backend gradcomp with ddp_hook, 4 bits per layer

Each must leave every rank with the same parameters, keep them on the device, and lower the
loss; each prints its loss and how far it ended from the exact run. Then two checks on the
device's tensors:

  p2p           the backend's isend/irecv around the ranks and batch_isend_irecv (torch 2 brackets a
                batch of GPU tensors with _start/_end_coalescing), values and device kept
  adasum        hvd.allreduce(op=Adasum): on GPUs through the CUDA data path the nodes' averages
                (one node here: the plain average), else the ranks' Adasum tree

Exits nonzero (every rank names the failing mode or check) otherwise.
"""
import argparse
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gradcomp.torch as hvd


def make_model(device):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10)).to(device)


def batch(step, device):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(64, 256, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(256, 10, generator=teacher)
    return x.to(device), (x @ w).argmax(1).to(device)


def mine(t):
    half = t.shape[0] // hvd.size()
    return t[hvd.rank() * half:(hvd.rank() + 1) * half]


def train(model, step_fn, steps, device):
    losses = []
    for step in range(steps):
        x, y = batch(step % 4, device)  # four batches, seen in turn
        losses.append(step_fn(model, x, y))
    return losses


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def exact_run(steps, device):
    """One process, the whole batch: what uncompressed data parallelism must reproduce."""
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(m, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return model, train(model, step, steps, device)


def hvd_run(steps, device, compression, name):
    model = make_model(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=[(f"{name}.{n}", p) for n, p in model.named_parameters()],
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step(m, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(mine(x)), mine(y))
        loss.backward()
        opt.step()
        return hvd.allreduce(loss.detach(), name=f"{name}.loss").item()

    return model, train(model, step, steps, device)


def ddp_run(steps, device, hook):
    model = make_model(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    if hook:
        ddp.register_comm_hook(hvd.DDPHookState(dist.group.WORLD, layer_min_size=1024,
                                                compression_params={"bits": 4, "bucket_size": 512}), hvd.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)

    def step(m, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(mine(x)), mine(y))
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / hvd.size()

    return model, train(ddp, step, steps, device)


def p2p_check(device):
    me, n = hvd.rank(), hvd.size()
    nxt, prev = (me + 1) % n, (me - 1) % n
    out, got = torch.full((1 << 20,), float(me), device=device), torch.empty(1 << 20, device=device)
    for work in [dist.isend(out, nxt), dist.irecv(got, prev)]:
        work.wait()
    problems = [] if torch.equal(got.cpu(), torch.full((1 << 20,), float(prev))) else ["isend/irecv: wrong values"]
    right, left = torch.empty(4, 3, device=device), torch.empty(4, 3, device=device)
    block = torch.arange(12.0, device=device).reshape(4, 3) + 100 * me
    ops = [dist.P2POp(dist.isend, block, nxt), dist.P2POp(dist.isend, block, prev),
           dist.P2POp(dist.irecv, right, nxt), dist.P2POp(dist.irecv, left, prev)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for peer, t in ((nxt, right), (prev, left)):
        if t.device.type != device.type or not torch.equal(t.cpu(), torch.arange(12.0).reshape(4, 3) + 100 * peer):
            problems.append(f"batch_isend_irecv: wrong values or device from rank {peer}")
    return problems


def adasum_check(device):
    from gradcomp import _core
    g = torch.Generator().manual_seed(hvd.rank())
    x = (torch.randn(100000, generator=g) + 1.0).to(device)  # a shared component: neither orthogonal nor equal
    got = hvd.allreduce(x, op=hvd.Adasum, name="check.adasum").double().cpu()
    vs = hvd.allgather(x.double().reshape(1, -1).cpu(), name="check.adasum.inputs")
    if device.type == "cuda" and _core.cuda_data_path():
        # The nodes' averages (Horovod's GPU Adasum); every rank of this check shares a node.
        want, what = vs.mean(0), "the node's average"
    else:
        level = list(vs)
        while len(level) > 1:  # the tree of whole ranks (a power of two here)
            nxt_level = []
            for a, b in zip(level[0::2], level[1::2]):
                dot = a.dot(b)
                nxt_level.append((1 - dot / (2 * a.dot(a))) * a + (1 - dot / (2 * b.dot(b))) * b)
            level = nxt_level
        want, what = level[0], "the ranks' Adasum tree"
    off = ((got - want).norm() / want.norm()).item()
    return [] if off < 1e-5 else [f"Adasum is {off:.2e} from {what}"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    hvd.init()
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device(args.device)
    # Started by mpirun, not gcrun: torch's store (which the backend does not use past start-up)
    # is a file that rank 0 names.
    path = hvd.broadcast_object(tempfile.mktemp(prefix="gradcomp-store-") if hvd.rank() == 0 else None, 0)
    dist.init_process_group("gradcomp", store=dist.FileStore(path, hvd.size()), rank=hvd.rank(),
                            world_size=hvd.size())
    me = hvd.rank()
    print(f"rank {me}: torch {torch.__version__}, device {device}, cuda_built {hvd.cuda_built()}, "
          f"nccl_built {hvd.nccl_built()}", flush=True)
    exact, exact_losses = exact_run(args.steps, device)
    runs = {
        "hvd_none": lambda: hvd_run(args.steps, device, hvd.Compression.none, "none"),
        "hvd_maxmin4": lambda: hvd_run(args.steps, device, hvd.Compression.maxmin(bits=4, error_feedback=True),
                                       "maxmin4"),
        "ddp_backend": lambda: ddp_run(args.steps, device, hook=False),
        "ddp_hook4": lambda: ddp_run(args.steps, device, hook=True),
    }
    failed = []
    for mode, run in runs.items():
        try:
            model, losses = run()
            params = flat(model)
            gathered = hvd.allgather(params.reshape(1, -1), name=f"{mode}.params")
            spread = (gathered - gathered[0]).abs().max().item()
            off = ((params - flat(exact)).norm() / flat(exact).norm()).item()
            problems = []
            if params.device.type != device.type:
                problems.append(f"parameters on {params.device}")
            if spread != 0:
                problems.append(f"ranks differ by up to {spread:g}")
            if not losses[-1] < 0.7 * losses[0]:
                problems.append(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} (not below 70%)")
            if mode in ("hvd_none", "ddp_backend") and off > 1e-4:
                problems.append(f"{off:.2e} from the exact run (uncompressed must match it)")
            print(f"rank {me}: {mode}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (exact run {exact_losses[-1]:.4f}), "
                  f"{off:.2e} from the exact run's parameters{': ' + '; '.join(problems) if problems else ''}",
                  flush=True)
            if problems:
                failed.append(mode)
        except Exception as e:  # noqa: BLE001 - reported per mode, every mode runs
            print(f"rank {me}: {mode}: {type(e).__name__}: {e}", flush=True)
            failed.append(mode)
    for name, check in (("p2p", p2p_check), ("adasum", adasum_check)):
        try:
            problems = check(device)
        except Exception as e:  # noqa: BLE001 - reported per check, every check runs
            problems = [f"{type(e).__name__}: {e}"]
        print(f"rank {me}: {name}: {'; '.join(problems) if problems else 'ok'}", flush=True)
        if problems:
            failed.append(name)
    print(f"rank {me}: {'FAILED: ' + ', '.join(failed) if failed else 'every adapter trained, every check passed'}",
          flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
