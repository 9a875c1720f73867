"""The compression a call or an adapter asks for: codec names and specs, adaptive compression's
spec (auto_spec) and its defaults by optimizer, and what auto chose (compression_choices,
auto_summary).
"""
import os

from gradcomp import _core
from gradcomp._runtime_state import state, world_runtime
from gradcomp.process_sets import runtime
from gradcomp.reports import stats

_CODECS = tuple(name for name, _ in _core.codecs()) + ("auto",)
AUTO_CANDIDATES = ("none", "fp16", "maxmin8", "maxmin6", "maxmin5", "maxmin4", "maxmin3", "maxmin2", "maxmin1")


# Compression.auto(relaxed=BY_OPTIMIZER), the default: how far a calm tensor's budget relaxes
# depends on the optimizer. Measured (docs/benchmarks.md "Adaptive compression as it comes"): under SGD 1 bit
# can throw training off (digits: in one of two runs one seed of three diverged to chance), 2
# bits held it; under Adam, whose update is normalized per coordinate, 1 bit holds the character
# LM's loss.
BY_OPTIMIZER = "optimizer"
RELAXED_BITS = 2            # SGD and any optimizer gradcomp does not see (NumPy, the DDP hook)
RELAXED_BITS_ADAPTIVE = 1   # optimizers that normalize their update per coordinate (Adam and kin)
_auto_notes = {}  # what an adapter decided for the defaults: auto_summary() says it


def relaxed_bits_by_optimizer(reference_bits, adaptive):
    """The relaxed bits BY_OPTIMIZER stands for under a `reference_bits` reference (0: off)."""
    return max(0, min(RELAXED_BITS_ADAPTIVE if adaptive else RELAXED_BITS, reference_bits - 1))


def relaxed_bits_were_set():
    """Whether GRADCOMP_AUTO_RELAXED_BITS was given (environment or init()'s settings)."""
    return "GRADCOMP_AUTO_RELAXED_BITS" in os.environ or "GRADCOMP_AUTO_RELAXED_BITS" in state.overrides


def note_auto_default(key, text):
    """An adapter's word on a default it chose for auto compression (auto_summary prints it)."""
    _auto_notes[key] = text


def auto_spec(candidates=None, reference=None, interval=25, relaxed=BY_OPTIMIZER, critical_change=0.5,
              normalized=True):
    """The runtime's spec of adaptive compression: every `interval` steps each tensor gets the
    setting among `candidates` (names: none, fp16, bf16, maxminB, topkR) that puts the fewest
    bytes on the wire while the model's total squared error stays at most what `reference` (a
    maxmin spec dict, default 4 bits; its bucket size, rounding and error feedback apply to
    every candidate) would give.

    With `relaxed` (a maxmin spec dict of fewer bits than the reference, or its bits; None for
    the reference's budget throughout), only tensors in a critical regime keep the reference's
    error budget (Accordion): those whose gradient, summed over the steps between two choices,
    moved in norm by `critical_change` (a fraction) or more since the previous choice, and every
    tensor at its first choice. A calm tensor's budget steps down one bit a choice (the error of
    maxmin at one bit fewer than its previous budget), down to the relaxed setting's. The
    default, BY_OPTIMIZER, is 2 bits, which DistributedOptimizer lowers to 1 under an optimizer
    that normalizes its update per coordinate (Adam and its kin), as GRADCOMP_AUTO_RELAXED_BITS'
    default is (both never below 1, nor at the reference's bits or above).

    With `normalized` (the default), each tensor's error counts over its values' mean square:
    the error of an update normalized per coordinate, which held both SGD's and Adam's accuracy
    in the measurements of docs/benchmarks.md; False weighs absolute errors (L-GreCo's), which
    lets a tensor of small gradients take few bits."""
    candidates = AUTO_CANDIDATES if candidates is None else candidates
    if isinstance(candidates, str):
        candidates = [candidates]
    candidates = [str(c).strip() for c in candidates]
    if not candidates or any(not c or "," in c for c in candidates):
        raise ValueError(f"auto compression: candidates must be a non-empty list of names (none, fp16, bf16, "
                         f"maxminB, topkR), got {candidates!r}")
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ValueError(f"auto compression: interval must be a positive number of steps, got {interval!r}")
    ref = {"codec": "maxmin", "bits": 4} if reference is None else dict(reference)
    if ref.get("codec") != "maxmin":
        raise ValueError(f"auto compression: the reference must be a maxmin setting, got {reference!r}")
    spec = {k: v for k, v in ref.items() if k in ("bits", "bucket_size", "stochastic", "error_feedback",
                                                  "skip_incomplete_buckets")}
    relaxed_bits = relaxed
    if relaxed == BY_OPTIMIZER:
        relaxed_bits = relaxed_bits_by_optimizer(spec.get("bits", 4), adaptive=False)
        relaxed = relaxed_bits or None
    if relaxed is None:
        relaxed_bits = 0
    elif isinstance(relaxed, dict):
        if relaxed.get("codec") != "maxmin":
            raise ValueError(f"auto compression: relaxed must be a maxmin setting, got {relaxed!r}")
        differ = sorted(k for k in ("bucket_size", "stochastic", "error_feedback", "skip_incomplete_buckets")
                        if k in relaxed and k in spec and relaxed[k] != spec[k])
        if differ:
            raise ValueError(f"auto compression: relaxed may differ from the reference in its bits only; "
                             f"{differ} differ ({relaxed!r} against {ref!r})")
        relaxed_bits = relaxed.get("bits", 4)
    if relaxed is not None and (not isinstance(relaxed_bits, int) or isinstance(relaxed_bits, bool) or
                                not 1 <= relaxed_bits < spec.get("bits", 4)):
        raise ValueError(f"auto compression: relaxed must have from 1 to fewer than the reference's "
                         f"{spec.get('bits', 4)} bits, got {relaxed!r}")
    if isinstance(critical_change, bool) or not isinstance(critical_change, (int, float)) or \
            not 0 < critical_change < float("inf"):
        raise ValueError(f"auto compression: critical_change must be a positive fraction, got {critical_change!r}")
    if not isinstance(normalized, bool):
        raise ValueError(f"auto compression: normalized must be True or False, got {normalized!r}")
    spec.update(codec="auto", candidates=",".join(candidates), interval=interval, relaxed_bits=relaxed_bits,
                critical_change=float(critical_change), normalized=normalized)
    return spec


def compression_choices(process_set=None):
    """Auto compression on this rank (in the process set's runtime, as stats()): {tensor name:
    {"setting": its current setting, "choice": which choice set it (counting from 1, as
    stats()["auto_choices"]), "measured_at": the step of the tensor its errors were measured on,
    "relative_error": {candidate: error over all ranks, "reference": error}, "relative_error_ef":
    the same with error feedback, measured on the gradient plus the residual the tensor carries
    (empty for a spec without error feedback), "critical": whether the choice found it in a
    critical regime (always True without relaxed), "budget_bits": the maxmin width whose error
    bounded its choice (the reference's while critical; with relaxed, one bit fewer each calm
    choice since, down to the relaxed bits), "norm_change": how far the norm of its gradient
    summed between choices moved since the choice before, as a fraction (-1: none before)}}
    (empty before the first choice)."""
    return dict(runtime(process_set).compression_choices())


def auto_summary():
    """One line for a job's summary on what adaptive compression chose on this rank: each
    setting with its number of tensors, and, where the cost model kept tensors uncompressed,
    that it did and why (the link it measured). '' when no tensor runs under auto."""
    choices = compression_choices()
    if not choices:
        return ("auto compression made no choice yet: every auto tensor ran its reference (the first choice comes "
                "after the interval, GRADCOMP_AUTO_INTERVAL or Compression.auto(interval=...))"
                if stats()["auto_tensors"] else "")
    settings = {}
    for c in choices.values():
        settings[c["setting"]] = settings.get(c["setting"], 0) + 1
    line = (f"auto compression, choice {max(c['choice'] for c in choices.values())}: " +
            ", ".join(f"{k} x{v}" for k, v in sorted(settings.items(), key=lambda kv: -kv[1])))
    raw = sum(1 for c in choices.values() if c["setting"] == "none" and c["estimated_seconds"])
    if raw:
        latency, per_byte = world_runtime().auto_link()
        speed = f"{1e-9 / per_byte:.2f} GB/s" if per_byte > 0 else "faster than it could time"
        line += (f". The cost model kept {raw} of {len(choices)} tensors uncompressed: it measured this job's link at "
                 f"{speed} and {latency * 1e6:.0f} us a message, where encoding and decoding them would take longer "
                 f"than the bytes they save (ranks on one node, or a fast network); across slow links it compresses "
                 f"(GRADCOMP_AUTO_COST_MODEL=0 compresses regardless)")
    for note in _auto_notes.values():
        line += ". " + note
    return line


def codec_info():
    """{codec name: {"description", "sparse", "fields"}}: what each codec is, from the core."""
    return _core.codec_info()


def compression_spec(compression):
    """None (the settings' policy), a codec name, or a dict with "codec" and its parameters
    (the keys of ``codec_info()[codec]["fields"]``, and error_feedback)."""
    if compression is None:
        return None
    if isinstance(compression, str):
        compression = {"codec": compression}
    if not isinstance(compression, dict) or compression.get("codec") not in _CODECS:
        raise ValueError(f"compression must be None, one of {_CODECS} or a dict with a 'codec' among them, "
                         f"got {compression!r}")
    return dict(compression)
