"""gradcomp.torch.elastic's state in one job (mpirun -np 2 and 3): commit/restore, sync from rank
0, a change of hosts heard by one rank interrupting every rank at the same commit, run()
going on from the commit without gcrun, Horovod's ObjectState signature, the commit written
to GRADCOMP_ELASTIC_DIR and brought back by a fresh state (what a relaunch does),
ElasticSampler splitting what is left of an epoch over the ranks, LR schedulers committed as
their state_dict, and commits on disk holding plain values only (an object refused when
committing, a file whose loading would run code refused when read). test_elastic.py runs whole
jobs under gcrun --elastic."""
import hashlib
import os
import pickle
import random
import shutil

import pytest
import torch
import torch.nn as nn

import gradcomp.torch as hvd
from gradcomp import elastic as common
from mpi_fixtures import job_id


@pytest.fixture(scope="module", autouse=True)
def runtime():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def commit_dir():
    path = f"/tmp/gradcomp-elastic-test-{hashlib.sha1(job_id().encode()).hexdigest()[:12]}"
    os.environ["GRADCOMP_ELASTIC_DIR"] = path
    yield path
    hvd.barrier()
    del os.environ["GRADCOMP_ELASTIC_DIR"]
    if hvd.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def model_and_optimizer(seed):
    """A 1.3M-parameter MLP, different on every rank when seeds differ, with Adam state."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 768), nn.ReLU(), nn.Linear(768, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 512)).sum().backward()
    opt.step()
    return model, opt


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_sync_makes_every_rank_rank0s_and_restore_undoes_uncommitted_work():
    model, opt = model_and_optimizer(seed=100 + hvd.rank())
    state = hvd.elastic.TorchState(model, opt, epoch=hvd.rank(), batch=0)
    state.sync()
    everyone = hvd.allgather_object((flat(model), state.epoch, opt.state_dict()["state"][0]["exp_avg"]))
    for w, epoch, exp_avg in everyone:
        assert torch.equal(w, everyone[0][0]) and epoch == 0 and torch.equal(exp_avg, everyone[0][2])
    committed = flat(model).clone()
    state.batch = 7
    state.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state.batch = 99
    state.restore()
    assert torch.equal(flat(model), committed) and state.batch == 7


def test_a_notice_on_one_rank_interrupts_every_rank_at_the_same_commit():
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)  # Horovod's signature
    state.commit()  # nothing heard: no interrupt
    if hvd.rank() == hvd.size() - 1:
        common.notify_hosts_updated()
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.commit()
    state.commit()  # heard once, acted on once


def test_run_without_gcrun_goes_on_from_the_commit_after_a_change_of_hosts():
    model, opt = model_and_optimizer(seed=7)
    state = hvd.elastic.TorchState(model, opt, step=0)
    calls, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(state.step)])

    @hvd.elastic.run
    def train(state, last):
        calls.append(state.step)
        while state.step < last:
            state.step += 1
            if state.step == 3 and len(calls) == 1 and hvd.rank() == 0:
                common.notify_hosts_updated()
            state.commit()
        return state.step

    assert train(state, 6) == 6
    assert calls == [0, 3] and resets == [3], (calls, resets)


def test_a_commit_on_disk_comes_back_in_a_fresh_state(commit_dir):
    model, opt = model_and_optimizer(seed=11)
    dataset = torch.utils.data.TensorDataset(torch.arange(1000))
    sampler = hvd.elastic.ElasticSampler(dataset, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=2, batches=0)
    state.sync()
    for i in range(5):
        sampler.record_batch(i, 10)
    state.batches = 5
    state.commit()
    common.wait_for_writes()  # written in the background by the host's first rank
    hvd.barrier()
    assert os.path.exists(common.commit_path(commit_dir))
    committed, adam = flat(model).clone(), opt.state_dict()["state"][0]["exp_avg"].clone()

    # A relaunched process: other weights, nothing processed; its first sync() finds the commit.
    model2, opt2 = model_and_optimizer(seed=500 + hvd.rank())
    sampler2 = hvd.elastic.ElasticSampler(dataset, seed=3)
    fresh = hvd.elastic.TorchState(model2, opt2, sampler=sampler2, epoch=0, batches=0)
    fresh.sync()
    assert torch.equal(flat(model2), committed)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], adam)
    assert (fresh.epoch, fresh.batches, fresh.commits) == (2, 5, state.commits)
    # The sampler resumes the epoch: what is left, split over the ranks, none seen twice.
    done = 5 * 10 * hvd.size()
    assert sampler2.processed_num == done
    mine = list(iter(sampler2))
    everyone = hvd.allgather_object(mine)
    left = sorted(set(i for part in everyone for i in part))
    order = list(range(1000))
    random.Random(3 + sampler2.epoch).shuffle(order)  # the sampler's seed plus its epoch (0)
    assert left == sorted(order[done:])
    assert all(len(part) == len(mine) for part in everyone)


def test_an_lr_scheduler_is_committed_as_its_state_dict(commit_dir):
    # torch 2's schedulers derive from LRScheduler (no longer from _LRScheduler): still a handler's.
    model, opt = model_and_optimizer(seed=12)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    state.sync()
    for _ in range(3):
        opt.step()
        sched.step()
    state.commit()
    common.wait_for_writes()
    hvd.barrier()
    model2, opt2 = model_and_optimizer(seed=13)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    fresh = hvd.elastic.TorchState(model2, opt2, scheduler=sched2, epoch=0)
    fresh.sync()
    assert fresh.scheduler is sched2 and sched2.last_epoch == 3
    assert sched2.get_last_lr() == pytest.approx([1e-3 * 0.5 ** 3])


class Opaque:
    """An object that is neither a tensor nor a plain value."""


def test_a_commit_holding_an_object_is_refused_on_every_rank(commit_dir):
    model, opt = model_and_optimizer(seed=14)
    state = hvd.elastic.TorchState(model, opt, epoch=0, extra=[1, Opaque()])
    state.sync()
    with pytest.raises(ValueError, match=r"an elastic commit: the state\['objects'\]\['extra'\]\[1\] is a "
                                         r"test_elastic_state_mpi.Opaque; an elastic commit holds only tensors and "
                                         r"None, bools, numbers, strings, bytes, and lists, tuples and dicts of them, "
                                         r"so that loading it runs no code"):
        state.commit()
    hvd.barrier()
    assert not os.path.exists(common.commit_path(commit_dir))


def leave_a_mark(path):
    with open(path, "w"):
        pass


class _RunsCode:
    """Unpickling it calls leave_a_mark."""

    def __reduce__(self):
        return (leave_a_mark, (os.environ["GRADCOMP_ELASTIC_DIR"] + "/code-ran",))


def test_a_commit_file_whose_loading_would_run_code_is_not_loaded(commit_dir):
    # Whoever can write the commit directory must not run code in the job: such a file is refused
    # when read, and the job starts from rank 0's state as if there were no commit.
    if hvd.local_rank() == 0:
        os.makedirs(commit_dir, exist_ok=True)
        torch.save({"commit": 99, "world": hvd.size(), "state": _RunsCode()}, common.commit_path(commit_dir))
    hvd.barrier()
    model, opt = model_and_optimizer(seed=200 + hvd.rank())
    state = hvd.elastic.TorchState(model, opt, epoch=hvd.rank())
    state.sync()
    assert not os.path.exists(os.path.join(commit_dir, "code-ran"))
    assert state.commits == 0 and state.epoch == 0
    everyone = hvd.allgather_object(flat(model))
    assert all(torch.equal(w, everyone[0]) for w in everyone)
    # The framework-neutral state reads its commits the same way: plain values only.
    mine = os.path.join(commit_dir, f"plain-{hvd.rank()}.pkl")
    with open(mine, "wb") as f:
        pickle.dump({"commit": 1, "state": _RunsCode()}, f)
    with open(mine, "rb") as f, \
            pytest.raises(pickle.UnpicklingError, match=r"refusing to load test_elastic_state_mpi.leave_a_mark"):
        common.ObjectState(hvd.broadcast_object, hvd.rank, step=0).load(f)
    assert not os.path.exists(os.path.join(commit_dir, "code-ran"))
