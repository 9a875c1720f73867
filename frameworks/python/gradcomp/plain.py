"""Plain data: what gradcomp stores or sends where loading it must run no code.

An elastic commit on disk and an optimizer state's skeleton hold only plain values (None, bools,
numbers, strings, bytes, and lists, tuples and dicts of them; the torch adapter adds tensors).
Unpickling anything else can run code of whoever wrote the bytes, so such values are refused
before they are written (`refuse_unplain`, naming where they are) and refused again when read
(`loads`, an unpickler that resolves no class or function).
"""
import collections
import io
import pickle

PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
PLAIN_VALUES = "None, bools, numbers, strings, bytes, and lists, tuples and dicts of them"


def first_unplain(obj, path, leaf_ok=None):
    """(path, type name) of the first value in `obj` that is not plain (nor accepted by
    `leaf_ok`), or None when all of it is."""
    if isinstance(obj, PLAIN_SCALARS) or (leaf_ok is not None and leaf_ok(obj)):
        return None
    if type(obj) in (dict, collections.OrderedDict):
        for k, v in obj.items():
            found = first_unplain(k, f"{path} (a key)", leaf_ok) or first_unplain(v, f"{path}[{k!r}]", leaf_ok)
            if found:
                return found
        return None
    if type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            found = first_unplain(v, f"{path}[{i}]", leaf_ok)
            if found:
                return found
        return None
    return path, f"{type(obj).__module__}.{type(obj).__qualname__}"


def refuse_unplain(obj, what, path, leaf_ok=None, plain=PLAIN_VALUES):
    """Raises ValueError naming the first value of `obj` that is not plain."""
    found = first_unplain(obj, path, leaf_ok)
    if found:
        raise ValueError(f"{what}: {found[0]} is a {found[1]}; {what} holds only {plain}, so that loading it "
                         "runs no code")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only {PLAIN_VALUES} may be loaded here")


def dumps(obj):
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def load(f):
    """Unpickles plain values from the file `f`; anything that names a class or function is refused."""
    return _PlainUnpickler(f).load()


def loads(data):
    return load(io.BytesIO(data))
