"""overlap_forward in the averaging DistributedOptimizer (gradcomp.torch.optimizer documents it):
each parameter's update waits for the next forward to reach its module, and large gradients
are reduced in row slices."""
import contextlib
import math
import weakref

import torch

from gradcomp import basics as _b


def _settings_of(group):
    """A param group's hyperparameters (everything but its parameters)."""
    return {k: v for k, v in group.items() if k != "params"}


class _OverlapForward:
    """The optimizer's part that defers updates to the next forward (a base of
    _DistributedOptimizer)."""

    def _setup_overlap(self, module):
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"overlap_forward must be the torch.nn.Module whose forward uses the parameters, got "
                             f"{type(module).__name__}")
        if self._groups:
            raise ValueError("overlap_forward does not combine with groups (a group is reduced as one)")
        if self._powersgd is not None:
            raise ValueError("overlap_forward does not combine with Compression.powersgd (its second allreduce "
                             "needs every gradient at step())")
        owned = set(self._requires_update)
        hooked = set()
        for m in module.modules():
            mine = [p for p in m.parameters(recurse=False) if p in owned and p not in hooked]
            if mine:
                hooked.update(mine)
                self._hook_handles.append(m.register_forward_pre_hook(self._make_pre_hook(mine)))
        missing = [self._name_of[id(p)] for p in self._plans if p in owned and p not in hooked]
        if missing:
            raise ValueError(f"overlap_forward: parameter(s) {', '.join(missing[:5])} of the optimizer are not in the "
                             "module given; its forward must use every parameter the optimizer updates")
        me = weakref.ref(self)

        def apply_all(*_):
            opt = me()
            if opt is not None:
                opt._apply_deferred(list(opt._deferred))

        self._hook_handles.append(module.register_forward_hook(apply_all))
        if hasattr(module, "_register_state_dict_hook"):
            self._hook_handles.append(module._register_state_dict_hook(apply_all))
        part_bytes = _b.runtime().scheduling_credit_mb * 2**20
        for p in owned:
            rows = p.shape[0] if p.dim() >= 2 else 1
            parts = math.ceil(p.numel() * p.element_size() / part_bytes) if part_bytes > 0 else 1
            self._parts[p] = max(1, min(rows, parts))
        self._overlap = module

    def _wire_names(self, p, plan):
        """The names p's gradient is reduced under (one per row slice)."""
        parts = self._parts.get(p, 1)
        if parts == 1:
            return [f"allreduce.{plan.name}"]
        return [f"allreduce.{plan.name}.part{i}" for i in range(parts)]

    def _make_pre_hook(self, params):
        me = weakref.ref(self)

        def pre_hook(module, inputs):
            del module, inputs
            opt = me()
            if opt is not None:
                opt._module_forward(params)

        return pre_hook

    def _module_forward(self, params):
        """A module holding `params` is about to run its forward: their deferred update first."""
        if params[0] not in self._priority:  # the first forward through this module
            self._modules_seen += 1
            for p in params:
                self._priority[p] = self._modules_seen
        waiting = [p for p in params if p in self._deferred]
        if waiting:
            self._apply_deferred(waiting)

    @contextlib.contextmanager
    def _only(self, params, settings=None):
        """The wrapped optimizer sees only `params` (and, given, the param groups' `settings`)."""
        keep = set(params)
        saved = []
        for gi, group in enumerate(self.param_groups):
            saved.append((group["params"], _settings_of(group)))
            group["params"] = [p for p in group["params"] if p in keep]
            if settings is not None:
                group.update(settings[gi])
        try:
            yield
        finally:
            for group, (params_, values) in zip(self.param_groups, saved):
                group["params"] = params_
                group.update(values)

    def _apply_deferred(self, params):
        """Waits for these parameters' exchange and applies their deferred update."""
        if not params:
            return
        for p in params:
            self._complete(p, self._deferred.pop(p))
        with self._only(params, self._deferred_settings):
            super(self.__class__, self).step()
        if self._deferred_zero is not None:
            args, kwargs = self._deferred_zero
            with self._only(params):
                super(self.__class__, self).zero_grad(*args, **kwargs)
        if not self._deferred:
            self._deferred_settings = None
            self._deferred_zero = None
