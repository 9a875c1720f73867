"""examples/benchmarks/codec_profile: the seconds a device's codec calls and copies take by call size,
which simulations price codec work from (GRADCOMP_SIM_CODEC_PROFILE). GRADCOMP_CODEC_PROFILE_RUNS
lists DEVICE=BINARY pairs (comma-separated): the host device in the build's binary, and the CUDA
device of the emulated runtime (test/support/cuda_emulation), the path a GPU session profiles."""
import os
import subprocess
import tempfile

SIZES = [1024, 16384, 262144]
CODECS = ["maxmin4", "maxmin8", "fp16", "none"]


def runs():
    pairs = [p.split("=", 1) for p in os.environ["GRADCOMP_CODEC_PROFILE_RUNS"].split(",") if p]
    assert pairs and all(len(p) == 2 for p in pairs), os.environ["GRADCOMP_CODEC_PROFILE_RUNS"]
    return pairs


def profile(binary, device, *extra):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "profile.txt")
        proc = subprocess.run([binary, "--device", device, "--codecs", ",".join(CODECS), "--mb", "1", "--reps", "1",
                               "--sizes", ",".join(map(str, SIZES)), "--out", out, *extra],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        with open(out) as f:
            text = f.read()
    assert text == proc.stdout  # --out holds what it printed
    return text


def parse(text):
    """The rows as the simulation reads them (ops/common/simulation.cc): {(op, codec): {values: seconds}}."""
    device, curves = None, {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "device":
            device = line.split(None, 1)[1]
            continue
        op, codec, values, seconds = words
        curves.setdefault((op, codec), {})[int(values)] = float(seconds)
    return device, curves


def test_every_device_profiles_every_codec_op_and_copy_at_every_size():
    for device, binary in runs():
        name, curves = parse(profile(binary, device))
        assert name, device
        expected = {(op, c) for op in ("encode", "decode", "decode_acc") for c in CODECS}
        expected |= {(op, "-") for op in ("copy", "elementwise", "to_host", "from_host")}
        assert set(curves) == expected, (device, sorted(set(curves) ^ expected))
        for key, curve in curves.items():
            assert sorted(curve) == SIZES, (device, key, curve)
            assert all(s >= 0 for s in curve.values()), (device, key, curve)
        for c in CODECS:
            for op in ("encode", "decode", "decode_acc"):
                # Real work: a call of 256x the values takes longer. Except a plain copy (codec
                # none's encode and decode) on the emulated GPU, whose time is the emulation's
                # per-call overhead (0.1-0.3 ms, a stream's synchronization) more than the 1 MB's:
                # under CI's load, once, the 1K call measured longer than the 256K one.
                curve = curves[(op, c)]
                assert curve[SIZES[0]] > 0, (device, op, c, curve)
                if device != "host" and c == "none" and op != "decode_acc":
                    continue
                assert curve[SIZES[-1]] > curve[SIZES[0]], (device, op, c, curve)
        if device == "host":
            # The host device's staged buffers are the wire itself: "copies" to the host cost
            # next to nothing, where a real copy of the same bytes takes time.
            for op in ("to_host", "from_host"):
                assert curves[(op, "-")][SIZES[-1]] < 0.1 * curves[("copy", "-")][SIZES[-1]], curves[(op, "-")]
        else:
            # A GPU's staged buffers are copied over to the host and back.
            assert curves[("to_host", "-")][SIZES[-1]] > 0, device
            assert "host" not in name, name


def test_bad_options_name_the_option():
    device, binary = runs()[0]
    for args, says in ((["--codecs", "maxmin9"], "maxmin9"), (["--sizes", "1024,x"], "--sizes"),
                       (["--mb", "1", "--sizes", "999999999"], "--sizes 999999999"), (["--device", "tpu"], "--device"),
                       (["--reps"], "--reps needs a value")):
        proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.returncode, proc.stderr)
