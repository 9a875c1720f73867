"""The simulation target (cmake -DGRADCOMP_SIMULATION=ON, driven by examples/benchmarks/simulate.py):
the data plane builds against SimGrid's SMPI, and on small simulated clusters its allreduces take
what the links allow. Builds into GRADCOMP_SIM_BUILD_DIR (the test registration puts it under the
build directory)."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIMULATE = os.path.join(ROOT, "examples", "benchmarks", "simulate.py")


def simulate(*args, codec_scale="1"):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, GRADCOMP_SIM_CODEC_SCALE=codec_scale)
        subprocess.run([sys.executable, SIMULATE, *args, "--out", out], check=True, timeout=900, env=env)
        with open(out) as f:
            return {r["variant"]: r for r in json.load(f)["rows"]}


def test_two_nodes_at_one_gigabit_run_near_the_link():
    rows = simulate("--nodes", "2", "--link", "1Gbps", "--latency", "15us", "--sizes-mb", "16",
                    "--variants", "mpi,sra:none,sra:maxmin4", "--reps", "1")
    mpi, none, four = rows["mpi"], rows["sra:none"], rows["sra:maxmin4"]
    # Uncompressed, the ring and SRA both send 2 (n-1)/n of the buffer: near the link's rate
    # (SMPI's TCP model keeps ~0.9 of it).
    for r in (mpi, none):
        assert 0.75 <= r["ideal_seconds"] / r["seconds"] <= 1.0, r
    # 4 bits: 7.76x fewer bytes than float32 (buckets of 512 carry a min and a unit)...
    assert abs(mpi["bytes_sent"] / four["bytes_sent"] - 7.76) < 0.1, four
    # ...and, codec time included, at least 5x MPI_Allreduce's speed (the ideal is 7.76x).
    assert mpi["seconds"] / four["seconds"] >= 5.0, (mpi, four)
    assert four["codec_seconds"] > 0


def test_the_grid_sends_flat_sras_bytes_and_the_hierarchy_fewer():
    # 8 nodes of 2 ranks, the network alone (codec scale 0): the 2-D SRA moves the bytes flat SRA
    # moves (2 rows x 8 columns); hierarchical sends only the node's shard across.
    rows = simulate("--nodes", "8", "--ranks-per-node", "2", "--sizes-mb", "16",
                    "--variants", "sra:maxmin4,sra2d:maxmin4,hier:maxmin4,hier2d:maxmin4", "--reps", "1",
                    codec_scale="0")
    flat, grid = rows["sra:maxmin4"], rows["sra2d:maxmin4"]
    assert abs(grid["bytes_sent"] / flat["bytes_sent"] - 1) < 0.01, (flat, grid)
    for v in ("hier:maxmin4", "hier2d:maxmin4"):
        # Across nodes a rank sends its shard (1/2 of the buffer) SRA'd among 8: under half of
        # flat SRA's bytes (which also cross the node's link), plus the node-local exchanges.
        assert rows[v]["seconds"] < flat["seconds"], (v, rows[v], flat)
    assert rows["hier:maxmin4"]["codec_seconds"] > 0


def test_node_rows_keep_a_nodes_traffic_to_its_share():
    # 16 nodes of 2 ranks, the network alone: flat SRA over all 32 ranks sends each rank's chunks
    # for the other nodes across the node's link (twice what the node needs to send); the grids
    # whose rows are the nodes exchange inside the node over the loopback and send only the
    # columns across, flat (sra2dnode) or on a 4 x 4 grid of the nodes (sra3d, what the runtime
    # runs from GRADCOMP_GRID_MIN_RANKS nodes on). Every variant sends the same bytes in all.
    rows = simulate("--nodes", "16", "--ranks-per-node", "2", "--sizes-mb", "16",
                    "--variants", "sra:maxmin4,sra2dnode:maxmin4,sra3d:maxmin4", "--reps", "1",
                    codec_scale="0")
    flat = rows["sra:maxmin4"]
    for v in ("sra2dnode:maxmin4", "sra3d:maxmin4"):
        assert abs(rows[v]["bytes_sent"] / flat["bytes_sent"] - 1) < 0.02, (v, rows[v], flat)
        assert rows[v]["seconds"] < 0.75 * flat["seconds"], (v, rows[v], flat)


def test_a_grid_composed_from_its_rows_and_columns_predicts_the_whole_run():
    # 64 nodes of one rank on the fat tree, the network alone: the 2-D SRA (8 x 8) run whole, and
    # composed (--compose) from a world of two of its rows (16 nodes) and its column's SRA of 8
    # and of 2 nodes, as simulate.py does for 1024 nodes.
    args = ["--nodes", "64", "--topology", "fattree", "--sizes-mb", "64", "--variants", "sra2d:maxmin4",
            "--reps", "1", "--warmup", "0"]
    whole = simulate(*args, codec_scale="0")["sra2d:maxmin4"]
    composed = simulate(*args, "--compose", codec_scale="0")["sra2d:maxmin4"]
    assert "composed" not in whole
    parts = composed["composed"]
    assert parts["grid"] == [8, 8], parts
    assert parts["two_rows_seconds"] > parts["column_seconds"] > 0, parts
    assert abs(composed["seconds"] / whole["seconds"] - 1) < 0.1, (whole, composed)
    assert abs(composed["bytes_sent"] / whole["bytes_sent"] - 1) < 0.01, (whole, composed)


def test_a_nested_grid_composed_from_its_rows_and_nested_columns_predicts_the_whole_run():
    # Four levels on 64 nodes of one rank (rows of 8 nodes; each 8-node column on a 2 x 4 grid of
    # its own, as the runtime nests 64-node columns at 1024 x 8): composed from two rows and the
    # column's own 2-D SRA on 8 nodes, against the whole run of the same grid. Within 15%: -8%
    # (7.7 ms against 8.4) until the row steps sent to the next peers first, which
    # speeds the world of two rows (7.43 -> 7.08 ms) more than the whole world's rows (8.4 -> 8.3):
    # -11.5%, optimistic.
    args = ["--nodes", "64", "--topology", "fattree", "--sizes-mb", "64", "--variants", "sra2d:maxmin4",
            "--cross-columns", "8,4", "--reps", "1", "--warmup", "0"]
    whole = simulate(*args, codec_scale="0")["sra2d:maxmin4"]
    composed = simulate(*args, "--compose", codec_scale="0")["sra2d:maxmin4"]
    parts = composed["composed"]
    assert parts["grid"] == [8, 8] and parts["levels"] == [8, 4], parts
    assert abs(composed["seconds"] / whole["seconds"] - 1) < 0.15, (whole, composed)
    assert abs(composed["bytes_sent"] / whole["bytes_sent"] - 1) < 0.01, (whole, composed)


def test_cross_columns_is_checked_before_anything_runs():
    # Each is rejected before the simulation target is built, naming the option and the value.
    for args, message in (
            (["--nodes", "64", "--topology", "fattree", "--compose", "--cross-columns", "7"],
             "--cross-columns 7: each row length must be at least 2 and divide the nodes its level spans "
             "(64 of --nodes 64), got 7"),
            (["--nodes", "64", "--topology", "fattree", "--compose", "--cross-columns", "1"],
             "--cross-columns 1: each row length must be at least 2 and divide the nodes its level spans "
             "(64 of --nodes 64), got 1"),
            (["--nodes", "1024", "--topology", "fattree", "--compose", "--cross-columns", "16,3"],
             "--cross-columns 16,3: each row length must be at least 2 and divide the nodes its level spans "
             "(64 of --nodes 1024), got 3"),
            (["--nodes", "64", "--topology", "fattree", "--compose", "--cross-columns", "8,x"],
             "'8,x' is not a comma-separated list of integers")):
        proc = subprocess.run([sys.executable, SIMULATE, *args], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, GRADCOMP_SIM_BUILD_DIR="/nonexistent-gradcomp-sim"))
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)


def test_the_composed_grid_is_the_runtimes():
    # simulate.py composes the grid the runtime would run (its GridShape, mirrored): at one rank a
    # node the most square; at eight rows of at most 16 nodes, long columns nested (1024 x 8:
    # rows of 16 nodes, 64-node columns on 8 x 8 grids). The C++ rule's own test holds the same
    # figures (test_compressed_allreduce, GridShape.*).
    sys.path.insert(0, os.path.dirname(SIMULATE))
    try:
        import simulate as sim
    finally:
        sys.path.pop(0)
    assert sim.grid_shape(1024, 1) == [32]
    assert sim.grid_shape(512, 1) == [32]
    assert sim.grid_shape(1024, 8) == [16, 8]
    assert sim.grid_shape(512, 8) == [16, 8]
    assert sim.grid_shape(256, 8) == [16]
    assert sim.grid_shape(64, 8) == [8]
    assert sim.grid_shape(31, 8) == [31]


def write_profile(path, seconds_per_value, codecs=("maxmin4",), leave_out=(), staging_seconds_per_value=None):
    """A profile as examples/benchmarks/codec_profile writes it, every call costing 1000 values'
    time plus its own values' (so that scaling seconds_per_value scales every call's price);
    copies to and from the host at staging_seconds_per_value if given."""
    with open(path, "w") as f:
        f.write("# made up by test_simulation.py\ndevice synthetic\n")
        ops = [(op, c) for op in ("encode", "decode", "decode_acc") for c in codecs]
        ops += [(op, "-") for op in ("copy", "elementwise", "to_host", "from_host")]
        for op, codec in ops:
            if f"{op} {codec}" in leave_out:
                continue
            rate = seconds_per_value
            if staging_seconds_per_value is not None and op in ("to_host", "from_host"):
                rate = staging_seconds_per_value
            for n in (1024, 16777216):
                f.write(f"{op} {codec} {n} {(1000 + n) * rate:.9g}\n")


def test_a_codec_profile_prices_the_codec_work_instead_of_this_machines_clock():
    # 2 nodes, a 16 MB (4M values) 4-bit SRA. Every rank encodes each of its 4M values once and
    # decodes each at least once, so at 1 ns a value the profile charges at least 8 ms a rank,
    # whatever this machine's codec takes; at 4 ns, 4 times as much (the same calls, priced).
    args = ["--nodes", "2", "--sizes-mb", "16", "--variants", "mpi,sra:maxmin4", "--reps", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        priced = {}
        for ns in (1, 4):
            path = os.path.join(tmp, f"{ns}ns.txt")
            write_profile(path, ns * 1e-9)
            priced[ns] = simulate(*args, "--codec-profile", path)["sra:maxmin4"]
        measured = simulate(*args)["sra:maxmin4"]
    one, four = priced[1], priced[4]
    assert one["charged_seconds"] >= 8e-3, one
    assert abs(four["charged_seconds"] / one["charged_seconds"] - 4) < 1e-3, (one, four)
    # The codec's time is on the critical path (its work is 8x the link's ~1 ms at 4 bits).
    assert four["seconds"] > 2.5 * one["seconds"], (one, four)
    # Without a profile the charge is this machine's time, measured (the tasks' whole time; the
    # codec's phases inside them, a little less).
    assert measured["codec_seconds"] > 0, measured
    assert abs(measured["charged_seconds"] / measured["codec_seconds"] - 1) < 0.1, measured
    # The same algorithm sends the same bytes, however its codec is priced.
    assert one["bytes_sent"] == four["bytes_sent"] == measured["bytes_sent"]


def test_a_profile_prices_the_work_between_the_steps_too():
    # 2 nodes of 2 ranks, 16 MB (4M values), hierarchical. With a GPU's tensors and MPI on the host
    # each rank copies the whole input to the host and the result back, and its shard of the node
    # sum up and down: 3 x 4M values. The profile prices those copies (staging.h) although they
    # run between the pipeline's tasks, on the rank's own core: at 1 ns a value, >= 12 ms more
    # charged than when they are free, and the step that much longer.
    args = ["--nodes", "2", "--ranks-per-node", "2", "--sizes-mb", "16", "--variants", "hier:maxmin4", "--reps", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for ns in (0, 1):
            path = os.path.join(tmp, f"staging{ns}.txt")
            write_profile(path, 1e-11, staging_seconds_per_value=ns * 1e-9)
            rows[ns] = simulate(*args, "--codec-profile", path)["hier:maxmin4"]
    free, priced = rows[0], rows[1]
    assert priced["charged_seconds"] - free["charged_seconds"] >= 12e-3, (free, priced)
    assert priced["seconds"] - free["seconds"] >= 0.9 * 12e-3, (free, priced)
    assert priced["bytes_sent"] == free["bytes_sent"]


def test_a_profile_without_the_work_a_run_needs_stops_it_naming_the_line():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "profile.txt")
        write_profile(path, 1e-9, leave_out=("decode_acc maxmin4",))
        proc = subprocess.run([sys.executable, SIMULATE, "--nodes", "2", "--sizes-mb", "4", "--variants",
                               "sra:maxmin4", "--reps", "1", "--codec-profile", path],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0, proc.stdout
        assert f"GRADCOMP_SIM_CODEC_PROFILE {path} has no 'decode_acc maxmin4' line" in proc.stderr, proc.stderr
        proc = subprocess.run([sys.executable, SIMULATE, "--nodes", "2", "--codec-profile", path + ".missing"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, GRADCOMP_SIM_BUILD_DIR="/nonexistent-gradcomp-sim"))
        assert proc.returncode != 0 and f"--codec-profile {path}.missing" in proc.stderr, proc.stderr
