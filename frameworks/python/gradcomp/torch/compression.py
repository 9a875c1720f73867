"""Compression choices for gradcomp.torch, with Horovod's ``Compression`` names.

``Compression.none``, ``fp16``, ``bf16``, ``maxmin(...)`` and ``topk(...)`` run inside the
runtime (encoded in the fusion buffer, exchanged compressed, decoded in full precision), and
``auto(...)`` chooses among them per tensor from measured errors; ``powersgd(...)`` is a
low-rank method of the framework layer, applied by ``DistributedOptimizer`` and the DDP hook
with two allreduces per step.

Like Horovod's, ``Compression.fp16`` etc. also offer ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx)`` for code that calls them directly.
"""
import torch

from gradcomp import basics as _b


class Compressor:
    """A compression choice. `spec` is the runtime's compression dict (None: not a runtime codec)."""

    spec = None

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        del ctx
        return tensor

    def __repr__(self):
        return f"Compression.{self.name}"


class _Cast(Compressor):
    def __init__(self, name, dtype):
        self.name = name
        self.dtype = dtype
        self.spec = {"codec": name}

    def compress(self, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != self.dtype:
            return tensor.to(self.dtype), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class _NoneCompressor(Compressor):
    name = "none"
    spec = {"codec": "none"}


class MaxMin(Compressor):
    """Max-min quantization (CGX/QSGD): each bucket of `bucket_size` values is sent as its
    min, its max and `bits`-bit codes; the reduction runs in full precision."""

    name = "maxmin"

    def __init__(self, bits=4, bucket_size=512, stochastic=False, error_feedback=False,
                 skip_incomplete_buckets=False):
        if not isinstance(bits, int) or not 1 <= bits <= 8:
            raise ValueError(f"Compression.maxmin: bits must be an integer in 1..8, got {bits!r}")
        if not isinstance(bucket_size, int) or bucket_size < 1:
            raise ValueError(f"Compression.maxmin: bucket_size must be a positive integer, got {bucket_size!r}")
        self.bits, self.bucket_size = bits, bucket_size
        self.spec = {"codec": "maxmin", "bits": bits, "bucket_size": bucket_size, "stochastic": bool(stochastic),
                     "error_feedback": bool(error_feedback), "skip_incomplete_buckets": bool(skip_incomplete_buckets)}

    def __repr__(self):
        return (f"Compression.maxmin(bits={self.bits}, bucket_size={self.bucket_size}, "
                f"error_feedback={self.spec['error_feedback']})")


class TopK(Compressor):
    """DGC top-k sparsification: the `ratio` largest-magnitude values travel as (value, index)
    and the rest stays in a local accumulator. `momentum` > 0 turns on DGC's momentum
    correction inside the runtime; with DistributedOptimizer, None takes the wrapped
    optimizer's momentum (see DistributedOptimizer)."""

    name = "topk"

    def __init__(self, ratio=0.01, momentum=None, nesterov=False):
        if not 0 < ratio <= 1:
            raise ValueError(f"Compression.topk: ratio must be in (0, 1], got {ratio!r}")
        if momentum is not None and not 0 <= momentum < 1:
            raise ValueError(f"Compression.topk: momentum must be in [0, 1), got {momentum!r}")
        self.ratio, self.momentum, self.nesterov = float(ratio), momentum, bool(nesterov)
        self.spec = self.with_momentum(momentum or 0.0, nesterov)

    def with_momentum(self, momentum, nesterov):
        return {"codec": "topk", "ratio": self.ratio, "momentum": float(momentum), "nesterov": bool(nesterov)}

    def __repr__(self):
        return f"Compression.topk(ratio={self.ratio}, momentum={self.momentum}, nesterov={self.nesterov})"


class Auto(Compressor):
    """Adaptive compression inside the runtime: every `interval` steps each tensor gets the
    setting among `candidates` that sends the fewest bytes while the gradient's total error
    stays at most the uniform `reference`'s (a ``Compression.maxmin(...)``; its bucket size,
    rounding and error feedback apply to every candidate). Until the first choice every tensor
    runs the reference. With `relaxed` (a ``Compression.maxmin(...)`` of fewer bits, or the
    bits; None: the reference's budget throughout), only tensors in a critical regime keep the
    reference's budget (Accordion: their gradient summed between two choices moved in norm by
    `critical_change` or more since the previous choice, or it is their first); a calm tensor's
    budget steps down one bit a choice (the error of maxmin at one bit fewer) to the relaxed
    setting's. The default, ``'optimizer'``, relaxes to 1 bit under DistributedOptimizer with an
    optimizer that normalizes its update per coordinate (Adam and its kin) and to 2 bits
    otherwise (SGD: 1 bit can throw its training off). `normalized=True` (the default) weighs
    each tensor's error over its values' mean square; False weighs absolute errors. See
    ``gradcomp.torch.compression_choices()`` and ``auto_summary()``."""

    name = "auto"

    def __init__(self, candidates=None, reference=None, interval=25, relaxed=_b.BY_OPTIMIZER, critical_change=0.5,
                 normalized=True):
        if reference is None:
            reference = MaxMin(4)
        if not isinstance(reference, MaxMin):
            raise ValueError(f"Compression.auto: reference must be a Compression.maxmin(...), got {reference!r}")
        if relaxed is not None and relaxed != _b.BY_OPTIMIZER and not isinstance(relaxed, MaxMin) and \
                (not isinstance(relaxed, int) or isinstance(relaxed, bool)):
            raise ValueError(f"Compression.auto: relaxed must be a Compression.maxmin(...), its bits, None or "
                             f"'{_b.BY_OPTIMIZER}', got {relaxed!r}")
        self.reference = reference
        self.relaxed = relaxed
        self.spec = _b.auto_spec(candidates, reference.spec, interval,
                                 relaxed.spec if isinstance(relaxed, MaxMin) else relaxed, critical_change, normalized)

    def for_optimizer(self, adaptive):
        """The runtime spec under an optimizer (adaptive: it normalizes its update per
        coordinate): the default relaxed bits resolved for it."""
        spec = dict(self.spec)
        if self.relaxed == _b.BY_OPTIMIZER:
            spec["relaxed_bits"] = _b.relaxed_bits_by_optimizer(self.reference.spec.get("bits", 4), adaptive)
        return spec

    def __repr__(self):
        relaxed = "" if self.relaxed is None else \
            f", relaxed={self.relaxed!r}, critical_change={self.spec['critical_change']}"
        normalized = ", normalized=True" if self.spec["normalized"] else ""
        return (f"Compression.auto(candidates={self.spec['candidates'].split(',')}, reference={self.reference!r}, "
                f"interval={self.spec['interval']}{relaxed}{normalized})")


class PowerSGD(Compressor):
    """PowerSGD (Vogels et al.): a gradient matrix M (n x m) travels as P = M Q (n x r) and
    Q = M^T P (m x r), one allreduce each, with error feedback and Q kept across steps (warm
    start). Tensors are compressed only when (n*m) / ((n+m)*r) >= min_compression_rate; the
    first `start_iter` steps use plain allreduce."""

    name = "powersgd"

    def __init__(self, rank=1, start_iter=10, min_compression_rate=2.0, warm_start=True, seed=0):
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"Compression.powersgd: rank must be a positive integer, got {rank!r}")
        if start_iter < 0:
            raise ValueError(f"Compression.powersgd: start_iter must be >= 0, got {start_iter!r}")
        self.rank, self.start_iter = rank, int(start_iter)
        self.min_compression_rate, self.warm_start = float(min_compression_rate), bool(warm_start)
        self.seed = int(seed)

    def __repr__(self):
        return f"Compression.powersgd(rank={self.rank}, start_iter={self.start_iter})"


class Compression:
    """The compression choices (Horovod's names plus gradcomp's codecs)."""

    none = _NoneCompressor()
    fp16 = _Cast("fp16", torch.float16)
    bf16 = _Cast("bf16", torch.bfloat16)
    maxmin = MaxMin
    topk = TopK
    powersgd = PowerSGD
    auto = Auto


def called(compression):
    """`compression` itself, or an instance of it when a choice's class was given without
    calling it (``Compression.maxmin``)."""
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression()
    return compression


def runtime_spec(compression):
    """The runtime's spec dict for a compression argument: None keeps the settings' policy."""
    if compression is None:
        return None
    if isinstance(compression, dict):  # a raw spec, as gradcomp.numpy takes
        return dict(compression)
    compression = called(compression)
    if not isinstance(compression, Compressor):
        raise ValueError(f"compression must be None or a gradcomp.torch.Compression choice, got {compression!r}")
    if compression.spec is None:
        raise ValueError(f"{compression!r} works through DistributedOptimizer or the DDP hook (it needs two "
                         "allreduces per step), not on a single allreduce")
    return dict(compression.spec)
