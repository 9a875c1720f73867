"""Set-up shared by the multi-rank suites, under mpirun or torchrun: gradcomp's runtime and a
torch.distributed process group, on a port derived from the MPI job (so concurrent jobs do not
collide) or on torchrun's own store."""
import hashlib
import os

import torch.distributed as dist

import gradcomp.torch as hvd
from launched import job_id, torchrun  # noqa: F401 (job_id: for the suites)


def use_job_port(salt=""):
    """torch.distributed's env:// on 127.0.0.1 and a port of this job's own (torchrun's store
    under torchrun)."""
    if torchrun():
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    # Below Linux's ephemeral range (32768-60999), where any connection's local port may already
    # hold the one a hash picks there.
    os.environ["MASTER_PORT"] = str(20000 + int(hashlib.sha1((salt + job_id()).encode()).hexdigest(), 16) % 12768)


def torch_runtime(backend, salt=""):
    """Body of a module-scoped fixture: `yield from torch_runtime("gradcomp")`."""
    hvd.init()
    use_job_port(salt)
    dist.init_process_group(backend, rank=hvd.rank(), world_size=hvd.size())
    yield
    dist.destroy_process_group()
    hvd.shutdown()


def runtime_only():
    """Body of a module-scoped fixture for suites without a torch.distributed group:
    `yield from runtime_only()`."""
    hvd.init()
    yield
    hvd.shutdown()
