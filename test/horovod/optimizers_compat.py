"""A pytest plugin for Horovod's own test_torch.py (../shared/horovod-conformance) on torch 2.9 and
newer. Three of its tests build every torch.optim optimizer, found as the subclasses of
torch.optim.Optimizer, over a model with 1-D biases, leaving out by name the two that cannot
take such a model (LBFGS, SparseAdam). torch 2.9 added a third, Muon, which takes 2-D parameters
only and refuses the model in its constructor, before any collective. This plugin leaves Muon out
of that list as the test leaves out the other two; every other optimizer runs as before.

    run.sh -p optimizers_compat          (with this folder on PYTHONPATH)
"""
import torch


def pytest_configure(config):
    del config
    muon = getattr(torch.optim, "Muon", None)
    if muon is None:
        return
    optimizer = torch.optim.Optimizer
    subclasses = type.__subclasses__
    # A class attribute of that name hides type's method for Optimizer alone.
    optimizer.__subclasses__ = staticmethod(lambda: [c for c in subclasses(optimizer) if c is not muon])
