"""op=hvd.Adasum under mpirun (np 3: a rank beyond the power of two folds in first; np 4 on
2 nodes x 2): allreduce and grouped allreduce of every float dtype against a float64 tree
written from the formula, per tensor within a fusion, with Horovod's compressors, the misuses
that must fail, and DistributedOptimizer(op=Adasum) (Horovod's delta optimizer) on a model of
1.05M parameters against each rank's own optimizer and the tree of their updates.
Every rank runs the same tests in the same order (they are collective)."""
import copy

import pytest
import torch

import gradcomp.torch as hvd


@pytest.fixture(scope="module", autouse=True)
def runtime():
    hvd.init()
    yield
    hvd.shutdown()


def combine(a, b):
    """a (+) b on whole float64 vectors, straight from the definition."""
    a, b = a.double().flatten(), b.double().flatten()
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 if aa == 0 else 1 - dot / (2 * aa)
    cb = 1.0 if bb == 0 else 1 - dot / (2 * bb)
    return ca * a + cb * b


def tree(vectors):
    """Ranks beyond the largest power of two p fold into rank - p; then pairs (2i, 2i+1), ..."""
    v = list(vectors)
    p = 1
    while 2 * p <= len(v):
        p *= 2
    for r in range(p, len(v)):
        v[r - p] = combine(v[r - p], v[r])
    v = v[:p]
    while len(v) > 1:
        v = [combine(v[i], v[i + 1]) for i in range(0, len(v), 2)]
    return v[0]


def everyones(x, name):
    """Every rank's tensor, in rank order."""
    return list(hvd.allgather(x.unsqueeze(0), name=name))


def rank_vector(shape, shared_seed, scale=1.0):
    """A component every rank shares plus one of its own (coefficients far from 1 and 1/2)."""
    shared = torch.randn(shape, generator=torch.Generator().manual_seed(shared_seed))
    own = torch.randn(shape, generator=torch.Generator().manual_seed(1000 + 7 * hvd.rank() + shared_seed))
    return shared + scale * (1 + 0.3 * hvd.rank()) * own


def rel(got, want):
    return float((got.double().flatten() - want).norm() / want.norm())


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-6), (torch.float64, 1e-12), (torch.float16, 4e-3),
                                         (torch.bfloat16, 3e-2)])
def test_allreduce_equals_the_tree(dtype, bound):
    x = rank_vector((257, 129), 1, 0.8).to(dtype)
    got = hvd.allreduce(x, op=hvd.Adasum, name=f"ada.{dtype}")
    assert got.dtype == dtype
    want = tree([t.double() for t in everyones(x, f"ada.in.{dtype}")])
    assert rel(got, want) <= bound
    # The same bits on every rank.
    for other in everyones(got, f"ada.out.{dtype}"):
        assert torch.equal(other, got)
    # In place, with scale factors: Adasum is scale-free, so the result scales with them.
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=4.0, name=f"ada.inplace.{dtype}")
    assert rel(y, 2.0 * want) <= 2 * bound


def test_each_tensor_of_a_group_has_its_own_coefficients():
    """One fusion: a tensor equal on every rank stays itself (a (+) a = a); one whose ranks hold
    disjoint coordinates is their sum; a third follows the tree on its own."""
    me, n = hvd.rank(), hvd.size()
    same = torch.linspace(-1, 1, 4096).reshape(64, 64)
    disjoint = torch.zeros(n, 1000)
    disjoint[me] = 1.0 + me
    mixed = rank_vector((333,), 2)
    a, b, c = hvd.grouped_allreduce([same, disjoint, mixed], op=hvd.Adasum, name="ada.group")
    assert torch.allclose(a, same, rtol=0, atol=1e-6)
    assert torch.equal(b, sum(torch.eye(n)[r].unsqueeze(1).expand(n, 1000) * (1.0 + r) for r in range(n)))
    assert rel(c, tree([t.double() for t in everyones(mixed, "ada.group.in")])) <= 1e-6


def test_million_element_tensor_with_the_fp16_compressor():
    x = rank_vector((1024, 1024), 3)
    want = tree([t.double() for t in everyones(x, "ada.big.in")])
    exact = hvd.allreduce(x, op=hvd.Adasum, name="ada.big")
    assert rel(exact, want) <= 1e-6
    # Horovod's fp16 compressor casts the tensor first; the result comes back float32.
    half = hvd.allreduce(x, op=hvd.Adasum, compression=hvd.Compression.fp16, name="ada.big.fp16")
    assert half.dtype == torch.float32
    assert 1e-5 < rel(half, want) <= 4e-3


def test_misuse_fails_with_a_clear_error_on_every_rank():
    x = torch.ones(16, 16)
    with pytest.raises(ValueError, match=r"op Adasum needs a floating-point tensor, got torch.int32"):
        hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Adasum, name="ada.int")
    with pytest.raises(ValueError, match=r"op Adasum runs on exact values .* compression Compression.maxmin"):
        hvd.allreduce(x, op=hvd.Adasum, compression=hvd.Compression.maxmin(bits=4), name="ada.mm")
    # Horovod raises a RuntimeError for a reducescatter with Adasum; NotImplementedError is one.
    with pytest.raises(NotImplementedError, match="reducescatter: op Adasum is an allreduce only"):
        hvd.reducescatter(x, op=hvd.Adasum, name="ada.rs")
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="overlap_forward is not supported with op=Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                 op=hvd.Adasum, overlap_forward=model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   op=hvd.Adasum)
    with pytest.raises(AssertionError, match="Skipping synchronization is not supported"):
        with opt.skip_synchronize():
            pass
    # The runtime still works after all of these.
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, name="ada.after"), x * hvd.size())


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def _batch(step, pass_):
    g = torch.Generator().manual_seed(100 * step + 10 * pass_ + hvd.rank())
    return torch.randn(32, 1024, generator=g), torch.randint(0, 10, (32,), generator=g)


@pytest.mark.parametrize("make_opt,passes", [(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), 1),
                                             (lambda p: torch.optim.Adam(p, lr=1e-3), 2)])
def test_distributed_optimizer_combines_each_ranks_update(make_opt, passes):
    """Each rank's wrapped optimizer steps on its own gradients (its state follows them); the
    parameters become their value before the step plus the tree of every rank's update."""
    model = _model()
    assert sum(p.numel() for p in model.parameters()) > 1_000_000
    local = copy.deepcopy(model)  # this rank's own optimizer, stepped by hand
    local_opt = make_opt(local.parameters())
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), model.named_parameters(), op=hvd.Adasum,
                                   backward_passes_per_step=passes)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for q, p in zip(local.parameters(), before):
                q.copy_(p)
        opt.zero_grad()
        local_opt.zero_grad()
        for pass_ in range(passes):
            x, y = _batch(step, pass_)
            loss_fn(model(x), y).backward()
            loss_fn(local(x), y).backward()
        local_opt.step()
        opt.step()
        for i, (p, q, b) in enumerate(zip(model.parameters(), local.parameters(), before)):
            deltas = [d.double() for d in everyones(q.detach() - b, f"ada.opt.delta.{step}.{i}")]
            want = b.double().flatten() + tree(deltas)
            got = p.detach().double().flatten()
            assert float((got - want).norm() / (want - b.double().flatten()).norm()) <= 1e-4, (step, i)
            for other in everyones(p.detach(), f"ada.opt.param.{step}.{i}"):
                assert torch.equal(other, p.detach())


def test_identical_data_trains_as_one_process():
    """a (+) a = a: with the same batch on every rank the model follows single-process training."""
    model, single = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   op=hvd.Adasum)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = torch.randn(32, 1024, generator=g), torch.randint(0, 10, (32,), generator=g)
        for m, o in ((model, opt), (single, single_opt)):
            o.zero_grad()
            loss_fn(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), single.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)
