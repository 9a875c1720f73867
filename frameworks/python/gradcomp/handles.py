"""The adapters' calls in flight: the names of unnamed calls (the same on every rank), the handles
that stand for enqueued operations, grouped handles, and waiting for them.
"""
import functools

from gradcomp._runtime_state import state
from gradcomp.process_sets import global_process_set, runtime


def auto_name(kind, name, process_set=None):
    """`name`, or a generated one that is the same on every rank for the same call order
    (counted per process set: each set's ranks call its collectives in their own order).
    A generated number is only used up once the call is submitted (register()): a call that
    fails on one rank before reaching the runtime (a bad dtype, a bad argument) leaves the
    numbering of every rank in step."""
    if process_set is not None and process_set is not global_process_set:
        runtime(process_set)  # a registered set this rank belongs to, or a clear error now
    if name is not None:
        return str(name)
    key = kind if process_set is None or process_set is global_process_set else (kind, process_set.process_set_id)
    n = state.name_counters.get(key, 0)
    state.reserved_names[key] = n + 1
    return f"{kind}.noname.{n}"


def submits(fn):
    """Decorates the adapters' calls that submit collectives: the unnamed-call numbers a call
    reserved (auto_name) are used up when it is submitted (register) and dropped when it
    fails before that, so one rank's local error does not shift its numbering."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            state.reserved_names.clear()
    return call


def register(native_handle, finish):
    """Records an enqueued operation; `finish()` turns its completion into the result."""
    state.name_counters.update(state.reserved_names)  # the submitted call's numbers are taken
    state.reserved_names.clear()
    h = next(state.next_handle)
    state.handles[h] = (native_handle, finish)
    return h


class _HandleGroup:
    """Several registered handles standing as one (grouped calls made of single ones)."""

    def __init__(self, handles):
        self.handles = handles

    def poll(self):
        return all(poll(h) for h in self.handles)

    def wait(self):
        pass  # each handle is waited on by the group's result


class NativeGroup:
    """Several native handles standing as one (a grouped allreduce split by dtype)."""

    def __init__(self, natives):
        self.natives = list(natives)

    def poll(self):
        return all(n.poll() for n in self.natives)

    def wait(self):
        for n in self.natives:
            n.wait()


def indices_by(keys):
    """{key: indices} in the order the keys first appear (the same on every rank where the keys
    are): how a grouped allreduce of several dtypes splits into one group per dtype."""
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def register_group(handles):
    """One handle for several registered ones; its result is the list of theirs, in order."""
    return register(_HandleGroup(handles), lambda: [synchronize(h) for h in handles])


def poll(handle):
    """True once the operation behind `handle` has finished; never blocks."""
    if handle not in state.handles:
        raise ValueError(f"unknown handle {handle!r}")
    return state.handles[handle][0].poll()


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its result (raising its error)."""
    if handle not in state.handles:
        raise ValueError(f"unknown handle {handle!r}")
    native, finish = state.handles.pop(handle)
    native.wait()
    return finish()
