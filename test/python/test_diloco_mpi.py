"""DiLoCo and Streaming DiLoCo (gradcomp.torch.DiLoCo) under mpirun -np 3: inner steps send
nothing, the replicas are bit-identical after every sync (each fragment's after its own), the
loss falls (to under a third, 85% accuracy or more), a state resumes (with error feedback's
memories handed over), and bad arguments are
named (diloco_training.py's model and data; each node one worker: test_diloco_nodes_mpi.py).

Run by ctest as: mpirun -np 3 python3 -m pytest test/python/test_diloco_mpi.py
Every rank runs the same tests in the same order (they are collective)."""
import copy

import pytest
import torch

import gradcomp.torch as hvd
from diloco_training import batches, digits, fingerprint, make_model, run, same_on_every_rank, train
from gradcomp.torch.diloco import split_fragments
from mpi_fixtures import runtime_only


@pytest.fixture(scope="module", autouse=True)
def runtime():
    yield from runtime_only()


def test_inner_steps_send_nothing_and_every_sync_leaves_bit_identical_replicas():
    H = 10
    seen = {"syncs": 0}

    def check(opt, step):
        executed = hvd.stats()["executed_tensors"]
        if step == 0:
            pass
        elif step % H:
            assert executed == check.executed, f"step {step} (an inner step) ran collectives"
            if step % H == 1:  # the ranks trained apart since the sync: they differ now
                assert not same_on_every_rank(opt.params)
        else:
            assert executed > check.executed, f"step {step} (a sync) ran nothing"
            assert same_on_every_rank(opt.params), f"replicas differ after the sync at step {step}"
            seen["syncs"] += 1
        check.executed = hvd.stats()["executed_tensors"]  # the fingerprints' allgathers counted out
    model, (loss0, _), (loss, accuracy) = train(H, 150, check=check)
    assert seen["syncs"] == 15
    assert loss < loss0 / 3 and accuracy >= 0.85, (loss0, loss, accuracy)


def test_four_bit_syncs_with_error_feedback_send_an_eighth_and_reach_the_same_accuracy():
    H = 10
    compression = hvd.Compression.maxmin(bits=4, error_feedback=True)
    before = hvd.stats()

    def check(opt, step):
        if step and step % H == 0:
            assert same_on_every_rank(opt.params), f"replicas differ after the 4-bit sync at step {step}"
    model, (loss0, _), (loss, accuracy) = train(H, 150, compression=compression, name="diloco4", check=check)
    after = hvd.stats()
    into = after["compressed_bytes_in"] - before["compressed_bytes_in"]
    wire = after["compressed_bytes_on_wire"] - before["compressed_bytes_on_wire"]
    n = sum(p.numel() for p in model.parameters())
    assert into >= 15 * n * 4, (into, n)            # every sync's pseudo-gradients went through the codec
    # Each rank puts 2 (n - 1) / n of its pseudo-gradients on the wire (reduce-scatter, then
    # allgather), at 4 bits of 32, plus each 512-value bucket's min and max.
    n_ranks = hvd.size()
    assert wire <= into * 2 * (n_ranks - 1) / n_ranks / 8 * 1.05, (wire, into)
    assert loss < loss0 / 3 and accuracy >= 0.85, (loss0, loss, accuracy)


def test_streaming_fragments_sync_in_turn_overlapping_the_next_steps():
    H, F, delay = 12, 3, 2
    applied = []

    def check(opt, step):
        interval = H // F
        sent = step - delay
        if step and sent > 0 and sent % interval == 0:  # a fragment's exchange applied at this step
            f = (sent // interval - 1) % F
            assert same_on_every_rank(opt.fragments[f]), f"fragment {f} differs after its sync at step {step}"
            others = [p for g, ps in enumerate(opt.fragments) if g != f for p in ps]
            assert not same_on_every_rank(others)  # the other fragments are still each rank's own
            applied.append(f)
    model, (loss0, _), (loss, accuracy) = train(H, 150, fragments=F, delay=delay, name="streaming", check=check)
    assert applied[:6] == [0, 1, 2, 0, 1, 2] and len(applied) == (150 - delay) // (H // F), applied
    assert loss < loss0 / 3 and accuracy >= 0.85, (loss0, loss, accuracy)


def test_a_state_dict_resumes_exactly_or_from_the_last_sync():
    """A state taken with an exchange in flight: loaded into a fresh DiLoCo (after the model's
    own state), the exchange is sent again and the next steps give the same bits as the run that
    went on; with from_last_sync=True (an elastic restore) every rank restarts from the weights
    of the last sync, bit-identical, nothing in flight."""
    x, y, _, _ = digits()
    data = list(batches(x, y, 10))

    def make(name):
        model = make_model(hvd.rank())
        # Exact syncs (a state with error feedback's memories handed over: the test below).
        opt = hvd.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-4), sync_every=4, fragments=2, delay=1,
                         compression=hvd.Compression.none, name=name)
        return model, opt

    model, opt = make("resume.a")
    run(opt, model, data[:6])  # fragments sent at steps 2, 4, 6 (0, 1, 0), applied a step later
    assert list(opt.pending) == [0], opt.pending
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert saved["pending"] and not same_on_every_rank(model.parameters())
    run(opt, model, data[6:])
    expected = fingerprint(model.parameters())

    model_b, opt_b = make("resume.b")
    model_b.load_state_dict(saved_model)
    opt_b.load_state_dict(saved)
    run(opt_b, model_b, data[6:])
    assert fingerprint(model_b.parameters()) == expected

    model_c, opt_c = make("resume.c")
    opt_c.load_state_dict(saved, from_last_sync=True)
    assert not opt_c.pending and same_on_every_rank(model_c.parameters())
    assert fingerprint(model_c.parameters()) == fingerprint(saved["anchors"])


def test_error_memories_handed_over_make_a_resumed_run_the_same_as_the_run_that_went_on():
    """2-bit syncs with error feedback leave residuals in the runtime (each rank its own);
    take_error_memories() hands them over, the same on every rank, into the state: a fresh
    DiLoCo loaded with that state trains to the same bits as the run that went on, and without
    them it does not. Loading while this instance's exchanges are in flight is refused."""
    x, y, _, _ = digits()
    data = list(batches(x, y, 8))

    def make(name, delay=0):
        model = make_model(hvd.rank())
        opt = hvd.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-3), sync_every=2, delay=delay,
                         compression=hvd.Compression.maxmin(bits=2, error_feedback=True), name=name)
        return model, opt

    model, opt = make("memories.a")
    run(opt, model, data[:4])  # two syncs
    assert opt.owed == [None]
    opt.take_error_memories()
    owed = opt.owed[0]
    assert max(t.abs().max().item() for t in owed) > 1e-4 and same_on_every_rank(owed)
    executed = hvd.stats()["executed_tensors"]
    opt.take_error_memories()  # nothing synced since: no collective, nothing changes
    assert hvd.stats()["executed_tensors"] == executed and opt.owed[0] is owed
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    run(opt, model, data[4:])
    expected = fingerprint(model.parameters())

    for name, state, same in (("memories.b", saved, True), ("memories.c", dict(saved, owed=None), False)):
        model_b, opt_b = make(name)
        model_b.load_state_dict(saved_model)
        opt_b.load_state_dict(state)
        run(opt_b, model_b, data[4:])
        assert (fingerprint(model_b.parameters()) == expected) == same, name

    model_d, opt_d = make("memories.d", delay=1)
    run(opt_d, model_d, data[:2])  # the sync of step 2 is in flight until step 3
    with pytest.raises(RuntimeError) as e:
        opt_d.load_state_dict(saved)
    assert "DiLoCo.load_state_dict: exchanges of this instance are in flight" in str(e.value)
    opt_d.load_state_dict(saved, from_last_sync=True)


def test_fragments_are_consecutive_and_about_equal():
    params = [torch.zeros(n) for n in (100, 10, 100, 10, 100, 10)]
    groups = split_fragments(params, 3)
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [t for g in groups for t in g] == params
    assert [len(g) for g in split_fragments(params, 6)] == [1] * 6
    assert [len(g) for g in split_fragments([torch.zeros(1000)] + params, 3)] == [1, 3, 3]


@pytest.mark.parametrize("kwargs,message", [
    ({"sync_every": 0}, "sync_every must be a positive integer, got 0"),
    ({"sync_every": 10, "fragments": 3}, "sync_every (10) must be a multiple of fragments (3)"),
    ({"sync_every": 10, "fragments": 9}, "fragments must be an integer from 1 to the model's 6 trained parameters"),
    ({"sync_every": 12, "fragments": 3, "delay": 4},
     "delay must be an integer from 0 to sync_every / fragments - 1 (3)"),
    ({"sync_every": 10, "mixing": 1.5}, "mixing must be in [0, 1], got 1.5"),
    ({"sync_every": 10, "workers": "host"}, "workers must be 'rank' or 'node', got 'host'"),
    ({"sync_every": 10, "workers": "node", "process_set": hvd.global_process_set},
     "workers='node' needs the world (process_set=None)"),
])
def test_bad_arguments_are_named(kwargs, message):
    model = make_model(0)
    with pytest.raises(ValueError) as e:
        hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
    assert message in str(e.value)


def test_a_model_without_trained_parameters_and_a_state_of_another_model_are_refused():
    frozen = make_model(0).requires_grad_(False)
    with pytest.raises(ValueError) as e:
        hvd.DiLoCo(frozen, torch.optim.SGD(make_model(0).parameters(), lr=0.1), sync_every=10)
    assert "DiLoCo: the model has no parameter that requires grad" in str(e.value)
    model = make_model(0)
    opt = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=10, name="refused")
    state = opt.state_dict()
    state["anchors"] = state["anchors"][:4]
    with pytest.raises(ValueError) as e:
        opt.load_state_dict(state)
    assert "DiLoCo.load_state_dict: the state has 4 parameters, the model 6" in str(e.value)
