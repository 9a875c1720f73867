"""A group's ranks meet on its store before the backend builds anything collective on it.

c10d gives every group a store (the default group's is the env:// rendezvous's TCPStore, served
by rank 0 on MASTER_PORT). Under MPI the backend's collectives do not need it, so without this
meeting nothing checks that the ranks creating a group are in the same one. A script that
destroys its group and creates it again on the same MASTER_PORT (CGX's test suite does, once per
test) races: a rank quick to come back can connect to rank 0's previous store, still served until
rank 0 destroys its own group, and go on into an MPI collective that rank 0, waiting for its
workers on the new store, never reaches.

Each rank adds itself to a count on the store and waits until the count is the group's size. On
a store left from an earlier group the count passes that size at once: the rank fails, naming the
cause. Every other failure (rank 0's store gone, a rank that never comes, one that failed before
it came) is named too, within the group's timeout.
"""
import time

from gradcomp import _core
from gradcomp import world as _world

JOINED = "gradcomp/group/joined"
ALL_JOINED = "gradcomp/group/all_joined"


def meet(store, rank, size, timeout, runtime_running=lambda: True):
    """Returns once all `size` ranks of the group came to `store`; raises RuntimeError naming why
    not within `timeout` (a timedelta; None: c10d's default, 30 minutes). `runtime_running`: whether
    the world's runtime, if one was running, still is: a rank whose script failed before it came
    (torch's rendezvous, say) stops it on every rank as it exits, and this rank then stops waiting."""
    seconds = timeout.total_seconds() if timeout is not None else 1800.0
    deadline = time.monotonic() + seconds
    waiting = _world.StoreAdapter(store)  # get() returns None on a timeout, torch's words for it vary
    try:
        joined = store.add(JOINED, 1)
        if joined == size:
            store.set(ALL_JOINED, "1")
        while joined <= size and waiting.get(ALL_JOINED, min(0.5, seconds)) is None:
            if not runtime_running():
                raise _failed(rank, size, f"gradcomp stopped on this rank while it waited for the group's ranks on "
                                          f"its store ({store.add(JOINED, 0)} of {size} came): another rank shut "
                                          "gradcomp down as its script ended, having failed before it joined this "
                                          "group")
            if time.monotonic() >= deadline:
                raise _failed(rank, size, f"only {store.add(JOINED, 0)} of the group's {size} ranks came to its "
                                          f"store within the group's timeout ({seconds:.0f} s, "
                                          "init_process_group(timeout=...)); a rank that never came died, hangs, or "
                                          "is in another group")
    except GroupJoinError:
        raise
    except RuntimeError as e:  # the store's own failure (torch's store errors are RuntimeErrors)
        raise _failed(rank, size, f"the group's store failed while its ranks met on it ({e}): the rank that serves it "
                                  "(rank 0, on MASTER_ADDR:MASTER_PORT for the default group) exited or destroyed its "
                                  "group") from e
    if joined > size:
        raise _failed(rank, size, f"it is rank {joined} to join a store on which the group's {size} ranks had already "
                                  "met: a store left from an earlier group, still served by the rank that has not "
                                  "destroyed it yet (destroy_process_group, then init_process_group on the same "
                                  "MASTER_ADDR:MASTER_PORT, while another rank was still in its previous group). Give "
                                  "each new group a MASTER_PORT of its own, or keep one group for the job")


class GroupJoinError(RuntimeError):
    """A group's creation failed on this rank: the message names the rank, the group's size and why."""


def _failed(rank, size, why):
    # This rank leaves the job: its MPI teardown at exit must not wait for ranks that are in
    # another group (a launcher then ends the job).
    _core.abandon_mpi_at_exit()
    return GroupJoinError(f"backend gradcomp: rank {rank} of {size} could not create the group: {why}. This "
                          "process leaves MPI unfinalized at its exit, so mpirun ends the job")
