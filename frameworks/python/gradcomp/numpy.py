"""gradcomp for NumPy arrays, with Horovod's names and semantics.

    import numpy as np
    import gradcomp.numpy as gc
    gc.init()
    total = gc.allreduce(np.ones(4, np.float32), op=gc.Sum)

Every collective has an ``_async`` variant returning a handle for ``poll``/``synchronize``;
``allreduce_`` and ``broadcast_`` work in place. Names must match across ranks; when omitted,
names are generated from the call order (the same on every rank).
"""
import numpy as np

from gradcomp.basics import (Average, GradcompError, Max, Min, Product, Sum, check_op, cross_rank, cross_size,
                             init, is_initialized, local_rank, local_size, poll, rank, shutdown, size,
                             start_timeline, stats, stop_timeline, synchronize)
from gradcomp import basics as _b

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size", "cross_rank",
           "cross_size", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
           "grouped_allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "join",
           "barrier", "poll", "synchronize", "start_timeline", "stop_timeline", "Sum", "Average", "Min", "Max",
           "Product", "GradcompError", "stats"]


def _array(x, what):
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} expects a numpy array, got {type(x).__name__}")
    return np.ascontiguousarray(x)


def allreduce_async_(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
                     compression=None):
    """Reduces `array` across ranks in place; returns a handle. `compression` overrides the
    settings' policy for this tensor: a codec name or {"codec": "maxmin", "bits": 4, ...}."""
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("allreduce_ needs a writeable C-contiguous numpy array")
    name = _b.auto_name("allreduce", name)
    native = _b.runtime().allreduce_async(array, array, name, check_op(op, average), prescale_factor,
                                          postscale_factor, _b.compression_spec(compression))
    return _b.register(native, lambda: array)


def allreduce_async(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
                    compression=None):
    """Reduces a copy of `array` across ranks; returns a handle whose result is the new array."""
    out = np.array(_array(array, "allreduce"), copy=True)
    return allreduce_async_(out, op, name, prescale_factor, postscale_factor, average, compression)


def allreduce(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None, compression=None):
    """op (default Average) of `array` over all ranks, as a new array."""
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor, average, compression))


def allreduce_(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
               compression=None):
    """In-place allreduce; returns `array`."""
    return synchronize(allreduce_async_(array, op, name, prescale_factor, postscale_factor, average, compression))


def grouped_allreduce_async(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Allreduces a list of arrays negotiated together; returns a handle whose result is the list."""
    base = _b.auto_name("grouped_allreduce", name)
    outs = [np.array(_array(a, "grouped_allreduce"), copy=True) for a in arrays]
    natives = _b.runtime().grouped_allreduce_async(outs, [f"{base}.{i}" for i in range(len(outs))], check_op(op),
                                                   prescale_factor, postscale_factor)

    class _Group:
        def poll(self):
            return all(n.poll() for n in natives)

        def wait(self):
            for n in natives:
                n.wait()

    return _b.register(_Group(), lambda: outs)


def grouped_allreduce(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor))


def allgather_async(array, name=None):
    """Concatenates every rank's `array` along the first dimension (which may differ per rank)."""
    a = _array(array, "allgather")
    if a.ndim == 0:
        raise ValueError("allgather needs an array with at least one dimension")
    native = _b.runtime().allgather_async(a, _b.auto_name("allgather", name))
    return _b.register(native, native.output)


def allgather(array, name=None):
    return synchronize(allgather_async(array, name))


def broadcast_async_(array, root_rank, name=None):
    """Overwrites `array` with root_rank's in place; returns a handle."""
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("broadcast_ needs a writeable C-contiguous numpy array")
    native = _b.runtime().broadcast_async(array, int(root_rank), _b.auto_name("broadcast", name))
    return _b.register(native, lambda: array)


def broadcast_async(array, root_rank, name=None):
    out = np.array(_array(array, "broadcast"), copy=True)
    return broadcast_async_(out, root_rank, name)


def broadcast(array, root_rank, name=None):
    """root_rank's `array` on every rank, as a new array."""
    return synchronize(broadcast_async(array, root_rank, name))


def broadcast_(array, root_rank, name=None):
    return synchronize(broadcast_async_(array, root_rank, name))


def alltoall_async(array, splits=None, name=None):
    """Sends rows splits[p] of `array` to rank p (even split by default). The result is
    (received array, rows received from each rank)."""
    a = _array(array, "alltoall")
    s = [] if splits is None else [int(v) for v in np.asarray(splits).reshape(-1)]
    native = _b.runtime().alltoall_async(a, s, _b.auto_name("alltoall", name))
    return _b.register(native, lambda: (native.output(), np.asarray(native.aux(), dtype=np.int64)))


def alltoall(array, splits=None, name=None):
    return synchronize(alltoall_async(array, splits, name))


def reducescatter_async(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `array` and gives each rank a slice of the first dimension (even split)."""
    a = _array(array, "reducescatter")
    if a.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    native = _b.runtime().reducescatter_async(a, _b.auto_name("reducescatter", name), check_op(op),
                                              prescale_factor, postscale_factor)
    return _b.register(native, native.output)


def reducescatter(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(reducescatter_async(array, op, name, prescale_factor, postscale_factor))


def join():
    """This rank is out of data: it contributes zeros to other ranks' reductions until all
    ranks have joined. Returns the last rank to join."""
    native = _b.runtime().join_async()
    native.wait()
    return int(native.aux()[0])


def barrier():
    """Returns once every rank has called barrier()."""
    _b.runtime().barrier_async().wait()
