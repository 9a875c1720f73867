"""Where this rank is: its rank and size in the world, on its node and across nodes.
"""
from gradcomp._runtime_state import world_runtime


def rank():
    return world_runtime().rank()


def size():
    return world_runtime().size()


def local_rank():
    return world_runtime().local_rank()


def local_size():
    return world_runtime().local_size()


def cross_rank():
    return world_runtime().cross_rank()


def cross_size():
    return world_runtime().cross_size()


def is_homogeneous():
    """Whether every node holds the same number of ranks (Horovod's)."""
    return world_runtime().is_homogeneous()
