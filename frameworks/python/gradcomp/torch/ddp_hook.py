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
import torch
import torch.distributed as dist

from gradcomp import _core
from gradcomp import codec as _codec
from gradcomp.torch.futures import failing_in_cpp

_FLOATS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_CODEC = "maxmin"  # the hook quantizes as CGX's does


class DDPHookState:
    """State of ddp_hook: the process group, the layer filter and max-min parameters
    ({"bits": 1..8, "bucket_size": n, "stochastic": bool, "error_feedback": bool})."""

    def __init__(self, process_group=None, layer_min_size=1024, compression_params=None):
        params = dict(compression_params or {})
        unknown = set(params) - {"bits", "bucket_size", "stochastic", "error_feedback"}
        if unknown:
            raise ValueError(f"DDPHookState: unknown compression_params {sorted(unknown)} "
                             "(bits, bucket_size, stochastic, error_feedback)")
        self.process_group = process_group
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
        self._nonfinite = None  # count of layers sent with non-finite values, kept where they were
        self._waiting = []  # exchanges whose all_gather is not issued yet, in bucket order
        # GPU buckets are encoded and decoded on their GPU where gradcomp has its CUDA kernels
        # (and GRADCOMP_CUDA_DATA_PATH is not 0); else on the CPU.
        self._on_gpu = _core.cuda_data_path()

    @property
    def nonfinite_steps(self):
        """Layers sent with non-finite values (their residuals were kept). Reading it waits for
        the GPU; the hook itself never does."""
        return 0 if self._nonfinite is None else int(self._nonfinite)

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


class _Layer:
    """A compressed layer of a bucket: where it lies in the bucket buffer, its values to send
    (float32, error-compensated), its chunk per rank and each chunk's encoded size."""

    def __init__(self, param, offset, values, world, params):
        self.param, self.offset, self.values = param, offset, values
        self.chunks = _chunks(values.numel(), world)
        self.sizes = [_codec.wire_size(length, _CODEC, **params) for _, length in self.chunks]


class _Exchange:
    """One bucket's scatter-reduce-allgather, from its hook call until DDP gets the result.

    start(): encodes every peer's chunk and issues the exact all_reduce and the all_to_all;
    the all_to_all's callback reduces this rank's chunk and encodes it (no collective).
    gather(): waits for that reduction and issues the all_gather; its callback decodes every
    chunk into the bucket buffer and completes `future`.

    The codecs work in the bucket's memory (on its GPU for a GPU bucket, see DDPHookState);
    the collectives take the bucket's device, so nothing crosses to the host on the way."""

    def __init__(self, state, bucket, group):
        self.state, self.group = state, group
        self.world, self.me = dist.get_world_size(group), dist.get_rank(group)
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
                self.layers.append(_Layer(param, offset, values, self.world, self.params))
                state.bytes_in += n * grad.element_size()
            else:
                self.exact.append((offset, n))
            offset += n
        self._seeds = [_core.sra_stream_seeds(0, r) for r in range(self.world)]  # (scatter, gather) per rank
        self.future = torch.futures.Future()
        self._reduced = None  # future of this rank's encoded reduced chunk
        self._exact = None  # (future, values) of the exact layers' all_reduce

    def _scatter_params(self, rank):
        """Codec parameters `rank` encodes its peers' chunks with (the runtime SRA's stream)."""
        return dict(self.params, seed=self._seeds[rank][0], step=self.step)

    def _gather_params(self, rank):
        """Codec parameters `rank` encodes its reduced chunk with (the runtime SRA's stream)."""
        return dict(self.params, seed=self._seeds[rank][1], step=self.step)

    def _encode_for_peers(self, parts):
        """Phase 1 payload: for each peer in turn (`parts` bytes each), every layer's chunk for that
        peer, encoded. Keeps each layer's residual (what encoding lost) unless it is not finite,
        as the runtime's memories do (an inf or NaN value makes its bucket decode to NaN)."""
        send_params = self._scatter_params(self.me)
        send = torch.empty(sum(parts), dtype=torch.uint8, device=self.work)
        at = [sum(parts[:p]) for p in range(self.world)]  # where each peer's next layer goes
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

    def start(self):
        world, me = self.world, self.me
        if self.exact:
            values = torch.cat([self.flat[o:o + n].to(torch.float32) for o, n in self.exact])
            work = dist.all_reduce(values, group=self.group, async_op=True)
            self._exact = (work.get_future(), values)
        if not self.layers:
            return
        in_splits = [sum(layer.sizes[p] for layer in self.layers) for p in range(world)]
        mine = in_splits[me]  # what every rank sends me
        self.state.bytes_on_wire += sum(in_splits) - mine + mine * (world - 1)
        send = self._encode_for_peers(in_splits).to(self.device)
        recv = torch.empty(mine * world, dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(recv, send, [mine] * world, in_splits, group=self.group, async_op=True)
        width = max(in_splits)
        self._reduced = work.get_future().then(lambda f: self._reduce_mine(f, recv, mine, width))

    def _reduce_mine(self, fut, recv, mine, width):
        """My chunk of each layer: every rank's encoding of it, summed in rank order, averaged,
        encoded once, padded to the widest rank's payload (all_gather needs equal sizes)."""
        fut.wait()  # raises the exchange's error, if any
        received = recv.to(self.work)
        send_params = [self._scatter_params(p) for p in range(self.world)]
        reduce_params = self._gather_params(self.me)
        padded = torch.zeros(width, dtype=torch.uint8, device=self.work)
        within = 0  # where the layer's bytes start in each rank's part
        for layer in self.layers:
            start, length = layer.chunks[self.me]
            size = layer.sizes[self.me]
            acc = torch.zeros(length, dtype=torch.float32, device=self.work)
            for p in range(self.world):
                begin = p * mine + within
                _decode_from(received[begin:begin + size], acc, send_params[p], accumulate=True)
            acc.div_(self.world)
            _encode_into(acc, padded[within:within + size], start, reduce_params)
            within += size
        return padded.to(self.device)

    def gather(self):
        """Issues phase 2 (on the hook's thread) and arranges for `future` to complete."""
        waits = []
        if self._reduced is not None:
            try:
                mine = self._reduced.wait()
            except Exception as e:  # noqa: BLE001 - the exchange failed; DDP gets the error
                self.future.set_exception(e)
                return
            gathered = [torch.empty_like(mine) for _ in range(self.world)]
            work = dist.all_gather(gathered, mine, group=self.group, async_op=True)
            waits.append(work.get_future().then(lambda f: self._decode_all(f, gathered)))
        if self._exact is not None:
            waits.append(self._exact[0].then(lambda f: self._copy_exact(f)))
        if not waits:
            self.future.set_result(self.buffer)
            return
        torch.futures.collect_all(waits).then(self._finish)

    def _decode_all(self, fut, gathered):
        fut.wait()
        in_place = self.work == self.device  # else decoded on the CPU, then copied to the bucket
        with torch.no_grad():
            for p in range(self.world):
                data, at = gathered[p].to(self.work), 0
                owner_params = self._gather_params(p)
                for layer in self.layers:
                    start, length = layer.chunks[p]
                    begin = layer.offset + start
                    target = self.flat[begin:begin + length]
                    out = target if in_place else torch.empty(length, dtype=target.dtype, device=self.work)
                    _decode_from(data[at:at + layer.sizes[p]], out, owner_params)
                    if not in_place:
                        target.copy_(out)
                    at += layer.sizes[p]

    def _copy_exact(self, fut):
        fut.wait()
        summed, at = self._exact[1] / self.world, 0
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
    to every rank, which decodes them (so every rank holds the same values). The exact layers
    are averaged by one all_reduce of the process group, started alongside. The module's text
    explains the order in which the collectives are issued."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    exchange = _Exchange(state, bucket, group)
    exchange.start()
    # Phase 2 of the buckets before this one, in bucket order; all of them after the last.
    waiting, state._waiting = state._waiting, []
    for earlier in waiting:
        earlier.gather()
    if bucket.is_last():
        exchange.gather()
    else:
        state._waiting.append(exchange)
    return failing_in_cpp(exchange.future)
