"""The averaging DistributedOptimizer (gradcomp.torch.optimizer documents what it does), made of
four parts, each a base class in a file of its own: each parameter's compression plan, DGC's
momentum takeover and `groups` (parameter_plans.py); the gradient hooks and the exchange, dense,
sparse, grouped and PowerSGD's (gradient_exchange.py); the updates deferred to the next forward
(overlap_forward.py); step()'s updates applied as the exchanges end (exchange_order_step.py).
Here: the constructor, synchronize() and step()."""
import contextlib
import warnings
import weakref

import torch

from gradcomp import basics as _b
from gradcomp.basics import Average, check_op
from gradcomp.torch.exchange_order_step import _ExchangeOrderStep
from gradcomp.torch.gradient_exchange import _GradientExchange, _remove_hooks
from gradcomp.torch.overlap_forward import _OverlapForward, _settings_of
from gradcomp.torch.parameter_plans import _names_of, _ParameterPlans
from gradcomp.torch.powersgd import PowerSGDState

_PARTS = (_ParameterPlans, _OverlapForward, _ExchangeOrderStep, _GradientExchange)


def _check_process_set(process_set):
    """(the optimizer's ProcessSet, whether this rank belongs to it). As Horovod's: on a rank
    outside the set the optimizer is local."""
    ps = _b.global_process_set if process_set is None else process_set
    if not isinstance(ps, _b.ProcessSet):
        raise ValueError(f"DistributedOptimizer: process_set must be a ProcessSet, got {process_set!r}")
    included = ps is _b.global_process_set or bool(ps.included())
    if included:
        _b.runtime(ps)  # a ProcessSet that is registered, or a clear error
    elif ps.included() is None:
        raise ValueError(f"DistributedOptimizer: {ps!r} is not registered: add it with add_process_set (on every rank)")
    return ps, included


_ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                   "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class _DistributedOptimizer(*_PARTS, torch.optim.Optimizer):
    """What DistributedOptimizer makes of the optimizer it wraps: averaging_class(its class)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, overlap_forward=None, process_set=None):
        super(self.__class__, self).__init__(params)
        self.process_set, self._included = _check_process_set(process_set)
        self._sparse_as_dense = bool(sparse_as_dense)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        op = check_op(op)
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self._op = op
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = gradient_predivide_factor
        self.backward_passes_per_step = backward_passes_per_step

        all_params = [p for g in self.param_groups for p in g["params"]]
        self._name_of = name_of = _names_of(named_parameters, all_params)
        # Horovod's attribute: parameter -> the name its gradient is reduced under.
        self._parameter_names = {p: name_of[id(p)] for p in all_params}

        self._groups = self._make_groups(groups, all_params)
        self._plans = self._make_plans(compression, all_params)
        self._powersgd = None
        configs = {id(pl.choice): pl.choice for pl in self._plans.values() if pl.powersgd}
        if len(configs) > 1:
            raise ValueError("DistributedOptimizer supports one Compression.powersgd configuration per optimizer")
        if configs:
            self._powersgd = PowerSGDState(next(iter(configs.values())), process_set)

        self._handles = {}  # param -> handle id (or None while accumulating)
        self._powersgd_started = {}  # param -> PowerSGD phase-1 context
        self._group_ready = {}  # group index -> params ready this step
        self._momentum = {}  # param -> local momentum buffer
        self._allreduce_delay = {p: backward_passes_per_step for p in all_params}
        self._requires_update = {p for p in all_params if p.requires_grad}
        self._group_sizes = {}  # group index -> parameters that get a gradient
        for p, gi in self._groups.items():
            if p in self._requires_update:
                self._group_sizes[gi] = self._group_sizes.get(gi, 0) + 1
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accs = []
        # Every hook this optimizer put on the gradient accumulators and the modules. The hooks
        # hold the optimizer weakly and go when it does: wrapping a model's parameters again
        # (a new optimizer, a new trial in the same process) does not leave the old hooks
        # reducing each gradient a second time (Horovod's hooks stay: horovod#2017).
        self._hook_handles = []
        weakref.finalize(self, _remove_hooks, self._hook_handles)
        # overlap_forward (module doc): updates deferred to the next forward.
        self._overlap = None
        self._deferred = {}  # param -> _Pending of a step() whose update is not applied yet
        self._deferred_settings = None  # the param groups' settings at that step()
        self._deferred_zero = None  # zero_grad's arguments, for parameters updated after it
        self._priority = {}  # param -> its module's place in the forward, from 1
        self._modules_seen = 0
        self._parts = {}  # param -> row slices its gradient is reduced in
        self._refuse_clashes()
        if overlap_forward is not None and self._included:
            self._setup_overlap(overlap_forward)
        # Residuals and DGC momentum are kept by tensor name: a new optimizer starts fresh.
        if self._included:
            _b.runtime(self.process_set).forget_compression_state(
                [n for p, pl in self._plans.items() for n in self._wire_names(p, pl)])
            self._register_hooks()

    def synchronize(self):
        """Waits for every gradient's allreduce and writes the results into .grad (with
        overlap_forward, first applies a previous step()'s updates still deferred)."""
        if not self._included:
            self._synchronized = True  # outside the optimizer's process set: nothing to exchange
            return
        self._apply_deferred(list(self._deferred))
        self._start_all()
        for p, pending in self._handles.items():
            self._complete(p, pending)
        if self._powersgd_started:
            started = sorted(self._powersgd_started.items(), key=lambda kv: self._plans[kv[0]].index)
            approxes = self._powersgd.finish([c for _, c in started])
            for (p, _), approx in zip(started, approxes):
                with torch.no_grad():
                    p.grad.copy_(approx.view_as(p.grad))
        if self._powersgd is not None:
            self._powersgd.step += 1
        self._take_handles()
        self._powersgd_started.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize (use after an explicit synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._overlap is not None and self._should_synchronize:
            if closure is not None:
                raise ValueError("overlap_forward: step(closure) is not supported (the closure needs the updated "
                                 "parameters at once); call synchronize() and step() inside skip_synchronize()")
            self._apply_deferred(list(self._deferred))  # no forward since the last step()
            self._start_all()
            self._deferred = self._take_handles()
            self._deferred_settings = [_settings_of(g) for g in self.param_groups]
            self._synchronized = False
            return None
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.")
            if closure is None and self._steps_in_exchange_order(self._wrapped_class):
                self._step_in_exchange_order()
                self._synchronized = False
                return None
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _gradcomp_wrapped_step(self):
        """The wrapped optimizer's own step (no communication)."""
        return super(self.__class__, self).step()

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(_ZERO_GRAD_RACE)
        if self._deferred:
            # The deferred parameters' .grad holds (or receives) their reduced gradient: cleared
            # once their update is applied.
            self._deferred_zero = (args, kwargs)
            with self._only([p for g in self.param_groups for p in g["params"] if p not in self._deferred]):
                return super(self.__class__, self).zero_grad(*args, **kwargs)
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        self._apply_deferred(list(self._deferred))
        return super(self.__class__, self).state_dict(*args, **kwargs)


def averaging_class(optimizer_class):
    """The class of a DistributedOptimizer wrapping an optimizer of `optimizer_class` (as
    Horovod's: a subclass of it by the same name, so isinstance checks hold), with the methods of
    _DistributedOptimizer and of its parts; `super(self.__class__, self)` in them is the wrapped
    optimizer's class (the parts define none of its methods)."""
    return type(optimizer_class.__name__, _PARTS + (optimizer_class,),
                dict(_DistributedOptimizer.__dict__, _wrapped_class=optimizer_class))
