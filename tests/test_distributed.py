"""miniflow.distributed: the one-process world, the step builders' checks, bucketing (against
PyTorch's rule when it is installed) and, under ``mpiexec -n 2`` (and 3), the collectives'
numerics, the failure behaviour (excepthook abort, a SIGKILLed rank, a rank that left early, a
dead launcher) and the mismatch check. The MPI tests skip only without the ``dist`` extra."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from miniflow import distributed as dist
from mpi_harness import (alive, child_env, finish, kill_a_rank, kill_ranks, launch, rank_results,
                         requires_mpi, run_mpi, wait_for_files)

LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MINIFLOW_DIST_TIMEOUT")


@pytest.fixture
def fresh(monkeypatch):
    """No world yet and no launcher in the environment (restored afterwards)."""
    monkeypatch.setitem(dist._STATE, "world", None)
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


# ----------------------------------------------------------------------------- one process
def test_world_of_one_process_without_a_launcher(fresh):
    assert not dist.is_initialized()
    hook = sys.excepthook
    dist.init()
    world = dist._STATE["world"]
    assert dist.is_initialized() and dist.rank() == 0 and dist.world_size() == 1
    assert dist.local_world_size() == 1
    assert world.comm is None and world.watch is None and sys.excepthook is hook
    dist.init()
    assert dist._STATE["world"] is world                  # idempotent
    dist.barrier()
    dist.check_same_across_ranks("anything", "parameters")
    dist.check_same_values([0.1], lambda: ["optimizer 0 group 0 lr"], "learning rates")
    assert dist.same_values([0.1, 2.0]) and dist.all_gather_object(True, "flags") == [True]


def test_torch_distributed_names_set_up_and_query_the_mpi_world(fresh):
    """nanoGPT's ``init_process_group(backend="nccl")``, ``get_rank()``, ``get_world_size()``
    and ``destroy_process_group()`` were bare AttributeErrors: they are :func:`init`, ``rank``,
    ``world_size`` and a no-op; a backend, world size or argument miniflow cannot honour is a
    ValueError naming it."""
    import datetime
    with pytest.raises(RuntimeError, match="call miniflow.distributed.init"):
        dist.get_rank()
    with pytest.raises(ValueError, match=r"backend 'ucc' is not one of \('mpi', 'gloo', 'nccl'\)"):
        dist.init_process_group("ucc")
    with pytest.raises(ValueError, match=r"\['init_method'\] are not taken"):
        dist.init_process_group("nccl", init_method="env://")
    assert not dist.is_initialized()
    dist.init_process_group(backend="nccl", timeout=datetime.timedelta(seconds=30))
    assert (dist.get_rank(), dist.get_world_size(), dist.is_initialized()) == (0, 1, True)
    with pytest.raises(ValueError, match="world_size=4 but mpiexec started this process as "
                                         "world_size 1"):
        dist.init_process_group(world_size=4)
    dist.destroy_process_group()


def test_the_announced_world_size_comes_from_the_launchers_variables(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert dist.announced_world_size() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert dist.announced_world_size() == 3
    monkeypatch.setenv("PMI_SIZE", "2")                  # MPICH's, read first
    assert dist.announced_world_size() == 2


def test_one_process_world_does_not_import_mpi():
    code = ("import sys; from miniflow import distributed as d; d.init(); "
            "print(d.world_size(), 'mpi4py.MPI' in sys.modules)")
    env = {k: v for k, v in child_env().items() if k not in LAUNCHER_VARS}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.stdout.split() == ["1", "False"], res.stderr


@pytest.mark.parametrize("call", [dist.rank, dist.world_size, dist.local_world_size, dist.barrier])
def test_queries_before_init_raise(fresh, call):
    with pytest.raises(RuntimeError, match=rf"distributed\.{call.__name__}: .*call "
                                           r"miniflow\.distributed\.init\(\) first"):
        call()


def test_steps_before_init_raise(fresh):
    with pytest.raises(RuntimeError, match=r"allreduce_mean_step: .*init\(\) first"):
        dist.allreduce_mean_step([np.zeros(3, np.float32)])


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), "soon", None])
def test_init_rejects_a_bad_timeout(fresh, monkeypatch, timeout):
    if timeout is None:
        monkeypatch.setenv("MINIFLOW_DIST_TIMEOUT", "ten")
        match = r"^miniflow: MINIFLOW_DIST_TIMEOUT='ten' is not a positive number of seconds: "
    else:
        match = rf"timeout \(init\(timeout=\.\.\.\)\) must be a positive number .*got {timeout!r}"
    with pytest.raises(ValueError, match=match):
        dist.init(timeout=timeout)
    assert not dist.is_initialized()


def test_launcher_without_mpi4py_is_an_error(fresh, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)        # import mpi4py fails
    with pytest.raises(RuntimeError, match=r"started by an MPI launcher \(world size 2\) but "
                                           r"mpi4py is not installed.*miniflow\[dist\]"):
        dist.init()
    assert not dist.is_initialized()


def test_launcher_of_one_process_without_mpi4py_is_a_one_process_world(fresh, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    dist.init()
    assert dist.world_size() == 1


@requires_mpi
def test_launcher_of_another_mpi_is_an_error():
    """Open MPI's launcher variables, but mpi4py's MPICH sees a world of 1 (a singleton)."""
    env = {k: v for k, v in child_env().items() if k not in LAUNCHER_VARS}
    env.update(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2")
    res = subprocess.run([sys.executable, "-c", "from miniflow import distributed as d; d.init()"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "the launcher started 2 processes but mpi4py's MPI (MPICH" in res.stderr
    assert "sees a world of 1" in res.stderr


def test_steps_in_a_one_process_world_are_the_identity(fresh):
    dist.init()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(5).astype(np.float16), rng.standard_normal((2, 3)).astype(np.float16)]
    before = [a.copy() for a in arrays]
    counts = np.array([3, 4], np.int64)
    for fn, args in (dist.allreduce_mean_step(arrays), dist.allreduce_sum_int64_step(counts),
                     dist.broadcast_step(arrays)):
        fn(*args)
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(counts, [3, 4])


@pytest.mark.parametrize("arrays, error, match", [
    ([], ValueError, r"allreduce_mean_step: got no arrays"),
    ([[1.0, 2.0]], TypeError, r"array 0 is a builtins\.list, not a NumPy array.*stage device"),
    ([np.zeros((4, 4), np.float32)[:, ::2]], ValueError,
     r"array 0 \(shape \[4, 2\], strides \(16, 8\)\) is not C-contiguous"),
    ([np.zeros(3, np.int64)], TypeError, r"array 0 has dtype int64, expected float16 or bfloat16 "
                                         r"or float32 or float64"),
    ([np.zeros(3, np.float32), np.zeros(2, np.float16)], TypeError,
     r"a bucket holds one dtype; array 0 is float32 but array 1 is float16 \(group the arrays "
     r"with compute_bucket_assignment_by_size\)"),
])
def test_allreduce_mean_step_rejects_bad_buffers(fresh, arrays, error, match):
    dist.init()
    with pytest.raises(error, match=match):
        dist.allreduce_mean_step(arrays)


def test_steps_with_outputs_in_a_one_process_world(fresh):
    dist.init()
    src = [np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)]
    src[0].flags.writeable = False                         # only read when out is given
    dst = [np.zeros(3, np.float32), np.zeros((2, 2), np.float32)]
    fn, args = dist.allreduce_mean_step(src, out=dst)
    fn(*args)
    for a, o in zip(src, dst):
        np.testing.assert_array_equal(o, a)
    count, total = np.array([2], np.int64), np.zeros(1, np.int64)
    fn, args = dist.allreduce_sum_int64_step(count, out=total)
    fn(*args)
    assert total.tolist() == [2]


@pytest.mark.parametrize("out, match", [
    ([np.zeros(3, np.float32)], r"allreduce_mean_step: got 2 arrays but 1 outputs"),
    ([np.zeros(3, np.float32), np.zeros(4, np.float32)],
     r"allreduce_mean_step: output 1 is float32\[4\] but array 1 is float32\[2, 2\]"),
    ([np.zeros(3, np.float32), np.zeros((2, 2), np.float64)],
     r"output 1 is float64\[2, 2\] but array 1 is float32\[2, 2\]"),
])
def test_outputs_must_match(fresh, out, match):
    dist.init()
    with pytest.raises(ValueError, match=match):
        dist.allreduce_mean_step([np.zeros(3, np.float32), np.zeros((2, 2), np.float32)], out=out)


def test_steps_reject_read_only_and_wrong_dtype(fresh):
    dist.init()
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"allreduce_mean_step: array 0 \(shape \[3\]\) is read-only"):
        dist.allreduce_mean_step([ro])
    with pytest.raises(TypeError, match=r"allreduce_sum_int64_step: array 0 has dtype int32, "
                                        r"expected int64"):
        dist.allreduce_sum_int64_step(np.zeros(2, np.int32))
    dist.broadcast_step([ro], root=0)          # the root only reads its arrays
    for root in (1, -1, True, 0.0):
        with pytest.raises(ValueError, match=rf"broadcast_step: root must be a rank in \[0, 0\], "
                                             rf"got {root!r}"):
            dist.broadcast_step([np.zeros(2)], root=root)


def test_check_same_across_ranks_takes_strings(fresh):
    dist.init()
    with pytest.raises(TypeError, match=r"check_same_across_ranks: signature must be a str, got list"):
        dist.check_same_across_ranks(["a"], "parameters")
    with pytest.raises(TypeError, match=r"check_same_across_ranks: what must be a str, got int"):
        dist.check_same_across_ranks("a", 3)


# ----------------------------------------------------------------------------- buckets
MiB = 2 ** 20


def test_bucket_assignment_by_size():
    f32, f16 = np.float32, np.float16
    specs = [((1024,), f32), ((512,), f16), ((1024,), f32), ((3000,), f32), ((10,), f16),
             ((1,), f32)]
    # cap 8 KiB: a bucket closes once it holds >= 8192 bytes; per dtype; ordered by first index
    assert dist.compute_bucket_assignment_by_size(specs, 8192 / MiB) == [[0, 2], [1, 4], [3], [5]]
    assert dist.compute_bucket_assignment_by_size(specs) == [[0, 2, 3, 5], [1, 4]]
    assert dist.compute_bucket_assignment_by_size([((3, 0), f32), ((2, 2), "float64")]) == [[0], [1]]
    assert dist.compute_bucket_assignment_by_size([]) == []
    # a ~25 MiB default: 10 float32 arrays of 1M elements (4 MiB) -> buckets of 7 (28 MiB) and 3
    big = [((1 << 20,), f32)] * 10
    assert dist.compute_bucket_assignment_by_size(big) == [list(range(7)), [7, 8, 9]]


@pytest.mark.parametrize("cap", [0, -1, float("inf"), "25", True, None])
def test_bucket_assignment_rejects_a_bad_cap(cap):
    with pytest.raises(ValueError, match=rf"bucket_cap_mb must be a positive number of MiB, "
                                         rf"got {cap!r}"):
        dist.compute_bucket_assignment_by_size([((1,), np.float32)], cap)


def test_bucket_assignment_matches_pytorch():
    torch = pytest.importorskip("torch")
    tdist = pytest.importorskip("torch.distributed")
    if not tdist.is_available():
        pytest.skip("this PyTorch build has no torch.distributed")
    rng = np.random.default_rng(0)
    dtypes = [(np.float32, torch.float32), (np.float16, torch.float16), (np.float64, torch.float64)]
    for trial in range(20):
        sizes = rng.integers(0, 5000, rng.integers(1, 30))
        kinds = rng.integers(0, 3, len(sizes))
        cap = int(rng.integers(100, 40000))
        specs = [((int(s),), dtypes[k][0]) for s, k in zip(sizes, kinds)]
        tensors = [torch.empty(int(s), dtype=dtypes[k][1]) for s, k in zip(sizes, kinds)]
        expected, _ = tdist._compute_bucket_assignment_by_size(tensors, [cap], [False] * len(tensors))
        assert dist.compute_bucket_assignment_by_size(specs, cap / MiB) == \
            [list(b) for b in expected], (trial, cap, sizes, kinds)


# ----------------------------------------------------------------------------- under mpiexec
def _mean(stack: np.ndarray) -> np.ndarray:
    """The oracle: NumPy's mean over the ranks (float32 intermediates for float16)."""
    return np.mean(stack, axis=0)


@requires_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_collectives(tmp_path, n):
    rc, output, _ = run_mpi("collectives.py", n, tmp_path)
    assert rc == 0, output
    data = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(n)]
    info = rank_results(tmp_path, n)
    outs = [k for k in data[0] if k.startswith("out_")]
    # 19 arrays in the 6 float buckets, 8 in the 2 of views, 12 in the 3 with outputs,
    # 6 gradients, 2 counts, a bucket of 2 counts
    assert len(outs) == 49
    for key in outs:
        got = [d[key] for d in data]
        for r in range(1, n):     # bitwise identical on every rank (nan too)
            assert got[r].dtype == got[0].dtype and got[r].tobytes() == got[0].tobytes(), (key, r)
        inputs = np.stack([d["in_" + key[4:]] for d in data])
        if key.startswith("out_count"):
            np.testing.assert_array_equal(got[0], inputs.sum(axis=0))
        elif n == 2:               # one addition: exactly NumPy's mean, bit for bit
            np.testing.assert_array_equal(got[0], _mean(inputs), err_msg=key)
        else:                      # MPI's summation order: to the dtype's rounding
            tol = {np.float16: 1e-3, np.float32: 1e-6, np.float64: 1e-14}[got[0].dtype.type]
            np.testing.assert_allclose(got[0], _mean(inputs), rtol=tol, atol=tol, err_msg=key)
    for key in (k for k in data[0] if k.startswith("unchanged_")):   # out=: inputs only read
        for d in data:
            assert d[key].tobytes() == d["in_" + key[len("unchanged_"):]].tobytes(), key
    edge = data[0]["out_f16_5"]
    assert edge.dtype == np.float16
    # 60000 and 62016: their float16 sum overflows, their mean does not; inf and nan spread
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(60000) + np.float16(62016))
    if n == 2:
        assert abs(float(edge[0]) - 61008) <= 16 and np.isinf(edge[5]) and np.isnan(edge[6])
    for r in range(n):
        for k, value in enumerate([np.full((2, 3), 0), np.arange(5) + 0, [0, 0], [[True]]]):
            np.testing.assert_array_equal(data[r][f"bcast0_{k}"], value)
        np.testing.assert_array_equal(data[r]["bcastlast_0"], np.full(4, 10.0 * (n - 1)))
        assert data[r]["bcast0_1"].dtype == np.float16 and data[r]["bcast0_3"].dtype == bool
    for i in info:
        assert i["world_size"] == n and i["bucket_plan"] == [[0, 2], [1, 3], [4], [5]]
        assert i["step_name_f16"] == "all_reduce_mean"
        assert i["step_name_countpair"] == "all_reduce_sum" and i["local_world_size"] == n
        assert i["alloc_peak_bytes"] < 64 * 1024, i      # the staged buckets are 4 and 2 MiB
        assert i["big_mean"] == [(n - 1) / 2] * 2
        for name in ("f32_views", "f64_views"):     # a staging buffer would take 400/800 KB
            assert i[f"build_peak_bytes_{name}"] < 64 * 1024 and i[f"outside_kept_{name}"], i
        assert i["barrier_wait_s"] > 0.9
        if i["rank"] != 0:         # waited about 1 s, sleeping rather than busy polling
            assert i["barrier_cpu_s"] < 0.3, i


@requires_mpi
def test_uncaught_exception_aborts_every_rank(tmp_path):
    rc, output, seconds = run_mpi("failures.py", 2, tmp_path, "raise", timeout=60)
    assert rc != 0 and seconds < 30, (rc, seconds, output)
    assert "miniflow.distributed: rank 1 of 2: uncaught ValueError; aborting all 2 ranks" in output
    assert "[rank 1] ValueError: injected failure on rank 1" in output
    assert '[rank 1]   File "' in output                  # the traceback, line by line


@requires_mpi
def test_sigkilled_rank_ends_the_job(tmp_path):
    rc, output, seconds = kill_a_rank("failures.py", tmp_path, "loop")
    assert rc != 0 and seconds < 30, (rc, seconds, output)


@pytest.mark.slow
@requires_mpi
def test_rank_that_left_early_ends_the_job_after_the_timeout(tmp_path):
    rc, output, seconds = run_mpi("failures.py", 2, tmp_path, "early_exit", timeout=60)
    assert rc != 0 and 3 <= seconds < 30, (rc, seconds, output)
    assert ("rank 0 of 2: all_reduce_mean(float32, 1 arrays, 16 bytes) has waited more than 3 s "
            "for the other ranks") in output


@requires_mpi
def test_abort_ends_every_rank_with_its_code(tmp_path):
    rc, output, seconds = run_mpi("failures.py", 2, tmp_path, "abort", timeout=60)
    assert rc == 3 and seconds < 30, (rc, seconds, output)
    assert "miniflow.distributed: rank 1 of 2: exiting with code 3; aborting all 2 ranks" in output


def test_abort_does_nothing_in_a_one_rank_world(fresh):
    dist.abort(3)                        # before init
    dist.init()
    dist.abort(3)
    assert dist.world_size() == 1


@requires_mpi
def test_dead_launcher_ends_the_ranks(tmp_path):
    proc = launch("failures.py", 2, tmp_path, "loop")
    wait_for_files([tmp_path / "pid0.json", tmp_path / "pid1.json"], proc)
    ids = [json.loads((tmp_path / f"pid{r}.json").read_text()) for r in range(2)]
    try:
        os.kill(ids[0]["ppid"], signal.SIGKILL)           # hydra's proxy: the ranks' parent
        deadline = time.monotonic() + 30
        while any(alive(i["pid"]) for i in ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(i["pid"]) for i in ids)
        finish(proc, timeout=30)   # the ranks' messages went to the dead proxy: nothing to read
    finally:
        kill_ranks([i["pid"] for i in ids])


@requires_mpi
def test_mismatch_is_reported_on_every_rank(tmp_path):
    rc, output, _ = run_mpi("failures.py", 2, tmp_path, "mismatch")
    assert rc == 0, output
    errors = rank_results(tmp_path, 2)
    assert errors[0] == errors[1]                           # every rank raised the same error
    head = "the parameters of graph TrainGraph differ across the 2 ranks: "
    assert set(errors[0]) == {"item", "more", "fewer"}      # "same" passed
    assert errors[0]["item"].startswith(
        head + "rank 1 differs from rank 0 at item 3: rank 1 has '2.weight f32[10, 256]', "
               "rank 0 has '2.weight f32[10, 128]'. Every rank must build the same graph")
    assert errors[0]["more"].startswith(
        head + "rank 1 has 5 items, rank 0 has 4 (the first item only rank 1 has: "
               "'4.weight f32[5, 10]')")
    assert errors[0]["fewer"].startswith(
        head + "rank 1 has 3 items, rank 0 has 4 (the first item only rank 0 has: "
               "'2.bias f32[10]')")
