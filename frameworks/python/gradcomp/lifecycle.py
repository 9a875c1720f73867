"""Starting and stopping gradcomp on a rank: init() with its keyword settings (the registry's names
without the GRADCOMP_ prefix, lower-case), a world started through a store (torchrun), shutdown,
the timeline, and the collectives that take no tensor (join, barrier).
"""
import atexit
import sys

from gradcomp import _core
from gradcomp import world as _world
from gradcomp._runtime_state import state, world_runtime
from gradcomp.process_sets import add_process_set, global_process_set, runtime, stop_process_set

_SETTING_NAMES = {s["name"][len("GRADCOMP_"):].lower(): s["name"] for s in _core.describe_settings()}


def _settings_from_kwargs(kwargs):
    out = {}
    for key, value in kwargs.items():
        if key not in _SETTING_NAMES:
            raise ValueError(f"init() got an unknown setting '{key}'; known: {', '.join(sorted(_SETTING_NAMES))}")
        if isinstance(value, bool):
            value = int(value)
        out[_SETTING_NAMES[key]] = str(value)
    return out


def init(process_sets=None, **settings):
    """Starts gradcomp on every rank (collective). Keyword arguments override GRADCOMP_*
    variables. `process_sets`: ProcessSets or lists of ranks to register at once (as
    add_process_set does; "dynamic", Horovod's switch for adding them later, is accepted: sets
    can always be added). Calling init() again after shutdown() starts a fresh runtime.

    Under gcrun or mpirun the world is MPI's. Started by torchrun or another env:// launcher
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) without MPI, the ranks meet through
    torch.distributed's store and run on gradcomp's own TCP connections and shared memory."""
    start(None, process_sets, **settings)


def start(store, process_sets=None, place=None, **settings):
    """init() with the world's store given (world.StoreAdapter, or None: found from the
    launch): the torch.distributed backend passes its group's, and its (rank, size) as `place`
    for a world without MPI whose variables do not say (init_method tcp:// or file://)."""
    overrides = _settings_from_kwargs(settings)
    if process_sets is not None and process_sets != "dynamic" and not isinstance(process_sets, (list, tuple)):
        raise ValueError(f"init(process_sets=...) takes a list of ProcessSets or rank lists, or 'dynamic'; "
                         f"got {process_sets!r}")
    with state.lock:
        if state.runtime is not None and state.runtime.running:
            if isinstance(process_sets, (list, tuple)) and process_sets:
                raise ValueError("init(process_sets=...) on a running gradcomp: register them with add_process_set")
            return
        where = _world.env_world()
        if where is None and store is not None and place is not None and not _world.mpi_launched():
            where = place
        if where is not None and store is None:
            store = _world.env_store(*where)
        if where is None:
            state.runtime = _core.Runtime(overrides)
        else:
            state.worlds += 1
            state.runtime = _core.Runtime(overrides, store=store, rank=where[0], size=where[1],
                                          prefix=_world.prefix(f"{state.worlds}/world"),
                                          timeout=_world.DEFAULT_TIMEOUT_SECONDS)
        state.store = store if where is not None else None
        state.overrides = overrides
        state.handles.clear()
        state.name_counters.clear()
        state.reserved_names.clear()
        state.process_sets = {0: global_process_set}
        state.next_set_id = 1
        state.set_calls = 0
        global_process_set.ranks = list(range(state.runtime.size()))
        global_process_set._runtime = state.runtime
    if isinstance(process_sets, (list, tuple)):
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops gradcomp on this rank (and ends negotiation on every rank); pending operations fail."""
    for ps in [ps for ps in state.process_sets.values() if ps is not global_process_set]:
        stop_process_set(ps)
    with state.lock:
        rt, state.runtime = state.runtime, None
        global_process_set._runtime = None
    if rt is not None:
        # After a collective timeout (docs/errors.md) shutdown ends the process: print first.
        sys.stdout.flush()
        sys.stderr.flush()
        rt.shutdown()


def started_through_store():
    """Whether the running world was started without MPI (an env:// launch: torchrun)."""
    return state.store is not None


def is_initialized():
    return state.runtime is not None and state.runtime.running


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a Chrome-trace timeline into file_path (written by rank 0)."""
    del mark_cycles  # cycle marks follow GRADCOMP_TIMELINE_MARK_CYCLES
    world_runtime().start_timeline(str(file_path))


def stop_timeline():
    world_runtime().stop_timeline()


def join():
    """This rank is out of data: it contributes zeros to other ranks' reductions until every
    rank has joined. Returns the last rank to join."""
    native = runtime().join_async()
    native.wait()
    return int(native.aux()[0])


def barrier(process_set=None):
    """Returns once every rank (of `process_set`) has called barrier()."""
    runtime(process_set).barrier_async().wait()


def _leave_mpi_on_uncaught_exception(kind, value, tb, previous=sys.excepthook):
    """sys.excepthook while gradcomp is imported. A script ending on an exception it did not catch
    (KeyboardInterrupt included) must not wait at exit for the other ranks to reach MPI's teardown:
    a rank still training, or waiting in a rendezvous for this one, may never reach it. This
    process then leaves MPI unfinalized (and exits non-zero, as Python does), so mpirun ends the
    job; without MPI (torchrun, env://) there is nothing to leave and the launcher ends it."""
    _core.abandon_mpi_at_exit()
    previous(kind, value, tb)


sys.excepthook = _leave_mpi_on_uncaught_exception


@atexit.register
def _shutdown_at_exit():
    try:
        shutdown()
    except Exception:  # noqa: BLE001 - never fail interpreter exit
        pass
