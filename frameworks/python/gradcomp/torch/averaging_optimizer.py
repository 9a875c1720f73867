"""The averaging DistributedOptimizer (gradcomp.torch.optimizer documents what it does): the
gradient hooks, each parameter's compression plan, DGC's momentum takeover, PowerSGD, sparse
gradients, and the updates deferred to the next forward (overlap_forward)."""
import contextlib
import gc
import math
import warnings
import weakref

import torch

from gradcomp import basics as _b
from gradcomp.basics import Average, check_op, synchronize
from gradcomp.torch import auto_defaults, compat
from gradcomp.torch.compression import Compression, Compressor, PowerSGD, TopK, called, runtime_spec
from gradcomp.torch.mpi_ops import (allreduce_async_, compressed_form, grouped_allreduce_async_, host_allreduce_async_,
                                    sparse_allreduce_async)
from gradcomp.torch.powersgd import PowerSGDState

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


class _Once:
    """A handle that several gradients share (a grouped allreduce): waited on once."""

    __slots__ = ("handle", "done")

    def __init__(self, handle):
        self.handle = handle
        self.done = False

    def wait(self):
        if not self.done:
            synchronize(self.handle)
            self.done = True


class _Pending:
    """A gradient whose exchange has started: `once` completes it (None: nothing to wait for
    here, as for PowerSGD, finished separately) and then `sent` holds the reduced gradient
    (None: nothing to copy into .grad), or `result()` returns the new gradient (sparse ones)."""

    __slots__ = ("once", "sent", "result")

    def __init__(self, once, sent, result=None):
        self.once = once
        self.sent = sent
        self.result = result

    def wait(self):
        if self.once is not None:
            self.once.wait()


def _settings_of(group):
    """A param group's hyperparameters (everything but its parameters)."""
    return {k: v for k, v in group.items() if k != "params"}


# id(parameter) -> (weak reference to it, weak set of the DistributedOptimizers whose hooks
# reduce its gradient); by id, since tensors compare elementwise; an entry goes with its parameter
_OWNERS = {}


def _owners(p):
    entry = _OWNERS.get(id(p))
    return list(entry[1]) if entry is not None and entry[0]() is p else []


def _add_owner(p, opt):
    key = id(p)
    entry = _OWNERS.get(key)
    if entry is None or entry[0]() is not p:
        entry = (weakref.ref(p, lambda _: _OWNERS.pop(key, None)), weakref.WeakSet())
        _OWNERS[key] = entry
    entry[1].add(opt)


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


_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")
_ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                   "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


def _remove_hooks(handles):
    for h in handles:
        h.remove()
    handles.clear()


class _DistributedOptimizer(torch.optim.Optimizer):
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

    # -- construction helpers ------------------------------------------------------------------

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

    def _refuse_clashes(self):
        """Refuses a parameter whose gradient a live DistributedOptimizer already reduces under
        the same name: both hooks would submit it, and the second would fail at the first
        backward. An optimizer that is gone but not yet collected (a reference cycle) is
        collected first."""
        def clashes():
            return [p for p in self._requires_update
                    if any(o._name_of.get(id(p)) == self._name_of[id(p)] for o in _owners(p))]

        clash = clashes()
        if clash:
            gc.collect()
            clash = clashes()
        if clash:
            names = ", ".join(f"'{n}'" for n in sorted(self._name_of[id(p)] for p in clash)[:5])
            raise ValueError(f"DistributedOptimizer: parameter(s) {names} are already reduced, under the same "
                             f"name(s), by another DistributedOptimizer that still exists; drop every reference "
                             "to it (an LR scheduler holds its optimizer) before wrapping the parameters again, "
                             "or pass named_parameters with other names")

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    handle, keep = compat.on_gradient_accumulated(p, self._make_hook(p))
                    self._hook_handles.append(handle)
                    if keep is not None:
                        self._grad_accs.append(keep)
                    _add_owner(p, self)

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

    # -- communication ---------------------------------------------------------------------------

    def _make_hook(self, p):
        me = weakref.ref(self)

        def hook():
            opt = me()
            if opt is not None:
                opt._gradient_ready(p)

        return hook

    def _gradient_ready(self, p):
        """Backward has produced p's gradient (one more local pass)."""
        if p in self._deferred:
            raise AssertionError(f"overlap_forward: parameter '{self._name_of[id(p)]}' got a gradient before the "
                                 "update of the previous step() was applied; run the forward through the module "
                                 "given as overlap_forward (or call optimizer.synchronize() before it)")
        if p in self._handles and self._handles[p] is not None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
        assert not p.grad.requires_grad
        assert self._allreduce_delay[p] > 0
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            self._start(p)
        else:
            self._handles[p] = None

    def _to_send(self, p, plan):
        """The tensor to reduce for p: its gradient, or (DGC take-over) the locally
        weight-decayed and, for dense parameters, momentum-accumulated gradient."""
        if plan.weight_decay == 0.0 and plan.local_momentum == 0.0:
            return p.grad
        g = p.grad.detach()
        if plan.weight_decay:
            g = g.add(p.detach(), alpha=plan.weight_decay)
        if plan.local_momentum:
            buf = self._momentum.get(p)
            if buf is None:
                buf = g.clone()
            else:
                buf = buf.mul(plan.local_momentum).add_(g)
            # A non-finite step (a loss scaler's overflow) is sent, not remembered: the
            # momentum keeps its value from before it, as the runtime's memories do.
            if bool(torch.isfinite(buf).all()):
                self._momentum[p] = buf
            g = g.add(buf, alpha=plan.local_momentum) if plan.nesterov else buf.clone()
        return g.contiguous()

    def _start(self, p):
        """Starts p's communication (or defers it until its group is complete) and records
        it in self._handles[p] as a _Pending."""
        plan = self._plans[p]
        if plan.powersgd and self._powersgd.compresses(p.grad):
            self._powersgd_started[p] = self._powersgd.start(plan.name, plan.index, p.grad)
            self._handles[p] = _Pending(None, None)  # finished with every PowerSGD tensor at once
            return
        if p.grad.is_sparse:
            self._start_sparse(p, plan)
            return
        send = self._to_send(p, plan)
        _, cast = compressed_form(send.dtype, plan.runtime_spec())
        if cast is not None:
            send = send.to(cast)  # float64 under an explicit compression travels as float32
        if p in self._groups:
            gi = self._groups[p]
            self._handles[p] = _Pending(None, None)  # replaced once the group is complete
            ready = self._group_ready.setdefault(gi, {})
            ready[p] = send
            if len(ready) == self._group_sizes[gi]:
                self._start_group(gi)
            return
        priority = self._priority.get(p, 1_000_000 + plan.index) if self._overlap is not None else 0
        names = self._wire_names(p, plan)
        if len(names) == 1 and send.device.type == "cpu" and send.is_contiguous():
            # The common case, without allreduce_async_'s general path: this runs once per
            # gradient on the training thread, inside backward.
            handle = host_allreduce_async_(send, names[0], self._op, self._prescale, self._postscale,
                                           plan.runtime_spec(), priority, self.process_set)
            self._handles[p] = _Pending(_Once(handle), send)
            return
        pieces = [send] if len(names) == 1 else send.tensor_split(len(names))
        handles = [allreduce_async_(piece, name=name, op=self._op, prescale_factor=self._prescale,
                                    postscale_factor=self._postscale, compression=plan.compression, priority=priority,
                                    process_set=self.process_set)
                   for name, piece in zip(names, pieces)]
        handle = handles[0] if len(handles) == 1 else _b.register_group(handles)
        self._handles[p] = _Pending(_Once(handle), send)

    def _start_sparse(self, p, plan):
        """A sparse gradient (an embedding with sparse=True): its indices and values are
        allgathered, as Horovod does; with sparse_as_dense it is reduced dense and handed back
        sparse (so sparse optimizers keep working). Compression does not apply to either."""
        name = f"allreduce.{plan.name}"
        if self._sparse_as_dense:
            dense = p.grad.to_dense()
            handle = allreduce_async_(dense, name=name, op=self._op, prescale_factor=self._prescale,
                                      postscale_factor=self._postscale, compression=Compression.none,
                                      process_set=self.process_set)
            self._handles[p] = _Pending(_Once(handle), None, lambda: dense.to_sparse())
        else:
            self._handles[p] = _Pending(None, None, sparse_allreduce_async(p.grad, name, op=self._op,
                                                                           process_set=self.process_set))

    def _start_group(self, gi):
        """One grouped allreduce per (compression, dtype) among the group's ready gradients."""
        ready = self._group_ready.pop(gi)
        buckets = {}
        for p, send in ready.items():
            plan = self._plans[p]
            key = (repr(plan.compression), send.dtype)
            buckets.setdefault(key, []).append((p, send))
        for items in buckets.values():
            items.sort(key=lambda item: self._plans[item[0]].index)
        for (_, _), items in sorted(buckets.items(), key=lambda kv: self._plans[kv[1][0][0]].index):
            plan = self._plans[items[0][0]]
            handle = grouped_allreduce_async_([s for _, s in items], name=f"allreduce.group{gi}.{plan.name}",
                                              op=self._op, prescale_factor=self._prescale,
                                              postscale_factor=self._postscale, compression=plan.compression,
                                              process_set=self.process_set)
            shared = _Once(handle)
            for p, send in items:
                self._handles[p] = _Pending(shared, send)

    def _complete(self, p, pending):
        """Waits for p's exchange and writes the result into p.grad."""
        pending.wait()
        if pending.result is not None:
            p.grad = pending.result()
        elif pending.sent is not None and pending.sent is not p.grad:
            with torch.no_grad():
                p.grad.copy_(pending.sent)

    def _start_all(self):
        """Starts the exchange of every gradient not started yet (and of incomplete groups)."""
        for p in self._requires_update:
            if p not in self._handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._allreduce_delay[p] = 1
                self._handles[p] = None
        for p in list(self._handles):
            if self._handles[p] is None:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._start(p)
        for gi in list(self._group_ready):
            self._start_group(gi)

    def _take_handles(self):
        """This step's pending exchanges, handed over; the next backward starts afresh."""
        handles, self._handles = self._handles, {}
        for p in handles:
            self._allreduce_delay[p] = self.backward_passes_per_step
        return handles

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
