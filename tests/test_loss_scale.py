"""Loss scaling in the graph: the three loss-scale policies, static and dynamic scalers, step
skipping, the scale schedule against PyTorch's GradScaler, the skipped steps of a run training
only the last layer against PyTorch's (live), persistent non-finite gradients; the
scaler's state-dict loads (all or nothing, PyTorch's ``GradScaler.state_dict`` accepted) and its
settings changed after construction (checked, valid ones recompile).

Golden IR printouts (the loss-scale stage under each policy) live in ``tests/golden/loss_scale/``;
regenerate them with ``MINIFLOW_UPDATE_GOLDEN=1 python -m pytest tests/test_loss_scale.py``.
"""
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.amp import GradScaler, NonFiniteGradientsError, StaticGradScaler
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import EvalGraph, accuracy, mlp
from miniflow.passes.autograd import AutogradState
from miniflow.passes.loss_scale import LossScaleOverflowWarning, LossScaleState

from graph_cases import Step as OneStep, small_mlp, xy

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden" / "loss_scale"
UPDATE = os.environ.get("MINIFLOW_UPDATE_GOLDEN") == "1"
POLICIES = ("legacy", "cast_back", "fp32")
sys.path.insert(0, str(FIXTURES))
import grad_scaler_sequence as seq  # noqa: E402


class Step(nn.Graph):
    """One SGD step of ``model`` on ``loss_fn(model, x, y...)`` with optional AMP and a scaler."""

    def __init__(self, model, scaler=None, amp=True, policy="fp32", loss_fn=None, lr=0.01,
                 momentum=0.0, dtype=mf.float16):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn or (lambda m, x: m(x).sum())
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=lr, momentum=momentum))
        if amp:
            self.config.enable_amp(True, dtype, loss_scale_policy=policy)
            # the loss-scale stage as its pass makes it (fused: tests/test_fused_update.py)
            self.config.enable_fused_model_update_cast(False)
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, *inputs):
        loss = self.loss_fn(self.model, *inputs)
        loss.backward()
        return loss


def _linear(n_in=8, n_out=3, seed=0):
    mf.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=False)


def _params(model):
    return [p.numpy().copy() for p in model.parameters()]


# ------------------------------------------------------------------------------ first step skipped
@pytest.mark.parametrize("policy", POLICIES)
def test_sum_of_matmul_skips_the_first_step_at_scale_2_16_then_trains(policy):
    model = _linear()
    scaler = GradScaler(init_scale=2.0 ** 16)
    step = Step(model, scaler, policy=policy)
    x = np.random.default_rng(0).random((1, 8), dtype=np.float32)
    before = _params(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LossScaleOverflowWarning)
        step(x)
    assert scaler.found_inf and scaler.num_skipped_steps == 1
    assert scaler.scale == 32768.0
    for a, b in zip(before, _params(model)):
        assert a.tobytes() == b.tobytes()  # bit for bit
    step(x)
    assert not scaler.found_inf and scaler.scale == 32768.0 and scaler.growth_tracker == 1
    assert all(not np.array_equal(a, b) for a, b in zip(before, _params(model)))


# ------------------------------------------------------------------------------ digits, static 2^16
def _digits_run(policy, scaler, epochs=5, black_logits=False, amp=True):
    data = load_digits()
    mf.manual_seed(0)
    model = mlp((64, 128, 10))

    def loss_fn(m, x, y):
        logits = m(x)
        if black_logits:
            logits = mf.amp.black_identity(logits)
        return nn.functional.cross_entropy(logits, y)

    step = Step(model, scaler, amp=amp, policy=policy, loss_fn=loss_fn, lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LossScaleOverflowWarning)
        for _ in range(epochs):
            for xb, yb in batches(data.x_train, data.y_train, 64, rng=rng):
                step(xb, yb)
                n += 1
    return step, n, accuracy(EvalGraph(model), data.x_test, data.y_test)


@pytest.mark.parametrize("policy", ["legacy", "cast_back"])
def test_static_65536_skips_every_step_under_legacy_and_cast_back_with_miniflows_default(policy):
    # miniflow's StaticGradScaler skips non-finite steps by default; OneFlow would apply them
    scaler = StaticGradScaler(65536.0, max_consecutive_skips=10 ** 6)
    _, n, acc = _digits_run(policy, scaler, epochs=1)
    assert scaler.num_skipped_steps == n == 23
    assert acc < 0.5  # the initial weights: nothing was learnt


def _one_static_legacy_step(scaler, dtype=mf.float16):
    """One "legacy" AMP step (in ``dtype``) of the digits MLP (mean cross-entropy, first batch of
    64) under the static ``scaler``; returns the parameters before and after it and the graph."""
    data = load_digits()
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    step = Step(model, scaler, policy="legacy", lr=0.1, momentum=0.9, dtype=dtype,
                loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    before = _params(model)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore"):
        warnings.simplefilter("ignore", LossScaleOverflowWarning)
        step(data.x_train[:64], data.y_train[:64])
    return before, _params(model), step


def test_oneflow_static_2_16_legacy_applies_the_inf_step_and_the_weights_turn_nan():
    """OneFlow never skips a step under a static loss scale (autograd.cpp's
    CountNotFiniteIfNeeded and optimizer.cpp's SetDynamicLossScaleSkipIf return early without a
    dynamic policy): ``skip_nonfinite=False`` is that. The scale 2^16 made in the float16 initial
    gradient's dtype is inf, and the update applies the inf/NaN gradients."""
    scaler = StaticGradScaler(2.0 ** 16, skip_nonfinite=False)
    before, after, step = _one_static_legacy_step(scaler)
    assert step.compile_context.state[AutogradState].initial_grad.dtype is mf.float16
    assert scaler.found_inf and scaler.num_skipped_steps == 0
    assert all(np.isfinite(b).all() for b in before)
    assert all(np.isnan(a).any() for a in after)          # every parameter holds NaN
    assert np.mean(~np.isfinite(np.concatenate([a.ravel() for a in after]))) > 0.5


def test_bfloat16_static_2_20_legacy_without_skipping_applies_a_finite_step():
    """The same OneFlow setup in bfloat16: the initial gradient is bfloat16, whose exponent range
    is float32's, so the scale 2^20 made in its dtype is finite, no gradient overflows, no
    warning is given, and the step changes every parameter to finite values."""
    scaler = StaticGradScaler(2.0 ** 20, skip_nonfinite=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LossScaleOverflowWarning)
        before, after, step = _one_static_legacy_step(scaler, mf.bfloat16)
    assert step.compile_context.state[AutogradState].initial_grad.dtype is mf.bfloat16
    assert not scaler.found_inf
    assert all(np.isfinite(a).all() and not np.array_equal(a, b) for a, b in zip(after, before))


def test_miniflow_default_static_2_16_legacy_skips_and_keeps_the_weights_bit_identical():
    """miniflow's ``StaticGradScaler`` skips non-finite steps by default (not OneFlow's
    behaviour): the same step changes no weight, bit for bit."""
    scaler = StaticGradScaler(2.0 ** 16)
    before, after, _ = _one_static_legacy_step(scaler)
    assert scaler.found_inf and scaler.num_skipped_steps == 1
    for a, b in zip(before, after):
        assert a.tobytes() == b.tobytes()


def test_static_65536_trains_under_fp32_policy():
    scaler = StaticGradScaler(65536.0)
    _, n, acc = _digits_run("fp32", scaler)
    assert scaler.num_skipped_steps == 0 and acc >= 0.90, acc


def test_black_identity_on_the_logits_makes_legacy_train_at_65536():
    scaler = StaticGradScaler(65536.0)
    step, _, acc = _digits_run("legacy", scaler, black_logits=True)
    assert scaler.num_skipped_steps == 0 and acc >= 0.90, acc
    assert step.compile_context.state[AutogradState].initial_grad.dtype is mf.float32


@pytest.mark.parametrize("policy", POLICIES)
def test_static_200_trains_under_every_policy_without_dtype_mismatch(policy):
    scaler = StaticGradScaler(200.0)
    _, _, acc = _digits_run(policy, scaler)
    assert scaler.num_skipped_steps == 0 and acc >= 0.90, acc


# ------------------------------------------------------------------------------ schedule
def test_growth_never_reaches_a_non_finite_scale():
    model = _linear()
    scaler = GradScaler(init_scale=2.0 ** 127, growth_interval=1)
    step = Step(model, scaler, amp=False)
    step(np.full((1, 8), 1e-3, np.float32))
    assert not scaler.found_inf
    assert scaler.scale == 2.0 ** 127 and scaler.growth_tracker == 0


def test_always_nan_gradients_halve_to_the_floor_then_raise_after_64_floor_skips():
    model = _linear()
    scaler = GradScaler(init_scale=2.0 ** 16, min_scale=1.0)
    step = Step(model, scaler, amp=True, momentum=0.9)
    before = _params(model)
    x = np.full((2, 8), np.nan, np.float32)
    scales = []
    for _ in range(79):
        step(x)
        scales.append(scaler.scale)
    assert scales[:17] == [2.0 ** k for k in range(15, -1, -1)] + [1.0]
    assert scaler.consecutive_floor_skips == 63 and scaler.num_skipped_steps == 79
    with pytest.raises(NonFiniteGradientsError, match=r"64 consecutive steps.*'model.weight'"):
        step(x)
    assert scaler.num_skipped_steps == 80 and scaler.scale == 1.0
    for a, b in zip(before, _params(model)):
        assert a.tobytes() == b.tobytes()
    opt_state = step._optimizers[0].state_dict()["state"][0]["momentum_buffer"]
    assert not opt_state.any()


def test_a_finite_step_after_a_skipped_one_applies_only_its_own_update():
    x_bad = np.full((1, 8), np.inf, np.float32)
    x = np.random.default_rng(1).random((1, 8), dtype=np.float32)
    runs = []
    for script in ([x_bad, x], [x]):
        model = _linear()
        scaler = GradScaler(init_scale=1024.0)
        step = Step(model, scaler, amp=False, momentum=0.9)
        for xi in script:
            step(xi)
        runs.append((_params(model), step._optimizers[0].state_dict()["state"][0]))
    (p_skip, s_skip), (p_ref, s_ref) = runs
    np.testing.assert_array_equal(p_skip[0], p_ref[0])
    np.testing.assert_array_equal(s_skip["momentum_buffer"], s_ref["momentum_buffer"])


def _pytorch_rules(nonfinite: list) -> tuple:
    """A pure-Python model of torch.amp.GradScaler's update: (scale used per step, skipped)."""
    scale, tracker = np.float32(seq.INIT_SCALE), 0
    used, skipped = [], []
    for bad in nonfinite:
        used.append(float(scale))
        skipped.append(bad)
        if bad:
            scale, tracker = np.float32(scale * seq.BACKOFF_FACTOR), 0
        else:
            tracker += 1
            if tracker == seq.GROWTH_INTERVAL:
                grown = np.float32(scale * seq.GROWTH_FACTOR)
                scale = grown if np.isfinite(grown) else scale
                tracker = 0
    return used, skipped


def _miniflow_trajectory() -> tuple:
    model = _linear(4, 3)
    scaler = GradScaler(init_scale=seq.INIT_SCALE, growth_factor=seq.GROWTH_FACTOR,
                        backoff_factor=seq.BACKOFF_FACTOR, growth_interval=seq.GROWTH_INTERVAL)
    step = Step(model, scaler, amp=False)
    used, skipped = [], []
    for i in range(seq.NUM_STEPS):
        used.append(scaler.scale)
        step(seq.inputs(i))
        skipped.append(scaler.found_inf)
    return used, skipped


@pytest.fixture(scope="module")
def trajectory():
    return _miniflow_trajectory()


def test_scale_trajectory_matches_a_model_of_pytorchs_rules(trajectory):
    used, skipped = trajectory
    expected = _pytorch_rules([i in seq.NONFINITE_STEPS for i in range(seq.NUM_STEPS)])
    assert (used, skipped) == expected
    assert len(set(used)) > 5 and sum(skipped) == len(seq.NONFINITE_STEPS)


def test_scale_trajectory_matches_torch_gradscaler_fixture(trajectory):
    fixture = json.loads((FIXTURES / "grad_scaler_trajectory.json").read_text())
    assert trajectory == (fixture["scale_used"], fixture["skipped"])


def test_scale_trajectory_matches_torch_gradscaler_live(trajectory):
    pytest.importorskip("torch")
    import make_grad_scaler_trajectory as make
    live = make.trajectory()
    assert trajectory == (live["scale_used"], live["skipped"])


# ------------------------------------------------------------------------------ last layer trained
def _last_layer_run(frozen: bool, torch):
    """Six SGD steps under AMP float16 with a default GradScaler, training only the last Linear of
    the digits MLP (``frozen``: the first Linear has ``requires_grad=False``; else the optimizer
    gets only the last Linear's parameters) in miniflow and in torch (autocast float16 on the CPU,
    ``torch.amp.GradScaler``), from the same weights on the same batches of raw 0..16 pixels
    (the digits times 16). Returns ``(skipped, scale after, loss)`` per step for each, and the
    first Linear's weight before and after miniflow's steps."""
    data = load_digits()
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    ref = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ref.load_state_dict({k: torch.tensor(np.array(v)) for k, v in model.state_dict().items()})
    for p in [*model[0].parameters(), *ref[0].parameters()]:
        p.requires_grad = not frozen
    first = model[0].weight.numpy().copy()
    scaler, ref_scaler = GradScaler(), torch.amp.GradScaler("cpu")
    step = OneStep(model, mf.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9), scaler,
                   policy="fp32")
    ref_opt = torch.optim.SGD(ref[2].parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    ours, theirs = [], []
    for _ in range(6):
        idx = rng.integers(0, len(data.x_train), 64)
        x, y = data.x_train[idx] * 16, data.y_train[idx]
        loss = float(step(x, y).numpy())
        ours.append((bool(scaler.found_inf), scaler.scale, loss))
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            ref_loss = torch.nn.functional.cross_entropy(ref(torch.tensor(x)), torch.tensor(y))
        ref_scaler.scale(ref_loss).backward()
        before = ref_scaler.get_scale()
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        theirs.append((ref_scaler.get_scale() < before, ref_scaler.get_scale(), ref_loss.item()))
    return ours, theirs, first, model[0].weight.numpy()


@pytest.mark.parametrize("frozen", [True, False], ids=["requires_grad_false", "optimizer_only"])
def test_training_only_the_last_layer_skips_the_steps_torch_skips(frozen):
    """A new user's report: training only the last Linear under AMP, 3 of 6 steps skipped. It is
    float16 overflow of that Linear's weight gradient (raw 0..16 pixels make large activations),
    which torch.amp.GradScaler finds on the same steps: same skips, same scales, same losses;
    the frozen layer's gradient is neither made nor checked."""
    torch = pytest.importorskip("torch")
    ours, theirs, first_before, first_after = _last_layer_run(frozen, torch)
    assert [o[:2] for o in ours] == [t[:2] for t in theirs]
    assert [o[0] for o in ours] == [True, True, True, False, False, False]
    np.testing.assert_allclose([o[2] for o in ours], [t[2] for t in theirs], rtol=1e-3)
    np.testing.assert_array_equal(first_after, first_before)


# ------------------------------------------------------------------------------ fp32 policy numerics
def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def test_fp32_policy_unscaled_gradients_match_a_numpy_fp16_reference():
    """Reference: the same mixed-precision step written in NumPy, rounding to fp16 exactly where the
    IR casts (white matmuls in fp16 storage with fp32 accumulation; the loss path in fp32)."""
    mf.manual_seed(2)
    model = mlp((64, 32, 10))
    w1, b1, w2, b2 = (p.numpy() for p in model.parameters())
    scale = 2.0 ** 12
    step = Step(model, StaticGradScaler(scale), policy="fp32",
                loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    data = load_digits()
    x, y = data.x_train[:16], data.y_train[:16]
    step(x, y)
    plan = next(iter(step.plans.values()))
    got = {n: plan.buffers[v] for n, v in step.ir.grads.items()}

    x16, w1_16, w2_16 = _f16(x), _f16(w1), _f16(w2)
    h = np.maximum(_f16(_f16(x16 @ w1_16.T) + _f16(b1)), 0)        # f16 matmul, bias_add, relu
    z = _f16(h @ w2_16.T) + b2                                      # f16 matmul -> f32 bias_add
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = p.copy()
    dz[np.arange(16), y] -= 1
    dz *= np.float32(scale) * np.float32(1 / 16)                    # scaled initial grad * mean
    dz = dz.astype(np.float32)
    dz16 = _f16(dz)                                                 # cast before the matmul grads
    dw2 = _f16(dz16.T @ h)
    dh = _f16(dz16 @ w2_16) * (h > 0)
    dw1 = _f16(dh.T @ x16)
    db1 = _f16(dh.sum(0))
    db2 = dz.sum(0)
    inv = np.float32(1 / scale)
    ref = {"model.0.weight": dw1 * inv, "model.0.bias": db1 * inv,
           "model.2.weight": dw2 * inv, "model.2.bias": db2 * inv}
    for name, r in ref.items():
        np.testing.assert_allclose(got[name], r, rtol=1e-6, atol=1e-7, err_msg=name)


# ------------------------------------------------------------------------------ IR per policy
@pytest.mark.parametrize("policy", POLICIES)
def test_ir_of_the_loss_scale_stage_per_policy_golden(policy):
    model = _linear(3, 2)
    step = Step(model, GradScaler(init_scale=1024.0), policy=policy)
    step(np.ones((4, 3), np.float32))
    text = str(step.ir)
    path = GOLDEN / f"{policy}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), f"IR differs from {path}:\n{text}"
    initial = step.compile_context.state[LossScaleState].scaled_initial_grad
    assert initial.dtype is (mf.float32 if policy == "fp32" else mf.float16)
    ops = [n.op.name for n in step.ir.nodes]
    assert ops.count("dynamic_loss_scale_schedule") == 1
    assert ops.index("dynamic_loss_scale_schedule") > max(
        i for i, n in enumerate(step.ir.nodes) if step.ir.variables["loss_scale"] in n.inputs
        and n.op.name != "dynamic_loss_scale_schedule")


# ------------------------------------------------------------------------------ API and validation
def test_state_dict_round_trip_keeps_every_field():
    model = _linear()
    scaler = GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25,
                        growth_interval=3, min_scale=2.0, max_consecutive_skips=7)
    step = Step(model, scaler, amp=False)
    step(np.full((1, 8), np.inf, np.float32))
    step(np.ones((1, 8), np.float32))
    sd = scaler.state_dict()
    assert {"scale", "growth_factor", "backoff_factor", "growth_interval",
            "_growth_tracker"} <= set(sd)
    other = GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    assert sd["scale"] == 64.0 and sd["_growth_tracker"] == 1 and sd["num_skipped_steps"] == 1
    static = StaticGradScaler(8.0, skip_nonfinite=False)
    copy = StaticGradScaler(1.0)
    copy.load_state_dict(static.state_dict())
    assert copy.state_dict() == static.state_dict()


@pytest.mark.parametrize("kwargs,match", [
    ({"init_scale": 0.0}, "init_scale"), ({"init_scale": float("nan")}, "init_scale"),
    ({"init_scale": float("inf")}, "init_scale"), ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.0}, "backoff_factor"), ({"backoff_factor": 0.0}, "backoff_factor"),
    ({"growth_interval": 0}, "growth_interval"), ({"min_scale": 0.0}, "min_scale"),
    ({"max_consecutive_skips": 0}, "max_consecutive_skips")])
def test_bad_scaler_arguments_are_rejected_quoting_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GradScaler(**kwargs)


def test_bad_static_scale_policy_and_scaler_type():
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 .*got -1.0"):
        StaticGradScaler(-1.0)
    with pytest.raises(ValueError, match="unknown loss_scale_policy 'fp16'"):
        nn.GraphConfig().enable_amp(True, loss_scale_policy="fp16")
    with pytest.raises(TypeError, match="set_grad_scaler"):
        Step(_linear(), scaler=1024.0)


@pytest.mark.parametrize("policy,warns", [("legacy", True), ("cast_back", True), ("fp32", False)])
def test_compile_time_warning_when_the_policy_cannot_represent_the_scale(policy, warns):
    step = Step(_linear(), GradScaler(), policy=policy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(np.ones((1, 8), np.float32))
    hits = [w for w in caught if issubclass(w.category, LossScaleOverflowWarning)]
    assert bool(hits) == warns
    if warns:
        assert "loss_scale_policy='fp32'" in str(hits[0].message)


def test_scaler_without_amp_trains_like_no_scaler():
    runs = []
    for scaler in (None, StaticGradScaler(1024.0)):
        model = _linear()
        step = Step(model, scaler, amp=False)
        for i in range(3):
            step(np.full((2, 8), 0.5 + i, np.float32))
        runs.append(_params(model)[0])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-6)


# ------------------------------------------------------------------------------ 3. scaler loads
def _used_scaler():
    scaler = GradScaler(init_scale=1024.0, growth_interval=100)
    model = small_mlp()
    g = OneStep(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler)
    g(*xy())
    g(*xy())
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
    model = small_mlp()
    g = OneStep(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler, policy="fp32")
    g(*xy())  # the third finite step since the last change: the scale grows
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


def test_an_initial_scale_below_1_sets_the_default_floor_to_it():
    """PyTorch takes ``GradScaler(init_scale=0.5)``; miniflow's default floor of 1 refused it
    naming ``min_scale``, an argument the user never passed (a new user's finding)."""
    scaler = GradScaler(init_scale=0.5)
    assert scaler.scale == 0.5 and scaler.min_scale == 0.5
    assert GradScaler().min_scale == 1.0
    with pytest.raises(ValueError, match="min_scale 1 is above the scale 0.5"):
        GradScaler(init_scale=0.5, min_scale=1.0)


def test_torch_grad_scaler_getters_and_setters():
    """``get_scale()``, ``is_enabled()`` and the ``get_/set_`` growth_factor, backoff_factor and
    growth_interval methods were an AttributeError: they read and set the settings (the setters
    checked as the constructor, the graph recompiling), as ``torch.amp.GradScaler``'s."""
    scaler = GradScaler(init_scale=512.0, growth_factor=4.0, backoff_factor=0.25,
                        growth_interval=3)
    got = lambda s: (s.get_scale(), s.is_enabled(), s.get_growth_factor(),  # noqa: E731
                     s.get_backoff_factor(), s.get_growth_interval())
    assert got(scaler) == (512.0, True, 4.0, 0.25, 3)
    version = scaler.version
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.5)
    scaler.set_growth_interval(7)
    assert got(scaler) == (512.0, True, 3.0, 0.5, 7) and scaler.version == version + 3
    with pytest.raises(ValueError, match="GradScaler: growth_interval must be"):
        scaler.set_growth_interval(0)
    with pytest.raises(ValueError, match="GradScaler: backoff_factor"):
        scaler.set_backoff_factor(1.5)
    assert got(scaler) == (512.0, True, 3.0, 0.5, 7)
    assert (StaticGradScaler(8.0).get_scale(), StaticGradScaler(8.0).is_enabled()) == (8.0, True)
    torch = pytest.importorskip("torch")
    ts = torch.amp.GradScaler("cpu", init_scale=512.0, growth_factor=4.0, backoff_factor=0.25,
                              growth_interval=3)
    ts.set_growth_factor(3.0)
    ts.set_backoff_factor(0.5)
    ts.set_growth_interval(7)
    assert got(ts) == got(scaler)
