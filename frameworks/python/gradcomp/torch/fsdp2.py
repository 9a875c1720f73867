"""FSDP2 (torch's fully_shard, HSDP on a 2-D mesh, the FSDP2-based replicate()) on backend
gradcomp, each module's exchanges under the module's own name.

    dist.init_process_group("gradcomp")
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    hvd.compress_fsdp(model)          # after fully_shard, before the first step

Backend gradcomp serves FSDP2 without this line too, compressed per the settings as any c10d
collective; but c10d names no tensors, so nothing is kept from one step to the next there (no
error feedback). compress_fsdp gives every FSDP module of `model` a reduce-scatter and an
all-gather of its own (FSDP2's set_custom_reduce_scatter and set_custom_all_gather), named after
the module's path in the model (`fsdp.layers.3`; `fsdp` for the root; `fsdp#1.layers.3` in the
next model given them):

- the gradients' reduce-scatter `fsdp.<path>`, with `compression` (None: GRADCOMP_COMPRESSION
  through the layer filter GRADCOMP_MIN_SIZE; auto chooses each module's setting as it does an
  allreduced tensor's) and `error_feedback` (None: GRADCOMP_ERROR_FEEDBACK). The residual and
  auto's measurements are kept by that name, so they follow the module whatever order the
  modules' gradients come in;
- HSDP's and replicate()'s all-reduce of the reduced shard over the replicas `fsdp.<path>.replicas`,
  with the same compression (auto included) and its own residual: FSDP2 issues it through c10d,
  which the backend recognizes by the buffer this module's reduce-scatter allocated;
- the weights' all-gather `fsdp.<path>.weights`, with `allgather_compression` (None:
  GRADCOMP_ALLGATHER_COMPRESSION): every rank decodes every shard, its own too, so the unsharded
  weights are the same bytes on every rank, and each owner keeps its exact shard.

A group within one node of a world of several (HSDP's shard group when a node holds one replica)
stays exact; compression applies across nodes. A module whose flat gradient changes size starts
with a fresh residual; a model sharded again needs compress_fsdp again (fully_shard makes new
FSDP state), whose new names start fresh too.
"""
import torch

from gradcomp import basics as _b
from gradcomp.torch import backend
from gradcomp.torch.compression import runtime_spec

try:  # torch >= 2.9 has FSDP2's custom collectives (torch 1.13's fsdp fails to import on Python 3.11)
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except Exception:  # noqa: BLE001 - an older torch; compress_fsdp says so
    FSDPModule = AllGather = ReduceScatter = None


def _gradcomp_group(group, what):
    """The backend gradcomp process group FSDP2 hands a module's collective."""
    if not isinstance(group, backend.ProcessGroupGradcomp):
        name = group.name() if hasattr(group, "name") else type(group).__name__
        raise ValueError(f"compress_fsdp: {what} runs on a process group of backend '{name}'; compress_fsdp needs "
                         "the mesh on backend gradcomp (dist.init_process_group(\"gradcomp\"))")
    return group


class _ModuleReduceScatter(ReduceScatter if ReduceScatter is not None else object):
    """A module's gradient reduce-scatter, under its name; the buffers it allocates are the
    module's (an all_reduce of one across replicas is named after the module too)."""

    def __init__(self, name, compress):
        self.name, self.compress = name, compress

    def allocate(self, size, *, dtype, device):
        buffer = torch.empty(*size, dtype=dtype, device=device)
        backend.name_module_buffer(buffer, self.name, self.compress)
        return buffer

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        work = _gradcomp_group(group, f"the gradients of '{self.name}'").reduce_scatter_module(
            output_tensor, input_tensor, op, self.name, self.compress)
        if async_op:
            return work
        work.wait()
        return None


class _ModuleAllGather(AllGather if AllGather is not None else object):
    """A module's weights' all-gather, under its name."""

    def __init__(self, name, compress):
        self.name, self.compress = name, compress

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        work = _gradcomp_group(group, f"the weights of '{self.name}'").all_gather_module(
            output_tensor, input_tensor, self.name + ".weights", self.compress)
        if async_op:
            return work
        work.wait()
        return None


def _gradient_spec(compression, error_feedback):
    """The module's gradient compression: the settings' or `compression`, error feedback per
    `error_feedback` (None: what the spec or the settings say)."""
    settings, _ = _b.runtime().default_compression()
    spec = settings if compression is None else runtime_spec(compression)
    info = _b.codec_info().get(spec["codec"])
    if info is not None and info["sparse"]:
        raise ValueError(f"compress_fsdp: compression {spec['codec']} needs an allreduce (DGC's sparse allgather); "
                         "FSDP reduce-scatters: use none, fp16, bf16, maxmin or auto")
    if error_feedback is not None:
        spec["error_feedback"] = bool(error_feedback)
    elif compression is not None:
        spec.setdefault("error_feedback", settings.get("error_feedback", False))
    return spec


_calls = 0  # compress_fsdp calls so far: every rank makes them in the same order


def compress_fsdp(model, compression=None, allgather_compression=None, error_feedback=None):
    """Gives every FSDP2 module of `model` (fully_shard or the FSDP2-based replicate, `model`
    included) a reduce-scatter and an all-gather named after it; returns the modules' names.
    `compression`, `allgather_compression`: None (the settings') or a Compression choice;
    `error_feedback`: None (the settings') or a bool. See the module's documentation.

    Names start with `fsdp` at the first call and `fsdp#k` at the k-th after it, so two models
    (or a model sharded again and given its collectives again) never share a residual."""
    global _calls
    if FSDPModule is None or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        raise NotImplementedError(f"compress_fsdp: torch {torch.__version__} has no FSDP2 custom collectives "
                                  "(set_custom_reduce_scatter, torch >= 2.9); backend gradcomp still compresses FSDP2's "
                                  "collectives per the settings, without error feedback")
    gradients = _gradient_spec(compression, error_feedback)
    weights = None if allgather_compression is None else runtime_spec(allgather_compression)
    prefix = "fsdp" if _calls == 0 else f"fsdp#{_calls}"
    names = []
    for path, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        name = f"{prefix}.{path}" if path else prefix
        module.set_custom_reduce_scatter(_ModuleReduceScatter(name, gradients))
        module.set_custom_all_gather(_ModuleAllGather(name, weights))
        names.append(name)
    if not names:
        raise ValueError("compress_fsdp: the model holds no FSDP2 module; call fully_shard (or replicate) first")
    _calls += 1
    return names
