"""Training step time and scaling efficiency of real model shapes, every exchange side by side.

    mpirun -np 2 /usr/bin/python3 examples/benchmarks/step_bench.py --model mlp
    sudo bash examples/benchmarks/step_cluster.sh --rate 1gbit --models mlp,resnet18   # 2 emulated nodes

Each rank trains the same model on random data of the model's real shape; every variant gets a
fresh copy of the model, runs --warmup steps, then --steps timed steps (zero_grad, forward,
backward, optimizer step; DDP waits for its exchange at the end of backward, DistributedOptimizer
in step()). A step's time is the slowest rank's; the figure is the median step.

Scaling efficiency = the step time with no exchange at all (every rank computing at the same
time, so the cores and memory are as busy as in the other rows) / the variant's step time.

Variants (--variants, comma-separated; default all):
  compute              no exchange (the reference)
  ddp                  torch DDP on gloo
  ddp_fp16             + torch's fp16_compress_hook
  ddp_powersgd         + torch's PowerSGD hook (rank 1, error feedback, warm start; one bucket,
                       since with several it hangs on gloo: see build())
  gc_none, gc_fp16, gc_maxmin8, gc_maxmin4, gc_maxmin4_ef, gc_topk1, gc_topk01, gc_powersgd,
  gc_auto              gradcomp.torch.DistributedOptimizer with that compression (gc_auto:
                       Compression.auto, per tensor against 4 bits, cost model on)
  gc_none_ovl, gc_maxmin4_ovl
                       the same with overlap_forward=model: step() returns at once and each
                       module's update waits for the next forward to reach it (gradients
                       prioritized by forward order, large ones in slices)
  backend4             DDP on torch.distributed backend "gradcomp" (maxmin 4 bits from the settings)
  hook4                DDP on gloo with gradcomp's ddp_hook (maxmin 4 bits; reducing in each node
                       first on nodes of several ranks, its default)
  hook4_flat           the same with node_rows=False (one exchange over all ranks)

--interleave builds every variant's model at once and runs them one step each in turn, every
step started together on all ranks: within one job this machine's step time drifts by up to
25%, which sequential rows take as a difference between variants; interleaved, the drift falls
on every variant alike. The `_ovl` variants run back to back after the others (their exchange
runs on into whatever follows their step).

CPU: the training thread's CPU time per step and that of every other thread of the process
(gradcomp's background and pipeline threads, gloo's, MPI's), averaged over ranks: where the
exchange's work runs, and how much of the cores it takes from training when they are shared.

Rank 0 prints one line per variant as it finishes and a Markdown table at the end; --json FILE
appends one record per variant (model, variant, seconds per step, efficiency, ranks, link).
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import gradcomp.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from resnet import ResNet18, ResNet20  # noqa: E402


class GPT2(nn.Module):
    """GPT-2-small's shapes (vocabulary 50257, width 768, 12 heads, 1024 positions, tied output
    embedding) with fewer layers: pre-norm causal transformer blocks."""

    def __init__(self, layers=2, vocab=50257, width=768, heads=12, positions=1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(positions, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        causal = torch.triu(torch.full((t, t), float("-inf")), 1)
        return self.norm(self.blocks(x, mask=causal)) @ self.tok.weight.t()


def mlp():
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


def classify(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def language(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


# name: (builder, batch maker (batch size, generator), loss, default batch size)
MODELS = {
    "mlp": (mlp, lambda b, g: (torch.randn(b, 1024, generator=g), torch.randint(0, 10, (b,), generator=g)),
            classify, 32),
    "resnet20": (ResNet20, lambda b, g: (torch.randn(b, 3, 32, 32, generator=g),
                                         torch.randint(0, 10, (b,), generator=g)), classify, 64),
    "resnet18": (ResNet18, lambda b, g: (torch.randn(b, 3, 224, 224, generator=g),
                                         torch.randint(0, 1000, (b,), generator=g)), classify, 4),
    "gpt2": (GPT2, lambda b, g: torch.randint(0, 50257, (b, 129), generator=g), language, 4),
}

AUTO_INTERVAL = [3]  # --auto-interval
COMPRESSIONS = {
    "gc_none": lambda: hvd.Compression.none,
    "gc_fp16": lambda: hvd.Compression.fp16,
    "gc_maxmin8": lambda: hvd.Compression.maxmin(8),
    "gc_maxmin4": lambda: hvd.Compression.maxmin(4),
    "gc_maxmin4_ef": lambda: hvd.Compression.maxmin(4, error_feedback=True),
    "gc_topk1": lambda: hvd.Compression.topk(0.01),
    "gc_topk01": lambda: hvd.Compression.topk(0.001),
    "gc_powersgd": lambda: hvd.Compression.powersgd(rank=1, start_iter=0),
    # Chooses every --auto-interval steps (default 3: first at step 4, the warm-up's end with
    # --warmup 3), so the timed steps include measurement steps, far more of them than a real
    # run's every 100th: a pessimistic figure.
    "gc_auto": lambda: hvd.Compression.auto(interval=AUTO_INTERVAL[0]),
}
OVERLAPPED = {"gc_none_ovl": "gc_none", "gc_maxmin4_ovl": "gc_maxmin4"}  # overlap_forward=model
VARIANTS = ["compute", "ddp", "ddp_fp16", "ddp_powersgd", *COMPRESSIONS, *OVERLAPPED, "backend4", "hook4",
            "hook4_flat"]


def build(variant, model, gloo):
    """The model to call and the optimizer to step for `variant`."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if variant == "compute":
        return model, opt
    if variant in COMPRESSIONS or variant in OVERLAPPED:
        overlap = model if variant in OVERLAPPED else None
        # Named after the variant: with --interleave several DistributedOptimizers share the runtime.
        named = [(f"{variant}.{n}", p) for n, p in model.named_parameters()]
        opt = hvd.DistributedOptimizer(opt, named_parameters=named,
                                       compression=COMPRESSIONS[OVERLAPPED.get(variant, variant)](),
                                       overlap_forward=overlap)
        return model, opt
    group = None if variant == "backend4" else gloo
    # torch's PowerSGD hook issues each bucket's second allreduce from a callback of its first,
    # so with several buckets in flight gloo meets them in different orders on different ranks
    # and hangs (seen with torch 1.13 here): that row runs with one bucket. On ResNet-20 it
    # still aborts inside gloo (mismatched message sizes), so step_cluster.sh runs it apart.
    cap = {"bucket_cap_mb": 1 << 14} if variant == "ddp_powersgd" else {}
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, **cap)
    if variant == "ddp_fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    elif variant == "ddp_powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=gloo, matrix_approximation_rank=1, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif variant in ("hook4", "hook4_flat"):
        state = hvd.DDPHookState(gloo, layer_min_size=1024, compression_params={"bits": 4},
                                 node_rows=False if variant == "hook4_flat" else None)
        ddp.register_comm_hook(state, hvd.ddp_hook)
    elif variant not in ("ddp", "backend4"):
        raise ValueError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    return ddp, opt


class Runner:
    """One variant's fresh model, optimizer and batches; step() times one training step."""

    def __init__(self, variant, args, gloo):
        make, batch_of, self.loss_of, default_batch = MODELS[args.model]
        torch.manual_seed(0)
        self.variant = variant
        self.model, self.opt = build(variant, make(), gloo)
        g = torch.Generator().manual_seed(1 + hvd.rank())
        self.batches = [batch_of(args.batch_size or default_batch, g) for _ in range(2)]
        self.steps = 0
        self.times, self.train_cpu, self.other_cpu = [], 0.0, 0.0

    def step(self, timed):
        cpu = (time.thread_time(), time.process_time())
        start = time.perf_counter()
        self.opt.zero_grad()
        self.loss_of(self.model, self.batches[self.steps % 2]).backward()
        self.opt.step()
        seconds = time.perf_counter() - start
        self.steps += 1
        if timed:
            train = time.thread_time() - cpu[0]
            self.times.append(seconds)
            self.train_cpu += train
            self.other_cpu += time.process_time() - cpu[1] - train

    def finish(self):
        """(median step of the slowest rank, training thread CPU, other threads' CPU) a step,
        the CPU averaged over ranks. Collective: every rank calls it."""
        self.opt.state_dict()  # overlap_forward: applies the last step's deferred updates
        n = len(self.times)
        every = hvd.allgather_object((self.times, self.train_cpu / n, self.other_cpu / n))
        step = statistics.median(max(rank[0][i] for rank in every) for i in range(n))
        return step, statistics.mean(r[1] for r in every), statistics.mean(r[2] for r in every)


def run(variant, args, gloo, warmup):
    """One variant alone: warm-up steps, then --steps timed steps back to back."""
    runner = Runner(variant, args, gloo)
    hvd.barrier()
    for step in range(warmup + args.steps):
        runner.step(timed=step >= warmup)
    return runner.finish()


def run_interleaved(variants, args, gloo, warmup):
    """Every variant at once, one step each in turn (the order rotating every round), every
    step started together on all ranks (a gloo barrier, outside the timing): slow drifts of the
    machine (clocks, other load, the allocator) fall on every variant alike. An overlap_forward
    variant's exchange runs on after its step() returns, into the next forward: interleaved, it
    would run during the other variants' steps (their figures slower, its own faster than any
    training loop sees), so those variants run back to back after the others."""
    mixed = [v for v in variants if v not in OVERLAPPED]
    runners = [Runner(v, args, gloo) for v in mixed]
    for round_ in range(warmup + args.steps):
        for i in range(len(runners)):
            runner = runners[(round_ + i) % len(runners)]
            dist.barrier(group=gloo)
            runner.step(timed=round_ >= warmup)
    results = dict(zip(mixed, [runner.finish() for runner in runners]))
    for v in variants:
        if v in OVERLAPPED:
            results[v] = run(v, args, gloo, warmup)
    return [results[v] for v in variants]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--auto-interval", type=int, default=3, help="gc_auto: steps between two choices")
    p.add_argument("--batch-size", type=int, default=0, help="per rank (default: the model's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--interleave", action="store_true",
                   help="build every variant at once and run them one step each in turn (compare rows whose "
                        "differences are smaller than the machine's drift within a job)")
    p.add_argument("--link", default="", help="a label for the records (the driver passes the link)")
    p.add_argument("--json", default="", help="append one JSON record per variant to this file")
    p.add_argument("--list-variants", action="store_true", help="print every variant and exit")
    args = p.parse_args()
    AUTO_INTERVAL[0] = args.auto_interval
    if args.list_variants:
        print(",".join(VARIANTS))
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown} (one of {', '.join(VARIANTS)})")
    if args.interleave:  # one runner a variant: a repeat would only clash with itself
        variants = list(dict.fromkeys(variants))
    if "compute" in variants:  # the reference first
        variants.remove("compute")
    variants.insert(0, "compute")
    torch.set_num_threads(args.threads)

    hvd.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("OMPI_MCA_ess_base_jobid", "0")) % 1000))
    dist.init_process_group("gradcomp", rank=hvd.rank(), world_size=hvd.size())
    gloo = dist.new_group(backend="gloo")
    params = sum(p.numel() for p in MODELS[args.model][0]().parameters())
    if hvd.rank() == 0:
        print(f"model {args.model}: {params / 1e6:.1f}M parameters, batch {args.batch_size or MODELS[args.model][3]} "
              f"per rank, {hvd.size()} ranks, {args.threads} torch thread(s) each{', ' + args.link if args.link else ''}",
              flush=True)
    rows = []
    results = iter(run_interleaved(variants, args, gloo, args.warmup) if args.interleave else ())
    for variant in variants:
        # The first row also warms the process (allocator, page faults, clocks): 3x the warm-up.
        seconds, train_cpu, other_cpu = (next(results) if args.interleave else
                                         run(variant, args, gloo, args.warmup * (1 if rows else 3)))
        reference = rows[0][1] if rows else seconds
        rows.append((variant, seconds, reference / seconds, train_cpu, other_cpu))
        if hvd.rank() == 0:
            print(f"  {variant:14s} {seconds:8.3f} s/step  {100 * reference / seconds:5.1f}%  CPU s/step: training "
                  f"thread {train_cpu:.3f}, other threads {other_cpu:.3f}", flush=True)
            if variant == "gc_auto":  # what the cost model and the error budget chose, per tensor
                chosen = collections.Counter(c["setting"] for c in hvd.compression_choices().values())
                print("    auto chose: " + ", ".join(f"{n} x {k}" for k, n in chosen.most_common()), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"model": args.model, "variant": variant, "seconds": seconds,
                                        "efficiency": reference / seconds, "ranks": hvd.size(), "link": args.link,
                                        "params": params, "train_cpu": train_cpu, "other_cpu": other_cpu}) + "\n")
    if hvd.rank() == 0:
        print("\n| variant | s/step | scaling efficiency | training thread CPU s/step | other threads CPU s/step |"
              "\n|---|---|---|---|---|")
        for variant, seconds, eff, train_cpu, other_cpu in rows:
            print(f"| {variant} | {seconds:.3f} | {100 * eff:.0f}% | {train_cpu:.3f} | {other_cpu:.3f} |")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
