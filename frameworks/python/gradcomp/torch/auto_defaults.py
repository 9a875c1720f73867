"""Adaptive compression's defaults under DistributedOptimizer, which sees the optimizer.

How far a calm tensor's error budget relaxes (``Compression.auto(relaxed='optimizer')``, the
default; GRADCOMP_AUTO_RELAXED_BITS when not set) depends on the update rule: under SGD 1 bit can
throw training off, 2 bits hold it; an optimizer that normalizes its update per coordinate (Adam
and its kin) holds its loss at 1 bit (docs/benchmarks.md, "Adaptive compression as it comes"). The choice
made is said once in ``auto_summary()``.
"""
import torch

from gradcomp import basics as _b
from gradcomp.torch.compression import Auto

# torch.optim's optimizers whose step divides by a running estimate of each coordinate's scale.
ADAPTIVE = tuple(getattr(torch.optim, n) for n in ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta",
                                                   "RMSprop", "SparseAdam") if hasattr(torch.optim, n))


def is_adaptive(optimizer):
    return isinstance(optimizer, ADAPTIVE)


def resolve(optimizer, plans, settings_spec, min_size):
    """Sets the spec_override of each plan (a parameter -> _Plan map) whose auto compression
    leaves the relaxed bits to the optimizer: its own Compression.auto(), or the settings' auto
    (`settings_spec`, for plans of no choice that pass the layer filter `min_size`) when
    GRADCOMP_AUTO_RELAXED_BITS was not given."""
    adaptive = is_adaptive(optimizer)
    by_settings = settings_spec.get("codec") == "auto" and not _b.relaxed_bits_were_set()
    settings_bits = _b.relaxed_bits_by_optimizer(settings_spec.get("bits", 4), adaptive)
    chosen = set()
    for p, plan in plans.items():
        if plan.spec_override is not None:
            continue
        if isinstance(plan.choice, Auto) and plan.choice.relaxed == _b.BY_OPTIMIZER:
            plan.spec_override = plan.choice.for_optimizer(adaptive)
            chosen.add(plan.spec_override["relaxed_bits"])
        elif plan.choice is None and by_settings and p.dim() > 1 and p.numel() >= min_size:
            if settings_bits != settings_spec.get("relaxed_bits"):
                plan.spec_override = dict(settings_spec, relaxed_bits=settings_bits)
            chosen.add(settings_bits)
    if chosen:
        bits = " or ".join(str(b) for b in sorted(chosen))
        why = ("it normalizes its update per coordinate" if adaptive else
               "under SGD and any optimizer not known to normalize its update, 1 bit can throw training off")
        _b.note_auto_default("optimizer", f"A calm tensor's error budget relaxes to that of {bits} bits (0: it does "
                                          f"not relax) for the optimizer {type(optimizer).__name__}: {why}")
