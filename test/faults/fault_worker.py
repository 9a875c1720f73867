"""One rank of a fault-matrix run (test/python/test_faults.py starts it under mpirun or torchrun).

    fault_worker.py --fault kill --at init|negotiation|allreduce|ddp|teardown [--victim R]
    fault_worker.py --fault stop [--victim R]     # the victim stops calling gradcomp
    fault_worker.py --fault none                  # allreduces until killed (a link cut from outside)
    fault_worker.py --fault stall|shape --catch   # the victim submits another name / shape at step 3
    fault_worker.py --fault raise --at before_init|first_step|mid|outside|exit [--victim R]
    fault_worker.py --fault linger --steps N        # the victim stays 60 s after its last step

--at teardown: the victim submits w3 with another op (the ranks agree on an error; the others'
scripts end on it, shutting gradcomp down on every rank) and dies 50 ms later, before its own
teardown.

--catch: the script catches gradcomp's error, says so and exits 0 (as one that saves a
checkpoint and ends would); after a shape mismatch it trains on first (the job goes on).

--fault raise: the victim's script raises an exception it does not catch: before gradcomp's init
(before_init, the others waiting in it), before its first allreduce (first_step), at step 3 (mid), at step 3 while the others spend 60 s outside gradcomp
(outside: an evaluation, a checkpoint), or after its last step (exit) while the others end
cleanly.

Every rank prints `fault-worker rank R at T: ...` lines (flushed; T is the wall clock) so the
test sees how far it got and when. The victim SIGKILLs itself at the chosen point, as the OOM
killer would.
"""
import argparse
import os
import signal
import sys
import threading
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--fault", choices=["kill", "stop", "stall", "shape", "none", "raise", "linger"], required=True)
p.add_argument("--catch", action="store_true")
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--at", choices=["init", "negotiation", "allreduce", "ddp", "teardown", "before_init", "first_step", "mid",
                                "outside", "exit"], default="negotiation")
p.add_argument("--victim", type=int, default=1)
p.add_argument("--elements", type=int, default=1 << 20)
p.add_argument("--kill-after", type=float, default=0.3, help="--at allreduce: seconds after the submit")
args = p.parse_args()

world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))  # mpirun's, or torchrun's
victim = world_rank == args.victim


def say(what):
    print(f"fault-worker rank {world_rank} at {time.time():.3f}: {what}", flush=True)


def open_mpi_job_id():
    """Open MPI's job id, after which it names its shared-memory segments (the test looks for
    leftovers): Open MPI 4 passes it; Open MPI 5 derives it from PMIx's namespace ("prterun-HOST-PID@N"):
    the one-at-a-time hash of what precedes '@', folded to 16 bits, then N."""
    if "OMPI_MCA_ess_base_jobid" in os.environ:
        return int(os.environ["OMPI_MCA_ess_base_jobid"])
    family, _, local = os.environ.get("PMIX_NAMESPACE", "@0").rpartition("@")
    h = 0
    for c in family.encode():
        h = (h + c) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return (((h >> 16) ^ (h & 0xFFFF)) << 16 | int(local)) if family else 0


job_id = open_mpi_job_id()
say(f"job {job_id:x}")

def die():
    say("SIGKILL")
    os.kill(os.getpid(), signal.SIGKILL)


if args.fault == "kill" and args.at == "init" and victim:
    die()

if args.at == "ddp":
    import torch
    import torch.distributed as dist
    import gradcomp.torch as gc
    gc.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(21000 + job_id % 20000))
    dist.init_process_group("gradcomp", rank=gc.rank(), world_size=gc.size())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step = {"n": 0}
    def fault(g):
        if step["n"] == 3:
            if args.fault == "stop":
                say("stops calling gradcomp")
                time.sleep(3600)
            die()
        return g

    if victim and args.fault in ("kill", "stop"):
        # In the middle of backward: some buckets were handed to the backend, others not.
        model[2].weight.register_hook(fault)
    say("up")
    for step["n"] in range(1000):
        x = torch.randn(32, 256)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step["n"] == 2:
            say("trained 3 steps")
    say("finished")
    sys.exit(0)

import gradcomp.numpy as gc  # noqa: E402

if args.fault == "raise" and args.at == "before_init" and victim:
    say("raises")
    raise RuntimeError(f"the user's script failed on rank {world_rank} before init")
gc.init()
say("up")
x = np.ones((args.elements // 1024, 1024), np.float32)


def step_of_the_victim(step):
    """The victim's allreduce of `step` (3: where its fault is)."""
    name = f"w{step}"
    if args.fault == "stop":
        say("stops calling gradcomp")
        time.sleep(3600)
    if args.fault == "kill" and args.at == "negotiation":
        # Its background thread in negotiation rounds with the others: a tensor of its own is
        # submitted, and the others' w3 never, so no round can agree on either (submitting w3
        # itself could let the round agree, on an error or the tensor, before the kill lands).
        gc.allreduce_async(x, name=name + "-victim", op=gc.Sum)
        time.sleep(0.2)
        die()
    if args.fault == "kill" and args.at == "allreduce":
        threading.Timer(args.kill_after, die).start()
    if args.fault == "kill" and args.at == "teardown":
        gc.allreduce_async(x, name=name, op=gc.Average)
        time.sleep(0.05)
        die()
    if args.fault == "stall":
        name = "other"
    if args.fault == "shape":
        return gc.allreduce(x[1:], name=name, op=gc.Sum)
    return gc.allreduce(x, name=name, op=gc.Sum)


def raise_here(step):
    """--fault raise: the victim's exception at `step` (the others' time outside gradcomp)."""
    at = {"first_step": 0, "mid": 3, "outside": 3}.get(args.at)
    if step != at:
        return
    if victim:
        say("raises")
        raise RuntimeError(f"the user's script failed on rank {world_rank} at step {step}")
    if args.at == "outside":
        say("outside gradcomp for 60 s")
        time.sleep(60)


for step in range(args.steps):
    if step == 3:
        say("steady")
    if args.fault == "raise":
        raise_here(step)
    try:
        out = step_of_the_victim(step) if step == 3 and victim else gc.allreduce(x, name=f"w{step}", op=gc.Sum)
    except gc.GradcompError as e:
        if not args.catch:
            raise
        say(f"caught: {e}")
        if args.fault == "shape":
            continue
        say("exits 0")
        sys.exit(0)
    if step in (0, args.steps - 1):
        assert np.all(out == gc.size()), out
say("finished")
if args.fault == "linger" and victim:
    say("lingers 60 s")
    time.sleep(60)
if args.fault == "raise" and args.at == "exit" and victim:
    say("raises")
    raise RuntimeError(f"the user's script failed on rank {world_rank} after training")
