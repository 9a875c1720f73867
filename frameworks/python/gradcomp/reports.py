"""What a rank's runtimes counted: stats() of one, total_stats() of every runtime of the rank.
"""
from gradcomp._runtime_state import state
from gradcomp.process_sets import runtime


def stats(process_set=None):
    """Counters of this rank's runtime (the process set's, which a backend group of some ranks
    has too: its `process_set`): cycles, cache hits, tensors executed, and the bytes
    compressed collectives took in and put on the wire."""
    return dict(runtime(process_set).stats())


# stats() fields that are a runtime's settings, not counts: total_stats() gives the world's.
_SETTING_STATS = ("fusion_threshold_mb", "cycle_time_ms", "autotune_done")


def total_stats():
    """stats() summed over every runtime of this rank: the world's and each process set's it
    belongs to, torch.distributed groups of some ranks included (FSDP2's and a DeviceMesh's
    groups each run one). What a framework's training sent, wherever its groups put it; the
    settings fields (fusion threshold, cycle time, autotune) are the world runtime's."""
    total = stats()
    for ps in list(state.process_sets.values()):
        if ps._runtime is None:
            continue
        for key, value in ps._runtime.stats().items():
            if key not in _SETTING_STATS:
                total[key] += value
    return total
