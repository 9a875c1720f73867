"""Set-up shared by the mpirun PyTorch suites: gradcomp's runtime and a torch.distributed
process group on a port derived from the MPI job (so concurrent jobs do not collide)."""
import hashlib
import os

import torch.distributed as dist

import gradcomp.torch as hvd


def job_id():
    """This MPI job's name, which no job running at the same time shares: Open MPI 4's
    OMPI_MCA_ess_base_jobid, Open MPI 5's PMIX_NAMESPACE."""
    return os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE", "0")


def use_job_port(salt=""):
    """torch.distributed's env:// on 127.0.0.1 and a port of this job's own."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(20000 + int(hashlib.sha1((salt + job_id()).encode()).hexdigest(), 16) % 20000)


def torch_runtime(backend, salt=""):
    """Body of a module-scoped fixture: `yield from torch_runtime("gradcomp")`."""
    hvd.init()
    use_job_port(salt)
    dist.init_process_group(backend, rank=hvd.rank(), world_size=hvd.size())
    yield
    dist.destroy_process_group()
    hvd.shutdown()
