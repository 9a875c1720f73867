"""Elastic training, framework-neutral part (Horovod's elastic API over relaunches).

An MPI world cannot gain or lose members, so gradcomp does what torchrun does: when hosts fail,
leave or join, `gcrun --elastic` relaunches every rank on the hosts available, and the training
state comes back from the last commit. The script is a Horovod elastic script:

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()   # saves the state; raises HostsUpdatedInterrupt when hosts changed

    train(state)

- commit() keeps a copy of the state in memory and, under `gcrun --elastic` or torchrun, writes
  it to commit_directory() on each host (by the host's first rank; a file per host name), then
  checks with every rank whether gcrun has announced a change of hosts (SIGUSR1, forwarded by
  mpirun): if any rank heard it, every rank raises HostsUpdatedInterrupt at this commit.
- run(): on HostsUpdatedInterrupt under gcrun --elastic the ranks exit with RESTART_EXIT and
  gcrun relaunches them on the new hosts; without gcrun nothing can change the world and the
  function is called again from the commit. A failed peer (GradcompError) ends the rank:
  gcrun relaunches the job without the failed host. torchrun's agent restarts every rank
  itself (a rank failed, or a node joined its rendezvous): the restarted ranks start from the
  newest commit, as a relaunch does.
- sync() at the start of a relaunched job: the ranks agree on the newest commit found on any
  host (the hosts that survived hold it), load it from the lowest rank that has it and
  broadcast it, so every replica starts bit-identical; on a first start, rank 0's state is
  broadcast as in Horovod. Reset callbacks run after a relaunch (the world may have changed
  size: rescale the learning rate there).
"""
import copy
import functools
import os
import signal
import socket
import sys
import tempfile
import threading

from gradcomp import basics as _b
from gradcomp import plain
from gradcomp._core import GradcompError

RESTART_EXIT = 75  # launcher/elastic.py: the ranks stopped at a commit for a change of hosts

_notified = threading.Event()


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit()/check_host_updates() on every rank when hosts were added or removed."""

    def __init__(self, skip_sync=False):
        super().__init__("the hosts of the job changed")
        self.skip_sync = skip_sync


def under_gcrun():
    """Whether this rank runs under gcrun --elastic."""
    return os.environ.get("GRADCOMP_ELASTIC") == "1"


def under_torchrun():
    """Whether torchrun's elastic agent started this rank (and restarts every rank when one
    fails or nodes join: --max-restarts, --nnodes=MIN:MAX)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ


def commit_directory():
    """Where commits persist: GRADCOMP_ELASTIC_DIR (gcrun --elastic sets it), else under torchrun
    a directory of the run's own in the temporary directory (each host keeps its own file, as
    under gcrun; give GRADCOMP_ELASTIC_DIR a shared or lasting path to keep them elsewhere)."""
    directory = os.environ.get("GRADCOMP_ELASTIC_DIR")
    if not directory and under_torchrun():
        directory = os.path.join(tempfile.gettempdir(), f"gradcomp-elastic-{os.environ['TORCHELASTIC_RUN_ID']}")
    return directory


def resets():
    """How many times this job was relaunched (gcrun --elastic) or restarted (torchrun)."""
    return int(os.environ.get("GRADCOMP_ELASTIC_RESETS") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or "0")


def notify_hosts_updated():
    """Marks a change of hosts, as gcrun's SIGUSR1 does: the next commit raises HostsUpdatedInterrupt."""
    _notified.set()


def _listen():
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: _notified.set())


def _say(message):
    # Rank 0 says what happens to the job; every rank says what concerns it alone.
    print(f"gradcomp elastic (rank {_b.rank()}): {message}", file=sys.stderr, flush=True)


_writer = None  # the thread writing the last commit to disk, if any


def wait_for_writes():
    """Returns once the last commit is on disk."""
    if _writer is not None:
        _writer.join()


def commit_path(directory):
    return os.path.join(directory, f"commit-{socket.gethostname()}.pkl")


class State:
    """The state that survives a change of hosts. Subclasses keep the committed copy
    (save/restore), broadcast it (sync_from_root) and turn it into something picklable
    (snapshot/load_snapshot)."""

    # What a commit on disk may hold besides plain values (a framework's state: its tensors).
    commit_leaf = None
    commit_holds = plain.PLAIN_VALUES

    def __init__(self, bcast_object, get_rank, allgather_object=None):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._allgather_object = allgather_object
        self._reset_callbacks = []
        self._commits = 0          # commits so far, over relaunches
        self._started = False      # sync() ran once in this process

    def register_reset_callbacks(self, callbacks):
        """Functions called after a reset (a relaunch on other hosts, or a change of hosts)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    @property
    def commits(self):
        return self._commits

    def commit(self):
        """Saves the state (in memory, and under gcrun --elastic on disk on every host), then
        raises HostsUpdatedInterrupt on every rank if gcrun announced a change of hosts."""
        self.save()
        self._commits += 1
        self._persist()
        self.check_host_updates()

    def check_host_updates(self):
        heard = self._gather(_notified.is_set(), f"elastic.hosts_updated.{self._commits}")
        if any(heard):
            _notified.clear()
            raise HostsUpdatedInterrupt()

    def _gather(self, obj, name):
        """Every rank's obj in rank order (Horovod's State has only a broadcast: one per rank then)."""
        if self._allgather_object is not None:
            return self._allgather_object(obj, name=name)
        return [self._bcast_object(obj, root_rank=r, name=f"{name}.{r}") for r in range(_b.size())]

    # -- what subclasses provide ---------------------------------------------------------------
    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync_from_root(self):
        raise NotImplementedError

    def snapshot(self):
        raise NotImplementedError

    def load_snapshot(self, snap):
        raise NotImplementedError

    def dump(self, obj, f):
        f.write(plain.dumps(obj))

    def load(self, f):
        """A commit from disk: plain values only (whoever could write the file must not run code here)."""
        return plain.load(f)

    # -- persistence -----------------------------------------------------------------------------
    def _persist(self):
        """Writes the commit just saved in the background: training goes on while it is
        serialized (save() made new copies, which no later save() changes). One write at a time;
        the next commit, a relaunch's exit and the interpreter's exit wait for it."""
        directory = commit_directory()
        if not directory:
            return
        blob = {"commit": self._commits, "world": _b.size(), "state": self.snapshot()}
        # Checked on every rank (they hold the same state), so every rank stops with the same error.
        plain.refuse_unplain(blob["state"], "an elastic commit", "the state", self.commit_leaf, self.commit_holds)
        if _b.local_rank() != 0:
            return

        def write():
            path = commit_path(directory)
            tmp = f"{path}.{os.getpid()}.tmp"
            try:
                os.makedirs(directory, exist_ok=True)
                with open(tmp, "wb") as f:
                    self.dump(blob, f)
                os.replace(tmp, path)  # a rank killed while writing leaves the previous commit whole
            except Exception as e:  # the job goes on; a relaunch would start from an older commit
                _say(f"could not write commit {blob['commit']} to {path}: {e!r}")

        global _writer
        wait_for_writes()
        _writer = threading.Thread(target=write, name="gradcomp-elastic-commit")  # not a daemon
        _writer.start()

    def _restore_persisted(self):
        """Loads the newest commit any host holds; False when there is none."""
        directory = commit_directory()
        wait_for_writes()
        blob, mine = None, -1
        path = commit_path(directory) if directory else None
        if path and os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    blob = self.load(f)
                mine = int(blob["commit"])
            except Exception as e:  # a damaged file: the other hosts' copies may do
                _say(f"cannot read the commit in {path} ({e!r}); not using it")
                blob, mine = None, -1
        views = self._gather((mine, _b.rank()), "elastic.commits")
        best = max(c for c, _ in views)
        if best < 0:
            return False
        owner = min(r for c, r in views if c == best)
        blob = self._bcast_object(blob if _b.rank() == owner else None, root_rank=owner, name="elastic.commit")
        self.load_snapshot(blob["state"])
        self._commits = best
        self.restore()
        if _b.rank() == 0:
            _say(f"restored commit {best} (made by {blob['world']} ranks) from rank {owner}'s host; "
                 f"{_b.size()} ranks now. Error-feedback and DGC memories (per rank, in the runtime) start "
                 f"from zero after a relaunch: they are not part of a commit (a DiLoCo's are: it hands "
                 f"them over at each commit)")
        return True

    def sync(self):
        """Makes every rank's state identical: on the first call of a relaunched job, from the
        newest commit; otherwise from rank 0."""
        first, self._started = not self._started, True
        if first and self._restore_persisted():
            return
        self.sync_from_root()
        self.save()


class ObjectState(State):
    """Plain Python attributes (picklable), given as keyword arguments."""

    def __init__(self, bcast_object, get_rank, allgather_object=None, **kwargs):
        """As Horovod's ObjectState(bcast_object, get_rank, **kwargs); allgather_object, when
        given, saves the broadcasts that stand in for it."""
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank, allgather_object)

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync_from_root(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank=0, name="elastic.objects")
            self._set_attrs()

    def snapshot(self):
        return {"objects": dict(self._saved_state)}

    def load_snapshot(self, snap):
        self._saved_state = dict(snap["objects"])

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


def run_fn(func):
    """The body of hvd.elastic.run (see the module's docstring)."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if under_gcrun():
            _listen()
        relaunched = resets() > 0
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            if relaunched:
                state.on_reset()
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                if under_gcrun():
                    if _b.rank() == 0:
                        _say(f"hosts changed: stopping at commit {state.commits} for gcrun to relaunch")
                    wait_for_writes()
                    _b.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(RESTART_EXIT)
                # Nothing else can change an MPI world: go on from the commit.
                skip_sync, relaunched = e.skip_sync, True
            except GradcompError as e:  # a collective failed: usually a peer's fault, not ours
                if under_gcrun():
                    _say(f"stopping: a collective failed ({str(e).splitlines()[0][:200]})")
                raise
            except Exception as e:
                if under_gcrun():  # gcrun blames this rank's host (launcher/elastic.py)
                    print(f"gradcomp elastic: rank {_b.rank()} failed: {type(e).__name__}: {e}"[:500],
                          file=sys.stderr, flush=True)
                raise
    return wrapper
