"""The gradient exchange of the averaging DistributedOptimizer: the hooks on the gradient
accumulators, starting each gradient's allreduce when its last backward pass produced it (dense,
sparse, grouped, PowerSGD's first phase), and writing the results into .grad."""
import gc
import weakref

import torch

from gradcomp import basics as _b
from gradcomp.basics import synchronize
from gradcomp.torch import compat
from gradcomp.torch.compression import Compression
from gradcomp.torch.mpi_ops import (allreduce_async_, compressed_form, grouped_allreduce_async_, host_allreduce_async_,
                                    sparse_allreduce_async)

_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")


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


def _remove_hooks(handles):
    for h in handles:
        h.remove()
    handles.clear()


class _GradientExchange:
    """The optimizer's part that exchanges gradients (a base of _DistributedOptimizer)."""

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
