"""What every gradcomp adapter shares, one idea a module, gathered here under the names the
adapters use (``from gradcomp import basics as _b``):

- lifecycle.py: init/start/shutdown with init()'s keyword settings (the registry's names
  without the ``GRADCOMP_`` prefix, lower-case: ``init(compression="maxmin", bits=4,
  fusion_threshold_mb=32)``; they override the environment, and ``python3 -m gradcomp.settings``
  lists them), the timeline, join and barrier;
- topology.py: rank, size, local and cross ranks;
- process_sets.py: ProcessSet, registering sets, the runtime a set's collective runs on;
- reduce_ops.py: the reduction ops and Horovod's op= / average= arguments;
- compression_settings.py: codec specs and adaptive compression's spec and report;
- reports.py: the runtimes' counters;
- handles.py: names of unnamed calls, handles of calls in flight, waiting for them;
- _runtime_state.py: the state they share.
"""
from gradcomp._core import GradcompError
from gradcomp.compression_settings import (AUTO_CANDIDATES, BY_OPTIMIZER, RELAXED_BITS, RELAXED_BITS_ADAPTIVE,
                                           auto_spec, auto_summary, codec_info, compression_choices,
                                           compression_spec, note_auto_default, relaxed_bits_by_optimizer,
                                           relaxed_bits_were_set)
from gradcomp.handles import (NativeGroup, auto_name, indices_by, poll, register, register_group, submits,
                              synchronize)
from gradcomp.lifecycle import (barrier, init, is_initialized, join, shutdown, start, start_timeline,
                                started_through_store, stop_timeline)
from gradcomp.process_sets import (ProcessSet, add_process_set, global_process_set, group_tag,
                                   members_only_process_set, remove_process_set, runtime, set_rank)
from gradcomp.reduce_ops import OP_NAMES, Adasum, Average, Max, Min, Product, Sum, check_op
from gradcomp.reports import stats, total_stats
from gradcomp.topology import cross_rank, cross_size, is_homogeneous, local_rank, local_size, rank, size

# Everything above: what the adapters use as basics.X.
__all__ = ["GradcompError",
           "AUTO_CANDIDATES", "BY_OPTIMIZER", "RELAXED_BITS", "RELAXED_BITS_ADAPTIVE", "auto_spec", "auto_summary",
           "codec_info", "compression_choices", "compression_spec", "note_auto_default", "relaxed_bits_by_optimizer",
           "relaxed_bits_were_set",
           "NativeGroup", "auto_name", "indices_by", "poll", "register", "register_group", "submits", "synchronize",
           "barrier", "init", "is_initialized", "join", "shutdown", "start", "start_timeline", "started_through_store",
           "stop_timeline",
           "ProcessSet", "add_process_set", "global_process_set", "group_tag", "members_only_process_set",
           "remove_process_set", "runtime", "set_rank",
           "OP_NAMES", "Adasum", "Average", "Max", "Min", "Product", "Sum", "check_op",
           "stats", "total_stats",
           "cross_rank", "cross_size", "is_homogeneous", "local_rank", "local_size", "rank", "size"]
