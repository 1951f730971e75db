"""The cuda backend end to end (under the simulator, or on a GPU): selection, device residency,
training steps that match the cpu backend (fp32 SGD; AMP with a dynamic loss scale and Adam),
clear errors; data parallel on two ranks (``mpiexec -n 2``)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.runtime.backend import BACKENDS, cuda_status, default_backend_name, get_backend

from cuda_cases import (TRAIN_X, TRAIN_Y, TRAINING, all_cases, case_signatures, step_signatures,
                        train_graph, training_signatures)
from mpi_harness import rank_results, requires_mpi, run_mpi

@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    mf.set_backend("cpu")


def test_default_backend_is_cpu_under_the_simulator_and_cuda_on_a_gpu(monkeypatch):
    monkeypatch.delenv("MINIFLOW_BACKEND", raising=False)
    simulated = cuda_status() == (True, "CUDA simulator")
    assert default_backend_name() == ("cpu" if simulated else "cuda")
    monkeypatch.setenv("MINIFLOW_BACKEND", "cuda")
    assert default_backend_name() == "cuda"


def _train(backend: str, steps: int, **options):
    """Steps of ``cuda_cases.train_graph`` on ``backend``: (losses, parameters, graph, model);
    a loss is the mean of the micro-batch losses when the graph accumulates."""
    mf.set_backend(backend)
    graph, model = train_graph(**options)
    losses = [float(graph(TRAIN_X, TRAIN_Y).numpy().mean()) for _ in range(steps)]
    return losses, [p.numpy() for p in model.parameters()], graph, model


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_training_steps_match_the_cpu_backend(name):
    options = TRAINING[name]
    cpu_losses, cpu_params, _, _ = _train("cpu", 3, **options)
    losses, params, graph, model = _train("cuda", 3, **options)
    tol = 2e-3 if options["amp"] else 1e-5
    np.testing.assert_allclose(losses, cpu_losses, rtol=tol, atol=tol)
    for p, q in zip(params, cpu_params):
        np.testing.assert_allclose(p, q, rtol=tol, atol=tol)
    backend = get_backend()
    assert all(backend.owns(p._data) for p in model.parameters()), "parameters live on the device"
    compiled = {**case_signatures(all_cases()), **training_signatures()}
    for plan in graph.plans.values():
        for fn, args in plan.steps:          # kernels get device arrays only: no host copies
            arrays = [a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")]
            arrays += [x for a in args if isinstance(a, tuple) for x in a    # not scalars:
                       if hasattr(x, "dtype") and not isinstance(x, np.generic)]   # scalar_args
            assert all(backend.owns(a) for a in arrays), fn
        # every kernel signature launched here is one the PTX lane compiles
        launched = step_signatures(plan.steps)
        missing = sorted(f"{label}{key[1]}" for key, label in launched.items()
                         if key not in compiled)
        assert not missing, f"the PTX lane does not compile: {missing}"


def test_eager_ops_run_on_the_device():
    mf.set_backend("cuda")
    t = mf.tensor(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32))
    u = (t * 2.0).relu().sum(axis=1)
    assert get_backend().owns(u._data)
    np.testing.assert_allclose(u.numpy(), [2.0, 7.0])


class _Assign(mf.nn.Graph):
    def build(self, x, v):
        y = x * 1.0
        y[:, 1::2] = v           # op slice_update
        return y


def test_item_assignment_on_the_device_eager_and_in_a_graph():
    """``x[key] = v`` of an eager tensor writes its device memory in place; in a graph op
    ``slice_update`` (a flat copy, then a strided scatter) gives the cpu backend's values."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.array([-1.0, -2.0], np.float32)
    want = x.copy()
    want[:, 1::2] = v
    mf.set_backend("cuda")
    t = mf.tensor(x)
    data = t._data
    t[:, 1::2] = mf.tensor(v)
    assert t._data is data and get_backend().owns(data)
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(_Assign()(x, mf.tensor(v)).numpy(), want)


def test_a_model_from_another_backend_is_a_clear_error():
    mf.set_backend("cpu")
    model = mlp((8, 16, 3))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    mf.set_backend("cuda")
    with pytest.raises(TypeError, match=r"variable %.*numpy.ndarray.*'cuda' backend.*"
                                        r"set_backend\('cuda'\)"):
        graph(TRAIN_X, TRAIN_Y)
    t = mf.tensor(np.ones(2, np.float32))
    mf.set_backend("cpu")
    with pytest.raises(TypeError, match="exp: input 0 holds"):
        t.exp()


def test_cuda_is_registered():
    assert "cuda" in BACKENDS and mf.set_backend("cuda").name == "cuda"


@pytest.mark.parametrize("op,inputs,attrs", [
    ("matmul", [np.random.default_rng(0).uniform(-1, 1, (2, 3)),
                np.random.default_rng(1).uniform(-1, 1, (3, 2))], {"transpose_a": False}),
    ("log_softmax", [np.random.default_rng(2).uniform(-1, 1, (2, 3))], {}),
], ids=["matmul", "log_softmax"])
def test_float64_gradient_check_on_the_cuda_backend(op, inputs, attrs):
    """float64 kernels are exact enough for finite-difference gradient checks, as on the CPU."""
    from miniflow.testing import check_grad, gradient_graph
    mf.set_backend("cuda")
    check_grad(op, inputs, attrs)
    _, plan, _ = gradient_graph(op, inputs, attrs)
    compiled = case_signatures(all_cases())
    missing = sorted(f"{label}{key[1]}" for key, label in step_signatures(plan.steps).items()
                     if key not in compiled)
    assert not missing, f"the PTX lane does not compile: {missing}"


@requires_mpi
def test_data_parallel_on_two_ranks_matches_the_cpu_backend(tmp_path):
    """``mpiexec -n 2`` AMP training on the cuda backend: the all-reduces staged through host
    buffers and the compile-time broadcast (device -> host -> device) give bitwise equal ranks,
    and the cpu backend's numbers."""
    results = {}
    for backend in ("cpu", "cuda"):
        (tmp_path / backend).mkdir()
        rc, output, _ = run_mpi("training.py", 2, tmp_path / backend, "tiny", timeout=300,
                                env={"MINIFLOW_BACKEND": backend})
        assert rc == 0, output
        results[backend] = [(info, dict(np.load(tmp_path / backend / f"rank{r}.npz")))
                            for r, info in enumerate(rank_results(tmp_path / backend, 2))]
    for backend, ((i0, v0), (i1, v1)) in results.items():
        assert i0["backend"] == i1["backend"] == backend
        assert i0["scales"] == i1["scales"]
        assert v0.keys() == v1.keys() and all(v0[k].tobytes() == v1[k].tobytes() for k in v0)
    (cpu, cpu_vars), _ = results["cpu"]
    (cuda, cuda_vars), _ = results["cuda"]
    np.testing.assert_allclose(cuda["losses"], cpu["losses"], rtol=2e-3, atol=2e-3)
    assert cuda["scales"] == cpu["scales"]
    for k, v in cpu_vars.items():
        np.testing.assert_allclose(cuda_vars[k], v, rtol=2e-3, atol=2e-3, err_msg=k)


@pytest.mark.skipif(cuda_status() == (True, "CUDA simulator"),
                    reason="a real GPU: the simulator has neither packed launches nor graphs")
@pytest.mark.parametrize("name", sorted(TRAINING))
def test_cuda_graph_and_packed_launches_give_the_dispatchers_bits(name, monkeypatch):
    """On a real GPU: the plan captured as one CUDA graph, and as packed launches, trains bit for
    bit as numba-cuda's dispatcher called at every step (``runtime.cuda.prepare``)."""
    from miniflow.runtime import cuda as runtime
    results = {}
    for path in ("dispatcher", "packed", "graph"):
        monkeypatch.setattr(runtime, "GRAPHS", [path == "graph"])
        if path == "dispatcher":
            monkeypatch.setattr(runtime, "prepare", lambda steps, stream: (
                list(steps), list(range(len(steps))), "dispatcher calls"))
        losses, params, graph, _ = _train("cuda", 3, **TRAINING[name])
        results[path] = losses, params
        how = next(iter(graph.plans.values())).how
        assert how == {"dispatcher": "dispatcher calls", "graph": "one CUDA graph"}.get(
            path, how) and (path != "packed" or how.startswith("packed launches")), how
        monkeypatch.undo()
    for path in ("packed", "graph"):
        assert results[path][0] == results["dispatcher"][0], path
        for a, b in zip(results[path][1], results["dispatcher"][1]):
            assert a.tobytes() == b.tobytes(), path
