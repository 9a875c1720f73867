"""torchft's DiLoCo on the character LM of examples/torch_diloco_charlm.py, as the peer in
diloco_cluster.sh's table: the same model, data, inner AdamW schedule, evaluation and RESULT
record, trained by torchft (pip install torchft) over its gloo process group.

    mpirun -np 4 -x MASTER_ADDR=<node 0's address> python examples/benchmarks/torchft_diloco_charlm.py --sync-every 50

Each rank is a replica group of one (torchft's unit of fault tolerance); rank 0 also runs the
lighthouse. torchft's 8-bit pseudo-gradients (should_quantize) run only on CUDA (Triton kernels),
so on the CPU its DiLoCo syncs exactly. gradcomp serves only to launch and to gather the figures
of rank 0's report, outside the timed steps.
"""
import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torchft import Manager, ProcessGroupGloo
from torchft.checkpointing import HTTPTransport
from torchft._torchft import LighthouseServer
from torchft.local_sgd import DiLoCo

import gradcomp.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import CharGPT, corpus, train_step  # noqa: E402
from torch_diloco_charlm import add_diloco_arguments, evaluation, sent_bytes  # noqa: E402

LIGHTHOUSE_PORT = 29510
STORE_PORT = 29520


class Transport(HTTPTransport):
    """torchft's HTTP checkpoint transport, reached at this host's address: its own names the
    host by gethostname(), which the other nodes may not resolve (an emulated node's UTS name)."""

    def __init__(self, host, timeout):
        self.host = host  # before the server starts: it logs its address()
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self):
        return f"http://{self.host}:{self._server.socket.getsockname()[1]}/checkpoint/"


def manager_for(rank, model, inner, outer):
    """A torchft Manager of the replica group `rank` (one process), its lighthouse on MASTER_ADDR."""
    # A store per replica group (several on one host in a local run), reached at this host's
    # address: the other groups' process group meets at the quorum's first member's store.
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    host, port, timeout = own_address(address), STORE_PORT + rank, datetime.timedelta(seconds=300)
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict(), "outer": outer.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])
        outer.load_state_dict(state["outer"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=hvd.size(),
                      load_state_dict=load_state_dict, state_dict=state_dict, use_async_quorum=False,
                      replica_id=f"replica{rank}", store_addr=host, store_port=port, rank=0,
                      world_size=1, lighthouse_addr=f"http://{address}:{LIGHTHOUSE_PORT}",
                      hostname=host, checkpoint_transport=Transport(host, timeout), timeout=timeout,
                      quorum_timeout=timeout)
    return manager, store


def own_address(peer):
    """The address this host reaches `peer` from (what the other replica groups connect to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, LIGHTHOUSE_PORT))
        return s.getsockname()[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    add_diloco_arguments(p)
    args = p.parse_args()
    hvd.init()
    rank = hvd.rank()
    lighthouse = LighthouseServer(bind=f"[::]:{LIGHTHOUSE_PORT}", min_replicas=hvd.size()) if rank == 0 else None
    hvd.barrier()
    text, held_out = corpus(args.corpus_mb)
    torch.manual_seed(args.seed)
    model = CharGPT(args.layers, args.width, args.heads, args.context)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                            nesterov=args.outer_momentum > 0)
    manager, _store = manager_for(rank, model, inner, outer)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    params = sum(q.numel() for q in model.parameters())
    run = f"torchft DiLoCo H={args.sync_every} (exact, gloo)"
    if rank == 0:
        print(f"{run}: {hvd.size()} replica groups, {params / 1e6:.2f}M parameters, {args.steps} steps", flush=True)
    curve, trained, sent0, wire0 = [], 0.0, sent_bytes(), hvd.stats()["compressed_bytes_on_wire"]
    with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every, backup_device=torch.device("cpu"),
                pin_memory=False):
        for step in range(args.steps):
            start = time.perf_counter()
            train_step(model, inner, text, args, step, gen)
            trained += time.perf_counter() - start
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                curve.append(evaluation(model, held_out, args, step + 1, trained, sent0, wire0))
    if rank == 0:
        print("RESULT " + json.dumps({"run": run, "ranks": hvd.size(), "parameters": params, "curve": curve}),
              flush=True)
    hvd.barrier()
    manager.shutdown(wait=False)
    if lighthouse is not None:
        lighthouse.shutdown()
    hvd.shutdown()


if __name__ == "__main__":
    main()
