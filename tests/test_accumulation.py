"""Gradient accumulation (``config.set_gradient_accumulation_steps(n)``, OneFlow's semantics):
4 micro-batches of 16 train as one batch of 64 (float64 model, SGD, Adam and Adadelta, with and
without a dynamic grad scaler, to 1e-6; AMP keeps float32 master weights, so under AMP the float32
model's accumulated gradient equals the mean of the micro-batches' own AMP gradients to 1e-6 and
one batch of 64 to float16 rounding), the losses come back packed, a non-finite micro-batch skips
the whole update;
batch norm under accumulation (OneFlow's semantics: moving statistics once per micro-batch);
OneFlow issue 9075's setting on a conv-bn network; the micro-batch schedule of the IR (which nodes run once, which once per micro-batch), its plan
(one flat list of steps) and ``ir.evaluate`` on it; the boundary ops' kernels over whole loops;
bad input."""
import math

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph, TrainGraph, mlp
from miniflow.ir import Graph, VerifyError, evaluate
from miniflow.kernels.cpu import builder_for
from miniflow.ops import emitter, get_op
from miniflow.runtime.backend import get_backend
from miniflow.runtime.plan import Plan


def f64_mlp(sizes=(64, 32, 10), seed=0):
    """The digits MLP with float64 parameters."""
    mf.manual_seed(seed)
    model = mlp(sizes)
    for layer in model.children():
        if isinstance(layer, nn.Linear):
            layer.weight = nn.Parameter(layer.weight.numpy().astype(np.float64))
            layer.bias = nn.Parameter(layer.bias.numpy().astype(np.float64))
    return model


def _batch(seed=0, n=64, dtype=np.float64):
    r = np.random.default_rng(seed)
    return (r.random((n, 64)) * 2).astype(dtype), r.integers(0, 10, n)


def _graph(model, opt_name, scaled, micro, clip=None, amp=False, lr=None):
    """A training graph: SGD (momentum, weight decay), Adam or Adadelta; ``scaled``: a dynamic
    grad scaler; ``amp``: AMP too (float32 models only: AMP keeps float32 master weights)."""
    kw = {"clip_grad_max_norm": clip} if clip else {}
    if opt_name == "sgd":
        opt = mf.optim.SGD(model.parameters(), lr=0.1 if lr is None else lr, momentum=0.9,
                           weight_decay=1e-3, **kw)
    else:
        cls = mf.optim.Adam if opt_name == "adam" else mf.optim.Adadelta
        opt = cls(model.parameters(), lr=(1e-2 if opt_name == "adam" else 1.0)
                  if lr is None else lr, **kw)
    g = TrainGraph(model, opt)
    if amp:
        g.config.enable_amp(True)
        g.config.enable_fused_model_update_cast(False)   # reads the unscaled mean gradients
    if scaled:
        g.set_grad_scaler(mf.amp.GradScaler(init_scale=2.0 ** 12, growth_interval=2))
    if micro > 1:
        g.config.set_gradient_accumulation_steps(micro)
    return g, opt


def _state(model, opt):
    out = {f"p.{k}": v for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        out.update({f"s{i}.{k}": np.asarray(v, np.float64) for k, v in s.items()})
    return out


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss-scaled"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adadelta"])
def test_four_micro_batches_of_16_equal_one_batch_of_64(opt_name, scaled):
    whole_model, micro_model = f64_mlp(), f64_mlp()
    whole, opt_w = _graph(whole_model, opt_name, scaled, 1)
    micro, opt_m = _graph(micro_model, opt_name, scaled, 4)
    for step in range(4):
        x, y = _batch(step)
        loss = whole(x, y).numpy()
        losses = micro(x, y).numpy()
        assert losses.shape == (4,)                     # OneFlow's pack of the scalar loss
        np.testing.assert_allclose(losses.mean(), loss, rtol=1e-12)
    assert micro.compile_count == 1
    a, b = _state(whole_model, opt_w), _state(micro_model, opt_m)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-6, err_msg=k)
        assert np.abs(b[k] - a[k]).max() < 1e-10, k     # float64: the same up to rounding
    if scaled:
        assert whole._grad_scaler.state_dict() == micro._grad_scaler.state_dict()
        assert micro._grad_scaler.scale == 2.0 ** 14    # grew twice: once per call, not per
    if opt_name != "sgd":                               # micro-batch
        assert opt_m.state_dict()["state"][0]["step"][0] == 4


def _twins():
    mf.manual_seed(0)
    a, b = mlp((64, 32, 10)), mlp((64, 32, 10))
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adadelta"])
def test_under_amp_the_accumulated_gradient_is_the_mean_of_the_micro_batch_gradients(opt_name):
    """AMP (float16 matmuls) with a dynamic scaler: the gradient an accumulating graph applies
    equals, to 1e-6, the mean of the gradients the same AMP graph computes for each micro-batch
    of 16 alone (lr 0 there: nothing moves); both scale the initial gradient per micro-batch."""
    a, b = _twins()
    alone, _ = _graph(a, opt_name, True, 1, amp=True, lr=0.0)
    micro, _ = _graph(b, opt_name, True, 4, amp=True)
    x, y = _batch(4, dtype=np.float32)
    grads = []
    for i in range(4):
        alone(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
        assert not alone._grad_scaler.found_inf
        grads.append(_grads(alone))
    micro(x, y)
    assert not micro._grad_scaler.found_inf and micro.ir.count_ops()["cast"] > 0
    got = _grads(micro)
    for k in got:
        want = np.mean([g[k].astype(np.float64) for g in grads], axis=0)
        # float32 sums of 4 terms: 1e-6 of the gradient's scale (cancellation in an element)
        np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                   err_msg=k)


def _grads(graph) -> dict:
    """The gradient results of the graph's last call (float32 master gradients)."""
    plan = next(reversed(graph.plans.values()))
    return {k: get_backend().to_numpy(plan.buffers[v]) for k, v in plan.graph.grads.items()}


def test_under_amp_accumulation_trains_like_one_batch_to_float16_rounding():
    """One batch of 64 rounds its float16 weight gradients once, four micro-batches once each:
    the trained weights agree to float16 rounding, not to 1e-6."""
    a, b = _twins()
    whole, _ = _graph(a, "sgd", True, 1, amp=True)
    micro, _ = _graph(b, "sgd", True, 4, amp=True)
    for step in range(3):
        x, y = _batch(step, dtype=np.float32)
        whole(x, y)
        micro(x, y)
    for k, v in a.state_dict().items():
        np.testing.assert_allclose(b.state_dict()[k], v, rtol=0, atol=2e-3, err_msg=k)


def test_a_non_finite_micro_batch_skips_the_whole_update():
    a, model = _twins()
    g, opt = _graph(model, "adam", True, 4, amp=True)
    x, y = _batch(1, dtype=np.float32)
    g(x, y)
    before, scale = _state(model, opt), g._grad_scaler.scale
    bad = x.copy()
    bad[40, 3] = np.inf                                # in micro-batch 2 of 4 (rows 32..47)
    losses = g(bad, y).numpy()
    assert np.isfinite(losses[[0, 1, 3]]).all() and not np.isfinite(losses[2])
    assert g._grad_scaler.found_inf and g._grad_scaler.scale == scale / 2
    after = _state(model, opt)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert (opt.num_steps, opt.num_skipped_steps) == (2, 1)


def test_the_loss_scale_meets_every_micro_batch_and_the_update_runs_once():
    g, _ = _graph(_twins()[0], "sgd", True, 4, amp=True)
    g(*_batch(dtype=np.float32))
    ir = g.ir
    schedule = ir.micro_batch_schedule()
    when = {}
    for part in ("before", "each", "after"):
        for i in getattr(schedule, part):
            when.setdefault(ir.nodes[i].op.name, set()).add(part)
    assert schedule.count == 4
    assert when["unpack"] == when["matmul"] == when["acc"] == when["pack"] == {"each"}
    assert "each" in when["scalar_mul_by_tensor"]      # the initial gradient times the scale
    for op in ("multi_count_not_finite", "dynamic_loss_scale_schedule", "sgd_update"):
        assert when[op] == {"after"}, op
    plan = next(iter(g.plans.values()))  # one flat list: the micro-batch nodes' steps 4 times
    per_node = {}
    for i in plan._owners:
        per_node[i] = per_node.get(i, 0) + 1
    assert len(plan.steps) == sum(per_node.values())
    constant = set(plan._once_owners)     # computed once, at the first run: the ones_like
    assert {ir.nodes[i].op.name for i in constant} == {"ones_like"}
    for part, times in (("before", 1), ("each", 4), ("after", 1)):
        for i in getattr(schedule, part):
            want = 0 if i in constant else times * _steps_once(plan, i)
            assert per_node.get(i, 0) == want, (part, ir.nodes[i])


def _steps_once(plan, i) -> int:
    """Steps node ``i`` makes for one micro-batch (builders may make several)."""
    node = plan.graph.nodes[i]
    return len(builder_for(node.op)(node, [plan.buffers[v] for v in node.inputs],
                                    [plan.buffers[v] for v in node.outputs]))


def test_evaluate_runs_the_micro_batches_like_the_plan():
    model = f64_mlp((64, 16, 10))
    g, opt = _graph(model, "sgd", False, 4)
    x, y = _batch(2)
    before = {f"model.{k}": v.copy() for k, v in model.state_dict().items()}
    state = {**before, **{f"{k}.momentum_buffer": np.zeros_like(v) for k, v in before.items()}}
    losses = g(x, y).numpy()
    got = evaluate(g.ir, [x, y], state)
    np.testing.assert_allclose(got["output0"], losses, rtol=1e-12)
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(got[f"model.{k}"], v, rtol=1e-12, atol=1e-14, err_msg=k)


def test_inference_in_micro_batches_returns_the_packed_outputs():
    model = f64_mlp()
    x, _ = _batch(3, n=12)
    full = EvalGraph(model)(x).numpy()
    g = EvalGraph(model)
    g.config.set_gradient_accumulation_steps(3)
    np.testing.assert_allclose(g(x).numpy(), full, rtol=1e-12)
    assert g.ir.count_ops()["unpack"] == 1 and g.ir.count_ops()["pack"] == 1


def test_clipping_acts_on_the_mean_gradient():
    whole_model, micro_model = f64_mlp(), f64_mlp()
    whole, _ = _graph(whole_model, "sgd", False, 1, clip=0.05)
    micro, _ = _graph(micro_model, "sgd", False, 4, clip=0.05)
    for step in range(2):
        whole(*_batch(step))
        micro(*_batch(step))
    for k, v in whole_model.state_dict().items():
        np.testing.assert_allclose(micro_model.state_dict()[k], v, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------- the boundary ops
def _run_loop(op, x_parts, attrs, out_shape, n):
    """Run ``op``'s CPU kernel once per micro-batch (attrs["micro_batch"] = i) on shared
    buffers: ``x_parts[i]`` is the input of micro-batch i."""
    from miniflow.ir import Node, Value
    from miniflow.dtype import as_dtype
    buf = np.full(x_parts[0].shape, np.nan, x_parts[0].dtype)
    out = np.full(out_shape, -777.0, x_parts[0].dtype)
    for i in range(n):
        np.copyto(buf, x_parts[i])
        node = Node(get_op(op), [Value("x", buf.shape, as_dtype(buf.dtype))],
                    [Value("o", out.shape, as_dtype(out.dtype))], {**attrs, "micro_batch": i})
        for fn, args in builder_for(node.op)(node, [buf], [out]):
            fn(*args)
    return out


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
def test_acc_and_pack_over_a_whole_loop(dt):
    r = np.random.default_rng(5)
    parts = [r.uniform(-2, 2, (3, 2)).astype(dt) for _ in range(4)]
    got = _run_loop("acc", parts, {"max_acc_num": 4}, (3, 2), 4)
    want = parts[0].astype(np.float32)
    for p in parts[1:]:
        want = (want + p.astype(np.float32)).astype(dt).astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-6)
    packed = _run_loop("pack", parts, {"pack_num": 4}, (12, 2), 4)
    np.testing.assert_array_equal(packed, np.concatenate(parts))
    scalars = [np.array(v, dt) for v in (1.5, -2.0, 3.25)]
    np.testing.assert_array_equal(_run_loop("pack", scalars, {"pack_num": 3}, (3,), 3),
                                  np.array([1.5, -2.0, 3.25], dt))


def test_unpack_over_a_whole_loop_covers_the_input():
    x = np.arange(24, dtype=np.int64).reshape(8, 3)
    from miniflow.ir import Node, Value
    from miniflow.dtype import int64
    out = np.full((2, 3), -1, np.int64)
    seen = []
    for i in range(4):
        node = Node(get_op("unpack"), [Value("x", x.shape, int64)], [Value("o", (2, 3), int64)],
                    {"unpack_num": 4, "micro_batch": i})
        for fn, args in builder_for(node.op)(node, [x], [out]):
            fn(*args)
        seen.append(out.copy())
    np.testing.assert_array_equal(np.concatenate(seen), x)


# ------------------------------------------------------------------------- the schedule
def _boundary_graph():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (8, 3), mf.float32)
    w = g.add_variable("w", (3,), mf.float32, data=np.ones(3, np.float32))
    xm = emit("unpack", x, unpack_num=4)
    return g, emit, x, w, xm


def test_the_schedule_follows_the_data_flow():
    g, emit, x, w, xm = _boundary_graph()
    w2 = emit("relu", w)                              # needed by the micro-batches: before
    y = emit("broadcast_mul", xm, w2)                 # a micro-batch's value
    s = emit("acc", y, max_acc_num=4)
    z = emit("exp", s)                                # after
    g.set_outputs([emit("pack", y, pack_num=4), z])
    g.verify()
    sched = g.micro_batch_schedule()
    names = [[g.nodes[i].op.name for i in part] for part in (sched.before, sched.each,
                                                              sched.after)]
    assert sched.count == 4 and names == [["relu"], ["unpack", "broadcast_mul", "acc", "pack"],
                                          ["exp"]]
    xs = np.random.default_rng(0).random((8, 3)).astype(np.float32)
    got = evaluate(g, [xs])
    np.testing.assert_allclose(got["output0"], xs, rtol=1e-7)
    parts = xs.astype(np.float64).reshape(4, 2, 3)
    np.testing.assert_allclose(got["output1"], np.exp(parts.sum(0)), rtol=1e-12)
    plan = Plan(g, get_backend())
    out = plan.run([xs])
    np.testing.assert_allclose(out[0], xs, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(parts.sum(0)), rtol=1e-5)
    assert Graph().micro_batch_schedule().count == 1


@pytest.mark.parametrize("case, match", [
    ("read acc inside", r"is the output of acc, complete only after the last micro-batch"),
    ("counts disagree", r"disagree on the number of micro-batches: \[2, 4\]"),
    ("unpacked output", r"output 'output0' .* is a value of one micro-batch; pack it"),
    ("unpack of a micro-batch", r"unpack reads a value of one micro-batch"),
])
def test_an_inconsistent_schedule_is_a_verify_error(case, match):
    g, emit, x, w, xm = _boundary_graph()
    if case == "read acc inside":
        s = emit("acc", xm, max_acc_num=4)
        g.set_outputs([emit("pack", emit("broadcast_add", xm, s), pack_num=4)])
    elif case == "counts disagree":
        g.set_outputs([emit("pack", xm, pack_num=2)])
    elif case == "unpacked output":
        g.set_outputs([xm])
    else:
        twice = emit("unpack", xm, unpack_num=2)      # f32[1,3] of a micro-batch's f32[2,3]
        g.set_outputs([emit("pack", emit("pack", twice, pack_num=2), pack_num=4)])
    with pytest.raises(VerifyError, match=match):
        g.verify()


# ------------------------------------------------------------------------- bad input
def test_an_input_that_does_not_split_is_a_clear_error():
    g, _ = _graph(f64_mlp(), "sgd", False, 4)
    x, y = _batch(n=62)
    with pytest.raises(ValueError, match=r"input 'x' has shape \[62, 64\], but "
                                         r"set_gradient_accumulation_steps\(4\) splits every "
                                         r"input along dim 0 into 4 equal micro-batches"):
        g(x, y)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "4"])
def test_set_gradient_accumulation_steps_checks_its_value(value):
    g = EvalGraph(mlp((4, 2)))
    with pytest.raises(ValueError, match=r"set_gradient_accumulation_steps: value must be an "
                                         r"integer >= 1"):
        g.config.set_gradient_accumulation_steps(value)
    assert g.config.gradient_accumulation_steps == 1


def test_changing_the_number_of_micro_batches_recompiles():
    g, _ = _graph(f64_mlp(), "sgd", False, 4)
    x, y = _batch()
    assert g(x, y).shape == (4,)
    g.config.set_gradient_accumulation_steps(2)
    assert g(x, y).shape == (2,) and g.compile_count == 2
    assert math.isfinite(float(g(x, y).numpy().mean()))


def conv_bn_net(seed=0, dtype=np.float64):
    """conv-bn-relu-pool and a linear layer over 1x8x8 images, parameters and batch-norm
    statistics in ``dtype``."""
    mf.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10))
    for m in model.modules():
        for k, p in list(m._parameters.items()):
            setattr(m, k, nn.Parameter(p.numpy().astype(dtype)))
        for k, b in list(m._buffers.items()):
            if b.dtype == mf.float32:
                setattr(m, k, b.numpy().astype(dtype))
    return model


def _images(seed=0, n=32):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, 1, 8, 8)), r.integers(0, 10, n)


def test_batch_norm_under_accumulation_follows_oneflow():
    """Batch norm with 4 micro-batches of 8 (float64), OneFlow's semantics: each micro-batch is
    normalized by its own batch statistics and updates the moving statistics in turn, once per
    micro-batch (OneFlow's ``NormalizationExponentialAverageAutoTickPass`` ties
    ``moving_mean``/``moving_variance`` to the tick of ``x``; here the ``normalization`` node
    reads a micro-batch's value, so it runs once per micro-batch), so the update is the mean of
    the micro-batches' own gradients, not one batch of 32's; ``num_batches_tracked`` counts one
    per step (OneFlow's ``num_batches_tracked.add_(1)`` reads no micro-batch value; PyTorch,
    running 4 forwards, would count 4)."""
    x, y = _images()
    model = conv_bn_net()
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.5))
    g.config.set_gradient_accumulation_steps(4)
    g(x, y)
    got = model.state_dict()

    # the moving statistics: 4 training-mode calls on the micro-batches in order (lr 0)
    seq = conv_bn_net()
    g_seq = TrainGraph(seq, mf.optim.SGD(seq.parameters(), lr=0.0))
    for k in range(4):
        g_seq(x[8 * k:8 * k + 8], y[8 * k:8 * k + 8])
    for key in ("1.running_mean", "1.running_var"):
        np.testing.assert_allclose(got[key], seq.state_dict()[key], rtol=1e-12, atol=1e-14)
    assert not np.allclose(got["1.running_mean"], 0.0)  # they moved
    assert int(got["1.num_batches_tracked"]) == 1 and int(seq.state_dict()[
        "1.num_batches_tracked"]) == 4

    # the parameters: the mean of one SGD step from the same start on each micro-batch
    # (plain SGD is linear in the gradient)
    steps = []
    for k in range(4):
        m = conv_bn_net()
        TrainGraph(m, mf.optim.SGD(m.parameters(), lr=0.5))(x[8 * k:8 * k + 8],
                                                            y[8 * k:8 * k + 8])
        steps.append(m.state_dict())
    for key, _ in model.named_parameters():
        np.testing.assert_allclose(got[key], np.mean([s[key] for s in steps], axis=0),
                                   rtol=1e-10, atol=1e-12)

    # and not one batch of 32 (its batch statistics are those of all 32 images)
    whole = conv_bn_net()
    TrainGraph(whole, mf.optim.SGD(whole.parameters(), lr=0.5))(x, y)
    assert not np.allclose(got["0.weight"], whole.state_dict()["0.weight"], rtol=1e-6)


def _9075_model(name):
    if name == "mlp":
        mf.manual_seed(0)
        return mlp((64, 32, 10)), lambda x: x
    mf.manual_seed(0)
    return mf.models.lenet(10), lambda x: x.reshape(-1, 1, 8, 8)


@pytest.mark.parametrize("model_name", ["lenet", "mlp"])
@pytest.mark.parametrize("policy", ["fp32", "cast_back", "legacy"])
def test_oneflow_issue_9075_amp_scale_2_30_and_accumulation_2_skips_until_it_backs_off(
        policy, model_name):
    """OneFlow issue 9075's setting: AMP, GradScaler(2^30), gradient accumulation 2, a conv-bn
    network (the digits LeNet: conv-bn-relu-pool twice; and the MLP), on the digits. No crash
    and no silent NaN: steps overflow and are skipped, each halves the scale, no weight and no
    batch-norm statistic ever becomes non-finite, and once the scale has backed off the updates
    apply and the loss falls."""
    from miniflow.data import load_digits
    data = load_digits()
    model, shape = _9075_model(model_name)
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    g.config.enable_amp(True, loss_scale_policy=policy)
    scaler = mf.amp.GradScaler(init_scale=2.0 ** 30, growth_interval=1000)
    g.set_grad_scaler(scaler)
    g.config.set_gradient_accumulation_steps(2)
    skipped, losses = [], []
    with pytest.warns(UserWarning) if policy != "fp32" else _no_warning():
        for step in range(40):
            rows = slice(32 * step % 1400, 32 * step % 1400 + 32)
            x = np.ascontiguousarray(shape(data.x_train[rows]))
            losses.append(float(g(x, data.y_train[rows]).numpy().mean()))
            skipped.append(scaler.found_inf)
            for name, a in model.state_dict().items():
                assert np.isfinite(a).all(), (step, name)
    first_applied = skipped.index(False)
    assert first_applied >= 1 and all(skipped[:first_applied])  # skipped until it backed off
    if policy != "fp32":  # a float16 initial gradient: the scale must fit float16
        assert 2.0 ** 30 / 2 ** first_applied < 65504
    assert sum(skipped[first_applied:]) <= 3                    # then (nearly) every step applies
    assert np.mean(losses[-5:]) < np.mean(losses[first_applied:first_applied + 5])


class _no_warning:
    def __enter__(self):
        import warnings
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)
