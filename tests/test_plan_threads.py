"""The threads a cpu plan's run uses (``kernels/cpu/team.py``): fewer of Numba's while other
processes keep the cores busy, set back after the run, and the same bits on any number of them
(a training whose team changes at every step against one on all of Numba's threads)."""
import math
import time

import numba
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import TrainGraph
from miniflow.kernels.cpu import team
from miniflow.kernels.cpu.common import pinned_threads

TWO = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                         reason="Numba's pool has one thread (NUMBA_NUM_THREADS): none to spare")


@pytest.mark.parametrize("wanted, cores, others, size", [
    (2, 2, 0.0, 2), (2, 2, 0.2, 2), (2, 2, 0.3, 1), (2, 2, 1.0, 1), (2, 2, 2.0, 1),
    (8, 8, 3.0, 5), (8, 8, 3.3, 4), (4, 8, 3.0, 4), (1, 2, 1.0, 1), (2, 1, 0.0, 1)])
def test_the_team_is_the_cores_other_processes_leave_free(wanted, cores, others, size):
    assert team.team_size(wanted, cores, others) == size


class FakeStat:
    """``/proc/stat`` as a test sets it: ``busy`` seconds of other processes' time per second
    of wall time (this process's own time is not counted)."""

    def __init__(self):
        self.busy, self.t, self.total = 0.0, 0.0, 0.0

    def __call__(self, cores):
        self.t += 1.0
        self.total += self.busy
        return self.total, 0.0, self.t


@TWO
def test_a_busy_machine_runs_the_plan_on_fewer_threads_and_sets_them_back(monkeypatch, capsys):
    monkeypatch.setattr(team, "INTERVAL_S", 0.0)           # look at the end of every run
    stat = FakeStat()
    t = team.Team(stat)
    t.cores = [0, 1]
    with pinned_threads(2):
        assert t.begin() == 0 and numba.get_num_threads() == 2     # idle: all threads
        stat.busy = 1.0
        t.end(0)                                    # looked: another process held a core
        before = t.begin()
        assert before == 2 and numba.get_num_threads() == 1 and math.isclose(t.others, 1.0)
        stat.busy = 0.1
        t.end(before)
        assert numba.get_num_threads() == 2
        assert t.begin() == 0 and numba.get_num_threads() == 2
    assert capsys.readouterr().err == ""        # the same bits: nothing to say


@TWO
def test_what_other_processes_did_during_a_pause_between_runs_is_not_judged(monkeypatch):
    """A benchmark's other frameworks take turns with miniflow: the cores they kept busy while
    this process waited say nothing of the next run (``team.GAP_S``)."""
    monkeypatch.setattr(team, "INTERVAL_S", 0.0)
    monkeypatch.setattr(team, "MIN_WINDOW_S", 0.0)   # FakeStat's seconds pass at each look
    stat = FakeStat()
    t = team.Team(stat)
    t.cores = [0, 1]
    with pinned_threads(2):
        t.end(t.begin())
        stat.busy = 2.0                             # the other processes' turn: both cores
        stat(t.cores)
        stat.busy = 0.0
        t.ended -= 2 * team.GAP_S                   # this process paused meanwhile
        assert t.begin() == 0 and numba.get_num_threads() == 2
        t.end(0)
        assert t.others == 0.0 and t.limit == 2     # judged from the run after the pause
        stat.busy = 2.0                             # busy while this process runs: judged
        t.end(t.begin())
        before = t.begin()
        assert before == 2 and numba.get_num_threads() == 1 and t.others == 2.0
        t.end(before)


def test_a_window_after_a_pause_is_judged_once_it_spans_several_ticks(monkeypatch):
    """``/proc/stat`` counts in 10 ms ticks: the window that starts after a pause is judged at
    the first run's end at least ``MIN_WINDOW_S`` later, not at the next one's."""
    monkeypatch.setattr(team, "GAP_S", 10.0)       # the sleep below is no pause
    looks = []
    t = team.Team(lambda cores: looks.append(1) or (len(looks), 0.0, float(len(looks))))
    t.ended -= 20.0
    t.begin()
    t.end(0)
    assert len(looks) == 2                          # made, and the pause's restart
    time.sleep(1.5 * team.MIN_WINDOW_S)
    t.begin()
    t.end(0)
    assert len(looks) == 3 and t.others == 1.0      # judged


def _mlp_losses(dtype, switch, monkeypatch, steps=6):
    """Losses and weights of a 64-512-512-10 MLP trained at batch 256 (parallel kernels: every
    activation has 2^17 elements) by a plan built on 2 threads; ``switch``: the team is one
    thread at every other step."""
    mf.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    if dtype != "fp32":
        graph.config.enable_amp(dtype=mf.bfloat16 if dtype == "bf16" else mf.float16)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    y = rng.integers(0, 10, 256)
    fake = team.Team(lambda cores: None)
    monkeypatch.setattr(team, "TEAM", fake)
    sizes, losses = [], []
    real_set = numba.set_num_threads
    monkeypatch.setattr(numba, "set_num_threads", lambda n: (sizes.append(n), real_set(n)))
    with pinned_threads(2):
        for i in range(steps):
            fake.limit = 1 if switch and i % 2 else numba.config.NUMBA_NUM_THREADS
            losses.append(float(graph(x, y)))
            assert numba.get_num_threads() == 2
    return losses, {k: np.array(v) for k, v in model.state_dict().items()}, sizes


@TWO
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_a_training_gives_the_same_bits_whatever_the_team(dtype, monkeypatch):
    losses, weights, _ = _mlp_losses(dtype, False, monkeypatch)
    losses1, weights1, sizes = _mlp_losses(dtype, True, monkeypatch)
    assert 1 in sizes                   # the runs at odd steps did run on one thread
    assert losses1 == losses
    for k, w in weights.items():
        np.testing.assert_array_equal(weights1[k], w, err_msg=k)
