"""step() in the averaging DistributedOptimizer, applied as the exchanges end: the wrapped
optimizer steps on each batch of parameters whose gradients have arrived, while the later ones
are still on the wire, instead of once after the last. Backward produces the first layers'
gradients last, so their exchange is what a step waits for after backward; the update of every
other layer now runs behind it (on the 25.2M-parameter MLP of step_bench.py, SGD's update of its
4096 x 4096 layer, ~17 ms of a core, runs while the first layer's gradient is on the wire).

Only where stepping part of the parameters at a time is the same arithmetic as stepping all at
once: torch.optim's optimizers whose update of a parameter reads that parameter's gradient and
state alone, no closure, no step hooks (which would run once per batch), no PowerSGD (its second
allreduce needs every gradient first). Elsewhere step() waits for every exchange, then steps."""
import torch.optim.optimizer as _optim

from gradcomp.basics import poll
from gradcomp.torch.overlap_forward import _settings_of

# torch.optim's optimizers whose update of a parameter depends on that parameter alone.
_SEPARABLE = {"SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD",
              "Rprop", "Adafactor", "SparseAdam"}


def _separable(optimizer_class):
    """Whether `optimizer_class` (the class DistributedOptimizer wraps) is one of torch.optim's
    per-parameter optimizers, not a subclass that may add cross-parameter work."""
    return optimizer_class.__module__.startswith("torch.optim") and optimizer_class.__name__ in _SEPARABLE


def _no_step_hooks(optimizer):
    """No step hook registered on `optimizer` or globally (torch 2 has them; 1.13 none)."""
    return not (getattr(optimizer, "_optimizer_step_pre_hooks", None) or
                getattr(optimizer, "_optimizer_step_post_hooks", None) or
                getattr(_optim, "_global_optimizer_pre_hooks", None) or
                getattr(_optim, "_global_optimizer_post_hooks", None))


def _arrived(pending):
    """Whether a gradient's exchange has ended (its wait would not block); never blocks."""
    once = pending.once
    return once is None or once.done or poll(once.handle)


class _ExchangeOrderStep:
    """The optimizer's part that steps parameters as their exchanges end (a base of
    _DistributedOptimizer, beside _OverlapForward, whose deferred updates it reuses)."""

    def _steps_in_exchange_order(self, wrapped_class):
        return (self._included and self._powersgd is None and self._overlap is None and _separable(wrapped_class)
                and _no_step_hooks(self))

    def _step_in_exchange_order(self):
        """Starts the exchanges not started yet and applies each parameter's update once its
        gradient has arrived: waits for the first still on the wire (in the order they were
        started, the order they end), then steps every parameter whose exchange has ended."""
        self._start_all()
        self._deferred = self._take_handles()
        self._deferred_settings = [_settings_of(g) for g in self.param_groups]
        try:
            while self._deferred:
                first = next(iter(self._deferred))
                self._deferred[first].wait()
                self._apply_deferred([p for p, pending in self._deferred.items() if _arrived(pending)])
        except BaseException:
            # A failed exchange (a lost peer): the step raises as synchronize() would, and the
            # rest is dropped, so that state_dict() or a restore afterwards does not wait on it.
            self._deferred, self._deferred_settings = {}, None
            raise
