"""gradcomp.torch behaves as Horovod's torch API does, in this project's words (under mpirun
-np 2 and 3): int16 tensors, alltoall's return value and its even-split rule, grouped
reducescatter, gradients through grouped allreduce / allgather / reducescatter / alltoall,
join semantics, HorovodInternalError, sparse allreduce and sparse gradients in the
DistributedOptimizer, the optimizer without named_parameters, broadcast_optimizer_state's
gradients, Average as a true division, and unnamed calls whose numbering drifted apart.
Every rank runs the same tests in the same order (they are collective)."""
import copy
import inspect
import time

import pytest
import torch

import gradcomp.torch as hvd
from mpi_fixtures import torch_runtime


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from torch_runtime("gradcomp", salt="parity")


def test_int16_goes_through_every_collective():
    me, n = hvd.rank(), hvd.size()
    x = torch.arange(6, dtype=torch.int16).reshape(3, 2) + me * 100
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, name="i16.ar"),
                       sum(torch.arange(6, dtype=torch.int16).reshape(3, 2) + r * 100 for r in range(n)))
    gathered = hvd.allgather(x, name="i16.ag")
    assert gathered.dtype == torch.int16 and gathered.shape == (3 * n, 2)
    assert torch.equal(gathered[3 * me:3 * me + 3], x)
    assert torch.equal(hvd.broadcast(x, 0, name="i16.bc"), torch.arange(6, dtype=torch.int16).reshape(3, 2))
    y = torch.full((n, 2), me, dtype=torch.int16)
    got = hvd.alltoall(y, name="i16.a2a")
    assert got.dtype == torch.int16 and torch.equal(got[:, 0], torch.arange(n, dtype=torch.int16))


def test_alltoall_returns_the_tensor_and_splits_only_when_splits_are_given():
    me, n = hvd.rank(), hvd.size()
    x = torch.arange(2 * n, dtype=torch.float32) + 10 * me
    out = hvd.alltoall(x, name="a2a.even")
    assert isinstance(out, torch.Tensor)
    expected = torch.cat([torch.arange(2 * me, 2 * me + 2, dtype=torch.float32) + 10 * p for p in range(n)])
    assert torch.equal(out, expected)
    splits = [1 + p % 2 for p in range(n)]
    x = torch.ones(sum(splits)) * me
    out, received = hvd.alltoall(x, splits=splits, name="a2a.splits")
    assert received.tolist() == [1 + me % 2] * n
    assert torch.equal(out, torch.cat([torch.full((1 + me % 2,), float(p)) for p in range(n)]))
    # The async form always yields both.
    out, received = hvd.synchronize(hvd.alltoall_async(torch.zeros(n), name="a2a.async"))
    assert received.tolist() == [1] * n


def test_alltoall_without_splits_needs_a_multiple_of_the_ranks():
    n = hvd.size()
    with pytest.raises(ValueError, match=rf"first dimension \({n + 1}\) must be a multiple of the number of ranks "
                                         rf"\({n}\)"):
        hvd.alltoall(torch.zeros(n + 1), name="a2a.uneven")


def test_gradients_flow_through_alltoall():
    n = hvd.size()
    x = torch.arange(3 * n, dtype=torch.float32).reshape(n, 3).requires_grad_()
    out = hvd.alltoall(x, name="a2a.grad")
    (out * torch.arange(1, n + 1, dtype=torch.float32).reshape(n, 1)).sum().backward()
    # Row p went to rank p, where it sits at row `me` with weight me + 1.
    assert torch.equal(x.grad, torch.full((n, 3), float(hvd.rank() + 1)))
    splits = [1] * n
    out, _ = hvd.alltoall(x, splits=splits, name="a2a.grad.splits")
    x.grad = None
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones(n, 3))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_grouped_reducescatter_equals_one_reducescatter_per_tensor(op):
    me, n = hvd.rank(), hvd.size()
    tensors = [torch.arange(4 * n * k, dtype=torch.float64).reshape(4 * n, k) * (me + 1) for k in (1, 2, 3)]
    grouped = hvd.grouped_reducescatter(tensors, op=op, name=f"grs.{op}", prescale_factor=0.5, postscale_factor=3.0)
    for k, (t, got) in enumerate(zip(tensors, grouped)):
        single = hvd.reducescatter(t, op=op, name=f"rs.{op}.{k}", prescale_factor=0.5, postscale_factor=3.0)
        assert torch.equal(got, single)
        total = sum(torch.arange(4 * n * t.shape[1], dtype=torch.float64).reshape(4 * n, -1) * (r + 1)
                    for r in range(n)) * 1.5
        if op == hvd.Average:
            total = total / n
        torch.testing.assert_close(got, total[4 * me:4 * me + 4])
    handle = hvd.grouped_reducescatter_async(tensors, op=op, name=f"grs.async.{op}")
    assert [t.shape for t in hvd.synchronize(handle)] == [(4, 1), (4, 2), (4, 3)]


@pytest.mark.parametrize("op,factor", [(hvd.Sum, "size"), (hvd.Average, 1)])
def test_reducescatter_gradients_are_horovods(op, factor):
    n = hvd.size()
    expected = float(n if factor == "size" else factor)
    x = torch.rand(2 * n, 3, dtype=torch.float64).requires_grad_()
    hvd.reducescatter(x, op=op, name=f"rs.grad.{op}").sum().backward()
    assert torch.equal(x.grad, torch.full((2 * n, 3), expected, dtype=torch.float64))
    a, b = (torch.rand(n, 2).requires_grad_() for _ in range(2))
    ra, rb = hvd.grouped_reducescatter([a, b], op=op, name=f"grs.grad.{op}")
    (ra.sum() + 2 * rb.sum()).backward()
    assert torch.equal(a.grad, torch.full((n, 2), expected)) and torch.equal(b.grad, torch.full((n, 2), 2 * expected))


def test_gradients_flow_through_grouped_allreduce_and_allgather():
    me, n = hvd.rank(), hvd.size()
    a, b = torch.ones(3, requires_grad=True), torch.ones(2, 2, requires_grad=True)
    ra, rb = hvd.grouped_allreduce([a, b], op=hvd.Sum, name="gar.grad")
    (ra.sum() * (me + 1) + rb.sum()).backward()
    assert torch.equal(a.grad, torch.full((3,), float(sum(range(1, n + 1)))))
    assert torch.equal(b.grad, torch.full((2, 2), float(n)))
    a, b = torch.ones(me + 1, 2, requires_grad=True), torch.ones(2, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b], name="gag.grad")
    assert ga.shape == (sum(range(1, n + 1)), 2) and gb.shape == (2 * n,)
    (ga.sum() * 2 + gb.sum()).backward()
    # Averaged over ranks (every rank's output gradient is the same here), this rank's rows.
    assert torch.equal(a.grad, torch.full((me + 1, 2), 2.0)) and torch.equal(b.grad, torch.ones(2))


def test_after_a_join_only_allreduce_goes_on():
    me, n = hvd.rank(), hvd.size()
    if me == 0:
        last = hvd.join()
    else:
        for what, call in [("allgather", lambda: hvd.allgather(torch.ones(2), name="j.ag")),
                           ("broadcast", lambda: hvd.broadcast(torch.ones(2), 1, name="j.bc")),
                           ("reducescatter", lambda: hvd.reducescatter(torch.ones(n), name="j.rs")),
                           ("alltoall", lambda: hvd.alltoall(torch.ones(n), name="j.a2a"))]:
            with pytest.raises(RuntimeError, match=rf"{what} of tensor 'j\.\w+': not supported while ranks have "
                                                   r"joined \(rank 0\)"):
                call()
        # Rank 0 contributes zeros.
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="j.ar"), torch.full((2,), n - 1.0))
        last = hvd.join()
    # Which of the later ranks joins last is a matter of timing; every rank is told the same.
    assert last != 0 and hvd.allgather_object(last, name="j.last") == [last] * n
    assert torch.equal(hvd.allgather(torch.ones(1), name="j.after"), torch.ones(n))


def test_horovod_internal_error_is_what_failed_collectives_raise():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    shape = (2, 3) if hvd.rank() == 0 else (3, 2)
    with pytest.raises(hvd.HorovodInternalError, match="mismatched shape"):
        hvd.allreduce(torch.ones(shape), name="hie.shape")


def test_a_local_error_on_one_rank_leaves_unnamed_calls_in_step():
    # Rank 0's failed calls never reach the runtime, so they use up no unnamed numbers: the
    # next unnamed calls still meet their partners on every rank.
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="complex64"):
            hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
        with pytest.raises(ValueError, match="first dimension"):
            hvd.alltoall(torch.zeros(hvd.size() + 1))
    start = time.monotonic()
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), hvd.size() * 1.0))
    assert hvd.alltoall(torch.ones(hvd.size())).shape == (hvd.size(),)
    assert time.monotonic() - start < 30


def test_average_is_a_true_division():
    n = hvd.size()
    x = torch.rand(1000, dtype=torch.float32, generator=torch.Generator().manual_seed(7)) * 100
    got = hvd.allreduce(x * (hvd.rank() + 1), op=hvd.Average, name="avg.div")
    total = hvd.allreduce(x * (hvd.rank() + 1), op=hvd.Sum, name="avg.sum")
    assert torch.equal(got, total / n)


def test_sparse_allreduce_equals_the_dense_allreduce():
    g = torch.Generator().manual_seed(hvd.rank())
    for i, rows in enumerate([5, 17, 40]):
        dense = torch.rand(rows, 4, generator=g)
        dense[dense < 0.7] = 0
        result = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{i}", op=hvd.Average)()
        assert result.is_sparse
        torch.testing.assert_close(result.to_dense(), hvd.allreduce(dense, name=f"dense.{i}"))
    with pytest.raises(ValueError, match="sparse_allreduce_async expects a sparse COO tensor, got Tensor with layout "
                                         "torch.strided"):
        hvd.sparse_allreduce_async(torch.ones(2), name="sparse.bad")
    with pytest.raises(ValueError, match="sparse allreduce supports Sum and Average"):
        hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), name="sparse.min", op=hvd.Min)


def test_grouped_calls_need_a_tensor():
    for call, what in [(hvd.grouped_allreduce, "grouped allreduce"), (hvd.grouped_allgather, "grouped allgather"),
                       (hvd.grouped_reducescatter, "grouped reducescatter")]:
        with pytest.raises(ValueError, match=f"{what} needs at least one tensor"):
            call([])
    with pytest.raises(ValueError, match=r"grouped reducescatter 'g\.rs' needs at least one tensor"):
        hvd.grouped_reducescatter_async([], name="g.rs")


# Horovod 0.28.1's positional parameters (horovod/torch/mpi_ops.py), which a call written for
# Horovod passes in this order; gradcomp's own parameters may only follow them.
HOROVOD_POSITIONAL = {
    "allreduce": "tensor average name compression op prescale_factor postscale_factor process_set",
    "allreduce_async": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_async_": "tensor average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce": "tensors average name compression op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async": "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_": "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async_": "tensors average name op prescale_factor postscale_factor process_set",
    "allgather": "tensor name process_set",
    "allgather_async": "tensor name process_set",
    "grouped_allgather": "tensors name process_set",
    "grouped_allgather_async": "tensors name process_set",
    "broadcast": "tensor root_rank name process_set",
    "broadcast_async": "tensor root_rank name process_set",
    "broadcast_": "tensor root_rank name process_set",
    "broadcast_async_": "tensor root_rank name process_set",
    "alltoall": "tensor splits name process_set",
    "alltoall_async": "tensor splits name process_set",
    "reducescatter": "tensor name compression op process_set prescale_factor postscale_factor",
    "reducescatter_async": "tensor name op process_set prescale_factor postscale_factor",
    "grouped_reducescatter": "tensors name compression op process_set prescale_factor postscale_factor",
    "grouped_reducescatter_async": "tensors name op process_set prescale_factor postscale_factor",
    "sparse_allreduce_async": "tensor name op process_set",
    "join": "device",
    "barrier": "process_set",
}


@pytest.mark.parametrize("function", sorted(HOROVOD_POSITIONAL))
def test_collectives_take_horovods_arguments_in_horovods_order(function):
    params = list(inspect.signature(getattr(hvd, function)).parameters)
    expected = HOROVOD_POSITIONAL[function].split()
    assert params[:len(expected)] == expected


def test_positional_calls_written_for_horovod_mean_the_same():
    me, n = hvd.rank(), hvd.size()
    x = torch.arange(2 * n, dtype=torch.float32) * (me + 1)
    total = torch.arange(2 * n, dtype=torch.float32) * sum(range(1, n + 1))
    # (tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    got = hvd.synchronize(hvd.allreduce_async(x, None, "pos.ar", hvd.Sum, 0.5, 4.0, hvd.global_process_set))
    torch.testing.assert_close(got, total * 2)
    y = x.clone()
    hvd.allreduce_(y, None, "pos.ar_", hvd.Sum, 1.0, 1.0, hvd.global_process_set)
    torch.testing.assert_close(y, total)
    a, b = hvd.grouped_allreduce_([x.clone(), x.clone() * 2], None, "pos.gar_", hvd.Sum, 1.0, 0.5,
                                  hvd.global_process_set)
    torch.testing.assert_close(a, total / 2)
    torch.testing.assert_close(b, total)
    # (tensor, name, compression, op, process_set, prescale_factor, postscale_factor)
    rows = hvd.reducescatter(x, "pos.rs", hvd.Compression.fp16, hvd.Sum, hvd.global_process_set, 2.0, 1.0)
    assert rows.dtype == torch.float32
    torch.testing.assert_close(rows, (total * 2)[2 * me:2 * me + 2])
    rows = hvd.synchronize(hvd.reducescatter_async(x, "pos.rs.async", hvd.Sum, hvd.global_process_set, 1.0, 3.0))
    torch.testing.assert_close(rows, (total * 3)[2 * me:2 * me + 2])
    (r,) = hvd.grouped_reducescatter([x], "pos.grs", hvd.Compression.bf16, hvd.Average)
    torch.testing.assert_close(r, (total / n)[2 * me:2 * me + 2], rtol=1e-2, atol=0)


def test_reducescatter_casts_as_horovods_compression_quantizes_with_maxmin_and_refuses_the_others():
    n, me = hvd.size(), hvd.rank()
    x = torch.full((n, 3), 1.0 + 2 ** -20, dtype=torch.float32, requires_grad=True)  # rounds to 1.0 in fp16
    out = hvd.reducescatter(x, name="rs.fp16", compression=hvd.Compression.fp16, op=hvd.Sum)
    assert out.dtype == torch.float32 and torch.equal(out.detach(), torch.full((1, 3), float(n)))
    out.sum().backward()
    assert torch.equal(x.grad, torch.full((n, 3), float(n)))
    # maxmin in the runtime: each rank's pieces of its peers' rows quantized (4 bits, buckets of
    # 64), each row summed by its owner in float32: within half a unit of each peer's bucket.
    torch.manual_seed(5 + me)
    g = torch.randn(4 * n, 1024)
    rows = hvd.reducescatter(g, name="rs.maxmin", compression=hvd.Compression.maxmin(4, bucket_size=64), op=hvd.Sum)
    everyone = hvd.allgather(g.unsqueeze(0), name="rs.maxmin.inputs")
    exact = everyone.double().sum(0)[4 * me:4 * me + 4]
    units = [(p[4 * me:4 * me + 4].reshape(-1, 64).amax(1) - p[4 * me:4 * me + 4].reshape(-1, 64).amin(1)) / 15
             for r, p in enumerate(everyone) if r != me]
    bound = (sum(units) / 2).double().repeat_interleave(64).reshape(4, 1024) + 1e-5
    assert ((rows.double() - exact).abs() <= bound).all()
    assert (rows.double() - exact).abs().max() > 0  # quantized, not exact
    # auto in the runtime, a setting for this name: until its first choice, its reference (4 bits).
    auto = hvd.reducescatter(g, name="rs.auto", compression=hvd.Compression.auto(interval=2), op=hvd.Sum)
    error = float((auto.double() - exact).norm() / exact.norm())
    assert 0 < error < 0.2, error
    for codec in (hvd.Compression.topk(0.1), hvd.Compression.powersgd(1)):
        with pytest.raises(ValueError, match=r"reducescatter of 'rs\.codec': compression .* compresses allreduces "
                                             r"only; a reducescatter takes Compression\.none, fp16, bf16, maxmin\(\.\.\.\) "
                                             r"or auto\(\.\.\.\)"):
            hvd.reducescatter(x, name="rs.codec", compression=codec)
    with pytest.raises(ValueError, match=r"grouped reducescatter 'grs\.codec': compression Compression\.topk"):
        hvd.grouped_reducescatter([x], name="grs.codec", compression=hvd.Compression.topk(0.1))
    with pytest.raises(ValueError, match=r"reducescatter of 'rs\.bad': compression must be a gradcomp\.torch\."
                                         r"Compression choice or have compress\(\) and decompress\(\), got 'fp16'"):
        hvd.reducescatter(x, name="rs.bad", compression="fp16")


def test_distributed_optimizer_takes_horovods_arguments_in_horovods_order():
    """Horovod's positional order, with its deprecated num_groups (groups, with a warning)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    ref = copy.deepcopy(model)  # this rank's own gradients (the hooks reduce the model's in place, at once)
    with pytest.warns(DeprecationWarning, match="num_groups"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                       hvd.Compression.none, 1, hvd.Sum, 1.0, 2, None, False, hvd.global_process_set)
    assert sorted(set(opt._groups.values())) == [0, 1]
    x = torch.full((4, 8), 1.0 + hvd.rank())
    opt.zero_grad()
    model(x).sum().backward()
    ref(x).sum().backward()
    local = [p.grad for p in ref.parameters()]
    opt.synchronize()
    summed = [hvd.allreduce(g, op=hvd.Sum, name=f"num_groups.check.{i}") for i, g in enumerate(local)]
    for p, want in zip(model.parameters(), summed):
        torch.testing.assert_close(p.grad, want)
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients_train_identically_on_every_rank(sparse_as_dense):
    torch.manual_seed(0)
    model = torch.nn.Embedding(50, 8, sparse=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    g = torch.Generator().manual_seed(hvd.rank())
    for _ in range(3):
        idx = torch.randint(0, 50, (4, 6), generator=g)
        opt.zero_grad()
        model(idx).pow(2).sum().backward()
        expected = hvd.allreduce(model.weight.grad.to_dense(), name=f"sparse.ref.{sparse_as_dense}")
        opt.synchronize()
        assert model.weight.grad.is_sparse
        torch.testing.assert_close(model.weight.grad.to_dense(), expected)
        with opt.skip_synchronize():
            opt.step()
    weights = hvd.allgather(model.weight.detach().unsqueeze(0), name=f"sparse.w.{sparse_as_dense}")
    for r in range(hvd.size()):
        assert torch.equal(weights[r], weights[0])


def test_optimizer_without_named_parameters_names_them_the_same_on_every_rank():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": model[0].parameters()},
                                                    {"params": model[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    assert set(names) == set(model.parameters()) and len(set(names.values())) == 4
    everyone = hvd.allgather_object(sorted(names.values()))
    assert all(v == everyone[0] for v in everyone)


def test_broadcast_optimizer_state_leaves_zero_gradients_where_there_were_none():
    a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    b = torch.nn.Parameter(torch.rand(4))
    before = b.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b], lr=0.1, momentum=0.9, weight_decay=0.01),
                                   named_parameters=[("a", a), ("b", b)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert a.grad is None
    assert torch.equal(b.grad, torch.zeros(4))
    assert torch.equal(b.detach(), before)  # the initializing step is undone
