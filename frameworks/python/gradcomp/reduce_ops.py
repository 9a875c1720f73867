"""Reduction ops: the C++ ReduceOp codes (from the bindings) and Horovod's op= / average= arguments.
"""
from gradcomp import _core

# Reduction ops (the C++ ReduceOp codes, from the bindings).
Sum = _core.reduce_ops["sum"]
Average = _core.reduce_ops["average"]
Min = _core.reduce_ops["min"]
Max = _core.reduce_ops["max"]
Product = _core.reduce_ops["product"]
# Horovod's adaptive summation (allreduce of floating-point tensors; docs/design.md "Adasum").
Adasum = _core.reduce_ops["adasum"]
OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}


def check_op(op, average=None):
    """Resolves Horovod's `op=` and deprecated `average=` arguments to an op code."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op= or the deprecated average=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op not in OP_NAMES:
        raise ValueError(f"unknown reduction op {op!r}; use Sum, Average, Min, Max, Product or Adasum")
    return op
