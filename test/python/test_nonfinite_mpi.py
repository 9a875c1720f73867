"""Mixed-precision overflow steps under mpirun (-np 2 and 3): a step that carries an inf gradient
shows it in its result (so a loss scaler skips the step) but does not poison the memories that
compression keeps across steps: error-feedback residuals and DGC momentum/velocity in the
runtime, the DGC take-over's local momentum and PowerSGD's error and Q in DistributedOptimizer,
ddp_hook's residuals. Training with an emulated GradScaler (torch.cuda.amp's needs CUDA) and
injected overflows reaches the accuracy of the same training without them.

Run by ctest as: mpirun -np N python3 -m pytest test/python/test_nonfinite_mpi.py
Every rank runs the same tests in the same order (they are collective)."""
import hashlib
import math

import numpy as np
import pytest
import torch

import gradcomp.numpy as gnp
import gradcomp.torch as hvd
from mpi_fixtures import torch_runtime

OVERFLOW_STEPS = (9, 31)  # rank 0 gets an inf gradient element in these steps


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from torch_runtime("gloo", "inf")


@pytest.mark.parametrize("compression", [
    {"codec": "maxmin", "bits": 4, "error_feedback": True},
    {"codec": "maxmin", "bits": 2, "error_feedback": True, "stochastic": True},
    {"codec": "topk", "ratio": 0.05, "error_feedback": True}])
def test_runtime_residuals_survive_an_inf_step(compression):
    # The report: (64, 512) float32, one step with a single inf, then ordinary steps.
    rng = np.random.default_rng(hvd.rank())
    name = f"inf.{compression['codec']}.{compression['bits'] if 'bits' in compression else ''}"
    skips = hvd.stats()["nonfinite_memory_skips"]
    for step in range(6):
        g = rng.normal(size=(64, 512)).astype(np.float32)
        if step == 2 and hvd.rank() == 0:
            g[5, 9] = np.inf
        out = gnp.allreduce(g, name=name, compression=compression)
        if step == 2:
            assert not np.isfinite(out).all()  # the step shows the overflow
        else:
            assert np.isfinite(out).all(), step
    if hvd.rank() == 0:
        assert hvd.stats()["nonfinite_memory_skips"] > skips


def digits():
    """sklearn's handwritten digits, scaled to [0, 1]: 1500 training and 297 test images."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


class EmulatedScaler:
    """torch.cuda.amp.GradScaler's dynamic loss scaling on CPU: scale the loss; if an averaged
    gradient is not finite, skip the step and halve the scale; else unscale and step, and
    double the scale after `growth_interval` good steps."""

    def __init__(self, scale=2.0 ** 12, growth_interval=25):
        self.scale, self.growth_interval, self.good = scale, growth_interval, 0
        self.skipped = 0

    def finite(self, params):
        return all(bool(torch.isfinite(p.grad).all()) for p in params)

    def step(self, params, step_fn):
        if not self.finite(params):
            self.skipped += 1
            self.scale /= 2
            self.good = 0
            return
        for p in params:
            p.grad.div_(self.scale)
        step_fn()
        self.good += 1
        if self.good == self.growth_interval:
            self.scale *= 2
            self.good = 0


def overflow_hook(flag):
    """A gradient hook that puts an inf into rank 0's gradient while flag["on"]."""

    def hook(grad):
        if flag["on"] and hvd.rank() == 0:
            grad = grad.clone()
            grad[3, 7] = math.inf
        return grad

    return hook


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean() * 100)


def train_digits(mode, overflow, steps=100, per_rank=32):
    """Trains make_model() on digits with the emulated scaler; returns the test accuracy and the
    skipped steps. `mode` picks the compression path."""
    xtr, ytr, xte, yte = digits()
    model = make_model()
    params = list(model.parameters())
    flag = {"on": False}
    model[0].weight.register_hook(overflow_hook(flag))
    scaler = EmulatedScaler()
    passes = 2 if mode == "maxmin_ef_2_passes" else 1
    if mode == "ddp_hook":
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
        ddp.register_comm_hook(hvd.DDPHookState(None, layer_min_size=1024,
                                                compression_params={"bits": 4, "error_feedback": True}),
                               hvd.ddp_hook)
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        forward = ddp
    else:
        compression = {"maxmin_ef": hvd.Compression.maxmin(4, error_feedback=True),
                       "maxmin_ef_2_passes": hvd.Compression.maxmin(4, error_feedback=True),
                       "dgc": hvd.Compression.topk(0.05),
                       "powersgd": hvd.Compression.powersgd(rank=2, start_iter=3)}[mode]
        base = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), compression=compression,
                                       backward_passes_per_step=passes)
        forward = model
    n, me = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(7)
    for step in range(steps):
        opt.zero_grad()
        order = torch.randperm(len(ytr), generator=g)[:per_rank * n * passes]
        for k in range(passes):
            rows = order[(k * n + me) * per_rank:(k * n + me + 1) * per_rank]
            flag["on"] = overflow and step in OVERFLOW_STEPS and k == passes - 1
            loss = torch.nn.functional.cross_entropy(forward(xtr[rows]), ytr[rows]) / passes
            (loss * scaler.scale).backward()
        flag["on"] = False
        if mode == "ddp_hook":
            scaler.step(params, opt.step)
        else:
            opt.synchronize()

            def apply():
                with opt.skip_synchronize():
                    opt.step()

            scaler.step(params, apply)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()
    assert len(set(hvd.allgather_object(digest))) == 1, "replicas differ"
    return accuracy(model, xte, yte), scaler.skipped


@pytest.mark.parametrize("mode", ["maxmin_ef", "maxmin_ef_2_passes", "dgc", "powersgd", "ddp_hook"])
def test_training_with_overflow_steps_reaches_the_clean_accuracy(mode):
    clean, clean_skips = train_digits(mode, overflow=False)
    hit, skips = train_digits(mode, overflow=True)
    assert clean_skips == 0
    assert skips == len(OVERFLOW_STEPS)  # each overflow skipped one step, no more
    assert clean > 85, (mode, clean)
    assert abs(hit - clean) <= 3, (mode, clean, hit)
    print(f"{mode}: clean {clean:.1f}%, with overflow steps {hit:.1f}%")
