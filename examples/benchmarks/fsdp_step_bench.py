"""FSDP training step time and scaling efficiency: a 22M-parameter transformer under torch's
FullyShardedDataParallel (--fsdp 1) or FSDP2's fully_shard (--fsdp 2, torch >= 2.9) on gloo and on
backend gradcomp, uncompressed and compressed.

    mpirun -np 2 python3 examples/benchmarks/fsdp_step_bench.py --variant gc_w8g4 [--fsdp 2]
    bash examples/benchmarks/fsdp_cluster.sh --fsdp 2        # 2 emulated nodes, every variant

One variant a job (the compression settings are the runtime's, read when it starts): the
driver runs each in turn, in rounds. Each rank trains the character GPT of examples/charlm.py at
7 layers of width 512 (22.2M parameters, one FSDP unit per block, FSDP's defaults otherwise; under
FSDP2 each block fully_shard'ed, then the model, and compress_fsdp names each module's exchanges) on
its own random windows, Adam; --warmup steps, then --steps timed steps (zero_grad, forward,
backward, optimizer step; FSDP waits for the last reduce-scatter at the end of backward). A
step's time is the slowest rank's; the figure is the median step.

Variants (--variant):
  compute    no exchange: the unsharded model on every rank at once (the cores as busy as in
             the other rows); scaling efficiency = its step time / a variant's
  gloo       FSDP on torch's gloo backend
  gc_none    FSDP on backend gradcomp, exact
  gc_w8      + weights allgathered at 8 bits (GRADCOMP_ALLGATHER_COMPRESSION=maxmin)
  gc_g4      + gradients reduce-scattered at 4 bits (GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4;
             under FSDP2 with error feedback per module, GRADCOMP_ERROR_FEEDBACK=1)
  gc_w8g4    both

--json FILE appends the variant's record (seconds, ranks, link, parameters, bytes); --table FILE
prints the Markdown table of a file's records instead, those of --link if given (medians over the
rounds; vs gloo = gloo's step time over the variant's, from the same file; the exchange = a
step's time less the compute row's, what a GPU, computing far faster than these cores, would
leave of the step).
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
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import gradcomp.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import Block, CharGPT  # noqa: E402

VARIANTS = {
    "compute": {},
    "gloo": {},
    "gc_none": {},
    "gc_w8": {"GRADCOMP_ALLGATHER_COMPRESSION": "maxmin", "GRADCOMP_ALLGATHER_BITS": "8"},
    "gc_g4": {"GRADCOMP_COMPRESSION": "maxmin", "GRADCOMP_BITS": "4"},
    "gc_w8g4": {"GRADCOMP_ALLGATHER_COMPRESSION": "maxmin", "GRADCOMP_ALLGATHER_BITS": "8",
                "GRADCOMP_COMPRESSION": "maxmin", "GRADCOMP_BITS": "4"},
}
SETTINGS = ("GRADCOMP_ALLGATHER_COMPRESSION", "GRADCOMP_ALLGATHER_BITS", "GRADCOMP_COMPRESSION", "GRADCOMP_BITS",
            "GRADCOMP_ERROR_FEEDBACK")


def table(path, only_link="", fsdp=0):
    """The Markdown table of `path`'s records (those of `only_link` and FSDP `fsdp` if given): one
    row a (FSDP, link, variant), medians over rounds."""
    runs = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if only_link and r["link"] != only_link or fsdp and r.get("fsdp", 1) != fsdp:
                continue
            hsdp = f" HSDP {r['replicas']} replicas" if r.get("replicas", 1) > 1 else ""
            runs[(f"FSDP{r.get('fsdp', 1)}{hsdp}, {r['link']}", r["variant"])].append(r)
    for link in dict.fromkeys(k[0] for k in runs):
        median = {v: statistics.median(r["seconds"] for r in rs) for (lk, v), rs in runs.items() if lk == link}
        first = next(rs[0] for (lk, _), rs in runs.items() if lk == link)
        print(f"\n{first['params'] / 1e6:.1f}M parameters, {first['ranks']} ranks, {link}\n")
        print("| variant | s/step (median of rounds) | rounds | scaling efficiency | vs gloo | exchange s/step "
              "(step - compute) | exchange's share of the step | exchange vs gloo's | MiB on the wire a step "
              "(compressed / in) |\n|---|---|---|---|---|---|---|---|---|")
        for variant in VARIANTS:
            if variant not in median:
                continue
            rs = runs[(link, variant)]
            eff = f"{100 * median['compute'] / median[variant]:.0f}%" if "compute" in median else "n/a"
            vs = f"{median['gloo'] / median[variant]:.2f}x" if "gloo" in median else "n/a"
            exchange, share, exchange_vs = "-", "-", "-"
            if "compute" in median and variant != "compute":
                exchange = f"{median[variant] - median['compute']:.3f}"
                share = f"{100 * (median[variant] - median['compute']) / median[variant]:.0f}%"
                if "gloo" in median and median[variant] > median["compute"]:
                    exchange_vs = f"{(median['gloo'] - median['compute']) / (median[variant] - median['compute']):.2f}x"
            wire = (f"{rs[0]['wire_mib']:.1f} / {rs[0]['in_mib']:.1f}" if rs[0]["in_mib"] else "-")
            print(f"| {variant} | {median[variant]:.3f} | {len(rs)} | {eff} | {vs} | {exchange} | {share} | "
                  f"{exchange_vs} | {wire} |")

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=list(VARIANTS), default="gc_w8g4")
    p.add_argument("--fsdp", type=int, choices=[1, 2], help="FullyShardedDataParallel (1, the default) or fully_shard "
                   "(2); with --table, only that one's records")
    p.add_argument("--replicas", type=int, default=1, help="FSDP2: HSDP with this many replicas (a 2-D mesh, "
                   "replicas x ranks/replicas: the shard groups are nodes when the replicas are the nodes)")
    p.add_argument("--layers", type=int, default=7)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2, help="windows per rank and step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--link", default="", help="a label for the record (the driver passes the link)")
    p.add_argument("--json", default="", help="append the variant's record to this file")
    p.add_argument("--table", default="", help="print the table of this file's records and exit")
    args = p.parse_args()
    if args.table:
        table(args.table, args.link, args.fsdp)
        return
    # The runtime reads its settings when it starts: this variant's, over the environment's.
    for name in SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(VARIANTS[args.variant])
    args.fsdp = args.fsdp or 1
    if args.fsdp == 2 and "GRADCOMP_COMPRESSION" in VARIANTS[args.variant]:
        os.environ["GRADCOMP_ERROR_FEEDBACK"] = "1"  # kept per module by compress_fsdp
    run(args)


def shard(model, version, replicas):
    """`model` under FSDP `version`, one unit per block: FullyShardedDataParallel, or fully_shard
    on each block and the model (HSDP with `replicas` > 1) with compress_fsdp on backend gradcomp;
    and the gradcomp process sets its exchanges run on (None: the world's)."""
    if version == 1:
        return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block})), [None]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    n = dist.get_world_size()
    mesh = (init_device_mesh("cpu", (replicas, n // replicas), mesh_dim_names=("replicate", "shard"))
            if replicas > 1 else init_device_mesh("cpu", (n,)))
    for module in [m for m in model.modules() if isinstance(m, Block)] + [model]:
        fully_shard(module, mesh=mesh)
    if dist.get_backend() != "gradcomp":
        return model, [None]
    hvd.compress_fsdp(model)
    if replicas == 1:
        return model, [None]
    return model, [mesh.get_group(dim).process_set for dim in ("replicate", "shard")]


def compressed_mib(process_sets):
    """(MiB in, MiB on the wire) of the codecs so far, over these process sets' runtimes."""
    return tuple(sum(hvd.stats(ps)[key] for ps in process_sets) / 2**20
                 for key in ("compressed_bytes_in", "compressed_bytes_on_wire"))


def run(args):
    """The variant's training steps, timed; rank 0 prints the figure and writes the record."""
    torch.set_num_threads(args.threads)
    hvd.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("OMPI_MCA_ess_base_jobid", "0")) % 1000))
    dist.init_process_group("gloo" if args.variant == "gloo" else "gradcomp", rank=hvd.rank(), world_size=hvd.size())
    torch.manual_seed(0)
    model = CharGPT(args.layers, args.width, args.width // 64, args.context)
    params = sum(q.numel() for q in model.parameters())
    process_sets = [None]
    if args.variant != "compute":
        model, process_sets = shard(model, args.fsdp, args.replicas)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + hvd.rank())
    batches = [torch.randint(0, 256, (args.batch_size, args.context + 1), generator=g) for _ in range(2)]
    times = []
    before = compressed_mib(process_sets)
    hvd.barrier()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = compressed_mib(process_sets)
        start = time.perf_counter()
        batch = batches[step % 2]
        opt.zero_grad()
        logits = model(batch[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1)).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    after = compressed_mib(process_sets)
    every = hvd.allgather_object(times)
    seconds = statistics.median(max(rank[i] for rank in every) for i in range(len(times)))
    in_mib, wire_mib = ((a - b) / args.steps for a, b in zip(after, before))
    if hvd.rank() == 0:
        print(f"  {args.variant:8s} {seconds:7.3f} s/step  ({params / 1e6:.1f}M parameters, {hvd.size()} ranks, "
              f"batch {args.batch_size}x{args.context} a rank; compressed {wire_mib:.1f} of {in_mib:.1f} MiB a step)",
              flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"variant": args.variant, "fsdp": args.fsdp, "replicas": args.replicas,
                                    "seconds": seconds, "ranks": hvd.size(),
                                    "link": args.link, "params": params, "in_mib": in_mib,
                                    "wire_mib": wire_mib}) + "\n")
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
