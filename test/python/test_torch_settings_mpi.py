"""gradcomp.torch following the settings (run under mpirun -np 2 with GRADCOMP_COMPRESSION=maxmin,
GRADCOMP_BITS=4, GRADCOMP_MIN_SIZE=64, GRADCOMP_ERROR_FEEDBACK=1): the torch.distributed
backend compresses float all_reduce as CGX does, DistributedOptimizer's default follows the
settings with the layer filter."""
import hashlib
import os
import warnings

import pytest
import torch
import torch.distributed as dist

import gradcomp.torch as hvd
from mpi_fixtures import use_job_port


@pytest.fixture(scope="module", autouse=True)
def runtime():
    assert os.environ.get("GRADCOMP_COMPRESSION") == "maxmin" and os.environ.get("GRADCOMP_BITS") == "4"
    hvd.init()
    use_job_port()
    dist.init_process_group("gradcomp", rank=hvd.rank(), world_size=hvd.size())
    yield
    dist.destroy_process_group()
    hvd.shutdown()


def same_everywhere(t):
    digests = hvd.allgather_object(hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest())
    return all(d == digests[0] for d in digests)


def test_backend_compresses_large_float_buffers_only():
    me, n = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(me)
    x = torch.randn(4096, generator=g)
    exact = hvd.allreduce(x, op=hvd.Sum, name="exact", compression=hvd.Compression.none)
    before = hvd.stats()["compressed_bytes_on_wire"]
    y = x.clone()
    with warnings.catch_warnings(record=True) as caught:  # said at the first collective it concerns
        warnings.simplefilter("always")
        dist.all_reduce(y)
    assert any("GRADCOMP_ERROR_FEEDBACK" in str(w.message) for w in caught), [str(w.message) for w in caught]
    on_wire = hvd.stats()["compressed_bytes_on_wire"] - before
    rel = float((y - exact).norm() / exact.norm())
    assert 0 < rel < 0.2, rel  # 4-bit max-min: close, not exact
    assert same_everywhere(y)
    assert 0 < on_wire < 4096 * 4 / 4  # at least 4x smaller than float32
    small = torch.ones(16) * (me + 1)  # under GRADCOMP_MIN_SIZE: exact
    dist.all_reduce(small)
    assert torch.equal(small, torch.full((16,), float(n * (n + 1) / 2)))
    ints = torch.arange(4096, dtype=torch.int64) * (me + 1)
    dist.all_reduce(ints)
    assert torch.equal(ints, torch.arange(4096, dtype=torch.int64) * (n * (n + 1) // 2))


def test_ddp_trains_on_the_compressing_backend_and_ranks_agree():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 20, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    me = hvd.rank()
    mine = slice(me * 32 // hvd.size(), (me + 1) * 32 // hvd.size())
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[mine]), y[mine])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    assert all(same_everywhere(p) for p in model.parameters())


def test_distributed_optimizer_default_follows_the_settings_with_the_layer_filter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8 * hvd.size(), 20, generator=g)
    y = torch.randint(0, 4, (8 * hvd.size(),), generator=g)
    me = hvd.rank()
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    before = hvd.stats()["compressed_bytes_in"]  # allreduces start during backward
    torch.nn.functional.cross_entropy(model(x[me * 8:(me + 1) * 8]), y[me * 8:(me + 1) * 8]).backward()
    opt.synchronize()
    # 0.weight (1280) and 2.weight (256) are compressed; biases (1-D) are exact.
    assert hvd.stats()["compressed_bytes_in"] - before == (1280 + 256) * 4
    for name in ("0.bias", "2.bias"):
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, dict(ref.named_parameters())[name].grad,
                                   rtol=1e-5, atol=1e-6)
    w, w_ref = model[0].weight.grad, ref[0].weight.grad
    assert 0 < float((w - w_ref).norm() / w_ref.norm()) < 0.3
    with opt.skip_synchronize():
        opt.step()


def test_adasum_says_the_settings_compression_does_not_apply_and_runs_exact():
    """GRADCOMP_COMPRESSION=maxmin here: Adasum combines exact values, and says so once."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    with pytest.warns(UserWarning, match=r"the settings' compression \(maxmin, GRADCOMP_COMPRESSION\) does not "
                                         r"apply: Adasum combines exact values"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), op=hvd.Adasum)
    before = hvd.stats()["compressed_bytes_in"]
    opt.zero_grad()
    model(torch.ones(4, 64)).sum().backward()
    opt.step()
    assert hvd.stats()["compressed_bytes_in"] == before
    x = torch.full((64, 64), 2.0)  # a (+) a = a, exact
    assert torch.equal(hvd.allreduce(x, op=hvd.Adasum, name="settings.adasum"), x)
