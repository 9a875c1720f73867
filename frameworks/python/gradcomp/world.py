"""Which world a process starts in: MPI's (gcrun, mpirun, srun with PMI) or, with no MPI
launcher, the env:// one that torchrun, Kubernetes' PyTorchJob, SageMaker and `srun` + torchrun
set up (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): its ranks find each other through
torch.distributed's TCPStore (without torch, a server of gradcomp's own that speaks its protocol)
and connect gradcomp's own TCP mesh (docs/design.md, "A world without MPI")."""

import datetime
import os

# Variables that an MPI launcher sets in every rank (Open MPI, MPICH/Hydra, Intel MPI, MVAPICH,
# PMIx, including srun --mpi=pmix).
_MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
# The bootstrap's waits for a rank that has not started yet (torchrun starts a node's workers
# together; nodes join a c10d rendezvous before any worker starts).
DEFAULT_TIMEOUT_SECONDS = 300.0


def mpi_launched(environ=os.environ):
    return any(name in environ for name in _MPI_VARIABLES)


def env_world(environ=os.environ):
    """(rank, size) of an env:// launch without MPI, or None (MPI's world, or a lone process)."""
    if mpi_launched(environ) or "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"RANK={environ['RANK']!r} and WORLD_SIZE={environ['WORLD_SIZE']!r} must be integers "
                         "(set by torchrun or the job's launcher)") from None
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"RANK={rank} is not a rank of WORLD_SIZE={size}")
    return rank, size


def prefix(what):
    """A store key prefix for `what`, apart for each restart of an elastic job."""
    return f"gradcomp/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{what}"


class StoreAdapter:
    """A torch.distributed Store as the C++ bootstrap calls it: set(key, bytes) and
    get(key, timeout) -> bytes, or None once `timeout` seconds passed without the key."""

    def __init__(self, store):
        self._store = store

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key, timeout):
        if timeout <= 0:
            return self._store.get(key) if self._store.check([key]) else None
        try:
            self._store.wait([key], datetime.timedelta(seconds=timeout))
        except Exception as e:  # torch's timeout is a RuntimeError (DistStoreError since 2.2)
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                return None
            raise
        return self._store.get(key)


def _master(rank, size):
    """MASTER_ADDR and MASTER_PORT, which an env:// launcher sets beside RANK and WORLD_SIZE."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(f"rank {rank} of {size}: RANK and WORLD_SIZE are set but {name} is not; an env:// "
                             "launcher (torchrun, a PyTorchJob) sets MASTER_ADDR and MASTER_PORT too")
    try:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except ValueError:
        raise ValueError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} must be a port number") from None


def env_store(rank, size):
    """The env:// launch's store: the default group's when torch.distributed is initialized,
    else the one torch's env:// rendezvous gives (torchrun's agent store, or a server that rank 0
    hosts on MASTER_PORT, shared with a later init_process_group in the same process); without
    torch, gradcomp's own (own_store)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return own_store(rank, size)
    if dist.is_initialized():
        return StoreAdapter(dist.distributed_c10d._get_default_store())
    _master(rank, size)
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size))
    return StoreAdapter(store)


_own_server = []  # rank 0's StoreServer, kept for the process's life (later groups meet through it)


def own_store(rank, size):
    """A TCPStore of gradcomp's own (gradcomp/tcp_store.py, torch's protocol): rank 0 serves it on
    MASTER_PORT unless torchrun's agent serves one there (TORCHELASTIC_USE_AGENT_STORE), and
    every rank connects to MASTER_ADDR:MASTER_PORT."""
    from gradcomp import tcp_store
    host, port = _master(rank, size)
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and not _own_server:
        try:
            _own_server.append(tcp_store.StoreServer(port))
        except OSError as e:
            raise ValueError(f"rank 0 of {size} cannot serve the job's store on MASTER_PORT={port}: {e}") from None
    # Its get(key, timeout) is already the one the C++ bootstrap calls: no StoreAdapter.
    return tcp_store.StoreClient(host, port, DEFAULT_TIMEOUT_SECONDS, f"rank {rank} of {size}")
