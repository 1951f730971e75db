"""Found by outside review (issue 11): no silently wrong results, atomic loads, clear errors.

Threads calling one nn.Graph, every way of changing an optimizer's param group, failed optimizer
and scaler loads (nothing may change), PyTorch GradScaler state dicts, scaler settings changed
after construction, lr=0, one-element scalars of any shape for scalar_mul_by_tensor, copying and
pickling optimizers, and the IR printer declaring every value it prints.
"""
import copy
import io
import pickle
import re
import sys
import threading
import time
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.amp import GradScaler, StaticGradScaler
from miniflow.experiments.mlp import EvalGraph, TrainGraph, mlp
from miniflow.ir import Graph as IRGraph
from miniflow.passes.loss_scale import LossScaleOverflowWarning
from miniflow.runtime.backend import get_backend
from miniflow.runtime.plan import Plan
from miniflow.testing import check_grad
from miniflow.ops import emitter

README = Path(__file__).resolve().parent.parent / "README.md"


class Step(nn.Graph):
    """One optimizer step of ``model`` on cross entropy, with an optional scaler and AMP."""

    def __init__(self, model, opt, scaler=None, policy=None):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        if policy is not None:
            self.config.enable_amp(True, loss_scale_policy=policy)
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def _xy(n=4, seed=0):
    r = np.random.default_rng(seed)
    return r.random((n, 4), dtype=np.float32), r.integers(0, 3, n).astype(np.int64)


def _model(seed=0):
    mf.manual_seed(seed)
    return mlp((4, 8, 3))


def _params(model):
    return [p.numpy().copy() for p in model.parameters()]


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
    model = _model()
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
    x, y = _xy(6)

    def make():
        model = _model(3)
        scaler = GradScaler(init_scale=2.0 ** 20, growth_interval=5)
        return model, scaler, Step(model, mf.optim.Adam(model.parameters(), lr=1e-2), scaler,
                                   policy="fp32")

    model_1, scaler_1, step_1 = make()
    losses_1 = sorted(float(step_1(x, y).numpy()) for _ in range(300))
    model_2, scaler_2, step_2 = make()
    losses_2 = [[], []]
    _run_threads(lambda k: losses_2[k].extend(float(step_2(x, y).numpy()) for _ in range(150)))
    assert sorted(losses_2[0] + losses_2[1]) == losses_1
    for a, b in zip(_params(model_1), _params(model_2)):
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
    model = _model()
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

# ------------------------------------------------------------------------------ 2. param groups
def _trained_step(opt_cls=mf.optim.SGD, **kw):
    model = _model()
    opt = opt_cls(model.parameters(), **kw)
    g = Step(model, opt)
    g(*_xy())
    return model, opt, g


def test_param_group_ior_is_checked_and_a_compiled_key_recompiles():
    _, opt, g = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    with pytest.raises(ValueError, match=r"SGD: lr must be finite and in \[0, inf\), got -5.0"):
        group |= {"lr": -5.0}
    assert opt.param_groups[0]["lr"] == 0.1 and opt.version == 0
    group |= {"lr": 0.05}  # the learning-rate variable: no recompilation
    assert group is opt.param_groups[0] and group["lr"] == 0.05 and opt.version == 0
    assert opt.learning_rate[0] == 0.05 and "lr=" not in str(g.ir)
    group |= {"momentum": 0.5}
    assert opt.version == 1
    g(*_xy())
    assert g.compile_count == 2 and "momentum=0.5" in str(g.ir)


def test_param_group_update_is_all_or_nothing():
    _, opt, _ = _trained_step(lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum must be finite"):
        opt.param_groups[0].update(lr=0.01, momentum=-1.0)
    assert opt.hyper == {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False,
                         "clip_grad_max_norm": None, "clip_grad_norm_type": 2.0}
    assert opt.version == 0
    with pytest.raises(KeyError, match=r"cannot set 'dampening'; hyper-parameters are "
                                       r"\['clip_grad_max_norm', 'clip_grad_norm_type', 'lr', "
                                       r"'momentum', 'nesterov', 'weight_decay'\]"):
        opt.param_groups[0].update(lr=0.01, dampening=0.5)
    with pytest.raises(KeyError, match=r"cannot set 'params'.*make a new optimizer"):
        opt.param_groups[0]["params"] = []
    assert opt.hyper["lr"] == 0.1 and opt.version == 0


@pytest.mark.parametrize("change,what", [
    (lambda g: g.pop("lr"), r"pop\('lr'\)"),
    (lambda g: g.pop("lr", None), r"pop\('lr'\)"),
    (lambda g: g.popitem(), r"popitem\(\)"),
    (lambda g: g.clear(), r"clear\(\)"),
    (lambda g: g.__delitem__("momentum"), r"del group\['momentum'\]"),
    (lambda g: g.setdefault("dampening", 0.5), r"setdefault\('dampening'\)")])
def test_param_group_keys_cannot_be_removed_or_added(change, what):
    _, opt, _ = _trained_step(lr=0.1)
    before = dict(opt.param_groups[0])
    with pytest.raises(TypeError, match=rf"SGD.param_groups\[0\]: {what} is refused: "
                                        "hyper-parameters cannot be removed or added"):
        change(opt.param_groups[0])
    assert dict(opt.param_groups[0]) == before and opt.version == 0


def test_param_group_setdefault_of_an_existing_key_and_copies_change_nothing():
    _, opt, _ = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    assert group.setdefault("lr", 3.0) == 0.1
    for snapshot in (copy.copy(group), group.copy(), dict(group), group | {"lr": -1.0},
                     copy.deepcopy(group)):
        assert type(snapshot) is dict  # a plain dict: a snapshot, not a back door
        snapshot["lr"] = -1.0
    assert group["lr"] == 0.1 and opt.version == 0


def test_the_param_group_list_cannot_be_replaced_and_loads_update_the_group_in_place():
    _, opt, _ = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    with pytest.raises(TypeError, match=r"param_groups cannot be changed .*opt.param_groups\[0\]"
                                        r"\[key\] = value"):
        opt.param_groups[0] = {"lr": -5.0, "momentum": 0.0, "weight_decay": 0.0}
    with pytest.raises(AttributeError, match="SGD.param_groups cannot be replaced"):
        opt.param_groups = [{"lr": -5.0}]
    assert opt.param_groups[0] is group and opt.hyper["lr"] == 0.1
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 0.25
    opt.load_state_dict(sd)
    assert group["lr"] == 0.25 and opt.param_groups[0] is group  # a held reference stays live
    group["lr"] = 0.5
    assert opt.hyper["lr"] == 0.5


# ------------------------------------------------------------------------------ 3. optimizer loads
def _other_state(opt):
    """A valid state dict of ``opt`` with every state value and hyper-parameter changed."""
    sd = opt.state_dict()
    for i, s in sd["state"].items():
        for k, v in s.items():
            s[k] = v + (i + 1) * (3 if k == "step" else 0.5)
    sd["param_groups"][0]["lr"] = 0.25
    return sd


def _sgd():
    return mf.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)


def _adam():
    return mf.optim.Adam(_model().parameters(), lr=0.1)


def _set(path, value):
    def change(sd):
        *head, last = path
        d = sd
        for k in head:
            d = d[k]
        d[last] = value(d[last]) if callable(value) else value
    return change


LAST = 3  # the last parameter (model.2.bias): earlier ones would be assigned first


@pytest.mark.parametrize("make,change,err,match", [
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.zeros(5)), ValueError,
     r"state\[3\]\['momentum_buffer'\] has shape \[5\], expected \[3\]"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array(["a", "b", "c"])), TypeError,
     r"state\[3\]\['momentum_buffer'\] has dtype <U1 .*expected real numbers for a float32 "
     "state"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), [1.0, "x", 2.0]), TypeError,
     r"state\[3\]\['momentum_buffer'\] has dtype"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array([0.0, np.nan, 1.0])), ValueError,
     r"state\[3\]\['momentum_buffer'\] must be finite; element \[1\] is nan"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array([0.0, 1e39, 1.0])), ValueError,
     r"must be finite; element \[1\] is 1e\+39"),
    (_sgd, _set(("state", LAST), {}), KeyError,
     r"missing state\[3\]\['momentum_buffer'\]; every parameter needs \['momentum_buffer'\]"),
    (_sgd, _set(("param_groups", 0, "lr"), -1.0), ValueError,
     r"SGD.load_state_dict: param_groups\[0\]: SGD: lr must be finite .*got -1.0"),
    (_sgd, _set(("param_groups", 0, "momentum"), "0.9"), TypeError,
     "momentum must be a real number, got '0.9'"),
    (_sgd, _set(("param_groups", 0, "dampening"), 0.5), KeyError,
     r"unknown hyper-parameters \['dampening'\]"),
    (_sgd, _set(("param_groups", 0, "params"), [0, 1]), ValueError,
     r"'params'\] is \[0, 1\], expected \[0, 1, 2, 3\]"),
    (_sgd, _set(("param_groups",), lambda g: g * 2), ValueError, "a list of one dict"),
    (_sgd, _set(("state",), lambda s: {k: s[k] for k in (0, 1)}), ValueError,
     "each of the 4 parameter indices"),
    (_adam, _set(("state", LAST, "step"), np.array([-1])), ValueError,
     r"state\[3\]\['step'\] must be a count >= 0 that int64 holds; element \[0\] is -1"),
    (_adam, _set(("state", LAST, "step"), np.array([2.5])), ValueError,
     r"state\[3\]\['step'\] must be a count >= 0 .*element \[0\] is 2.5"),
    (_adam, _set(("state", LAST, "step"), np.array(["7"])), TypeError,
     r"state\[3\]\['step'\] has dtype <U1 .*expected real numbers for a int64 state"),
    (_adam, _set(("state", LAST, "exp_avg_sq"), np.array([0.0, -1.0, 0.0])), ValueError,
     r"state\[3\]\['exp_avg_sq'\] must be finite and >= 0; element \[1\] is -1.0"),
    (_adam, _set(("param_groups", 0, "betas"), (0.9, 1.5)), ValueError, "beta2 must be finite"),
    (_adam, _set(("param_groups", 0, "maximize"), True), KeyError,
     r"unknown hyper-parameters \['maximize'\]"),
])
def test_failed_optimizer_load_changes_nothing(make, change, err, match):
    opt = make()
    sd = _other_state(opt)
    change(sd)
    before = opt.state_dict()
    with pytest.raises(err, match=match):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"] and opt.version == 0
    for i, s in before["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(after["state"][i][k], v, err_msg=f"state[{i}][{k}]")


def test_valid_optimizer_load_assigns_everything_in_place():
    opt = _adam()
    arrays = [s["exp_avg"] for s in opt.state]
    sd = _other_state(opt)
    sd["state"][0]["exp_avg"] = mf.tensor(sd["state"][0]["exp_avg"])  # Tensors are accepted
    sd["state"][1]["step"] = sd["state"][1]["step"].astype(np.float64)  # whole floats: counts
    opt.load_state_dict(sd)
    assert all(a is s["exp_avg"] for a, s in zip(arrays, opt.state))  # graphs keep their bindings
    got = opt.state_dict()
    assert got["param_groups"][0]["lr"] == 0.25 and opt.version == 1
    assert got["state"][1]["step"].tolist() == [6] and got["state"][1]["step"].dtype == np.int64
    np.testing.assert_array_equal(got["state"][3]["exp_avg"], np.full(3, 2.0, np.float32))


# ------------------------------------------------------------------------------ 3. scaler loads
def _used_scaler():
    scaler = GradScaler(init_scale=1024.0, growth_interval=100)
    model = _model()
    g = Step(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler)
    g(*_xy())
    g(*_xy())
    return scaler


@pytest.mark.parametrize("change,err,match", [
    ({"scale": 8.0, "_growth_tracker": "x"}, ValueError,
     r"GradScaler.load_state_dict: _growth_tracker must be an integer >= 0, got 'x'"),
    ({"scale": 8.0, "_growth_tracker": -1}, ValueError, r"_growth_tracker .*got -1"),
    ({"scale": 8.0, "_growth_tracker": 1.5}, ValueError, r"_growth_tracker .*got 1.5"),
    ({"scale": "8"}, TypeError, "scale must be a real number, got '8'"),
    ({"scale": 8.0, "growth_factor": 0.5}, ValueError, "growth_factor must be > 1, got 0.5"),
    ({"scale": 8.0, "backoff_factor": "half"}, ValueError,
     "backoff_factor must be a finite number, got 'half'"),
    ({"scale": 8.0, "growth_interval": 0}, ValueError, "growth_interval must be an integer >= 1"),
    ({"scale": 8.0, "skip_nonfinite": "yes"}, TypeError,
     "skip_nonfinite must be True or False, got 'yes'"),
    ({"scale": 8.0, "found_inf": 2}, TypeError, "found_inf must be True or False, got 2"),
    ({"scale": 8.0, "num_skipped_steps": -3}, ValueError, "num_skipped_steps .*got -3"),
    ({"scale": 8.0, "consecutive_floor_skips": None}, ValueError, "consecutive_floor_skips"),
    ({"scale": 8.0, "max_consecutive_skips": 0}, ValueError, "max_consecutive_skips .*got 0"),
    ({"scale": 8.0, "min_scale": 16.0}, ValueError,
     "min_scale 16 is above the scale 8; load a lower min_scale with it"),
    ({"scale": 8.0, "loss_scale": 8.0}, KeyError, r"unexpected keys \['loss_scale'\]"),
])
def test_failed_scaler_load_changes_nothing(change, err, match):
    scaler = _used_scaler()
    before, version = scaler.state_dict(), scaler.version
    with pytest.raises(err, match=match):
        scaler.load_state_dict({**before, **change})
    assert scaler.state_dict() == before and scaler.version == version
    assert scaler.scale == 1024.0


def test_a_pytorch_grad_scaler_state_dict_loads_keeping_miniflow_defaults():
    torch_state = {"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                   "growth_interval": 3, "_growth_tracker": 2}  # torch.amp.GradScaler's keys
    scaler = GradScaler()
    defaults = scaler.state_dict()
    scaler.load_state_dict(torch_state)
    sd = scaler.state_dict()
    assert {k: sd[k] for k in torch_state} == torch_state
    assert {k: sd[k] for k in set(sd) - set(torch_state)} == \
        {k: defaults[k] for k in set(sd) - set(torch_state)}
    assert sd["min_scale"] == 1.0 and sd["max_consecutive_skips"] == 64
    model = _model()
    g = Step(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler, policy="fp32")
    g(*_xy())  # the third finite step since the last change: the scale grows
    assert scaler.scale == 65536.0 and scaler.growth_tracker == 0
    with pytest.raises(KeyError, match=r"missing keys \['_growth_tracker'\]"):
        scaler.load_state_dict({k: v for k, v in torch_state.items() if k != "_growth_tracker"})
    with pytest.raises(ValueError, match=r"min_scale 1 is above the scale 0.25.*set "
                                         r"scaler.min_scale lower before loading"):
        scaler.load_state_dict(dict(torch_state, scale=0.25))  # PyTorch has no floor
    scaler.min_scale = 0.125
    scaler.load_state_dict(dict(torch_state, scale=0.25))
    assert scaler.scale == 0.25
    with pytest.raises(KeyError, match=r"unexpected keys .*load it into a GradScaler"):
        StaticGradScaler(8.0).load_state_dict(torch_state)


def test_a_live_torch_grad_scaler_state_dict_loads():
    torch = pytest.importorskip("torch")
    ts = torch.amp.GradScaler("cpu", init_scale=512.0, growth_factor=4.0, backoff_factor=0.25,
                              growth_interval=7)
    scaler = GradScaler()
    scaler.load_state_dict(ts.state_dict())
    assert (scaler.scale, scaler.growth_factor, scaler.backoff_factor, scaler.growth_interval,
            scaler.growth_tracker) == (512.0, 4.0, 0.25, 7, 0)


# ------------------------------------------------------------------------------ 4. scaler settings
@pytest.mark.parametrize("make,attr,value,err,match", [
    (GradScaler, "growth_factor", 0.5, ValueError,
     "GradScaler: growth_factor must be > 1, got 0.5"),
    (GradScaler, "growth_factor", float("nan"), ValueError, "growth_factor must be a finite"),
    (GradScaler, "backoff_factor", 1.5, ValueError, r"backoff_factor must be in \(0, 1\), got 1.5"),
    (GradScaler, "growth_interval", 0, ValueError,
     "growth_interval must be an integer >= 1, got 0"),
    (GradScaler, "growth_interval", 2.5, ValueError, "growth_interval must be an integer >= 1"),
    (GradScaler, "min_scale", -1, ValueError, "min_scale must be a finite number > 0 .*got -1"),
    (GradScaler, "min_scale", 1e6, ValueError, "min_scale 1e\\+06 is above the scale 65536"),
    (GradScaler, "skip_nonfinite", "yes", TypeError, "skip_nonfinite must be True or False"),
    (GradScaler, "max_consecutive_skips", 0, ValueError,
     "max_consecutive_skips must be an integer"),
    (GradScaler, "growth_intervall", 5, AttributeError,
     "GradScaler has no setting 'growth_intervall'; its settings are growth_factor, "),
    (lambda: StaticGradScaler(8.0), "skip_nonfinite", "no", TypeError,
     "StaticGradScaler: skip_nonfinite must be True or False, got 'no'"),
    (lambda: StaticGradScaler(8.0), "growth_factor", 2.0, AttributeError,
     "StaticGradScaler has no setting 'growth_factor'"),
])
def test_scaler_settings_changed_after_construction_are_checked(make, attr, value, err, match):
    scaler = make()
    before, version = scaler.state_dict(), scaler.version
    with pytest.raises(err, match=match):
        setattr(scaler, attr, value)
    assert scaler.state_dict() == before and scaler.version == version
    assert not hasattr(scaler, "growth_intervall")


def test_scaler_settings_are_checked_at_construction_too_and_valid_changes_recompile():
    with pytest.raises(TypeError, match="StaticGradScaler: skip_nonfinite must be True or False"):
        StaticGradScaler(8.0, skip_nonfinite="yes")
    scaler = GradScaler()
    version = scaler.version
    scaler.growth_interval = np.int64(10)
    assert scaler.growth_interval == 10 and type(scaler.growth_interval) is int
    assert scaler.version == version + 1


# ------------------------------------------------------------------------------ 4. lr = 0
@pytest.mark.parametrize("opt_cls", [mf.optim.SGD, mf.optim.Adam])
def test_lr_zero_is_accepted_and_changes_no_weight(opt_cls):
    model = _model()
    before = _params(model)
    opt = opt_cls(model.parameters(), lr=0.0)
    g = Step(model, opt)
    g(*_xy())
    assert opt.learning_rate[0] == 0.0 and "%optimizer0.learning_rate" in str(g.ir)
    for a, b in zip(before, _params(model)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=rf"{opt_cls.__name__}: lr must be finite and in "
                                         r"\[0, inf\), got -1e-09"):
        opt_cls(model.parameters(), lr=-1e-9)


# ------------------------------------------------------------------------------ 4. scalar shapes
@pytest.mark.parametrize("x_shape,s_shape", [((3, 2), (1,)), ((3, 2), ()), ((4,), (1, 1)),
                                             ((), (1, 1)), ((2, 1, 3), (1, 1, 1))])
def test_scalar_mul_by_tensor_takes_any_one_element_scalar(x_shape, s_shape):
    r = np.random.default_rng(0)
    x = r.uniform(-2, 2, x_shape).astype(np.float32)
    s = r.uniform(0.5, 2, s_shape).astype(np.float32)
    g = IRGraph()
    out = emitter(g)("scalar_mul_by_tensor", g.add_input("x", x_shape, mf.float32),
                     g.add_input("s", s_shape, mf.float32))
    assert out.shape == x_shape
    g.set_outputs([out])
    g.verify()
    (got,) = Plan(g, get_backend()).run([x, s])
    np.testing.assert_allclose(got, x.astype(np.float64) * float(s.reshape(())), rtol=1e-6)
    r64 = np.random.default_rng(1)  # both gradients (dx and dscalar) against finite differences
    check_grad("scalar_mul_by_tensor", [r64.uniform(-1, 1, x_shape),
                                        r64.uniform(0.5, 2, s_shape)], {})


def test_scalar_mul_by_tensor_refuses_a_scalar_of_several_elements():
    g = IRGraph()
    x = g.add_input("x", (3,), mf.float32)
    with pytest.raises(ValueError, match=r"scalar_mul_by_tensor: scalar %s \(f32\[1,2\]\) must "
                                         r"have exactly one element .*it has 2"):
        emitter(g)("scalar_mul_by_tensor", x, g.add_input("s", (1, 2), mf.float32))


# ------------------------------------------------------------------------------ 4. copy, pickle
@pytest.mark.parametrize("clone", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))],
                         ids=["deepcopy", "pickle"])
def test_optimizer_copies_are_complete_and_independent(clone):
    model = _model()
    opt = mf.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    g = Step(model, opt)
    for _ in range(3):
        g(*_xy())
    sd = opt.state_dict()
    model_2, opt_2 = clone((model, opt))  # together: the copy trains the copied model
    assert opt_2.params[0] is model_2[0].weight and opt_2.params[0] is not opt.params[0]
    sd_2 = opt_2.state_dict()
    assert sd_2["param_groups"] == sd["param_groups"] and opt_2.version == opt.version
    for i, s in sd["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(sd_2["state"][i][k], v)
    group = opt_2.param_groups[0]
    assert group["params"] is opt_2.params
    with pytest.raises(ValueError, match="Adam: lr must be finite"):
        group["lr"] = -1.0
    group["lr"] = 0.02  # the copy's own learning-rate array
    assert opt.hyper["lr"] == 0.01 and opt.learning_rate[0] == 0.01
    assert opt_2.learning_rate[0] == 0.02
    group["eps"] = 1e-6
    assert opt.hyper["eps"] == 1e-8 and opt_2.version == opt.version + 1
    group.update(lr=0.01, eps=1e-8)
    g_2 = Step(model_2, opt_2)
    g(*_xy(seed=5))
    g_2(*_xy(seed=5))  # the same step on both: the same result, separate storage
    for a, b in zip(_params(model), _params(model_2)):
        np.testing.assert_array_equal(a, b)
    assert opt.state_dict()["state"][0]["step"][0] == opt_2.state_dict()["state"][0]["step"][0] == 4
    g(*_xy(seed=6))
    assert opt_2.state_dict()["state"][0]["step"][0] == 4
    assert not np.array_equal(_params(model)[0], _params(model_2)[0])


def test_an_optimizer_copied_alone_owns_copies_of_the_parameters():
    model = _model()
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    alone = copy.deepcopy(opt)
    assert alone.params[0] is not model[0].weight
    np.testing.assert_array_equal(alone.params[0].numpy(), model[0].weight.numpy())
    assert alone.param_groups[0]._owner is alone and opt.param_groups[0]._owner is opt


def test_a_shallow_copy_shares_the_parameters_but_not_the_group_or_the_state():
    model, opt, g = _trained_step(lr=0.1, momentum=0.9)
    shallow = copy.copy(opt)
    assert shallow.params[0] is model[0].weight
    assert shallow.param_groups[0] is not opt.param_groups[0]
    shallow.param_groups[0]["lr"] = 0.5
    assert opt.hyper["lr"] == 0.1 and opt.learning_rate[0] == 0.1
    assert shallow.learning_rate[0] == 0.5
    shallow.param_groups[0]["momentum"] = 0.5
    assert opt.hyper["momentum"] == 0.9 and opt.version == 0 and shallow.version == 1
    buf = shallow.state_dict()["state"][0]["momentum_buffer"].copy()
    g(*_xy())  # trains with opt: its momentum buffer moves, the copy's does not
    np.testing.assert_array_equal(shallow.state_dict()["state"][0]["momentum_buffer"], buf)
    assert not np.array_equal(opt.state_dict()["state"][0]["momentum_buffer"], buf)


# ------------------------------------------------------------------------------ 4. IR printer
_DECLARED = re.compile(r"^\s+%([\w.]+): ", re.M)  # header lines: inputs, variables, constants


def _undeclared(text: str) -> set:
    declared = set(_DECLARED.findall(text))
    for line in text.splitlines():
        if " = " in line and not line.startswith("    %"):  # node outputs: the left-hand side
            declared.update(re.findall(r"%([\w.]+):", line.split(" = ")[0]))
    return set(re.findall(r"%([\w.]+)", text)) - declared


def _graphs():
    x, y = _xy()
    model = _model()
    yield "sgd", Step(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)), (x, y)
    model = _model()
    yield "eval", EvalGraph(model), (x,)
    for policy in ("legacy", "cast_back", "fp32"):
        for scaler in (GradScaler(), StaticGradScaler(1024.0)):
            model = _model()
            yield (f"{policy}-{type(scaler).__name__}",
                   Step(model, mf.optim.Adam(model.parameters()), scaler, policy), (x, y))
    model = _model()
    yield "train", TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1)), (x, y)


def test_the_ir_printer_declares_every_value_it_uses():
    for label, g, inputs in _graphs():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LossScaleOverflowWarning)  # legacy/cast_back at 2^16
            g(*inputs)
        text = str(g.ir)
        assert not _undeclared(text), (label, _undeclared(text), text)
        if label == "sgd":
            assert re.search(r"^    %c\d+: i64\[1\],  # constant \[0\]$", text, re.M), text


def test_the_printer_shows_small_constant_values_and_summarises_large_ones():
    g = IRGraph()
    x = g.add_input("x", (2, 16), mf.float32)  # small: [2,1], broadcast over the columns
    small = g.add_constant(np.array([[0.5], [2.0]], np.float32))
    large = g.add_constant(np.zeros((2, 16), np.float32))
    emit = emitter(g)
    g.set_outputs([emit("broadcast_add", emit("broadcast_mul", x, small), large)])
    text, names = str(g), g.names()
    assert f"    %{names[small]}: f32[2,1],  # constant [[0.5], [2.0]]" in text
    assert f"    %{names[large]}: f32[2,16],  # constant (32 elements)" in text
    assert not _undeclared(text)


def test_the_readme_ir_sample_is_the_real_output_of_the_code_beside_it():
    section = README.read_text().split("## What it looks like", 1)[1].split("\n## ", 1)[0]
    code, printed = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)[:2]
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    real = out.getvalue().splitlines()
    shown = printed.rstrip("\n").splitlines()
    assert any(ln.strip() == "..." for ln in shown) and len(shown) > 10
    position = 0
    for line in shown:  # every line shown is a real line, in the real order
        if line.strip() == "...":
            continue
        assert line in real[position:], f"README line not in the real output (in order): {line!r}"
        position = real.index(line, position) + 1
    assert not _undeclared("\n".join(real))
