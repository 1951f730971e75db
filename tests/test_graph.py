"""nn.Graph tracing, IR printing/verification, plan reuse, the flat hot path and eager mode, and
threads: one graph called, compiled or traced from several threads at once."""
import re
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.ir import Graph, VerifyError
from miniflow.ops import emitter, inference_calls
from miniflow.experiments.mlp import EvalGraph, TrainGraph, mlp
from miniflow.passes.autograd import AutogradState
from miniflow.amp import GradScaler

from graph_cases import Step, param_arrays, small_mlp, xy


def _train_graph(seed=0, hidden=8):
    mf.manual_seed(seed)
    model = mlp((4, hidden, 3))
    return model, TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def _batch(n=5, seed=0):
    r = np.random.default_rng(seed)
    return r.random((n, 4), dtype=np.float32), r.integers(0, 3, n).astype(np.int64)


def test_ir_printer_one_line_per_node_with_types():
    _, g = _train_graph()
    g(*_batch())
    text = str(g.ir)
    assert re.search(r"%\d+: f32\[5,8\] = matmul\(%x, %model\.0\.weight\) \{transpose_a=False, "
                     r"transpose_b=True\}", text), text
    assert "ones_like(%" in text and "sgd_update(%model.0.weight" in text
    assert "%model.2.bias: f32[3],  # variable" in text
    assert re.search(r"^    %c\d+: i64\[1\],  # constant \[0\]$", text, re.M), text  # skip_if
    body = [ln for ln in text.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert len([ln for ln in body if " = " in ln or "_update(" in ln]) == len(g.ir.nodes)


def test_verifier_names_the_node_and_prints_context():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (2, 3), mf.float32)
    y = emit("relu", x)
    emit("exp", y)
    g.nodes[1].outputs[0].shape = (3, 2)
    with pytest.raises(VerifyError, match=r"node 1 \(exp\).*infers f32\[2,3\]") as e:
        g.verify()
    assert "--> " in str(e.value) and "relu(%x)" in str(e.value)
    g2 = Graph()
    emit2 = emitter(g2)
    a = g2.add_input("a", (2,), mf.float32)
    late = emit2("negative", a)
    emit2("exp", a)
    g2.nodes.reverse()  # use before definition
    g2.nodes[0].inputs = [late]
    with pytest.raises(VerifyError, match="used before it is defined"):
        g2.verify()


def test_verifier_names_values_as_the_printer_does():
    """Undefined values print as ``%?<tag>`` (a tag may equal another value's printed number), and
    an op's inference error names the node's inputs by their printed names, not their tags."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (3,), mf.float32)
    a = emit("relu", x)
    emit("exp", emit("negative", a))      # tags 1, 2, 3: printed %0, %1, %2
    del g.nodes[1]                         # drop negative without rewiring exp
    with pytest.raises(VerifyError, match=r"node 1 \(exp\): input %\?2 is defined nowhere in the "
                                          r"graph .*replace_uses") as e:
        g.verify()
    assert "--> %1: f32[3] = exp(%?2)" in str(e.value)
    g = Graph()
    emit = emitter(g)
    a = emit("relu", g.add_input("x", (3,), mf.float32))
    b = emit("relu", g.add_input("y", (4,), mf.float32))
    emit("broadcast_mul", a, a).producer.inputs = [a, b]
    with pytest.raises(VerifyError, match=r"shapes \[3\] of %0 and \[4\] of %1 cannot be "
                                          r"broadcast"):
        g.verify()


def test_plan_reused_for_same_signature_and_new_plan_for_new_shape():
    _, g = _train_graph()
    g(*_batch(5))
    g(*_batch(5, seed=1))
    assert g.compile_count == 1
    g(*_batch(7))
    assert g.compile_count == 2 and len(g.plans) == 2


def test_plan_cache_keeps_at_most_8_lru():
    _, g = _train_graph()
    for n in range(1, 11):
        g(*_batch(n))
    assert len(g.plans) == 8
    sizes = [k[0][0][0] for k in g.plans]
    assert sizes == list(range(3, 11))


def test_variables_shared_between_plans_and_modules():
    model, g = _train_graph()
    w0 = model[0].weight.numpy()
    g(*_batch(5))
    w1 = model[0].weight.numpy()
    assert not np.array_equal(w0, w1)
    g(*_batch(6))  # a second plan updates the same storage
    assert not np.array_equal(w1, model[0].weight.numpy())
    eager = model(mf.tensor(_batch(2)[0])).numpy()
    graph_out = EvalGraph(model)(_batch(2)[0]).numpy()
    np.testing.assert_array_equal(eager, graph_out)


def test_hot_path_runs_no_inference_and_allocates_no_node_buffers():
    _, g = _train_graph(hidden=64)
    x, y = _batch(32)
    g(x, y)
    calls = inference_calls()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for _ in range(20):
        g(x, y)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert inference_calls() == calls
    # a single per-node buffer here is 32*64*4 = 8 KiB; the steady-state step must stay far below
    assert peak - base < 4096, peak - base


def test_print_ir_after_every_pass(capsys):
    _, g = _train_graph()
    g.config.debug(print_ir=True)
    g(*_batch())
    out = capsys.readouterr().out
    for name in ("trace", "autograd", "optimizer", "dead_code_elimination"):
        assert f"# IR after {name}" in out


def test_autograd_records_initial_grad_and_sums_fan_out():
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.add_optimizer(mf.optim.SGD(self.lin.parameters(), lr=0.1))

        def build(self, x):
            h = self.lin(x)
            loss = (h * h + h).sum()  # h fans out twice
            loss.backward()
            return loss

    g = G()
    g(np.ones((2, 3), np.float32))
    ir, initial_grad = g.ir, g.compile_context.state[AutogradState].initial_grad
    assert initial_grad.producer.op.name == "ones_like"
    assert initial_grad.producer.inputs[0] is ir.loss
    assert ir.count_ops().get("add_n", 0) >= 1


def test_inference_graph_has_no_backward_or_updates():
    model, _ = _train_graph()
    e = EvalGraph(model)
    e(_batch()[0])
    ops = e.ir.count_ops()
    assert "ones_like" not in ops and "sgd_update" not in ops


def test_state_dict_round_trip_and_checks():
    model, _ = _train_graph()
    sd = model.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert sd["0.weight"].shape == (8, 4)
    sd["0.bias"][:] = 7
    model.load_state_dict(sd)
    assert (model[0].bias.numpy() == 7).all()
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({"0.weight": sd["0.weight"]})
    bad = dict(sd)
    bad["0.weight"] = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="0.weight"):
        model.load_state_dict(bad)
    bad["0.weight"] = sd["0.weight"].astype(np.float64)
    with pytest.raises(ValueError, match="0.weight"):
        model.load_state_dict(bad)


def test_eager_tensor_api():
    a = mf.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = mf.tensor([0.5, -1.0])
    assert a.dtype is mf.float32
    np.testing.assert_allclose((a + b).numpy(), [[1.5, 1.0], [3.5, 3.0]])
    np.testing.assert_allclose((a @ a).numpy(), np.array([[7, 10], [15, 22]]))
    np.testing.assert_allclose((2 - a).numpy(), 2 - a.numpy())
    np.testing.assert_allclose((1 / a).numpy(), 1 / a.numpy(), rtol=1e-6)
    np.testing.assert_allclose(a.mean(axis=0).numpy(), [2, 3])
    np.testing.assert_allclose((-a).T.numpy(), -a.numpy().T)
    assert a.to(mf.float16).dtype is mf.float16
    np.testing.assert_allclose(nn.functional.softmax(a, dim=0).numpy().sum(0), [1, 1], rtol=1e-6)
    assert a.reshape(4).shape == (4,)
    with pytest.raises(RuntimeError, match="inside nn.Graph.build"):
        a.sum().backward()


def _run_threads(work, n_threads=2):
    """Run ``work(k)`` in ``n_threads`` threads started together, with a tiny GIL switch
    interval so that the threads interleave inside calls; re-raises a thread's exception."""
    barrier = threading.Barrier(n_threads)
    errors = []

    def run(k):
        barrier.wait()
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]

# ------------------------------------------------------------------------------ 2. threads
def _mlp_forward(model, x):
    """The MLP in float64 NumPy: the oracle of the eval graph."""
    (w1, b1, w2, b2) = [p.numpy().astype(np.float64) for p in model.parameters()]
    return np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2


def test_one_graph_called_from_two_threads_gives_every_call_its_own_result():
    model = small_mlp()
    g = EvalGraph(model)
    r = np.random.default_rng(1)
    inputs = [[r.random((3, 4), dtype=np.float32) for _ in range(8)] for _ in range(2)]
    expected = [[g(x).numpy() for x in xs] for xs in inputs]  # single-threaded results
    for xs, ys in zip(inputs, expected):
        for x, y in zip(xs, ys):
            np.testing.assert_allclose(y, _mlp_forward(model, x), rtol=1e-5, atol=1e-6)
    wrong = [0, 0]

    def work(k):
        for i in range(1500):
            if not np.array_equal(g(inputs[k][i % 8]).numpy(), expected[k][i % 8]):
                wrong[k] += 1

    _run_threads(work)
    assert wrong == [0, 0], f"wrong outputs per thread: {wrong} of 1500"
    assert g.compile_count == 1


def test_a_training_graph_with_a_scaler_from_two_threads_equals_the_same_steps_in_one_thread():
    """The same batch in every call: any order of the 2 x 150 steps is the same sequence, so the
    weights, the scaler's state and the multiset of losses must equal 300 steps in one thread."""
    x, y = xy(6)

    def make():
        model = small_mlp(3)
        scaler = GradScaler(init_scale=2.0 ** 20, growth_interval=5)
        return model, scaler, Step(model, mf.optim.Adam(model.parameters(), lr=1e-2), scaler,
                                   policy="fp32")

    model_1, scaler_1, step_1 = make()
    losses_1 = sorted(float(step_1(x, y).numpy()) for _ in range(300))
    model_2, scaler_2, step_2 = make()
    losses_2 = [[], []]
    _run_threads(lambda k: losses_2[k].extend(float(step_2(x, y).numpy()) for _ in range(150)))
    assert sorted(losses_2[0] + losses_2[1]) == losses_1
    for a, b in zip(param_arrays(model_1), param_arrays(model_2)):
        np.testing.assert_array_equal(a, b)
    assert scaler_2.state_dict() == scaler_1.state_dict()
    assert scaler_1.num_skipped_steps > 0  # the scale overflowed and backed off on the way
    state_1, state_2 = (s._optimizers[0].state_dict()["state"] for s in (step_1, step_2))
    for i, s in state_1.items():
        for k, v in s.items():
            np.testing.assert_array_equal(state_2[i][k], v)
    assert state_2[0]["step"][0] == 300 - scaler_2.num_skipped_steps


class _SlowBuild(EvalGraph):
    """An eval graph whose trace takes a while, so a second thread arrives in the middle of it."""

    def build(self, x):
        out = self.model(x)
        time.sleep(0.05)
        return out


def test_first_calls_from_two_threads_compile_in_turn():
    """Two new signatures at once: the second thread waits for the first one's trace (it used to
    see the other thread's tracer and fail as a nested call)."""
    model = small_mlp()
    g = _SlowBuild(model)
    xs = [np.random.default_rng(k).random((k + 2, 4), dtype=np.float32) for k in range(2)]
    outs = [None, None]

    def work(k):
        time.sleep(0.02 * k)  # thread 1 arrives while thread 0 traces
        outs[k] = g(xs[k]).numpy()

    _run_threads(work)
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out, _mlp_forward(model, x), rtol=1e-5, atol=1e-6)
    assert g.compile_count == 2


def test_a_graph_calling_itself_from_build_gets_the_nested_call_error_not_a_deadlock():
    class Recursive(nn.Graph):
        def build(self, x):
            return self(x)

    g = Recursive()
    with pytest.raises(RuntimeError, match="Recursive was called inside another graph's build"):
        g(np.ones(2, np.float32))
    free = []

    def try_lock():  # from another thread: the lock was released after the error
        free.append(g._lock.acquire(blocking=False))
        if free[-1]:
            g._lock.release()

    t = threading.Thread(target=try_lock)
    t.start()
    t.join()
    assert free == [True]



def test_two_graphs_tracing_at_the_same_time_in_two_threads_record_into_their_own_graph():
    both_in_build = threading.Barrier(2, timeout=30)

    class Scaled(nn.Graph):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def build(self, x):
            both_in_build.wait()          # the other thread is tracing its own graph now
            return x * self.factor

    graphs = [Scaled(2.0), Scaled(3.0)]
    x = np.arange(4, dtype=np.float32)
    results, errors = {}, []

    def call(g):
        try:
            results[g.factor] = g(x).numpy()
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=call, args=(g,)) for g in graphs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    np.testing.assert_array_equal(results[2.0], x * 2)
    np.testing.assert_array_equal(results[3.0], x * 3)
    assert [len(g.ir.nodes) for g in graphs] == [1, 1]
