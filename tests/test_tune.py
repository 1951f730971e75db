"""Kernel choices by measurement (``kernels.cpu.tune``): the file's format and atomic write, a
corrupt, foreign or unwritable file, the ``MINIFLOW_MATMUL`` override, determinism, the budget,
``mpiexec`` (one rank measures), and that every candidate computes the product within rounding
of a float64 oracle, so whichever wins, results are right.

No test times anything: the tuner's timer is a fake that runs the candidate and reports a cost
per candidate name (cuDNN's benchmark mode and XLA's autotuner are the models;
``torch.backends.cudnn.benchmark``'s documentation states the same contract: the fastest
algorithm per input shape, chosen once)."""
import json
import os
import time
import types

import numpy as np
import pytest

from miniflow import distributed
from miniflow.dtype import bfloat16, float16, float32, float64, int64
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import builder_for, matmul as cpu_matmul, mkl_gemm, team, tune
from miniflow.kernels.cpu.common import pinned_threads
from miniflow.ops import get_op
from mpi_harness import rank_results, requires_mpi, run_mpi


class FakeTimer:
    """``timer(name, run)``: runs the candidate, returns ``costs[name]`` seconds; counts calls."""

    def __init__(self, **costs):
        self.costs, self.calls = costs, []

    def __call__(self, name, run):
        run()
        self.calls.append(name)
        return self.costs[name]


@pytest.fixture(autouse=True)
def one_thread():
    """Numba and BLAS on one thread (set back after): the kernels and products the tests name are
    the serial ones (at more threads the products split across Numba's, ``blas_split``); the
    test of the one-thread BLAS candidate gives BLAS its threads itself."""
    with pinned_threads(1):
        yield


def _tuner(tmp_path, monkeypatch, timer, path=None) -> tune.Tuner:
    """A tuner on a file in ``tmp_path``, choosing between the rules, BLAS and oneMKL (where
    offered; the one-thread BLAS candidate, which applies only where BLAS has more threads, has
    its own test)."""
    monkeypatch.setenv("MINIFLOW_MATMUL", "auto")
    monkeypatch.setattr(cpu_matmul, "CANDIDATES", {"numba": cpu_matmul.numba_steps,
                                                   "blas": cpu_matmul.blas_steps,
                                                   "mkl": cpu_matmul.mkl_steps})
    t = tune.Tuner(path=str(path or tmp_path / "tuning.json"), timer=timer)
    monkeypatch.setattr(tune, "TUNER", t)
    return t


def _matmul(m, k, n, dt=float32, ta=False, tb=False, counted=False, seed=0, out_dt=None):
    """``(steps, out, ref)``: the CPU builder's steps for ``op(a) @ op(b)`` (run; out of
    ``out_dt``, default ``dt``), and the float64 product."""
    out_dt = out_dt or dt
    r = np.random.default_rng(seed)
    a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dt.np)
    b = r.uniform(-1, 1, (n, k) if tb else (k, n)).astype(dt.np)
    outs = [np.full((m, n), -777.0, out_dt.np)] + ([np.zeros(1, np.int64)] if counted else [])
    node = Node(get_op("matmul"), [Value("a", a.shape, dt), Value("b", b.shape, dt)],
                [Value("o", (m, n), out_dt)] + ([Value("c", (1,), int64)] if counted else []),
                {"transpose_a": ta, "transpose_b": tb, "count_not_finite": counted})
    steps = builder_for(node.op)(node, [a, b], outs)
    for fn, args in steps:
        fn(*args)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return steps, outs[0], (a64.T if ta else a64) @ (b64.T if tb else b64)


def _names(steps) -> str:
    return tune._kernels(steps)


def test_the_faster_candidate_is_chosen_and_written_to_the_file(tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    steps, _, _ = _matmul(16, 300, 1000, tb=True)          # the rules: dot_block_kernel
    assert _names(steps) == "dot"
    data = json.loads((tmp_path / "tuning.json").read_text())
    assert data["format"] == tune.FORMAT and data["machine"] == tune.machine()
    [(key, name)] = data["choices"].items()
    assert name == "blas" and key.startswith("matmul float32 @ float32.T -> float32 m16 k512 "
                                             "n1024 | dot_block_kernel | threads ")
    assert tune.MIN_ROUNDS <= t.timer.calls.count("blas") <= tune.MAX_ROUNDS
    assert t.timer.calls.count("numba") == t.timer.calls.count("blas")    # interleaved rounds
    t2 = _tuner(tmp_path, monkeypatch, FakeTimer(numba=1e-3, blas=2e-3))
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot" and t2.timer.calls == []


def test_blas_wins_unless_beaten_by_the_margin_and_identical_candidates_are_not_measured(
        tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=1e-3 / (1 + tune.MARGIN / 2), blas=1e-3))
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    t = _tuner(tmp_path / "2", monkeypatch, FakeTimer(numba=1e-3 / (1 + 2 * tune.MARGIN),
                                                      blas=1e-3))
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot_block_kernel"
    t.timer.calls.clear()
    assert _names(_matmul(64, 32, 16, tb=True)[0]) == "dot"    # the rules call BLAS too
    assert t.timer.calls == [] and len(t.choices) == 1


def test_the_override_takes_one_candidate_without_measuring(tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer())       # any timing would raise a KeyError
    for value, expect in (("blas", "dot"), (" Numba ", "dot_block_kernel")):
        monkeypatch.setenv("MINIFLOW_MATMUL", value)
        assert _names(_matmul(16, 300, 1000, tb=True)[0]) == expect
    assert t.timer.calls == [] and not (tmp_path / "tuning.json").exists()
    monkeypatch.setenv("MINIFLOW_MATMUL", "fast")
    with pytest.raises(ValueError, match=r"MINIFLOW_MATMUL='fast' is not one of auto, numba, "
                                         r"blas"):
        _matmul(16, 300, 1000, tb=True)


def test_a_cached_choice_gives_the_same_steps_and_bits_in_a_new_process(tmp_path, monkeypatch):
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, mkl=3e-3, blas=1e-3))  # mkl: on AMX
    steps1, out1, _ = _matmul(256, 300, 256, ta=True, dt=float16)
    again = _tuner(tmp_path, monkeypatch, FakeTimer())       # a new process: reads the file
    steps2, out2, _ = _matmul(256, 300, 256, ta=True, dt=float16)
    assert _names(steps1) == _names(steps2) and again.timer.calls == []
    np.testing.assert_array_equal(out1.view(np.uint16), out2.view(np.uint16))


@pytest.mark.parametrize("content,why", [
    ("{not json", "cannot be read as JSON"),
    ("[" * 100000 + "]" * 100000, "cannot be read as JSON (RecursionError"),     # deep nesting
    ('{"format": "miniflow-tuning-2", "machine": {}, "choices": {}}', "is not a miniflow-tuning-4"),
    ('{"format": "miniflow-tuning-4", "machine": {"cpu": "a VAX"}, "choices": {"k": "blas"}}',
     "written for another machine"),
])
def test_a_corrupt_or_foreign_file_is_ignored_with_one_notice(tmp_path, monkeypatch, capsys,
                                                               content, why):
    monkeypatch.setattr(tune, "_SHOWN", set())
    (tmp_path / "tuning.json").write_text(content)
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    _matmul(16, 300, 1000, tb=True)
    _matmul(16, 1000, 300)
    err = capsys.readouterr().err
    assert err.count("miniflow: ignoring the kernel choices in") == 1 and why in err, err
    assert "a run measures them again and replaces the file" in err, err
    if "VAX" in content:    # what differs, both ways, not the file's whole machine
        assert f"cpu: file 'a VAX', here {tune.machine()['cpu']!r}; features: file 'None'" in err
    data = json.loads((tmp_path / "tuning.json").read_text())      # replaced by a valid file
    assert data["machine"] == tune.machine() and len(data["choices"]) == 2
    assert "k" not in data["choices"]


@pytest.mark.parametrize("kind", ["fifo", "device", "too big"])
def test_a_path_that_is_no_regular_file_is_not_read_and_is_replaced(tmp_path, monkeypatch,
                                                                    capsys, kind):
    """A FIFO (open() would block), a link to /dev/zero (read() would never end) or a file
    bigger than ``MAX_BYTES``: one notice, measured, the path replaced by a valid file."""
    monkeypatch.setattr(tune, "_SHOWN", set())
    path = tmp_path / "tuning.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    else:
        path.write_text(" " * (tune.MAX_BYTES + 1))
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    _matmul(16, 300, 1000, tb=True)
    err = capsys.readouterr().err
    assert err.count("miniflow: ignoring the kernel choices in") == 1, err
    assert ("more than the" if kind == "too big" else "not a regular file") in err
    assert path.is_file() and not path.is_symlink()
    assert len(json.loads(path.read_text())["choices"]) == 1


def test_a_folder_in_the_file_s_place_keeps_the_choices_in_memory_with_one_notice(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tune, "_SHOWN", set())
    (tmp_path / "tuning.json").mkdir()
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    assert "kept in memory only" in t.describe()[0]             # said before any write
    _matmul(16, 300, 1000, tb=True)
    err = capsys.readouterr().err
    assert err.count("miniflow:") == 1 and "it is a folder" in err and t.in_memory


def test_the_file_is_readable_as_numba_s_cache_files_are(tmp_path, monkeypatch):
    """``mkstemp`` makes 0600 files; the tuning file gets the mode ``open`` would give it."""
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    old = os.umask(0o027)
    try:
        _matmul(16, 300, 1000, tb=True)
        assert tune._umask() == 0o027 and os.umask(0o027) == 0o027      # read, not changed
    finally:
        os.umask(old)
    assert (tmp_path / "tuning.json").stat().st_mode & 0o777 == 0o640


def test_miniflow_info_says_in_memory_where_the_folder_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "a file").write_text("")
    t = _tuner(tmp_path, monkeypatch, FakeTimer(), path=tmp_path / "a file" / "x" / "t.json")
    assert "kept in memory only" in t.describe()[0] and not t.in_memory
    t = _tuner(tmp_path, monkeypatch, FakeTimer(), path=tmp_path / "new" / "folders" / "t.json")
    assert "cached in" in t.describe()[0]        # made at the first write


def test_a_sample_repeats_a_short_candidate_counted_from_a_warm_call(tmp_path, monkeypatch):
    """The first call of a candidate compiles (or loads) its kernels: the repeats per timed
    sample (``SAMPLE_S``) come from a second call, not from that one. The calls advance a fake
    clock (a real one read around one short call counts whatever else the cores did then: on a
    loaded 2-core machine one warm call of a no-op once took a whole ``SAMPLE_S``)."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(tune, "time", types.SimpleNamespace(perf_counter=lambda: clock.now,
                                                            thread_time=time.thread_time))
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1
        clock.now += 0.05 if calls["fast"] == 1 else 1e-6      # "compiling", then warm

    def slow():
        calls["slow"] += 1
        clock.now += 0.05 if calls["slow"] == 1 else 1e-6
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    candidates = {"numba": lambda node, ins, outs: [(fast, ())],
                  "blas": lambda node, ins, outs: [(slow, ())]}
    assert t.measure(None, [], [], candidates, [(fast, ())]) == ("blas", True, True)
    samples = len(t.timer.calls) // 2
    assert calls["fast"] - 2 >= 10 * samples        # many calls a sample, not one


def test_the_file_is_written_atomically(tmp_path, monkeypatch, capsys):
    """A write that fails before ``os.replace`` leaves the old file as it was and no temporary
    file; the choices stay in memory, said once."""
    monkeypatch.setattr(tune, "_SHOWN", set())
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    _matmul(16, 300, 1000, tb=True)
    before = (tmp_path / "tuning.json").read_text()
    replaced = []

    def failing_replace(src, dst):
        replaced.append((os.path.dirname(src), json.loads(open(src).read())))
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tune.os, "replace", failing_replace)
    assert _names(_matmul(16, 1000, 300)[0]) == "dot"
    assert (tmp_path / "tuning.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["tuning.json"]
    [(where, written)] = replaced          # the whole file, written beside the old one
    assert where == str(tmp_path) and len(written["choices"]) == 2
    assert t.in_memory and len(t.choices) == 2
    _matmul(64, 1000, 300)
    assert capsys.readouterr().err.count("No space left on device") == 1


def test_an_unwritable_folder_measures_in_memory_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tune, "_SHOWN", set())
    (tmp_path / "a file").write_text("")
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3),
               path=tmp_path / "a file" / "tuning.json")        # its folder cannot exist
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    _matmul(16, 1000, 300)
    assert t.in_memory and len(t.choices) == 2 and t.timer.calls.count("blas") <= 2 * tune.MAX_ROUNDS
    err = capsys.readouterr().err
    assert err.count("cannot write the kernel choices") == 1 and "kept in memory" in err
    assert "a file, not a folder" in err and "ignoring" not in err      # one notice, not two
    assert "kept in memory" in "\n".join(t.describe())


def test_the_file_keeps_at_most_max_choices_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "MAX_CHOICES", 2)
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    for m in (4, 16, 64):
        _matmul(m, 300, 1000, tb=True)
    keys = list(json.loads((tmp_path / "tuning.json").read_text())["choices"])
    assert [k.split()[6] for k in keys] == ["m16", "m64"]


def test_past_the_budget_the_usual_choice_is_taken_and_nothing_is_cached(tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=0.2, blas=0.1))
    t.spent = tune.BUDGET_S             # nothing cached yet: the rules
    assert _names(_matmul(4, 300, 1000, tb=True)[0]) == "dot_block_kernel"
    t.spent = 0.0
    _matmul(16, 300, 1000, tb=True)
    assert t.spent == pytest.approx(tune.MIN_ROUNDS * 0.3)      # stopped at the class budget
    t.spent = tune.BUDGET_S             # what the cached matmul classes at these threads chose
    assert _names(_matmul(8, 300, 1000, tb=True)[0]) == "dot"                # BLAS
    assert len(json.loads((tmp_path / "tuning.json").read_text())["choices"]) == 1
    tune.begin_model()                  # a new plan (Backend.begin_plan): a new budget, but
    assert _names(_matmul(4, 300, 1000, tb=True)[0]) == "dot_block_kernel"   # the guess stays
    assert len(t.timer.calls) == 2 * tune.MIN_ROUNDS
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=0.2, blas=0.1))     # a later process
    assert _names(_matmul(4, 300, 1000, tb=True)[0]) == "dot"                # measures it
    assert len(json.loads((tmp_path / "tuning.json").read_text())["choices"]) == 2


def _watch(others):
    """A watch that runs the timed rounds and says other processes kept ``others`` cores busy."""
    return lambda run: (run(), others)[1]


def test_a_threaded_choice_timed_on_busy_cores_is_kept_in_memory_not_written(tmp_path,
                                                                              monkeypatch):
    """Timed by wall time at 2 threads while another process held one of the 2 cores: this
    process uses the winner, the file does not get it; a later process on free cores (others
    under ``team.BUSY_SLACK``, or unknown) measures it again and writes it."""
    monkeypatch.setattr(tune, "_threads", lambda: (2, 2))
    monkeypatch.setattr(team, "cores", lambda: [0, 1])
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    t.watch = _watch(1.0)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert t.unsteady == 1 and not (tmp_path / "tuning.json").exists()
    calls = len(t.timer.calls)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot" and len(t.timer.calls) == calls
    for others in (0.2, None):
        (tmp_path / "tuning.json").unlink(missing_ok=True)
        later = tune.Tuner(path=t.path, timer=FakeTimer(numba=1e-3, blas=2e-3),
                           watch=_watch(others))
        monkeypatch.setattr(tune, "TUNER", later)
        assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot_block_kernel"
        choices = json.loads((tmp_path / "tuning.json").read_text())["choices"]
        assert list(choices.values()) == ["numba"] and later.unsteady == 0
        assert list(choices)[0].endswith("| threads 2/2")


def test_more_threads_than_the_process_has_cores_is_steady_on_idle_cores(tmp_path,
                                                                         monkeypatch):
    """Numba's 2 threads where the process may run on one core (``taskset -c 1``, a container's
    cpuset): a run has at most that core, and the cores are idle: the choice is written. It was
    unsteady whatever the load (team_size(2, 1, 0.0) is 1), measured again in every run, its
    winner and so the bits differing from run to run. Another process keeping that core busy
    still makes it unsteady."""
    monkeypatch.setattr(tune, "_threads", lambda: (2, 1))
    monkeypatch.setattr(team, "cores", lambda: [1])
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    t.watch = _watch(0.0)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert t.unsteady == 0 and (tmp_path / "tuning.json").exists()
    (tmp_path / "tuning.json").unlink()
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    t.watch = _watch(1.0)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert t.unsteady == 1 and not (tmp_path / "tuning.json").exists()


def test_a_one_thread_choice_timed_on_busy_cores_is_written(tmp_path, monkeypatch):
    """At one thread the timer is the calling thread's CPU time: the time other processes take
    is not counted, so the choice is written."""
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    t.watch = _watch(1.0)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert t.unsteady == 0 and (tmp_path / "tuning.json").exists()


def test_the_default_watch_reads_other_processes_time_over_a_window_of_ticks(monkeypatch):
    """``/proc/stat`` counts in 10 ms ticks: a class's rounds shorter than ``WINDOW_S`` are
    judged over a window reaching back to an earlier look."""
    looks = iter([(0.0, 0.0, 0.0), (0.05, 0.0, 0.05), (0.10, 0.0, 0.08), (0.30, 0.1, 0.28),
                  (0.40, 0.15, 0.38)])           # (busy, own, wall) seconds
    monkeypatch.setattr(team, "snapshot", lambda cores: next(looks))
    watch, ran = tune._Watch(), []
    assert watch(lambda: ran.append(1)) == pytest.approx(1.0) and ran == [1]   # from 0.0
    assert watch(lambda: None) == pytest.approx(1.25)     # to 0.08: all since the first look
    assert watch(lambda: None) == pytest.approx(0.5)      # to 0.28: from 0.08
    assert watch(lambda: None) == pytest.approx(0.5)      # to 0.38: from 0.08, not 0.28
    monkeypatch.undo()
    assert tune.Tuner(timer=FakeTimer()).watch is tune._unwatched
    assert isinstance(tune.Tuner().watch, tune._Watch)


def test_a_process_keeps_its_choice_when_another_process_writes_the_class(tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=1e-3, blas=2e-3))
    t.spent = tune.BUDGET_S             # guessed: the rules
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot_block_kernel"
    other = tune.Tuner(path=t.path, timer=FakeTimer(numba=2e-3, blas=1e-3))
    monkeypatch.setattr(tune, "TUNER", other)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"               # measured: BLAS
    monkeypatch.setattr(tune, "TUNER", t)
    t.spent = 0.0
    _matmul(64, 300, 1000, tb=True)     # measured and saved: the file (and BLAS for m16) merged
    assert "blas" in t.choices.values() and t.timer.calls
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot_block_kernel"  # still the guess


def test_building_a_plan_starts_a_new_measuring_budget(monkeypatch):
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    calls = []
    monkeypatch.setattr(tune, "begin_model", lambda collective=False: calls.append(collective))
    model = mlp((4, 8, 3))
    TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))(np.zeros((2, 4), np.float32),
                                                               np.array([0, 1]))
    assert calls == [False]             # one process: no collective


def test_under_mpiexec_rank_0_measures_and_every_rank_uses_its_choice(tmp_path, monkeypatch):
    """Rank 0 decides and broadcasts (``distributed.broadcast_object``); another rank measures
    nothing, writes nothing and takes what it is sent."""
    sent = []
    monkeypatch.setattr(distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "broadcast_object",
                        lambda obj, what: sent.append(obj) or "blas")
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    t = _tuner(tmp_path, monkeypatch, FakeTimer())
    tune.begin_model(collective=True)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot"
    assert sent == [None] and t.timer.calls == [] and not (tmp_path / "tuning.json").exists()
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, blas=1e-3))
    tune.begin_model(collective=True)
    _matmul(16, 300, 1000, tb=True)
    assert sent[-1] == "blas" and (tmp_path / "tuning.json").exists()
    sent.clear()        # a plan this rank builds alone (an evaluation graph): no collective
    t = _tuner(tmp_path / "alone", monkeypatch, FakeTimer(numba=1e-3, blas=2e-3))
    tune.begin_model(collective=False)
    assert _names(_matmul(16, 300, 1000, tb=True)[0]) == "dot_block_kernel"
    assert sent == [] and t.timer.calls


PRODUCTS = [  # (m, k, n, ta, tb): the MLPs' products and the rules' edges (test_executor's table)
    (3, 300, 1000, False, True), (16, 300, 1000, False, True), (7, 301, 1001, False, True),
    (3, 1000, 300, False, False), (16, 1000, 300, False, False), (1000, 2, 1100, True, False),
    (1001, 13, 1100, True, False), (64, 1, 128, True, False), (1024, 300, 256, True, False),
    (1024, 300, 256, True, True), (300, 300, 1024, False, True), (19, 64, 128, False, True),
    (1, 64, 128, False, True), (0, 64, 128, False, True), (64, 0, 128, True, False),
]


@pytest.mark.parametrize("dt", [float16, bfloat16, float32, float64], ids=lambda d: d.short)
@pytest.mark.parametrize("m,k,n,ta,tb", PRODUCTS)
@pytest.mark.parametrize("counted", [False, True], ids=["plain", "counted"])
def test_every_candidate_agrees_with_the_float64_oracle(monkeypatch, m, k, n, ta, tb, dt, counted):
    if counted and dt is float64:
        pytest.skip("the loss scaler counts half and float32 products")
    for value in ("numba", "mkl", "blas"):      # the rules' Numba steps, oneMKL's, BLAS alone
        if value == "mkl" and not mkl_gemm.available():
            continue                          # forcing it would raise (test_mkl_gemm)
        monkeypatch.setenv("MINIFLOW_MATMUL", value)
        _, out, ref = _matmul(m, k, n, dt, ta, tb, counted, seed=m + k + n)
        tol = {float16: 2e-2, bfloat16: 2e-2, float32: 1e-4, float64: 1e-12}[dt] * np.sqrt(k + 1)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


def test_the_blas_candidate_calls_blas_alone():
    node = Node(get_op("matmul"), [Value("a", (16, 300), float16), Value("b", (1000, 300), float16)],
                [Value("o", (16, 1000), float16)], {"transpose_b": True})
    ins = [np.zeros((16, 300), np.float16), np.zeros((1000, 300), np.float16)]
    steps = cpu_matmul.blas_steps(node, ins, [np.zeros((16, 1000), np.float16)])
    assert _names(steps) == "cast_kernel + cast_kernel + dot + cast_kernel"


def test_samples_keep_the_strides_of_views():
    """The tuner times the candidates on arrays laid out as the plan's (a transposed view, a
    block of a bigger buffer), not on contiguous copies."""
    base = np.zeros((6, 8), np.float32)
    views = [base.T, base[:, 2:5], base[::2], np.zeros((0, 3), np.float16)]
    for view, sample in zip(views, tune._samples(views, np.random.default_rng(0))):
        assert sample.shape == view.shape and sample.strides == view.strides
        assert sample.dtype == view.dtype and (sample.size == 0 or np.abs(sample).max() > 0)


def test_one_thread_blas_is_a_candidate_where_blas_has_more_threads(tmp_path, monkeypatch):
    from threadpoolctl import threadpool_limits
    _tuner(tmp_path, monkeypatch, FakeTimer(numba=3e-3, blas=2e-3, **{"blas 1 thread": 1e-3}))
    monkeypatch.setattr(cpu_matmul, "CANDIDATES", {
        "numba": cpu_matmul.numba_steps, "blas": cpu_matmul.blas_steps,
        "blas 1 thread": cpu_matmul.blas_one_thread_steps})
    with threadpool_limits(2, user_api="blas"):
        if max(lib.num_threads for lib in tune.numpy_blas()) < 2:
            pytest.skip("NumPy's BLAS has one thread here")
        steps, out, ref = _matmul(256, 1024, 1024)
        assert _names(steps) == "dot (1 BLAS thread)"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    with threadpool_limits(1, user_api="blas"):
        assert cpu_matmul.blas_one_thread_steps(None, [], []) is None


def test_a_convolution_s_algorithm_and_its_gemms_are_measured_choices(tmp_path, monkeypatch):
    """Winograd against im2col per convolution class, and every GEMM of the chosen one (BLAS,
    BLAS on one thread, the register tile) per GEMM class; whatever wins, the result agrees
    with the direct convolution (float64)."""
    from miniflow.ops.conv import conv_sample_inputs
    from op_cases import Case, host_buffers, make_node
    t = _tuner(tmp_path, monkeypatch, FakeTimer(winograd=3e-3, im2col=1e-3, blas=2e-3,
                                                tile=1e-3, **{"blas 1 thread": 2e-3}))
    a = {"kernel_size": 3, "strides": 1, "padding_before": 1, "dilation_rate": 1, "groups": 1}
    x, w, _ = conv_sample_inputs(np.float32, 4, 8, 16, 16, 64, a)
    node = make_node(Case("conv2d", [x, w], a))
    ins, outs = host_buffers(Case("conv2d", [x, w], a), node)
    steps = builder_for(node.op)(node, ins, outs)
    names = _names(steps)
    assert "im2col_kernel" in names and "winograd" not in names and "outer_block_kernel" in names
    [conv] = [name for key, name in t.choices.items() if key.startswith("conv ")]
    gemms = {name for key, name in t.choices.items() if key.startswith("gemm ")}
    assert conv == "im2col" and "tile" in gemms      # Winograd's GEMMs were measured too
    for fn, args in steps:
        fn(*args)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + 16, j:j + 16], w64[:, :, i, j])
              for i in range(3) for j in range(3))
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)


@requires_mpi
def test_under_a_real_mpiexec_one_rank_measures_and_every_rank_builds_its_choice(tmp_path):
    rc, output, _ = run_mpi("tuning.py", 2, tmp_path)
    assert rc == 0, output
    ranks = rank_results(tmp_path, 2)
    assert [i["kernels"] for i in ranks] == ["dot", "dot"]        # rank 0's choice: BLAS
    assert ranks[0]["timed"] > 0 and ranks[1]["timed"] == 0
    assert [i["file"] for i in ranks] == [True, False]
    assert [i["choices"] for i in ranks] == [["blas"], ["blas"]]
    assert [i["echo"] for i in ranks] == [{"from": 0}, {"from": 0}]


def test_rank_0_measuring_alone_broadcasts_no_nested_choice(tmp_path, monkeypatch):
    """A candidate whose steps choose a class of their own (a Winograd convolution's products):
    rank 0, measuring the candidates while the other ranks wait for its broadcast, broadcast the
    nested choices too, which reached the ranks waiting for the outer one (``mpiexec -n 2
    miniflow train --ddp --model lenet`` on a machine with no cached choices: ``KeyError:
    'blas'`` on rank 1). Only the outer choice, and the nested one of the winner that every
    rank then builds, are broadcast, in the order every rank calls them."""
    sent = []
    monkeypatch.setattr(distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    monkeypatch.setattr(distributed, "broadcast_object",
                        lambda obj, what: sent.append((what.split(" | ")[0], obj)) or obj)
    t = _tuner(tmp_path, monkeypatch, FakeTimer(fast=1e-3, slow=2e-3, inner_a=1e-3,
                                                inner_b=2e-3))
    tune.begin_model(collective=True)
    a = np.zeros(4, np.float32)

    def step(name):
        def fn(x):
            pass
        fn.__name__ = name
        return [(fn, (a,))]

    def with_inner(name):           # a candidate that chooses a nested class when built
        def build(node, ins, outs):
            return step(name) + tune.choose("inner", "k", None, [a], [a], {
                "inner_a": lambda n, i, o: step("inner_a"),
                "inner_b": lambda n, i, o: step("inner_b")})
        return build

    steps = tune.choose("outer", "k", None, [a], [a], {"slow": with_inner("slow"),
                                                       "fast": with_inner("fast")})
    assert [fn.__name__ for fn, _ in steps] == ["fast", "inner_a"]
    assert sent == [("the kernel choice for inner k", "inner_a"),   # building the rules' steps
                    ("the kernel choice for outer k", "fast"),
                    ("the kernel choice for inner k", "inner_a")]   # building the winner's
    assert t.collective
