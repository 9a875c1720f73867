"""Elastic training (gcrun --elastic, gradcomp.torch.elastic): the launcher's decisions on their
own, then whole jobs of examples/torch_elastic_digits.py: a host added by the discovery script
joins at the next commit; on an emulated cluster (root, network namespaces) a SIGKILLed rank's
host is left out and the job goes on from the last commit on the other two, reaching the
accuracy of an undisturbed run; a node whose link is cut and that discovery drops is left
behind; under torchrun (no MPI), a killed rank's restart resumes from the last commit. Run by ctest
with plain pytest (gcrun starts mpirun itself)."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest

from paths import GCRUN, PY, ROOT

EXAMPLE = os.path.join(ROOT, "examples", "torch_elastic_digits.py")
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
sys.path.insert(0, os.path.join(ROOT, "launcher"))
import elastic  # noqa: E402
import gcrun  # noqa: E402


# -- the launcher on its own ------------------------------------------------------------------


def make(argv):
    opts, command = gcrun.parse_args(argv)
    return elastic.Elastic(opts, command, gcrun.build_command, gcrun.LaunchError)


def test_discovery_output_is_parsed_and_bad_lines_are_named():
    assert elastic.parse_discovered("a:2\n\n# comment\nb\na:1\n", "s") == {"a": 3, "b": 1}
    with pytest.raises(ValueError, match=r"s line 2: bad slots in 'b:x'"):
        elastic.parse_discovered("a:2\nb:x\n", "s")
    with pytest.raises(ValueError, match="bad host 'c:0'"):
        elastic.parse_discovered("c:0", "s")


@pytest.mark.parametrize("argv, message", [
    (["--min-np", "2", "-np", "2", "x"], "--min-np needs --elastic"),
    (["--elastic", "-np", "2", "x"], "--elastic needs --host-discovery-script or a host list"),
    (["--elastic", "--min-np", "3", "--max-np", "2", "-H", "a:3", "x"], "--max-np 2 is below --min-np 3"),
    (["--elastic", "--host-discovery-script", "s", "-H", "a:2", "-np", "2", "x"], "not both"),
    (["--elastic", "--blacklist-after", "0", "-H", "a:2", "-np", "2", "x"], "--blacklist-after must be at least 1"),
])
def test_bad_elastic_invocations_are_named(argv, message):
    result = subprocess.run([GCRUN] + argv, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_failed_host_cools_down_then_is_blacklisted_and_min_np_wins():
    e = make(["--elastic", "--min-np", "2", "--max-np", "3", "-H", "a:1,b:1,c:1", "--failure-cooldown", "30", "x"])
    hosts = {"a": 1, "b": 1, "c": 1}
    assert e.plan(e.usable(hosts, 0)) == hosts
    e.cooling["c"] = 30
    assert e.usable(hosts, 10) == {"a": 1, "b": 1}      # c sits out its cooldown
    assert e.usable(hosts, 31) == hosts                 # and comes back after it
    e.cooling["b"] = 30
    assert e.usable(hosts, 10) == hosts                 # alone, a is below --min-np: use them all
    e.blacklist.add("c")
    assert e.usable(hosts, 10) == {"a": 1, "b": 1}      # blacklisted is never used
    # The rank mpirun names, mapped to the host it ran on (ranks fill hosts in order).
    used = {"a": 2, "b": 1}
    assert e.blame(["mpirun noticed that process rank 2 with PID 7 on node zz exited on signal 9 (Killed).\n"],
                   used) == "b"
    assert e.blame(["  Process name: [[4011,1],1]\n  Exit code: 1\n"], used) == "a"
    assert e.blame(["nothing useful\n"], used) is None
    # Over gradcomp's TCP connections a survivor exits at once naming the rank it lost, and
    # mpirun may report the survivor's status first: the lost rank is to blame, not the survivor.
    lost = ["gradcomp._core.GradcompError: tcp communicator: rank 0 lost its connection to rank 2 while receiving a "
            "message (rank 2 exited or failed without saying why) [compressed allreduce of tensor 'w3']\n",
            "  Process name: [[4011,1],0]\n", "  Exit code: 1\n"]
    assert e.blame(lost, used) == "b"
    # A survivor's eager send to the killed rank failed and Open MPI aborted it first (CI, session
    # 21): the disconnect report names the dead rank's host (an address or a name), and a
    # survivor's non-zero status printed after it must not be blamed.
    disconnect = ["An MPI communication peer process has unexpectedly disconnected.  This\n",
                  "usually indicates a failure in the peer process (e.g., a crash or\n",
                  "  Local host: gf97dc53-n1\n", "  Local PID:  3826\n", "  Peer host:  {}\n",
                  "  Process name: [[25125,1],2]\n", "  Exit code: 255\n"]
    nodes = {"10.199.0.11": 1, "10.199.0.12": 1, "10.199.0.13": 1}
    assert e.blame([line.format("10.199.0.12") for line in disconnect], nodes) == "10.199.0.12"
    assert e.blame([line.format("127.0.0.1") for line in disconnect], {"a.invalid": 1, "localhost": 2}) == "localhost"
    assert e.blame([line.format("10.199.0.99") for line in disconnect], nodes) is None
    # A link gone silent: the ranks on either side name each other (forwarded reasons repeat a
    # claim), and the rank the most ranks cannot reach is to blame; Open MPI 5 wraps its report.
    silent = ["[gradcomp rank 2] [error] tcp communicator: rank 2 cannot reach rank 0 while sending 7 bytes: ...\n",
              "[gradcomp rank 0] [error] tcp communicator: rank 0 cannot reach rank 2 while sending 7 bytes: ...\n",
              "[gradcomp rank 1] [error] tcp communicator: rank 0 cannot reach rank 2 while sending 7 bytes: ...\n",
              "[gradcomp rank 1] [error] tcp communicator: rank 1 cannot reach rank 2 while receiving a message\n",
              "  Process name: [[4011,1],0]\n"]
    assert e.blame(silent, used) == "b"
    # A rank exiting on that error closes its connections: its peers' reports of losing it come
    # after the claims, and do not outweigh them.
    assert e.blame(silent[:1] + [lost[0].replace("rank 0 lost", "rank 1 lost").replace("to rank 2", "to rank 0")]
                   + silent[1:], used) == "b"
    assert e.blame(["prterun noticed that process rank 0 with PID 7 on node zz exited on\n", "signal 9 (Killed).\n"],
                   used) == "a"


def test_the_reset_limit_ends_a_job_that_keeps_failing():
    result = subprocess.run([GCRUN, "--elastic", "-np", "2", "-H", "localhost:2", "--reset-limit", "1",
                             "--failure-cooldown", "0", "--blacklist-after", "5", "/bin/sh", "-c", "exit 3"],
                            capture_output=True, text=True, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "launch 0: 2 ranks on localhost:2" in out and "launch 1: 2 ranks on localhost:2" in out, out
    # Every rank failed before starting MPI: mpirun names the first (then localhost is blamed)
    # or, in some runs, nobody; either way each failure is reported and the reset limit ends it.
    said = (out.count("the job failed (status 3) and mpirun did not say which rank; no host is blamed")
            + len(re.findall(r"a rank on localhost failed \(status 3\), failure \d of that host", out)))
    assert said == 2, out
    assert "--reset-limit 1 reached: giving up" in out and "launch 2" not in out, out


def test_a_blacklisted_host_leaves_too_few_slots_and_gcrun_says_so():
    # Rank 1 raises in the training function; rank 0 then fails in a collective (not its fault).
    script = ("import torch\nimport gradcomp.torch as hvd\nhvd.init()\n"
              "state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)\n"
              "@hvd.elastic.run\ndef train(state):\n"
              "    if hvd.rank() == 1:\n        raise ValueError('bad batch')\n"
              "    hvd.allreduce(torch.zeros(1), name='never')\n"
              "train(state)\n")
    result = subprocess.run([GCRUN, "--elastic", "-np", "2", "-H", "localhost:2", "--blacklist-after", "1",
                             "--elastic-timeout", "1", PY, "-c", script],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS="5"))
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "gradcomp elastic: rank 1 failed: ValueError: bad batch" in out, out
    assert "a rank on localhost failed (status 1), failure 1 of that host: blacklisted for the rest of the job " \
           "(--blacklist-after 1)" in out, out
    assert "gcrun: error: --elastic-timeout 1 s: only 0 slots available ((none); blacklisted: ['localhost']), " \
           "--min-np is 2" in out, out


# -- whole jobs --------------------------------------------------------------------------------


class Job:
    """gcrun (or torchrun) running in the background; its output collected line by line."""

    def __init__(self, argv, prefix=(), env=None, launcher=(PY, GCRUN)):
        self.lines = []
        self.proc = subprocess.Popen(list(prefix) + list(launcher) + argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.output):
                return
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the job's output:\n{self.output[-6000:]}")

    def finish(self, timeout=300):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            raise AssertionError(f"gcrun still running after {timeout} s:\n{self.output[-6000:]}")
        self.reader.join(timeout=10)
        return self.proc.returncode

    def result(self):
        found = re.findall(r"^RESULT (.*)$", self.output, re.M)
        assert len(found) == 1, self.output[-6000:]
        return json.loads(found[0])


EPOCHS = 14


@pytest.fixture(scope="session")
def undisturbed():
    """The same training on 3 ranks without any fault (once per session)."""
    job = Job(["--elastic", "-np", "3", "-H", "localhost:3", PY, EXAMPLE, "--epochs", str(EPOCHS)])
    assert job.finish() == 0, job.output[-6000:]
    # The variables gcrun --elastic sets for the adapters are gradcomp's own, not typos.
    assert "is not a gradcomp setting" not in job.output, job.output[-6000:]
    return job.result()


def assert_same_band(result, reference):
    assert result["epochs"] == EPOCHS, result
    assert result["accuracy"] >= 0.9 and abs(result["accuracy"] - reference["accuracy"]) <= 0.03, (result, reference)


def test_a_host_added_by_discovery_joins_at_the_next_commit(tmp_path, undisturbed):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    job = Job(["--elastic", "--min-np", "2", "--max-np", "3", "--host-discovery-script", f"cat {hosts}",
               PY, EXAMPLE, "--epochs", str(EPOCHS)])
    job.wait_for(r"epoch 2/\d+: 2 ranks")
    hosts.write_text("localhost:3\n")
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    assert "gcrun: elastic: more slots available: localhost:3; asking the ranks to stop at their next commit" in out
    assert "gcrun: elastic: the ranks stopped at a commit for the change of hosts" in out, out[-6000:]
    assert "launch 1: 3 ranks on localhost:3" in out, out[-6000:]
    restored = re.search(r"restored commit (\d+) \(made by 2 ranks\)", out)
    assert restored and int(restored.group(1)) > 0, out[-6000:]
    assert "reset: 3 ranks, learning rate 0.03" in out, out[-6000:]
    result = job.result()
    assert result["ranks"] == 3 and result["resets"] == 1, result
    assert_same_band(result, undisturbed)


def test_torchrun_restarts_every_rank_from_the_last_commit_when_one_is_killed(undisturbed):
    """torchrun --max_restarts, no MPI: the agent restarts every rank when one dies; the State API
    brings the training back from the newest commit, as gcrun --elastic's relaunch does."""
    job = Job(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", "--max_restarts=1", EXAMPLE,
               "--epochs", str(EPOCHS)], launcher=(PY,), env={"OMP_NUM_THREADS": "1"})
    job.wait_for(r"epoch 3/\d+: 3 ranks")
    time.sleep(0.2)  # into epoch 4
    pid = rank_pid(2, "RANK")
    assert pid, job.output[-6000:]
    os.kill(pid, 9)
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    restored = re.search(r"restored commit (\d+) \(made by 3 ranks\)", out)
    assert restored and int(restored.group(1)) >= 3, out[-6000:]
    result = job.result()
    assert result["ranks"] == 3 and result["resets"] == 1, result
    assert_same_band(result, undisturbed)


def test_diloco_goes_on_from_the_last_outer_sync_when_a_rank_is_killed():
    """hvd.DiLoCo with 4-bit syncs and error feedback in a TorchState: a rank killed mid-training
    ends the launch; the relaunched job restores the newest commit (error feedback's memories
    included) from the weights of its last outer sync and trains to the end."""
    job = Job(["--elastic", "-np", "3", "--min-np", "2", "-H", "localhost:3", PY, EXAMPLE, "--diloco", "10",
               "--bits", "4", "--epochs", "8"], env={"OMP_NUM_THREADS": "1"})
    job.wait_for(r"epoch 2/\d+: 3 ranks")
    pid = rank_pid(2)
    assert pid, job.output[-6000:]
    os.kill(pid, 9)
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    assert "launch 1: 3 ranks on localhost:3" in out, out[-6000:]
    restored = re.search(r"restored commit (\d+) \(made by 3 ranks\)", out)
    assert restored and int(restored.group(1)) >= 2, out[-6000:]
    result = job.result()
    assert result["resets"] == 1 and result["epochs"] == 8 and result["accuracy"] >= 0.9, result


# -- on an emulated cluster (one node per rank) ------------------------------------------------


@pytest.fixture
def cluster():
    tag = "ge" + uuid.uuid4().hex[:6]
    up = subprocess.run(["bash", CLUSTER, "up", tag, "3", "1gbit"], capture_output=True, text=True)
    assert up.returncode == 0, f"the emulated cluster did not come up (needs root, ip, tc):\n{up.stderr}"
    words = up.stdout.split("\n")[:-1]
    prefix = words[:words.index("mpirun")]                        # ip netns exec TAG-head
    mca = words[words.index("--mca"):words.index("-x")]            # the launch agent, TCP on eth0
    nodes = words[-1].split(",")                                  # -H's value: one address per node
    yield tag, prefix, " ".join(mca), nodes
    subprocess.run(["bash", CLUSTER, "down", tag], check=True)


def rank_pid(rank, variable="OMPI_COMM_WORLD_RANK"):
    """The pid of the example's process of that rank (the ranks share this machine's pid space),
    told by the launcher's `variable` (mpirun's, or torchrun's RANK)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"torch_elastic_digits" in cmd and b"python" in cmd and f"{variable}={rank}".encode() in env:
            return int(pid)
    return None


def test_a_killed_rank_leaves_its_host_out_and_training_goes_on(cluster, undisturbed):
    tag, prefix, mca, nodes = cluster
    job = Job(["--elastic", "-np", "3", "--min-np", "2", "-H", ",".join(nodes), "--failure-cooldown", "600",
               "--mpi-args", mca, PY, EXAMPLE, "--epochs", str(EPOCHS)], prefix=prefix)
    job.wait_for(r"epoch 3/\d+: 3 ranks")
    time.sleep(0.2)  # into epoch 4
    pid = rank_pid(2)
    assert pid, job.output[-6000:]
    os.kill(pid, 9)
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    assert re.search(rf"a rank on {re.escape(nodes[2])} failed \(status \d+\), failure 1 of that host: "
                     r"left out for --failure-cooldown 600 s", out), out[-6000:]
    assert f"launch 1: 2 ranks on {nodes[0]}:1,{nodes[1]}:1" in out, out[-6000:]
    restored = re.search(r"restored commit (\d+) \(made by 3 ranks\)", out)
    assert restored and int(restored.group(1)) >= 3, out[-6000:]
    result = job.result()
    assert result["ranks"] == 2 and result["resets"] == 1, result
    assert_same_band(result, undisturbed)


def test_a_node_whose_link_is_cut_is_dropped(cluster, tmp_path):
    tag, prefix, mca, nodes = cluster
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{n}:1\n" for n in nodes))
    job = Job(["--elastic", "--min-np", "2", "--max-np", "3", "--host-discovery-script", f"cat {hosts}",
               "--elastic-timeout", "15", "--mpi-args", mca, PY, EXAMPLE, "--epochs", str(EPOCHS)],
              prefix=prefix, env={"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS": "8"})
    try:
        job.wait_for(r"epoch 3/\d+: 3 ranks")
        subprocess.run(["bash", CLUSTER, "cut", tag, "3"], check=True)
        hosts.write_text("".join(f"{n}:1\n" for n in nodes[:2]))  # what a cluster manager would report
        job.wait_for(r"launch 1: 2 ranks", timeout=120)
    finally:
        subprocess.run(["bash", CLUSTER, "heal", tag, "3"], check=True)
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    assert f"hosts gone or shrunk: ['{nodes[2]}']; asking the ranks to stop at their next commit" in out, out[-6000:]
    result = job.result()
    assert result["ranks"] == 2 and result["epochs"] == EPOCHS and result["accuracy"] >= 0.9, result


def test_a_node_whose_link_goes_silent_is_left_out_of_a_fixed_host_list(cluster, undisturbed):
    """No discovery: the host list is all gcrun knows. Node 3's link drops everything mid-training;
    each side says it cannot reach the other, the node that most ranks cannot reach is blamed,
    and training goes on from the last commit on the two nodes that still reach each other."""
    tag, prefix, mca, nodes = cluster
    job = Job(["--elastic", "-np", "3", "--min-np", "2", "-H", ",".join(nodes), "--failure-cooldown", "600",
               "--elastic-timeout", "20", "--mpi-args", mca, PY, EXAMPLE, "--epochs", str(EPOCHS)],
              prefix=prefix, env={"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS": "8"})
    try:
        job.wait_for(r"epoch 3/\d+: 3 ranks")
        subprocess.run(["bash", CLUSTER, "cut", tag, "3"], check=True)
        job.wait_for(r"launch 1: 2 ranks", timeout=120)
    finally:
        subprocess.run(["bash", CLUSTER, "heal", tag, "3"], check=True)
    assert job.finish() == 0, job.output[-6000:]
    out = job.output
    assert re.search(rf"a rank on {re.escape(nodes[2])} failed .*left out for --failure-cooldown 600 s", out), \
        out[-6000:]
    assert f"launch 1: 2 ranks on {nodes[0]}:1,{nodes[1]}:1" in out, out[-6000:]
    result = job.result()
    assert result["ranks"] == 2 and result["resets"] == 1, result
    assert_same_band(result, undisturbed)
