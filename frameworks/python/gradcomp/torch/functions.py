"""Model and object helpers with Horovod's names: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object."""
import collections
import io
import pickle

import torch

from gradcomp import basics as _b
from gradcomp.basics import synchronize
from gradcomp.torch.mpi_ops import allgather_async, broadcast_async_


def _named_tensors(params, what):
    if isinstance(params, dict):
        return sorted(params.items())
    if isinstance(params, collections.abc.Iterable):
        items = list(params)
        if all(isinstance(p, tuple) and len(p) == 2 for p in items):
            return items
    raise ValueError(f"{what} expects a state_dict or a list of (name, tensor) pairs, got {type(params).__name__}")


def broadcast_parameters(params, root_rank, process_set=None):
    """Overwrites every tensor of `params` (model.state_dict() or model.named_parameters())
    with root_rank's, in place (among `process_set`'s ranks)."""
    handles = []
    for name, p in _named_tensors(params, "broadcast_parameters"):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: '{name}' is a {type(p).__name__}, not a tensor")
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p, root_rank,
                                        f"broadcast_parameters.{name}", process_set))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Makes every rank's optimizer state (hyper-parameters and per-parameter buffers) equal
    to root_rank's. An optimizer without state yet gets it initialized first (one step on
    zero gradients, parameters restored afterwards), as Horovod does; parameters that had
    no gradient keep the zero gradient of that step, as in Horovod."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support torch.optim.LBFGS")
    if not optimizer.state_dict()["state"]:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        saved = [(p, p.data.clone(), p.grad) for p in params]
        for p in params:
            p.grad = torch.zeros_like(p)
        base = getattr(optimizer, "_gradcomp_wrapped_step", None)
        (base or optimizer.step)()
        for p, data, grad in saved:
            p.data.copy_(data)
            if grad is not None:
                p.grad = grad
    state = optimizer.state_dict()
    # Tensors travel in place, one broadcast each; everything else in one pickled object.
    tensors = []

    def strip(obj, path):
        if isinstance(obj, torch.Tensor):
            tensors.append((path, obj))
            return ("__gradcomp_tensor__", len(tensors) - 1)
        if isinstance(obj, dict):
            return {k: strip(v, f"{path}.{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(strip(v, f"{path}.{i}") for i, v in enumerate(obj))
        return obj

    skeleton = strip(state, "state")
    root_skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state.skeleton",
                                     process_set=process_set)
    handles = [broadcast_async_(t, root_rank, f"broadcast_optimizer_state.{path}", process_set)
               for path, t in tensors]
    for h in handles:
        synchronize(h)

    def fill(obj):
        if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "__gradcomp_tensor__":
            return tensors[obj[1]][1]
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(v) for v in obj)
        return obj

    # The root's hyper-parameters (learning rate, momentum, step counts) win as well.
    optimizer.load_state_dict(fill(root_skeleton))


def _to_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(t):
    return torch.load(io.BytesIO(t.numpy().tobytes()))


@_b.submits
def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` (anything picklable) on every rank (of `process_set`)."""
    name = _b.auto_name("broadcast_object", name, process_set)
    payload = _to_bytes(obj) if _b.rank() == root_rank else torch.zeros(0, dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    synchronize(broadcast_async_(size, root_rank, f"{name}.size", process_set))
    if _b.rank() != root_rank:
        payload = torch.zeros(int(size[0]), dtype=torch.uint8)
    synchronize(broadcast_async_(payload, root_rank, f"{name}.data", process_set))
    return obj if _b.rank() == root_rank else _from_bytes(payload)


@_b.submits
def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj` (anything picklable), as a list in rank order (of `process_set`)."""
    name = _b.auto_name("allgather_object", name, process_set)
    payload = _to_bytes(obj)
    sizes = synchronize(allgather_async(torch.tensor([payload.numel()], dtype=torch.int64), f"{name}.sizes",
                                        process_set))
    gathered = synchronize(allgather_async(payload, f"{name}.data", process_set))
    out, at = [], 0
    for n in sizes.tolist():
        out.append(_from_bytes(gathered[at:at + n]))
        at += n
    return out
