"""Bad input gets a clear error at the earliest point, naming the op, shapes, dtypes and the fix."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import TrainGraph, mlp

from graph_cases import Step, xy


class Fn(nn.Graph):
    """A graph whose build is a plain function, for error tests."""

    def __init__(self, fn, model=None, opt=False):
        super().__init__()
        self.fn = fn
        if model is not None:
            self.model = model
            if opt:
                self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))

    def build(self, *xs):
        return self.fn(self, *xs)


def test_shape_mismatch_while_tracing_names_op_and_shapes():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ.*f32\[3,5\].*f32\[2,4\]"):
        g(np.zeros((3, 5), np.float32))
    g2 = Fn(lambda self, a, b: a + b)
    with pytest.raises(ValueError, match=r"broadcast_add: shapes \[3,4\] of %input0 and \[5\] of %input1"):
        g2(np.zeros((3, 4), np.float32), np.zeros(5, np.float32))


def test_dtype_mismatch_and_unsupported_dtype():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    with pytest.raises(TypeError, match=r"matmul: inputs have different dtypes.*f64.*f32.*\.to\(\)"):
        g(np.zeros((3, 4), np.float64))
    with pytest.raises(TypeError, match="graph input 0: unsupported dtype"):
        g(np.zeros((3, 4), np.int32))


def test_different_rank_gets_clear_error_and_valid_new_signature_gets_new_plan():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    g(np.zeros((3, 4), np.float32))
    g(np.zeros((2, 3, 4), np.float32))  # Linear accepts [..., in]: a new, valid plan
    assert g.compile_count == 2
    with pytest.raises(ValueError, match=r"matmul.*f32\[1,7\]"):
        g(np.zeros(7, np.float32))


def test_wrong_number_of_inputs():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"build takes 2 input\(s\) \(x, y\), got 1"):
        g(np.zeros((2, 4), np.float32))


def test_labels_out_of_range():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    x = np.zeros((2, 4), np.float32)
    w = model[0].weight.numpy()
    with pytest.raises(ValueError, match=r"label out of range.*label\[1\] = 3 \(1 of 2") as e:
        g(x, np.array([0, 3]))
    assert "sparse_softmax_cross_entropy" in str(e.value)
    with pytest.raises(ValueError, match="label out of range"):
        g(x, np.array([-1, 0]))
    np.testing.assert_array_equal(w, model[0].weight.numpy())
    with pytest.raises(TypeError, match="label.*must be int64"):
        g(x, np.array([0.0, 1.0], np.float32))


def test_backward_on_non_scalar_or_twice():
    lin = nn.Linear(4, 2)

    def non_scalar(self, x):
        y = self.model(x)
        y.backward()
        return y

    with pytest.raises(RuntimeError, match=r"scalar loss.*shape \[3, 2\]"):
        Fn(non_scalar, model=lin, opt=True)(np.zeros((3, 4), np.float32))

    def twice(self, x):
        loss = self.model(x).sum()
        loss.backward()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="already called"):
        Fn(twice, model=lin, opt=True)(np.zeros((3, 4), np.float32))


def test_optimizer_without_backward():
    with pytest.raises(RuntimeError, match="never called loss.backward"):
        Fn(lambda self, x: self.model(x).sum(), model=nn.Linear(4, 2), opt=True)(
            np.zeros((3, 4), np.float32))


def test_bad_hyper_parameters():
    p = nn.Linear(2, 2).parameters()
    with pytest.raises(ValueError, match=r"lr must be finite and in \[0, inf\), got -0.1"):
        mf.optim.SGD(p, lr=-0.1)
    with pytest.raises(ValueError, match=r"beta1 must be finite and in \[0, 1\)"):
        mf.optim.Adam(nn.Linear(2, 2).parameters(), betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="reduction"):
        nn.functional.cross_entropy(mf.tensor(np.zeros((2, 3))), [0, 1], reduction="avg")


def test_lazy_tensor_cannot_escape_build():
    kept = []

    def keep(self, x):
        kept.append(x * 2.0)
        return kept[-1]

    Fn(keep)(np.ones(3, np.float32))
    kept_msg = (r"lazy tensor %\d+ \(f32\[3\]\) was kept from an nn.Graph.build \(an attribute "
                r"set in forward")
    with pytest.raises(RuntimeError, match=kept_msg):
        kept[0] + 1.0
    with pytest.raises(RuntimeError, match=kept_msg):   # said "... inside nn.Graph.build"
        kept[0].numpy()
    with pytest.raises(RuntimeError, match="cannot read the value of lazy tensor"):
        Fn(lambda self, x: mf.tensor(x.numpy()))(np.ones(3, np.float32))


# ------------------------------------------------------------------------------ found by a new user


def test_optimizer_parameters_of_unattached_modules_are_an_error():
    free = nn.Linear(4, 3)

    class S(nn.Graph):
        def __init__(self):
            super().__init__()
            self.layers = [free]  # a plain list: not found
            self.add_optimizer(mf.optim.SGD(free.parameters(), lr=0.1))

        def build(self, x, y):
            loss = nn.functional.cross_entropy(self.layers[0](x), y)
            loss.backward()
            return loss

    with pytest.raises(ValueError, match=r"SGD parameter 0 \(f32\[3, 4\]\) is not a parameter"):
        S()(*xy())


def test_a_new_lr_is_read_at_the_next_call_other_changes_recompile():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    opt = mf.optim.SGD(model.parameters(), lr=0.1)
    g = Step(model, opt)
    g(*xy())
    opt.param_groups[0]["lr"] = 1e-30  # like an LR schedule: a graph input, no recompilation
    w = model[0].weight.numpy()
    g(*xy())
    assert g.compile_count == 1 and opt.version == 0
    np.testing.assert_allclose(model[0].weight.numpy(), w, rtol=0, atol=1e-20)
    opt.param_groups[0]["weight_decay"] = 0.5  # an attribute of the update ops: recompiles
    g(*xy())
    assert g.compile_count == 2 and "weight_decay=0.5" in str(g.ir)
    g.config.enable_amp(True)
    g(*xy())
    assert g.compile_count == 3 and "cast" in g.ir.count_ops()
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.param_groups[0]["lr"] = float("nan")
    opt.param_groups[0]["lrr"] = 0.1       # a misspelt key is kept unread, as in PyTorch
    assert opt.param_groups[0]["lrr"] == 0.1 and opt.param_groups[0]["lr"] != 0.1
    g(*xy())
    assert g.compile_count == 3


def test_optimizer_added_twice_or_sharing_parameters_is_an_error():
    model = nn.Linear(4, 3)
    opt = mf.optim.SGD(model.parameters(), lr=0.1)
    g = Step(model, opt)
    with pytest.raises(ValueError, match="already added"):
        g.add_optimizer(opt)
    with pytest.raises(ValueError, match="already trained by another optimizer"):
        g.add_optimizer(mf.optim.Adam(model.parameters()))
    with pytest.raises(TypeError, match="expected a miniflow.optim optimizer"):
        g.add_optimizer(None)


def test_static_scaler_without_skipping_applies_non_finite_steps():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    scaler = mf.amp.StaticGradScaler(8.0, skip_nonfinite=False)
    g = Step(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler)
    x, y = xy()
    x[0, 0] = np.nan
    g(x, y)
    assert scaler.found_inf and scaler.num_skipped_steps == 0
    assert np.isnan(model[0].weight.numpy()).any()


@pytest.mark.parametrize("make,err,match", [
    (lambda p: mf.optim.SGD(p, lr=0.1, momentum=float("inf")), ValueError, "momentum must be finite"),
    (lambda p: mf.optim.SGD(p, lr=float("nan")), ValueError, "lr must be finite"),
    (lambda p: mf.optim.SGD(p, lr="0.1"), TypeError, "lr must be a real number"),
    (lambda p: mf.optim.Adam(p, eps=float("nan")), ValueError, "eps must be finite"),
    (lambda p: mf.optim.Adam(p, betas=0.9), TypeError, "betas must be a pair"),
    (lambda p: mf.optim.SGD([np.ones(3)], lr=0.1), TypeError, "not an nn.Parameter"),
    (lambda p: mf.optim.SGD([p[0], {"params": p[1:]}], lr=0.1), TypeError,
     "parameter 1 of group 0 is a dict, not an nn.Parameter"),
    (lambda p: mf.optim.SGD(p[0], lr=0.1), TypeError, "an ordered iterable .* got a Parameter"),
    (lambda p: mf.optim.SGD(set(p), lr=0.1), TypeError, "sets have no fixed order"),
    (lambda p: mf.optim.SGD([{"params": set(p)}], lr=0.1), TypeError, "ordered collections"),
    (lambda p: mf.optim.SGD([{"params": p[:1]}, {"params": p}], lr=0.1), ValueError,
     "some parameters appear in more than one parameter group"),
    (lambda p: mf.optim.SGD([{"params": p, "maximize": True}], lr=0.1), ValueError,
     r"add_param_group: maximize=True; miniflow's SGD runs only PyTorch's maximize=False"),
    (lambda p: mf.optim.SGD([{"params": p, "lr": -1.0}], lr=0.1), ValueError,
     "lr must be finite"),
])
def test_optimizer_arguments_are_checked_at_construction(make, err, match):
    with pytest.raises(err, match=match):
        make(list(nn.Linear(2, 2).parameters()))


@pytest.mark.parametrize("kwargs,match", [
    ({"init_scale": 1e40}, "float32 can hold"), ({"min_scale": 1e6}, "min_scale 1e\\+06 is above"),
    ({"growth_factor": float("inf")}, "growth_factor must be a finite"),
    ({"max_consecutive_skips": 2.7}, "integer >= 1")])
def test_grad_scaler_arguments_beyond_the_basic_ranges(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mf.amp.GradScaler(**kwargs)
    with pytest.raises(ValueError, match="float32 can hold"):
        mf.amp.StaticGradScaler(1e-50)


def test_failed_load_state_dict_changes_nothing():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    before = model.state_dict()
    bad = {k: np.full_like(v, 7) for k, v in before.items()}
    bad["2.bias"] = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match="2.bias"):
        model.load_state_dict(bad)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    good = {k: mf.tensor(v) for k, v in before.items()}  # Tensors are accepted too
    model.load_state_dict(good)
    scaler = mf.amp.GradScaler()
    sd = scaler.state_dict()
    with pytest.raises(ValueError):
        scaler.load_state_dict(dict(sd, growth_factor=3.0, scale=-1.0))
    assert scaler.growth_factor == 2.0
    with pytest.raises(KeyError, match=r"missing keys \['growth_factor'\]"):
        scaler.load_state_dict({k: v for k, v in sd.items() if k != "growth_factor"})


def test_tensor_truth_value_and_item():
    assert bool(mf.tensor(3.0)) and not bool(mf.tensor([0.0]))
    with pytest.raises(ValueError, match="2 elements"):
        mf.tensor([1.0, 2.0]).item()
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is "
                                           "ambiguous"):       # PyTorch's error
        bool(mf.tensor([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with no values"):
        bool(mf.zeros(0))
    with pytest.raises(TypeError, match="0-d"):
        len(mf.tensor(1.0))
    assert (mf.tensor([1.0, -1.0]) / 0).numpy().tolist() == [np.inf, -np.inf]


def test_graph_api_misuse_gets_clear_errors():
    class NoSuper(nn.Graph):
        def __init__(self):
            pass

        def build(self, x):
            return x

    with pytest.raises(RuntimeError, match="must call super"):
        NoSuper()(np.ones(2, np.float32))

    class WithDefault(nn.Graph):
        def build(self, x, scale=2.0):
            return x * scale

    assert WithDefault()([1.0, 2.0]).numpy().tolist() == [2.0, 4.0]  # a list input: float32
    with pytest.raises(TypeError, match=r"takes 1 to 2 input\(s\)"):
        WithDefault()()
    with pytest.raises(TypeError, match="relu: input 0 is a ndarray, not a miniflow Tensor"):
        nn.functional.relu(np.ones(3))
    inner = WithDefault()
    with pytest.raises(RuntimeError, match="nested nn.Graph calls are not supported"):
        Fn(lambda self, x: inner(x))(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="mode must be True or False"):
        nn.GraphConfig().enable_amp("yes")
    with pytest.raises(ValueError, match="in_features must be a positive integer"):
        nn.Linear(4.5, 3)
    with pytest.raises(TypeError, match="sum: dim must be an int, a sequence of ints or None"):
        mf.tensor([1.0, 2.0]).sum(0.5)


# ------------------------------------------------------------------------------ second new-user pass
def test_replacing_a_submodule_or_parameter_recompiles():
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    w = Wrap()
    f = Fn(lambda self, x: self.model(x), model=w)
    x = np.ones((1, 3), np.float32)
    a = f(x).numpy()
    w.fc = nn.Linear(3, 2)
    np.testing.assert_array_equal(f(x).numpy(), w(mf.tensor(x)).numpy())
    assert f.compile_count == 2 and not np.array_equal(a, f(x).numpy())
    w.fc.weight = nn.Parameter(np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(f(x).numpy(), w.fc.bias.numpy()[None])


def test_param_group_update_is_checked_and_recompiles_and_removal_is_refused():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    opt = mf.optim.Adam(model.parameters(), lr=0.1)
    g = Step(model, opt)
    g(*xy())
    opt.param_groups[0].update(lr=0.01, betas=(0.8, 0.9))
    g(*xy())
    assert g.compile_count == 2 and "beta1=0.8, beta2=0.9" in str(g.ir)
    assert opt.learning_rate[0] == 0.01
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.param_groups[0].update(lr=-5.0)
    with pytest.raises(TypeError, match="cannot be removed"):
        opt.param_groups[0].pop("lr")
    sd = opt.state_dict()
    assert sd["param_groups"][0]["betas"] == (0.8, 0.9)  # PyTorch's layout
    opt.load_state_dict(sd)


def test_loaded_scaler_settings_reach_the_compiled_graph():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    scaler = mf.amp.GradScaler(init_scale=8.0, growth_interval=1000)
    g = Step(model, mf.optim.SGD(model.parameters(), lr=0.1), scaler)
    g(*xy())
    sd = dict(scaler.state_dict(), growth_interval=1, _growth_tracker=0)
    scaler.load_state_dict(sd)
    g(*xy())
    assert scaler.scale == 16.0
    scaler.growth_interval = 2
    g(*xy())
    g(*xy())
    assert scaler.scale == 32.0 and "growth_interval=2" in str(g.ir)
    with pytest.raises(KeyError, match="unexpected keys"):
        mf.amp.StaticGradScaler(4.0).load_state_dict(scaler.state_dict())
    g.set_grad_scaler(None)
    g(*xy())
    assert "multi_count_not_finite" not in g.ir.count_ops()


def test_more_misuse_gets_clear_errors():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="nothing is compiled yet"):
        g.ir.to_dot("/tmp/never.dot")
    with pytest.raises(TypeError, match="graph input 0: .*a str"):
        g("abc")
    with pytest.raises(TypeError, match="print_ir must be True or False"):
        g.config.debug("no")


_A = np.zeros((2, 3, 4), np.float32)
_ATTENTION_OP_ERRORS = [
    ("batch_matmul", [_A, np.zeros((3, 4, 5), np.float32)], {}, ValueError,
     r"batch_matmul: batch dimensions differ: .*f32\[2,3,4\].*f32\[3,4,5\].*does not broadcast"),
    ("batch_matmul", [_A, np.zeros((2, 5, 4), np.float32)], {}, ValueError,
     r"batch_matmul: inner dimensions differ.*give 4 vs 5"),
    ("batch_matmul", [np.zeros((3, 4), np.float32)] * 2, {}, ValueError,
     r"batch_matmul: both inputs must have one rank >= 3.*use matmul"),
    ("layer_norm", [_A, np.ones(3, np.float32), np.zeros(3, np.float32)], {}, ValueError,
     r"layer_norm: gamma %in1 \(f32\[3\]\) must have the normalized shape \[4\]"),
    ("layer_norm", [_A, np.ones(4, np.float16), np.zeros(4, np.float16)], {}, TypeError,
     r"layer_norm: gamma .* must have x's dtype float32"),
    ("layer_norm", [_A], {"begin_norm_axis": 1, "begin_params_axis": 2}, ValueError,
     r"begin_params_axis 2 must equal begin_norm_axis 1"),
    ("gather", [_A, np.zeros(2, np.float32)], {}, TypeError,
     r"gather: indices %in1 \(f32\[2\]\) must be int64"),
    ("slice", [_A], {"start": (0, 0, 0), "stop": (2, 3, 4), "step": (1, -1, 1)}, ValueError,
     r"slice: step -1 on axis 1: step must be greater than zero"),
    ("slice", [_A], {"start": (0, 0), "stop": (2, 3), "step": (1, 1)}, ValueError,
     r"slice: start has 2 entries for a tensor of rank 3"),
    ("slice_update", [_A, np.zeros((2, 3, 2), np.float32)],
     {"start": (0, 0, 0), "stop": (2, 3, 4), "step": (1, 1, 1)}, ValueError,
     r"slice_update: value %in1 \(f32\[2,3,2\]\) must have the slice's shape \[2,3,4\] "
     r"\(ref %in0 \(f32\[2,3,4\]\), start \[0, 0, 0\], stop \[2, 3, 4\], step \[1, 1, 1\]\); "
     r"broadcast it"),
    ("slice_update", [_A, np.zeros((1, 3, 4), np.float16)],
     {"start": (0, 0, 0), "stop": (1, 3, 4), "step": (1, 1, 1)}, TypeError,
     r"slice_update: value %in1 \(f16\[1,3,4\]\) must have ref's dtype %in0 \(f32\[2,3,4\]\); "
     r"cast it with .to\(float32\)"),
    ("slice_update", [_A, np.zeros((2, 3, 4), np.float32)],
     {"start": (0, 0, 0), "stop": (2, 3, 4), "step": (1, 0, 1)}, ValueError,
     r"slice_update: step 0 on axis 1: step must be greater than zero"),
    ("masked_fill", [_A, np.ones((3, 5), np.int64)], {"value": 0.0}, ValueError,
     r"masked_fill: mask %in1 \(i64\[3,5\]\) must broadcast to x's shape"),
    ("tril", [np.zeros(4, np.float32)], {}, ValueError,
     r"tril: x %in0 \(f32\[4\]\) must have at least 2 dimensions"),
    ("dropout", [_A, np.zeros(2, np.int64)], {"rate": 1.5}, ValueError,
     r"dropout: rate \(PyTorch's p\) must be a probability in \[0, 1\], got 1.5"),
    ("dropout", [_A, np.zeros(3, np.int64)], {"rate": 0.5}, TypeError,
     r"dropout: state .* must be the int64 \[seed, offset\]"),
]


@pytest.mark.parametrize("op,inputs,attrs,err,match", _ATTENTION_OP_ERRORS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(_ATTENTION_OP_ERRORS)])
def test_attention_ops_refuse_bad_input_at_build(op, inputs, attrs, err, match):
    from miniflow.ir import Graph
    from miniflow.ops import emitter
    g = Graph()
    vals = [g.add_input(f"in{i}", a.shape, mf.dtype.as_dtype(a.dtype)) for i, a in
            enumerate(inputs)]
    with pytest.raises(err, match=match):
        emitter(g)(op, *vals, **attrs)
