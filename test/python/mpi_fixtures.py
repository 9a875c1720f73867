"""Set-up shared by the mpirun PyTorch suites: gradcomp's runtime and a torch.distributed
process group on a port derived from the MPI job (so concurrent jobs do not collide)."""
import hashlib
import os

import torch.distributed as dist

import gradcomp.torch as hvd


def torch_runtime(backend, salt=""):
    """Body of a module-scoped fixture: `yield from torch_runtime("gradcomp")`."""
    hvd.init()
    job = os.environ.get("OMPI_MCA_ess_base_jobid", "0")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(20000 + int(hashlib.sha1((salt + job).encode()).hexdigest(), 16) % 20000)
    dist.init_process_group(backend, rank=hvd.rank(), world_size=hvd.size())
    yield
    dist.destroy_process_group()
    hvd.shutdown()
