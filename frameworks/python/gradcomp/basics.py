"""What every gradcomp adapter shares: the Runtime the bindings own (and one per process set),
init/shutdown, topology queries, reduction ops, init() keyword settings, handle bookkeeping and
names.

Settings passed to ``init(**kwargs)`` use the registry's names without the ``GRADCOMP_``
prefix, lower-case (``init(compression="maxmin", bits=4, fusion_threshold_mb=32)``); they
override the environment. ``python3 -m gradcomp.settings`` lists them.
"""
import atexit
import functools
import itertools
import os
import sys
import threading
import zlib

from gradcomp import _core
from gradcomp import world as _world
from gradcomp._core import GradcompError

# Reduction ops (the C++ ReduceOp codes, from the bindings).
Sum = _core.reduce_ops["sum"]
Average = _core.reduce_ops["average"]
Min = _core.reduce_ops["min"]
Max = _core.reduce_ops["max"]
Product = _core.reduce_ops["product"]
# Horovod's adaptive summation (allreduce of floating-point tensors; docs/design.md "Adasum").
Adasum = _core.reduce_ops["adasum"]
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}

_SETTING_NAMES = {s["name"][len("GRADCOMP_"):].lower(): s["name"] for s in _core.describe_settings()}


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


_state = _State()


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
        return self.process_set_id is not None and _state.process_sets.get(self.process_set_id) is self

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
    native = _rt().allgather_async(row.ctypes.data, _core.dtypes["int64"], list(row.shape), name, row)
    native.wait()
    return native.output_bytes().view(row.dtype).reshape(native.output_shape())


def _agree_on_ranks(ranks, what):
    """Raises on every rank, naming each rank's list, unless every rank passed the same ranks."""
    import numpy as np  # pylint: disable=import-outside-toplevel  # only process sets need it

    n = size()
    mine = np.full((1, n + 1), -1, dtype=np.int64)
    mine[0, 0] = len(ranks)
    mine[0, 1:min(len(ranks), n) + 1] = ranks[:n]
    every = _gather_rows(mine, f"process_set.check.{_state.set_calls}")
    lists = [row[1:1 + int(row[0])].tolist() if 0 <= row[0] <= n else row[1:].tolist() for row in every]
    if any(lst != lists[0] or every[r, 0] != every[0, 0] for r, lst in enumerate(lists)):
        shown = ", ".join(f"rank {r} {lst}" for r, lst in enumerate(lists))
        raise ValueError(f"{what} must be called by every rank with the same ranks: {shown}")


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns it. Collective:
    every rank calls it, with the same ranks, in the same order as its other add/remove calls."""
    rt = _rt()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    what = f"add_process_set({ps.ranks})"
    if ps is global_process_set or ps._registered():
        raise ValueError(f"{what}: this process set is already registered (id {ps.process_set_id})")
    _state.set_calls += 1
    _agree_on_ranks(ps.ranks, "add_process_set")  # first: what follows fails on every rank alike
    n = rt.size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= n:
        raise ValueError(f"{what}: ranks must be between 0 and {n - 1}, at least one of them")
    same = next((other for other in _state.process_sets.values()
                 if other.ranks == ps.ranks and other.process_set_id >= 0), None)
    if same is not None:
        raise ValueError(f"{what}: a process set with these ranks is already registered: {same!r}")
    ps._runtime = _core.process_set_runtime(ps.ranks, _state.overrides, **_store_world(f"set{_state.set_calls}"))
    ps.process_set_id = _state.next_set_id
    _state.next_set_id += 1
    _state.process_sets[ps.process_set_id] = ps
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
    ps._runtime = _core.process_set_runtime(ps.ranks, _state.overrides, members_only=True, tag=group_tag(ps.ranks),
                                            **where)
    _state.members_only_sets += 1
    ps.process_set_id = -_state.members_only_sets
    _state.process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a process set and stops its runtime; returns whether it was registered.
    Collective, as add_process_set. The global process set cannot be removed."""
    if process_set is global_process_set:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if not isinstance(process_set, ProcessSet) or not process_set._registered():
        return False
    _state.set_calls += 1
    _agree_on_ranks(process_set.ranks, "remove_process_set")
    _stop_process_set(process_set)
    return True


def _stop_process_set(ps):
    rt, ps._runtime = ps._runtime, None
    _state.process_sets.pop(ps.process_set_id, None)
    ps.process_set_id = None
    if rt is not None:
        rt.shutdown()


def _settings_from_kwargs(kwargs):
    out = {}
    for key, value in kwargs.items():
        if key not in _SETTING_NAMES:
            raise ValueError(f"init() got an unknown setting '{key}'; known: {', '.join(sorted(_SETTING_NAMES))}")
        if isinstance(value, bool):
            value = int(value)
        out[_SETTING_NAMES[key]] = str(value)
    return out


def _store_world(what, store=None):
    """The keyword arguments that start a process set's runtime through the world's store (or
    `store`) in a world without MPI; none in MPI's world."""
    if _state.store is None:
        return {}
    return {"store": store or _state.store, "world_rank": rank(), "prefix": _world.prefix(f"{_state.worlds}/{what}"),
            "timeout": _world.DEFAULT_TIMEOUT_SECONDS}


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
    with _state.lock:
        if _state.runtime is not None and _state.runtime.running:
            if isinstance(process_sets, (list, tuple)) and process_sets:
                raise ValueError("init(process_sets=...) on a running gradcomp: register them with add_process_set")
            return
        where = _world.env_world()
        if where is None and store is not None and place is not None and not _world.mpi_launched():
            where = place
        if where is not None and store is None:
            store = _world.env_store(*where)
        if where is None:
            _state.runtime = _core.Runtime(overrides)
        else:
            _state.worlds += 1
            _state.runtime = _core.Runtime(overrides, store=store, rank=where[0], size=where[1],
                                           prefix=_world.prefix(f"{_state.worlds}/world"),
                                           timeout=_world.DEFAULT_TIMEOUT_SECONDS)
        _state.store = store if where is not None else None
        _state.overrides = overrides
        _state.handles.clear()
        _state.name_counters.clear()
        _state.reserved_names.clear()
        _state.process_sets = {0: global_process_set}
        _state.next_set_id = 1
        _state.set_calls = 0
        global_process_set.ranks = list(range(_state.runtime.size()))
        global_process_set._runtime = _state.runtime
    if isinstance(process_sets, (list, tuple)):
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops gradcomp on this rank (and ends negotiation on every rank); pending operations fail."""
    for ps in [ps for ps in _state.process_sets.values() if ps is not global_process_set]:
        _stop_process_set(ps)
    with _state.lock:
        rt, _state.runtime = _state.runtime, None
        global_process_set._runtime = None
    if rt is not None:
        # After a collective timeout (docs/errors.md) shutdown ends the process: print first.
        sys.stdout.flush()
        sys.stderr.flush()
        rt.shutdown()


def started_through_store():
    """Whether the running world was started without MPI (an env:// launch: torchrun)."""
    return _state.store is not None


def is_initialized():
    return _state.runtime is not None and _state.runtime.running


def _rt():
    rt = _state.runtime
    if rt is None:
        raise ValueError("gradcomp has not been initialized; call gradcomp.init() first")
    return rt


def runtime(process_set=None):
    """The native runtime object (for adapters): the global one, or `process_set`'s, which
    this rank must belong to."""
    rt = _rt()
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


def rank():
    return _rt().rank()


def size():
    return _rt().size()


def local_rank():
    return _rt().local_rank()


def local_size():
    return _rt().local_size()


def cross_rank():
    return _rt().cross_rank()


def cross_size():
    return _rt().cross_size()


def is_homogeneous():
    """Whether every node holds the same number of ranks (Horovod's)."""
    return _rt().is_homogeneous()


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a Chrome-trace timeline into file_path (written by rank 0)."""
    del mark_cycles  # cycle marks follow GRADCOMP_TIMELINE_MARK_CYCLES
    _rt().start_timeline(str(file_path))


def stop_timeline():
    _rt().stop_timeline()


def check_op(op, average=None):
    """Resolves Horovod's `op=` and deprecated `average=` arguments to an op code."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op= or the deprecated average=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op not in _OP_NAMES:
        raise ValueError(f"unknown reduction op {op!r}; use Sum, Average, Min, Max, Product or Adasum")
    return op


_CODECS = tuple(name for name, _ in _core.codecs()) + ("auto",)

AUTO_CANDIDATES = ("none", "fp16", "maxmin8", "maxmin6", "maxmin5", "maxmin4", "maxmin3", "maxmin2", "maxmin1")


# Compression.auto(relaxed=BY_OPTIMIZER), the default: how far a calm tensor's budget relaxes
# depends on the optimizer. Measured (docs/benchmarks.md "Adaptive compression as it comes"): under SGD 1 bit
# can throw training off (digits: in one of two runs one seed of three diverged to chance), 2
# bits held it; under Adam, whose update is normalized per coordinate, 1 bit holds the character
# LM's loss.
BY_OPTIMIZER = "optimizer"
RELAXED_BITS = 2            # SGD and any optimizer gradcomp does not see (NumPy, the DDP hook)
RELAXED_BITS_ADAPTIVE = 1   # optimizers that normalize their update per coordinate (Adam and kin)
_auto_notes = {}  # what an adapter decided for the defaults: auto_summary() says it


def relaxed_bits_by_optimizer(reference_bits, adaptive):
    """The relaxed bits BY_OPTIMIZER stands for under a `reference_bits` reference (0: off)."""
    return max(0, min(RELAXED_BITS_ADAPTIVE if adaptive else RELAXED_BITS, reference_bits - 1))


def relaxed_bits_were_set():
    """Whether GRADCOMP_AUTO_RELAXED_BITS was given (environment or init()'s settings)."""
    return "GRADCOMP_AUTO_RELAXED_BITS" in os.environ or "GRADCOMP_AUTO_RELAXED_BITS" in _state.overrides


def note_auto_default(key, text):
    """An adapter's word on a default it chose for auto compression (auto_summary prints it)."""
    _auto_notes[key] = text


def auto_spec(candidates=None, reference=None, interval=25, relaxed=BY_OPTIMIZER, critical_change=0.5,
              normalized=True):
    """The runtime's spec of adaptive compression: every `interval` steps each tensor gets the
    setting among `candidates` (names: none, fp16, bf16, maxminB, topkR) that puts the fewest
    bytes on the wire while the model's total squared error stays at most what `reference` (a
    maxmin spec dict, default 4 bits; its bucket size, rounding and error feedback apply to
    every candidate) would give.

    With `relaxed` (a maxmin spec dict of fewer bits than the reference, or its bits; None for
    the reference's budget throughout), only tensors in a critical regime keep the reference's
    error budget (Accordion): those whose gradient, summed over the steps between two choices,
    moved in norm by `critical_change` (a fraction) or more since the previous choice, and every
    tensor at its first choice. A calm tensor's budget steps down one bit a choice (the error of
    maxmin at one bit fewer than its previous budget), down to the relaxed setting's. The
    default, BY_OPTIMIZER, is 2 bits, which DistributedOptimizer lowers to 1 under an optimizer
    that normalizes its update per coordinate (Adam and its kin), as GRADCOMP_AUTO_RELAXED_BITS'
    default is (both never below 1, nor at the reference's bits or above).

    With `normalized` (the default), each tensor's error counts over its values' mean square:
    the error of an update normalized per coordinate, which held both SGD's and Adam's accuracy
    in the measurements of docs/benchmarks.md; False weighs absolute errors (L-GreCo's), which
    lets a tensor of small gradients take few bits."""
    candidates = AUTO_CANDIDATES if candidates is None else candidates
    if isinstance(candidates, str):
        candidates = [candidates]
    candidates = [str(c).strip() for c in candidates]
    if not candidates or any(not c or "," in c for c in candidates):
        raise ValueError(f"auto compression: candidates must be a non-empty list of names (none, fp16, bf16, "
                         f"maxminB, topkR), got {candidates!r}")
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ValueError(f"auto compression: interval must be a positive number of steps, got {interval!r}")
    ref = {"codec": "maxmin", "bits": 4} if reference is None else dict(reference)
    if ref.get("codec") != "maxmin":
        raise ValueError(f"auto compression: the reference must be a maxmin setting, got {reference!r}")
    spec = {k: v for k, v in ref.items() if k in ("bits", "bucket_size", "stochastic", "error_feedback",
                                                  "skip_incomplete_buckets")}
    relaxed_bits = relaxed
    if relaxed == BY_OPTIMIZER:
        relaxed_bits = relaxed_bits_by_optimizer(spec.get("bits", 4), adaptive=False)
        relaxed = relaxed_bits or None
    if relaxed is None:
        relaxed_bits = 0
    elif isinstance(relaxed, dict):
        if relaxed.get("codec") != "maxmin":
            raise ValueError(f"auto compression: relaxed must be a maxmin setting, got {relaxed!r}")
        differ = sorted(k for k in ("bucket_size", "stochastic", "error_feedback", "skip_incomplete_buckets")
                        if k in relaxed and k in spec and relaxed[k] != spec[k])
        if differ:
            raise ValueError(f"auto compression: relaxed may differ from the reference in its bits only; "
                             f"{differ} differ ({relaxed!r} against {ref!r})")
        relaxed_bits = relaxed.get("bits", 4)
    if relaxed is not None and (not isinstance(relaxed_bits, int) or isinstance(relaxed_bits, bool) or
                                not 1 <= relaxed_bits < spec.get("bits", 4)):
        raise ValueError(f"auto compression: relaxed must have from 1 to fewer than the reference's "
                         f"{spec.get('bits', 4)} bits, got {relaxed!r}")
    if isinstance(critical_change, bool) or not isinstance(critical_change, (int, float)) or \
            not 0 < critical_change < float("inf"):
        raise ValueError(f"auto compression: critical_change must be a positive fraction, got {critical_change!r}")
    if not isinstance(normalized, bool):
        raise ValueError(f"auto compression: normalized must be True or False, got {normalized!r}")
    spec.update(codec="auto", candidates=",".join(candidates), interval=interval, relaxed_bits=relaxed_bits,
                critical_change=float(critical_change), normalized=normalized)
    return spec


def compression_choices(process_set=None):
    """Auto compression on this rank (in the process set's runtime, as stats()): {tensor name:
    {"setting": its current setting, "choice": which choice set it (counting from 1, as
    stats()["auto_choices"]), "measured_at": the step of the tensor its errors were measured on,
    "relative_error": {candidate: error over all ranks, "reference": error}, "relative_error_ef":
    the same with error feedback, measured on the gradient plus the residual the tensor carries
    (empty for a spec without error feedback), "critical": whether the choice found it in a
    critical regime (always True without relaxed), "budget_bits": the maxmin width whose error
    bounded its choice (the reference's while critical; with relaxed, one bit fewer each calm
    choice since, down to the relaxed bits), "norm_change": how far the norm of its gradient
    summed between choices moved since the choice before, as a fraction (-1: none before)}}
    (empty before the first choice)."""
    return dict(runtime(process_set).compression_choices())


def auto_summary():
    """One line for a job's summary on what adaptive compression chose on this rank: each
    setting with its number of tensors, and, where the cost model kept tensors uncompressed,
    that it did and why (the link it measured). '' when no tensor runs under auto."""
    choices = compression_choices()
    if not choices:
        return ("auto compression made no choice yet: every auto tensor ran its reference (the first choice comes "
                "after the interval, GRADCOMP_AUTO_INTERVAL or Compression.auto(interval=...))"
                if stats()["auto_tensors"] else "")
    settings = {}
    for c in choices.values():
        settings[c["setting"]] = settings.get(c["setting"], 0) + 1
    line = (f"auto compression, choice {max(c['choice'] for c in choices.values())}: " +
            ", ".join(f"{k} x{v}" for k, v in sorted(settings.items(), key=lambda kv: -kv[1])))
    raw = sum(1 for c in choices.values() if c["setting"] == "none" and c["estimated_seconds"])
    if raw:
        latency, per_byte = _rt().auto_link()
        speed = f"{1e-9 / per_byte:.2f} GB/s" if per_byte > 0 else "faster than it could time"
        line += (f". The cost model kept {raw} of {len(choices)} tensors uncompressed: it measured this job's link at "
                 f"{speed} and {latency * 1e6:.0f} us a message, where encoding and decoding them would take longer "
                 f"than the bytes they save (ranks on one node, or a fast network); across slow links it compresses "
                 f"(GRADCOMP_AUTO_COST_MODEL=0 compresses regardless)")
    for note in _auto_notes.values():
        line += ". " + note
    return line


def codec_info():
    """{codec name: {"description", "sparse", "fields"}}: what each codec is, from the core."""
    return _core.codec_info()


def compression_spec(compression):
    """None (the settings' policy), a codec name, or a dict with "codec" and its parameters
    (the keys of ``codec_info()[codec]["fields"]``, and error_feedback)."""
    if compression is None:
        return None
    if isinstance(compression, str):
        compression = {"codec": compression}
    if not isinstance(compression, dict) or compression.get("codec") not in _CODECS:
        raise ValueError(f"compression must be None, one of {_CODECS} or a dict with a 'codec' among them, "
                         f"got {compression!r}")
    return dict(compression)


def stats(process_set=None):
    """Counters of this rank's runtime (the process set's, which a backend group of some ranks
    has too: its `process_set`): cycles, cache hits, tensors executed, and the bytes
    compressed collectives took in and put on the wire."""
    return dict(runtime(process_set).stats())


# stats() fields that are a runtime's settings, not counts: total_stats() gives the world's.
_SETTING_STATS = ("fusion_threshold_mb", "cycle_time_ms", "autotune_done")


def total_stats():
    """stats() summed over every runtime of this rank: the world's and each process set's it
    belongs to, torch.distributed groups of some ranks included (FSDP2's and a DeviceMesh's
    groups each run one). What a framework's training sent, wherever its groups put it; the
    settings fields (fusion threshold, cycle time, autotune) are the world runtime's."""
    total = stats()
    for ps in list(_state.process_sets.values()):
        if ps._runtime is None:
            continue
        for key, value in ps._runtime.stats().items():
            if key not in _SETTING_STATS:
                total[key] += value
    return total


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
    n = _state.name_counters.get(key, 0)
    _state.reserved_names[key] = n + 1
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
            _state.reserved_names.clear()
    return call


def register(native_handle, finish):
    """Records an enqueued operation; `finish()` turns its completion into the result."""
    _state.name_counters.update(_state.reserved_names)  # the submitted call's numbers are taken
    _state.reserved_names.clear()
    h = next(_state.next_handle)
    _state.handles[h] = (native_handle, finish)
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
    if handle not in _state.handles:
        raise ValueError(f"unknown handle {handle!r}")
    return _state.handles[handle][0].poll()


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its result (raising its error)."""
    if handle not in _state.handles:
        raise ValueError(f"unknown handle {handle!r}")
    native, finish = _state.handles.pop(handle)
    native.wait()
    return finish()


def join():
    """This rank is out of data: it contributes zeros to other ranks' reductions until every
    rank has joined. Returns the last rank to join."""
    native = runtime().join_async()
    native.wait()
    return int(native.aux()[0])


def barrier(process_set=None):
    """Returns once every rank (of `process_set`) has called barrier()."""
    runtime(process_set).barrier_async().wait()


@atexit.register
def _shutdown_at_exit():
    try:
        shutdown()
    except Exception:  # noqa: BLE001 - never fail interpreter exit
        pass


__all__ = ["GradcompError", "init", "shutdown", "join", "barrier", "ProcessSet", "global_process_set",
           "add_process_set", "remove_process_set",
           "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "start_timeline", "stop_timeline", "poll", "synchronize",
           "Sum", "Average", "Min", "Max", "Product", "Adasum"]
