"""gcrun: command construction for every flag and host form, --dry-run, every error, the exit
code of the first failing rank, Ctrl-C cleanup, an end-to-end run of the digits example, and
the timeline tool on a trace recorded by that run. Run by ctest with plain pytest (gcrun
itself starts mpirun)."""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from paths import FORWARD_PACKAGE, GCRUN, PY, ROOT

sys.path.insert(0, os.path.join(ROOT, "launcher"))
import gcrun  # noqa: E402



def build(argv, env=None, is_root=True, cpu_count=2):
    opts, command = gcrun.parse_args(argv)
    args, run_env, assigned = gcrun.build_command(opts, command, env=env or {"PATH": os.environ["PATH"]},
                                                  is_root=is_root, cpu_count=cpu_count, port=12345)
    return args, run_env, assigned


def exported(args):
    return [args[i + 1] for i, a in enumerate(args) if a == "-x"]


def run_gcrun(argv, timeout=120, **kw):
    return subprocess.run([GCRUN] + argv, capture_output=True, text=True, timeout=timeout, **kw)


# -- command construction ---------------------------------------------------------------------


def test_basic_command():
    args, env, _ = build(["-np", "2", PY, "train.py", "--epochs", "3"])
    assert os.path.basename(args[0]) == "mpirun" and args[1:3] == ["-np", "2"]
    assert "--allow-run-as-root" in args and "--oversubscribe" not in args
    assert args[-4:] == ["gcrun-rank", PY, "train.py", "--epochs", "3"][-4:]
    assert args[args.index("gcrun-rank") + 1:] == [PY, "train.py", "--epochs", "3"]
    # torch.distributed's env:// variables
    shim = args[args.index("-c") + 1]
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        assert f'{var}="$OMPI_COMM_WORLD_' in shim
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "12345"
    assert {"PATH", "MASTER_ADDR", "MASTER_PORT"} <= set(exported(args))


def test_network_interface_reaches_gradcomp_open_mpi_and_nccl():
    args, env, _ = build(["-np", "2", "--network-interface", "eth0,ib0", PY, "x.py"])
    i = args.index("btl_tcp_if_include")
    assert args[i - 1] == "--mca" and args[i + 1] == "eth0,ib0"
    assert "NCCL_SOCKET_IFNAME=eth0,ib0" in exported(args)
    assert env["GRADCOMP_CONTROLLER_IFACE"] == "eth0,ib0" and "GRADCOMP_CONTROLLER_IFACE" in exported(args)
    with pytest.raises(gcrun.LaunchError, match="--network-interface takes interface names"):
        build(["-np", "2", "--network-interface", "eth0;rm -rf", PY, "x.py"])


def test_not_root_and_oversubscribe():
    args, _, _ = build(["-np", "3", PY, "x.py"], is_root=False, cpu_count=2)
    assert "--allow-run-as-root" not in args and "--oversubscribe" in args
    args, _, _ = build(["-np", "2", PY, "x.py"], is_root=False, cpu_count=2)
    assert "--oversubscribe" not in args


@pytest.mark.parametrize("flag,value,var,expected", [
    ("--compression", "maxmin", "GRADCOMP_COMPRESSION", "maxmin"),
    ("--bits", "4", "GRADCOMP_BITS", "4"),
    ("--bucket-size", "256", "GRADCOMP_BUCKET_SIZE", "256"),
    ("--topk-ratio", "0.001", "GRADCOMP_TOPK_RATIO", "0.001"),
    ("--error-feedback", None, "GRADCOMP_ERROR_FEEDBACK", "1"),
    ("--fusion-threshold-mb", "32", "GRADCOMP_FUSION_THRESHOLD_MB", "32.0"),
    ("--cycle-time-ms", "2.5", "GRADCOMP_CYCLE_TIME_MS", "2.5"),
    ("--hierarchical", None, "GRADCOMP_HIERARCHICAL", "1"),
    ("--timeline-filename", "/tmp/t.json", "GRADCOMP_TIMELINE", "/tmp/t.json"),
    ("--stall-check-warning-time-seconds", "30", "GRADCOMP_STALL_CHECK_TIME_SECONDS", "30.0"),
    ("--stall-check-shutdown-time-seconds", "120", "GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS", "120.0"),
    ("--log-level", "debug", "GRADCOMP_LOG_LEVEL", "debug"),
])
def test_each_setting_flag_becomes_its_variable(flag, value, var, expected):
    argv = ["-np", "2", flag] + ([value] if value is not None else []) + [PY, "x.py"]
    args, env, assigned = build(argv)
    assert env[var] == expected and assigned[var] == expected and var in exported(args)
    if value is not None:  # --flag=value works too
        _, env2, _ = build(["-np", "2", f"{flag}={value}", PY, "x.py"])
        assert env2[var] == expected


@pytest.mark.parametrize("argv,var,expected", [
    (["--hierarchical-allreduce"], "GRADCOMP_HIERARCHICAL", "1"),
    (["--hierarchical", "--no-hierarchical-allreduce"], "GRADCOMP_HIERARCHICAL", "0"),
    (["--cache-capacity", "2048"], "GRADCOMP_CACHE_CAPACITY", "2048"),
    (["--timeline-mark-cycles"], "GRADCOMP_TIMELINE_MARK_CYCLES", "1"),
    (["--no-autotune"], "GRADCOMP_AUTOTUNE", "0"),
    (["--no-stall-check"], "GRADCOMP_STALL_CHECK_TIME_SECONDS", "0"),
    (["--gloo"], "GRADCOMP_CONTROLLER", "gloo"),
    (["--mpi"], "GRADCOMP_CONTROLLER", "mpi"),
])
def test_horovodruns_flags_become_gradcomps_settings(argv, var, expected):
    args, env, _ = build(["-np", "2"] + argv + [PY, "x.py"])
    assert env[var] == expected and var in exported(args)


def test_horovodruns_launch_flags_become_mpirun_arguments():
    args, _, _ = build(["--num-proc", "4", "-H", "a:2,b:2", "-p", "2222", "-i", "/keys/id rsa", "-prefix-timestamp",
                        "--tcp", "--binding-args=--bind-to socket --map-by socket", "--network-interface", "eth0",
                        "--network-interfaces", "eth1,eth2", PY, "x.py"])
    assert args[args.index("-np") + 1] == "4"
    assert args[args.index("plm_rsh_args") + 1] == "-p 2222 -i '/keys/id rsa'"
    assert "--timestamp-output" in args
    assert args[args.index("pml") - 1:args.index("pml") + 4] == ["--mca", "pml", "ob1", "--mca", "btl"]
    assert args[args.index("pml") + 4] == "^openib"
    i = args.index("--bind-to")
    assert args[i:i + 4] == ["--bind-to", "socket", "--map-by", "socket"] and args.count("--bind-to") == 1
    assert args[args.index("btl_tcp_if_include") + 1] == "eth0,eth1,eth2"


def test_horovodruns_flags_with_nothing_to_do_are_accepted_with_a_note():
    r = run_gcrun(["-np", "2", "--start-timeout", "30", "--hierarchical-allgather", "--log-without-timestamp",
                   "--autotune-warmup-samples=5", "--dry-run", PY, "x.py"])
    assert r.returncode == 0, r.stderr
    assert "gcrun: note: --start-timeout has no effect: gcrun runs no start-up checks" in r.stderr
    assert "--hierarchical-allgather has no effect: gradcomp's allgather has no hierarchical form" in r.stderr
    assert "--autotune-warmup-samples has no effect" in r.stderr and "--log-without-timestamp has no effect" in r.stderr
    assert "GRADCOMP_" not in r.stdout.split("mpirun")[0].replace("PYTHONPATH", "")  # nothing set for them
    # With --elastic too (its launches take another path): the note comes before anything else.
    r = run_gcrun(["--elastic", "-np", "2", "--start-timeout", "30", "--dry-run", PY, "x.py"])
    assert r.returncode == 2 and "--dry-run does not apply to --elastic" in r.stderr
    assert r.stderr.startswith("gcrun: note: --start-timeout has no effect"), r.stderr


def test_a_horovodrun_command_line_runs_unchanged():
    """horovodrun's flags, and a Horovod variable (HOROVOD_FUSION_THRESHOLD, in bytes) from the caller."""
    r = run_gcrun(["--num-proc", "2", "--cycle-time-ms", "2", "--cache-capacity", "512",
                   "--hierarchical-allreduce", "--no-stall-check", "--mpi", "--log-level", "INFO", PY, "-c",
                   "import gradcomp.numpy as gc, numpy as np; gc.init(); "
                   "print(f'sum={gc.allreduce(np.ones(3), op=gc.Sum)[0]}'); gc.shutdown()"],
                  env=dict(os.environ, HOROVOD_FUSION_THRESHOLD=str(32 * 1024 * 1024)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("sum=2.0") == 2  # (the ranks' lines may interleave)
    assert "fusion 32 MB, cache 512, negotiating over mpi" in r.stderr


def test_caller_variables_are_forwarded_and_flags_win():
    env = {"PATH": os.environ["PATH"], "GRADCOMP_BITS": "8", "CGX_COMPRESSION_BUCKET_SIZE": "128",
           "HOROVOD_FUSION_THRESHOLD": "33554432", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/opt/py",
           "UNRELATED": "x"}
    args, run_env, _ = build(["-np", "2", "--bits", "2", PY, "x.py"], env=env)
    names = exported(args)
    assert {"GRADCOMP_BITS", "CGX_COMPRESSION_BUCKET_SIZE", "HOROVOD_FUSION_THRESHOLD", "LD_LIBRARY_PATH",
            "PYTHONPATH", "PATH"} <= set(names)
    assert "UNRELATED" not in names
    assert run_env["GRADCOMP_BITS"] == "2"
    assert "/opt/py" in run_env["PYTHONPATH"].split(os.pathsep)


def test_verbose_sets_debug_logging_unless_a_level_is_given():
    _, env, _ = build(["-np", "1", "--verbose", PY, "x.py"])
    assert env["GRADCOMP_LOG_LEVEL"] == "debug"
    _, env, _ = build(["-np", "1", "--verbose", "--log-level", "warning", PY, "x.py"])
    assert env["GRADCOMP_LOG_LEVEL"] == "warning"


@pytest.mark.parametrize("hosts,expected,slots", [
    ("a:4,b:4", "a:4,b:4", 8), ("a,b", "a:1,b:1", 2), ("node-1:2", "node-1:2", 2), ("localhost:8", "localhost:8", 8)])
def test_host_forms(hosts, expected, slots):
    for flag in ("-H", "--hosts"):
        args, env, _ = build(["-np", str(slots), flag, hosts, PY, "x.py"])
        assert args[args.index("-H") + 1] == expected
        assert "--oversubscribe" not in args
        args, _, _ = build(["-np", str(slots + 1), flag, hosts, PY, "x.py"])
        assert "--oversubscribe" in args
    _, env, _ = build(["-np", "2", "-H", hosts, PY, "x.py"])
    assert env["MASTER_ADDR"] == ("127.0.0.1" if hosts.startswith("localhost") else hosts.split(":")[0].split(",")[0])


def test_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nn1 slots=2\nn2 slots=3\n\n")
    args, env, _ = build(["-np", "5", "--hostfile", str(hf), PY, "x.py"])
    assert args[args.index("--hostfile") + 1] == str(hf) and "--oversubscribe" not in args
    assert env["MASTER_ADDR"] == "n1"
    args, _, _ = build(["-np", "6", "--hostfile", str(hf), PY, "x.py"])
    assert "--oversubscribe" in args


def test_output_filename_and_mpi_args():
    args, _, _ = build(["-np", "2", "--output-filename", "/tmp/logs", "--mpi-args=--mca btl tcp,self -v", PY,
                        "x.py"])
    assert args[args.index("--output-filename") + 1] == "/tmp/logs"
    i = args.index("--mca")
    assert args[i:i + 4] == ["--mca", "btl", "tcp,self", "-v"]


def test_dry_run_prints_a_runnable_command_and_starts_nothing():
    r = run_gcrun(["-np", "2", "--compression", "maxmin", "--bits", "4", "--dry-run", PY, "-c", "print(1)"])
    assert r.returncode == 0 and r.stderr == ""
    words = shlex.split(r.stdout)
    assert "GRADCOMP_COMPRESSION=maxmin" in words and "GRADCOMP_BITS=4" in words
    mpirun = next(i for i, w in enumerate(words) if w.endswith("mpirun"))
    assert words[mpirun + 1:mpirun + 3] == ["-np", "2"] and words[-3:] == [PY, "-c", "print(1)"]


def test_ranks_get_torchruns_defaults_unless_the_user_set_them():
    args, env, assigned = build(["-np", "4", PY, "x.py"])
    assert assigned["OMP_NUM_THREADS"] == "1" and assigned["USE_LIBUV"] == "0"
    assert {"OMP_NUM_THREADS", "USE_LIBUV"} <= set(exported(args))
    args, env, assigned = build(["-np", "4", PY, "x.py"], env={"PATH": "/bin", "OMP_NUM_THREADS": "3",
                                                              "USE_LIBUV": "1"})
    assert "OMP_NUM_THREADS" not in assigned and "USE_LIBUV" not in assigned
    assert env["OMP_NUM_THREADS"] == "3" and {"OMP_NUM_THREADS", "USE_LIBUV"} <= set(exported(args))
    # One rank a host (as torchrun with one process a node): the threads are the rank's own.
    for argv in (["-np", "1", PY, "x.py"], ["-np", "2", "-H", "a:1,b:1", PY, "x.py"]):
        assert "OMP_NUM_THREADS" not in build(argv)[2], argv


def test_a_job_says_once_that_it_set_the_threads_and_a_ddp_script_starts_from_env():
    # torch.distributed's env:// under the torch this machine has (torch 2.4+'s libuv store is
    # missing from some builds), one thread per rank, and torchrun's one line about it.
    code = ("import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); "
            "t = torch.ones(3) * (dist.get_rank() + 1); dist.all_reduce(t); "
            "print(f'ddp ok {dist.get_rank()} {torch.get_num_threads()} {t.tolist()}', flush=True); "
            "dist.destroy_process_group()")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "USE_LIBUV")}
    r = run_gcrun(["-np", "2", PY, "-c", code], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # mpirun forwards each rank's output as it comes: two ranks' lines may meet on one line, so each
    # rank prints its line in one write (print's separate arguments are separate writes unbuffered).
    assert sorted(re.findall(r"ddp ok \d+ \d+ \[[^\]]*\]", r.stdout)) == [
        "ddp ok 0 1 [3.0, 3.0, 3.0]", "ddp ok 1 1 [3.0, 3.0, 3.0]"], r.stdout
    assert r.stderr.count("gcrun: setting OMP_NUM_THREADS=1 for every rank (as torchrun does)") == 1, r.stderr
    # Open MPI 5's TCP transport stays quiet about IPv6 pairs on dual-stack hosts (gradcomp sets
    # btl_tcp_disable_family when it starts MPI): only a script importing gradcomp gets that.
    r = run_gcrun(["-np", "2", PY, "-c", "import gradcomp.numpy as g; g.init(); g.barrier(); g.shutdown()"], env=env)
    assert r.returncode == 0 and "reachable pairing" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_help():
    r = run_gcrun(["--help"])
    assert r.returncode == 0
    for flag in list(gcrun.FLAGS) + list(gcrun.HOROVODRUN_FLAGS) + list(gcrun._ALIASES) + list(gcrun._REFUSED):
        assert flag in r.stdout


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["-np", "0", PY, "x.py"], "-np must be at least 1, got 0"),
    (["-np", "-3", PY, "x.py"], "-np must be at least 1, got -3"),
    (["-np", "two", PY, "x.py"], "-np expects an integer, got 'two'"),
    ([PY, "x.py"], "-np is required"),
    (["-np", "2"], "no command to run"),
    (["-np", "2", "--bogus", PY, "x.py"], "unknown flag --bogus"),
    (["-np", "2", "-H", "a:x", PY, "x.py"], "bad slots 'x' for host 'a'"),
    (["-np", "2", "-H", "a:0", PY, "x.py"], "bad slots 0 for host 'a'"),
    (["-np", "2", "-H", "a,,b", PY, "x.py"], "empty entry"),
    (["-np", "2", "-H", "a:1:2", PY, "x.py"], "bad host 'a:1:2'"),
    (["-np", "2", "-H", "a:1", "--hostfile", "/etc/hostname", PY, "x.py"], "either -H/--hosts or --hostfile"),
    (["-np", "2", "--hostfile", "/no/such/file", PY, "x.py"], "--hostfile /no/such/file: no such file"),
    (["-np", "2", "--bits"], "--bits needs a value"),
    (["-np", "2", "--hierarchical=1", PY, "x.py"], "--hierarchical takes no value"),
    (["-np", "2", "--mpirun", "/no/mpirun", PY, "x.py"], "mpirun not found at /no/mpirun"),
    (["-np", "2", "--config-file", "h.yaml", PY, "x.py"], "--config-file: horovodrun's YAML configuration files are "
                                                           "not read; pass the settings as flags"),
    (["-np", "2", "--jsrun", PY, "x.py"], "--jsrun: gcrun starts the ranks with mpirun"),
    (["-np", "2", "--no-autotune=1", PY, "x.py"], "--no-autotune takes no value"),
])
def test_errors(argv, message):
    r = run_gcrun(argv)
    assert r.returncode == 2, r.stderr
    assert "gcrun: error: " in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize("argv, expected", [
    (["-np", "4", "--compression", "maxmin", "--bits", "4", "--torchrun", "python3", "train.py", "--epochs", "2"],
     "GRADCOMP_BITS=4 GRADCOMP_COMPRESSION=maxmin python3 -m torch.distributed.run --nproc_per_node=4 --standalone "
     "train.py --epochs 2"),
    (["-np", "8", "-H", "a:4,b:4", "--network-interface", "eth1", "--torchrun", "python", "-m", "pkg.train"],
     "# on each of a, b:\nGRADCOMP_CONTROLLER_IFACE=eth1 NCCL_SOCKET_IFNAME=eth1 python -m torch.distributed.run "
     "--nproc_per_node=4 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=a:29400 --rdzv_id=gradcomp-job -m pkg.train"),
    (["-np", "8", "-H", "a:4,b:4", "--elastic", "--min-np", "4", "--max-np", "12", "--reset-limit", "3",
      "--torchrun", "/venv/bin/python3.12", "train.py"],
     "# on each of a, b:\n/venv/bin/python3.12 -m torch.distributed.run --nproc_per_node=4 --nnodes=1:3 "
     "--max_restarts=3 --rdzv_backend=c10d --rdzv_endpoint=a:29400 --rdzv_id=gradcomp-job train.py"),
    (["-np", "2", "--torchrun", "./job.sh", "x"], "torchrun --no-python --nproc_per_node=2 --standalone ./job.sh x"),
])
def test_torchrun_prints_the_same_job_without_mpi(argv, expected):
    r = run_gcrun(argv)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected


def test_torchrun_refuses_nodes_of_different_sizes():
    r = run_gcrun(["-np", "6", "-H", "a:4,b:4", "--torchrun", "python3", "train.py"])
    assert r.returncode == 2 and "-np 6 over a:4, b:2 is not" in r.stderr, r.stderr


def test_no_mpirun_on_path():
    env = dict(os.environ, PATH="/nonexistent")
    r = subprocess.run([PY, GCRUN, "-np", "2", PY, "x.py"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "mpirun not found on PATH" in r.stderr and "openmpi-bin" in r.stderr


# -- running ----------------------------------------------------------------------------------


def test_exit_code_is_that_of_the_failing_rank():
    r = run_gcrun(["-np", "2", "/bin/sh", "-c", 'if [ "$RANK" = 1 ]; then exit 7; fi; sleep 2'])
    assert r.returncode == 7, (r.returncode, r.stderr[-500:])
    r = run_gcrun(["-np", "2", "/bin/sh", "-c", 'echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK"'])
    assert r.returncode == 0
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 of 2 local 0", "rank 1 of 2 local 1"]


def test_a_rank_pinned_to_one_core_is_warned_and_gcrun_does_not_pin():
    # mpirun binds each rank to one core by default for up to two ranks; gradcomp says so at
    # init (its background thread would share that core with the training thread).
    code = "import gradcomp.numpy as g; g.init(); g.shutdown()"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    pinned = subprocess.run(["mpirun", *root, "-np", "1", "--bind-to", "core", *FORWARD_PACKAGE, PY, "-c", code],
                            capture_output=True, text=True, timeout=120)
    assert pinned.returncode == 0, pinned.stderr[-800:]
    warned = "may only run on CPU" in pinned.stdout + pinned.stderr
    assert warned == (os.cpu_count() > 1), pinned.stdout + pinned.stderr  # one core of one is no pinning
    if warned:
        assert "--bind-to none" in pinned.stdout + pinned.stderr  # the fix comes with it
    free = run_gcrun(["-np", "1", PY, "-c", code])
    assert free.returncode == 0 and "may only run on CPU" not in free.stdout + free.stderr, free.stderr[-800:]


def _marked(marker):
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def test_ctrl_c_stops_every_rank():
    marker = f"gcrun_ctrl_c_{os.getpid()}"
    proc = subprocess.Popen([GCRUN, "-np", "2", PY, "-c", f"import time; time.sleep(600)  # {marker}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while len(_marked(marker)) < 3 and time.time() < deadline:  # gcrun/mpirun + 2 ranks
        time.sleep(0.2)
    assert len(_marked(marker)) >= 2, "the ranks never started"
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    deadline = time.time() + 20
    while _marked(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert _marked(marker) == [], "rank processes left behind"
    assert code == 128 + signal.SIGINT


def test_digits_example_end_to_end_with_a_timeline(tmp_path):
    timeline = tmp_path / "timeline.json"
    r = run_gcrun(["-np", "2", "--compression", "maxmin", "--bits", "4", "--timeline-filename", str(timeline),
                   PY, os.path.join(ROOT, "examples", "torch_digits.py"), "--epochs", "1", "--max-steps", "6",
                   "--log-dir", str(tmp_path / "logs")], timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "final test accuracy: top-1" in r.stdout
    assert "compressed gradients (gradcomp runtime" in r.stdout and "x less" in r.stdout
    assert "final test accuracy" in (tmp_path / "logs" / "digits_train.log").read_text()
    events = json.loads(timeline.read_text())
    assert any(e.get("name") == "COMPRESS" for e in events)

    # The timeline tool on that trace.
    png = tmp_path / "timeline.png"
    t = subprocess.run([PY, "-m", "gradcomp.timeline", str(timeline), "--png", str(png)], capture_output=True,
                       text=True, timeout=120)
    assert t.returncode == 0, t.stderr
    for section in ("Time per phase", "Per tensor", "Slowest negotiations"):
        assert section in t.stdout
    assert "| COMPRESS |" in t.stdout and "maxmin(bits=4" in t.stdout
    assert "allreduce.fc1.weight" in t.stdout
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_tool_on_a_handmade_trace(tmp_path):
    events = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "w"}},
        {"name": "NEGOTIATE", "ph": "B", "ts": 0, "pid": 0, "tid": 1},
        {"name": "rank 0 ready", "ph": "i", "ts": 1, "pid": 0, "tid": 1, "s": "t"},
        {"name": "rank 2 ready", "ph": "i", "ts": 3000, "pid": 0, "tid": 1, "s": "t"},
        {"name": "rank 1 ready", "ph": "i", "ts": 500, "pid": 0, "tid": 1, "s": "t"},
        {"name": "NEGOTIATE", "ph": "E", "ts": 3010, "pid": 0, "tid": 1},
        {"name": "ALLREDUCE", "ph": "B", "ts": 3020, "pid": 0, "tid": 1},
        {"name": "COMPRESS", "ph": "B", "ts": 3030, "pid": 0, "tid": 1},
        {"name": "COMPRESS", "ph": "E", "ts": 3530, "pid": 0, "tid": 1},
        {"name": "ALLREDUCE", "ph": "E", "ts": 5020, "pid": 0, "tid": 1,
         "args": {"bytes": 4000, "wire_bytes": 500, "ratio": 8, "codec": "maxmin(bits=4, bucket=512)"}},
    ]
    path = tmp_path / "t.json"
    # A trace cut off mid-write (no closing bracket) is read as far as it goes.
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    from gradcomp import timeline
    trace = timeline.load(str(path))
    assert timeline.negotiations(trace) == [("w", 3010, 2, 2999)]
    phases = {name: (n, us) for name, n, us in timeline.phase_table(trace)}
    assert phases == {"NEGOTIATE": (1, 3010), "ALLREDUCE": (1, 2000), "COMPRESS": (1, 500)}
    assert timeline.tensor_table(trace) == [("w", 1, 5010, 4000, 500, "maxmin(bits=4, bucket=512)")]
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert timeline.main([str(empty)]) == 1
    assert timeline.main([str(tmp_path / "missing.json")]) == 2


def test_settings_module_prints_the_registry_as_the_settings_reference_does():
    out = subprocess.run([PY, "-m", "gradcomp.settings"], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(ROOT, "docs", "settings.md")) as f:
        readme = f.read()
    table = readme[readme.index("<!-- settings:begin -->\n") + 24:readme.index("<!-- settings:end -->")]
    assert out == table
    assert "| `GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS` |" in out


def test_negotiation_goes_over_tcp_and_falls_back_to_mpi_when_the_ranks_cannot_connect():
    # The controller's own TCP connections (GRADCOMP_CONTROLLER=auto): every rank says what it
    # negotiates over at init (log level info), and the sums are right either way.
    code = ("import numpy as np, gradcomp.numpy as g; g.init(); "
            "x = g.allreduce(np.full(1000, g.rank() + 1.0, dtype=np.float32), name='x', op=g.Sum); "
            "assert (x == 6.0).all(), x[:4]; print('sum ok', g.rank(), flush=True); g.shutdown()")

    def job(*env):
        return run_gcrun(["-np", "3", "--log-level", "info", PY, "-c", code],
                         env=dict(os.environ, **dict(kv.split("=", 1) for kv in env)))

    r = job()
    out = r.stdout + r.stderr
    assert r.returncode == 0 and out.count("sum ok") == 3, out[-2000:]
    assert out.count("negotiating over tcp") == 3, out[-2000:]
    r = job("GRADCOMP_CONTROLLER=gloo")  # Horovod's name for it
    assert r.returncode == 0 and (r.stdout + r.stderr).count("negotiating over tcp") == 3, r.stderr[-2000:]
    # No address to connect to: every rank says why (one reason, the ranks that gave it), and
    # negotiates over MPI.
    r = job("GRADCOMP_CONTROLLER_IFACE=nosuch0")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and out.count("sum ok") == 3, out[-2000:]
    assert out.count("GRADCOMP_CONTROLLER=auto: negotiating over MPI, since cannot connect the ranks over TCP: ranks "
                     "0-2: no IPv4 address on network interface 'nosuch0' (GRADCOMP_CONTROLLER_IFACE); (") == 3, \
        out[-2000:]
    assert out.count("negotiating over mpi") == 3, out[-2000:]
    # Asked for tcp explicitly: an error on every rank instead.
    r = job("GRADCOMP_CONTROLLER=tcp", "GRADCOMP_CONTROLLER_IFACE=nosuch0")
    out = r.stdout + r.stderr
    # (Python 3.13's tracebacks quote the -c line, print included: the ranks' output is stdout.)
    assert r.returncode != 0 and "sum ok" not in r.stdout, out[-2000:]
    assert out.count("GRADCOMP_CONTROLLER=tcp: cannot connect the ranks over TCP:") >= 3, out[-3000:]


def test_data_between_nodes_goes_over_tcp_by_default():
    # Three nodes of one rank (GRADCOMP_LOCAL_SIZE=1): under GRADCOMP_CROSS_COMMUNICATOR=auto the
    # world's data travels on gradcomp's TCP connections (every rank says so), the
    # scatter-reduce-allgather of a 4 MB tensor and a 4-bit compressed one included; mpi keeps it
    # on MPI; tcp asks for it even when the negotiation stays on MPI.
    code = ("import numpy as np, gradcomp.numpy as g; g.init(); r = g.rank(); "
            "x = g.allreduce(np.arange(1 << 20, dtype=np.float32) * (r + 1), name='big', op=g.Sum); "
            "assert (x == np.arange(1 << 20, dtype=np.float32) * 6).all(), x[:4]; "
            "y = g.allreduce(np.full(1000, r + 1.0, dtype=np.float32), name='small', op=g.Average); "
            "assert (y == 2.0).all(), y[:4]; "
            "w = np.sin(np.arange(300000, dtype=np.float32)).reshape(600, 500); "
            "z = g.allreduce(w + r, name='q', op=g.Average, compression={'codec': 'maxmin', 'bits': 4}); "
            "err = np.linalg.norm(z - (w + 1)) / np.linalg.norm(w + 1); assert 0 < err < 0.1, err; "
            "assert g.stats()['compressed_bytes_in'] > 0, g.stats(); "
            "print('sums ok', r, flush=True); g.shutdown()")

    def job(*env):
        return run_gcrun(["-np", "3", "--log-level", "info", PY, "-c", code],
                         env=dict(os.environ, GRADCOMP_LOCAL_SIZE="1", **dict(kv.split("=", 1) for kv in env)))

    for env, says in ((("GRADCOMP_CONTROLLER=auto",), "negotiating over tcp, between nodes over tcp"),
                      (("GRADCOMP_CROSS_COMMUNICATOR=mpi",), "negotiating over tcp, between nodes over mpi"),
                      (("GRADCOMP_CONTROLLER=mpi",), "negotiating over mpi, between nodes over mpi"),
                      (("GRADCOMP_CONTROLLER=mpi", "GRADCOMP_CROSS_COMMUNICATOR=tcp"),
                       "negotiating over mpi, between nodes over tcp"),
                      # No address to connect to under auto: MPI for both, with every rank's reason.
                      (("GRADCOMP_CONTROLLER_IFACE=nosuch0",), "negotiating over mpi, between nodes over mpi")):
        r = job(*env)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and out.count("sums ok") == 3, (env, out[-3000:])
        assert out.count(says) == 3, (env, out[-3000:])
    # Asked for tcp and the connections cannot be made: every rank fails, naming the setting.
    r = job("GRADCOMP_CROSS_COMMUNICATOR=tcp", "GRADCOMP_CONTROLLER_IFACE=nosuch0")
    out = r.stdout + r.stderr
    # (Python 3.13's tracebacks quote the -c line, print included: the ranks' output is stdout.)
    assert r.returncode != 0 and "sums ok" not in r.stdout, out[-2000:]
    assert out.count("GRADCOMP_CROSS_COMMUNICATOR=tcp: cannot connect the ranks over TCP:") >= 3, out[-3000:]
