"""gradcomp for PyTorch, with Horovod's names and semantics.

    import gradcomp.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.maxmin(bits=4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Importing this module also registers the torch.distributed backend "gradcomp"
(``dist.init_process_group("gradcomp")``), and ``ddp_hook`` / ``DDPHookState`` give DDP
per-layer compression on any backend, ``fsdp_hook`` / ``FSDPHookState`` FSDP's gradients, and
``compress_fsdp`` names FSDP2's exchanges after their modules (error feedback per module).

Differences from Horovod worth knowing: ``compression=None`` (the default everywhere) follows
the GRADCOMP_* settings and the layer filter, so ``gcrun --compression maxmin --bits 4`` turns
compression on for an unchanged Horovod script; pass ``Compression.none`` to force exact
communication.
"""
import sys

from gradcomp._core import GradcompError
from gradcomp.basics import (Adasum, Average, Max, Min, ProcessSet, Product, Sum, add_process_set, auto_summary,
                             compression_choices, cross_rank, cross_size, global_process_set, init, is_homogeneous,
                             is_initialized, local_rank, local_size, poll, rank, remove_process_set, shutdown, size,
                             start_timeline, stats, stop_timeline, synchronize, total_stats)
from gradcomp.torch.compression import Compression, Compressor
from gradcomp.torch.mpi_ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                                    allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
                                    broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
                                    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                                    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async,
                                    join, reducescatter, reducescatter_async, sparse_allreduce_async)
from gradcomp.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                      broadcast_parameters)
from gradcomp.torch.optimizer import DistributedOptimizer
from gradcomp.torch.diloco import DiLoCo
from gradcomp.torch.sync_batch_norm import SyncBatchNorm
from gradcomp.torch.ddp_hook import DDPHookState, ddp_hook
from gradcomp.torch.fsdp_hook import FSDPHookState, fsdp_hook
from gradcomp.torch import backend as _backend
from gradcomp.torch import compat
from gradcomp.torch import elastic  # hvd.elastic.TorchState, hvd.elastic.run
from gradcomp.elastic import HostsUpdatedInterrupt

# Horovod raises HorovodInternalError when a collective fails for a reason outside the
# caller's arguments (a peer lost, a stall shut down); gradcomp raises GradcompError then.
HorovodInternalError = GradcompError

compat.warn_if_untested()
_backend.register()

# torch.compile'd code that calls gradcomp calls it as an opaque library (compat.run_untraced).
compat.run_untraced(sys.modules[__name__], [
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
    "grouped_allreduce_", "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "sparse_allreduce_async", "join", "barrier", "poll", "synchronize", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object"])


def compress_fsdp(model, compression=None, allgather_compression=None, error_feedback=None):
    """Names FSDP2's exchanges after their modules on backend gradcomp (gradcomp.torch.fsdp2,
    imported here: torch's FSDP takes half a second to import)."""
    from gradcomp.torch import fsdp2
    return fsdp2.compress_fsdp(model, compression, allgather_compression, error_feedback)


def mpi_built():
    """gradcomp always runs over MPI."""
    return True


def mpi_enabled():
    return True


def mpi_threads_supported():
    """The background thread is the only one calling MPI (MPI_THREAD_FUNNELED is enough)."""
    return True


def gloo_built():
    """gradcomp has no gloo (torch's gloo backend works alongside it). Its negotiation goes over
    TCP connections of its own by default, Horovod's gloo controller's part
    (GRADCOMP_CONTROLLER, which takes HOROVOD_CONTROLLER=gloo); the data goes over MPI, so
    mpi_enabled() stays true."""
    return False


def gloo_enabled():
    return False


def nccl_built():
    """As Horovod: the NCCL version code the NCCL communicator was built with (22809 for
    2.28.9), or 0 when it was not (it is when CMake finds CUDA and NCCL)."""
    from gradcomp import _core
    return int(_core.build_info()["nccl_version"])


def cuda_built():
    """Whether the GPU data path (the CUDA device and its kernels) is compiled in."""
    from gradcomp import _core
    return bool(_core.build_info()["cuda"])


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


__all__ = ["elastic", "HostsUpdatedInterrupt", "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size", "cross_rank",
           "cross_size", "is_homogeneous", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
           "grouped_allreduce",
           "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "allgather", "allgather_async",
           "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
           "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async", "join",
           "barrier", "poll", "synchronize", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object", "Average", "Sum", "Min", "Max", "Product", "Adasum", "start_timeline", "stop_timeline",
           "Compression", "Compressor", "DistributedOptimizer", "SyncBatchNorm", "DDPHookState", "ddp_hook",
           "FSDPHookState", "fsdp_hook", "compress_fsdp",
           "GradcompError", "HorovodInternalError", "stats", "total_stats", "compression_choices", "auto_summary",
           "mpi_built",
           "mpi_enabled", "mpi_threads_supported",
           "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ddl_built", "ccl_built",
           "ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
