"""torch.distributed backend "gradcomp": c10d collectives through gradcomp's runtime.

    import gradcomp.torch            # registers the backend
    dist.init_process_group("gradcomp")

Launched by gcrun or mpirun (the ranks come from MPI; torch's rank and world size must agree).
Floating-point all_reduce is compressed per the settings as CGX does: any buffer of at least
GRADCOMP_MIN_SIZE elements (DDP's flat buckets included), with GRADCOMP_COMPRESSION, _BITS,
_BUCKET_SIZE, ... ; everything else is exact. For per-layer compression inside DDP's buckets
register gradcomp.torch.ddp_hook.

c10d names no tensors, so the backend names each operation by its sequence number in the
group (c10d requires every rank to call collectives in the same order, so the names agree).
Sequence names never repeat, so per-tensor state across steps is not available here:
GRADCOMP_ERROR_FEEDBACK and GRADCOMP_COMPRESSION=topk (DGC's accumulator) are ignored by the
backend with a warning; DistributedOptimizer and ddp_hook keep that state per parameter.

send and recv concern two ranks, where a runtime operation is negotiated by all of its group:
they are MPI messages on a communicator of the group's own (ops/comm/mpi_point_to_point.h),
waited for on the caller's thread up to the group's timeout.
"""
import atexit
import collections
import contextlib
import queue
import sys
import threading
import time
import warnings
import weakref

import torch
import torch.distributed as dist
from torch.futures import Future

from gradcomp import _core
from gradcomp import basics as _b
from gradcomp import world as _world
from gradcomp.basics import Average, Max, Min, Product, Sum
from gradcomp.torch import compat, group_join, mpi_ops
from gradcomp.torch.futures import failing_in_cpp

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # what the codecs take
_live_groups = weakref.WeakSet()
_groups_created = 0  # ProcessGroupGradcomp objects, in creation order


@atexit.register
def _drain_at_exit():
    # Registered after gradcomp.basics' shutdown hook, so it runs before it (atexit is LIFO).
    for group in list(_live_groups):
        group._drain(timeout=10.0)


_warned_fsdp2 = []


def _warn_if_fsdp2(codec):
    """Once a process, when FSDP2's own reduce-scatter (its _fsdp_collectives module, torch 2.4 on)
    calls a compressed one: without compress_fsdp it has no name, so each step is quantized afresh
    with no residual carried to the next."""
    frame = sys._getframe(2)
    while frame is not None and "_fsdp_collectives" not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return
    _warned_fsdp2.append(True)
    warnings.warn(f"backend gradcomp: FSDP2's reduce-scatter is compressed ({codec}, GRADCOMP_COMPRESSION) without "
                  "error feedback: c10d names no tensor, so no residual is kept from one step to the next. Call "
                  "hvd.compress_fsdp(model) after fully_shard: each module's reduce-scatter then has its name and "
                  "its error feedback (GRADCOMP_ERROR_FEEDBACK=1); without it the quantization errors of every "
                  "step are lost and training can end well above an exact reduction's loss", stacklevel=2)


def _reduce_op(op):
    """gradcomp's op for a c10d ReduceOp and the factor to scale each rank's values by first:
    PREMUL_SUM(f) (FSDP2 after set_gradient_divide_factor) is Sum with prescale f."""
    table = [(dist.ReduceOp.SUM, Sum), (dist.ReduceOp.PRODUCT, Product), (dist.ReduceOp.MIN, Min),
             (dist.ReduceOp.MAX, Max)]
    if hasattr(dist.ReduceOp, "AVG"):
        table.append((dist.ReduceOp.AVG, Average))
    for c10d_op, ours in table:
        if op == c10d_op:
            return ours, 1.0
    if hasattr(dist.ReduceOp, "PREMUL_SUM") and op == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError("backend gradcomp: this torch's ReduceOp.PREMUL_SUM does not say its factor")
        return Sum, float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    raise ValueError(f"backend gradcomp: reduce op {getattr(op, 'op', op)} is not supported (SUM, AVG, PREMUL_SUM, "
                     "PRODUCT, MIN, MAX)")


def _opts_op(opts):
    """_reduce_op of a c10d options object's reduceOp (SUM where there are no options)."""
    return _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)


# Buffers that an FSDP2 module's comm allocated (gradcomp.torch.fsdp2), by address. FSDP2
# all-reduces a module's reduce-scattered gradient over its replicas (HSDP, replicate()) through
# c10d, which names nothing: an all_reduce of such a buffer runs under the module's name and with
# its compression instead, so its error feedback stays the module's in whatever order modules come.
_module_buffers = {}  # data_ptr -> (weak reference to the buffer, module's name, compression spec)


def name_module_buffer(tensor, name, compress):
    """Marks `tensor` (alive) as the gradient buffer of the FSDP2 module `name`."""
    for ptr in [ptr for ptr, (ref, _, _) in _module_buffers.items() if ref() is None]:
        del _module_buffers[ptr]
    _module_buffers[tensor.data_ptr()] = (weakref.ref(tensor), name, compress)


def _module_buffer(t):
    """(name, compression) of the module whose live buffer `t` is, or None."""
    entry = _module_buffers.get(t.data_ptr()) if t.numel() > 0 else None
    if entry is None:
        return None
    buffer = entry[0]()
    if buffer is None or buffer.numel() != t.numel() or buffer.dtype != t.dtype:
        return None
    return entry[1], entry[2]


class _Pending:
    """One c10d operation: gradcomp handles, what to do once they complete, and the future
    (wrapped in the Work that c10d gets) to resolve with `result`."""

    def __init__(self, handles, finish, result):
        self.handles, self.finish, self.result = handles, finish, result
        self.future = Future()
        self.error = None
        self.resolved_at = None  # time.monotonic() once the future is resolved
        # Issued under torch.inference_mode (Lightning's validate, an eval loop): its outputs are
        # inference tensors, which the handles' and this operation's finishing copies may write
        # in place only in that mode, on the completer's thread too (the mode is per thread).
        self.inference = torch.is_inference_mode_enabled()

    def complete(self):
        """Waits for the operations and runs `finish`; returns the error, if any."""
        try:
            with torch.inference_mode(self.inference):
                for h in self.handles:
                    _b.synchronize(h)
                if self.finish is not None:
                    self.finish()
        except Exception as e:  # noqa: BLE001 - delivered through the future
            return e
        return None

    def resolve(self, error):
        self.error = error
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(self.result)
        self.resolved_at = time.monotonic()


class _Work(dist.Work):
    """The Work of one operation: `wait()` raises the operation's error, on every rank it
    reaches, as gloo's and NCCL's works do. (A Work that torch builds from a future,
    `_create_work_from_future`, returns from `wait()` without raising: a failed
    `dist.all_gather` of mismatched sizes then left its outputs untouched, silently.)
    C++ callers (DDP's Reducer, `_broadcast_coalesced`) reach `wait()` and `get_future()`
    through torch's trampoline while the Python object lives: the group keeps each Work until
    a while after its operation ends (ProcessGroupGradcomp._retain)."""

    def __init__(self, pending):
        super().__init__()
        self._pending = pending
        self._future = failing_in_cpp(pending.future)  # DDP reads a failure in C++ too

    def wait(self, timeout=None):
        del timeout  # the runtime's stall check bounds every operation
        try:
            self._future.wait()
        except Exception:  # noqa: BLE001 - the operation's own error, not the chained future's
            if self._pending.error is not None:
                raise self._pending.error from None
            raise
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and self._pending.error is None

    def exception(self):
        return self._pending.error

    def result(self):
        self.wait()
        return self._pending.result


class _P2pWork(dist.Work):
    """A send or recv: an MPI request of the group's point-to-point communicator, waited for on
    the caller's thread up to the group's timeout. `buffer` (what MPI reads or writes) lives as
    long as the Work, and past it while MPI may still use it; `finish` lands a staged receive."""

    _abandoned = []  # buffers of requests given up on (a send cannot be withdrawn)

    def __init__(self, request, what, timeout, buffer, finish):
        super().__init__()
        self._request, self._what, self._timeout = request, what, timeout
        self._buffer, self._finish = buffer, finish
        self._done, self._error = False, None

    def _complete(self):
        self._done = True
        if self._finish is not None:
            self._finish()

    def wait(self, timeout=None):
        del timeout  # the group's, as gloo's send and recv
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        try:
            completed = self._request.wait(self._timeout)
        except Exception as e:  # noqa: BLE001 - the message's own problem, named
            self._error = RuntimeError(f"backend gradcomp: {e}")
            raise self._error from None
        if not completed:
            self._request.cancel_receive()
            if self._request.test():  # it arrived as the receive was being withdrawn
                self._complete()
                return True
            _P2pWork._abandoned.append((self._request, self._buffer))
            self._error = RuntimeError(f"backend gradcomp: {self._what} did not complete within {self._timeout:g} s "
                                       "(the group's timeout: init_process_group / new_group timeout=)")
            raise self._error
        self._complete()
        return True

    def is_completed(self):
        if not self._done and self._error is None:
            try:
                if self._request.test():
                    self._complete()
            except Exception as e:  # noqa: BLE001 - raised by wait()
                self._error = RuntimeError(f"backend gradcomp: {e}")
        return self._done or self._error is not None

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        self.is_completed()
        return self._error

    def _source_rank(self):
        """The sender of a completed recv (torch's recv(src=None) returns it)."""
        self.wait()
        return self._request.source()


class _Works(dist.Work):
    """Several Works as one (the messages of a batch_isend_irecv)."""

    def __init__(self, works):
        super().__init__()
        self._works = works

    def wait(self, timeout=None):
        for work in self._works:
            work.wait(timeout)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self._works)

    def is_success(self):
        return all(work.is_success() for work in self._works)

    def exception(self):
        return next((work.exception() for work in self._works if work.exception() is not None), None)


class ProcessGroupGradcomp(dist.ProcessGroup):
    """A c10d ProcessGroup whose collectives are gradcomp runtime operations."""

    def __init__(self, store, rank, size, timeout, process_set=None):
        super().__init__(rank, size)
        if not _b.is_initialized():
            # Without MPI (torchrun), the world's ranks meet through the default group's store.
            _b.start(_world.StoreAdapter(store), place=(rank, size))
        # A group of some of the ranks runs on a process set of its own (its own runtime).
        self._process_set = process_set
        runtime = _b.runtime(process_set)
        if runtime.rank() != rank or runtime.size() != size:
            raise ValueError(f"backend gradcomp: torch.distributed says rank {rank} of {size}, but gradcomp's world "
                             f"says rank {runtime.rank()} of {runtime.size()}: under gcrun or mpirun, let RANK and "
                             "WORLD_SIZE come from MPI; under torchrun, from torchrun")
        # send / recv: messages of the group's own that no runtime negotiates (MPI's, or in a world
        # without MPI TCP connections of their own), bounded by the group's timeout (torch's
        # default for gloo: 30 minutes).
        self._timeout = timeout.total_seconds() if timeout is not None else 1800.0
        if _b.started_through_store():
            self._p2p = _core.TcpPointToPoint(_world.StoreAdapter(store), rank, size, "gradcomp/p2p",
                                              _world.DEFAULT_TIMEOUT_SECONDS)
        else:
            self._p2p = _core.PointToPoint(process_set.ranks if process_set is not None else [],
                                           _b.group_tag(process_set.ranks) if process_set is not None else 0)
        self._p2p_live = []  # messages not done yet (_coalesce)
        self._seq = 0
        if process_set is not None:
            self._prefix = "c10d"  # alone on its runtime
        else:
            # Operation names are unique across the world's groups: every rank creates them in
            # the same order (torch's rule for new_group), so the n-th has the same prefix everywhere.
            global _groups_created
            self._prefix = "c10d" if _groups_created == 0 else f"c10d.group{_groups_created}"
            _groups_created += 1
        self._seq_lock = threading.Lock()  # hooks may issue collectives from callback threads
        self._retained = collections.deque()  # Works kept alive for C++ callers (_retain)
        # What the settings ask that c10d's unnamed collectives cannot keep across steps: said at
        # the first collective it concerns (an FSDP2 model given compress_fsdp names its own).
        self._unkeyed = []
        spec, self._min_size = _b.runtime().default_compression()
        if spec["codec"] == "auto":
            self._unkeyed.append("GRADCOMP_COMPRESSION=auto chooses per tensor from measurements across steps, which "
                                 "c10d's unnamed collectives cannot key; the backend's all_reduce uses its reference, "
                                 "maxmin with GRADCOMP_BITS (DistributedOptimizer and compress_fsdp apply auto)")
            spec["codec"] = "maxmin"
        if _b.codec_info()[spec["codec"]]["sparse"]:
            self._unkeyed.append("GRADCOMP_COMPRESSION=topk needs a per-tensor accumulator across steps, which c10d's "
                                 "unnamed collectives cannot key; the backend's all_reduce stays exact (use "
                                 "DistributedOptimizer(compression=Compression.topk(...)) for DGC)")
            spec = {"codec": "none"}
        if spec.get("error_feedback"):
            self._unkeyed.append("GRADCOMP_ERROR_FEEDBACK=1 is ignored by the torch.distributed backend's collectives, "
                                 "which c10d does not name; compress_fsdp (FSDP2), ddp_hook and DistributedOptimizer "
                                 "keep a residual per module or tensor")
            spec["error_feedback"] = False
        self._compress = spec if spec["codec"] != "none" else None
        # A group within one node of a world of several (HSDP's shard groups, a node's ranks of
        # a DeviceMesh) stays exact: compression pays on the links between nodes only.
        self._within_node = process_set is not None and runtime.cross_size() == 1 < _b.cross_size()
        # Completes each Work's future as soon as its operations finish (DDP waits on futures).
        self._completer = queue.Queue()
        self._resolvers = set()  # threads resolving futures now
        self._resolvers_lock = threading.Lock()
        self._completer_thread = threading.Thread(target=self._complete_in_order, name="gradcomp-c10d-completer",
                                                  daemon=True)
        self._completer_thread.start()
        _live_groups.add(self)

    def _complete_in_order(self):
        """Waits for the operations in submission order. Each future is resolved on a fresh
        thread: future callbacks (DDP comm hooks such as PowerSGD's) may issue collectives and
        wait for them, which needs this thread free."""
        while True:
            pending = self._completer.get()
            if pending is None:
                return
            error = pending.complete()
            thread = threading.Thread(target=self._resolve, args=(pending, error), name="gradcomp-c10d-future",
                                      daemon=True)
            with self._resolvers_lock:
                self._resolvers.add(thread)
            thread.start()

    def _resolve(self, pending, error):
        try:
            pending.resolve(error)
        finally:
            with self._resolvers_lock:
                self._resolvers.discard(threading.current_thread())

    def _drain(self, timeout):
        """At interpreter exit: lets the completer and the resolvers finish what they are doing.
        Left running, a daemon thread inside torch when the interpreter finalizes aborts the
        process (it is stopped while torch holds a catch-all frame): this happened when a
        script exited on a collective's error while other futures were being failed."""
        self._completer.put(None)
        deadline = time.monotonic() + timeout
        self._completer_thread.join(max(0.0, deadline - time.monotonic()))
        with self._resolvers_lock:
            resolvers = list(self._resolvers)
        for thread in resolvers:
            thread.join(max(0.0, deadline - time.monotonic()))

    # torch 2's DeviceMesh (and with it fully_shard) reads every group's name, which a C++
    # ProcessGroup keeps in its C++ backend; a ProcessGroup written in Python has none, so its
    # name, set by torch when it creates the group, is kept here.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def process_set(self):
        """The gradcomp process set this group runs on (None: the world's runtime), for
        hvd.stats(process_set) and hvd.compression_choices(process_set)."""
        return self._process_set

    @property
    def group_name(self):
        return getattr(self, "_group_name", self._prefix)

    def getBackendName(self):
        return "gradcomp"

    def name(self):
        return "gradcomp"

    def _name(self, kind):
        """The operation's sequence number in this group: the same on every rank as long as
        every rank issues its collectives in the same order, as c10d requires (a hook that
        issues them from callbacks can break that; ddp_hook issues them from its caller)."""
        with self._seq_lock:
            self._seq += 1
            return f"{self._prefix}.{kind}.{self._seq}"

    def _work(self, handles, finish, result):
        pending = _Pending(handles, finish, result)
        self._completer.put(pending)
        work = _Work(pending)
        self._retain(work)
        return work

    # How long a Work is kept after its operation ends. torch 1.13's trampoline keeps no
    # reference to the Python object it hands to C++ (torch 2's PyWorkHolder does): without
    # this, a C++ caller would find a bare Work, whose get_future() throws and whose wait()
    # never returns (DDP hung so). Its C++ callers (DDP's Reducer, _broadcast_coalesced, DDP's
    # checks of the parameters) call them before they issue their next operation. A Work that
    # has ended goes once it is _RETAIN_SECONDS old or _RETAIN_COUNT newer ones were issued,
    # so a loop of large temporary tensors does not keep many of them alive.
    _RETAIN_SECONDS = 5.0
    _RETAIN_COUNT = 64

    def _retain(self, work):
        """Keeps `work` and lets go of the ended Works that are old enough (they end in the
        order they were issued)."""
        now = time.monotonic()
        with self._seq_lock:
            self._retained.append(work)
            while self._retained:
                ended = self._retained[0]._pending.resolved_at
                if ended is None or (now - ended < self._RETAIN_SECONDS
                                     and len(self._retained) <= self._RETAIN_COUNT):
                    break
                self._retained.popleft()

    @staticmethod
    def _single(tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"backend gradcomp: {what} takes one tensor per process, got {len(tensors)}")
        return tensors[0]

    def _reduction_spec(self, t, op, compress=None):
        """The compression of a reduction of `t` (all_reduce, reduce_scatter): `compress` (an
        FSDP2 module's) or the settings' codec, for float tensors of at least GRADCOMP_MIN_SIZE
        elements under Sum or Average, one dimension or several (CGX semantics: flat buffers,
        DDP's buckets and FSDP's flat parameters, are compressed too), outside a group within
        one node; exact otherwise (None: the runtime's own rule)."""
        eligible = not self._within_node and t.dtype in _FLOATS and op in (Sum, Average) and t.numel() >= self._min_size
        if compress is None and eligible and self._unkeyed:
            for message in self._unkeyed:
                warnings.warn(f"backend gradcomp: {message}")
            self._unkeyed = []
        compress = self._compress if compress is None else compress
        if compress is not None and eligible:
            return compress
        return {"codec": "none"} if t.dtype.is_floating_point else None

    def _allreduce_one(self, t, opts, kind):
        op, prescale = _opts_op(opts)
        module = _module_buffer(t)  # an FSDP2 module's gradient across its replicas, under its name
        name, compress = (self._name(kind), None) if module is None else (f"{module[0]}.replicas", module[1])
        return mpi_ops.allreduce_async_(t, name=name, op=op, prescale_factor=prescale,
                                        compression=self._reduction_spec(t, op, compress), process_set=self._process_set)

    def allreduce(self, tensors, opts=None):
        t = self._single(tensors, "allreduce")
        return self._work([self._allreduce_one(t, opts, "allreduce")], None, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """Each tensor reduced as all_reduce reduces it (the runtime fuses those ready together)."""
        return self._work([self._allreduce_one(t, opts, "allreduce_coalesced") for t in tensors], None, tensors)

    def broadcast(self, tensors, opts=None):
        t = self._single(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0  # the group's rank; mpi_ops takes the world's
        if self._process_set is not None:
            root = self._process_set.ranks[root]
        h = mpi_ops.broadcast_async_(t, root, self._name("broadcast"), self._process_set)
        return self._work([h], None, tensors)

    def _allgather_flat(self, t, output=None):
        """Every rank's `t` as a row: GRADCOMP_ALLGATHER_COMPRESSION applies to rows of at least
        GRADCOMP_MIN_SIZE float values (FSDP's flat parameter shards), decoded alike on every rank
        (into `output`, where one is given, as mpi_ops.allgather_async's `output`)."""
        return mpi_ops.allgather_async(t.reshape(1, -1) if t.dim() == 0 else t.reshape(1, *t.shape),
                                       self._name("allgather"), self._process_set, output=output,
                                       compression={"codec": "none"} if self._within_node else None)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = self._single(input_tensors, "allgather")
        outs = self._single(output_tensors, "allgather")
        h = self._allgather_flat(t)

        def finish():
            # A rank's wrong outputs are its error alone, after the exchange (the others go on).
            self._copy_rows(outs, _b.synchronize(h), f"allgather needs {self.size()} output tensors",
                            lambda r, has, sent: f"allgather output {r} has {has} elements, the input {sent}")

        return self._work([], finish, output_tensors)

    def _copy_rows(self, outs, rows, count_error, size_error):
        """outs[r] = rows[r], once there are as many outputs as ranks and each holds its row's
        elements; the errors say `count_error`, or `size_error(r, output's, row's elements)`."""
        if len(outs) != self.size():
            raise ValueError(f"backend gradcomp: {count_error}, got {len(outs)}")
        for r, out in enumerate(outs):
            if out.numel() != rows[r].numel():
                raise ValueError(f"backend gradcomp: {size_error(r, out.numel(), rows[r].numel())}")
            with torch.no_grad():
                out.copy_(rows[r].reshape(out.shape))

    @staticmethod
    def _fail_on_every_rank(h, problem):
        """The end of an operation this rank sent rows of the wrong width to on purpose: waits
        out the shape mismatch that fails it everywhere, then raises this rank's own reason."""
        with contextlib.suppress(Exception):
            _b.synchronize(h)
        raise ValueError(f"backend gradcomp: {problem}")

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][i] = rank r's input_list[i]: one allgather per input."""
        handles = [self._allgather_flat(t) for t in input_list]

        def finish():
            if len(output_lists) != self.size():
                raise ValueError(f"backend gradcomp: allgather_coalesced needs {self.size()} output lists, got "
                                 f"{len(output_lists)}")
            for r, outs in enumerate(output_lists):
                if len(outs) != len(input_list):
                    raise ValueError(f"backend gradcomp: allgather_coalesced output list {r} has {len(outs)} tensors, "
                                     f"the input list {len(input_list)}")
            for i, h in enumerate(handles):
                self._copy_rows([outs[i] for outs in output_lists], _b.synchronize(h), "",
                                lambda r, has, sent, i=i: f"allgather_coalesced output {r}[{i}] has {has} elements, "
                                                          f"rank {r}'s input {i} {sent}")

        return self._work([], finish, output_lists)

    def _allgather_base(self, output, input, opts=None):
        """all_gather_into_tensor: decoded straight into FSDP's unsharded parameter where it can
        be (a contiguous host tensor apart from the input), else copied in."""
        h = self._allgather_flat(input, output)
        return self._work([h], None, [output])

    def _allgather_coalesced_tensors(self, outputs, inputs, opts=None):
        """all_gather_into_tensor of several tensors in one Work (torch's coalescing manager)."""
        if len(outputs) != len(inputs):
            raise ValueError(f"backend gradcomp: a coalesced all_gather_into_tensor has {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        return self._work([self._allgather_flat(i, o) for o, i in zip(outputs, inputs)], None, list(outputs))

    def _reduce_scatter_parts(self, output, flat, opts, problem=None, name=None, compress=None):
        """The handles of one reduce-scatter into `output` and what to run once they end (under
        `name` and with `compress`, an FSDP2 module's, where given)."""
        op, prescale = _opts_op(opts)
        if problem is None and flat.numel() != output.numel() * self.size():
            problem = f"reduce_scatter input has {flat.numel()} elements, expected {self.size()} x {output.numel()}"
        if problem is not None:
            # Rows one value wider than every rank's output: the operation fails on every rank
            # (a shape mismatch naming this rank's rows) instead of leaving the others waiting.
            flat = output.detach().new_zeros(self.size() * (output.numel() + 1))
        spec = self._reduction_spec(flat, op, compress)
        if name is None and spec is not None and spec.get("codec", "none") != "none" and not _warned_fsdp2:
            _warn_if_fsdp2(spec["codec"])
        h = mpi_ops.reducescatter_async(flat.reshape(self.size(), -1), op=op, prescale_factor=prescale,
                                        name=name or self._name("reduce_scatter"), process_set=self._process_set,
                                        compression=spec, output=output if problem is None else None)
        if problem is None:
            return [h], None  # the shard lands in `output` (mpi_ops)
        return [], lambda: self._fail_on_every_rank(h, problem)

    def _reduce_scatter_flat(self, output, flat, opts, problem=None, name=None, compress=None):
        handles, finish = self._reduce_scatter_parts(output, flat, opts, problem, name, compress)
        return self._work(handles, finish, [output])

    def reduce_scatter_module(self, output, input, op, name, compress):
        """reduce_scatter_tensor of an FSDP2 module's gradients (gradcomp.torch.fsdp2) under the
        module's `name` (the key of its error feedback and of auto's choices) with its compression
        `compress`."""
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        return self._reduce_scatter_flat(output, input.detach().reshape(-1).contiguous(), opts, None, name, compress)

    def all_gather_module(self, output, input, name, compress):
        """all_gather_into_tensor of an FSDP2 module's weights under `name`, with `compress` (None:
        GRADCOMP_ALLGATHER_COMPRESSION through the layer filter) for float shards of at least
        GRADCOMP_MIN_SIZE elements outside a group within one node."""
        if self._within_node or (compress is not None and (input.dtype not in _FLOATS
                                                           or input.numel() < self._min_size)):
            compress = {"codec": "none"}
        h = mpi_ops.allgather_async(input.reshape(1, -1), name, self._process_set, output=output, compression=compress)
        return self._work([h], None, [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._single(output_tensors, "reduce_scatter")
        ins = self._single(input_tensors, "reduce_scatter")
        problem = None
        if len(ins) != self.size():
            problem = f"reduce_scatter needs {self.size()} input tensors, got {len(ins)}"
        flat = torch.cat([x.detach().reshape(-1) for x in ins])
        return self._reduce_scatter_flat(out, flat, opts, problem)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._reduce_scatter_flat(output, input.detach().reshape(-1).contiguous(), opts)

    def _reduce_scatter_coalesced_tensors(self, outputs, inputs, opts=None):
        """reduce_scatter_tensor of several tensors in one Work (torch's coalescing manager)."""
        if len(outputs) != len(inputs):
            raise ValueError(f"backend gradcomp: a coalesced reduce_scatter_tensor has {len(outputs)} outputs for "
                             f"{len(inputs)} inputs")
        parts = [self._reduce_scatter_parts(o, i.detach().reshape(-1).contiguous(), opts)
                 for o, i in zip(outputs, inputs)]

        def finish():
            for _, part_finish in parts:
                if part_finish is not None:
                    part_finish()

        return self._work([h for handles, _ in parts for h in handles], finish, list(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        splits = list(input_split_sizes) if input_split_sizes else None
        h = mpi_ops.alltoall_async(input, splits, self._name("alltoall"), self._process_set)

        def finish():
            received, _ = _b.synchronize(h)
            if received.numel() != output.numel():
                raise ValueError(f"backend gradcomp: alltoall received {received.numel()} elements, the output "
                                 f"holds {output.numel()}")
            with torch.no_grad():
                output.copy_(received.reshape(output.shape))

        return self._work([], finish, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """input_tensors[p] to rank p, into its output_tensors[me]: the tensors flattened into one
        alltoall of single values (any shapes; the sizes each pair agrees on)."""
        me, n = self.rank(), self.size()
        problem = None
        if len(input_tensors) != n:
            problem = f"alltoall needs {n} input tensors, got {len(input_tensors)}"
        elif len(output_tensors) != n:
            problem = f"alltoall needs {n} output tensors, got {len(output_tensors)}"
        elif len({t.dtype for t in list(input_tensors) + list(output_tensors)}) != 1:
            problem = (f"alltoall tensors must share one dtype, got inputs "
                       f"{[str(t.dtype) for t in input_tensors]} and outputs {[str(t.dtype) for t in output_tensors]}")
        if problem is None:
            flat = torch.cat([t.detach().reshape(-1) for t in input_tensors])
            splits = [t.numel() for t in input_tensors]
        else:
            # Nothing sent: every rank expecting values from this one fails on their count; this
            # rank raises its own reason.
            like = (list(input_tensors) + list(output_tensors) + [torch.empty(0)])[0]
            flat, splits = like.detach().new_empty(0), [0] * n
        h = mpi_ops.alltoall_async(flat, splits, self._name("alltoall"), self._process_set)

        def finish():
            if problem is not None:
                with contextlib.suppress(Exception):
                    _b.synchronize(h)
                raise ValueError(f"backend gradcomp: {problem}")
            received, counts = _b.synchronize(h)
            for p, (out, count) in enumerate(zip(output_tensors, counts.tolist())):
                if out.numel() != count:
                    raise ValueError(f"backend gradcomp: alltoall output {p} on rank {me} holds {out.numel()} "
                                     f"elements, rank {p} sent {count}")
            with torch.no_grad():
                for out, part in zip(output_tensors, received.split(counts.tolist())):
                    out.copy_(part.reshape(out.shape))

        return self._work([], finish, output_tensors)

    def reduce(self, tensors, opts=None):
        """The reduction lands on the root only; the other ranks' tensors are left as they were.
        An exact allreduce (of a copy off the root): 2(n-1)/n of the tensor a rank on every
        link, against a direct reduce's n-1 tensors into the root's link. Used for losses and
        metrics; DDP never calls it."""
        t = self._single(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        op, prescale = _opts_op(opts)
        target = t if self.rank() == root else t.detach().clone()
        h = mpi_ops.allreduce_async_(target, name=self._name("reduce"), op=op, prescale_factor=prescale,
                                     compression={"codec": "none"} if t.dtype.is_floating_point else None,
                                     process_set=self._process_set)
        return self._work([h], None, tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        """Every rank's tensor to the root only: an alltoall in which each rank sends its tensor
        as one row to the root and nothing to the others."""
        t = self._single(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        me, n = self.rank(), self.size()
        outs = self._single(output_tensors, "gather") if me == root else []
        splits = [int(p == root) for p in range(n)]
        h = mpi_ops.alltoall_async(t.detach().reshape(1, -1).contiguous(), splits, self._name("gather"),
                                   self._process_set)

        def finish():
            # The root's own mistakes are its error alone (the others' tensors went through).
            received, _ = _b.synchronize(h)
            if me == root:
                self._copy_rows(outs, received, f"gather needs {n} output tensors on the root",
                                lambda r, has, sent: f"gather output {r} has {has} elements, rank {r} sent {sent}")

        return self._work([], finish, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """The root's tensor r to rank r: an alltoall in which only the root sends, one row to
        each rank."""
        out = self._single(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        me, n = self.rank(), self.size()
        problem = None
        if me == root:
            ins = self._single(input_tensors, "scatter")
            if len(ins) != n:
                problem = f"scatter needs {n} input tensors on the root, got {len(ins)}"
            else:
                problem = next((f"scatter input {r} has {x.numel()} elements, the root's output {out.numel()}"
                                for r, x in enumerate(ins) if x.numel() != out.numel()), None)
        if me != root:
            rows, splits = out.detach().new_empty((0, out.numel())), [0] * n
        elif problem is None:
            rows, splits = torch.stack([x.detach().reshape(-1) for x in ins]), [1] * n
        else:
            # Rows one value wider than every rank's output: the operation fails on every rank
            # (a shape mismatch naming the root's rows) instead of leaving the others waiting.
            rows, splits = out.detach().new_zeros((n, out.numel() + 1)), [1] * n
        h = mpi_ops.alltoall_async(rows, splits, self._name("scatter"), self._process_set)

        def finish():
            if problem is not None:
                self._fail_on_every_rank(h, problem)
            received, _ = _b.synchronize(h)
            if received.numel() != out.numel():
                raise ValueError(f"backend gradcomp: scatter output on rank {me} has {out.numel()} elements, the "
                                 f"root (rank {root}) sent {received.numel()}")
            with torch.no_grad():
                out.copy_(received.reshape(out.shape))

        return self._work([], finish, output_tensors)

    def _p2p_post(self, tensors, peer, tag, what, send):
        t = self._single(tensors, what)
        if not 0 <= tag <= self._p2p.max_tag():
            raise ValueError(f"backend gradcomp: {what} tag {tag} is outside 0..{self._p2p.max_tag()} (the largest "
                             "tag of the group's messages: MPI_TAG_UB under MPI)")
        direct = t.device.type == "cpu" and t.is_contiguous()
        if send:
            buffer = t.detach() if direct else t.detach().contiguous().cpu()
            request = self._p2p.send(buffer.data_ptr(), buffer.numel() * buffer.element_size(), peer, tag)
            return self._coalesce(_P2pWork(request, f"{what} to rank {peer} (tag {tag})", self._timeout, buffer,
                                           None))
        buffer = t.detach() if direct else torch.empty(t.shape, dtype=t.dtype)
        request = self._p2p.recv(buffer.data_ptr(), buffer.numel() * buffer.element_size(), peer, tag)
        source = "any rank" if peer < 0 else f"rank {peer}"

        def finish():
            if not direct:
                with torch.no_grad():
                    t.copy_(buffer)

        return self._coalesce(_P2pWork(request, f"{what} from {source} (tag {tag})", self._timeout, buffer, finish))

    # torch 2's batch_isend_irecv of GPU tensors brackets the messages with these and waits on
    # the Work _end_coalescing returns (NCCL's group calls); the messages were posted already.
    def _start_coalescing(self, device=None):
        del device
        self._coalesced = []

    def _end_coalescing(self, device=None):
        del device
        works, self._coalesced = getattr(self, "_coalesced", None), None
        if works is None:
            raise RuntimeError("backend gradcomp: _end_coalescing without _start_coalescing")
        return _Works(works)

    def _coalesce(self, work):
        """Keeps `work` (and so its buffer) until its message is done, waited for or not (an
        isend whose Work is dropped must not free the tensor MPI reads), and in the batch."""
        self._p2p_live = [w for w in self._p2p_live if not w.is_completed()] + [work]
        if getattr(self, "_coalesced", None) is not None:
            self._coalesced.append(work)
        return work

    def send(self, tensors, dstRank, tag):
        return self._p2p_post(tensors, dstRank, tag, "send", True)

    def recv(self, tensors, srcRank, tag):
        return self._p2p_post(tensors, srcRank, tag, "recv", False)

    def recv_anysource(self, tensors, tag):
        return self._p2p_post(tensors, -1, tag, "recv", False)

    def barrier(self, opts=None):
        mpi_ops.barrier(self._process_set)
        return self._work([], None, [])

    # torch 2.13's c10d calls the one-tensor and coalesced collectives by these names (torch 2.x
    # before it by the names above).
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced = _allgather_coalesced_tensors
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced = _reduce_scatter_coalesced_tensors


# DDP calls these from its forward, which torch.compile traces: they run as gloo's C++ would.
compat.run_untraced(ProcessGroupGradcomp, [
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "allgather_coalesced", "_allgather_base",
    "reduce_scatter", "_reduce_scatter_base", "alltoall_base", "alltoall", "reduce", "gather", "scatter", "send",
    "recv", "recv_anysource", "barrier", "_start_coalescing", "_end_coalescing", "all_gather_single",
    "reduce_scatter_single", "all_to_all_single", "all_gather_single_coalesced", "allgather_into_tensor_coalesced",
    "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", "reduce_scatter_module",
    "all_gather_module"])


def _create(store, rank, size, timeout):
    running = _b.is_initialized()
    group_join.meet(store, rank, size, timeout, lambda: not running or _b.is_initialized())
    if dist.is_initialized() and _b.is_initialized() and size != _b.size():
        # dist.new_group of some of the ranks (the default group is made before is_initialized):
        # torch creates it on its members only, which learn each other's world ranks through
        # the group's store, then start a runtime among themselves.
        store.set(f"gradcomp.world_rank.{rank}", str(_b.rank()))
        ranks = [int(store.get(f"gradcomp.world_rank.{r}")) for r in range(size)]
        if ranks != sorted(ranks) or ranks[rank] != _b.rank():
            raise ValueError(f"backend gradcomp: a group's ranks {ranks} are not in world rank order")
        return ProcessGroupGradcomp(store, rank, size, timeout,
                                    _b.members_only_process_set(ranks, _world.StoreAdapter(store)))
    return ProcessGroupGradcomp(store, rank, size, timeout)


def register():
    """Registers backend "gradcomp" with torch.distributed (done on importing gradcomp.torch)."""
    if "GRADCOMP" not in getattr(dist.Backend, "_plugins", {}) and not hasattr(dist.Backend, "GRADCOMP"):
        # Host tensors and CUDA tensors both, in every collective.
        compat.register_backend("gradcomp", _create, devices=["cpu", "cuda"])
