"""gradcomp.numpy under mpirun (-np 2 and 3): every collective, every dtype, async handles,
errors on every rank, join, barrier and the timeline.

Run by ctest as: mpirun -np N python3 -m pytest test/python/test_numpy_mpi.py
Every rank runs the same tests in the same order (they are collective)."""
import hashlib
import json
import os
import time

import numpy as np
import pytest

import gradcomp.numpy as gc
from gradcomp import world
from launched import launched_rank_and_size


DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


@pytest.fixture(scope="module", autouse=True)
def runtime():
    gc.init()
    yield
    gc.shutdown()


def rank_data(dtype, shape, rank):
    """Small values so sums over 3 ranks never overflow int8/uint8."""
    n = int(np.prod(shape))
    return ((np.arange(n) * 7 + rank * 3) % 11).astype(dtype).reshape(shape)


def test_topology():
    assert (gc.rank(), gc.size()) == launched_rank_and_size()
    assert gc.local_size() * gc.cross_size() == gc.size() and gc.is_homogeneous()
    assert 0 <= gc.local_rank() < gc.local_size()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(17,), (3, 5), (2, 3, 4)])
def test_allreduce_every_dtype_op_and_shape(dtype, shape):
    n, me = gc.size(), gc.rank()
    inputs = [rank_data(dtype, shape, r).astype(np.float64) for r in range(n)]
    expected = {gc.Sum: sum(inputs), gc.Min: np.minimum.reduce(inputs), gc.Max: np.maximum.reduce(inputs),
                gc.Product: np.prod(inputs, axis=0)}
    for op, want in expected.items():
        x = rank_data(dtype, shape, me)
        if op == gc.Product and dtype in (np.int8, np.uint8):
            x = np.ones(shape, dtype)
            want = np.ones(shape)
        got = gc.allreduce(x, op=op, name=f"ar.{np.dtype(dtype).name}.{shape}.{op}")
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        tol = 1e-2 * np.abs(want).max() if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want, atol=tol)
    avg = gc.allreduce(rank_data(dtype, shape, me), name=f"avg.{np.dtype(dtype).name}.{shape}")
    want = sum(inputs) / n
    if np.issubdtype(dtype, np.integer):
        want = np.trunc(want)
    np.testing.assert_allclose(avg.astype(np.float64), want, atol=2e-2 * max(1, np.abs(want).max()))


def test_bool_allreduce_is_logical():
    x = np.array([gc.rank() == 0, True, False])
    np.testing.assert_array_equal(gc.allreduce(x, op=gc.Max, name="bool.or"), [True, True, False])
    np.testing.assert_array_equal(gc.allreduce(x, op=gc.Min, name="bool.and"), [gc.size() == 1, True, False])


def test_async_poll_in_place_scaling_and_deprecated_average():
    x = np.full(1 << 20, float(gc.rank() + 1), dtype=np.float32)
    h = gc.allreduce_async_(x, op=gc.Sum, name="big", prescale_factor=2.0, postscale_factor=0.5)
    assert gc.poll(h) in (False, True)
    assert gc.synchronize(h) is x
    assert gc.poll is not None and np.all(x == sum(range(1, gc.size() + 1)))
    np.testing.assert_allclose(gc.allreduce(np.ones(3), average=False, name="dep"), np.full(3, gc.size()))
    with pytest.raises(ValueError, match="either op= or the deprecated average="):
        gc.allreduce(np.ones(3), op=gc.Sum, average=True)


def test_grouped_allreduce():
    arrays = [np.full(i + 1, float(gc.rank()), dtype=np.float64) for i in range(10)]
    out = gc.grouped_allreduce(arrays, op=gc.Sum, name="group")
    for i, o in enumerate(out):
        np.testing.assert_array_equal(o, np.full(i + 1, float(sum(range(gc.size())))))
    # Several dtypes in one group (Horovod takes them): each comes back in its own dtype, exact.
    mixed = [np.full(3, gc.rank(), np.int32), np.full((2, 2), 0.5, np.float32), np.full(4, gc.rank(), np.int64),
             np.full(5, 1.0 + gc.rank(), np.float64)]
    out = gc.grouped_allreduce(mixed, op=gc.Sum, name="group.mixed")
    total = sum(range(gc.size()))
    assert [o.dtype for o in out] == [np.int32, np.float32, np.int64, np.float64]
    for o, want in zip(out, [total, 0.5 * gc.size(), total, gc.size() + total]):
        np.testing.assert_array_equal(o, np.full(o.shape, want, o.dtype))
    with pytest.raises(ValueError, match="grouped allreduce of 'group.ada.0': op adasum needs a floating-point"):
        gc.grouped_allreduce(mixed, op=gc.Adasum, name="group.ada")


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_allgather_with_different_first_dimensions(dtype):
    me = gc.rank()
    x = np.full((me + 1, 2, 3), me % 2, dtype=dtype)
    got = gc.allgather(x, name=f"ag.{np.dtype(dtype).name}")
    want = np.concatenate([np.full((r + 1, 2, 3), r % 2, dtype=dtype) for r in range(gc.size())])
    np.testing.assert_array_equal(got, want)


def test_broadcast_from_every_root_and_in_place():
    for root in range(gc.size()):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + gc.rank()
        np.testing.assert_array_equal(gc.broadcast(x, root, name=f"bc.{root}"),
                                      np.arange(6, dtype=np.float32).reshape(2, 3) + root)
        y = np.full(4, gc.rank(), dtype=np.int64)
        assert gc.broadcast_(y, root, name=f"bc_.{root}") is y
        np.testing.assert_array_equal(y, np.full(4, root))


def test_alltoall_with_splits():
    n, me = gc.size(), gc.rank()
    splits = [p + 1 for p in range(n)]  # rank me sends p + 1 rows to rank p
    x = np.concatenate([np.full((p + 1, 2), me * 10 + p, dtype=np.int32) for p in range(n)])
    out, received = gc.alltoall(x, splits=splits, name="a2a")
    np.testing.assert_array_equal(received, np.full(n, me + 1))
    want = np.concatenate([np.full((me + 1, 2), s * 10 + me, dtype=np.int32) for s in range(n)])
    np.testing.assert_array_equal(out, want)


def test_alltoall_without_splits_returns_the_array_and_needs_a_multiple_of_the_ranks():
    n, me = gc.size(), gc.rank()
    out = gc.alltoall(np.arange(2 * n, dtype=np.int16) + 10 * me, name="a2a.even")
    assert isinstance(out, np.ndarray) and out.dtype == np.int16
    np.testing.assert_array_equal(out, np.concatenate([np.arange(2 * me, 2 * me + 2) + 10 * p for p in range(n)]))
    with pytest.raises(ValueError, match=rf"first dimension \({n + 1}\) must be a multiple of the number of ranks"):
        gc.alltoall(np.zeros(n + 1), name="a2a.uneven")


def test_grouped_allgather_and_reducescatter_equal_one_call_per_array():
    n, me = gc.size(), gc.rank()
    arrays = [np.full((me + 1, 2), me, np.int16), np.arange(4 * n, dtype=np.float64) * (me + 1)]
    gathered = gc.grouped_allgather(arrays, name="gag")
    np.testing.assert_array_equal(gathered[0], gc.allgather(arrays[0], name="ag.0"))
    np.testing.assert_array_equal(gathered[1], gc.allgather(arrays[1], name="ag.1"))
    scattered = gc.grouped_reducescatter(arrays[1:], op=gc.Sum, name="grs", postscale_factor=2.0)
    want = np.arange(4 * n, dtype=np.float64) * sum(range(1, n + 1)) * 2.0
    np.testing.assert_array_equal(scattered[0], want[4 * me:4 * me + 4])


def test_reducescatter_even_split():
    n, me = gc.size(), gc.rank()
    x = np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * (me + 1)
    got = gc.reducescatter(x, op=gc.Sum, name="rs")
    total = np.arange((2 * n + 1) * 3, dtype=np.float64).reshape(2 * n + 1, 3) * sum(range(1, n + 1))
    rows = [3 if r == 0 else 2 for r in range(n)]
    start = sum(rows[:me])
    np.testing.assert_array_equal(got, total[start:start + rows[me]])


def test_join_with_uneven_batches_and_barrier():
    me, n = gc.rank(), gc.size()
    for step in range(me + 1):  # rank r has r + 1 batches
        g = gc.allreduce(np.ones(5, np.float32), op=gc.Sum, name="uneven")
        np.testing.assert_array_equal(g, np.full(5, float(n - step)))
    assert gc.join() == n - 1
    gc.barrier()
    np.testing.assert_array_equal(gc.allreduce(np.ones(2), op=gc.Sum, name="after.join"), np.full(2, n))


def test_after_a_join_only_allreduce_goes_on():
    me, n = gc.rank(), gc.size()
    if me == 0:
        last = gc.join()
    else:
        with pytest.raises(gc.GradcompError, match=r"allgather of tensor 'j\.ag': not supported while ranks have "
                                                    r"joined \(rank 0\)"):
            gc.allgather(np.ones(2), name="j.ag")
        np.testing.assert_array_equal(gc.allreduce(np.ones(2), op=gc.Sum, name="j.ar"), np.full(2, n - 1.0))
        last = gc.join()
    # Which of the later ranks joins last is a matter of timing; every rank is told the same.
    everyone = gc.allgather(np.array([last]), name="j.last")
    assert last != 0 and (everyone == last).all()


def test_a_local_error_on_one_rank_leaves_unnamed_calls_in_step():
    if gc.rank() == 0:
        with pytest.raises(ValueError, match="complex"):
            gc.allreduce(np.zeros(2, np.complex64))
    np.testing.assert_array_equal(gc.allreduce(np.ones(2), op=gc.Sum), np.full(2, gc.size()))


def test_errors_reach_every_rank_with_the_values():
    me = gc.rank()
    with pytest.raises(gc.GradcompError, match=r"mismatched dtype for allreduce of tensor 'mixed': rank 0 float32"):
        gc.allreduce(np.ones(3, np.float32 if me == 0 else np.float64), name="mixed")
    with pytest.raises(gc.GradcompError, match=r"mismatched shape for allreduce of tensor 'shapes': rank 0 \[2\], rank 1 \[3\]"):
        gc.allreduce(np.ones(2 + me), name="shapes")
    with pytest.raises(ValueError, match=r"root rank 99 is outside 0\.\."):
        gc.broadcast(np.ones(2), 99, name="badroot")
    # Rank 0's 'dup' stays pending until the others submit theirs, after the barrier.
    x = np.ones(4)
    if me == 0:
        h = gc.allreduce_async_(x, name="dup")
        with pytest.raises(ValueError, match="an allreduce of tensor 'dup' is already pending on rank 0"):
            gc.allreduce_async_(np.ones(4), name="dup")
        gc.barrier()
    else:
        gc.barrier()
        h = gc.allreduce_async_(x, name="dup")
    gc.synchronize(h)
    with pytest.raises(ValueError, match="not supported"):
        gc.allreduce(np.ones(2, dtype=np.complex64), name="complex")
    with pytest.raises(ValueError, match="init\\(\\) got an unknown setting 'bitz'"):
        gc.init(bitz=3)


def test_compressed_allreduce_is_identical_everywhere_and_close():
    rng = np.random.default_rng(gc.rank())
    g = rng.normal(size=(256, 64)).astype(np.float32)
    out = gc.allreduce(g, name="q4", compression={"codec": "maxmin", "bits": 4})
    everyone = gc.allgather(out[None], name="q4.check")
    for r in range(gc.size()):
        np.testing.assert_array_equal(everyone[r], out)  # bit-identical on every rank
    exact = gc.allreduce(g, name="q4.exact", compression="none")
    err = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    assert 1e-4 < err < 0.2
    before = gc.stats()["compressed_bytes_on_wire"]
    gc.allreduce(g, name="q4.bytes", compression="maxmin")
    assert 0 < gc.stats()["compressed_bytes_on_wire"] - before < g.nbytes
    with pytest.raises(ValueError, match="compression must be None"):
        gc.allreduce(g, name="bad", compression="zip")
    with pytest.raises(ValueError, match="unknown compression field 'bitz'"):
        gc.allreduce(g, name="bad2", compression={"codec": "maxmin", "bitz": 3})
    with pytest.raises(ValueError, match="dtype int32 cannot be compressed"):
        gc.allreduce(np.ones((4, 4), np.int32), name="bad3", compression="maxmin")


@pytest.mark.parametrize("shape", [(64, 64), (512, 1024)])  # one SRA pipeline block; several stripes
def test_error_feedback_with_the_exact_codec_hands_the_residuals_over(shape):
    # Three 2-bit averages with error feedback leave each rank's residuals behind; an average of
    # zeros under the same name with codec none and error feedback sends them, exactly: the four
    # results add up to the exact averages (what error feedback owes), and nothing is left.
    rng = np.random.default_rng(gc.rank())
    name, lossy = f"handover{shape[1]}", {"codec": "maxmin", "bits": 2, "error_feedback": True}
    handover = {"codec": "none", "error_feedback": True}
    owed, delivered = np.zeros(shape), np.zeros(shape)
    for step in range(3):
        g = rng.normal(size=shape).astype(np.float32)
        delivered += gc.allreduce(g, name=name, op=gc.Average, compression=lossy)
        owed += gc.allreduce(g, name=f"{name}.exact", op=gc.Average, compression="none")
    zeros = np.zeros(shape, np.float32)
    flushed = gc.allreduce(zeros, name=name, op=gc.Average, compression=handover)
    assert np.abs(flushed).max() > 0.05  # 2-bit steps left residuals to send
    np.testing.assert_allclose(delivered + flushed, owed, atol=2e-5)
    everyone = gc.allgather(flushed[None], name=f"{name}.check")
    for r in range(gc.size()):
        np.testing.assert_array_equal(everyone[r], flushed)  # the same on every rank
    np.testing.assert_array_equal(gc.allreduce(zeros, name=name, op=gc.Average, compression=handover), zeros)


def test_auto_compression_chooses_per_array_records_its_choices_and_names_bad_candidates():
    path = os.path.join(os.environ.get("GRADCOMP_TEST_TMP", "/tmp"), f"gradcomp_auto_{os.getppid()}.json")
    gc.start_timeline(path)
    gc.barrier()
    spec = gc.Compression.auto(interval=2, reference={"codec": "maxmin", "bits": 4, "error_feedback": True},
                               relaxed=None)
    assert spec["codec"] == "auto" and spec["error_feedback"] and spec["interval"] == 2
    rng = np.random.default_rng(gc.rank())
    before = gc.stats()["auto_choices"]
    for step in range(5):
        arrays = {"np.auto.gauss": rng.normal(size=(128, 512)).astype(np.float32),
                  "np.auto.tails": (rng.normal(size=(128, 512)) ** 3).astype(np.float32)}
        outs = {n: gc.allreduce(a, name=n, compression=spec) for n, a in arrays.items()}
        everyone = gc.allgather(np.stack(list(outs.values()))[None], name=f"np.auto.check.{step}")
        for r in range(gc.size()):
            np.testing.assert_array_equal(everyone[r][0], everyone[0][0])
    gc.stop_timeline()
    assert gc.stats()["auto_choices"] - before == 2  # at steps 3 and 5
    choices = gc.compression_choices()
    assert set(choices) >= {"np.auto.gauss", "np.auto.tails"}
    for name in ("np.auto.gauss", "np.auto.tails"):
        c = choices[name]
        assert c["choice"] - before == 2 and c["measured_at"] == 4, c
        assert c["setting"].endswith("+ef"), c
        assert set(c["relative_error"]) == {"none", "fp16", "maxmin8", "maxmin6", "maxmin5", "maxmin4", "maxmin3",
                                            "maxmin2", "maxmin1", "reference"}
        assert c["relative_error"]["none"] == 0 < c["relative_error"]["maxmin8"] < c["relative_error"]["maxmin2"]
        # error feedback: also measured on the gradient plus the residual (none here: on one node
        # the cost model moves both to none at the first choice, which sends and drops it)
        ef = c["relative_error_ef"]
        assert set(ef) == set(c["relative_error"]) and ef["none"] == 0 < ef["maxmin8"] < ef["maxmin2"], c
    gc.barrier()
    if gc.rank() == 0:
        with open(path) as f:
            events = json.load(f)
        os.unlink(path)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        marks = [e for e in events if e["ph"] == "i" and e["name"] == "AUTO_CHOICE"]
        assert {rows[e["tid"]] for e in marks} == {"np.auto.gauss", "np.auto.tails"}
        assert all({"setting", "relative_error", "reference_error", "relative_error_ef"} <= set(e["args"])
                   for e in marks), marks
    g = np.ones((64, 64), np.float32)
    with pytest.raises(ValueError, match="'maxmin9' is not a candidate"):
        gc.allreduce(g, name="np.auto.bad", compression=gc.Compression.auto(["maxmin4", "maxmin9"]))
    with pytest.raises(ValueError, match="interval must be a positive number of steps"):
        gc.Compression.auto(interval=0)
    with pytest.raises(ValueError, match="the reference must be a maxmin setting"):
        gc.Compression.auto(reference={"codec": "topk"})


def test_auto_summary_follows_the_choices_and_says_why_the_cost_model_kept_tensors_raw():
    """On one machine (shared memory, or loopback) the cost model mostly finds the codecs slower
    than the link; whichever way each array went, the summary counts the choices and, for those
    it kept raw, says so with the link it measured."""
    spec = gc.Compression.auto(interval=2)
    rng = np.random.default_rng(30 + gc.rank())
    for step in range(3):
        for name in ("np.summary.big", "np.summary.small"):
            shape = (1024, 1024) if name.endswith("big") else (64, 64)
            gc.allreduce(rng.normal(size=shape).astype(np.float32), name=name, compression=spec)
    choices = {n: c for n, c in gc.compression_choices().items() if n.startswith("np.summary.")}
    assert len(choices) == 2, choices
    summary = gc.auto_summary()
    assert summary.startswith("auto compression, choice "), summary
    everything = gc.compression_choices()
    raw = sum(1 for c in everything.values() if c["setting"] == "none" and c["estimated_seconds"])
    for setting in {c["setting"] for c in everything.values()}:
        count = sum(1 for c in everything.values() if c["setting"] == setting)
        assert f"{setting} x{count}" in summary, summary
    if raw:
        assert (f"The cost model kept {raw} of {len(everything)} tensors uncompressed: it measured this job's link "
                "at ") in summary and "GB/s" in summary, summary
    else:
        assert "uncompressed" not in summary, summary


def test_auto_compression_normalized_weighs_each_array_by_its_own_scale():
    """Two Gaussian arrays, one 100x larger: under the absolute error (the default) the small
    one's hardly counts, and it takes fewer bits; normalized (each array's error over its mean
    square) keeps both at the reference's 4 bits."""
    rng = np.random.default_rng(20 + gc.rank())
    for normalized in (False, True):
        spec = gc.Compression.auto(["maxmin8", "maxmin6", "maxmin5", "maxmin4", "maxmin3", "maxmin2"], interval=2,
                                   normalized=normalized)
        prefix = f"np.normalized.{int(normalized)}."
        for step in range(3):
            for name, scale in (("large", 100.0), ("small", 1.0)):
                gc.allreduce((scale * rng.normal(size=(256, 256))).astype(np.float32), name=prefix + name,
                             compression=spec)
        chose = {n[len(prefix):]: int(c["setting"].split("bits=")[1].split(",")[0])
                 for n, c in gc.compression_choices().items() if n.startswith(prefix)}
        if normalized:
            assert chose == {"large": 4, "small": 4}, chose
        else:
            assert chose["large"] >= 4 > chose["small"], chose


def test_auto_compression_with_relaxed_bits_reports_regimes_and_names_bad_settings():
    """Gradients of one distribution at every step: the summed gradient's norm hardly moves
    between choices, so from the second choice on (the first has nothing to compare with) every
    array is calm, and its budget steps down one bit a choice from the reference's 4 bits to the
    relaxed 2: maxmin3's at the second choice, maxmin2's (every array at 2 bits) at the third."""
    spec = gc.Compression.auto(["maxmin8", "maxmin4", "maxmin2"], interval=2, relaxed={"codec": "maxmin", "bits": 2})
    assert spec["relaxed_bits"] == 2 and spec["critical_change"] == 0.5
    rng = np.random.default_rng(10 + gc.rank())
    seen = []
    for step in range(7):
        for name in ("np.regime.a", "np.regime.b"):
            gc.allreduce(rng.normal(size=(256, 256)).astype(np.float32), name=name, compression=spec)
        if step in (2, 4, 6):  # the choices at steps 3, 5 and 7
            seen.append({n: c for n, c in gc.compression_choices().items() if n.startswith("np.regime.")})
    first, second, third = seen
    for name in ("np.regime.a", "np.regime.b"):
        assert first[name]["critical"] and first[name]["norm_change"] == -1, first[name]
        assert first[name]["budget_bits"] == 4, first[name]
        c = second[name]
        assert not c["critical"] and 0 <= c["norm_change"] < 0.1 and c["budget_bits"] == 3, c
        # maxmin3 is no candidate: its error is measured as a step of the ladder.
        assert c["relative_error"]["relaxed"] > c["relative_error"]["maxmin3"] > c["relative_error"]["reference"], c
        c = third[name]
        assert not c["critical"] and 0 <= c["norm_change"] < 0.1 and c["budget_bits"] == 2, c
        assert c["setting"] == "maxmin(bits=2, bucket=512)", c
        assert c["relative_error"]["relaxed"] == c["relative_error"]["maxmin2"] > c["relative_error"]["reference"], c
    mine = repr(sorted((n, c["setting"], c["critical"]) for n, c in third.items())).encode()
    everyone = gc.allgather(np.frombuffer(hashlib.sha256(mine).digest(), np.uint8)[None], name="np.regime.check")
    assert (everyone == everyone[0]).all()
    absolute = gc.Compression.auto(relaxed=2, normalized=False)
    assert absolute["normalized"] is False and spec["normalized"] is True  # normalized by default
    with pytest.raises(ValueError, match="normalized must be True or False, got 'yes'"):
        gc.Compression.auto(normalized="yes")
    with pytest.raises(ValueError, match="relaxed must have from 1 to fewer than the reference's 4 bits"):
        gc.Compression.auto(relaxed={"codec": "maxmin", "bits": 4})
    with pytest.raises(ValueError, match=r"relaxed may differ from the reference in its bits only; \['bucket_size'\]"):
        gc.Compression.auto(reference={"codec": "maxmin", "bits": 4, "bucket_size": 512},
                            relaxed={"codec": "maxmin", "bits": 2, "bucket_size": 128})
    with pytest.raises(ValueError, match="critical_change must be a positive fraction, got 0"):
        gc.Compression.auto(relaxed=2, critical_change=0)


def test_adasum_equals_the_pairwise_tree_and_refuses_integers():
    """op=Adasum through the NumPy adapter (the algorithm's own suites: test_adasum,
    test_adasum_mpi.py): float64 against the tree of a (+) b written from the formula."""
    def combine(a, b):
        dot = a @ b
        return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b

    shared = np.random.default_rng(5).normal(size=4000)
    mine = shared + (1 + gc.rank()) * np.random.default_rng(50 + gc.rank()).normal(size=4000)
    got = gc.allreduce(mine, op=gc.Adasum, name="np.adasum")
    v = list(gc.allgather(mine[None, :], name="np.adasum.in"))
    p = 1 << (len(v).bit_length() - 1)
    for r in range(p, len(v)):  # a rank beyond the largest power of two folds in first
        v[r - p] = combine(v[r - p], v[r])
    v = v[:p]
    while len(v) > 1:
        v = [combine(v[i], v[i + 1]) for i in range(0, len(v), 2)]
    assert np.linalg.norm(got - v[0]) <= 1e-12 * np.linalg.norm(v[0])
    with pytest.raises(ValueError, match="allreduce of 'np.adasum.int': op adasum needs a floating-point tensor"):
        gc.allreduce(np.ones(8, np.int32), op=gc.Adasum, name="np.adasum.int")
    with pytest.raises(ValueError, match="reducescatter of 'np.adasum.rs': op adasum is an allreduce only"):
        gc.reducescatter(np.ones((4, 2), np.float32), op=gc.Adasum, name="np.adasum.rs")


def test_timeline_records_phases_and_per_rank_ready_marks():
    path = os.path.join(os.environ.get("GRADCOMP_TEST_TMP", "/tmp"), f"gradcomp_timeline_{os.getppid()}.json")
    gc.start_timeline(path)
    gc.barrier()  # rank 0 records from here on: every rank's requests are seen
    for step in range(3):
        handles = [gc.allreduce_async(np.ones(1000, np.float32), name=f"tl.{i}") for i in range(5)]
        for h in handles:
            gc.synchronize(h)
        if gc.rank() == 0 and step == 1:
            # Valid JSON while recording (a read can still race a write in progress: retry).
            for attempt in range(50):
                try:
                    with open(path) as f:
                        json.load(f)
                    break
                except json.JSONDecodeError:
                    time.sleep(0.01)
            else:
                pytest.fail("timeline file never parsed as JSON while recording")
    gc.allgather(np.ones((gc.rank() + 1, 2)), name="tl.gather")
    gc.allreduce(np.ones((64, 64), np.float32), name="tl.q", compression={"codec": "maxmin", "bits": 4})
    gc.stop_timeline()
    gc.barrier()
    if gc.rank() != 0:
        return
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"tl.0", "tl.4", "tl.gather"} <= set(rows.values())
    by_tensor = {}
    for e in events:
        if e["ph"] != "M":
            by_tensor.setdefault(rows[e["tid"]], []).append(e)
    phases = {e["name"] for e in by_tensor["tl.0"]}
    assert {"NEGOTIATE", "COMMUNICATE"} <= phases
    marks = [e["name"] for e in by_tensor["tl.0"] if e["ph"] == "i"]
    assert set(marks) == {f"rank {r} ready" for r in range(gc.size())} | {"queued"}
    # Rank 0 marks every hand-over, also the cached ones that have no NEGOTIATE row.
    assert marks.count("queued") == 3
    ends = [e for e in by_tensor["tl.0"] if e["ph"] == "E" and e["name"] == "COMMUNICATE"]
    assert ends and ends[0]["args"]["dtype"] == "float32" and ends[0]["args"]["shape"] == [1000]
    assert ends[0]["args"]["bytes"] == 4000 and ends[0]["args"]["ratio"] == 1
    # The uncompressed table's row (one node: its communicator; else the world's) and its estimate.
    one_node = gc.cross_size() == 1
    assert ends[0]["args"]["algorithm"] == ("node" if one_node else "communicator")
    assert ends[0]["args"]["estimated_messages"] == 2 * ((gc.local_size() if one_node else gc.size()) - 1)
    # Begin/end pairs balance per tensor and phase; timestamps never go backwards per row.
    for tensor, evs in by_tensor.items():
        for phase in {e["name"] for e in evs if e["ph"] in "BE"}:
            b = sum(1 for e in evs if e["name"] == phase and e["ph"] == "B")
            assert b == sum(1 for e in evs if e["name"] == phase and e["ph"] == "E"), (tensor, phase)
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)
    q = {e["name"] for e in by_tensor["tl.q"]}
    assert {"COMPRESS", "COMMUNICATE", "DECOMPRESS", "ALLREDUCE"} <= q
    end = [e for e in by_tensor["tl.q"] if e["name"] == "ALLREDUCE" and e["ph"] == "E"][0]["args"]
    assert end["bytes"] == 64 * 64 * 4 and 0 < end["wire_bytes"] < end["bytes"]
    assert end["ratio"] > 4 and end["codec"].startswith("maxmin(bits=4")
    # The table's row and its estimate: the flat SRA, 2 (n - 1) messages a rank.
    assert end["algorithm"] == "sra" and end["estimated_messages"] == 2 * (gc.size() - 1)


def test_the_launch_variables_choose_the_world_and_bad_ones_are_named():
    assert world.env_world({"OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"}) is None  # MPI's wins
    assert world.env_world({}) is None
    assert world.env_world({"RANK": "1", "WORLD_SIZE": "3"}) == (1, 3)
    with pytest.raises(ValueError, match=r"RANK='one' and WORLD_SIZE='3' must be integers \(set by torchrun"):
        world.env_world({"RANK": "one", "WORLD_SIZE": "3"})
    with pytest.raises(ValueError, match=r"RANK=3 is not a rank of WORLD_SIZE=3"):
        world.env_world({"RANK": "3", "WORLD_SIZE": "3"})

