"""This process's gradcomp: the world's runtime, init()'s settings, the registered process sets,
the handles of calls in flight and the numbering of unnamed calls (internal; the modules of
basics.py share it).
"""
import itertools
import threading


class _State:
    def __init__(self):
        self.runtime = None
        self.overrides = {}  # init()'s settings, which process sets' runtimes get too
        self.lock = threading.Lock()
        self.handles = {}
        self.next_handle = itertools.count()
        self.name_counters = {}
        self.reserved_names = {}  # kind -> next number, taken once the call is submitted
        self.process_sets = {}  # id -> registered ProcessSet (the global one is id 0)
        self.next_set_id = 1
        self.members_only_sets = 0  # members_only_process_set's, numbered -1, -2, ...
        self.set_calls = 0  # add/remove_process_set calls so far (they name their checks)
        self.store = None  # a world without MPI: the store its ranks met through (world.StoreAdapter)
        self.worlds = 0  # runtimes started through a store so far (their keys' prefixes)


state = _State()


def world_runtime():
    rt = state.runtime
    if rt is None:
        raise ValueError("gradcomp has not been initialized; call gradcomp.init() first")
    return rt
