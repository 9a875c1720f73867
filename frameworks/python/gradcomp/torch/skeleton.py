"""A torch state (a state_dict, an elastic commit) as its tensors plus a skeleton of plain values
in their place: how gradcomp sends and stores state that must load without running code.

The skeleton is pickled as plain values (gradcomp.plain) and the tensors travel as tensors: in
place for a broadcast, or saved as a list of tensors that torch.load(weights_only=True) reads on
every torch gradcomp runs on (torch 1.13's weights-only loader refuses even a float).
"""
import collections
import io

import torch

from gradcomp import plain

_TENSOR = "__gradcomp_tensor__"
HOLDS = f"tensors and {plain.PLAIN_VALUES}"


def is_tensor(value):
    return isinstance(value, torch.Tensor)


def split(obj, path="state"):
    """(skeleton, [(path, tensor), ...]): obj with each tensor replaced by its index."""
    tensors = []

    def strip(o, at):
        if isinstance(o, torch.Tensor):
            tensors.append((at, o))
            return (_TENSOR, len(tensors) - 1)
        if type(o) is collections.OrderedDict:  # a state_dict: its _metadata goes with it
            out = collections.OrderedDict((k, strip(v, f"{at}.{k}")) for k, v in o.items())
            out.__dict__.update(o.__dict__)
            return out
        if isinstance(o, dict):
            return {k: strip(v, f"{at}.{k}") for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(strip(v, f"{at}.{i}") for i, v in enumerate(o))
        return o

    return strip(obj, path), tensors


def fill(skeleton, tensors):
    """The object split() took apart, with `tensors` (tensors only, in split()'s order) in place."""
    def put(o):
        if isinstance(o, tuple) and len(o) == 2 and o[0] == _TENSOR:
            return tensors[o[1]]
        if type(o) is collections.OrderedDict:
            out = collections.OrderedDict((k, put(v)) for k, v in o.items())
            out.__dict__.update(o.__dict__)
            return out
        if isinstance(o, dict):
            return {k: put(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(put(v) for v in o)
        return o

    return put(skeleton)


def save(obj, f):
    """Writes obj to the file `f`: tensors and plain values, which the caller has checked
    (plain.refuse_unplain(obj, ..., is_tensor, HOLDS)); load() refuses anything else."""
    skeleton, tensors = split(obj)
    head = torch.frombuffer(bytearray(plain.dumps(skeleton)), dtype=torch.uint8)
    torch.save([head] + [t.detach() for _, t in tensors], f)


def load(f):
    """What save() wrote, loading tensors and plain values only."""
    parts = torch.load(f, weights_only=True)
    if not isinstance(parts, list) or not parts or not all(isinstance(p, torch.Tensor) for p in parts):
        raise ValueError("not a state gradcomp saved (a list of tensors, its skeleton first)")
    return fill(plain.load(io.BytesIO(parts[0].numpy().tobytes())), parts[1:])
