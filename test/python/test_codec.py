"""gradcomp.codec from Python: round trips, wire sizes, error types, dtypes."""
import numpy as np
import pytest

import gradcomp
import gradcomp.codec as gc


def gaussian(n, seed=0):
    return np.random.default_rng(seed).normal(0.0, 1.0, n).astype(np.float32)


def test_codecs_are_listed_with_descriptions():
    names = gc.codecs()
    assert list(names) == ["none", "fp16", "bf16", "maxmin", "topk"]
    assert all(len(d) > 20 for d in names.values())


@pytest.mark.parametrize("bits", range(1, 9))
def test_maxmin_wire_size_and_error_bound(bits):
    g = gaussian(10000, bits)
    wire = gc.encode(g, "maxmin", bits=bits, bucket_size=512)
    nb = -(-g.size // 512)
    assert len(wire) == gc.wire_size(g.size, "maxmin", bits=bits) == 8 * nb + -(-g.size * bits // 8)
    y = gc.decode(wire, g.size, "maxmin", bits=bits)
    meta = np.frombuffer(wire[: 8 * nb], dtype=np.float32).reshape(nb, 2)
    unit = np.repeat(meta[:, 1], 512)[: g.size]
    assert np.all(np.abs(y - g) <= unit / 2 * (1 + 1e-5) + 1e-6)


def test_four_bit_gaussian_relative_error_is_small():
    g = gaussian(1 << 20)
    y = gc.decode(gc.encode(g, "maxmin", bits=4), g.size, "maxmin", bits=4)
    assert np.linalg.norm(y - g) / np.linalg.norm(g) <= 0.2


def test_stochastic_rounding_depends_on_step_not_on_call():
    g = gaussian(4096)
    a = gc.encode(g, "maxmin", bits=2, stochastic=True, seed=3, step=1)
    assert a == gc.encode(g, "maxmin", bits=2, stochastic=True, seed=3, step=1)
    assert a != gc.encode(g, "maxmin", bits=2, stochastic=True, seed=3, step=2)


def test_float16_and_bfloat16_inputs_match_float32_path():
    g = gaussian(3000)
    h = g.astype(np.float16)
    assert gc.encode(h, "maxmin", bits=4) == gc.encode(h.astype(np.float32), "maxmin", bits=4)
    bf_bits = (g.view(np.uint32) >> 16).astype(np.uint16)  # truncation gives exact bfloat16 values
    as_f32 = (bf_bits.astype(np.uint32) << 16).view(np.float32)
    assert gc.encode(bf_bits, "maxmin", dtype="bfloat16") == gc.encode(as_f32, "maxmin")
    out16 = np.zeros(g.size, dtype=np.float16)
    gc.decode(gc.encode(g, "fp16"), g.size, "fp16", out=out16)
    np.testing.assert_array_equal(out16, g.astype(np.float16))


def test_topk_keeps_the_largest_and_accumulates():
    g = gaussian(100000)
    wire = gc.encode(g, "topk", ratio=0.01)
    count = int(np.frombuffer(wire[:4], dtype=np.uint32)[0])
    assert 800 <= count <= 1300
    assert len(wire) == 4 + 8 * count <= gc.wire_size(g.size, "topk", ratio=0.01)
    y = gc.decode(wire, g.size, "topk", ratio=0.01)
    kept = np.flatnonzero(y)
    assert np.array_equal(y[kept], g[kept])
    assert np.abs(g[kept]).min() >= np.sort(np.abs(g))[-count]
    acc = np.ones(g.size, dtype=np.float32)
    gc.decode_accumulate(wire, acc, "topk", ratio=0.01)
    np.testing.assert_array_equal(acc, 1 + y)


def test_bad_arguments_raise_value_error_naming_the_value():
    g = gaussian(100)
    with pytest.raises(ValueError, match="bits=0 is outside 1..8"):
        gc.encode(g, "maxmin", bits=0)
    with pytest.raises(ValueError, match="unknown codec 'lz4'"):
        gc.encode(g, "lz4")
    with pytest.raises(ValueError, match="codec input dtype int32 is not supported"):
        gc.encode(np.arange(10, dtype=np.int32))
    with pytest.raises(ValueError, match="take 13 bytes, got 5"):
        gc.decode(b"12345", 10, "maxmin", bits=4)
    with pytest.raises(ValueError, match="ratio=1.500000 is outside"):
        gc.encode(g, "topk", ratio=1.5)
    assert issubclass(gradcomp.GradcompError, RuntimeError)


@pytest.mark.parametrize("codec,params", [("maxmin", {"bits": 3, "bucket_size": 100, "stochastic": True}),
                                          ("topk", {"ratio": 0.05})])
def test_encoding_at_addresses_gives_the_same_bytes_and_values(codec, params):
    """codec_encode_at / codec_decode_at (the DDP hook's in-place calls, on the tensor's device)
    write the bytes gc.encode returns and decode to what gc.decode gives."""
    from gradcomp import _core
    g = gaussian(4097, seed=3)
    wire = gc.encode(g, codec, first_index=9, seed=5, step=2, **params)
    out = np.full(gc.wire_size(g.size, codec, **params) + 16, 0xAB, np.uint8)
    written = _core.codec_encode_at(g.ctypes.data, "float32", g.size, out.ctypes.data, out.size, codec, 9,
                                    seed=5, step=2, **params)
    assert bytes(out[:written]) == wire
    expected = gc.decode(wire, g.size, codec, seed=5, step=2, **params)
    got = np.ones(g.size, np.float32)
    _core.codec_decode_at(out.ctypes.data, written, g.size, got.ctypes.data, "float32", codec, True,
                          seed=5, step=2, **params)
    assert (got == expected + np.float32(1)).all()
    with pytest.raises(ValueError, match=f"4097 values need {gc.wire_size(g.size, codec, **params)} output "
                                         f"bytes with codec '{codec}', the output has 10"):
        _core.codec_encode_at(g.ctypes.data, "float32", g.size, out.ctypes.data, 10, codec, **params)
    # An ordinal no machine has: in a CUDA build the device does not exist, in another there is no CUDA.
    with pytest.raises(ValueError, match=r"codec_encode_at: .*(CUDA device 64 does not exist|GPU 64 but this "
                                         r"gradcomp was built without CUDA)"):
        _core.codec_encode_at(g.ctypes.data, "float32", g.size, out.ctypes.data, out.size, codec, device=64,
                              **params)
