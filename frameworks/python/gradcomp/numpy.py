"""gradcomp for NumPy arrays, with Horovod's names and semantics.

    import numpy as np
    import gradcomp.numpy as gc
    gc.init()
    total = gc.allreduce(np.ones(4, np.float32), op=gc.Sum)

Every collective has an ``_async`` variant returning a handle for ``poll``/``synchronize``;
``allreduce_`` and ``broadcast_`` work in place. Names must match across ranks; when omitted,
names are generated from the call order (the same on every rank). ``process_set=`` (every
collective, as in the torch adapter): the ranks of a registered ProcessSet run it among
themselves; ``root_rank`` stays a global rank.
"""
import numpy as np

from gradcomp.basics import (Adasum, Average, GradcompError, Max, Min, ProcessSet, Product, Sum, add_process_set,
                             auto_summary, barrier, check_op, compression_choices, cross_rank, cross_size,
                             global_process_set, init, is_homogeneous, is_initialized, join, local_rank, local_size,
                             poll, rank, remove_process_set, shutdown, size, start_timeline, stats, stop_timeline,
                             synchronize, total_stats)
from gradcomp import _core
from gradcomp import basics as _b

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size", "cross_rank",
           "cross_size", "is_homogeneous", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
           "grouped_allreduce",
           "grouped_allreduce_async", "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
           "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "join",
           "barrier", "poll", "synchronize", "start_timeline", "stop_timeline", "Sum", "Average", "Min", "Max",
           "Product", "Adasum", "GradcompError", "stats", "total_stats", "compression_choices", "auto_summary",
           "Compression",
           "ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class Compression:
    """Compression specs for `compression=` (a codec name or a dict works too)."""

    @staticmethod
    def auto(candidates=None, reference=None, interval=25, relaxed=_b.BY_OPTIMIZER, critical_change=0.5,
             normalized=True):
        """Adaptive compression (gradcomp.basics.auto_spec): `reference` is a maxmin spec dict
        such as {"codec": "maxmin", "bits": 4, "error_feedback": True}; `relaxed` a maxmin spec
        dict of fewer bits (or the bits), where the budget of a calm tensor steps down to, one bit
        a choice; `normalized` weighs each tensor's error over its mean square (Adam and its kin)."""
        return _b.auto_spec(candidates, reference, interval, relaxed, critical_change, normalized)


# numpy dtype -> the core's DataType code (numpy has no bfloat16).
_DTYPES = {np.dtype(name): code for name, code in _core.dtypes.items() if name != "bfloat16"}


def _array(x, what):
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} expects a numpy array, got {type(x).__name__}")
    return np.ascontiguousarray(x)


def _buffer(a, what):
    """(address, dtype code, shape) of a C-contiguous array."""
    code = _DTYPES.get(a.dtype)
    if code is None:
        raise ValueError(f"{what}: dtype {a.dtype} is not supported ({', '.join(str(d) for d in _DTYPES)})")
    return a.ctypes.data, code, list(a.shape)


def _writeable(array, what):
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable):
        raise ValueError(f"{what} needs a writeable C-contiguous numpy array")


def _result(native, like):
    """The runtime-allocated result of `native`, as an array of like's dtype."""
    return lambda: native.output_bytes().view(like.dtype).reshape(native.output_shape())


@_b.submits
def allreduce_async_(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
                     compression=None, process_set=None):
    """Reduces `array` across ranks in place; returns a handle. `compression` overrides the
    settings' policy for this tensor: a codec name or {"codec": "maxmin", "bits": 4, ...}."""
    _writeable(array, "allreduce_")
    name = _b.auto_name("allreduce", name, process_set)
    ptr, code, shape = _buffer(array, f"allreduce of '{name}'")
    native = _b.runtime(process_set).allreduce_async(ptr, ptr, code, shape, name, check_op(op, average),
                                                     prescale_factor, postscale_factor,
                                                     _b.compression_spec(compression), array)
    return _b.register(native, lambda: array)


def allreduce_async(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
                    compression=None, process_set=None):
    """Reduces a copy of `array` across ranks; returns a handle whose result is the new array."""
    out = np.array(_array(array, "allreduce"), copy=True)
    return allreduce_async_(out, op, name, prescale_factor, postscale_factor, average, compression, process_set)


def allreduce(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None, compression=None,
              process_set=None):
    """op (default Average) of `array` over all ranks (or `process_set`'s), as a new array."""
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor, average, compression,
                                       process_set))


def allreduce_(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, average=None,
               compression=None, process_set=None):
    """In-place allreduce; returns `array`."""
    return synchronize(allreduce_async_(array, op, name, prescale_factor, postscale_factor, average, compression,
                                        process_set))


@_b.submits
def grouped_allreduce_async(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Allreduces a list of arrays negotiated together; returns a handle whose result is the list.
    Arrays of several dtypes are allowed (each dtype's arrays form a group of their own)."""
    base = _b.auto_name("grouped_allreduce", name, process_set)
    op = check_op(op)
    outs = [np.array(_array(a, "grouped_allreduce"), copy=True) for a in arrays]
    names = [f"{base}.{i}" for i in range(len(outs))]
    bufs = [_buffer(a, f"grouped allreduce of '{n}'") for a, n in zip(outs, names)]
    if not outs:
        raise ValueError(f"grouped allreduce '{base}' needs at least one array")
    if op == Adasum:  # checked for every array first, so a refused one submits nothing
        for a, n in zip(outs, names):
            if a.dtype.kind != "f":
                raise ValueError(f"grouped allreduce of '{n}': op adasum needs a floating-point array, got {a.dtype}")
    rt, natives = _b.runtime(process_set), []
    for code, indices in _b.indices_by(b[1] for b in bufs).items():
        natives += rt.grouped_allreduce_async([bufs[i][0] for i in indices], code, [bufs[i][2] for i in indices],
                                              [names[i] for i in indices], op, prescale_factor, postscale_factor,
                                              None, [outs[i] for i in indices])
    return _b.register(_b.NativeGroup(natives), lambda: outs)


def grouped_allreduce(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return synchronize(grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor, process_set))


@_b.submits
def allgather_async(array, name=None, process_set=None):
    """Concatenates every rank's `array` along the first dimension (which may differ per rank)."""
    a = _array(array, "allgather")
    if a.ndim == 0:
        raise ValueError("allgather needs an array with at least one dimension")
    name = _b.auto_name("allgather", name, process_set)
    native = _b.runtime(process_set).allgather_async(*_buffer(a, f"allgather of '{name}'"), name, a)
    return _b.register(native, _result(native, a))


def allgather(array, name=None, process_set=None):
    return synchronize(allgather_async(array, name, process_set))


@_b.submits
def grouped_allgather_async(arrays, name=None, process_set=None):
    """allgather of each array; the handle's result is the list of gathered arrays."""
    base = _b.auto_name("grouped_allgather", name, process_set)
    return _b.register_group([allgather_async(a, f"{base}.{i}", process_set) for i, a in enumerate(arrays)])


def grouped_allgather(arrays, name=None, process_set=None):
    return synchronize(grouped_allgather_async(arrays, name, process_set))


@_b.submits
def broadcast_async_(array, root_rank, name=None, process_set=None):
    """Overwrites `array` with root_rank's (a global rank) in place; returns a handle."""
    _writeable(array, "broadcast_")
    name = _b.auto_name("broadcast", name, process_set)
    root = _b.set_rank(process_set, root_rank, f"broadcast of '{name}'")
    native = _b.runtime(process_set).broadcast_async(*_buffer(array, f"broadcast of '{name}'"), root, name, array)
    return _b.register(native, lambda: array)


def broadcast_async(array, root_rank, name=None, process_set=None):
    out = np.array(_array(array, "broadcast"), copy=True)
    return broadcast_async_(out, root_rank, name, process_set)


def broadcast(array, root_rank, name=None, process_set=None):
    """root_rank's `array` on every rank, as a new array."""
    return synchronize(broadcast_async(array, root_rank, name, process_set))


def broadcast_(array, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(array, root_rank, name, process_set))


@_b.submits
def alltoall_async(array, splits=None, name=None, process_set=None):
    """Sends rows splits[p] of `array` to rank p (without splits, an even split: the first
    dimension must be a multiple of the number of ranks). The handle's result is (received
    array, rows received from each rank)."""
    a = _array(array, "alltoall")
    s = [] if splits is None else [int(v) for v in np.asarray(splits).reshape(-1)]
    name = _b.auto_name("alltoall", name, process_set)
    native = _b.runtime(process_set).alltoall_async(*_buffer(a, f"alltoall of '{name}'"), s, name, a)
    result = _result(native, a)
    return _b.register(native, lambda: (result(), np.asarray(native.aux(), dtype=np.int64)))


def alltoall(array, splits=None, name=None, process_set=None):
    """The received array; with `splits`, (received array, rows received from each rank), as
    Horovod returns them."""
    received, received_splits = synchronize(alltoall_async(array, splits, name, process_set))
    return received if splits is None else (received, received_splits)


@_b.submits
def reducescatter_async(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduces `array` and gives each rank a slice of the first dimension (even split)."""
    a = _array(array, "reducescatter")
    if a.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    name = _b.auto_name("reducescatter", name, process_set)
    native = _b.runtime(process_set).reducescatter_async(*_buffer(a, f"reducescatter of '{name}'"), name,
                                                         check_op(op), prescale_factor, postscale_factor, a)
    return _b.register(native, _result(native, a))


def reducescatter(array, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return synchronize(reducescatter_async(array, op, name, prescale_factor, postscale_factor, process_set))


@_b.submits
def grouped_reducescatter_async(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0,
                                process_set=None):
    """reducescatter of each array; the handle's result is the list of this rank's slices."""
    base = _b.auto_name("grouped_reducescatter", name, process_set)
    return _b.register_group([reducescatter_async(a, op, f"{base}.{i}", prescale_factor, postscale_factor, process_set)
                              for i, a in enumerate(arrays)])


def grouped_reducescatter(arrays, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return synchronize(grouped_reducescatter_async(arrays, op, name, prescale_factor, postscale_factor, process_set))
