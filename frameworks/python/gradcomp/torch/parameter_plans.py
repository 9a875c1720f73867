"""Each parameter's compression plan in the averaging DistributedOptimizer: its name, the
compression chosen for it (one choice, a dict by name or a callable; the layer filter), DGC's
takeover of the param group's momentum, and Horovod's `groups`."""
import torch

from gradcomp import basics as _b
from gradcomp.torch import auto_defaults
from gradcomp.torch.compression import Compression, Compressor, PowerSGD, TopK, called, runtime_spec

_NAMED_PARAMETERS_ERROR = ("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                           "by model.named_parameters()")


class _Plan:
    """How one parameter's gradient is communicated."""

    def __init__(self, name, index, choice, spec_override=None):
        self.name = name
        self.index = index
        self.choice = choice  # None (settings' policy) or a Compressor
        self.spec_override = spec_override  # a runtime spec dict replacing choice.spec (DGC momentum)
        self.powersgd = isinstance(choice, PowerSGD)
        self.weight_decay = 0.0  # added locally when gradcomp took over the group's momentum
        self.local_momentum = 0.0  # dense parameters of such a group
        self.nesterov = False

    @property
    def compression(self):
        if self.powersgd:
            return Compression.none
        return self.spec_override if self.spec_override is not None else self.choice

    def runtime_spec(self):
        """runtime_spec(self.compression), computed once (the plan is fixed once made)."""
        if not hasattr(self, "_spec"):
            self._spec = runtime_spec(self.compression)
        return self._spec


def _names_of(named_parameters, all_params):
    """id(parameter) -> the name its tensor is reduced under (Horovod's checks and messages)."""
    if named_parameters is None:
        return {id(p): f"noname.{i}" for i, p in enumerate(all_params)}
    named_parameters = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in named_parameters):
        raise ValueError(_NAMED_PARAMETERS_ERROR)
    names = [n for n, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}")
    name_of = {id(p): n for n, p in named_parameters}
    unnamed = [id(p) for p in all_params if id(p) not in name_of]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(map(str, unnamed))}")
    return name_of


class _ParameterPlans:
    """The optimizer's part that decides how each gradient is communicated (a base of
    _DistributedOptimizer)."""

    def _make_groups(self, groups, all_params):
        """param -> group index, for grouped allreduce (Horovod's `groups`)."""
        if groups is None:
            return {}
        if isinstance(groups, int):
            if groups <= 0:
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
            n = len(all_params)
            per = (n + groups - 1) // groups
            return {p: i // per for i, p in enumerate(all_params)}
        if isinstance(groups, list) and all(isinstance(g, list) for g in groups):
            out = {}
            for gi, g in enumerate(groups):
                for p in g:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
                    out[p] = gi
            return out
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")

    def _choice_for(self, compression, name, p, min_size):
        if compression is None:
            return None
        compression = called(compression)
        if isinstance(compression, Compressor):
            if p.dim() <= 1 or p.numel() < min_size:  # the layer filter
                return Compression.none
            return compression
        if isinstance(compression, dict):
            choice = compression.get(name)
        elif callable(compression):
            choice = compression(name, p)
        else:
            raise ValueError(f"compression must be None, a Compression choice, a dict by parameter name or a "
                             f"callable (name, parameter) -> Compression; got {compression!r}")
        if choice is not None and not isinstance(choice, Compressor):
            raise ValueError(f"compression for parameter '{name}' must be a Compression choice, got {choice!r}")
        return choice

    def _make_plans(self, compression, all_params):
        settings_spec, min_size = _b.runtime().default_compression()
        plans = {}
        for i, p in enumerate(all_params):
            name = self._name_of[id(p)]
            plans[p] = _Plan(name, i, self._choice_for(compression, name, p, min_size))
        for group in self.param_groups:
            self._take_over_momentum(group, [plans[p] for p in group["params"]])
        auto_defaults.resolve(self, plans, settings_spec, min_size)
        return plans

    def _take_over_momentum(self, group, plans):
        """DGC: move the group's momentum, Nesterov and weight decay into gradcomp (see module doc)."""
        dgc = [pl for pl in plans if isinstance(pl.choice, TopK)]
        if not dgc:
            return
        momentum = group.get("momentum", 0.0) or 0.0
        if momentum == 0.0:
            for pl in dgc:
                if pl.choice.momentum:
                    pl.spec_override = pl.choice.spec
            return
        explicit = [pl.name for pl in dgc if pl.choice.momentum]
        if explicit:
            raise ValueError(f"Compression.topk sets DGC momentum for {', '.join(explicit)}, but the optimizer has "
                             f"momentum={momentum} too; keep one (Compression.topk(momentum=None) takes the "
                             "optimizer's)")
        if group.get("dampening", 0.0):
            raise ValueError("DGC momentum correction needs dampening=0 in the wrapped optimizer")
        nesterov = bool(group.get("nesterov", False))
        wd = group.get("weight_decay", 0.0) or 0.0
        for pl in plans:
            pl.weight_decay = wd
            pl.nesterov = nesterov
            if isinstance(pl.choice, TopK):
                pl.spec_override = pl.choice.with_momentum(momentum, nesterov)
            elif pl.powersgd:
                raise ValueError(f"parameter '{pl.name}': PowerSGD and DGC cannot share a param group with momentum")
            else:
                pl.local_momentum = momentum
        group["momentum"] = 0.0
        group["nesterov"] = False
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
