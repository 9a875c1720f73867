"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer (gradcomp.torch.optimizer)."""
import contextlib
import warnings
import weakref

import torch

from gradcomp import basics as _b
from gradcomp.basics import synchronize
from gradcomp.torch.averaging_optimizer import _ZERO_GRAD_RACE, _DistributedOptimizer, _check_process_set
from gradcomp.torch.gradient_exchange import _TOO_MANY_PASSES, _remove_hooks
from gradcomp.torch.parameter_plans import _names_of
from gradcomp.torch.mpi_ops import adasum_form, allreduce_async_


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """op=Adasum: Horovod's delta optimizer. When a parameter's gradient is ready (after
    backward_passes_per_step passes) the wrapped optimizer steps on that parameter alone, and
    the change it made (the delta) is combined across ranks with Adasum while backward goes on;
    step() sets each parameter to its value before the local step plus the combined delta. So
    Adasum adapts the optimizer's updates, not the raw gradients (the Adasum paper's form for
    Adam and LAMB as well as SGD), and each rank's optimizer state follows its own gradients."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, process_set):
        super(self.__class__, self).__init__(params)
        self.process_set, self._included = _check_process_set(process_set)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._name_of = _names_of(named_parameters, all_params)
        self._parameter_names = {p: self._name_of[id(p)] for p in all_params}
        self._compression = compression
        if compression is None and self._included:
            settings_spec, _ = _b.runtime(self.process_set).default_compression()
            if settings_spec.get("codec", "none") != "none":
                warnings.warn(f"DistributedOptimizer(op=Adasum): the settings' compression ({settings_spec['codec']}, "
                              "GRADCOMP_COMPRESSION) does not apply: Adasum combines exact values (pass "
                              "compression=Compression.fp16 to halve them)")
        self._requires_update = [p for p in all_params if p.requires_grad]
        for p in self._requires_update:  # a bad dtype or compression fails here, not in backward
            adasum_form(p.dtype, compression, f"DistributedOptimizer(op=Adasum): parameter '{self._name_of[id(p)]}'")
        self._allreduce_delay = {p: backward_passes_per_step for p in all_params}
        self._handles = {}  # param -> handle of its delta's Adasum (None while accumulating)
        self._starts = {}  # param -> its value before this step's local update
        self._grad_accs = []
        self._hook_handles = []  # as _DistributedOptimizer's: they go with the optimizer
        weakref.finalize(self, _remove_hooks, self._hook_handles)
        self._refuse_clashes()
        if self._included:
            self._register_hooks()

    _only = _DistributedOptimizer._only
    _refuse_clashes = _DistributedOptimizer._refuse_clashes
    _register_hooks = _DistributedOptimizer._register_hooks
    _make_hook = _DistributedOptimizer._make_hook

    def _gradient_ready(self, p):
        if self._handles.get(p) is not None and self._allreduce_delay[p] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            self._start(p)
        else:
            self._handles[p] = None

    def _start(self, p):
        """Steps the wrapped optimizer on p alone and starts the Adasum of the change (p holds
        it until step())."""
        start = self._starts.get(p)
        if start is None:
            start = self._starts[p] = torch.empty_like(p.data)
        start.copy_(p.data)
        with self._only([p]):
            super(self.__class__, self).step()
        p.data.sub_(start)
        self._handles[p] = allreduce_async_(p.data, name=self._name_of[id(p)], op=_b.Adasum,
                                            compression=self._compression, process_set=self.process_set)

    def synchronize(self):
        """Nothing to do: step() waits for the deltas (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover (a generator, for contextmanager)

    def step(self, closure=None):
        if not self._included:  # outside the process set: a local optimizer
            return super(self.__class__, self).step(closure)
        loss = closure() if closure is not None else None
        # Parameters whose gradient did not come through a hook this step (no backward, or
        # step() before backward_passes_per_step passes) are updated and combined now.
        for p in self._requires_update:
            if self._handles.get(p) is None:
                self._start(p)
        handles, self._handles = self._handles, {}
        for p, handle in handles.items():
            synchronize(handle)
            p.data.add_(self._starts[p])
            self._allreduce_delay[p] = self.backward_passes_per_step
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(_ZERO_GRAD_RACE)
        return super(self.__class__, self).zero_grad(*args, **kwargs)
