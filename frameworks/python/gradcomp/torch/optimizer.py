"""DistributedOptimizer: Horovod's optimizer wrapper, with gradcomp's compression.

Hooks on the parameters' gradient accumulators start each gradient's allreduce as soon as
backward produces it (after `backward_passes_per_step` local passes), so communication
overlaps the rest of backward; ``step()`` waits for them (``synchronize()``) and then runs
the wrapped optimizer. For torch.optim's per-parameter optimizers (SGD, Adam, AdamW, RMSprop,
...; not a subclass of them) stepped without a closure and without step hooks, ``step()``
steps each batch of parameters as soon as their exchanges have ended, in the order they were
started, so the update of the other layers runs while the first layers' gradients (backward's
last) are still on the wire: the same arithmetic on the same gradients as one step after all
(exchange_order_step.py).

Compression per parameter
    ``compression=None`` (default) follows the settings (GRADCOMP_COMPRESSION, ...; as
    ``gcrun --compression``) with the layer filter. A ``Compression`` choice applies to every
    parameter that passes the layer filter (at least GRADCOMP_MIN_SIZE elements and two
    dimensions; the others go uncompressed). A dict {name: Compression} or a callable
    (name, parameter) -> Compression gives each parameter its own choice, used as given
    (None: the settings' policy).

DGC and the wrapped optimizer's momentum
    DGC's momentum correction must accumulate momentum *before* sparsification, on each rank.
    With ``Compression.topk(ratio)`` (momentum=None) and an optimizer whose param groups have
    ``momentum`` (torch.optim.SGD), gradcomp takes over momentum, Nesterov and weight decay
    of every group holding a top-k parameter: the group's own are set to 0; weight decay is
    added to the local gradient; top-k parameters get the runtime's DGC momentum correction
    and momentum-factor masking; the group's other parameters (filtered out: biases, norms)
    get the same momentum locally before their dense allreduce, which is exactly SGD's momentum
    on the averaged gradient (the allreduce is linear). ``Compression.topk(ratio,
    momentum=0.9)`` sets DGC momentum explicitly; the optimizer must then have none.

PowerSGD
    ``Compression.powersgd(rank, ...)`` compresses each matrix-shaped gradient in two
    allreduces per step (P in the hook, Q at synchronize), with error feedback and warm start;
    the other gradients are allreduced uncompressed.

Overlap with the next forward (``overlap_forward=model``)
    Backward produces the first layers' gradients last, and the next forward needs those
    layers first. With ``overlap_forward``, ``step()`` returns at once: each module's parameters
    are updated (their exchange waited for, the wrapped optimizer stepped on them alone, with
    the hyperparameters of that step() call) when the next forward reaches the module, so the
    exchange of the later layers' gradients runs behind the first layers' forward. Gradients
    carry their module's place in the forward as their priority, and gradients larger than
    GRADCOMP_SCHEDULING_CREDIT_MB are reduced in as many row slices, so a first layer's gradient
    overtakes the rest of a large one still on the wire (ByteScheduler's scheduling, on
    gradcomp's negotiation: core/controller.h). Parameters the forward does not reach are updated
    at its end (the model's forward hook), and before ``model.state_dict()``,
    ``optimizer.state_dict()`` or ``synchronize()`` returns. ``zero_grad()`` clears a
    parameter's gradient once its update is applied. The results are those of the plain mode
    (the same reductions, the same optimizer arithmetic). Not with ``groups``, PowerSGD or
    ``step(closure)``; a forward must go through ``model`` (a gradient that arrives before its
    parameter's previous update was applied is an error).

Adasum (``op=hvd.Adasum``)
    Horovod's delta optimizer: each rank's wrapped optimizer steps on its own gradients, and
    the updates are combined with Adasum (ops/collectives/adasum.h), exact or cast by
    ``Compression.fp16``/``bf16``; the settings' compression does not apply to them.
"""
import warnings

from gradcomp import basics as _b
from gradcomp.basics import Average
from gradcomp.torch.adasum_optimizer import _DistributedAdasumOptimizer
from gradcomp.torch.averaging_optimizer import averaging_class


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None, overlap_forward=None):
    """Wraps `optimizer` so that step() applies gradients averaged (op) over all ranks.

    See the module documentation for compression, DGC momentum handling, PowerSGD and
    `overlap_forward` (a model: each module's update waits for the next forward to reach it).
    Sparse gradients (embeddings with sparse=True) are allgathered as indices and values, or,
    with `sparse_as_dense`, reduced dense and handed back sparse. With `process_set` the
    gradients are averaged over that set's ranks; on the other ranks the optimizer is local
    (as Horovod's). ``op=Adasum`` combines each parameter's local update with Adasum instead
    (Horovod's delta optimizer: _DistributedAdasumOptimizer). The arguments are Horovod's, in
    Horovod's order (``num_groups``, deprecated there, is ``groups``), then gradcomp's own."""
    if not _b.is_initialized():
        raise ValueError("gradcomp has not been initialized; call gradcomp.torch.init() before DistributedOptimizer")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` (as in Horovod)", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if op == _b.Adasum:
        for arg, value, default in (("groups", groups, None), ("overlap_forward", overlap_forward, None),
                                    ("gradient_predivide_factor", gradient_predivide_factor, 1.0)):
            if value != default:
                raise ValueError(f"DistributedOptimizer: {arg} is not supported with op=Adasum (it combines each "
                                 "parameter's update on its own)")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls([dict(g) for g in optimizer.param_groups], named_parameters, compression, backward_passes_per_step,
                   process_set)
    cls = averaging_class(optimizer.__class__)
    return cls([dict(g) for g in optimizer.param_groups], named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, overlap_forward, process_set)
