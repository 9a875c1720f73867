"""What differs between the torch versions gradcomp runs on (1.13 through 2.13), in one place:
the rest of the adapter calls these and never looks at torch's version itself.

Checked against torch 2.0-2.13 and found to work unchanged on all, so not here: the backend's
creator returning a ProcessGroup subclass (torch 2 keeps the group the creator returns as it is,
without the ProcessGroup/Backend split of its own backends), Work subclasses and futures, the
coalescing calls (_start_coalescing/_end_coalescing), DDP's comm-hook bucket API. torch.load of
anything but tensors (torch 2.6's weights_only default) is avoided altogether (skeleton.py);
gradcomp uses neither torch.cuda.amp nor TypedStorage."""
import inspect
import re
import warnings

import torch
import torch.distributed as dist

from gradcomp import import_hooks

# The torch releases gradcomp is tested against (docs/install.md): Debian 12's 1.13, Debian 13's 2.6
# and pip's 2.13, and so the range between them.
TESTED_TORCH = ((1, 13), (2, 13))


def untested_torch(version):
    """The warning for a torch `version` string outside TESTED_TORCH, or None inside it."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and TESTED_TORCH[0] <= (int(match.group(1)), int(match.group(2))) <= TESTED_TORCH[1]:
        return None
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TORCH
    return (f"gradcomp.torch has been tested with torch {lo_major}.{lo_minor} to {hi_major}.{hi_minor}, not with "
            f"torch {version}: it should work, but c10d's interface for backends changes between releases; "
            "please report what breaks")


def warn_if_untested():
    """Warns, once (at gradcomp.torch's import), when the installed torch is outside TESTED_TORCH."""
    message = untested_torch(torch.__version__)
    if message is not None:
        warnings.warn(message, stacklevel=3)

# torch 2.0 made LRScheduler the base of the schedulers; _LRScheduler stayed as a subclass of it
# that the built-in schedulers no longer derive from.
LRScheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler


def on_gradient_accumulated(p, hook):
    """Calls hook() each time backward has accumulated a gradient into p.grad. Returns the hook's
    handle and what must be kept alive for it to fire (or None). torch 2.1's
    register_post_accumulate_grad_hook where it exists; before it, a hook on the parameter's
    gradient accumulator node, as Horovod does."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda param: hook()), None
    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
    return accumulator.register_hook(lambda *ignored: hook()), accumulator


def register_backend(name, creator, devices):
    """dist.Backend.register_backend, telling torch 2 which devices the backend serves (it warns
    on registration when not told; torch 1.13 has no such argument)."""
    try:
        parameters = inspect.signature(dist.Backend.register_backend).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        parameters = {}
    kwargs = {"devices": devices} if "devices" in parameters else {}
    dist.Backend.register_backend(name, creator, **kwargs)


def _compiler_disable():
    """torch.compiler.disable (2.1+), or torch._dynamo.disable (2.0 has no torch.compiler)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "disable"):
        return compiler.disable
    import torch._dynamo as dynamo
    return dynamo.disable


def run_untraced(owner, names):
    """Makes torch.compile call each of `owner`'s functions `names` (a module's or a class's) as it
    calls a C++ library's: one graph break at the call, instead of tracing into gradcomp's Python
    (locks, handles, pointer checks), which broke every compiled graph several times over and
    recompiled at each call. The functions keep their names, signatures and documentation.

    Done when torch's compiler (torch._dynamo) is first imported, by torch.compile or anything
    else: importing it here would cost every rank of every job over a second. So the owner's
    attributes change then: code that calls them through the owner (hvd.allreduce, the process
    group's methods) gets the untraced ones; a name bound by `from gradcomp.torch import ...`
    before then keeps the plain function."""
    def apply():
        disable = _compiler_disable()
        for name in names:
            setattr(owner, name, disable(getattr(owner, name)))

    if hasattr(torch, "compile"):  # torch 2: it has a compiler
        import_hooks.when_imported("torch._dynamo", apply)


# torch 2.13 renamed the one-tensor collectives (all_gather_single, reduce_scatter_single) and
# warns at each call of the old names, which torch 2.0-2.12 have alone.
all_gather_into_tensor = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)


# torch.sparse_coo_tensor's check_invariants (torch 2; a builtin, so read off its documentation).
_SPARSE_CHECKS = {"check_invariants": True} if "check_invariants" in (torch.sparse_coo_tensor.__doc__ or "") else {}


def sparse_coo_tensor(indices, values, size):
    """torch.sparse_coo_tensor with its invariants checked (torch 2.13 warns at every tensor built
    with the check left implicit; torch 1.13 has no check_invariants)."""
    return torch.sparse_coo_tensor(indices, values, size, **_SPARSE_CHECKS)
