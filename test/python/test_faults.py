"""The fault matrix of docs/errors.md, as tests: 3-rank jobs under mpirun (and on an emulated
cluster where a link is needed) in which one rank is SIGKILLed (before init completes, during
negotiation, during an allreduce, inside a DDP step), stops calling gradcomp, or has its
node's link cut during an allreduce; and the killed rank under torchrun (no MPI; envrun.py
where torchrun cannot start).

Two launch modes for a killed rank:
- plain mpirun (what gcrun runs): mpirun sees the death and ends the job at once, naming the
  rank and the signal;
- `mpirun --enable-recovery` (a launcher that lets the survivors run on): each survivor must
  end itself with status 1: at once, naming the lost rank, when it waited in a negotiation
  round over the TCP controller (GRADCOMP_CONTROLLER=auto) or anywhere when the data travels on
  TCP too (GRADCOMP_CROSS_COMMUNICATOR=tcp, nodes of one rank); else through gradcomp's watchdog,
  with a message naming what waited, within GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS (plus the
  moment the training thread needs to exit).

Each case also checks that no rank process is left and that no shared memory of the job is
left in /dev/shm or in mpirun's session directory. Run by ctest with plain pytest (it starts
mpirun itself); the cluster cases need root for network namespaces, as the emulated cluster
benchmark does.
"""
import functools
import glob
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from paths import PY, ROOT

WORKER = os.path.join(ROOT, "test", "faults", "fault_worker.py")
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
TIMEOUT = 6          # GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS in these jobs
SLACK = 6            # after the deadline: the exception reaching Python, exit (2 cores, 3 ranks)
# Each rank's output goes to LOGDIR/rank-R.log, then the status it exited with and when; the
# wrapper then ends as its rank did (killed by the same signal), so mpirun sees what happened. A
# launcher's SIGTERM (or SIGINT, SIGHUP) to the wrapper ends the rank too, not the wrapper alone.
WRAPPER = ('exec >"$0/rank-$OMPI_COMM_WORLD_RANK.log" 2>&1; "$@" & c=$!; '
           'trap \'kill -9 $c; trap - TERM INT HUP; kill -TERM $$\' TERM INT HUP; wait $c; s=$?; '
           'echo "fault-test exit $s at $(date +%s.%N)"; [ $s -gt 128 ] && kill -$((s - 128)) $$; exit $s')


@functools.lru_cache(maxsize=None)
def open_mpi_major():
    """4 on Debian 12, 5 on Debian 13 (whose launcher is PRRTE's: under --enable-recovery it still
    ends the job once a rank exits non-zero, so a survivor may be ended by it after printing its
    error, and a failed MPI peer aborts a rank with status 14 where Open MPI 4's ob1 gave 255)."""
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Open MPI\)? (\d+)\.", out)
    return int(m.group(1)) if m else 0


class Job:
    def __init__(self, tmp_path, rc, output, elapsed, mpirun_pid):
        self.rc, self.output, self.elapsed, self.mpirun_pid = rc, output, elapsed, mpirun_pid
        self.ended = time.time()
        self.logs = {}
        for path in glob.glob(str(tmp_path / "rank-*.log")):
            rank = int(re.search(r"rank-(\d+)\.log", path).group(1))
            with open(path, errors="replace") as f:
                self.logs[rank] = f.read()
        found = [re.search(r"job ([0-9a-f]+)", log) for log in self.logs.values()]
        self.jobid = next((m.group(1) for m in found if m), None)

    def event(self, rank, what):
        """When `rank` said `what` (wall clock), or None."""
        m = re.search(rf"fault-worker rank {rank} at ([0-9.]+): {re.escape(what)}", self.logs.get(rank, ""))
        return float(m.group(1)) if m else None

    def exit(self, rank):
        """(status, wall clock) of `rank`'s process as the wrapper saw it, or None (killed with it)."""
        m = re.search(r"fault-test exit (\d+) at ([0-9.]+)", self.logs.get(rank, ""))
        return (int(m.group(1)), float(m.group(2))) if m else None

    def ended_at(self, rank):
        """exit(rank), or on Open MPI 5 (None, when the job ended) for a rank the launcher ended."""
        status = self.exit(rank)
        return status if status is not None or open_mpi_major() < 5 else (None, self.ended)

    def describe(self):
        return f"mpirun exit {self.rc} after {self.elapsed:.1f} s\n{self.output[-3000:]}\n" + "\n".join(
            f"--- rank {r}\n{log[-3000:]}" for r, log in sorted(self.logs.items()))


def start(tmp_path, worker_args, prefix=MPIRUN, mpi_args=(), env=()):
    # USE_LIBUV=0 as gcrun sets it: the DDP worker's env:// store on torch builds without libuv.
    cmd = list(prefix) + list(mpi_args) + ["-np", "3", "-x", f"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS={TIMEOUT}",
                                           "-x", "USE_LIBUV=0"]
    for kv in env:
        cmd += ["-x", kv]
    cmd += ["sh", "-c", WRAPPER, str(tmp_path), PY, WORKER] + list(worker_args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True), time.time()


def finish(tmp_path, proc, started, deadline=120):
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        output += f"\n[test: mpirun still running after {deadline} s, killed]"
    return Job(tmp_path, proc.returncode, output, time.time() - started, proc.pid)


def run(tmp_path, worker_args, **kw):
    deadline = kw.pop("deadline", 120)
    proc, started = start(tmp_path, worker_args, **kw)
    return finish(tmp_path, proc, started, deadline)


def still_running(pattern, wait=10):
    """The processes whose command line matches `pattern` (pgrep -af), after waiting up to `wait`
    seconds for them to end."""
    deadline = time.time() + wait
    while True:
        left = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


def assert_clean(job, tmp_path):
    """No rank left running, no shared memory of the job left behind."""
    left = still_running(str(tmp_path))
    assert not left, f"processes of the job still running: {left}\n{job.describe()}"
    assert job.jobid, job.describe()
    shm = [f for f in os.listdir("/dev/shm") if job.jobid in f]
    assert not shm, f"shared memory left by job {job.jobid}: {shm}"
    # Open MPI 4's session directory, or Open MPI 5's (PRRTE's)
    sessions = glob.glob(f"/tmp/ompi.*/pid.{job.mpirun_pid}") + glob.glob(f"/tmp/prterun.*.{job.mpirun_pid}.*")
    assert not sessions, f"mpirun's session directory left: {sessions}"


def assert_exits_on_its_own(job, r, since, *needles):
    """Rank r exited with status 1, within the timeout of `since`, saying `needles` (on Open MPI 5
    it may instead have been ended by the launcher after saying them, as another rank exited)."""
    log = job.logs.get(r, "")
    status = job.ended_at(r)
    assert status is not None and status[0] in (1, None), f"rank {r}: {status}\n{job.describe()}"
    for needle in needles:
        assert needle in log, f"rank {r} does not say {needle!r}\n{job.describe()}"
    waited = status[1] - since
    assert waited <= TIMEOUT + SLACK, f"rank {r} exited {waited:.1f} s after the fault\n{job.describe()}"


def assert_aborted_by_open_mpi(job, r, since):
    """Rank r's eager send to a dead peer failed and Open MPI aborted it, soon: ob1's status 255 (Open
    MPI 4), or status 14 with MPI_ERRORS_ARE_FATAL's report, which names the peer host (Open MPI 5)."""
    status, log = job.exit(r), job.logs.get(r, "")
    if open_mpi_major() >= 5:
        assert status[0] == 14 and "MPI_ERRORS_ARE_FATAL" in log + job.output, f"rank {r}\n{job.describe()}"
    else:
        assert status[0] == 255 and "pml_ob1_sendreq.c" in log and "FATAL" in log, f"rank {r}\n{job.describe()}"
    assert status[1] - since <= SLACK, f"rank {r}\n{job.describe()}"


def assert_raised_in_backward(job, r):
    """The error surfaced from rank r's loss.backward() as an exception (torch's RuntimeError, or
    gradcomp's own where the submission itself failed), not a crash."""
    log = job.logs[r]
    assert "loss.backward()" in log and ("RuntimeError" in log or "GradcompError" in log), job.describe()
    assert "Segmentation" not in log, job.describe()


def assert_survivors_exit_on_their_own(job, survivors, since, *needles):
    for r in survivors:
        assert_exits_on_its_own(job, r, since, *needles)


KILL_POINTS = ["init", "negotiation", "allreduce", "ddp"]
# mpirun's (Open MPI 4) or prterun's (Open MPI 5, which wraps the line) report of the killed rank
KILLED_NAMED = r"process rank 1 with PID \d+ on node \S+ exited on\s+signal 9"


@pytest.mark.parametrize("at", KILL_POINTS)
def test_killed_rank_mpirun_ends_the_job(tmp_path, at):
    job = run(tmp_path, ["--fault", "kill", "--at", at])
    assert job.event(1, "SIGKILL"), job.describe()
    assert job.rc != 0, job.describe()
    assert re.search(KILLED_NAMED, job.output), job.describe()
    for r in (0, 2):
        assert job.event(r, "finished") is None, job.describe()
    # Well inside the watchdog's timeout: mpirun ended the job, not gradcomp.
    assert job.elapsed < 60, job.describe()
    assert_clean(job, tmp_path)


LOST = "lost its connection to rank 1"  # the TCP controller's word for a peer that vanished
START_FAILED = "starting MPI failed"  # gradcomp's word for an MPI_Init that returned an error


# GRADCOMP_CONTROLLER=..., or "tcpdata": every rank a node whose data travels on the TCP
# connections too (GRADCOMP_CROSS_COMMUNICATOR=tcp).
TCP_DATA = ["GRADCOMP_CROSS_COMMUNICATOR=tcp", "GRADCOMP_LOCAL_SIZE=1"]


@pytest.mark.parametrize("at,controller", [(at, "auto") for at in KILL_POINTS] +
                         [("negotiation", "mpi"), ("allreduce", "tcpdata"), ("ddp", "tcpdata")],
                         ids=KILL_POINTS + ["negotiation-over-mpi", "allreduce-tcpdata", "ddp-tcpdata"])
def test_killed_rank_survivors_exit_on_their_own(tmp_path, at, controller):
    job = run(tmp_path, ["--fault", "kill", "--at", at], mpi_args=["--enable-recovery"],
              env=TCP_DATA if controller == "tcpdata" else [f"GRADCOMP_CONTROLLER={controller}"])
    killed = job.event(1, "SIGKILL")
    assert killed, job.describe()
    assert job.exit(1) is None or job.exit(1)[0] == 137, job.describe()
    watchdog = (f"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS={TIMEOUT}", "a peer rank died, stopped or lost its network link")
    if controller == "tcpdata":
        # Every byte between the ranks on TCP: wherever a survivor waits, the dead rank's
        # sockets closing ends it at once.
        for r in (0, 2):
            assert_exits_on_its_own(job, r, killed, LOST)
            assert job.ended_at(r)[1] - killed <= SLACK, job.describe()
    elif at == "negotiation" and controller == "auto":
        # Over the TCP controller the dead rank's sockets close with it: the survivors' round
        # fails at once, with no watchdog.
        for r in (0, 2):
            assert_exits_on_its_own(job, r, killed, LOST, "exited or failed without saying why")
            assert job.ended_at(r)[1] - killed <= SLACK, job.describe()
    elif at in ("allreduce", "ddp") and controller == "auto":
        # Around an allreduce or inside a DDP step a survivor waits in a negotiation round (it
        # hears at once) or in a collective over MPI (its watchdog ends it).
        for r in (0, 2):
            if LOST in job.logs.get(r, ""):
                assert_exits_on_its_own(job, r, killed, LOST)
                assert job.ended_at(r)[1] - killed <= SLACK, job.describe()
            else:
                assert_exits_on_its_own(job, r, killed, "has not completed", *watchdog)
    elif at == "init":
        # A survivor waits in MPI_Init, or past it for the others (its watchdog ends it); or, on Open
        # MPI 5, MPI_Init itself fails when the address exchange completed without the dead rank's.
        # Open MPI 5's mpirun ends the job as soon as one survivor exits: the other, still inside
        # MPI_Init (Open MPI may have printed its own "MPI_INIT failed" there), can be ended before
        # its watchdog fires, which its init's later start puts a few milliseconds after the
        # first's. At least one survivor says why; the other says so too or the launcher ended it,
        # both within the watchdog's bound.
        said = []
        for r in (0, 2):
            log = job.logs.get(r, "")
            if START_FAILED in log:
                assert_exits_on_its_own(job, r, killed, f"rank {r}: {START_FAILED}", "a rank of the job died")
            elif "init (starting MPI" in log or job.ended_at(r) is None or job.ended_at(r)[0] is not None:
                assert_exits_on_its_own(job, r, killed, "init (starting MPI, then waiting for every rank to call "
                                        "init())", *watchdog)
            else:
                assert job.ended_at(r)[1] - killed <= TIMEOUT + SLACK, f"rank {r}\n{job.describe()}"
                continue
            said.append(r)
        assert said, f"no survivor said why the job ended\n{job.describe()}"
    else:
        assert_survivors_exit_on_their_own(job, (0, 2), killed, "a negotiation round", *watchdog)
    if at == "ddp":  # the error surfaces from loss.backward() as an exception, not a crash
        for r in (0, 2):
            assert_raised_in_backward(job, r)
    assert_clean(job, tmp_path)


def test_mpi_failing_to_start_is_named_on_every_rank(tmp_path):
    """MPI_Init fails on every rank (its transports restricted to "self": no rank can reach
    another). Open MPI 5 returns the error (gradcomp sets MPI-4's initial error handler to return)
    and every rank names itself and the likely causes after Open MPI's report, exiting 1; Open
    MPI 4 aborts the job in MPI_Init with its own report (which its launcher may garble on a
    loaded machine: "ORTE_ERROR_LOG: Data unpack would read past end of buffer in show_help.c").
    Either way the job ends at once, with no rank left behind."""
    job = run(tmp_path, ["--fault", "none", "--steps", "1"], mpi_args=["--mca", "btl", "self"])
    assert job.rc != 0 and job.elapsed < 30, job.describe()
    if open_mpi_major() >= 5:
        assert "MPI_INIT has failed" in job.output + "".join(job.logs.values()), job.describe()
        for r in range(3):
            status = job.ended_at(r)
            assert status[0] in (1, None), f"rank {r}\n{job.describe()}"
            assert f"rank {r}: {START_FAILED} (MPI_Init_thread: " in job.logs[r], f"rank {r}\n{job.describe()}"
    assert_clean(job, tmp_path)


def test_a_rank_killed_after_the_shutdown_round_cannot_hold_the_others_in_mpi_teardown(tmp_path):
    """The ranks agree on an error (rank 1's w3 has another op), the others' scripts catch it and
    end cleanly, and every rank agrees to shut down; rank 1 dies before its own teardown.
    MPI_Win_free and MPI_Finalize would wait for it forever under --enable-recovery: the survivors
    meet on the TCP mesh first, which names the dead rank at once, and they skip MPI's teardown.
    (A script ending on the error uncaught would not meet at all: test_an_uncaught_exception_...)"""
    job = run(tmp_path, ["--fault", "kill", "--at", "teardown", "--catch"], mpi_args=["--enable-recovery"],
              deadline=60)
    killed = job.event(1, "SIGKILL")
    assert killed, job.describe()
    for r in (0, 2):
        log = job.logs.get(r, "")
        for needle in ("caught: mismatched op for allreduce of tensor 'w3'", "at shutdown, before MPI's teardown",
                       LOST):
            assert needle in log, f"rank {r} does not say {needle!r}\n{job.describe()}"
        status = job.ended_at(r)
        assert status is not None and status[0] in (0, None), job.describe()
        assert status[1] - killed <= SLACK, job.describe()
    assert_clean(job, tmp_path)


REGROUP = os.path.join(ROOT, "test", "faults", "regroup_worker.py")
# What a rank says when it cannot join its group: gradcomp's words, or torch's store's for a
# rendezvous that failed before the backend was asked (gloo meets the same race there).
REGROUP_ERRORS = ("backend gradcomp: rank", "Connection reset by peer", "Broken pipe", "DistNetworkError",
                  "DistStoreError")


def test_creating_the_group_again_under_load_joins_one_generation_or_fails_naming_why(tmp_path):
    """3 ranks create, use and destroy the default group 20 times on one MASTER_PORT beside two busy
    loops. A rank that met rank 0's previous store used to go on into MPI and wait there forever
    (and rank 0 for it in torch's store): now every rank finishes, or the job fails with a named
    error within the group's timeout of the last generation any rank joined. (The 20 generations
    themselves take 10-15 s on an idle 2-core machine and longer beside CI's other suites: the
    bound is on the time after progress stops, not on the job's.)"""
    group_timeout = 10
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]
    try:
        cmd = MPIRUN + ["-np", "3", "-x", f"MASTER_PORT={21000 + os.getpid() % 20000}", "-x", "MASTER_ADDR=127.0.0.1",
                        "-x", "USE_LIBUV=0", PY, REGROUP, "20", str(group_timeout)]
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        job = finish(tmp_path, proc, started, deadline=group_timeout + 90)
    finally:
        for p in busy:
            p.kill()
        subprocess.run(["pkill", "-9", "-f", REGROUP])  # a hung job's ranks (mpirun alone was killed)
    output = job.output
    joined = [float(t) for t in re.findall(r"^regroup rank \d at ([\d.]+): generation \d+$", output, re.M)]
    # A rank that failed in torch's rendezvous (its store connection reset: before the backend is
    # asked) leaves at once on its uncaught exception, MPI unfinalized (it used to wait at exit for
    # the others' teardown, while rank 0 waited for it in torch's store), and mpirun ends the job;
    # at worst a rank waits in torch's store for the group's timeout first.
    after = started + job.elapsed - max(joined, default=started)
    assert after < group_timeout + 10, f"ended {after:.1f} s after the last generation joined\n{output[-6000:]}"
    assert "Segmentation" not in output, output[-6000:]
    if job.rc == 0:
        assert output.count("finished 20 generations") == 3, output[-6000:]
    else:
        assert any(e in output for e in REGROUP_ERRORS), output[-6000:]


ENVRUN = os.path.join(ROOT, "test", "python", "envrun.py")


@functools.lru_cache(maxsize=None)
def torchrun_starts():
    """Whether this torch's torchrun can start: its rendezvous store needs libuv, which Debian 13's
    torch 2.6 is built without. There the ranks are started by envrun.py instead: the env://
    variables alone, as a Kubernetes PyTorchJob or srun gives them."""
    code = "import torch.distributed as d; d.TCPStore('127.0.0.1', 0, 1, True, use_libuv=True)"
    return subprocess.run([PY, "-c", code], capture_output=True).returncode == 0


def run_env_launched(tmp_path, worker_args, grace, bare=False):
    """The 3 ranks started by torchrun, or envrun.py where torchrun cannot start or `bare` asks
    for the env:// variables alone (no MPI: a world connected through a store), each wrapped as
    under mpirun. The launcher ends the others `grace` seconds after a rank failed (torchrun's
    monitor interval): a long one leaves the survivors to end on their own."""
    wrapper = WRAPPER.replace("$OMPI_COMM_WORLD_RANK", "$RANK")
    if torchrun_starts() and not bare:
        launcher = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
                    f"--monitor_interval={grace}", "--no_python"]
    else:
        launcher = [PY, ENVRUN, "-n", "3", "--grace", str(grace)]
    cmd = launcher + ["sh", "-c", wrapper, str(tmp_path), PY, WORKER]
    env = dict(os.environ, GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS=str(TIMEOUT), OMP_NUM_THREADS="1", USE_LIBUV="0")
    started = time.time()
    proc = subprocess.Popen(cmd + list(worker_args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    # Once every rank has exited (the wrappers log it), the launcher's long wait says nothing more.
    while time.time() < started + 60 + grace and proc.poll() is None:
        logs = glob.glob(str(tmp_path / "rank-*.log"))
        if len(logs) == 3 and all("fault-test exit" in Path(path).read_text(errors="replace") for path in logs):
            os.killpg(proc.pid, signal.SIGTERM)
            break
        time.sleep(0.2)
    return finish(tmp_path, proc, started)


@pytest.mark.parametrize("at", ["negotiation", "ddp"])
def test_killed_rank_without_mpi_survivors_fail_at_once_naming_it(tmp_path, at):
    """Without MPI every byte between the ranks is on gradcomp's TCP connections: the dead
    rank's sockets close with it, and wherever a survivor waits it fails at once, naming it."""
    job = run_env_launched(tmp_path, ["--fault", "kill", "--at", at], grace=60)
    killed = job.event(1, "SIGKILL")
    assert killed, job.describe()
    for r in (0, 2):
        assert_exits_on_its_own(job, r, killed, LOST)
        assert job.ended_at(r)[1] - killed <= SLACK, job.describe()
    if at == "ddp":  # the error surfaces from loss.backward() as an exception, not a crash
        for r in (0, 2):
            assert_raised_in_backward(job, r)
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout, job.describe()


def test_a_rank_killed_before_init_without_mpi_ends_the_job_in_seconds(tmp_path):
    """A rank that dies before it joined the world: its peers wait for it in the store, and
    the launcher (torchrun's agent, or envrun), which saw it die, ends the job and names it."""
    job = run_env_launched(tmp_path, ["--fault", "kill", "--at", "init"], grace=1)
    assert job.event(1, "SIGKILL"), job.describe()
    assert job.rc != 0 and job.elapsed < 30, job.describe()
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)|envrun: rank 1 exited", job.output), \
        job.describe()
    for r in (0, 2):
        assert job.event(r, "finished") is None, job.describe()


@pytest.mark.parametrize("launcher", ["mpirun", "env"] + (["torchrun"] if torchrun_starts() else []))
@pytest.mark.parametrize("at", ["before_init", "first_step", "mid", "outside", "exit"])
def test_an_uncaught_exception_anywhere_ends_the_job_in_seconds(tmp_path, at, launcher):
    """Rank 1's script raises: before gradcomp's init, before its first allreduce, mid-training,
    while the others spend 60 s outside gradcomp (an evaluation), or after its last step while the
    others end cleanly; under mpirun, torchrun, and the env:// variables alone (envrun.py).
    Its process leaves at once without meeting the others before MPI's teardown (they may never
    come: a rank outside gradcomp, or waiting in a rendezvous for this one, used to hold it there
    until they returned), exits 1 with MPI unfinalized, and the launcher ends the job naming it:
    within seconds of the raise, the exception's text printed, no abort, nothing left running."""
    worker = ["--fault", "raise", "--at", at, "--steps", "8" if at == "exit" else "100000"]
    job = (run(tmp_path, worker, deadline=90) if launcher == "mpirun" else
           run_env_launched(tmp_path, worker, grace=1, bare=launcher == "env"))
    raised = job.event(1, "raises")
    assert raised, job.describe()
    assert job.rc != 0, job.describe()
    assert job.ended - raised <= TIMEOUT + SLACK, f"ended {job.ended - raised:.1f} s after the raise\n{job.describe()}"
    assert "RuntimeError: the user's script failed on rank 1" in job.logs[1], job.describe()
    # Every survivor names rank 1: in its error, or (ended by the launcher while it was outside
    # gradcomp) through the launcher's report. After training, without MPI, the survivors' scripts
    # just end: nothing of theirs waits for rank 1.
    for r in (0, 2):
        if at == "exit":
            assert job.event(r, "finished"), f"rank {r}\n{job.describe()}"
        if job.exit(r) is not None and at not in ("outside", "before_init") and (at != "exit" or launcher == "mpirun"):
            assert re.search(r"by rank 1 |to rank 1 ", job.logs[r]), f"rank {r}\n{job.describe()}"
    if at in ("outside", "before_init"):  # the others wait outside gradcomp, or in its init
        # Open MPI 4's report names [[job,1],1], Open MPI 5's [prterun-HOST-PID@1,1]
        assert re.search(r"\[\[\d+,\d+\],1\]|\[prterun-[^\]]*@\d+,1\]|rank\s*:\s*1 \(local_rank|envrun: rank 1 exited",
                         job.output), job.describe()
    for r in range(3):
        assert "terminate called" not in job.logs.get(r, "") and "Aborted" not in job.logs.get(r, ""), job.describe()
        assert job.event(r, "finished") is None or at == "exit", job.describe()
    if launcher == "mpirun":
        assert_clean(job, tmp_path)
    assert_no_worker_left(job)


def assert_no_worker_left(job):
    """No rank's process left running (a launcher that ended a rank's wrapper alone left the rank)."""
    left = still_running(WORKER)
    assert not left, f"ranks left running:\n{left}\n{job.describe()}"


def test_a_rank_that_never_shuts_down_holds_the_others_teardown_for_the_timeout_at_most(tmp_path):
    """Rank 1 stays 60 s after its last step (alive, outside gradcomp); the others end their
    scripts and meet before MPI's teardown, which waits for every rank: they wait for it at most
    the collective timeout, then exit 1 naming that meeting, and mpirun ends the job."""
    job = run(tmp_path, ["--fault", "linger", "--steps", "6"], deadline=90)
    for r in (0, 2):
        done = job.event(r, "finished")
        assert done, job.describe()
        assert_exits_on_its_own(job, r, done, "the ranks' meeting at shutdown, before MPI's teardown")
    assert job.ended - job.event(1, "lingers 60 s") < TIMEOUT + SLACK + 5, job.describe()
    assert_clean(job, tmp_path)


@pytest.mark.parametrize("at", ["negotiation", "ddp"])
def test_stopped_rank_fails_every_rank_after_the_shutdown_time(tmp_path, at):
    shutdown = 4
    job = run(tmp_path, ["--fault", "stop", "--at", at],
              env=[f"GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS={shutdown}", "GRADCOMP_STALL_CHECK_TIME_SECONDS=2"])
    stopped = job.event(1, "stops calling gradcomp")
    assert stopped, job.describe()
    for r in (0, 2):
        status = job.ended_at(r)  # Open MPI 5 may end one as soon as the other exited
        assert status is not None and status[0] in (1, None), job.describe()
        # Their scripts end on the error they do not catch: they leave at once, MPI unfinalized,
        # without waiting at exit for the stopped rank (which would never come).
        assert status[1] - stopped <= shutdown + SLACK, job.describe()
        log = job.logs[r]
        assert f"gradcomp stopped after GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS={shutdown}" in log, job.describe()
        assert "missing ranks [1]" in log, job.describe()
        assert "at exit," not in log and "Segmentation" not in log, job.describe()
    # The stopped rank never exits by itself: mpirun ends it once the others failed.
    assert job.rc != 0 and job.exit(1) is None, job.describe()
    assert job.elapsed < 60, job.describe()
    assert_clean(job, tmp_path)


# -- a script that catches gradcomp's error and exits 0 -------------------------------------


@pytest.mark.parametrize("fault", ["stall", "shape"])
def test_a_caught_disagreement_ends_the_job_with_the_scripts_exit_code(tmp_path, fault):
    # Rank 1 submits another tensor name (every rank stops after the shutdown time) or another
    # shape (the tensor fails on every rank, training goes on) at step 3; each script catches it.
    job = run(tmp_path, ["--fault", fault, "--catch", "--steps", "6"],
              env=["GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS=4", "GRADCOMP_STALL_CHECK_TIME_SECONDS=2"])
    for r in range(3):
        log = job.logs.get(r, "")
        if fault == "stall":
            assert "caught: gradcomp stopped after GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS=4" in log, job.describe()
            assert "missing ranks [" in log and "exits 0" in log, job.describe()
            assert "the job ends with the scripts' own exit codes" in log, job.describe()
        else:
            assert "caught: mismatched shape for allreduce of tensor 'w3'" in log, job.describe()
            assert job.event(r, "finished"), job.describe()
        assert job.exit(r) is not None and job.exit(r)[0] == 0, job.describe()
        assert "at exit, MPI_" not in log, job.describe()
    assert job.rc == 0, job.describe()
    assert "exited improperly" not in job.output and "without calling" not in job.output, job.describe()
    assert_clean(job, tmp_path)


def test_a_caught_peer_death_says_how_the_job_ends(tmp_path):
    # Under --enable-recovery (plain mpirun ends the job at the death itself) the survivors hear
    # of it at once (the TCP controller's sockets), catch the error and exit 0; they cannot
    # finalize MPI, and the error says what that means for the job.
    job = run(tmp_path, ["--fault", "kill", "--at", "negotiation", "--catch"], mpi_args=["--enable-recovery"])
    assert job.event(1, "SIGKILL"), job.describe()
    for r in (0, 2):
        log = job.logs.get(r, "")
        assert "caught: " in log and LOST in log, job.describe()
        assert ("MPI is left unfinalized at this process's exit (a finalize could wait forever for a lost rank), so "
                "mpirun ends the job with a non-zero exit status whatever this script returns") in log, job.describe()
        assert job.exit(r) is not None and job.exit(r)[0] == 0, job.describe()
        assert "at exit, MPI_" not in log, job.describe()
    assert_clean(job, tmp_path)


# -- on an emulated cluster (one node per rank, 100 Mbit/s links) ------------------------------


@pytest.fixture
def cluster():
    tag = "gf" + uuid.uuid4().hex[:6]
    up = subprocess.run(["bash", CLUSTER, "up", tag, "3", "100mbit"], capture_output=True, text=True)
    assert up.returncode == 0, f"the emulated cluster did not come up (needs root, ip, tc):\n{up.stderr}"
    yield tag, up.stdout.split("\n")[:-1]
    subprocess.run(["bash", CLUSTER, "down", tag], check=True)


# 16M values, max-min 4 bits: striped SRA (4 stripes) of 8 MB per rank across 100 Mbit/s links,
# about a second per allreduce, so a kill 0.5 s after the submit lands in the middle of it.
SRA = ["--elements", str(16 << 20)]
SRA_ENV = ["GRADCOMP_COMPRESSION=maxmin", "GRADCOMP_BITS=4", "GRADCOMP_MIN_SIZE=1024"]


# The data between nodes over gradcomp's TCP connections (the default) or over MPI
# (GRADCOMP_CROSS_COMMUNICATOR=mpi), there with Open MPI's TCP eager limit at gradcomp's 2 MB (MPI
# init; a ~1 MB stripe goes eagerly) or at Open MPI's own 64 KB (`rendezvous`: the user's setting
# wins; stripes wait for an acknowledgement).
@pytest.mark.parametrize("recovery,data", [(None, "tcp"), ("recovery", "tcp"), ("eager", "mpi"), ("rendezvous", "mpi")],
                         ids=["mpirun", "enable-recovery", "enable-recovery-mpi", "enable-recovery-mpi-rendezvous"])
def test_kill_in_the_middle_of_a_striped_sra_across_nodes(tmp_path, cluster, recovery, data):
    _, prefix = cluster
    env = SRA_ENV + [f"GRADCOMP_CROSS_COMMUNICATOR={'auto' if data == 'tcp' else 'mpi'}"]
    env += ["OMPI_MCA_btl_tcp_eager_limit=65536"] if recovery == "rendezvous" else []
    job = run(tmp_path, ["--fault", "kill", "--at", "allreduce", "--kill-after", "0.5"] + SRA, prefix=prefix,
              mpi_args=["--enable-recovery"] if recovery else [], env=env)
    killed = job.event(1, "SIGKILL")
    assert killed, job.describe()
    needles = ("the allreduce of 'w3' has not completed", "a peer rank died, stopped or lost its network link")
    if recovery == "recovery":
        # Over TCP the dead rank's sockets close with it: both survivors' waits end at once,
        # naming it, also the survivor that learns it from the other one (which, failing in the
        # middle of sending it a stripe, finishes the stripe before its reason).
        for r in (0, 2):
            assert_exits_on_its_own(job, r, killed, LOST, "[compressed allreduce of tensor 'w3']")
            assert job.ended_at(r)[1] - killed <= SLACK, job.describe()
    elif recovery == "rendezvous" and open_mpi_major() < 5:
        # The survivors were inside the allreduce itself, not in a negotiation round, waiting for
        # the dead rank's acknowledgements: their watchdogs end them.
        assert_survivors_exit_on_their_own(job, (0, 2), killed, *needles)
    elif recovery in ("eager", "rendezvous"):
        # (Open MPI 5 aborts a rank whose peer's connection closed whatever the eager limit.)
        # A survivor whose eager send to the dead rank fails is ended by Open MPI at once (ob1
        # aborts on a failed send: status 255, mpirun's output names the peer host); one that
        # was not sending to it, by its watchdog, as above.
        for r in (0, 2):
            status = job.ended_at(r)
            assert status is not None, f"rank {r} did not exit\n{job.describe()}"
            if status[0] is None:  # ended by Open MPI 5's launcher as the other survivor was aborted
                assert status[1] - killed <= TIMEOUT + SLACK, job.describe()
            elif status[0] == 1:
                assert_exits_on_its_own(job, r, killed, *needles)
            else:
                assert_aborted_by_open_mpi(job, r, killed)
    else:
        # mpirun ends the job and names the killed rank; or, when a survivor failed first (it
        # lost its connection to the dead rank), reports that survivor's exit.
        assert job.rc != 0 and job.elapsed < 60, job.describe()
        if not re.search(KILLED_NAMED, job.output):
            failed = [r for r in (0, 2) if job.exit(r) and job.exit(r)[0] == 1]
            assert failed, job.describe()
            for r in failed:
                assert_exits_on_its_own(job, r, killed, LOST)
    assert_clean(job, tmp_path)


# How a link goes silent: every packet dropped both ways (a switch port that black-holes), or the
# node's veth set down (a cable pulled); in neither does a reset reach anyone.
SILENCES = {"drop": ("cut", "heal"), "down": ("unplug", "plug")}


@pytest.mark.parametrize("silence", sorted(SILENCES))
def test_link_cut_during_an_allreduce(tmp_path, cluster, silence):
    tag, prefix = cluster
    cut_off, restore = SILENCES[silence]
    proc, started = start(tmp_path, ["--fault", "none"] + SRA, prefix=prefix, env=SRA_ENV)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            logs = [p for p in glob.glob(str(tmp_path / "rank-*.log")) if "steady" in open(p).read()]
            if len(logs) == 3:
                break
            time.sleep(0.1)
        assert len(logs) == 3, "the ranks did not reach their allreduce loop"
        time.sleep(0.3)  # inside an allreduce (each takes about a second)
        subprocess.run(["bash", CLUSTER, cut_off, tag, "3"], check=True)
        cut = time.time()
        # Every rank, the cut-off one too, ends itself; mpirun cannot hear from node 3 until
        # its link is back, so give it back once the ranks have had their time.
        time.sleep(TIMEOUT + SLACK + 2)
        subprocess.run(["bash", CLUSTER, restore, tag, "3"], check=True)
    finally:
        job = finish(tmp_path, proc, started, deadline=60)
    # Half the collective timeout after the last acknowledgement, each rank's TCP connections to
    # the other side of the silent link fail, naming the peer it cannot reach (core/settings.h
    # UnreachableSeconds): the ranks on nodes 1 and 2 name rank 2, which names one of them.
    unreachable = {0: "cannot reach rank 2", 1: "cannot reach rank 2", 2: "rank 2 cannot reach rank"}
    for r in (0, 1, 2):
        status = job.exit(r)
        assert status is not None and status[0] == 1, f"rank {r}: {status}\n{job.describe()}"
        assert status[1] - cut <= TIMEOUT + SLACK, f"rank {r}\n{job.describe()}"
        assert unreachable[r] in job.logs[r], job.describe()
        assert f"acknowledged nothing for {TIMEOUT / 2:g} s" in job.logs[r], job.describe()
    assert job.rc != 0, job.describe()
    assert_clean(job, tmp_path)
