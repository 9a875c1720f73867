"""DiLoCo with each node one worker (workers="node") under mpirun -np 4 as 2 nodes x 2
(GRADCOMP_LOCAL_SIZE=2): a node's ranks average their gradients every inner step and stay
bit-identical, only the outer syncs run in the world's runtime, and the nodes differ between
syncs and agree after each.

Run by ctest as: mpirun -np 4 -x GRADCOMP_LOCAL_SIZE=2 python3 -m pytest test/python/test_diloco_nodes_mpi.py"""
import pytest

import gradcomp.torch as hvd
from diloco_training import fingerprint, train
from mpi_fixtures import runtime_only


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from runtime_only()


def test_node_workers_average_every_step_within_a_node_and_only_syncs_cross_nodes():
    """workers="node": a node's ranks are bit-identical after every step (they average their
    gradients over the node's group), the world's runtime runs nothing between syncs, and the
    nodes (GRADCOMP_LOCAL_SIZE=2 at -np 4: 2 nodes x 2) differ between syncs and agree after each."""
    H = 10
    nodes = hvd.allgather_object(hvd.cross_rank())

    def check(opt, step):
        executed = hvd.stats()["executed_tensors"]  # the world's runtime
        if step:
            assert (executed > check.executed) == (step % H == 0), f"world collectives at step {step}"
        prints = hvd.allgather_object(fingerprint(opt.params))
        assert len({prints[r] for r in range(hvd.size()) if nodes[r] == nodes[hvd.rank()]}) == 1, \
            f"a node's replicas differ after step {step}"
        if step % H == 0:
            assert len(set(prints)) == 1, f"replicas differ after the sync at step {step}"
        elif hvd.cross_size() > 1:
            assert len(set(prints)) == hvd.cross_size(), f"the nodes trained alike at step {step}"
        check.executed = hvd.stats()["executed_tensors"]
    model, (loss0, _), (loss, accuracy) = train(H, 100, name="nodes", check=check, workers="node")
    assert loss < loss0 / 2 and accuracy >= 0.8, (loss0, loss, accuracy)
