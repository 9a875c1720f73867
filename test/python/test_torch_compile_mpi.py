"""torch.compile'd models under gradcomp (torch 2.x; registered only where torch has
torch.compile): a compiled 2.1M-parameter model trains under DistributedOptimizer (4-bit
max-min, and exact) and under DDP on backend gradcomp (several buckets, compressed per the
settings) to the parameters the same model reaches uncompiled, with the replicas bit-identical;
compiled code calls gradcomp (and DDP its backend) without tracing into gradcomp's Python.

Run by ctest as: mpirun -np N python3 -m pytest test/python/test_torch_compile_mpi.py
Every rank runs the same tests in the same order (they are collective)."""
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as hvd
from mpi_fixtures import torch_runtime

IN, HIDDEN, OUT, PER_RANK, STEPS, LR = 256, 1024, 10, 32, 10, 1e-3


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from torch_runtime("gradcomp", "compile")


def make_model():
    """2.1M parameters in five linear layers of four shapes."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN // 2), torch.nn.ReLU(), torch.nn.Linear(HIDDEN // 2, HIDDEN // 2),
        torch.nn.ReLU(), torch.nn.Linear(HIDDEN // 2, OUT))


def shard(step):
    """This rank's rows of the step's batch (one of two, in turn: the model fits them in a few
    steps); the label is the largest of the first OUT inputs."""
    g = torch.Generator().manual_seed(100 + step % 2)
    x = torch.randn(PER_RANK * hvd.size(), IN, generator=g)
    rows = slice(hvd.rank() * PER_RANK, (hvd.rank() + 1) * PER_RANK)
    return x[rows], x[rows, :OUT].argmax(1)


def train(forward, optimizer):
    losses = []
    for step in range(STEPS):
        x, y = shard(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def assert_replicas_identical(model, name):
    gathered = hvd.allgather(flat(model).unsqueeze(0), name=f"compile.replicas.{name}")
    for r in range(1, hvd.size()):
        assert torch.equal(gathered[0], gathered[r]), f"rank {r}'s parameters differ from rank 0's"


def distance(a, b):
    return (flat(a) - flat(b)).norm().item()


def assert_same_training(compiled, eager, losses_compiled, losses_eager, exact=None, losses_exact=None):
    """Uncompressed: the same parameters to float32 rounding (inductor fuses and reorders the
    arithmetic). Compressed: a change of the last bit can move a value to the next quantization
    level, and which gradients share a fusion or DDP bucket follows the order backward produces
    them in, which compilation changes; so the compiled run's parameters and losses must be as
    close to the eager run's as the eager run's are to the same training uncompressed (`exact`)."""
    moved = distance(eager, make_model())
    if exact is None:
        assert distance(compiled, eager) <= 1e-5 * moved, (distance(compiled, eager), moved)
        assert losses_compiled == pytest.approx(losses_eager, rel=1e-4)
    else:
        assert distance(compiled, eager) <= distance(eager, exact), \
            f"compiled vs eager {distance(compiled, eager):.3g}, eager vs uncompressed {distance(eager, exact):.3g}"
        gap = max(abs(a - b) for a, b in zip(losses_compiled, losses_eager))
        assert gap <= max(abs(a - b) for a, b in zip(losses_eager, losses_exact)), \
            (losses_compiled, losses_eager, losses_exact)
    assert losses_eager[-1] < 0.5 * losses_eager[0], f"did not learn: {losses_eager}"


def train_under_distributed_optimizer(compiled, compression):
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=LR)
    # The same names in both runs: stochastic rounding is keyed by the tensor's name and step.
    optimizer = hvd.DistributedOptimizer(
        adam, named_parameters=[(f"compile.{compression}.{n}", p) for n, p in model.named_parameters()],
        compression=hvd.Compression.maxmin(bits=4) if compression == "maxmin4" else hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, train(torch.compile(model) if compiled else model, optimizer)


def test_compiled_model_under_distributed_optimizer():
    runs = {(c, compiled): train_under_distributed_optimizer(compiled, c)
            for c in ("none", "maxmin4") for compiled in (False, True)}
    for c in ("none", "maxmin4"):
        assert_replicas_identical(runs[c, True][0], c)
    (exact, losses_exact), (exact_c, losses_exact_c) = runs["none", False], runs["none", True]
    assert_same_training(exact_c, exact, losses_exact_c, losses_exact)
    (eager, losses), (compiled, losses_compiled) = runs["maxmin4", False], runs["maxmin4", True]
    assert_same_training(compiled, eager, losses_compiled, losses, exact=exact, losses_exact=losses_exact)


def test_compiled_ddp_on_backend_gradcomp():
    """DDP over backend gradcomp (its all_reduce compressed per GRADCOMP_COMPRESSION, set for this
    suite), compiled as torch 2 users do: torch.compile(DDP(model)), which splits the graph at
    DDP's buckets (1 MB: several here); DDP over gloo is the uncompressed reference."""
    assert dist.get_backend() == "gradcomp"
    runs = {}
    gloo = dist.new_group(backend="gloo")
    for backend, compiled in (("gloo", False), ("gradcomp", False), ("gradcomp", True)):
        model = make_model()
        ddp = DDP(model, bucket_cap_mb=1, process_group=gloo if backend == "gloo" else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        before = hvd.stats()["compressed_bytes_in"]
        losses = train(torch.compile(ddp) if compiled else ddp, optimizer)
        runs[compiled] = (model, losses)
        compressed = hvd.stats()["compressed_bytes_in"] - before
        if backend == "gloo":
            exact, losses_exact = model, losses
    assert_replicas_identical(runs[True][0], "ddp")
    assert_same_training(runs[True][0], runs[False][0], runs[True][1], runs[False][1], exact=exact,
                         losses_exact=losses_exact)
    assert compressed >= STEPS * 4 * sum(p.numel() for p in runs[True][0].parameters()) // 2, \
        f"the compiled DDP's buckets were not compressed ({compressed} bytes in)"


def graph_breaks(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def test_compiled_code_calls_gradcomp_as_a_library_without_tracing_into_it():
    """torch.compile traces Python, and gradcomp's calls are Python: they are marked to run as
    they are (one graph break at the call, as for gloo's C++ or Horovod's), instead of being
    traced into (locks, handles, pointer checks: breaks and recompiles at every call)."""
    def step(x):
        return hvd.allreduce(x * 2, name="compile.call", op=hvd.Sum) + 1

    x = torch.ones(4) * (hvd.rank() + 1)
    compiled = torch.compile(step)
    for _ in range(3):
        assert torch.equal(compiled(x), step(x))
    assert graph_breaks(step, x) == 1
    # DDP's forward calls the backend: on gradcomp it breaks the graph where it does on gloo.
    gloo = dist.new_group(backend="gloo")
    x, _ = shard(0)
    on_gloo = graph_breaks(DDP(make_model(), process_group=gloo), x)
    assert graph_breaks(DDP(make_model()), x) == on_gloo


LOADS = """
import importlib.util, sys
import gradcomp.torch as hvd
from gradcomp.torch import backend
assert "torch._dynamo" not in sys.modules, "import gradcomp.torch loaded torch's compiler"
assert importlib.util.find_spec("torch._dynamo") is not None  # looked up, not imported: nothing runs
assert not hasattr(hvd.allreduce, "_torchdynamo_disable")
import torch
torch.compile(lambda x: x + 1)  # imports the compiler, which marks gradcomp's calls then
assert hvd.allreduce._torchdynamo_disable and backend.ProcessGroupGradcomp.allreduce._torchdynamo_disable
assert backend.ProcessGroupGradcomp.reduce_scatter_module._torchdynamo_disable
"""


def test_import_leaves_the_compiler_unloaded_until_torch_compile_loads_it():
    """Loading torch's compiler takes over a second a process (torch 2.13): `import gradcomp.torch`
    leaves it to torch.compile (or whatever first imports torch._dynamo), whose import marks
    gradcomp's calls untraced then (the tests above compile after it)."""
    subprocess.run([sys.executable, "-c", LOADS], check=True, timeout=120)
