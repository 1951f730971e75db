"""The digits MLP trains with AMP on the CPU backend (static loss scale 1024, the default "fp32"
loss-scale policy), and the run is really mixed precision."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import EvalGraph, TrainGraph, accuracy, mlp

pytestmark = pytest.mark.slow  # training runs (-m "not slow" skips them)


def _train(amp: bool, epochs: int, seed: int = 0):
    """SGD(0.1, momentum 0.9), batch 64; returns (graph, losses per step, test accuracy)."""
    mf.manual_seed(seed)
    data = load_digits()
    model = mlp((64, 128, data.num_classes))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if amp:
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.StaticGradScaler(1024.0))
    rng = np.random.default_rng(seed)
    losses = [float(graph(xb, yb)) for _ in range(epochs)
              for xb, yb in batches(data.x_train, data.y_train, 64, rng=rng)]
    return graph, losses, accuracy(EvalGraph(model), data.x_test, data.y_test)


@pytest.fixture(scope="module")
def amp_run():
    return _train(amp=True, epochs=20)


def test_amp_training_reaches_94_percent(amp_run):
    _, losses, acc = amp_run
    assert acc >= 0.94, acc
    assert losses[-1] < losses[0] / 5


def test_every_matmul_is_fp16_in_the_report_and_in_the_plan_buffers(amp_run):
    graph, _, _ = amp_run
    rows = [r for r in graph.amp_report().rows if r.op == "matmul"]
    assert len(rows) == 5 and all(r.color == "white" and r.dtype == "f16" for r in rows)
    for plan in graph.plans.values():
        matmuls = [n for n in plan.graph.nodes if n.op.name == "matmul"]
        assert matmuls and all(plan.buffers[n.outputs[0]].dtype == np.float16 for n in matmuls)
        for name, v in plan.graph.variables.items():  # master weights and momentum stay fp32
            if name.endswith(".float16_copy"):        # the fused updates' half weight copies
                assert plan.buffers[v].dtype == np.float16, name
            elif v.dtype.is_float and name != "optimizer0.learning_rate":  # the lr: f64[1]
                assert plan.buffers[v].dtype == np.float32, name


def test_amp_losses_differ_from_the_fp32_run(amp_run):
    _, amp_losses, _ = amp_run
    _, fp32_losses, _ = _train(amp=False, epochs=1)
    amp_losses = np.array(amp_losses[:len(fp32_losses)])
    assert not np.array_equal(amp_losses, fp32_losses)
    np.testing.assert_allclose(amp_losses[:5], fp32_losses[:5], rtol=2e-2)
