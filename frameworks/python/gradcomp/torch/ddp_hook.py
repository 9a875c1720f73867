"""A DDP communication hook that compresses per layer inside DDP's buckets (as CGX's cgx_hook).

    from gradcomp.torch import DDPHookState, ddp_hook
    state = DDPHookState(dist.group.WORLD, layer_min_size=1024,
                         compression_params={"bits": 4, "bucket_size": 512})
    model.register_comm_hook(state, ddp_hook)

DDP hands the hook flat buckets holding several layers. The hook max-min quantizes each layer
of at least `layer_min_size` elements and two or more dimensions on its own (so buckets never
mix layers' ranges) and leaves the other layers (biases, norms, small layers) exact. It works
with any backend that has all_to_all and all_gather (gloo, nccl, mpi, gradcomp): the compressed
layers go through scatter-reduce-allgather as in the runtime (each value quantized twice,
whatever the number of ranks, reduced in float32; every rank ends with the same values, and
each rank sends about 2 (n-1)/n of the compressed size, like a ring allreduce of it), the exact
layers through one all_reduce.

Collective order. Scatter-reduce-allgather is two collectives with computation between them,
and backends match collectives by the order in which each rank issues them. Issuing the second
one from a future callback (as PowerSGD's hook does) lets its place in that order depend on
timing: with several buckets in flight, one rank's all_gather of bucket 0 meets another's
all_to_all of bucket 1, which hangs gloo and makes sequence-numbered backends mix buckets up.
So every collective is issued by the thread that calls the hook, in an order fixed by the
bucket order alone (DDP launches buckets in index order on every rank):

    hook(bucket k):  all_reduce(k, exact layers), all_to_all(k)      # phase 1 of k
                     all_gather(k - 1)                               # phase 2 of k - 1
    hook(last):      ... then all_gather(last)

Between its two phases a bucket's chunk is reduced in a callback of its all_to_all (computation
only, no collective), so the hook of bucket k waits only for what bucket k - 1 already had
the whole backward of bucket k's layers to finish. Callbacks never issue or wait for
collectives; every bucket owns its buffers.

Node rows. On several nodes of several ranks each, a flat exchange sends each rank's chunks for
the other nodes across the node's link: (ranks per node) times what the node needs. With node
rows (the default there, DDPHookState's node_rows) a bucket goes through four stages: the
node's all_to_all (each rank's chunk of the node's sum), an all_to_all and an all_gather
across the nodes among the ranks with the same place in their node (the compressed
allreduce of that chunk, one rank per node), and the node's all_gather of the result's
encodings as they are, so the bytes that cross a node's link are those of one flat exchange
of a 1/(ranks per node) share. The hook of bucket k issues stage s of bucket k - s, oldest
first, each from the thread that calls the hook; the stage waits for the one before it of
the same bucket only (issued by an earlier hook), so the order stays fixed by the buckets.

Where the work runs. Encoding, the float32 reduction and decoding work on the bucket's own
memory through gradcomp's device layer (`_core.codec_encode_at` / `codec_decode_at`, ordered on
torch's current stream): a GPU bucket stays on its GPU where gradcomp has its CUDA kernels (set
GRADCOMP_CUDA_DATA_PATH=0 to encode on the CPU instead), and the collectives take the bucket's
device, so only encoded bytes travel and nothing waits for the GPU on the hook's thread.

Error feedback keeps each layer's residual by parameter (DDP rebuilds its buckets after the first
step, so a bucket's index and position do not name a layer across steps). A layer whose values
(gradient plus residual) are not all finite in a step, such as a mixed-precision step that
overflowed, is sent as it is (the result shows the inf/NaN, so a loss scaler skips the step)
and keeps the residual it had before that step: one overflow does not poison later steps.
"""
import collections
import os
import socket

import torch
import torch.distributed as dist

from gradcomp import _core
from gradcomp import codec as _codec
from gradcomp.torch.futures import failing_in_cpp

_FLOATS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_CODEC = "maxmin"  # the hook quantizes as CGX's does
_COLUMN_SEED = 0x2D5A2D5A2D5A2D5A  # sra2d.cc's kColumnSeed


class DDPHookState:
    """State of ddp_hook: the process group, the layer filter and max-min parameters
    ({"bits": 1..8, "bucket_size": n, "stochastic": bool, "error_feedback": bool}).

    node_rows: None (default) reduces inside each node first when the group spans several nodes
    of two or more ranks each (equal counts, the world's ranks, backend gloo, nccl or gradcomp), flat
    otherwise; True requires it (ValueError saying why it cannot); False keeps it flat. Nodes
    are the hosts, or blocks of GRADCOMP_LOCAL_SIZE consecutive ranks where that is set."""

    def __init__(self, process_group=None, layer_min_size=1024, compression_params=None, node_rows=None):
        params = dict(compression_params or {})
        unknown = set(params) - {"bits", "bucket_size", "stochastic", "error_feedback"}
        if unknown:
            raise ValueError(f"DDPHookState: unknown compression_params {sorted(unknown)} "
                             "(bits, bucket_size, stochastic, error_feedback)")
        if node_rows not in (None, True, False):
            raise ValueError(f"DDPHookState: node_rows must be None, True or False, got {node_rows!r}")
        self.process_group = process_group
        self.node_rows = node_rows
        self.layer_min_size = int(layer_min_size)
        self.bits = int(params.get("bits", 4))
        self.bucket_size = int(params.get("bucket_size", 512))
        self.stochastic = bool(params.get("stochastic", False))
        self.error_feedback = bool(params.get("error_feedback", False))
        if not 1 <= self.bits <= 8:
            raise ValueError(f"DDPHookState: bits must be in 1..8, got {self.bits}")
        if self.bucket_size < 1:
            raise ValueError(f"DDPHookState: bucket_size must be positive, got {self.bucket_size}")
        if self.layer_min_size < 0:
            raise ValueError(f"DDPHookState: layer_min_size must be >= 0, got {self.layer_min_size}")
        self.iteration = 0  # buckets exchanged so far; keys stochastic rounding
        self.residuals = {}  # id(parameter) -> (parameter, float32 residual on the codecs' device)
        self.bytes_in = 0  # float bytes of the compressed layers
        self.bytes_on_wire = 0  # bytes this rank sent for them
        self.bytes_across_nodes = 0  # the part of those sent to ranks on other nodes
        self._grid = None  # the exchange's layout (_plan): here when torch.distributed is up, else at the first bucket
        self._nonfinite = None  # count of layers sent with non-finite values, kept where they were
        self._waiting = []  # exchanges with stages still to issue, in bucket order
        # GPU buckets are encoded and decoded on their GPU where gradcomp has its CUDA kernels
        # (and GRADCOMP_CUDA_DATA_PATH is not 0); else on the CPU.
        self._on_gpu = _core.cuda_data_path()
        if dist.is_available() and dist.is_initialized():
            self._grid = _plan(self, process_group if process_group is not None else dist.group.WORLD)

    @property
    def nonfinite_steps(self):
        """Layers sent with non-finite values (their residuals were kept). Reading it waits for
        the GPU; the hook itself never does."""
        return 0 if self._nonfinite is None else int(self._nonfinite)

    @property
    def reduces_in_nodes_first(self):
        """Whether the exchange runs node rows (known once the grid is made, see node_rows)."""
        return self._grid is not None and self._grid.node_rows

    def codec_params(self):
        return {"bits": self.bits, "bucket_size": self.bucket_size, "stochastic": self.stochastic}

    def compresses(self, param, grad):
        return (grad.dtype in _FLOATS and param.dim() >= 2 and grad.numel() >= self.layer_min_size)

    def residual(self, param):
        """The error-feedback residual kept for `param` (a flat float32 tensor), or None."""
        kept = self.residuals.get(id(param))
        return kept[1] if kept is not None and kept[0] is param else None

    def _keep_residual(self, param, residual, finite):
        """Keeps `residual` where `finite` (a bool tensor) holds, else the one from before; decided
        on the residual's device so the hook never waits for a GPU."""
        before = self.residual(param)
        if before is None or before.shape != residual.shape or before.device != residual.device:
            before = torch.zeros_like(residual)
        self.residuals[id(param)] = (param, torch.where(finite, residual, before))
        lost = (~finite).to(torch.int64)
        self._nonfinite = lost if self._nonfinite is None else self._nonfinite + lost.to(self._nonfinite.device)

    def _codec_device(self, buffer):
        return buffer.device if buffer.device.type == "cpu" or self._on_gpu else torch.device("cpu")


def _chunks(n, world):
    """(start, length) of each rank's chunk of n values: the runtime SRA's split."""
    out, at = [], 0
    for length in _core.even_split(n, world):
        out.append((at, length))
        at += length
    return out


def _where(tensor):
    """(device, stream) of a tensor for the codec bindings: -1 for host memory, else its GPU and
    the current stream there (the codec kernels are ordered after the work that produced it)."""
    if tensor.is_cuda:
        return tensor.device.index, torch.cuda.current_stream(tensor.device).cuda_stream
    return -1, 0


def _encode_into(values, out, first_index, params):
    """Encodes float32 `values` into the uint8 tensor `out` on their device; returns its bytes."""
    device, stream = _where(values)
    return _core.codec_encode_at(values.data_ptr(), "float32", values.numel(), out.data_ptr(), out.numel(), _CODEC,
                                 first_index, device=device, stream=stream, **params)


def _decode_from(wire, out, params, accumulate=False):
    """Decodes (or decode-accumulates) the uint8 tensor `wire` into `out` on their device."""
    device, stream = _where(out)
    _core.codec_decode_at(wire.data_ptr(), wire.numel(), out.numel(), out.data_ptr(), _FLOATS[out.dtype], _CODEC,
                          accumulate, device=device, stream=stream, **params)


class _Grid:
    """How a bucket's exchange is laid out over the hook's group: rows of ranks that reduce among
    themselves first, and columns across the rows.

    Flat (the default on one node, or with node_rows=False): one row, the whole group. Node
    rows (several nodes of equal rank counts): a row is a node; the ranks with the same
    position in their node form a column, one rank per node."""

    def __init__(self, group, nodes, node_rows):
        self.group = group
        self.size, self.me = len(nodes), dist.get_rank(group)
        self.nodes = nodes  # node of each rank of the group
        if not node_rows:
            self.row_group, self.column_group = group, None
            self.row_ranks = list(range(self.size))
            self.columns = [[r] for r in self.row_ranks]  # columns[j]: the ranks at row position j
            self.me_row, self.me_column = self.me, 0
            return
        members = {}
        for rank, node in enumerate(nodes):
            members.setdefault(node, []).append(rank)
        rows = list(members.values())  # in the order of their first ranks
        backend = dist.get_backend(group)
        # Every rank creates every group, in the same order (torch's rule for new_group); each
        # group's own rank order is its sorted ranks.
        row_groups = [dist.new_group(ranks, backend=backend) for ranks in rows]
        self.columns = [sorted(row[j] for row in rows) for j in range(len(rows[0]))]
        column_groups = [dist.new_group(ranks, backend=backend) for ranks in self.columns]
        mine = next(i for i, ranks in enumerate(rows) if self.me in ranks)
        self.row_ranks = rows[mine]
        self.me_row = self.row_ranks.index(self.me)
        self.me_column = self.columns[self.me_row].index(self.me)
        self.row_group, self.column_group = row_groups[mine], column_groups[self.me_row]

    @property
    def node_rows(self):
        return self.column_group is not None


def _node_of_each_rank(group):
    """The node of each rank of `group`: blocks of GRADCOMP_LOCAL_SIZE consecutive ranks where it
    is set (as in the runtime, which tests use to make nodes on one machine), else the hosts."""
    size = dist.get_world_size(group)
    # DDPHookState's constructor has parsed every setting already (_core.cuda_data_path reads
    # them all and names a bad value), so this is an integer in range.
    local = int(os.environ.get("GRADCOMP_LOCAL_SIZE") or 0)
    if local and size % local:
        raise ValueError(f"ddp_hook: GRADCOMP_LOCAL_SIZE={local} does not divide the process group's {size} ranks")
    if local:
        return [r // local for r in range(size)]
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    first = {}
    return [first.setdefault(host, len(first)) for host in hosts]


def _plan(state, group):
    """The grid `state` exchanges on over `group` (decided alike on every rank)."""
    nodes = _node_of_each_rank(group)
    counts = sorted(collections.Counter(nodes).values())
    backend = dist.get_backend(group)
    why_not = None
    if len(counts) < 2:
        why_not = "the process group is on one node"
    elif counts[0] != counts[-1]:
        why_not = f"its nodes hold different numbers of ranks ({counts})"
    elif counts[0] < 2:
        why_not = "every node holds one rank"
    elif len(nodes) != dist.get_world_size():
        why_not = "the process group does not span the world (new_group needs the world's ranks)"
    elif backend not in ("gloo", "nccl", "gradcomp"):
        why_not = f"its backend '{backend}' has no subgroups (gloo, nccl and gradcomp have)"
    if state.node_rows and why_not is not None:
        raise ValueError(f"DDPHookState(node_rows=True): {why_not}")
    return _Grid(group, nodes, state.node_rows is not False and why_not is None)


class _Layer:
    """A compressed layer of a bucket: where it lies in the bucket buffer, its values to send
    (float32, error-compensated), its chunk per row rank with each chunk's encoded size, and
    each row chunk's cells (its parts per column) with theirs."""

    def __init__(self, param, offset, values, grid, params):
        self.param, self.offset, self.values = param, offset, values
        self.chunks = _chunks(values.numel(), len(grid.row_ranks))
        self.sizes = [_codec.wire_size(length, _CODEC, **params) for _, length in self.chunks]
        columns = len(grid.columns[0])
        self.cells = [[(start + s, n) for s, n in _chunks(length, columns)] for start, length in self.chunks]
        self.cell_sizes = [[_codec.wire_size(n, _CODEC, **params) for _, n in row] for row in self.cells]


class _Exchange:
    """One bucket's scatter-reduce-allgather, from its hook call until DDP gets the result, as a
    sequence of stages that the hook issues one at a time (each stage's collectives on the
    hook's thread; each stage waits only for the one before it).

    Flat (one row): scatter the row (the exact layers' all_reduce and the encoded chunks' all_to_all;
    its callback reduces this rank's chunk, averages and encodes it), gather the row (all_gather;
    its callback decodes every chunk into the bucket buffer and completes `future`).

    Node rows: scatter the row as above, but the callback keeps the node's sum of this rank's
    chunk; scatter the column (that sum's cells encoded for each node's rank at this row
    position, all_to_all across the nodes; the callback sums this rank's cell, averages and
    encodes it once); gather the column (all_gather: every node's rank at this position now
    holds the encodings of the whole row chunk); gather the row (all_gather of those
    encodings as they are, decoded into the bucket). Each value is quantized three times (the
    rank's contribution, its node's sum, the average) and every rank decodes the same bytes; a
    node's link carries 1/(ranks per node) of what the flat exchange sends across it.

    The codecs work in the bucket's memory (on its GPU for a GPU bucket, see DDPHookState);
    the collectives take the bucket's device, so nothing crosses to the host on the way.

    Why this is not the runtime's compressed reduce-scatter and allgather (ops/collectives/
    compressed_shards.h): the hook exists for DDP on another backend (gloo, nccl, mpi), and its
    collectives must be that process group's, issued on the hook's thread in bucket order; the
    runtime's run on gradcomp's own world, negotiated by its background thread, so they would
    take the exchange off the group the user chose. DDP on backend gradcomp runs the runtime's
    collectives instead. The codec steps are the runtime's: the same chunking (`_core.even_split`),
    rounding streams (`_core.sra_stream_seeds`), encode and decode kernels (`_core.codec_*_at`)
    and float32 sums in rank order; unlike the runtime's scatter-reduce (ScatterHalf::Reduce,
    sra_halves.h), which starts from this rank's own values, the hook sums every rank's
    encoding, its own too, as its all_to_all delivers them."""

    def __init__(self, state, bucket, grid):
        self.state, self.grid = state, grid
        self.step = state.iteration
        state.iteration += 1
        self.params = state.codec_params()
        self.buffer = bucket.buffer()
        self.flat = self.buffer.view(-1)
        self.device = self.buffer.device  # where the collectives run
        self.work = state._codec_device(self.buffer)  # where the codecs run
        self.layers, self.exact = [], []
        offset = 0
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            n = grad.numel()
            if state.compresses(param, grad):
                values = grad.detach().reshape(-1).to(device=self.work, dtype=torch.float32)
                if state.error_feedback:
                    r = state.residual(param)
                    if r is not None and r.shape == values.shape and r.device == values.device:
                        values = values + r
                self.layers.append(_Layer(param, offset, values, grid, self.params))
                state.bytes_in += n * grad.element_size()
            else:
                self.exact.append((offset, n))
            offset += n
        self.future = torch.futures.Future()
        self._exact = None  # (future, values) of the exact layers' all_reduce
        self._result = None  # future of what the next stage sends
        self._stages = [self._scatter_row, self._gather_row]
        if grid.node_rows:
            self._stages[1:1] = [self._scatter_column, self._gather_column]
        # Encoded bytes of row position j's blob (its cells, column by column) and the widest.
        self._blob = [sum(layer.cell_sizes[j][c] for c in range(len(grid.columns[0])) for layer in self.layers)
                      for j in range(len(grid.row_ranks))]

    @property
    def done(self):
        return not self._stages

    def advance(self):
        """Issues the next stage (on the hook's thread): the first one, or one that takes what
        the stage before it made, once that is ready."""
        stage = self._stages.pop(0)
        if self.future.done():
            return  # an earlier stage failed; DDP has its error
        if stage == self._scatter_row:
            stage()
            return
        try:
            sent = self._result.wait() if self._result is not None else None
        except Exception as e:  # noqa: BLE001 - the exchange failed; DDP gets the error
            self.future.set_exception(e)
            return
        stage(sent)

    # Rounding streams: a rank's (scatter, gather) seeds of the runtime's SRA for the row (of a
    # flat exchange, as the runtime's), and for the columns those of the seed offset by
    # sra2d.cc's kColumnSeed, as the runtime's node rows.
    def _row_params(self, rank, which):
        return dict(self.params, seed=_core.sra_stream_seeds(0, rank)[which], step=self.step)

    def _column_params(self, rank, which):
        return dict(self.params, seed=_core.sra_stream_seeds(_COLUMN_SEED, rank)[which], step=self.step)

    def _count(self, sent):
        """Counts what this rank sends: `sent` maps each peer (a rank of the group) to bytes."""
        node = self.grid.nodes[self.grid.me]
        for peer, size in sent.items():
            if peer != self.grid.me:
                self.state.bytes_on_wire += size
                self.state.bytes_across_nodes += size if self.grid.nodes[peer] != node else 0

    def _encode_for_peers(self, parts):
        """Row scatter payload: for each row peer in turn (`parts` bytes each), every layer's chunk
        for that peer, encoded. Keeps each layer's residual (what encoding lost) unless it is not
        finite, as the runtime's memories do (an inf or NaN value makes its bucket decode to NaN)."""
        send_params = self._row_params(self.grid.me, 0)
        send = torch.empty(sum(parts), dtype=torch.uint8, device=self.work)
        at = [sum(parts[:p]) for p in range(len(parts))]  # where each peer's next layer goes
        feedback = self.state.error_feedback
        for layer in self.layers:
            residual = torch.empty_like(layer.values) if feedback else None
            for p, (start, length) in enumerate(layer.chunks):
                chunk, wire = layer.values[start:start + length], send[at[p]:at[p] + layer.sizes[p]]
                written = _encode_into(chunk, wire, start, send_params)
                if written != layer.sizes[p]:
                    raise RuntimeError(f"ddp_hook: {length} values encoded to {written} bytes, "
                                       f"expected {layer.sizes[p]}")
                if feedback:
                    lost = residual[start:start + length]
                    _decode_from(wire, lost, send_params)
                    torch.sub(chunk, lost, out=lost)
                at[p] += layer.sizes[p]
            if feedback:
                self.state._keep_residual(layer.param, residual, torch.isfinite(residual).all())
        return send

    def _all_to_all(self, send, splits, group, ranks, me):
        """Issues the all_to_all of `send` (`splits` bytes per peer of `ranks`) on `group`; returns
        its future and what it receives (every peer's part for this rank)."""
        mine = splits[me]
        self._count(dict(zip(ranks, splits)))
        recv = torch.empty(mine * len(ranks), dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(recv, send.to(self.device), [mine] * len(ranks), splits, group=group,
                                      async_op=True)
        return work.get_future(), recv

    def _all_gather(self, mine, size, group, ranks):
        """Issues the all_gather of `mine` (`size` bytes of it used, the rest padding) on `group`;
        returns its future and the gathered parts."""
        self._count({r: size for r in ranks})
        gathered = [torch.empty_like(mine) for _ in ranks]
        work = dist.all_gather(gathered, mine, group=group, async_op=True)
        return work.get_future(), gathered

    def _scatter_row(self):
        grid = self.grid
        if self.exact:
            values = torch.cat([self.flat[o:o + n].to(torch.float32) for o, n in self.exact])
            work = dist.all_reduce(values, group=grid.group, async_op=True)
            self._exact = (work.get_future(), values)
        if not self.layers:
            self._stages = [self._gather_row]  # only the exact layers: nothing to exchange
            return
        splits = [sum(layer.sizes[p] for layer in self.layers) for p in range(len(grid.row_ranks))]
        fut, recv = self._all_to_all(self._encode_for_peers(splits), splits, grid.row_group, grid.row_ranks,
                                     grid.me_row)
        self._result = fut.then(lambda f: self._reduce_row(f, recv, splits[grid.me_row]))

    def _reduce_row(self, fut, recv, mine):
        """My chunk of each layer: every row rank's encoding of it, summed in rank order. Flat, also
        averaged and encoded once, padded to the widest rank's payload (all_gather needs equal
        sizes); with node rows the float32 sums (the column stage sends them)."""
        fut.wait()  # raises the exchange's error, if any
        grid = self.grid
        pieces = [(layer.chunks[grid.me_row], layer.sizes[grid.me_row]) for layer in self.layers]
        sums = self._sum_pieces(recv, mine, [self._row_params(rank, 0) for rank in grid.row_ranks], pieces)
        if grid.node_rows:
            return sums
        return self._average_and_encode(sums, pieces, self._row_params(grid.me, 1), max(self._blob))

    def _sum_pieces(self, recv, mine, senders, pieces):
        """Each layer's piece for this rank summed over the peers, in their order: `recv` holds
        each peer's `mine` bytes (encoded with its `senders` parameters), every layer's piece
        ((start, length), encoded size in `pieces`) one after another."""
        received = recv.to(self.work)
        sums, within = [], 0  # where the layer's bytes start in each peer's part
        for (_, length), size in pieces:
            acc = torch.zeros(length, dtype=torch.float32, device=self.work)
            for p, params in enumerate(senders):
                begin = p * mine + within
                _decode_from(received[begin:begin + size], acc, params, accumulate=True)
            sums.append(acc)
            within += size
        return sums

    def _average_and_encode(self, sums, pieces, params, width):
        """Each layer's summed values divided by the group's size, encoded once (at the piece's
        start, to its size in `pieces`), one after another, padded to `width` bytes."""
        padded = torch.zeros(width, dtype=torch.uint8, device=self.work)
        at = 0
        for acc, ((start, _), size) in zip(sums, pieces):
            acc.div_(self.grid.size)
            _encode_into(acc, padded[at:at + size], start, params)
            at += size
        return padded.to(self.device)

    def _column_bytes(self, c):
        """Encoded bytes of column rank c's cells of this row position (every layer's)."""
        return sum(layer.cell_sizes[self.grid.me_row][c] for layer in self.layers)

    def _scatter_column(self, sums):
        grid = self.grid
        j, ranks = grid.me_row, grid.columns[grid.me_row]
        splits = [self._column_bytes(c) for c in range(len(ranks))]
        send = torch.empty(sum(splits), dtype=torch.uint8, device=self.work)
        params, at = self._column_params(grid.me, 0), 0
        for c in range(len(ranks)):
            for layer, acc in zip(self.layers, sums):
                row_start = layer.chunks[j][0]
                start, length = layer.cells[j][c]
                size = layer.cell_sizes[j][c]
                _encode_into(acc[start - row_start:start - row_start + length], send[at:at + size], start, params)
                at += size
        fut, recv = self._all_to_all(send, splits, grid.column_group, ranks, grid.me_column)
        self._result = fut.then(lambda f: self._reduce_column(f, recv, splits[grid.me_column]))

    def _reduce_column(self, fut, recv, mine):
        """My cell of each layer: every node's encoding of its sum, summed in column order,
        averaged, encoded once, padded to the column's widest payload."""
        fut.wait()
        grid = self.grid
        j, c, ranks = grid.me_row, grid.me_column, grid.columns[grid.me_row]
        pieces = [(layer.cells[j][c], layer.cell_sizes[j][c]) for layer in self.layers]
        sums = self._sum_pieces(recv, mine, [self._column_params(rank, 0) for rank in ranks], pieces)
        width = max(self._column_bytes(p) for p in range(len(ranks)))
        return self._average_and_encode(sums, pieces, self._column_params(grid.me, 1), width)

    def _gather_column(self, mine):
        grid = self.grid
        ranks = grid.columns[grid.me_row]
        fut, gathered = self._all_gather(mine, self._column_bytes(grid.me_column), grid.column_group, ranks)

        def blob(f):
            """The row chunk's encodings as every column rank made them, column by column, padded
            to the row's widest blob (what the row's all_gather sends)."""
            f.wait()
            out = torch.zeros(max(self._blob), dtype=torch.uint8, device=self.device)
            at = 0
            for c in range(len(ranks)):
                size = self._column_bytes(c)
                out[at:at + size] = gathered[c][:size]
                at += size
            return out

        self._result = fut.then(blob)

    def _gather_row(self, mine):
        """Issues the row's all_gather and arranges for `future` to complete."""
        grid = self.grid
        waits = []
        if mine is not None:
            fut, gathered = self._all_gather(mine, self._blob[grid.me_row], grid.row_group, grid.row_ranks)
            waits.append(fut.then(lambda f: self._decode_all(f, gathered)))
        if self._exact is not None:
            waits.append(self._exact[0].then(lambda f: self._copy_exact(f)))
        if not waits:
            self.future.set_result(self.buffer)
            return
        torch.futures.collect_all(waits).then(self._finish)

    def _decode_all(self, fut, gathered):
        fut.wait()
        grid = self.grid
        in_place = self.work == self.device  # else decoded on the CPU, then copied to the bucket
        with torch.no_grad():
            for j in range(len(grid.row_ranks)):
                data, at = gathered[j].to(self.work), 0
                for c, owner in enumerate(grid.columns[j]):
                    params = self._column_params(owner, 1) if grid.node_rows else self._row_params(owner, 1)
                    for layer in self.layers:
                        start, length = layer.cells[j][c]
                        size = layer.cell_sizes[j][c]
                        begin = layer.offset + start
                        target = self.flat[begin:begin + length]
                        out = target if in_place else torch.empty(length, dtype=target.dtype, device=self.work)
                        _decode_from(data[at:at + size], out, params)
                        if not in_place:
                            target.copy_(out)
                        at += size

    def _copy_exact(self, fut):
        fut.wait()
        summed, at = self._exact[1] / self.grid.size, 0
        with torch.no_grad():
            for o, n in self.exact:
                self.flat[o:o + n].copy_(summed[at:at + n])
                at += n

    def _finish(self, fut):
        try:
            for f in fut.wait():
                f.wait()  # raises the first failure
        except Exception as e:  # noqa: BLE001 - delivered to DDP through the future
            self.future.set_exception(e)
            return
        self.future.set_result(self.buffer)


def ddp_hook(state, bucket):
    """Compresses each large layer of `bucket` with max-min quantization, keeps the rest exact,
    and returns a future of the averaged bucket.

    Scatter-reduce-allgather per layer, as the runtime does: each rank encodes every peer's chunk
    of every compressed layer and exchanges them in one all_to_all; each rank sums its chunk in
    float32 in rank order, averages, encodes it once; one all_gather brings every reduced chunk
    to every rank, which decodes them (so every rank holds the same values). With node rows
    (DDPHookState) the chunk sums of a node are reduced across the nodes the same way before the
    node's all_gather. The exact layers are averaged by one all_reduce of the process group,
    started alongside. The module's text explains the order in which the collectives are issued."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    if state._grid is None or state._grid.group is not group:
        state._grid = _plan(state, group)
    exchange = _Exchange(state, bucket, state._grid)
    exchange.advance()
    # The next stage of each bucket before this one, in bucket order; after the last bucket,
    # stage after stage until every bucket is through.
    waiting, state._waiting = state._waiting, []
    for earlier in waiting:
        earlier.advance()
        if not earlier.done:
            state._waiting.append(earlier)
    state._waiting.append(exchange)
    if bucket.is_last():
        pending, state._waiting = state._waiting, []
        while pending:
            for e in pending:
                e.advance()
            pending = [e for e in pending if not e.done]
    return failing_in_cpp(exchange.future)
