"""The training frameworks users already run, on backend gradcomp, compressed: Lightning's DDP
(under torchrun and its own launcher, compression by the settings and by ddp_hook), its FSDP2 and
FSDP strategies, Hugging Face Accelerate under `accelerate launch`, and transformers.Trainer on a GPT-2
built from a config, each with 2 ranks through examples/frameworks/, as a user runs them.

Uncompressed, gradcomp trains Lightning's DDP to gloo's losses to the last printed digit;
compressed, each framework's validation loss stays within 2% of its run on gloo and the codecs
put about an eighth of the bytes they took in on the wire (4 bits a value plus each bucket's
range)."""
import os
import re
import socket
import subprocess

import pytest

from paths import PY, ROOT

import accelerate  # noqa: F401 - a missing framework fails the suite (pip-torch installs them), never skips it
import lightning  # noqa: F401
import transformers  # noqa: F401

EXAMPLES = os.path.join(ROOT, "examples", "frameworks")
# The model: a 3.3M-parameter GPT (4 blocks of width 256); few steps, a short validation.
MODEL = ["--layers", "4", "--width", "256", "--steps", "30", "--val-batches", "4", "--corpus-mb", "1"]
FOUR_BITS = {"GRADCOMP_COMPRESSION": "maxmin", "GRADCOMP_BITS": "4"}
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def run(command, env=None, timeout=300):
    """Runs a 2-rank job; what rank 0 printed: the losses and the bytes."""
    r = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    found = {key: re.search(pattern, r.stdout, re.M) for key, pattern in
             (("train", r"training loss: ([0-9.]+)"), ("val", r"validation loss: ([0-9.]+)"),
              ("bytes", r"compressed: (\d+) bytes in, (\d+) bytes on the wire"),
              ("title", r"^(lightning|accelerate|transformers)\b.* on \w+.*$"))}
    assert all(found.values()), r.stdout[-4000:] + r.stderr[-4000:]
    into, wire = (int(v) for v in found["bytes"].groups())
    return {"train": float(found["train"].group(1)), "val": float(found["val"].group(1)), "in": into, "wire": wire,
            "title": found["title"].group(0)}


def train_lightning(strategy, backend="gradcomp", launcher=TORCHRUN, env=None):
    """Under torchrun, or Lightning's own launcher (launcher=[PY]: rank 0 starts rank 1)."""
    return run(list(launcher) + [os.path.join(EXAMPLES, "lightning_charlm.py"), "--strategy", strategy, "--backend",
                                 backend, "--devices", "2"] + MODEL, env)


def assert_compressed_near(result, reference):
    """4-bit traffic (an eighth of the float bytes, plus each bucket's range) at the reference's
    loss within 2%."""
    assert result["in"] > 0 and 0.12 < result["wire"] / result["in"] < 0.14, result
    assert abs(result["val"] - reference["val"]) < 0.02 * reference["val"], (result, reference)


@pytest.fixture(scope="module")
def lightning_on_gloo():
    try:
        result = train_lightning("ddp", "gloo")
    except AssertionError as e:
        # The peer's reference, without gradcomp's runtime: under load a rank of torch 2.13's
        # gloo job has aborted once at its end ("terminate called without an active exception",
        # after the results); such a run is made again, once.
        if "terminate called without an active exception" not in str(e):
            raise
        result = train_lightning("ddp", "gloo")
    assert "on gloo" in result["title"] and result["val"] < 3.5, result  # trained: 5.5 nats untrained
    return result


def test_lightning_ddp_equals_gloo_uncompressed_and_compresses_by_the_settings(lightning_on_gloo):
    exact = train_lightning("ddp", launcher=[PY])
    assert "on gradcomp" in exact["title"], exact
    assert (exact["train"], exact["val"]) == (lightning_on_gloo["train"], lightning_on_gloo["val"])
    assert exact["in"] == 0
    assert_compressed_near(train_lightning("ddp", env=FOUR_BITS), lightning_on_gloo)


def test_lightning_ddp_hook(lightning_on_gloo):
    hooked = train_lightning("ddp_hook")
    assert "on gradcomp" in hooked["title"], hooked
    assert_compressed_near(hooked, lightning_on_gloo)


def test_lightning_fsdp2_strategy_compressed_per_module(lightning_on_gloo):
    """ModelParallelStrategy: fully_shard and compress_fsdp in configure_model; 4-bit gradients and
    8-bit weights. Sharded, the training is DDP's, so gloo's DDP run is the reference."""
    sharded = train_lightning("fsdp2", env=dict(FOUR_BITS, GRADCOMP_ALLGATHER_COMPRESSION="maxmin"))
    assert sharded["in"] > 0 and sharded["wire"] < 0.3 * sharded["in"], sharded
    assert abs(sharded["val"] - lightning_on_gloo["val"]) < 0.02 * lightning_on_gloo["val"], sharded


def test_lightning_fsdp_strategy_compressed(lightning_on_gloo):
    sharded = train_lightning("fsdp", env=FOUR_BITS)
    assert_compressed_near(sharded, lightning_on_gloo)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_accelerate_launch_compressed_near_gloo():
    def launch(backend, env=None):
        return run([PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                    "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                    os.path.join(EXAMPLES, "accelerate_charlm.py"), "--backend", backend] + MODEL, env)
    reference = launch("gloo")
    compressed = launch("gradcomp", FOUR_BITS)
    assert "on gradcomp (DistributedDataParallel)" in compressed["title"], compressed
    assert reference["val"] < 3.5, reference
    assert_compressed_near(compressed, reference)


def test_transformers_trainer_gpt2_compressed_near_gloo():
    def train(backend, env=None):
        return run(TORCHRUN + [os.path.join(EXAMPLES, "trainer_gpt2.py"), "--backend", backend] + MODEL, env)
    reference = train("gloo")
    compressed = train("gradcomp", FOUR_BITS)
    assert "on gradcomp (DistributedDataParallel)" in compressed["title"], compressed
    assert reference["val"] < 3.5, reference
    assert_compressed_near(compressed, reference)
