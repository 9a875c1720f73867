"""Tensor collectives with Horovod's names and semantics, over gradcomp's runtime.

Each tensor reaches the runtime as (data address, dtype code, shape) of a contiguous host
buffer: CPU tensors are used in place when contiguous; other tensors (non-contiguous, or on a
GPU while the runtime is host-only) go through a contiguous host copy that is written back
when the operation completes. Handles are integers for ``poll``/``synchronize``.

An explicit ``compression`` keeps the meaning Horovod's compressors give it: it compresses
floating-point tensors and leaves the others alone. float64 tensors travel as float32 (the
codecs' input; Horovod's fp16 compressor casts them too) and come back as float64; integer and
bool tensors are reduced exactly.

``process_set=`` (every collective, as in Horovod): the ranks of a registered ProcessSet run
it among themselves, on that set's runtime; ``root_rank`` stays a global rank.

Positional arguments come in Horovod 0.28's order, so a call written for Horovod means the same
here; what gradcomp adds (``compression`` on the asynchronous and in-place allreduces,
``priority``) comes after ``process_set``.
"""
import torch

from gradcomp import _core
from gradcomp import basics as _b
from gradcomp.basics import Average, check_op, synchronize
from gradcomp.torch import compat
from gradcomp.torch.compression import Compression, PowerSGD, called, runtime_spec

# torch dtype -> the core's DataType code (ops/common/dtype.h).
_DTYPES = {getattr(torch, name): code for name, code in _core.dtypes.items()}
_SUPPORTED = ", ".join(_core.dtypes)


def dtype_code(tensor, what):
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{what}: dtype {tensor.dtype} is not supported ({_SUPPORTED})")
    return code


_CODEC_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_EXACT = {"codec": "none"}


def compressed_form(dtype, spec):
    """(runtime spec, dtype to stage in or None) of a tensor of `dtype` under the runtime spec
    `spec` (None: the settings' policy, which leaves dtypes the codecs do not take exact)."""
    if spec is None or spec.get("codec") == "none" or dtype in _CODEC_DTYPES:
        return spec, None
    if dtype == torch.float64:
        return spec, torch.float32
    return _EXACT, None  # integers and bool: reduced exactly, as Horovod's compressors leave them


def adasum_form(dtype, compression, what):
    """(runtime spec, dtype to stage in or None) of an op=Adasum allreduce of a `dtype` tensor
    under the torch `compression` argument. Adasum combines whole vectors (their dot products
    and norms), so it runs exact, on the values Horovod's compressors would send: fp16 and bf16
    cast the tensor first; maxmin, top-k and the like cannot apply."""
    if not dtype.is_floating_point:
        raise ValueError(f"{what}: op Adasum needs a floating-point tensor, got {dtype}")
    spec = runtime_spec(compression)
    codec = "none" if spec is None else spec.get("codec")
    if codec in ("fp16", "bf16"):
        cast = torch.float16 if codec == "fp16" else torch.bfloat16
        return _EXACT, (None if dtype == cast else cast)
    if codec != "none":
        raise ValueError(f"{what}: op Adasum runs on exact values (its coefficients need each tensor's dot "
                         f"products and norms), so compression {compression!r} cannot apply; use "
                         "Compression.none, fp16 or bf16")
    return _EXACT, None


def _check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported; densify them first (tensor.to_dense())")


class _Staged:
    """The buffer the runtime works on for `tensor` during one operation: the tensor itself when
    it is contiguous in host memory, or in GPU memory where the operation takes device buffers
    (`on_device`) and the runtime has the CUDA data path; else a contiguous host copy."""

    def __init__(self, tensor, what, copy_in=True, on_device=False, dtype=None):
        _check_tensor(tensor, what)
        self.code = dtype_code(tensor, what)
        self.original = tensor
        self.device, self.stream = -1, 0  # host memory
        t = tensor.detach()
        if dtype is not None and dtype != t.dtype:
            # Staged in another dtype (compressed_form): a converted copy, written back converted.
            t = t.to(dtype)
            self.code = dtype_code(t, what)
        if t.is_cuda and on_device and _b.runtime().cuda_data_path:
            # Encoded, reduced and decoded on the GPU; only encoded bytes reach the host.
            self.buffer = t if t.is_contiguous() else t.contiguous()
            self.device = t.device.index
            self.stream = torch.cuda.current_stream(t.device).cuda_stream
        elif t.device.type == "cpu" and t.is_contiguous():
            self.buffer = t
        elif copy_in:
            self.buffer = t.to("cpu").contiguous()
        else:
            self.buffer = torch.empty(t.shape, dtype=t.dtype)
        self.in_place = self.buffer.data_ptr() == tensor.data_ptr() and self.buffer.device == tensor.device

    @property
    def ptr(self):
        return self.buffer.data_ptr()

    @property
    def shape(self):
        return list(self.buffer.shape)

    def write_back(self):
        """Copies the result into the original tensor (no-op when it was used in place)."""
        if not self.in_place:
            with torch.no_grad():
                self.original.copy_(self.buffer)
        return self.original


def _new_output(like):
    """An uninitialized tensor shaped like `like`, in the same memory."""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def _same_gpu(tensors):
    """Whether every tensor is on one GPU (a grouped operation hands them over as one placement)."""
    return all(t.is_cuda for t in tensors) and len({t.device for t in tensors}) == 1


def _from_output(native, dtype, device):
    """The runtime-allocated result of `native` as a tensor on `device`: copied straight from
    the runtime's buffer (GPU to GPU when the operation ran on the GPU)."""
    shape = native.output_shape()
    if device.type != "cpu" and not native.output_on_device():
        # A GPU tensor staged through the host (GRADCOMP_CUDA_DATA_PATH=0 or no CUDA kernels).
        raw = torch.from_numpy(native.output_bytes())
        out = raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype)
        return out.to(device)
    out = torch.empty(shape, dtype=dtype, device=device)
    ordinal, stream = (device.index, torch.cuda.current_stream(device).cuda_stream) if out.is_cuda else (-1, 0)
    native.copy_output_to(out.data_ptr(), out.numel() * out.element_size(), ordinal, stream)
    return out


def _direct_output(output, staged):
    """(address, bytes) of `output` where the runtime can write the result straight into it (a
    contiguous host tensor of the input's dtype apart from the input's memory, the input staged
    in host memory), else (0, 0). An output that holds the input (FSDP2's allgather reads its
    shard from its output) takes the copy: the collectives read their input while they write."""
    if (output is None or staged.device != -1 or output.device.type != "cpu" or not output.is_contiguous()
            or output.dtype != staged.buffer.dtype):
        return 0, 0
    address, size = output.data_ptr(), output.numel() * output.element_size()
    start, end = staged.ptr, staged.ptr + staged.buffer.numel() * staged.buffer.element_size()
    if address < end and start < address + size:
        return 0, 0
    return address, size


def _result(native, tensor, output, direct, what):
    """The finish of an allgather or reducescatter of `tensor`: a new tensor, or `output`, which
    the runtime wrote (`direct`) or which the result is copied into once it has its elements
    and dtype (a ValueError on this rank otherwise, after the exchange)."""
    if output is None:
        return lambda: _from_output(native, tensor.dtype, tensor.device)
    if direct:
        return lambda: output

    def copy():
        result = _from_output(native, tensor.dtype, tensor.device)
        if output.numel() != result.numel() or output.dtype != result.dtype:
            raise ValueError(f"{what}: output holds {output.numel()} {output.dtype}, the result is "
                             f"{tuple(result.shape)} {result.dtype}")
        with torch.no_grad():
            output.copy_(result.reshape(output.shape))
        return output

    return copy


# ---------------------------------------------------------------------------------------------
# allreduce


def _check_priority(priority, what):
    if isinstance(priority, bool) or not isinstance(priority, int) or not -2**31 <= priority < 2**31:
        raise ValueError(f"{what}: priority must be a 32-bit integer (lower runs first), got {priority!r}")
    return priority


def _allreduce_start(staged, output_ptr, keep, name, op, prescale_factor, postscale_factor, spec, priority=0,
                     process_set=None):
    rt = _b.runtime(process_set)
    return rt.allreduce_async(staged.ptr, output_ptr, staged.code, staged.shape, name, op,
                              float(prescale_factor), float(postscale_factor), spec,
                              keep, device=staged.device, stream=staged.stream,
                              priority=_check_priority(priority, f"allreduce of '{name}'"))


def _staged_for_allreduce(tensor, name, compression, op):
    """(_Staged, runtime spec) of one tensor to allreduce with `op` under `compression`."""
    _check_tensor(tensor, f"allreduce of '{name}'")
    if op == _b.Adasum:
        spec, dtype = adasum_form(tensor.dtype, compression, f"allreduce of '{name}'")
    else:
        spec, dtype = compressed_form(tensor.dtype, runtime_spec(compression))
    return _Staged(tensor, f"allreduce of '{name}'", on_device=True, dtype=dtype), spec


@_b.submits
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None, compression=None, priority=0):
    """Reduces `tensor` across ranks in place; returns a handle for poll()/synchronize().

    `compression` is None (the settings' policy and layer filter) or a Compression object
    (Compression.none, fp16, bf16, maxmin(...), topk(...)) applied to this tensor as given.
    `priority` (the same on every rank): among tensors ready at once, lower runs first, a
    GRADCOMP_SCHEDULING_CREDIT_MB's worth a cycle, so an urgent tensor overtakes a backlog."""
    op = check_op(op, average)
    name = _b.auto_name("allreduce", name, process_set)
    staged, spec = _staged_for_allreduce(tensor, name, compression, op)
    native = _allreduce_start(staged, staged.ptr, (staged,), name, op, prescale_factor, postscale_factor,
                              spec, priority, process_set)
    return _b.register(native, staged.write_back)


def host_allreduce_async_(tensor, name, op, prescale_factor, postscale_factor, spec, priority, process_set=None):
    """allreduce_async_ of a contiguous CPU tensor whose arguments the caller checked once
    (`op` a checked op, `name` a string, `spec` from runtime_spec, `priority` a 32-bit int):
    DistributedOptimizer's gradient hooks, which run on the training thread once per gradient
    a step, where every Python call of allreduce_async_'s general path (staging, checks,
    automatic names) is the training thread's time."""
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        dtype_code(tensor, f"allreduce of '{name}'")  # raises, naming the tensor and the dtype
    ptr = tensor.data_ptr()
    rt = _b.runtime(process_set)
    native = rt.allreduce_async(ptr, ptr, code, list(tensor.shape), name, op, prescale_factor,
                                postscale_factor, spec, tensor, -1, 0, priority)
    return _b.register(native, lambda: tensor)


@_b.submits
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=None):
    """Reduces a copy of `tensor` across ranks; synchronize(handle) returns the new tensor."""
    op = check_op(op, average)
    name = _b.auto_name("allreduce", name, process_set)
    staged, spec = _staged_for_allreduce(tensor, name, compression, op)
    out = _new_output(staged.buffer)
    native = _allreduce_start(staged, out.data_ptr(), (staged, out), name, op, prescale_factor, postscale_factor,
                              spec, process_set=process_set)
    device, dtype = tensor.device, tensor.dtype
    return _b.register(native, lambda: out.to(device=device, dtype=dtype))


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, compression, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, process_set,
                                           compression))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, None, ctx.op, ctx.pre, ctx.post,
                                           process_set=ctx.process_set))
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """op (default Average) of `tensor` over all ranks, as a new tensor. Differentiable: the
    gradient is the same reduction of the output's gradient."""
    op = check_op(op, average)
    return _AllreduceFunction.apply(tensor, op, name, prescale_factor, postscale_factor, compression, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None, compression=None):
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                                        compression))


@_b.submits
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None, compression=None, priority=0):
    """Reduces every tensor in place, negotiated and fused as one group; returns a handle
    whose result is the list. `priority` as for allreduce_async_. Tensors of several dtypes
    are allowed, as in Horovod: each dtype's tensors form a group of their own."""
    op = check_op(op, average)
    base = _b.auto_name("grouped_allreduce", name, process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"grouped allreduce '{base}' needs at least one tensor")
    names = [f"{base}.{i}" for i in range(len(tensors))]
    for t, n in zip(tensors, names):
        _check_tensor(t, f"grouped allreduce of '{n}'")
        dtype_code(t, f"grouped allreduce of '{n}'")
    priority = _check_priority(priority, f"grouped allreduce '{base}'")
    by_dtype = _b.indices_by(t.dtype for t in tensors)
    # Every dtype's form first, so a refused one submits nothing on this rank.
    forms = {dtype: (adasum_form(dtype, compression, f"grouped allreduce '{base}'") if op == _b.Adasum
                     else compressed_form(dtype, runtime_spec(compression))) for dtype in by_dtype}
    rt = _b.runtime(process_set)
    staged, natives = [None] * len(tensors), []
    for dtype, indices in by_dtype.items():
        spec, stage_as = forms[dtype]
        on_gpu = _same_gpu([tensors[i] for i in indices])
        part = [_Staged(tensors[i], f"grouped allreduce of '{names[i]}'", on_device=on_gpu, dtype=stage_as)
                for i in indices]
        for i, s in zip(indices, part):
            staged[i] = s
        natives += rt.grouped_allreduce_async([s.ptr for s in part], part[0].code, [s.shape for s in part],
                                              [names[i] for i in indices], op, float(prescale_factor),
                                              float(postscale_factor), spec, tuple(part), device=part[0].device,
                                              stream=part[0].stream, priority=priority)
    return _b.register(_b.NativeGroup(natives), lambda: [s.write_back() for s in staged])


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None, compression=None):
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set,
                                    compression)


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, compression, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op, prescale_factor,
                                                         postscale_factor, process_set, compression)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], None, None, ctx.op, ctx.pre,
                                                      ctx.post, process_set=ctx.process_set))
        return (None,) * 6 + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """Allreduce of a list of tensors, negotiated and fused together; returns new tensors.
    Differentiable: each gradient is the same reduction of its output's gradient."""
    op = check_op(op, average)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allreduce needs at least one tensor")
    return list(_GroupedAllreduceFunction.apply(op, name, prescale_factor, postscale_factor, compression, process_set,
                                                *tensors))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, compression=None):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set, compression))


# ---------------------------------------------------------------------------------------------
# allgather, broadcast, alltoall, reducescatter


@_b.submits
def allgather_async(tensor, name=None, process_set=None, compression=None, *, output=None):
    """Concatenates every rank's `tensor` along the first dimension (which may differ per rank).

    `compression` is None (GRADCOMP_ALLGATHER_COMPRESSION through the layer filter, none by
    default) or Compression.none, fp16, bf16 or maxmin(...): every rank's rows are encoded once
    and every rank decodes them all, so the result is the same on every rank. `output`, a tensor
    with the result's elements and dtype (any shape), receives it and is the result: a
    contiguous host tensor is written (decoded) in place, with no copy."""
    name = _b.auto_name("allgather", name, process_set)
    staged = _Staged(tensor, f"allgather of '{name}'", on_device=True)
    if staged.buffer.dim() == 0:
        raise ValueError(f"allgather of '{name}' needs a tensor with at least one dimension")
    rt = _b.runtime(process_set)
    address, size = _direct_output(output, staged)
    native = rt.allgather_async(staged.ptr, staged.code, staged.shape, name, (staged, output),
                                device=staged.device, stream=staged.stream, compression=runtime_spec(compression),
                                output=address, output_bytes=size)
    return _b.register(native, _result(native, tensor, output, address != 0, f"allgather of '{name}'"))


def _first_dims(dims, name, process_set):
    """Every rank's first dimension of each tensor: dims[i] of rank r at [r][i]."""
    sizes = synchronize(allgather_async(torch.tensor(dims, dtype=torch.int64), f"{name}.sizes", process_set))
    return sizes.reshape(-1, len(dims)).tolist()


def _own_rows(grads, dims, name, process_set):
    """This rank's rows of each gathered gradient (every rank's first dimensions gathered)."""
    every = _first_dims(dims, name, process_set)
    me = _b.runtime(process_set).rank()
    return [g.narrow(0, sum(every[r][i] for r in range(me)), dims[i]) for i, g in enumerate(grads)]


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        gathered = synchronize(allgather_async(tensor, name, process_set))  # validates the tensor first
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return gathered

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: average the gradient over ranks, then keep this rank's rows.
        ps = ctx.process_set
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=Average, process_set=ps))
        return _own_rows([grad], [ctx.dim], _b.auto_name("allgather.grad", None, ps), ps)[0], None, None


def allgather(tensor, name=None, process_set=None):
    """Every rank's `tensor` concatenated along the first dimension. Differentiable."""
    return _AllgatherFunction.apply(tensor, name, process_set)


@_b.submits
def grouped_allgather_async(tensors, name=None, process_set=None):
    """Allgathers each tensor; the result is the list of gathered tensors."""
    base = _b.auto_name("grouped_allgather", name, process_set)
    return _b.register_group([allgather_async(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)])


class _GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        gathered = synchronize(grouped_allgather_async(list(tensors), name, process_set))
        ctx.dims, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(gathered)

    @staticmethod
    def backward(ctx, *grads):
        # As allgather's: the averaged gradients, this rank's rows of each.
        ps = ctx.process_set
        averaged = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], op=Average, process_set=ps))
        return (None, None) + tuple(_own_rows(averaged, ctx.dims, _b.auto_name("grouped_allgather.grad", None, ps),
                                              ps))


def grouped_allgather(tensors, name=None, process_set=None):
    """allgather of each tensor, negotiated together; returns the gathered tensors.
    Differentiable."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allgather needs at least one tensor")
    return list(_GroupedAllgatherFunction.apply(name, process_set, *tensors))


@_b.submits
def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Overwrites `tensor` with root_rank's (a global rank), in place; returns a handle."""
    name = _b.auto_name("broadcast", name, process_set)
    root = _b.set_rank(process_set, root_rank, f"broadcast of '{name}'")
    staged = _Staged(tensor, f"broadcast of '{name}'", on_device=True)
    rt = _b.runtime(process_set)
    native = rt.broadcast_async(staged.ptr, staged.code, staged.shape, root, name, (staged,),
                                device=staged.device, stream=staged.stream)
    return _b.register(native, staged.write_back)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """root_rank's `tensor` on every rank; synchronize(handle) returns the new tensor."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # As Horovod: the averaged gradient flows to the root's input only.
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=Average, process_set=ctx.process_set))
        if _b.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's `tensor` on every rank, as a new tensor. Differentiable."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In-place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


@_b.submits
def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Sends rows splits[p] of `tensor` to rank p (without splits, an even split: the first
    dimension must be a multiple of the number of ranks). The handle's result is (received
    tensor, rows received from each rank)."""
    name = _b.auto_name("alltoall", name, process_set)
    staged = _Staged(tensor, f"alltoall of '{name}'", on_device=True)
    s = []
    if splits is not None:
        splits = torch.as_tensor(splits)
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise ValueError(f"alltoall of '{name}': splits must be integers (row counts), got {splits.dtype}")
        s = [int(v) for v in splits.reshape(-1).tolist()]
    rt = _b.runtime(process_set)
    native = rt.alltoall_async(staged.ptr, staged.code, staged.shape, s, name, (staged,),
                               device=staged.device, stream=staged.stream)
    return _b.register(native, lambda: (_from_output(native, tensor.dtype, tensor.device),
                                        torch.tensor(native.aux(), dtype=torch.int32)))


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        received, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received_splits, ctx.process_set = received_splits, process_set
        ctx.mark_non_differentiable(received_splits)
        return received, received_splits

    @staticmethod
    def backward(ctx, grad_output, grad_splits):
        del grad_splits
        # The gradient of each row goes back to the rank that sent it.
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received_splits,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """The received tensor; with `splits`, (received tensor, rows received from each rank), as
    Horovod returns them. Differentiable."""
    received, received_splits = _AlltoallFunction.apply(tensor, splits, name, process_set)
    return received if splits is None else (received, received_splits)


@_b.submits
def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0, postscale_factor=1.0,
                        compression=None, *, output=None):
    """Reduces `tensor` (default Average) and gives each rank a slice of the first dimension
    (ranks below first_dim % size get one row more).

    `compression` is None (the settings' GRADCOMP_COMPRESSION through the layer filter; topk and
    auto leave reducescatters exact) or Compression.none, fp16, bf16, maxmin(...) or auto(...) (a
    setting for this name, chosen as an allreduced tensor's): each rank's pieces of its peers'
    slices are encoded, and each slice is summed in float32 by its owner (error feedback by name
    with GRADCOMP_ERROR_FEEDBACK or the spec's error_feedback).
    `output`, a tensor with the slice's elements and dtype, receives it as allgather_async's does."""
    op = check_op(op)
    if op == _b.Adasum:  # Horovod raises a RuntimeError here too
        raise NotImplementedError("reducescatter: op Adasum is an allreduce only; use Sum or Average")
    name = _b.auto_name("reducescatter", name, process_set)
    staged = _Staged(tensor, f"reducescatter of '{name}'", on_device=True)
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter of '{name}' needs a tensor with at least one dimension")
    rt = _b.runtime(process_set)
    address, size = _direct_output(output, staged)
    native = rt.reducescatter_async(staged.ptr, staged.code, staged.shape, name, op,
                                    float(prescale_factor), float(postscale_factor), (staged, output),
                                    device=staged.device, stream=staged.stream,
                                    compression=runtime_spec(compression), output=address, output_bytes=size)
    return _b.register(native, _result(native, tensor, output, address != 0, f"reducescatter of '{name}'"))


def _reducescatter_grads(grads, op, prescale_factor, postscale_factor, process_set):
    """Horovod's gradient of a reducescatter: every rank's output gradients gathered (the
    rows each rank received), times the number of ranks for Sum, times the scale factors."""
    gathered = synchronize(grouped_allgather_async([g.contiguous() for g in grads], process_set=process_set))
    factor = (_b.runtime(process_set).size() if op == _b.Sum else 1) * prescale_factor * postscale_factor
    return [g * factor if factor != 1 else g for g in gathered]


class _ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, process_set, spec):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor,
                                               spec))

    @staticmethod
    def backward(ctx, grad_output):
        grad = _reducescatter_grads([grad_output], ctx.op, ctx.pre, ctx.post, ctx.process_set)[0]
        return grad, None, None, None, None, None, None


def _cast_for_reducescatter(compression, what):
    """(the Compressor whose compress()/decompress() wrap a reducescatter, as Horovod's does, the
    runtime spec or None): none, fp16, bf16 or a Horovod-style compressor of the caller's own
    cast around it; Compression.maxmin(...) and auto(...) (a setting per name, chosen as for an
    allreduce's tensor) run in the runtime (compressed_shards.h). topk and PowerSGD compress
    allreduces only."""
    if compression is None:
        return Compression.none, None
    compression = called(compression)
    spec = getattr(compression, "spec", None)
    if spec is not None and spec.get("codec") in ("maxmin", "auto"):
        return Compression.none, dict(spec)
    if isinstance(compression, PowerSGD) or (spec is not None and spec.get("codec") not in ("none", "fp16", "bf16")):
        raise ValueError(f"{what}: compression {compression!r} compresses allreduces only; a reducescatter takes "
                         "Compression.none, fp16, bf16, maxmin(...) or auto(...)")
    if not callable(getattr(compression, "compress", None)) or not callable(getattr(compression, "decompress", None)):
        raise ValueError(f"{what}: compression must be a gradcomp.torch.Compression choice or have compress() and "
                         f"decompress(), got {compression!r}")
    return compression, None


def reducescatter(tensor, name=None, compression=None, op=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """op (default Average) of `tensor` over all ranks; this rank gets its slice of the first
    dimension (ranks below first_dim % size get one row more). `compression` (Compression.none,
    fp16 or bf16) casts the tensor before and the slice after, as Horovod's; Compression.maxmin(...)
    quantizes each rank's pieces of its peers' slices (reducescatter_async). Differentiable."""
    compression, spec = _cast_for_reducescatter(compression, f"reducescatter of '{name}'")
    compressed, ctx = compression.compress(tensor)
    reduced = _ReducescatterFunction.apply(compressed, check_op(op), name, prescale_factor, postscale_factor,
                                           process_set, spec)
    return compression.decompress(reduced, ctx)


@_b.submits
def grouped_reducescatter_async(tensors, name=None, op=None, process_set=None, prescale_factor=1.0,
                                postscale_factor=1.0, compression=None):
    """reducescatter of each tensor; the handle's result is the list of this rank's slices."""
    base = _b.auto_name("grouped_reducescatter", name, process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"grouped reducescatter '{base}' needs at least one tensor")
    return _b.register_group([reducescatter_async(t, f"{base}.{i}", op, process_set, prescale_factor,
                                                  postscale_factor, compression)
                              for i, t in enumerate(tensors)])


class _GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, process_set, spec, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor, spec)))

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * 6 + tuple(_reducescatter_grads(grads, ctx.op, ctx.pre, ctx.post, ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=None, op=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor (default Average), negotiated together; returns this
    rank's slices. `compression` as for reducescatter. Differentiable."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped reducescatter needs at least one tensor")
    compression, spec = _cast_for_reducescatter(compression, f"grouped reducescatter '{name}'")
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = _GroupedReducescatterFunction.apply(check_op(op), name, prescale_factor, postscale_factor, process_set,
                                                  spec, *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]


@_b.submits
def sparse_allreduce_async(tensor, name=None, op=None, process_set=None):
    """Allreduce of a sparse COO tensor as Horovod does it: every rank's indices and values
    are allgathered (coordinates present on several ranks appear several times; coalescing
    sums them) and Average divides the values by the number of ranks. Returns a function
    that waits and returns the reduced sparse tensor."""
    op = check_op(op)
    if op not in (_b.Sum, Average):
        raise ValueError(f"sparse allreduce supports Sum and Average, got {_b.OP_NAMES[op]}")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError(f"sparse_allreduce_async expects a sparse COO tensor, got {type(tensor).__name__}"
                         + (f" with layout {tensor.layout}" if isinstance(tensor, torch.Tensor) else ""))
    name = _b.auto_name("sparse_allreduce", name, process_set)
    indices = allgather_async(tensor._indices().t().contiguous(), f"{name}.indices", process_set)
    values = allgather_async(tensor._values().contiguous(), f"{name}.values", process_set)
    ranks = _b.runtime(process_set).size()

    def result():
        v = synchronize(values)
        i = synchronize(indices)
        if op == Average:
            v = v / ranks
        return compat.sparse_coo_tensor(i.t(), v, tensor.size())

    return result


def join(device=-1):
    """This rank is out of data: it contributes zeros to other ranks' allreduces until every
    rank has joined. Returns the last rank to join."""
    del device  # the runtime is host-side
    return _b.join()


barrier = _b.barrier
