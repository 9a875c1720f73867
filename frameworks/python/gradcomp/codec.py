"""Inspect gradcomp's codecs on your own arrays: encode, decode, wire size.

    >>> import numpy as np, gradcomp.codec as gc
    >>> g = np.random.randn(1 << 20).astype(np.float32)
    >>> wire = gc.encode(g, "maxmin", bits=4, bucket_size=512)
    >>> len(wire), gc.wire_size(g.size, "maxmin", bits=4)      # 4 bits + 8 bytes per 512 values
    >>> err = gc.decode(wire, g.size, "maxmin", bits=4) - g

The bytes are exactly what travels between ranks (docs/design.md's wire formats). Arrays are
encoded as one segment: buckets start at element 0. Inputs are float32 or float16 arrays,
or uint16 arrays holding bfloat16 bits with ``dtype="bfloat16"``.
"""
import numpy as np

from gradcomp import _core

__all__ = ["codecs", "encode", "decode", "decode_accumulate", "wire_size"]

_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}


def codecs():
    """{name: one-line description} of every codec."""
    return dict(_core.codecs())


def _dtype_name(array, dtype):
    if dtype is not None:
        return dtype
    try:
        return _DTYPES[array.dtype]
    except KeyError:
        raise ValueError(f"codec input dtype {array.dtype} is not supported (float32, float16, "
                         "or uint16 bfloat16 bits with dtype='bfloat16')") from None


def encode(array, codec="maxmin", *, dtype=None, first_index=0, bits=4, bucket_size=512, stochastic=False,
           seed=0, step=0, skip_incomplete_buckets=False, ratio=0.01, sample_ratio=0.01, value_dtype="float32"):
    """Encodes `array` (flattened) with `codec`; returns the wire bytes.

    maxmin: bits (1-8), bucket_size, stochastic, seed, step, skip_incomplete_buckets.
    topk: ratio, sample_ratio, value_dtype ("float32" or "float16"), seed, step.
    first_index is the index of array[0] in its tensor (keys stochastic rounding)."""
    a = np.ascontiguousarray(array).reshape(-1)
    return _core.codec_encode(a, codec, _dtype_name(a, dtype), first_index, bits=bits, bucket_size=bucket_size,
                              stochastic=stochastic, seed=seed, step=step,
                              skip_incomplete_buckets=skip_incomplete_buckets, ratio=ratio,
                              sample_ratio=sample_ratio, value_dtype=value_dtype)


def _run_decode(wire, out, codec, accumulate, dtype, **params):
    if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("decode output must be a writeable C-contiguous numpy array")
    _core.codec_decode(bytes(wire), out.reshape(-1), codec, _dtype_name(out, dtype), accumulate, **params)
    return out


def decode(wire, n, codec="maxmin", *, out=None, dtype=None, bits=4, bucket_size=512, stochastic=False, seed=0,
           step=0, skip_incomplete_buckets=False, ratio=0.01, sample_ratio=0.01, value_dtype="float32"):
    """Decodes `n` values from `wire` into `out` (a new float32 array by default) and returns it.
    Pass the parameters the bytes were encoded with."""
    if out is None:
        out = np.empty(n, dtype=np.float32)
    if out.size != n:
        raise ValueError(f"decode output has {out.size} elements but n={n}")
    return _run_decode(wire, out, codec, False, dtype, bits=bits, bucket_size=bucket_size, stochastic=stochastic,
                       seed=seed, step=step, skip_incomplete_buckets=skip_incomplete_buckets, ratio=ratio,
                       sample_ratio=sample_ratio, value_dtype=value_dtype)


def decode_accumulate(wire, out, codec="maxmin", *, dtype=None, bits=4, bucket_size=512, stochastic=False, seed=0,
                      step=0, skip_incomplete_buckets=False, ratio=0.01, sample_ratio=0.01, value_dtype="float32"):
    """Adds the decoded values to `out` in place (the reduction's hot path) and returns it."""
    return _run_decode(wire, out, codec, True, dtype, bits=bits, bucket_size=bucket_size, stochastic=stochastic,
                       seed=seed, step=step, skip_incomplete_buckets=skip_incomplete_buckets, ratio=ratio,
                       sample_ratio=sample_ratio, value_dtype=value_dtype)


def wire_size(n, codec="maxmin", *, bits=4, bucket_size=512, stochastic=False, seed=0, step=0,
              skip_incomplete_buckets=False, ratio=0.01, sample_ratio=0.01, value_dtype="float32"):
    """Bytes `n` values take on the wire (for topk the most they can take)."""
    return _core.codec_wire_size(n, codec, bits=bits, bucket_size=bucket_size, stochastic=stochastic, seed=seed,
                                 step=step, skip_incomplete_buckets=skip_incomplete_buckets, ratio=ratio,
                                 sample_ratio=sample_ratio, value_dtype=value_dtype)
