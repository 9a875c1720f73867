"""Tensor collectives with Horovod's names and semantics, over gradcomp's runtime.

Each tensor reaches the runtime as (data address, dtype code, shape) of a contiguous host
buffer: CPU tensors are used in place when contiguous; other tensors (non-contiguous, or on a
GPU while the runtime is host-only) go through a contiguous host copy that is written back
when the operation completes. Handles are integers for ``poll``/``synchronize``.
"""
import torch

from gradcomp import _core
from gradcomp import basics as _b
from gradcomp.basics import Average, check_op, synchronize
from gradcomp.torch.compression import runtime_spec

# torch dtype -> the core's DataType code (ops/common/dtype.h).
_DTYPES = {getattr(torch, name): code for name, code in _core.dtypes.items()}
_SUPPORTED = ", ".join(_core.dtypes)


def dtype_code(tensor, what):
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{what}: dtype {tensor.dtype} is not supported ({_SUPPORTED})")
    return code


def _check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported; densify them first (tensor.to_dense())")


class _Staged:
    """A contiguous host tensor standing for `tensor` during one operation."""

    def __init__(self, tensor, what, copy_in=True):
        _check_tensor(tensor, what)
        self.code = dtype_code(tensor, what)
        self.original = tensor
        t = tensor.detach()
        if t.device.type == "cpu" and t.is_contiguous():
            self.host = t
        elif copy_in:
            self.host = t.to("cpu").contiguous()
        else:
            self.host = torch.empty(t.shape, dtype=t.dtype)
        self.in_place = self.host.data_ptr() == t.data_ptr() and t.device.type == "cpu"

    @property
    def ptr(self):
        return self.host.data_ptr()

    @property
    def shape(self):
        return list(self.host.shape)

    def write_back(self):
        """Copies the host result into the original tensor (no-op when it was used in place)."""
        if not self.in_place:
            with torch.no_grad():
                self.original.copy_(self.host)
        return self.original


def _new_output(like):
    """An uninitialized host tensor shaped like `like`."""
    return torch.empty(like.shape, dtype=like.dtype)


def _from_bytes(native, dtype, device):
    """The runtime-allocated result of `native` as a tensor."""
    raw = torch.from_numpy(native.output_bytes())
    shape = native.output_shape()
    out = raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype)
    return out.to(device) if device.type != "cpu" else out


# ---------------------------------------------------------------------------------------------
# allreduce


def _allreduce_start(staged, output_ptr, keep, name, op, prescale_factor, postscale_factor, compression):
    return _b.runtime().allreduce_async(staged.ptr, output_ptr, staged.code, staged.shape, name, op,
                                        float(prescale_factor), float(postscale_factor), runtime_spec(compression),
                                        keep)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     compression=None):
    """Reduces `tensor` across ranks in place; returns a handle for poll()/synchronize().

    `compression` is None (the settings' policy and layer filter) or a Compression object
    (Compression.none, fp16, bf16, maxmin(...), topk(...)) applied to this tensor as given."""
    op = check_op(op, average)
    name = _b.auto_name("allreduce", name)
    staged = _Staged(tensor, f"allreduce of '{name}'")
    native = _allreduce_start(staged, staged.ptr, (staged,), name, op, prescale_factor, postscale_factor,
                              compression)
    return _b.register(native, staged.write_back)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    compression=None):
    """Reduces a copy of `tensor` across ranks; synchronize(handle) returns the new tensor."""
    op = check_op(op, average)
    name = _b.auto_name("allreduce", name)
    staged = _Staged(tensor, f"allreduce of '{name}'")
    out = _new_output(staged.host)
    native = _allreduce_start(staged, out.data_ptr(), (staged, out), name, op, prescale_factor, postscale_factor,
                              compression)
    device = tensor.device
    return _b.register(native, lambda: out.to(device) if device.type != "cpu" else out)


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, compression):
        ctx.op, ctx.pre, ctx.post = op, prescale_factor, postscale_factor
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, compression))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, None, ctx.op, ctx.pre, ctx.post))
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """op (default Average) of `tensor` over all ranks, as a new tensor. Differentiable: the
    gradient is the same reduction of the output's gradient."""
    op = check_op(op, average)
    return _AllreduceFunction.apply(tensor, op, name, prescale_factor, postscale_factor, compression)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               compression=None):
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, compression))


class _Group:
    """Several native handles behaving as one."""

    def __init__(self, natives):
        self.natives = natives

    def poll(self):
        return all(n.poll() for n in self.natives)

    def wait(self):
        for n in self.natives:
            n.wait()


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             compression=None):
    """Reduces every tensor in place, negotiated and fused as one group; returns a handle
    whose result is the list."""
    op = check_op(op, average)
    base = _b.auto_name("grouped_allreduce", name)
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"grouped allreduce '{base}' needs at least one tensor")
    names = [f"{base}.{i}" for i in range(len(tensors))]
    staged = [_Staged(t, f"grouped allreduce of '{n}'") for t, n in zip(tensors, names)]
    if len({s.code for s in staged}) > 1:
        raise ValueError(f"grouped allreduce '{base}': every tensor must have the same dtype, got "
                         f"{sorted({str(t.dtype) for t in tensors})}")
    natives = _b.runtime().grouped_allreduce_async([s.ptr for s in staged], staged[0].code,
                                                   [s.shape for s in staged], names, op, float(prescale_factor),
                                                   float(postscale_factor), runtime_spec(compression),
                                                   tuple(staged))
    return _b.register(_Group(natives), lambda: [s.write_back() for s in staged])


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            compression=None):
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, compression)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0):
    """Allreduce of a list of tensors, negotiated and fused together; returns new tensors."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       compression=None):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                compression))


# ---------------------------------------------------------------------------------------------
# allgather, broadcast, alltoall, reducescatter


def allgather_async(tensor, name=None):
    """Concatenates every rank's `tensor` along the first dimension (which may differ per rank)."""
    name = _b.auto_name("allgather", name)
    staged = _Staged(tensor, f"allgather of '{name}'")
    if staged.host.dim() == 0:
        raise ValueError(f"allgather of '{name}' needs a tensor with at least one dimension")
    native = _b.runtime().allgather_async(staged.ptr, staged.code, staged.shape, name, (staged,))
    return _b.register(native, lambda: _from_bytes(native, tensor.dtype, tensor.device))


def _first_dims(n, name):
    """Every rank's first dimension, in rank order."""
    sizes = synchronize(allgather_async(torch.tensor([n], dtype=torch.int64), f"{name}.sizes"))
    return [int(v) for v in sizes]


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        gathered = synchronize(allgather_async(tensor, name))  # validates the tensor first
        ctx.dim = tensor.shape[0]
        return gathered

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: average the gradient over ranks, then keep this rank's rows.
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=Average))
        dims = _first_dims(ctx.dim, _b.auto_name("allgather.grad", None))
        offset = sum(dims[:_b.rank()])
        return grad.narrow(0, offset, ctx.dim), None


def allgather(tensor, name=None):
    """Every rank's `tensor` concatenated along the first dimension. Differentiable."""
    return _AllgatherFunction.apply(tensor, name)


def grouped_allgather_async(tensors, name=None):
    """Allgathers each tensor; the result is the list of gathered tensors."""
    base = _b.auto_name("grouped_allgather", name)
    handles = [allgather_async(t, f"{base}.{i}") for i, t in enumerate(tensors)]

    class _Gathered:
        def poll(self):
            return all(_b.poll(h) for h in handles)

        def wait(self):
            pass

    return _b.register(_Gathered(), lambda: [synchronize(h) for h in handles])


def grouped_allgather(tensors, name=None):
    return synchronize(grouped_allgather_async(tensors, name))


def broadcast_async_(tensor, root_rank, name=None):
    """Overwrites `tensor` with root_rank's, in place; returns a handle."""
    name = _b.auto_name("broadcast", name)
    staged = _Staged(tensor, f"broadcast of '{name}'")
    native = _b.runtime().broadcast_async(staged.ptr, staged.code, staged.shape, int(root_rank), name, (staged,))
    return _b.register(native, staged.write_back)


def broadcast_async(tensor, root_rank, name=None):
    """root_rank's `tensor` on every rank; synchronize(handle) returns the new tensor."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: the averaged gradient flows to the root's input only.
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=Average))
        if _b.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None


def broadcast(tensor, root_rank, name=None):
    """root_rank's `tensor` on every rank, as a new tensor. Differentiable."""
    return _BroadcastFunction.apply(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """In-place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def alltoall_async(tensor, splits=None, name=None):
    """Sends rows splits[p] of `tensor` to rank p (an even split by default). The result is
    (received tensor, rows received from each rank)."""
    name = _b.auto_name("alltoall", name)
    staged = _Staged(tensor, f"alltoall of '{name}'")
    s = []
    if splits is not None:
        splits = torch.as_tensor(splits)
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise ValueError(f"alltoall of '{name}': splits must be integers (row counts), got {splits.dtype}")
        s = [int(v) for v in splits.reshape(-1).tolist()]
    native = _b.runtime().alltoall_async(staged.ptr, staged.code, staged.shape, s, name, (staged,))
    return _b.register(native, lambda: (_from_bytes(native, tensor.dtype, tensor.device),
                                        torch.tensor(native.aux(), dtype=torch.int32)))


def alltoall(tensor, splits=None, name=None):
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` (default Average) and gives each rank a slice of the first dimension
    (ranks below first_dim % size get one row more)."""
    op = check_op(op)
    name = _b.auto_name("reducescatter", name)
    staged = _Staged(tensor, f"reducescatter of '{name}'")
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter of '{name}' needs a tensor with at least one dimension")
    native = _b.runtime().reducescatter_async(staged.ptr, staged.code, staged.shape, name, op,
                                              float(prescale_factor), float(postscale_factor), (staged,))
    return _b.register(native, lambda: _from_bytes(native, tensor.dtype, tensor.device))


def reducescatter(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor))


def join(device=-1):
    """This rank is out of data: it contributes zeros to other ranks' allreduces until every
    rank has joined. Returns the last rank to join."""
    del device  # the runtime is host-side
    return _b.join()


barrier = _b.barrier
