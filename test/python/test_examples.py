"""The examples run as a user runs them (through gcrun, 2 ranks, a few steps), including the
data paths a user points them at: MNIST idx files for torch_digits and CIFAR-10 pickles for
torch_dgc_resnet (tiny fakes in the real formats)."""
import gzip
import json
import os
import pickle
import re
import struct
import subprocess
import uuid

import numpy as np
import pytest
import torch

from paths import GCRUN, PY, ROOT

CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
NODE_ADDRESS = "10.199.0.1%d"  # node N of scripts/cluster.sh's cluster


def run(args, cwd, timeout=300, env=None, warnings_allowed=True):
    r = subprocess.run([GCRUN, "-np", "2"] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env=None if env is None else dict(os.environ, **env))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert warnings_allowed or "Warning:" not in r.stderr, r.stderr[-3000:]
    return r.stdout


def write_idx(path, array):
    """An MNIST idx file (gzipped): magic 0x0000 08 ndim, big-endian dims, uint8 data."""
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0800 | array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def test_torch_digits_reads_mnist_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "mnist"
    data.mkdir()
    for stem, n in (("train", 256), ("t10k", 64)):
        labels = rng.integers(0, 10, n)
        images = np.zeros((n, 28, 28), np.uint8)
        for i, c in enumerate(labels):  # a learnable pattern: a bright row per class
            images[i, 2 + 2 * c, :] = 255
        write_idx(data / f"{stem}-images-idx3-ubyte.gz", images)
        write_idx(data / f"{stem}-labels-idx1-ubyte.gz", labels)
    out = run([PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--data-dir", str(data), "--epochs", "3",
               "--batch-size", "16", "--log-dir", str(tmp_path / "logs"), "--compression", "maxmin"], tmp_path)
    assert f"MNIST from {data}: 256 train / 64 test images" in out
    top1 = float(out.split("final test accuracy: top-1 ")[1].split("%")[0])
    assert top1 > 50, out  # the pattern is easy; chance is 10%


def test_torch_digits_ddp_modes(tmp_path):
    for args in (["--mode", "ddp", "--compression", "powersgd"], ["--mode", "ddp", "--backend", "gloo",
                                                                    "--compression", "fp16"]):
        out = run([PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--epochs", "1", "--max-steps", "5",
                   "--log-dir", str(tmp_path / "logs")] + args, tmp_path)
        assert "final test accuracy: top-1" in out
    r = subprocess.run([GCRUN, "-np", "1", PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--mode", "hvd",
                        "--compression", "powersgd_fp16"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0 and "not available in --mode hvd" in r.stderr
    r = subprocess.run([GCRUN, "-np", "1", PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--mode", "ddp",
                        "--compression", "powersgd_fp16"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0 and "which torch does not implement on CPU; use --compression powersgd" in r.stderr


def accuracy_and_bytes(launcher, out):
    """torch_digits' final top-1 accuracy and rank 0's MB reduced and sent, from its output."""
    acc = re.search(r"final test accuracy: top-1 ([\d.]+)%", out)
    sent = re.search(r"([\d.]+) MB reduced, ([\d.]+) MB sent", out)
    assert acc and sent, (launcher, out[-3000:])
    return float(acc.group(1)), float(sent.group(1)), float(sent.group(2))


def test_torch_digits_under_torchrun_trains_as_under_gcrun(tmp_path):
    """The quick start's job started by torchrun (no MPI: a world connected through torch's store)
    reaches the accuracy of the same job under gcrun and sends the same compressed bytes."""
    job = [os.path.join(ROOT, "examples", "torch_digits.py"), "--epochs", "2", "--no-progress", "--log-dir",
           str(tmp_path)]
    settings = {"GRADCOMP_COMPRESSION": "maxmin", "GRADCOMP_BITS": "4"}
    outs = {"gcrun": run([PY] + job, cwd=tmp_path, env=settings)}
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] + job,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, **settings))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    outs["torchrun"] = r.stdout
    got = {launcher: accuracy_and_bytes(launcher, out) for launcher, out in outs.items()}
    (acc_m, in_m, wire_m), (acc_t, in_t, wire_t) = got["gcrun"], got["torchrun"]
    assert acc_m > 90 and abs(acc_t - acc_m) <= 1.0, got
    assert in_t == in_m and abs(wire_t - wire_m) <= 0.01 * wire_m, got


def test_torch_digits_under_torchrun_on_two_emulated_nodes_trains_as_under_mpirun(tmp_path):
    """Multi-node torchrun: 2 nodes x 2 ranks joined at 1 Gbit/s (scripts/cluster.sh: a network and
    UTS namespace a node), one torchrun agent per node meeting at node 1's c10d rendezvous, runs the
    quick start's job as mpirun does on the same cluster: the same accuracy, and the same bytes from
    rank 0 (the node's shared-memory stage, then the compressed exchange across the nodes)."""
    tag = "gx" + uuid.uuid4().hex[:6]
    up = subprocess.run(["bash", CLUSTER, "up", tag, "2", "1gbit"], capture_output=True, text=True)
    assert up.returncode == 0, f"the emulated cluster did not come up (needs root, ip, tc):\n{up.stderr}"
    try:
        job = [PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--epochs", "2", "--no-progress",
               "--log-dir", str(tmp_path)]
        settings = {"GRADCOMP_COMPRESSION": "maxmin", "GRADCOMP_BITS": "4", "OMP_NUM_THREADS": "1"}
        mpirun = up.stdout.split("\n")[:-3] + ["-H", f"{NODE_ADDRESS % 1}:2,{NODE_ADDRESS % 2}:2", "-np", "4"]
        for key, value in settings.items():
            mpirun += ["-x", f"{key}={value}"]
        r = subprocess.run(mpirun + job, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        outs = {"mpirun": r.stdout}
        agents = []
        for node in (1, 2):
            name = f"{tag}-n{node}"
            torchrun = [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                        f"--rdzv_endpoint={NODE_ADDRESS % 1}:29400", f"--rdzv_id={tag}",
                        f"--rdzv_conf=is_host={int(node == 1)}", f"--local_addr={NODE_ADDRESS % node}"]
            agents.append(subprocess.Popen(
                ["ip", "netns", "exec", name, "unshare", "--uts", "/bin/sh", "-c", 'hostname "$0" && exec "$@"',
                 name] + torchrun + job[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                env=dict(os.environ, **settings)))
        ends = [agent.communicate(timeout=300) for agent in agents]
        assert all(agent.returncode == 0 for agent in agents), [out[-3000:] + err[-3000:] for out, err in ends]
        outs["torchrun"] = ends[0][0]
    finally:
        subprocess.run(["bash", CLUSTER, "down", tag], check=True)
    got = {launcher: accuracy_and_bytes(launcher, out) for launcher, out in outs.items()}
    (acc_m, in_m, wire_m), (acc_t, in_t, wire_t) = got["mpirun"], got["torchrun"]
    # The fused batches follow the ranks' timing, and with them the quantization's buckets: two
    # runs of the same job differ by a few of the 360 test images (94.7% and 96.1% seen here).
    assert acc_m > 90 and acc_t > 90 and abs(acc_t - acc_m) <= 3.0, got
    assert in_t == in_m and abs(wire_t - wire_m) <= 0.01 * wire_m, got


def test_torch_digits_trains_with_adasum(tmp_path):
    """Horovod's examples' --use-adasum: the ranks' updates combined with Adasum at one rank's
    learning rate train the digits as well as averaging does (98.3-98.6% over 3 seeds here)."""
    out = run([PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--use-adasum", "--log-dir",
               str(tmp_path / "logs")], tmp_path)
    assert "op Adasum" in out and "Adasum combined the updates as exact float32 values" in out
    top1 = float(out.split("final test accuracy: top-1 ")[1].split("%")[0])
    assert top1 >= 95, out
    r = subprocess.run([GCRUN, "-np", "1", PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--use-adasum",
                        "--compression", "maxmin"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0 and "--use-adasum needs --mode hvd and --compression none or fp16" in r.stderr


TORCH = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("example, label, needs, settings", [
    ("torch_fsdp_charlm.py", "FSDP", (2, 0), {}),
    ("torch_fsdp2_charlm.py", "FSDP2", (2, 9), {"GRADCOMP_ERROR_FEEDBACK": "1"}),
])
def test_fsdp_charlms_train_compressed_as_on_gloo(tmp_path, example, label, needs, settings):
    """torch_fsdp_charlm (FSDP, torch 2) and torch_fsdp2_charlm (FSDP2 with compress_fsdp, torch
    2.9+): 8-bit weights and 4-bit gradients on backend gradcomp reach gloo's validation loss
    within 2% in 60 steps, a quarter of the bytes or less on the wire. On an older torch each
    says at once what it needs."""
    script = [PY, os.path.join(ROOT, "examples", example), "--steps", "60", "--log-every", "0"]
    if TORCH < needs:
        r = subprocess.run([GCRUN, "-np", "1"] + script, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode != 0 and f"needs torch {needs[0]}" in r.stderr, r.stderr
        return
    # No warning from torch either (FSDP2 warns of a root module whose output is a view).
    exact = run(script + ["--backend", "gloo"], tmp_path, warnings_allowed=False)
    compressed = run(script, tmp_path, env={"GRADCOMP_ALLGATHER_COMPRESSION": "maxmin", "GRADCOMP_COMPRESSION": "maxmin",
                                            "GRADCOMP_BITS": "4", **settings}, warnings_allowed=False)
    assert f"{label} on gradcomp (weights maxmin, gradients maxmin), 2 ranks" in compressed, compressed

    def loss(out):
        return float(out.split("validation loss: ")[1].split()[0])
    assert loss(exact) < 4.0 and abs(loss(compressed) - loss(exact)) < 0.02 * loss(exact), (exact, compressed)
    into, wire = (float(v) for v in compressed.split("compressed: ")[1].replace(" MiB in,", "").split()[:2])
    assert into > 10 and wire < 0.25 * into, compressed


def test_torch_diloco_charlm_syncs_every_h_steps_compressed_and_reports_its_curve(tmp_path):
    """examples/torch_diloco_charlm.py (what diloco_cluster.sh runs): 4-bit Streaming DiLoCo,
    its validation loss falling, its record with the codecs' bytes."""
    out = run([PY, os.path.join(ROOT, "examples", "torch_diloco_charlm.py"), "--steps", "100", "--sync-every", "10",
               "--fragments", "2", "--delay", "1", "--bits", "4", "--eval-every", "50", "--outer-momentum", "0.5"],
              tmp_path)
    assert "DiLoCo H=10 (4-bit, 2 fragments, delay 1): 2 ranks" in out, out
    record = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    losses = [point["validation_loss"] for point in record["curve"]]
    # ln 256 = 5.55 nats a character untrained
    assert [point["step"] for point in record["curve"]] == [50, 100] and 3.5 > losses[0] > losses[1], record
    assert record["curve"][-1]["codec_bytes_per_step"] > 0, record


def test_torch_dgc_resnet_reads_cifar_pickles(tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "cifar-10-batches-py"
    data.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (32, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, 32).tolist()}
        with open(data / name, "wb") as f:
            pickle.dump(batch, f)
    out = run([PY, os.path.join(ROOT, "examples", "torch_dgc_resnet.py"), "--data-dir", str(data), "--epochs", "1",
               "--batch-size", "16"], tmp_path)
    assert f"CIFAR-10 from {data}; ResNet-20; 2 ranks; DGC top-k 0.001" in out
    assert "epoch 1: loss" in out and "top-k sent" in out


def test_synthetic_benchmark_and_numpy_example(tmp_path):
    out = run([PY, os.path.join(ROOT, "examples", "torch_synthetic_benchmark.py"), "--model", "mlp",
               "--num-iters", "2", "--num-batches-per-iter", "2", "--compression", "maxmin"], tmp_path)
    assert "Img/sec per rank:" in out and "Total img/sec on 2 rank(s):" in out and "compressed gradients" in out
    # Horovod's benchmark flags (on the CPU here: no CUDA).
    out = run([PY, os.path.join(ROOT, "examples", "torch_synthetic_benchmark.py"), "--model", "mlp",
               "--num-iters", "2", "--num-batches-per-iter", "2", "--fp16-allreduce", "--use-adasum"], tmp_path)
    assert "2 ranks on CPU, compression fp16, op Adasum" in out and "Total img/sec on 2 rank(s):" in out
    out = run([PY, os.path.join(ROOT, "examples", "numpy_allreduce.py")], tmp_path)
    assert "4-bit max-min: relative L2 error 0.1" in out


def test_soak_holds_memory_and_gauges_steady_with_a_timeline(tmp_path):
    # A short soak (the 10,000-step one is in docs/benchmarks.md): both compression phases,
    # with the timeline recording, must keep RSS within 1% and every gauge flat after warm-up.
    trace = tmp_path / "soak.json"
    out = run([PY, os.path.join(ROOT, "examples", "benchmarks", "soak_digits.py"), "--steps", "1200", "--warmup",
               "400", "--every", "400", "--timeline", str(trace)], tmp_path, timeout=600)
    assert out.count("| 1200 |") == 2 and "soak passed" in out, out[-2000:]
    assert trace.stat().st_size > 0


def test_the_gpu_checks_training_script_trains_through_every_adapter(tmp_path):
    # scripts/device/check.sh runs it on a GPU (torch 2.x there); here on the CPU, so that it
    # stays runnable: uncompressed DistributedOptimizer and DDP equal one process on the whole
    # batch, the compressed modes learn, every rank ends with the same parameters.
    out = run([PY, os.path.join(ROOT, "scripts", "device", "torch_training_check.py"), "--device", "cpu"], tmp_path)
    assert out.count("every adapter trained, every check passed") == 2, out[-3000:]
    for mode in ("hvd_none", "hvd_maxmin4", "ddp_backend", "ddp_hook4"):
        assert out.count(f": {mode}: loss ") == 2, out[-3000:]
    assert out.count(": p2p: ok") == 2 and out.count(": adasum: ok") == 2, out[-3000:]
