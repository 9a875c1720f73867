"""An env:// launcher as Kubernetes' PyTorchJob or `srun` is one: N processes of a command, each
given RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, nothing else
(no torchrun agent, no MPI); rank 0 hosts the store on MASTER_PORT (torch.distributed's, or
without torch gradcomp's own). A rank that fails ends the others after a grace period, as a job
controller would, naming it; the exit code is the first failure's. --without-torch makes `import torch`
fail in the ranks, as where torch is not installed.

    python envrun.py -n 3 python -m pytest test_torch_mpi.py
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, required=True, help="ranks")
    p.add_argument("--grace", type=float, default=30, help="seconds the others get after a rank failed")
    p.add_argument("--without-torch", action="store_true", help="the ranks cannot import torch")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    port = str(free_port())
    extra = {}
    if args.without_torch:
        hidden = tempfile.mkdtemp(prefix="envrun-no-torch-")
        os.makedirs(os.path.join(hidden, "torch"))
        with open(os.path.join(hidden, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('torch is not installed (envrun --without-torch)')\n")
        extra["PYTHONPATH"] = os.pathsep.join(filter(None, [hidden, os.environ.get("PYTHONPATH")]))
    procs = []
    for r in range(args.n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.n), LOCAL_WORLD_SIZE=str(args.n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it: the ranks share the cores
        # A session of its own: ending a rank ends whatever it started (a wrapper's child).
        procs.append(subprocess.Popen(args.command, env=env, start_new_session=True))
    def end_all(signum, _frame):  # envrun itself ended (a test's timeout, Ctrl-C): its ranks too
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, end_all)
    signal.signal(signal.SIGINT, end_all)
    failed, deadline = 0, None
    while any(proc.poll() is None for proc in procs):
        for r, proc in enumerate(procs):
            if proc.poll() not in (None, 0) and not failed:
                failed, deadline = proc.returncode, time.time() + args.grace
                print(f"envrun: rank {r} exited with status {failed}; the others are ended in {args.grace:g} s",
                      file=sys.stderr, flush=True)
        if deadline is not None and time.time() > deadline:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.1)
    codes = [proc.returncode for proc in procs]
    return failed or next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
