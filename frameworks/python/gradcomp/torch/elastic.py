"""hvd.elastic for PyTorch: TorchState, ElasticSampler and run, as in horovod.torch.elastic.

How a change of hosts is handled (a relaunch by `gcrun --elastic`, the state from the last
commit) is described in gradcomp/elastic.py.
"""
import copy
import math
import random

import torch

from gradcomp import basics as _b
from gradcomp.elastic import (RESTART_EXIT, HostsUpdatedInterrupt, ObjectState, State, notify_hosts_updated,
                              resets, run_fn)
from gradcomp.torch import compat, skeleton
from gradcomp.torch.diloco import DiLoCo
from gradcomp.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                      broadcast_parameters)


def run(func):
    """Decorator for the training function, whose first argument is the State: syncs the state,
    runs the function, and on a change of hosts stops at the commit for gcrun --elastic to
    relaunch (see gradcomp/elastic.py)."""
    return run_fn(func)


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset over the ranks like DistributedSampler and, kept in a TorchState,
    resumes an epoch where the last commit left it: after a relaunch on another number of
    ranks the samples not yet processed are split over the new ranks.

    Call record_batch(batch_idx, batch_size) after each batch and set_epoch(epoch) at the end
    of each epoch (not the start: a resumed epoch must not start over)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch processed by all ranks together
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        del batch_idx
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state):
        self.epoch, self.processed_num = state["epoch"], state["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas, self.rank = _b.size(), _b.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = self.remaining + self.remaining[:self.total_size - len(self.remaining)]
        return iter(idx[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples


class _Handler:
    """Keeps the committed copy of one object with a state_dict."""

    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


class _ModelHandler(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _DiLoCoHandler(_Handler):
    """A DiLoCo: restored and synced from its last outer sync (DiLoCo.load_state_dict), so a
    relaunched job goes on from the global model, not from one rank's local steps. Give it after
    the model (TorchState(model, optimizer=diloco)): it sets the model's weights. A commit hands
    the runtime's error-feedback memories over into the state (collective, as commits are)."""

    def save(self):
        self.value.take_error_memories()
        super().save()

    def sync(self):
        self.value.take_error_memories()
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0), from_last_sync=True)

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self.saved), from_last_sync=True)


_HANDLERS = [
    (DiLoCo, _DiLoCoHandler),
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (compat.LRScheduler, _Handler),
    (ElasticSampler, _Handler),
]


def _handler(value):
    for kind, cls in _HANDLERS:
        if isinstance(value, kind):
            return cls(value)
    return None


class TorchState(ObjectState):
    """The model, the optimizer and any other attributes (LR schedulers, ElasticSampler, plain
    values such as epoch and batch) that make up the training state. Attributes are read and
    assigned as `state.epoch`; commit() saves them, restore() brings the last commit back."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for k, v in kwargs.items():
            h = _handler(v)
            if h is not None:
                handlers[k] = h
            else:
                plain[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(broadcast_object, _b.rank, allgather_object, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
            handlers[name].save()
        object.__setattr__(self, name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync_from_root(self):
        for h in self._handlers.values():
            h.sync()
        super().sync_from_root()

    def snapshot(self):
        snap = super().snapshot()
        snap["handlers"] = {k: h.saved for k, h in self._handlers.items()}
        return snap

    def load_snapshot(self, snap):
        super().load_snapshot(snap)
        for k, saved in snap["handlers"].items():
            if k in self._handlers:
                self._handlers[k].saved = saved
        # The sampler's split depends on the world: load_state_dict recomputes it.

    commit_leaf = staticmethod(skeleton.is_tensor)
    commit_holds = skeleton.HOLDS

    def dump(self, obj, f):
        skeleton.save(obj, f)

    def load(self, f):
        return skeleton.load(f)


__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "RESTART_EXIT", "State", "TorchState",
           "notify_hosts_updated", "resets", "run"]
