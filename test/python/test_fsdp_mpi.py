"""FSDP on backend gradcomp under mpirun (-np 2 and 3, and 4 as 2 nodes x 2): torch 2.x's
FullyShardedDataParallel (and fully_shard where the torch has it) trains a 4.2M-parameter model
of several FSDP units on dist.init_process_group("gradcomp"), with the settings' compression:
reduce_scatter_tensor quantizes the gradients (GRADCOMP_COMPRESSION), all_gather_into_tensor the
weights (GRADCOMP_ALLGATHER_COMPRESSION). Each run checks what its settings promise: exact runs
match FSDP on gloo step for step; compressed ones stay within the codecs' bounds, put fewer bytes
on the wire, train as well as gloo within a margin, and unshard the same weights on every rank.

Run by ctest as: mpirun -np N python3 -m pytest test/python/test_fsdp_mpi.py (torch >= 2).
Every rank runs the same tests in the same order (they are collective)."""
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import gradcomp.torch as hvd
from gradcomp.torch import compat
import fsdp_model
from fsdp_model import Block, digest
from mpi_fixtures import torch_runtime

GRAD_CODEC = os.environ.get("GRADCOMP_COMPRESSION", "none")
GRAD_BITS = int(os.environ.get("GRADCOMP_BITS", "4"))
WEIGHT_CODEC = os.environ.get("GRADCOMP_ALLGATHER_COMPRESSION", "none")
WEIGHT_BITS = int(os.environ.get("GRADCOMP_ALLGATHER_BITS", "8"))
BUCKET = int(os.environ.get("GRADCOMP_BUCKET_SIZE", "512"))
EXACT = GRAD_CODEC == "none" and WEIGHT_CODEC == "none"
WIDTH, HIDDEN, BLOCKS, PER_RANK, STEPS = 512, 1024, 4, 16, 8


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from torch_runtime("gradcomp", "fsdp")


@pytest.fixture(scope="module")
def gloo():
    return dist.new_group(backend="gloo")


def make_model(seed=0):
    return fsdp_model.make_model(WIDTH, HIDDEN, BLOCKS, seed)


def batch(step):
    del step  # the same rows every step
    return fsdp_model.batch(WIDTH, PER_RANK)


def train(group, wrap, steps=STEPS):
    """FSDP on `group` (nested units: one per block), SGD with momentum; every step's loss."""
    model = wrap(make_model(), group)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def fsdp1(module, group):
    return FSDP(module, process_group=group, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}))


def same_on_every_rank(value, gloo):
    everyone = [None] * hvd.size()
    dist.all_gather_object(everyone, value, group=gloo)
    return all(v == everyone[0] for v in everyone), everyone


def test_reduce_scatter_and_all_gather_follow_the_settings(gloo):
    """The collectives FSDP calls, on multi-megabyte tensors: within the codecs' bounds
    against gloo's exact results (compressed_shards.h), and exact where the settings say none."""
    n, me = hvd.size(), hvd.rank()
    torch.manual_seed(40 + me)
    grads = torch.randn(n * 294_912)
    rows = torch.empty(294_912)
    compat.reduce_scatter_tensor(rows, grads, op=dist.ReduceOp.SUM)
    everyone = torch.empty(n * n * 294_912)
    compat.all_gather_into_tensor(everyone, grads, group=gloo)
    mine = everyone.reshape(n, -1)[:, me * 294_912:(me + 1) * 294_912].double()
    exact = mine.sum(0)
    if GRAD_CODEC == "none":
        assert torch.allclose(rows.double(), exact, rtol=1e-6, atol=1e-6)
    else:
        # Half a unit of each peer's bucket of this rank's shard (maxmin, nearest rounding).
        buckets = mine.reshape(n, -1, BUCKET)
        units = (buckets.amax(2) - buckets.amin(2)) / (2 ** GRAD_BITS - 1)
        bound = (units.sum(0) - units[me]).repeat_interleave(BUCKET) / 2 + 1e-4
        error = (rows.double() - exact).abs()
        assert (error <= bound).all() and error.max() > 0
    shard = torch.randn(249_856) + me
    gathered = torch.empty(n * 249_856)
    compat.all_gather_into_tensor(gathered, shard)
    exact_gather = torch.empty(n * 249_856)
    compat.all_gather_into_tensor(exact_gather, shard, group=gloo)
    ok, _ = same_on_every_rank(digest([gathered]), gloo)
    assert ok, "the gathered tensor differs between ranks"
    if WEIGHT_CODEC == "none":
        assert torch.equal(gathered, exact_gather)
    else:
        buckets = exact_gather.double().reshape(-1, BUCKET)
        half = ((buckets.amax(1) - buckets.amin(1)) / (2 ** WEIGHT_BITS - 1) / 2).repeat_interleave(BUCKET) + 1e-6
        error = (gathered.double() - exact_gather.double()).abs()
        assert (error <= half).all() and error.max() > 0
    # Integers and small tensors stay exact whatever the settings.
    ints = torch.arange(n * 1000, dtype=torch.int64) * (me + 1)
    out = torch.empty(1000, dtype=torch.int64)
    compat.reduce_scatter_tensor(out, ints)
    assert torch.equal(out, torch.arange(me * 1000, (me + 1) * 1000) * sum(range(1, n + 1)))


def test_fsdp_trains_on_gradcomp_as_on_gloo(gloo):
    before = hvd.stats()
    model, losses = train(dist.group.WORLD, fsdp1)
    after = hvd.stats()
    _, reference = train(gloo, fsdp1)
    wire = after["compressed_bytes_on_wire"] - before["compressed_bytes_on_wire"]
    into = after["compressed_bytes_in"] - before["compressed_bytes_in"]
    if EXACT:
        assert wire == 0 and into == 0
        assert losses == pytest.approx(reference, rel=1e-5)
    else:
        # 4-bit gradients and 8-bit weights: a quarter of float32's bytes or less.
        assert into > 50 * 2 ** 20 and wire < 0.3 * into, (wire, into)
        assert reference[-1] < 0.8 * reference[0] and losses[-1] < 0.8 * losses[0], (losses, reference)
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 0.05 * reference[0], (losses, reference)
    # The weights every rank unshards are the same bytes on every rank.
    with FSDP.summon_full_params(model):
        ok, everyone = same_on_every_rank(digest(model.parameters()), gloo)
    assert ok, f"unsharded parameters differ between ranks: {everyone}"


class RecordingHookState(hvd.FSDPHookState):
    """FSDPHookState that remembers the names its hook gave the gradients, a list a backward."""

    def __init__(self):
        super().__init__()  # compression None: the settings' GRADCOMP_COMPRESSION
        self.backwards = []

    def next_name(self, grad):
        name = super().next_name(grad)
        if name.startswith(f"{self.name}.0."):
            self.backwards.append([])
        self.backwards[-1].append(name)
        return name


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "NO_SHARD"])
def test_fsdp_hook_reduces_the_gradients_through_gradcomp_on_gloo(gloo, strategy):
    """FSDP on a gloo group with gradcomp's hook: the gradients go through the runtime, per the
    settings (exact: gloo's own FSDP losses; maxmin: 4 bits on the wire), each unit under the
    same name in every step (error feedback's residuals follow it)."""
    sharding = getattr(torch.distributed.fsdp.ShardingStrategy, strategy)
    state = RecordingHookState()

    def hooked(module, group):
        model = FSDP(module, process_group=group, device_id=torch.device("cpu"), sharding_strategy=sharding,
                     auto_wrap_policy=ModuleWrapPolicy({Block}))
        model.register_comm_hook(state, hvd.fsdp_hook)
        return model

    def plain(module, group):
        return FSDP(module, process_group=group, device_id=torch.device("cpu"), sharding_strategy=sharding,
                    auto_wrap_policy=ModuleWrapPolicy({Block}))

    before = hvd.stats()
    model, losses = train(gloo, hooked)
    after = hvd.stats()
    _, reference = train(gloo, plain)
    assert len(state.backwards) == STEPS and len(state.backwards[0]) == BLOCKS + 1, state.backwards
    assert all(names == state.backwards[0] for names in state.backwards), state.backwards
    wire = after["compressed_bytes_on_wire"] - before["compressed_bytes_on_wire"]
    into = after["compressed_bytes_in"] - before["compressed_bytes_in"]
    if GRAD_CODEC == "none":
        assert wire == 0 and into == 0
        assert losses == pytest.approx(reference, rel=1e-5)
    else:
        assert into > 25 * 2 ** 20 and wire < 0.2 * into, (wire, into)
        assert losses[-1] < 0.8 * losses[0], (losses, reference)
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 0.05 * reference[0], (losses, reference)
    with FSDP.summon_full_params(model):
        ok, everyone = same_on_every_rank(digest(model.parameters()), gloo)
    assert ok, f"unsharded parameters differ between ranks: {everyone}"


def test_fsdp_hook_names_a_process_group_that_is_not_the_runtimes():
    """A shard that implies another number of ranks than the hook reduces over fails at once on
    every rank, naming the gradient, both sizes and the fix, before any collective starts."""
    n = hvd.size()
    leaf = torch.ones(4, requires_grad=True)
    leaf.register_hook(lambda g: hvd.fsdp_hook(hvd.FSDPHookState(), torch.zeros(6 * (n + 1)), torch.zeros(6)))
    with pytest.raises(ValueError) as e:
        leaf.sum().backward()
    assert (f"fsdp_hook: gradient 'fsdp.0.{6 * (n + 1)}' of {6 * (n + 1)} elements comes with a shard of 6, a "
            f"process group of {n + 1} ranks, but the hook reduces over {n}: give FSDPHookState the process_set"
            in str(e.value)), str(e.value)
