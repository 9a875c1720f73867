"""DiLoCo and Streaming DiLoCo: low-communication training through gradcomp's runtime.

    model = Net()
    inner = torch.optim.AdamW(model.parameters(), lr=4e-4)
    opt = gradcomp.torch.DiLoCo(model, inner, sync_every=50, compression=Compression.maxmin(4, error_feedback=True))
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

Each rank trains alone for `sync_every` inner steps, sending nothing. Then the ranks average
their pseudo-gradients (the weights at the last sync minus the weights now) with one grouped
allreduce through the runtime, compressed per `compression` (or the settings' policy), with
the runtime's error feedback carried from one sync to the next (the exchanges keep their names),
and the outer optimizer (default: Nesterov SGD, lr 0.7, momentum 0.9, DiLoCo's) applies the
average to the weights of the last sync. Every rank reduces bit-identical averages and steps
identical outer optimizers, so after every sync the replicas are bit-identical.

`fragments` > 1 is Streaming DiLoCo: the parameters are split into that many fragments (in
the model's order, of about equal size), and fragment f syncs every `sync_every` steps, the
fragments staggered by `sync_every / fragments` steps, so the link carries one fragment at a
time. With `delay` = d > 0 a fragment's exchange overlaps the next d inner steps (the runtime's
async handle); its result is applied d steps after it was sent, the fragment's working weights
becoming `mixing * local + (1 - mixing) * global` (mixing 0, the default, takes the global
weights: the replicas' fragment is bit-identical after its sync; the paper's alpha).

`workers="node"` makes each node one worker, as DiLoCo's workers usually are multi-GPU nodes:
the ranks of a node average their gradients every inner step (a group of the node's ranks, over
shared memory, exact), so a node's replicas stay bit-identical, and only the outer syncs cross
between nodes (the runtime's hierarchical allreduce reduces within each node first, so the
links between nodes carry one node's pseudo-gradients, not each rank's).

Error feedback's memories (each rank's residuals, in the runtime) are part of the training
state: take_error_memories() (collective; TorchState calls it at every commit) hands them over
as the average they still owe, identical on every rank, kept in state_dict() and added to each
fragment's next pseudo-gradient. A job that goes on from a commit, whatever ranks remain, owes
what the committed job owed.

The outer optimizer works on the model's own parameters (as torchft's DiLoCo): at a sync it is
given the weights of the last sync and the averaged pseudo-gradient as their gradient, so any
torch optimizer built over `model.parameters()` works, its state a function of the syncs only.
"""
import torch

from gradcomp import basics as _b
from gradcomp.torch.compression import Compression, runtime_spec
from gradcomp.torch.functions import allgather_object, broadcast_parameters
from gradcomp.torch.mpi_ops import grouped_allreduce_async_


def _check(sync_every, fragments, delay, mixing, params):
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"DiLoCo: sync_every must be a positive integer, got {sync_every!r}")
    if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= len(params):
        raise ValueError(f"DiLoCo: fragments must be an integer from 1 to the model's {len(params)} trained "
                         f"parameters, got {fragments!r}")
    if sync_every % fragments:
        raise ValueError(f"DiLoCo: sync_every ({sync_every}) must be a multiple of fragments ({fragments}), so that "
                         "every fragment syncs every sync_every steps")
    interval = sync_every // fragments
    if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < interval:
        raise ValueError(f"DiLoCo: delay must be an integer from 0 to sync_every / fragments - 1 ({interval - 1}): "
                         f"a fragment's exchange ends before the next one starts; got {delay!r}")
    if not 0.0 <= float(mixing) <= 1.0:
        raise ValueError(f"DiLoCo: mixing must be in [0, 1], got {mixing!r}")


def node_group(workers, process_set):
    """The process set of this rank's node for workers="node" (None: every rank its own worker,
    or a node of one rank). Collective over the world."""
    if workers not in ("rank", "node"):
        raise ValueError(f"DiLoCo: workers must be 'rank' or 'node', got {workers!r}")
    if workers == "rank":
        return None
    if process_set is not None:
        raise ValueError("DiLoCo: workers='node' needs the world (process_set=None): its nodes are the world's")
    nodes = allgather_object(_b.cross_rank())
    mine = [r for r, node in enumerate(nodes) if node == nodes[_b.rank()]]
    return _b.members_only_process_set(mine) if len(mine) > 1 else None


def split_fragments(params, fragments):
    """`params` in `fragments` consecutive groups of about equal size (in values): each group
    closes once it holds its share of what the groups before it left; none is empty."""
    left = sum(p.numel() for p in params)
    groups, current, size = [], [], 0
    for i, p in enumerate(params):
        current.append(p)
        size += p.numel()
        groups_left = fragments - len(groups)
        if groups_left > 1 and (size * groups_left >= left or len(params) - i - 1 == groups_left - 1):
            groups.append(current)
            left -= size
            current, size = [], 0
    groups.append(current)
    return groups


class DiLoCo:
    """DiLoCo(model, inner_optimizer, sync_every, outer_optimizer=None, compression=None,
    fragments=1, delay=0, mixing=0.0, workers="rank", name="diloco", process_set=None): see
    the module's doc.
    Broadcasts rank 0's parameters at construction, so every replica starts from the same weights."""

    def __init__(self, model, inner_optimizer, sync_every, outer_optimizer=None, compression=None, fragments=1,
                 delay=0, mixing=0.0, workers="rank", name="diloco", process_set=None):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("DiLoCo: the model has no parameter that requires grad")
        _check(sync_every, fragments, delay, mixing, named)
        self.model, self.inner = model, inner_optimizer
        self.sync_every, self.delay, self.mixing = sync_every, delay, float(mixing)
        self.interval = sync_every // fragments
        self.compression, self.name, self.process_set = compression, str(name), process_set
        self.params = [p for _, p in named]
        self.fragments = split_fragments(self.params, fragments)
        self.outer = outer_optimizer if outer_optimizer is not None else \
            torch.optim.SGD(self.params, lr=0.7, momentum=0.9, nesterov=True)
        self.node = node_group(workers, process_set)
        broadcast_parameters(named, root_rank=0, process_set=process_set)
        # The weights of the last sync (the global model), where the outer optimizer steps from.
        self.anchors = [p.detach().clone() for p in self.params]
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.local_step = 0
        self.pending = {}  # fragment -> (step it is applied at, handle, a copy of the deltas being reduced)
        # Per fragment: the error-feedback memories handed over (take_error_memories), or None;
        # the fragments synced since (whose memories are in the runtime).
        self.owed = [None] * len(self.fragments)
        self.in_runtime = set()

    # -- the training loop's calls ---------------------------------------------------------------
    @property
    def param_groups(self):
        """The inner optimizer's (a learning-rate schedule sets the inner steps' rates)."""
        return self.inner.param_groups

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One inner step; then the exchanges due at this step: a fragment's result applied,
        a fragment's pseudo-gradient sent (every `sync_every / fragments` steps)."""
        if self.node is not None:
            self._average_over_the_node()
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.local_step += 1
        for f, (due, _, _) in sorted(self.pending.items()):
            if due == self.local_step:
                self._apply(f)
        if self.local_step % self.interval == 0:
            f = (self.local_step // self.interval - 1) % len(self.fragments)
            self._send(f)
            if self.delay == 0:
                self._apply(f)
        return loss

    def _average_over_the_node(self):
        """The node's ranks average their gradients, exactly (a parameter without a gradient on
        this rank counts as zeros, so every rank of the node submits the same tensors)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        _b.synchronize(grouped_allreduce_async_([p.grad for p in self.params], name=f"{self.name}.node_gradients",
                                                op=_b.Average, process_set=self.node, compression=Compression.none))

    # -- one fragment's exchange -------------------------------------------------------------------
    def _send(self, f):
        if f in self.pending:  # unreachable with delay < interval; a clear error rather than a lost sync
            raise RuntimeError(f"DiLoCo: fragment {f}'s previous exchange has not been applied")
        deltas = [self.anchors[self.index[id(p)]] - p.detach() for p in self.fragments[f]]
        if self.owed[f] is not None:
            for d, owed in zip(deltas, self.owed[f]):
                d.add_(owed.to(d.dtype))
            self.owed[f] = None
        self.in_runtime.add(f)
        self._submit(f, self.local_step + self.delay, deltas)

    def _submit(self, f, due, deltas):
        """Reduces fragment f's `deltas` in place; a copy, taken before (the runtime writes into
        them as soon as they are submitted), stays for state_dict() while they are."""
        sent = [d.clone() for d in deltas] if self.delay else None
        handle = grouped_allreduce_async_(deltas, name=self._exchange(f), op=_b.Average,
                                          process_set=self.process_set, compression=self.compression)
        self.pending[f] = (due, handle, sent)

    def _exchange(self, f):
        return f"{self.name}.fragment{f}"

    def _apply(self, f):
        _, handle, _ = self.pending.pop(f)
        averaged = _b.synchronize(handle)
        params = self.fragments[f]
        saved = {id(p): p.grad for p in self.params}
        local = [p.detach().clone() for p in params] if self.mixing else None
        with torch.no_grad():
            for p in self.params:
                p.grad = None
            for p, delta in zip(params, averaged):
                p.copy_(self.anchors[self.index[id(p)]])
                p.grad = delta.to(p.dtype)
        self.outer.step()  # parameters without a gradient (the other fragments') stay as they are
        with torch.no_grad():
            for i, p in enumerate(params):
                self.anchors[self.index[id(p)]].copy_(p)
                if local is not None:
                    p.mul_(1.0 - self.mixing).add_(local[i], alpha=self.mixing)
            for p in self.params:
                p.grad = saved[id(p)]

    # -- error feedback's memories ------------------------------------------------------------------
    def take_error_memories(self):
        """Every rank at once: the runtime's error-feedback memories of each fragment's syncs
        (each rank's residuals, of its own compression and of the chunks it reduced) are sent
        once, exactly, as the average they owe (an allreduce of zeros with the exact codec and
        error feedback), and kept here, the same on every rank, for state_dict() and the
        fragment's next sync; the runtime's memories are then zero. A fragment whose exchange is
        in flight keeps its memories in the runtime. Nothing to do (no allreduce) without error
        feedback or for a fragment not synced since."""
        taken = sorted(self.in_runtime - set(self.pending)) if self._feedback() else []
        for f in taken:
            params = self.fragments[f]
            self.in_runtime.discard(f)
            zeros = [torch.zeros_like(p, dtype=torch.float32) for p in params]
            handed = _b.synchronize(grouped_allreduce_async_(
                zeros, name=self._exchange(f), op=_b.Average, process_set=self.process_set,
                compression={"codec": "none", "error_feedback": True}))
            if self.owed[f] is not None:
                handed = [h.add_(o) for h, o in zip(handed, self.owed[f])]
            self.owed[f] = handed

    def _feedback(self):
        """Whether this DiLoCo's syncs keep error-feedback memories."""
        spec = runtime_spec(self.compression)
        if spec is None:
            spec, _ = _b.runtime(self.process_set).default_compression()
        return bool(spec.get("error_feedback"))

    def _forget_error_memories(self):
        names = [f"{self._exchange(f)}.{i}" for f, params in enumerate(self.fragments) for i in range(len(params))]
        _b.runtime(self.process_set).forget_compression_state(names)
        self.in_runtime.clear()

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self):
        """The inner and outer optimizers' states, the weights of the last sync, the step count
        the pseudo-gradients of exchanges in flight (load_state_dict sends them again) and the
        error-feedback memories handed over by take_error_memories(). As
        torch optimizers' state_dict(), the optimizers' tensors are references: deepcopy or
        torch.save it to keep it while training goes on."""
        pending = [{"fragment": f, "due": due, "deltas": [d.clone() for d in sent]}
                   for f, (due, _, sent) in sorted(self.pending.items())]
        return {"inner": self.inner.state_dict(), "outer": self.outer.state_dict(), "local_step": self.local_step,
                "anchors": [a.clone() for a in self.anchors], "pending": pending,
                "owed": [None if o is None else [t.clone() for t in o] for o in self.owed]}

    def load_state_dict(self, state, from_last_sync=False):
        """Every rank at once. By default the training goes on exactly where `state` was taken
        (exchanges in flight are sent again, collectively). `from_last_sync=True` (what an
        elastic restore does: hvd.elastic.TorchState) goes on from each fragment's last outer
        sync instead: the model's weights become the weights of the last sync on every rank,
        exchanges in flight are dropped (their fragments sync again at their next turn), so
        the replicas restart bit-identical whichever rank's commit was loaded. The runtime's
        error-feedback memories of this DiLoCo are dropped: the state's handed-over memories
        take their place."""
        if len(state["anchors"]) != len(self.anchors):
            raise ValueError(f"DiLoCo.load_state_dict: the state has {len(state['anchors'])} parameters, the model "
                             f"{len(self.anchors)}")
        self._drop_pending(from_last_sync)
        self.inner.load_state_dict(state["inner"])
        self.outer.load_state_dict(state["outer"])
        self.local_step = int(state["local_step"])
        self._forget_error_memories()
        owed = state.get("owed") or [None] * len(self.fragments)
        self.owed = [None if o is None else [t.clone() for t in o] for o in owed]
        with torch.no_grad():
            for a, saved in zip(self.anchors, state["anchors"]):
                a.copy_(saved)
            if from_last_sync:
                for p, a in zip(self.params, self.anchors):
                    p.copy_(a)
                return
        for entry in state["pending"]:
            self._submit(int(entry["fragment"]), int(entry["due"]), [d.clone() for d in entry["deltas"]])

    def _drop_pending(self, allowed):
        """Waits for this instance's exchanges in flight and drops their results (every rank
        submitted them); refused unless `allowed`."""
        if self.pending and not allowed:
            raise RuntimeError("DiLoCo.load_state_dict: exchanges of this instance are in flight; load into a "
                               "fresh DiLoCo, after its step applied them, or with from_last_sync=True")
        for _, handle, _ in self.pending.values():
            _b.synchronize(handle)
        self.pending.clear()
