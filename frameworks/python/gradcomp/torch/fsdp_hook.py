"""An FSDP communication hook that reduces the gradients through gradcomp's runtime, compressed,
on any backend (gloo, nccl, mpi, gradcomp), as ddp_hook does for DDP.

    from gradcomp.torch import FSDPHookState, fsdp_hook
    model = FSDP(net, device_id=..., auto_wrap_policy=...)        # on gloo, for instance
    model.register_comm_hook(FSDPHookState(hvd.Compression.maxmin(bits=4)), fsdp_hook)

FullyShardedDataParallel (torch 2) calls the hook in backward once per FSDP unit instead of its
reduce-scatter, with the unit's flat gradient (padded to a multiple of the ranks) and the shard
to fill; under NO_SHARD with the flat gradient alone, to be reduced in place. The hook runs
gradcomp's reducescatter (allreduce under NO_SHARD), averaged over the runtime's ranks or the
state's process set and compressed per the state's compression, and waits for it: FSDP reads the
shard as soon as the hook returns. Compression None follows the settings' layer filter as
backend gradcomp does: GRADCOMP_COMPRESSION's codec for float gradients of at least
GRADCOMP_MIN_SIZE elements, flat as they are (topk and auto leave them exact), with
GRADCOMP_ERROR_FEEDBACK. Each shard is summed in float32 by its owner from its peers' quantized
pieces and its own exact values (hvd.reducescatter's codec path).

Names. The runtime negotiates tensors by name and keeps error feedback's residual by name, but
FSDP hands the hook new tensors every time. So a unit's gradient is named by its place among the
reductions of a backward (FSDP reduces its units in the same order on every rank and in every
step) and its size; the count starts again after each backward (a callback queued on autograd's
engine at a backward's first reduction). With Compression.maxmin(..., error_feedback=True) or
GRADCOMP_ERROR_FEEDBACK=1 each unit keeps its residual across steps.

The weights' allgather has no hook in FSDP: backend gradcomp compresses it
(GRADCOMP_ALLGATHER_COMPRESSION). Torch refuses hooks for the hybrid strategies.
"""
import torch

from gradcomp import basics as _b
from gradcomp.basics import Average, synchronize
from gradcomp.torch.compression import runtime_spec
from gradcomp.torch.mpi_ops import allreduce_, reducescatter_async

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class FSDPHookState:
    """What fsdp_hook needs: the compression (None: the settings'; else a Compression choice that
    works on one collective: none, fp16, bf16, maxmin(...)), the process set FSDP's process group
    is made of (None: every rank) and the prefix of the gradients' names."""

    def __init__(self, compression=None, process_set=None, name="fsdp"):
        runtime_spec(compression)  # a choice the runtime cannot take fails here, not in backward
        self.compression, self.process_set, self.name = compression, process_set, name
        self._index = None  # the next reduction's place in this backward; None between backwards
        self._settings = None  # (the settings' dense spec or None, GRADCOMP_MIN_SIZE), at first use

    def spec_for(self, grad):
        """The compression of one gradient: the state's, or the settings' (see the module)."""
        if self.compression is not None:
            return self.compression
        if self._settings is None:
            spec, min_size = _b.runtime(self.process_set).default_compression()
            dense = spec["codec"] != "auto" and not _b.codec_info()[spec["codec"]]["sparse"]
            self._settings = (spec if dense else None, min_size)
        spec, min_size = self._settings
        if spec is not None and grad.dtype in FLOATS and grad.numel() >= min_size:
            return spec
        return {"codec": "none"}

    def next_name(self, grad):
        if self._index is None:
            self._index = 0
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        name = f"{self.name}.{self._index}.{grad.numel()}"
        self._index += 1
        return name

    def _end_backward(self):
        self._index = None


def fsdp_hook(state, grad, output=None):
    """FSDP's communication hook: `output` = this rank's shard of the average of `grad` over the
    ranks (sharded strategies), or `grad` averaged in place (NO_SHARD, no `output`)."""
    name = state.next_name(grad)
    if output is None:
        allreduce_(grad, name=name, op=Average, process_set=state.process_set, compression=state.spec_for(grad))
        return
    ranks = _b.runtime(state.process_set).size()
    if output.numel() * ranks != grad.numel():
        raise ValueError(f"fsdp_hook: gradient '{name}' of {grad.numel()} elements comes with a shard of "
                         f"{output.numel()}, a process group of {grad.numel() // max(output.numel(), 1)} ranks, but "
                         f"the hook reduces over {ranks}: give FSDPHookState the process_set FSDP's process "
                         "group is made of")
    shard = synchronize(reducescatter_async(grad, name=name, op=Average, process_set=state.process_set,
                                            compression=state.spec_for(grad)))
    output.copy_(shard)
