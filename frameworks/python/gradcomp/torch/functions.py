"""Model and object helpers with Horovod's names: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object."""
import collections
import pickle

import torch

from gradcomp import basics as _b
from gradcomp import plain
from gradcomp.basics import synchronize
from gradcomp.torch import skeleton as state_skeleton
from gradcomp.torch.mpi_ops import allgather_async, broadcast_async_

try:
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle


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
    # Tensors travel in place, one broadcast each; everything else as one skeleton of plain
    # values, loaded as such (it runs no code): one that is not is refused on the root, and the
    # refusal reaches every rank instead of the skeleton.
    skeleton, tensors = state_skeleton.split(_in_parameter_order(optimizer.state_dict()))
    if _b.rank() == root_rank:
        try:
            plain.refuse_unplain(skeleton, "broadcast_optimizer_state", "the optimizer's state_dict()")
            sent = {"skeleton": skeleton}
        except ValueError as e:
            sent = {"error": f"{e} (on the root, rank {root_rank})"}
    root_sent = plain.loads(_broadcast_bytes(plain.dumps(sent) if _b.rank() == root_rank else None, root_rank,
                                             "broadcast_optimizer_state.skeleton", process_set))
    if "error" in root_sent:
        raise ValueError(root_sent["error"])
    handles = [broadcast_async_(t, root_rank, f"broadcast_optimizer_state.{path}", process_set)
               for path, t in tensors]
    for h in handles:
        synchronize(h)
    # The root's hyper-parameters (learning rate, momentum, step counts) win as well.
    optimizer.load_state_dict(state_skeleton.fill(root_sent["skeleton"], [t for _, t in tensors]))


def _in_parameter_order(state_dict):
    """`state_dict` with its per-parameter state ordered by parameter index: the order a state
    was created in (the parameters stepped first, as step() steps them as their exchanges end,
    or a checkpoint's) differs between ranks, and the tensors travel in this order."""
    def index(item):
        key = item[0]
        return (0, key, "") if isinstance(key, int) else (1, 0, repr(key))
    return dict(state_dict, state=dict(sorted(state_dict["state"].items(), key=index)))


def _pickled(obj, what):
    """obj pickled as Horovod does (cloudpickle where installed: lambdas and local classes too),
    or, for an object that cannot be pickled, why: what every rank raises instead of waiting."""
    try:
        return b"P" + _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # pickling runs the object's own code: any error
        return b"E" + f"{what}: cannot pickle the {type(obj).__name__} of rank {_b.rank()}: {e}".encode()


def _unpickled(data):
    if data[:1] == b"E":
        raise ValueError(data[1:].decode())
    return pickle.loads(data[1:])


def _as_tensor(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _broadcast_bytes(data, root_rank, name, process_set):
    """root_rank's bytes (`data` there, ignored elsewhere) on every rank, as bytes."""
    payload = _as_tensor(data) if _b.rank() == root_rank else torch.zeros(0, dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    synchronize(broadcast_async_(size, root_rank, f"{name}.size", process_set))
    if _b.rank() != root_rank:
        payload = torch.zeros(int(size[0]), dtype=torch.uint8)
    synchronize(broadcast_async_(payload, root_rank, f"{name}.data", process_set))
    return payload.numpy().tobytes()


@_b.submits
def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` (anything picklable) on every rank (of `process_set`). The other ranks
    unpickle what the root pickled, as in Horovod: like any pickle, it can run the root's code."""
    name = _b.auto_name("broadcast_object", name, process_set)
    mine = _pickled(obj, "broadcast_object") if _b.rank() == root_rank else None
    data = _broadcast_bytes(mine, root_rank, name, process_set)
    got = _unpickled(data)  # the root too: its error, if any, is every rank's
    return obj if _b.rank() == root_rank else got


@_b.submits
def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj` (anything picklable), as a list in rank order (of `process_set`). Each
    rank unpickles the others' pickles, as in Horovod: like any pickle, they can run their code."""
    name = _b.auto_name("allgather_object", name, process_set)
    payload = _as_tensor(_pickled(obj, "allgather_object"))
    sizes = synchronize(allgather_async(torch.tensor([payload.numel()], dtype=torch.int64), f"{name}.sizes",
                                        process_set))
    gathered = synchronize(allgather_async(payload, f"{name}.data", process_set))
    parts, at = [], 0
    for n in sizes.tolist():
        parts.append(gathered[at:at + n].numpy().tobytes())
        at += n
    for part in parts:  # a rank's object that could not be pickled fails every rank, naming it
        if part[:1] == b"E":
            _unpickled(part)
    return [_unpickled(part) for part in parts]
