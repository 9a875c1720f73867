"""Adaptive compression as it comes: GRADCOMP_COMPRESSION=auto and nothing else about it
(mpirun -np 2), with GRADCOMP_AUTO_COST_MODEL=0 standing for ranks joined by a slow link
(on one machine the cost model keeps every tensor raw; test_numpy_mpi.py checks that case).

Run by ctest as: mpirun -np 2 -x GRADCOMP_COMPRESSION=auto -x GRADCOMP_AUTO_COST_MODEL=0
python3 -m pytest test/python/test_auto_defaults_mpi.py"""
import os

import numpy as np
import pytest

import gradcomp.numpy as gc
from gradcomp import basics

AUTO_KEYS = ("candidates", "interval", "relaxed_bits", "critical_change", "normalized", "bits")


@pytest.fixture(scope="module", autouse=True)
def runtime():
    assert os.environ.get("GRADCOMP_COMPRESSION") == "auto"
    assert os.environ.get("GRADCOMP_AUTO_COST_MODEL") == "0"
    gc.init()
    yield
    gc.shutdown()


def test_compression_auto_defaults_are_the_settings_defaults():
    settings, _ = basics.runtime().default_compression()
    made = gc.Compression.auto()
    assert {k: made[k] for k in AUTO_KEYS} == {k: settings[k] for k in AUTO_KEYS}, (made, settings)


def run(steps, compression, prefix):
    """`steps` allreduces of two arrays drawn from one distribution each step (a calm training
    phase); the bytes this rank put on the wire and the choices seen after each step."""
    rng = np.random.default_rng(100 + gc.rank())
    before = gc.stats()["compressed_bytes_on_wire"]
    seen = []
    for step in range(steps):
        for name in ("a", "b"):
            gc.allreduce((1.0 + rng.normal(size=(256, 256))).astype(np.float32), name=prefix + name,
                         compression=compression)
        seen.append({n: c for n, c in gc.compression_choices().items() if n.startswith(prefix)})
    return gc.stats()["compressed_bytes_on_wire"] - before, seen


def test_the_defaults_choose_early_and_step_down_to_2_bits_on_calm_gradients():
    """The first choice at step 26 (the interval: 25 steps, so a job of a few hundred steps sees
    several), in a critical regime (nothing to compare with: 4 bits' budget); then every calm
    choice one bit fewer, down to 2 bits (the relaxed bits where no optimizer is seen, as here)
    from step 76; over 500 steps (50 of them at 4 bits) at most 0.6x the bytes uniform 4 bits
    sends."""
    steps = 500
    reference, _ = run(steps, {"codec": "maxmin", "bits": 4}, "defaults.ref.")
    sent, seen = run(steps, None, "defaults.auto.")  # None: the settings' policy, auto
    assert seen[24] == {}, seen[24]  # steps 1-25 run the reference
    bits = {}
    for step in (26, 51, 76, 101, 500):
        c = seen[step - 1]
        assert set(c) == {"defaults.auto.a", "defaults.auto.b"}, c
        bits[step] = sorted(v["budget_bits"] for v in c.values())
    assert bits == {26: [4, 4], 51: [3, 3], 76: [2, 2], 101: [2, 2], 500: [2, 2]}, bits
    assert all(v["setting"].startswith("maxmin(bits=2,") for v in seen[-1].values()), seen[-1]
    assert sent <= 0.6 * reference, (sent, reference)
    summary = gc.auto_summary()
    assert summary.startswith("auto compression, choice ") and "maxmin(bits=2, bucket=512) x" in summary, summary
    assert "uncompressed" not in summary, summary


@pytest.mark.parametrize("optimizer,bits", [("SGD", 2), ("Adam", 1)])
@pytest.mark.parametrize("how", ["settings", "Compression.auto()"])
def test_distributed_optimizer_relaxes_by_its_optimizer_and_says_so(optimizer, bits, how):
    """Under DistributedOptimizer the relaxed bits follow the optimizer: 2 under SGD, 1 under
    Adam (it normalizes its update per coordinate), for the settings' auto and for
    Compression.auto() alike; auto_summary() names the optimizer and the bits. lr 0 keeps the
    gradients of one distribution (random inputs, the weights unchanged): every choice after the
    first is calm."""
    import torch
    import gradcomp.torch as hvd
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    prefix = f"relax.{optimizer}.{how[0]}"
    opt = hvd.DistributedOptimizer(getattr(torch.optim, optimizer)(model.parameters(), lr=0.0),
                                   named_parameters=[(f"{prefix}.{n}", p) for n, p in model.named_parameters()],
                                   compression=None if how == "settings" else hvd.Compression.auto())
    g = torch.Generator().manual_seed(hvd.rank())
    for step in range(110):  # choices at steps 26, 51, 76, 101
        opt.zero_grad()
        model(torch.randn(32, 128, generator=g)).square().mean().backward()
        opt.step()
    choices = {n: c for n, c in hvd.compression_choices().items() if prefix in n}
    assert len(choices) == 2 and all(c["budget_bits"] == bits for c in choices.values()), choices
    note = (f"A calm tensor's error budget relaxes to that of {bits} bits (0: it does not relax) for the optimizer "
            f"{optimizer}")
    assert note in hvd.auto_summary(), hvd.auto_summary()
