"""End-to-end training against an independent NumPy float64 oracle, and the digits accuracy bar."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.experiments.train import train_digits

from reference_mlp import adam_step, forward_backward, sgd_step

pytestmark = pytest.mark.slow  # training runs (-m "not slow" skips them)


def _setup(opt_factory, seed=3):
    mf.manual_seed(seed)
    model = mlp((64, 32, 10))
    params64 = [p.numpy().astype(np.float64) for p in model.parameters()]
    return model, TrainGraph(model, opt_factory(model.parameters())), params64


def _data(steps, bs=16):
    d = load_digits()
    it = batches(d.x_train, d.y_train, bs, rng=np.random.default_rng(0), drop_last=True)
    return [next(it) for _ in range(steps)]


def test_sgd_momentum_matches_numpy_float64_for_50_steps():
    model, graph, ref = _setup(lambda p: mf.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3))
    bufs = [np.zeros_like(p) for p in ref]
    for xb, yb in _data(50):
        loss = float(graph(xb, yb))
        ref_loss, grads = forward_backward(ref, xb.astype(np.float64), yb)
        sgd_step(ref, grads, bufs, 0.1, 0.9, 1e-3)
        assert loss == pytest.approx(ref_loss, rel=1e-4)
    for p, r in zip(model.parameters(), ref):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-3, atol=1e-5)


def test_adam_matches_numpy_float64():
    model, graph, ref = _setup(lambda p: mf.optim.Adam(p, lr=1e-2, weight_decay=1e-4))
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in ref]
    for t, (xb, yb) in enumerate(_data(30), start=1):
        loss = float(graph(xb, yb))
        ref_loss, grads = forward_backward(ref, xb.astype(np.float64), yb)
        adam_step(ref, grads, state, t, 1e-2, 0.9, 0.999, 1e-8, 1e-4)
        assert loss == pytest.approx(ref_loss, rel=1e-4)
    assert graph._optimizers[0].state_dict()["state"][0]["step"][0] == 30


def test_train_command_defaults_reach_95_percent():
    r = train_digits("mlp", epochs=20, batch_size=64, lr=0.1, momentum=0.9, progress=False)
    assert r["test_accuracy"] >= 0.95, r["test_accuracy"]
    assert r["losses"][-1] < r["losses"][0] / 5


def test_accumulate_above_the_training_rows_is_a_clear_error():
    """``--batch-size 2000 --accumulate 2000`` over the 1437 training rows: every batch was cut
    to a multiple of 2000 rows, none was left, and the run ended in an IndexError."""
    with pytest.raises(ValueError, match=r"train_digits: accumulate 2000 needs at least 2000 "
                       r"rows per batch, but the training set has 1437: every batch would be "
                       r"dropped; give accumulate <= 1437"):
        train_digits("mlp", epochs=1, batch_size=2000, accumulate=2000, progress=False)


@pytest.mark.parametrize("option", [dict(batch_size=0), dict(epochs=0), dict(accumulate=0),
                                    dict(batch_size=2.5)])
def test_a_size_that_is_not_a_positive_integer_is_named(option):
    """``batch_size=0`` ended in ``range() arg 3 must not be zero``; ``epochs=0`` trained
    nothing and reported the untrained model (the CLI refuses both; the Python API now too)."""
    (name, value), = option.items()
    with pytest.raises(ValueError, match=rf"train_digits: {name} must be a positive integer, "
                                         rf"got {value!r}"):
        train_digits("mlp", progress=False, **option)
