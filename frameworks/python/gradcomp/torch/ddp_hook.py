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
"""
import numpy as np
import torch
import torch.distributed as dist

from gradcomp import codec as _codec

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


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
        self.iteration = 0
        self.residuals = {}
        self.bytes_in = 0  # float bytes of the compressed layers
        self.bytes_on_wire = 0  # bytes this rank sent for them

    def codec_params(self):
        return {"bits": self.bits, "bucket_size": self.bucket_size, "stochastic": self.stochastic}

    def compresses(self, param, grad):
        return (grad.dtype in _FLOATS and param.dim() >= 2 and grad.numel() >= self.layer_min_size)


def _layers(bucket):
    """(parameter, gradient view) pairs of the bucket, in bucket order."""
    return list(zip(bucket.parameters(), bucket.gradients()))


def _chunks(n, world):
    """(start, length) of each rank's chunk of n values (the first n % world get one more)."""
    base, extra = divmod(n, world)
    out, at = [], 0
    for r in range(world):
        length = base + (1 if r < extra else 0)
        out.append((at, length))
        at += length
    return out


class _Layer:
    """A compressed layer of a bucket: where it lies in the bucket buffer, its values to send
    (float32, error-compensated), its chunk per rank and each chunk's encoded size."""

    def __init__(self, key, offset, values, world, params):
        self.key, self.offset, self.values = key, offset, values
        self.chunks = _chunks(values.size, world)
        self.sizes = [_codec.wire_size(length, "maxmin", **params) for _, length in self.chunks]


def ddp_hook(state, bucket):
    """Compresses each large layer of `bucket` with max-min quantization, keeps the rest exact,
    and returns a future of the averaged bucket.

    Scatter-reduce-allgather per layer, as the runtime does: each rank encodes every peer's chunk
    of every compressed layer and exchanges them in one all_to_all; each rank sums its chunk in
    float32 in rank order, averages, encodes it once; one all_gather brings every reduced chunk
    to every rank, which decodes them (so every rank holds the same values). The exact layers
    are averaged by one all_reduce of the process group, started alongside."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    step = state.iteration
    state.iteration += 1
    params = state.codec_params()
    # Each rank and stage rounds with its own stream when rounding is stochastic.
    send_params = dict(params, seed=me, step=step)
    reduce_params = dict(params, seed=world + me, step=step)
    buffer = bucket.buffer()
    flat = buffer.view(-1)
    layers, exact = [], []
    offset = 0
    for i, (param, grad) in enumerate(_layers(bucket)):
        n = grad.numel()
        if state.compresses(param, grad):
            values = grad.detach().reshape(-1).to(device="cpu", dtype=torch.float32).numpy()  # codecs run on the CPU
            key = (bucket.index(), i)
            if state.error_feedback:
                r = state.residuals.get(key)
                if r is not None and r.shape == values.shape:
                    values = values + r
            layers.append(_Layer(key, offset, values, world, params))
            state.bytes_in += n * grad.element_size()
        else:
            exact.append((offset, n))
        offset += n

    # Phase 1 payload: for each peer, every layer's chunk for that peer, encoded.
    parts = []
    for p in range(world):
        encoded = []
        for layer in layers:
            start, length = layer.chunks[p]
            chunk = layer.values[start:start + length]
            wire = np.frombuffer(_codec.encode(chunk, "maxmin", first_index=start, **send_params), dtype=np.uint8)
            if state.error_feedback:
                lost = chunk - _codec.decode(wire, length, "maxmin", **send_params)
                state.residuals.setdefault(layer.key, np.zeros_like(layer.values))[start:start + length] = lost
            encoded.append(wire)
        parts.append(np.concatenate(encoded) if encoded else np.zeros(0, np.uint8))
    mine = sum(layer.sizes[me] for layer in layers)  # what every rank sends me
    send = torch.from_numpy(np.concatenate(parts))
    recv = torch.empty(mine * world, dtype=torch.uint8)
    in_splits = [part.size for part in parts]
    reduced_sizes = [sum(layer.sizes[p] for layer in layers) for p in range(world)]
    state.bytes_on_wire += sum(in_splits) - in_splits[me] + reduced_sizes[me] * (world - 1)

    exact_values = torch.cat([flat[o:o + n].to(torch.float32) for o, n in exact]) if exact else None
    exact_work = dist.all_reduce(exact_values, group=group, async_op=True) if exact else None
    fut = dist.all_to_all_single(recv, send, [mine] * world, in_splits, group=group, async_op=True).get_future()

    def reduce_and_gather(f):
        f.wait()  # raises the exchange's error, if any
        received = recv.numpy()
        # My chunk of each layer: every rank's encoding of it, summed in rank order, averaged.
        reduced = []
        within = 0  # where the layer's bytes start in each rank's part
        for layer in layers:
            start, length = layer.chunks[me]
            acc = np.zeros(length, np.float32)
            for p in range(world):
                at = p * mine + within
                _codec.decode_accumulate(received[at:at + layer.sizes[me]], acc, "maxmin", **send_params)
            within += layer.sizes[me]
            acc /= np.float32(world)
            reduced.append(np.frombuffer(_codec.encode(acc, "maxmin", first_index=start, **reduce_params),
                                         dtype=np.uint8))
        width = max(reduced_sizes) if reduced_sizes else 0
        padded = torch.zeros(width, dtype=torch.uint8)
        if reduced:
            padded[:reduced_sizes[me]] = torch.from_numpy(np.concatenate(reduced))
        gathered = [torch.empty(width, dtype=torch.uint8) for _ in range(world)]
        dist.all_gather(gathered, padded, group=group, async_op=True).wait()
        with torch.no_grad():
            for p in range(world):
                data, at = gathered[p].numpy(), 0
                owner_params = dict(params, seed=world + p, step=step)
                for layer in layers:
                    start, length = layer.chunks[p]
                    values = _codec.decode(data[at:at + layer.sizes[p]], length, "maxmin", **owner_params)
                    at += layer.sizes[p]
                    flat[layer.offset + start:layer.offset + start + length].copy_(torch.from_numpy(values))
            if exact_work is not None:
                exact_work.wait()
                summed, at = exact_values / world, 0
                for o, n in exact:
                    flat[o:o + n].copy_(summed[at:at + n])
                    at += n
        return buffer

    return fut.then(reduce_and_gather)
