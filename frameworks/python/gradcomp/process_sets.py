"""Process sets (Horovod's hvd.ProcessSet): registering them on every rank, the groups of some
ranks torch.distributed's backend creates, and the runtime a collective of a set runs on.
"""
import zlib

from gradcomp import _core
from gradcomp import world as _world
from gradcomp._runtime_state import state, world_runtime
from gradcomp.topology import rank, size


class ProcessSet:
    """Ranks that run collectives among themselves, as Horovod's ``hvd.ProcessSet``: register it
    on every rank with ``add_process_set`` (or ``init(process_sets=[...])``), then pass
    ``process_set=`` to a collective, called by the set's ranks only. Each set runs a runtime of
    its own over its ranks (negotiation, fusion, compression and the data path, as the global
    one's), so sets work at once and apart. Ranks inside a set are numbered in increasing
    global rank; ``root_rank`` arguments stay global ranks, as in Horovod."""

    def __init__(self, ranks):
        if isinstance(ranks, ProcessSet):
            ranks = ranks.ranks
        try:
            listed = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise ValueError(f"ProcessSet takes a list of ranks, got {ranks!r}") from None
        if any(isinstance(r, bool) or int(r) != r for r in ranks):
            raise ValueError(f"ProcessSet takes a list of integer ranks, got {ranks!r}")
        if len(set(listed)) != len(listed):
            raise ValueError(f"ProcessSet ranks must be distinct, got {listed}")
        self.ranks = sorted(listed)
        self.process_set_id = None
        self._runtime = None  # this rank's runtime for the set; None outside it

    def _registered(self):
        return self.process_set_id is not None and state.process_sets.get(self.process_set_id) is self

    def included(self):
        """Whether this rank belongs to the set (None before it is registered)."""
        return rank() in self.ranks if self._registered() else None

    def rank(self):
        """This rank's place in the set, -1 outside it (None before it is registered)."""
        if not self._registered():
            return None
        return self.ranks.index(rank()) if rank() in self.ranks else -1

    def size(self):
        """The number of ranks in the set (None before it is registered)."""
        return len(self.ranks) if self._registered() else None

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


# Every rank; its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _gather_rows(row, name):
    """Every rank's int64 numpy `row` (of one shape on every rank), one row a rank: through the
    native runtime, as the adapters built on this module would (they import it)."""
    native = world_runtime().allgather_async(row.ctypes.data, _core.dtypes["int64"], list(row.shape), name, row)
    native.wait()
    return native.output_bytes().view(row.dtype).reshape(native.output_shape())


def _agree_on_ranks(ranks, what):
    """Raises on every rank, naming each rank's list, unless every rank passed the same ranks."""
    import numpy as np  # pylint: disable=import-outside-toplevel  # only process sets need it

    n = size()
    mine = np.full((1, n + 1), -1, dtype=np.int64)
    mine[0, 0] = len(ranks)
    mine[0, 1:min(len(ranks), n) + 1] = ranks[:n]
    every = _gather_rows(mine, f"process_set.check.{state.set_calls}")
    lists = [row[1:1 + int(row[0])].tolist() if 0 <= row[0] <= n else row[1:].tolist() for row in every]
    if any(lst != lists[0] or every[r, 0] != every[0, 0] for r, lst in enumerate(lists)):
        shown = ", ".join(f"rank {r} {lst}" for r, lst in enumerate(lists))
        raise ValueError(f"{what} must be called by every rank with the same ranks: {shown}")


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns it. Collective:
    every rank calls it, with the same ranks, in the same order as its other add/remove calls."""
    rt = world_runtime()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    what = f"add_process_set({ps.ranks})"
    if ps is global_process_set or ps._registered():
        raise ValueError(f"{what}: this process set is already registered (id {ps.process_set_id})")
    state.set_calls += 1
    _agree_on_ranks(ps.ranks, "add_process_set")  # first: what follows fails on every rank alike
    n = rt.size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= n:
        raise ValueError(f"{what}: ranks must be between 0 and {n - 1}, at least one of them")
    same = next((other for other in state.process_sets.values()
                 if other.ranks == ps.ranks and other.process_set_id >= 0), None)
    if same is not None:
        raise ValueError(f"{what}: a process set with these ranks is already registered: {same!r}")
    ps._runtime = _core.process_set_runtime(ps.ranks, state.overrides, **_store_world(f"set{state.set_calls}"))
    ps.process_set_id = state.next_set_id
    state.next_set_id += 1
    state.process_sets[ps.process_set_id] = ps
    return ps


def group_tag(ranks):
    """The tag with which the members of a group of `ranks` create its communicators (the same
    on every member; MPI_TAG_UB >= 32767)."""
    return zlib.crc32(repr(sorted(ranks)).encode()) % 32000


def members_only_process_set(ranks, store=None):
    """A process set that only its members create, each with the same sorted `ranks` (what
    torch.distributed's new_group does: the backend's groups of some ranks). Registered under
    a negative id, apart from add_process_set's (its ranks may register the same ranks again);
    shutdown() stops it with the others. In a world without MPI its members connect through
    `store` (a world.StoreAdapter over the group's store), or the world's."""
    ps = ProcessSet(ranks)
    if rank() not in ps.ranks:
        raise ValueError(f"rank {rank()} creates a group of ranks {ps.ranks} it is not in")
    where = _store_world(f"group{group_tag(ps.ranks)}", store)
    ps._runtime = _core.process_set_runtime(ps.ranks, state.overrides, members_only=True, tag=group_tag(ps.ranks),
                                            **where)
    state.members_only_sets += 1
    ps.process_set_id = -state.members_only_sets
    state.process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a process set and stops its runtime; returns whether it was registered.
    Collective, as add_process_set. The global process set cannot be removed."""
    if process_set is global_process_set:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if not isinstance(process_set, ProcessSet) or not process_set._registered():
        return False
    state.set_calls += 1
    _agree_on_ranks(process_set.ranks, "remove_process_set")
    stop_process_set(process_set)
    return True


def stop_process_set(ps):
    rt, ps._runtime = ps._runtime, None
    state.process_sets.pop(ps.process_set_id, None)
    ps.process_set_id = None
    if rt is not None:
        rt.shutdown()


def _store_world(what, store=None):
    """The keyword arguments that start a process set's runtime through the world's store (or
    `store`) in a world without MPI; none in MPI's world."""
    if state.store is None:
        return {}
    return {"store": store or state.store, "world_rank": rank(), "prefix": _world.prefix(f"{state.worlds}/{what}"),
            "timeout": _world.DEFAULT_TIMEOUT_SECONDS}


def runtime(process_set=None):
    """The native runtime object (for adapters): the global one, or `process_set`'s, which
    this rank must belong to."""
    rt = world_runtime()
    if process_set is None or process_set is global_process_set:
        return rt
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet (hvd.add_process_set), got {process_set!r}")
    if not process_set._registered():
        raise ValueError(f"{process_set!r} is not registered: add it with add_process_set (on every rank)")
    if process_set._runtime is None:
        raise ValueError(f"rank {rt.rank()} is not in {process_set!r}: only its ranks call its collectives")
    return process_set._runtime


def set_rank(process_set, global_rank, what):
    """`global_rank`'s place in `process_set` (root_rank arguments are global ranks)."""
    if process_set is None or process_set is global_process_set:
        return int(global_rank)
    if int(global_rank) not in process_set.ranks:
        raise ValueError(f"{what}: root rank {global_rank} is not in {process_set!r}")
    return process_set.ranks.index(int(global_rank))
