"""FSDP2 on backend gradcomp under mpirun (-np 2, 3, and 4 as 2 nodes x 2): torch's fully_shard,
HSDP on a 2-D mesh and the FSDP2-based replicate() train a 4.1M-parameter model of five FSDP
modules (four blocks and the root; shards uneven at -np 3).

- Exact (the settings at none): every configuration FSDP2 offers (fp32, bf16 under
  MixedPrecisionPolicy, reshard_after_forward True and False, set_gradient_divide_factor's
  PREMUL_SUM, set_force_sum_reduction_for_comms' SUM, HSDP, replicate()) gives gloo's losses.
- Compressed through compress_fsdp (4-bit gradients with error feedback, 8-bit weights): fewer
  bytes, gloo's training within a margin, the same unsharded weights on every rank, replicas
  bit-identical, HSDP exact inside a node and compressed across nodes, each error memory the
  module's whatever order the modules run in, a fresh memory where a gradient changes size,
  auto's choices per module.

Run by ctest as: mpirun -np N python -m pytest test/python/test_fsdp2_mpi.py (torch >= 2.9).
Every rank runs the same tests in the same order (they are collective)."""
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import gradcomp.torch as hvd
from gradcomp.torch import backend, compat
import fsdp_model
from fsdp_model import Block, digest
from mpi_fixtures import torch_runtime

WIDTH, HIDDEN, BLOCKS, PER_RANK, STEPS = 512, 1000, 4, 16, 6
GRADIENTS = hvd.Compression.maxmin(bits=4, error_feedback=True)
WEIGHTS = hvd.Compression.maxmin(bits=8)


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from torch_runtime("gradcomp", "fsdp2")


def shape_2d():
    """HSDP's mesh (replicas, shard): nodes of two ranks at -np 4, one replica a rank below."""
    n = hvd.size()
    shard = 2 if n % 2 == 0 and n > 2 else 1
    return n // shard, shard


@pytest.fixture(scope="module")
def meshes():
    """1-D and 2-D meshes on gradcomp and on gloo, made once (each group of some ranks is a runtime)."""
    n = hvd.size()
    names = ("replicate", "shard")
    return {
        ("gradcomp", 1): init_device_mesh("cpu", (n,)),
        ("gloo", 1): init_device_mesh("cpu", (n,), backend_override={0: "gloo"}),
        ("gradcomp", 2): init_device_mesh("cpu", shape_2d(), mesh_dim_names=names),
        ("gloo", 2): init_device_mesh("cpu", shape_2d(), mesh_dim_names=names,
                                      backend_override={0: "gloo", 1: "gloo"}),
    }


@pytest.fixture(scope="module")
def gloo():
    return dist.new_group(backend="gloo")


def make_model(seed=0):
    return fsdp_model.make_model(WIDTH, HIDDEN, BLOCKS, seed)


def batch():
    return fsdp_model.batch(WIDTH, PER_RANK)


def wrap(model, mesh, how="fully_shard", **kwargs):
    """Each block an FSDP2 module, then the root: fully_shard, or replicate()."""
    if how == "replicate":
        from torch.distributed._composable.replicate_with_fsdp import replicate as apply
    else:
        apply = fully_shard
    for block in model[:BLOCKS]:
        apply(block, mesh=mesh, **kwargs)
    apply(model, mesh=mesh, **kwargs)
    return model


def train(model, steps=STEPS, lr=0.02):
    """SGD with momentum; every step's loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = batch()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run(backend_name, meshes, dims=1, how="fully_shard", setup=None, **kwargs):
    model = wrap(make_model(), meshes[(backend_name, dims)], how, **kwargs)
    if setup is not None:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                setup(module)
    return model, train(model)


def premul(factor):
    return lambda module: module.set_gradient_divide_factor(factor)


def force_sum(module):
    module.set_force_sum_reduction_for_comms(True)


EXACT_CASES = {
    "fp32": {},
    "keep_unsharded_after_forward": {"reshard_after_forward": False},
    "bf16": {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
    "bf16_reduced_in_fp32": {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                               reduce_dtype=torch.float32)},
    "force_sum": {"setup": force_sum},
}


@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_fully_shard_gives_gloos_losses(meshes, case):
    """Bit for bit but for float rounding; bf16's reduction sums in bf16 in another order than
    gloo's ring from three ranks on (each as accurate: the test below), so its losses agree to
    bf16's precision there."""
    kwargs = EXACT_CASES[case]
    _, losses = run("gradcomp", meshes, **kwargs)
    _, reference = run("gloo", meshes, **kwargs)
    close = {"abs": 2e-3 * reference[0]} if case == "bf16" and hvd.size() > 2 else {"rel": 1e-5}
    assert losses == pytest.approx(reference, **close), (losses, reference)
    assert losses[-1] < losses[0]


def test_bf16_reduce_scatter_is_as_accurate_as_gloos(gloo):
    """FSDP2's bf16 gradients averaged (reduce_scatter_tensor, AVG): against the float64 mean of
    the same bf16 values, the mean error (in units of bf16's rounding of the values' mean
    magnitude) is gloo's within 10%."""
    n, me, count = hvd.size(), hvd.rank(), 200_000
    torch.manual_seed(11 + me)
    grads = torch.randn(n * count).bfloat16()
    everyone = [torch.empty_like(grads) for _ in range(n)]
    dist.all_gather(everyone, grads, group=gloo)
    mine = torch.stack([g.double() for g in everyone]).reshape(n, n, count)[:, me]
    exact, unit = mine.mean(0), mine.abs().mean(0) * 2 ** -8
    errors = {}
    for label, group in (("gradcomp", None), ("gloo", gloo)):
        out = torch.empty(count, dtype=torch.bfloat16)
        compat.reduce_scatter_tensor(out, grads, op=dist.ReduceOp.AVG, group=group)
        errors[label] = ((out.double() - exact).abs() / unit).mean().item()
    assert errors["gradcomp"] <= 1.1 * errors["gloo"], errors


def test_gradient_divide_factor_is_premul_sum(meshes):
    """set_gradient_divide_factor makes FSDP2 reduce-scatter with PREMUL_SUM(1/f), which gloo
    refuses; gloo's SUM with FSDP2's own division after it is the reference."""
    factor = 1.5 * hvd.size()
    _, losses = run("gradcomp", meshes, setup=premul(factor))
    _, reference = run("gloo", meshes, setup=lambda m: (premul(factor)(m), force_sum(m)))
    _, average = run("gloo", meshes)
    assert losses == pytest.approx(reference, rel=1e-5), (losses, reference)
    assert losses[-1] != pytest.approx(average[-1], rel=1e-6)  # the factor made a difference


@pytest.mark.parametrize("how", ["fully_shard", "replicate"])
def test_hsdp_and_replicate_give_gloos_losses(meshes, how):
    dims = 2 if how == "fully_shard" else 1
    if how == "replicate":
        pytest.importorskip("torch.distributed._composable.replicate_with_fsdp")
    _, losses = run("gradcomp", meshes, dims, how)
    _, reference = run("gloo", meshes, dims, how)
    assert losses == pytest.approx(reference, rel=1e-5), (losses, reference)


def everyones(value, gloo):
    out = [None] * hvd.size()
    dist.all_gather_object(out, value, group=gloo)
    return out


def all_stats():
    """Compressed bytes in and on the wire and memories, summed over the runtimes of this rank
    (the world's and each group of some ranks')."""
    total = {"compressed_bytes_in": 0, "compressed_bytes_on_wire": 0, "compression_memories": 0}
    for group in list(backend._live_groups):
        if group.process_set is not None or group is dist.group.WORLD:
            stats = hvd.stats(group.process_set)
            for key in total:
                total[key] += stats[key]
    return total


def unsharded_digest(model):
    """The weights every FSDP module unshards (through its all-gather), as this rank sees them."""
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.unshard()
    try:
        return digest([p for m in modules for p in m.parameters(recurse=False)])
    finally:
        for m in modules:
            m.reshard()


def test_compressed_fully_shard_trains_as_gloo(meshes, gloo):
    before = all_stats()
    model = wrap(make_model(), meshes[("gradcomp", 1)])
    names = hvd.compress_fsdp(model, compression=GRADIENTS, allgather_compression=WEIGHTS)
    losses = train(model)
    after = all_stats()
    _, reference = run("gloo", meshes)
    into = after["compressed_bytes_in"] - before["compressed_bytes_in"]
    wire = after["compressed_bytes_on_wire"] - before["compressed_bytes_on_wire"]
    assert into > 50 * 2 ** 20 and wire < 0.3 * into, (wire, into)
    assert after["compression_memories"] - before["compression_memories"] == BLOCKS + 1, names
    assert losses[-1] < 0.8 * losses[0], losses
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 0.05 * reference[0], (losses, reference)
    seen = everyones(unsharded_digest(model), gloo)
    assert all(d == seen[0] for d in seen), "unsharded weights differ between ranks"


def test_compressed_hsdp_is_exact_in_a_node_and_replicas_stay_identical(meshes, gloo):
    """HSDP on (replicas, shard): the shard groups (a node each at -np 4) stay exact, the replicas'
    all-reduce is compressed under each module's name; ranks holding the same shard on different
    replicas hold the same bytes."""
    mesh = meshes[("gradcomp", 2)]
    shard_group, replica_group = mesh.get_group("shard"), mesh.get_group("replicate")
    stats = {g: hvd.stats(g.process_set) for g in (shard_group, replica_group)}
    model = wrap(make_model(), mesh)
    hvd.compress_fsdp(model, compression=GRADIENTS)
    losses = train(model)
    _, reference = run("gloo", meshes, 2)
    after = {g: hvd.stats(g.process_set) for g in stats}
    gained = {g: after[g]["compressed_bytes_on_wire"] - stats[g]["compressed_bytes_on_wire"] for g in stats}
    if replica_group.size() > 1:
        assert gained[replica_group] > 0
        assert after[replica_group]["compression_memories"] - stats[replica_group]["compression_memories"] \
            == BLOCKS + 1
    if shard_group.size() > 1:
        assert gained[shard_group] == 0, "the shard group within a node was compressed"
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 0.05 * reference[0], (losses, reference)
    shards = digest([p.to_local() for p in model.parameters()])
    seen = everyones((mesh.get_local_rank("shard"), shards), gloo)
    for place in {p for p, _ in seen}:
        assert len({d for p, d in seen if p == place}) == 1, f"replicas of shard {place} differ"


def test_compressed_replicate_keeps_replicas_identical(meshes, gloo):
    pytest.importorskip("torch.distributed._composable.replicate_with_fsdp")
    model = wrap(make_model(), meshes[("gradcomp", 1)], "replicate")
    hvd.compress_fsdp(model, compression=GRADIENTS)
    losses = train(model)
    _, reference = run("gloo", meshes, 1, "replicate")
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 0.05 * reference[0], (losses, reference)
    seen = everyones(digest([p.to_local() for p in model.parameters()]), gloo)
    assert all(d == seen[0] for d in seen), "replicas differ"


@pytest.mark.parametrize("dims", [1, 2])
def test_auto_chooses_a_setting_per_module(meshes, dims):
    """compress_fsdp with auto: each module's reduce-scatter (1-D) or its replicas' all-reduce
    (HSDP) gets a setting of its own, measured and chosen by its name."""
    mesh = meshes[("gradcomp", dims)]
    group = mesh.get_group("replicate") if dims == 2 else mesh.get_group()
    model = wrap(make_model(), mesh)
    auto = hvd.Compression.auto(reference=hvd.Compression.maxmin(bits=4, error_feedback=True), interval=2)
    names = hvd.compress_fsdp(model, compression=auto)
    losses = train(model)
    choices = hvd.compression_choices(group.process_set)
    suffix = ".replicas" if dims == 2 else ""
    assert all(choices[name + suffix]["measured_at"] > 0 for name in names), sorted(choices)
    assert losses[-1] < 0.8 * losses[0], losses


class TwoBranches(torch.nn.Module):
    """Two FSDP modules of the same shape side by side (their outputs summed) whose order flips
    every step, and with it the order of their reduce-scatters in backward: a memory that
    followed the order of the calls would hand each one the other's residual."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = Block(WIDTH, HIDDEN), Block(WIDTH, HIDDEN)
        self.into = torch.nn.Linear(WIDTH, WIDTH)  # the branches' input needs a gradient for FSDP2 to
        self.flip = False                          # reduce each branch as soon as its backward ends

    def forward(self, x):
        x = self.into(x)
        first, second = (self.b, self.a) if self.flip else (self.a, self.b)
        y = first(x)
        return y + second(x)


STEPS_EF = 12


def test_error_feedback_follows_each_module_whatever_the_order(meshes):
    """With the weights fixed (no step) each step's exact gradient is the same, so with error
    feedback each module's mean gradient over T steps approaches the exact one as 1/T (the sum of
    what was sent telescopes to the exact sum less one residual). A residual that went to the
    other module would keep the error at one step's."""
    mesh = meshes[("gradcomp", 1)]
    # Reduced by FSDP2 on gradcomp, exact and compressed; same inputs and weights.
    grads = {}
    x, _ = batch()
    for label, compression in (("exact", hvd.Compression.none), ("compressed", GRADIENTS)):
        model = TwoBranches()
        for m in (model.a, model.b, model):
            fully_shard(m, mesh=mesh)
        hvd.compress_fsdp(model, compression=compression)
        seen = []
        for step in range(STEPS_EF):
            model.flip = step % 2 == 1
            model.zero_grad()
            model(x).square().mean().backward()
            seen.append([p.grad.to_local().clone() for p in model.parameters()])
        grads[label] = seen
    exact = grads["exact"][0]
    assert all(torch.equal(a, b) for step in grads["exact"] for a, b in zip(step, exact))
    def error(grads):
        return sum((g - e).norm().item() ** 2 for g, e in zip(grads, exact)) ** 0.5

    one_step = error(grads["compressed"][0])
    averaged = error([torch.stack([step[i] for step in grads["compressed"]]).mean(0) for i in range(len(exact))])
    assert one_step > 0 and averaged < 1.5 / STEPS_EF * one_step, (averaged, one_step)


def test_a_gradient_that_changes_size_starts_a_fresh_memory(meshes):
    """The same module name with another size: the residual of the old size is dropped, so the
    result is what a name never used gives (bit for bit), not the old residual misapplied."""
    from gradcomp.torch import fsdp2
    group = dist.group.WORLD
    n = hvd.size()
    spec = dict(hvd.Compression.maxmin(bits=4, error_feedback=True).spec)
    torch.manual_seed(7 + hvd.rank())
    for size in (n * 65_536, n * 65_536):
        fsdp2._ModuleReduceScatter("fsdp2-test.grown", spec)(torch.empty(size // n), torch.randn(size), group,
                                                            dist.ReduceOp.AVG)
    grown = torch.randn(n * 98_304)
    reused, fresh = torch.empty(98_304), torch.empty(98_304)
    fsdp2._ModuleReduceScatter("fsdp2-test.grown", spec)(reused, grown, group, dist.ReduceOp.AVG)
    fsdp2._ModuleReduceScatter("fsdp2-test.new", spec)(fresh, grown, group, dist.ReduceOp.AVG)
    assert torch.equal(reused, fresh)


def test_compress_fsdp_names_each_model_apart_and_refuses_other_backends(meshes):
    first = hvd.compress_fsdp(wrap(make_model(), meshes[("gradcomp", 1)]))
    second = hvd.compress_fsdp(wrap(make_model(), meshes[("gradcomp", 1)]))
    assert len(first) == BLOCKS + 1 and not set(first) & set(second), (first, second)
    model = wrap(make_model(), meshes[("gloo", 1)])
    hvd.compress_fsdp(model)
    x, y = batch()
    with pytest.raises(ValueError, match="runs on a process group of backend 'gloo'; compress_fsdp needs"):
        model(x)
    with pytest.raises(ValueError, match="holds no FSDP2 module"):
        hvd.compress_fsdp(make_model())


def test_compressed_without_compress_fsdp_warns_once_naming_it(meshes):
    """The settings' codec on FSDP2's own reduce-scatter (no compress_fsdp): unnamed, so no error
    feedback. Every rank warns once, naming compress_fsdp; with compress_fsdp, no such warning.
    (This suite's settings are exact: the groups' codec is set to 4 bits here, as
    GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 would.)"""
    groups = [g for g in backend._live_groups if g._compress is None]
    for g in groups:
        g._compress = {"codec": "maxmin", "bits": 4}
    try:
        for named, expected in ((False, 1), (True, 0)):
            backend._warned_fsdp2.clear()
            model = wrap(make_model(), meshes[("gradcomp", 1)])
            if named:
                hvd.compress_fsdp(model, compression=hvd.Compression.maxmin(bits=4))
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                train(model, steps=2)
            mine = [str(w.message) for w in seen if "compress_fsdp" in str(w.message)]
            assert len(mine) == expected, [str(w.message) for w in seen]
            assert not mine or "FSDP2's reduce-scatter is compressed (maxmin" in mine[0], mine
    finally:
        for g in groups:
            g._compress = None
        backend._warned_fsdp2.clear()
