"""``miniflow.compile`` against PyTorch's ``torch.compile`` (its doc:
https://pytorch.org/docs/stable/generated/torch.compile.html, and ``OptimizedModule``): the
results are the eager module's, the forward traces again for a new shape, dtype, mode or
constant and not otherwise, the decorator forms, the parameters shared live, ``state_dict``
behind ``_orig_mod.`` (PyTorch's keys), and the arguments miniflow cannot honour refused."""
import copy

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.compiler.optimized import MAX_GRAPHS, OptimizedModule
from miniflow.experiments.mlp import TrainGraph

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

RNG = np.random.default_rng(0)


class Counted(nn.Module):
    """An MLP with batch norm whose ``traces`` lists the input shape and mode of every trace
    (a list read, never assigned, so counting recompiles nothing)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)
        self.traces = []

    def forward(self, x, scale=1.0):
        if x.is_lazy:
            self.traces.append((tuple(x.shape), self.training, scale))
        return self.fc2(self.bn(self.fc1(x)).relu()) * scale


def _x(n=5, dtype=np.float32):
    return RNG.standard_normal((n, 4)).astype(dtype)


def _oracle(model, x, *, train):
    """``model``'s forward in NumPy float64 from its state dict (batch statistics in training
    mode, running ones in eval, biased variance, eps 1e-5)."""
    sd = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = x.astype(np.float64) @ sd["fc1.weight"].T + sd["fc1.bias"]
    mean, var = ((h.mean(0), h.var(0)) if train else
                 (sd["bn.running_mean"], sd["bn.running_var"]))
    h = (h - mean) / np.sqrt(var + 1e-5) * sd["bn.weight"] + sd["bn.bias"]
    return np.maximum(h, 0) @ sd["fc2.weight"].T + sd["fc2.bias"]


def test_a_compiled_module_returns_the_eager_modules_results_in_both_modes():
    model = Counted()
    model.bn.load_state_dict({"running_mean": RNG.standard_normal(8),
                              "running_var": RNG.uniform(0.5, 2, 8)}, strict=False)
    compiled = mf.compile(model)
    x = _x()
    for train in (True, False):
        compiled.train(train)
        out = compiled(x)
        assert type(out) is mf.Tensor and not out.is_lazy and out.dtype is mf.float32
        np.testing.assert_allclose(out.numpy(), _oracle(model, x, train=train), rtol=1e-4,
                                   atol=1e-5)
        eager = model(mf.tensor(x)).numpy()
        np.testing.assert_allclose(out.numpy(), eager, rtol=1e-5, atol=1e-6)


def test_a_forward_that_returns_none_as_nanogpts_gives_none_back():
    class LogitsLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 3)

        def forward(self, x, targets=None):
            logits = self.head(x)
            loss = None if targets is None else nn.functional.cross_entropy(logits, targets)
            return logits, loss

    model = LogitsLoss()
    compiled = mf.compile(model)
    x, y = _x(), RNG.integers(0, 3, 5)
    logits, loss = compiled(x)
    assert loss is None
    np.testing.assert_allclose(logits.numpy(), model(mf.tensor(x))[0].numpy(), rtol=1e-6)
    logits, loss = compiled(x, y)
    np.testing.assert_allclose(float(loss), float(model(mf.tensor(x), mf.tensor(y))[1]),
                               rtol=1e-6)

def test_the_forward_traces_again_for_a_new_shape_dtype_mode_or_constant_only():
    model = Counted()
    compiled = mf.compile(model)
    x = _x()
    compiled(x)
    compiled(x + 1)
    assert model.traces == [((5, 4), True, 1.0)]
    compiled(_x(7))                                   # a new shape: torch.compile recompiles
    compiled.eval()
    compiled(x)                                       # a new mode
    compiled(x, scale=2.0)                            # a new constant
    out = compiled(x, scale=2.0)
    assert model.traces == [((5, 4), True, 1.0), ((7, 4), True, 1.0), ((5, 4), False, 1.0),
                            ((5, 4), False, 2.0)]
    np.testing.assert_allclose(out.numpy(), 2 * _oracle(model, x, train=False), rtol=1e-4,
                               atol=1e-5)
    compiled.train()
    compiled(x)
    compiled(_x(7))                                   # both kept: no trace
    assert len(model.traces) == 4


@pytest.mark.filterwarnings("ignore:.*recompile limit:RuntimeWarning")
def test_graphs_beyond_the_limit_are_evicted_least_recently_used_first():
    """One graph per pattern of constants, MAX_GRAPHS kept (torch.compile's recompile limit)."""
    model = Counted().eval()
    compiled = mf.compile(model)
    x = _x()
    for scale in range(MAX_GRAPHS + 1):
        compiled(x, scale=float(scale))
    compiled(x, scale=float(MAX_GRAPHS))              # kept
    assert len(model.traces) == MAX_GRAPHS + 1
    compiled(x, scale=0.0)                            # the least recently used: evicted
    assert len(model.traces) == MAX_GRAPHS + 2


def test_train_and_eval_reach_the_original_and_attributes_pass_through():
    model = Counted()
    compiled = mf.compile(model)
    assert isinstance(compiled, OptimizedModule) and isinstance(compiled, nn.Module)
    assert mf.compiler.compile is mf.compile      # torch.compiler.compile is torch.compile too
    assert compiled._orig_mod is model and compiled.fc1 is model.fc1
    assert compiled.traces is model.traces
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert compiled.eval() is compiled and not model.training and not model.bn.training
    compiled.train()
    assert model.bn.training
    with pytest.raises(AttributeError, match="'Counted' object has no attribute 'nothing'"):
        compiled.nothing


def test_state_dict_is_behind_orig_mod_and_round_trips():
    model = Counted()
    compiled = mf.compile(model)
    sd = compiled.state_dict()
    assert list(sd) == ["_orig_mod." + k for k in model.state_dict()]
    other = mf.compile(Counted())
    other.load_state_dict(sd)
    x = _x()
    np.testing.assert_array_equal(other(x).numpy(), compiled(x).numpy())
    with pytest.raises(RuntimeError, match=r"starts with '_orig_mod\.'.*"
                                           r"model\._orig_mod\.load_state_dict"):
        other.load_state_dict(model.state_dict())
    other._orig_mod.load_state_dict(model.state_dict())
    fresh = Counted()
    fresh.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in sd.items()})
    np.testing.assert_array_equal(fresh(mf.tensor(x)).numpy(), compiled(x).numpy())


@needs_torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # torch.jit's, from torch.compile
def test_state_dict_keys_are_torch_compiles():
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    mm = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    assert list(mf.compile(mm).state_dict()) == list(torch.compile(tm).state_dict())
    mm.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    tm.eval()
    compiled = mf.compile(mm).eval()
    x = _x()
    np.testing.assert_allclose(compiled(x).numpy(), tm(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_the_compiled_forward_reads_the_parameters_live():
    model = Counted().eval()
    compiled = mf.compile(model)
    x = _x()
    compiled(x)
    sd = {k: v * 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(sd)                          # into the original, after compiling
    np.testing.assert_allclose(compiled(x).numpy(), _oracle(model, x, train=False), rtol=1e-4,
                               atol=1e-5)
    assert len(model.traces) == 1


def test_a_compiled_module_trains_inside_an_nn_graph_and_its_calls_see_the_update():
    model = Counted()
    compiled = mf.compile(model)
    step = TrainGraph(compiled, mf.optim.SGD(compiled.parameters(), lr=0.5))
    x, y = _x(8), RNG.integers(0, 3, 8)
    before = compiled(x).numpy()
    losses = [float(step(x, y)) for _ in range(3)]
    assert losses[-1] < losses[0]
    after = compiled(x).numpy()
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, _oracle(model, x, train=True), rtol=1e-4, atol=1e-5)


def test_backward_on_a_compiled_result_says_how_to_train():
    compiled = mf.compile(Counted())
    out = compiled(_x())
    with pytest.raises(RuntimeError, match=r"(?s)miniflow\.compile\(model\)'s result.*"
                                           r"class TrainStep\(nn\.Graph\).*add_optimizer"
                                           r".*loss\.backward\(\)"):
        out.sum().backward()


def test_the_decorator_forms_compile_a_function():
    calls = []

    @mf.compile
    def f(a, b, *, scale=2.0):
        calls.append(scale)
        return {"y": (a * b).relu() * scale, "parts": (a, b)}

    a, b = _x(), _x()
    out = f(a, mf.tensor(b))
    assert f.__name__ == "f" and set(out) == {"y", "parts"}
    np.testing.assert_allclose(out["y"].numpy(), np.maximum(a * b, 0) * 2, rtol=1e-6)
    np.testing.assert_array_equal(out["parts"][1].numpy(), b)
    np.testing.assert_allclose(f(a, b, scale=3.0)["y"].numpy(), np.maximum(a * b, 0) * 3,
                               rtol=1e-6)
    f(a, b)
    assert calls == [2.0, 3.0]

    def g(x):
        return x.exp()
    for deco in (mf.compile(mode="max-autotune"), mf.compile(), mf.compile(fullgraph=True)):
        np.testing.assert_allclose(deco(g)(a).numpy(), np.exp(a), rtol=1e-6)


def test_a_compiled_function_reads_the_parameters_of_the_modules_it_names_live():
    lin = training = nn.Linear(4, 2)       # (training: a name nn.Graph has too)

    @mf.compile
    def f(x):
        return lin(x) + training(x)

    method = mf.compile(lin.forward)        # the module of a method: its self
    x = _x()
    f(x), method(x)
    lin.load_state_dict({"weight": np.ones((2, 4)), "bias": np.zeros(2)})
    sums = np.repeat(x.sum(1, keepdims=True), 2, 1)
    np.testing.assert_allclose(f(x).numpy(), 2 * sums, rtol=1e-5)
    np.testing.assert_allclose(method(x).numpy(), sums, rtol=1e-5)


def test_disable_returns_the_model_and_a_copy_compiles_its_own():
    model = Counted()
    assert mf.compile(model, disable=True) is model
    compiled = mf.compile(model)
    x = _x()
    compiled(x)
    twin = copy.deepcopy(compiled)
    assert twin._orig_mod is not model
    np.testing.assert_array_equal(twin(x).numpy(), compiled(x).numpy())


def test_the_settings_miniflow_takes_change_nothing():
    x = _x()
    want = mf.compile(Counted().eval())
    for settings in ({"backend": "miniflow"}, {"dynamic": True}, {"dynamic": False},
                     {"mode": "reduce-overhead"}, {"options": {}}, {"fullgraph": True}):
        compiled = mf.compile(want._orig_mod, **settings)
        np.testing.assert_array_equal(compiled(x).numpy(), want(x).numpy())


@pytest.mark.parametrize("settings, error, match", [
    ({"backend": "eager"}, RuntimeError, r"Invalid backend: 'eager'.*'inductor', 'miniflow'"),
    ({"backend": lambda gm, inputs: gm}, RuntimeError, "Invalid backend: a function"),
    ({"mode": "fast"}, RuntimeError, "Unrecognized mode=fast, should be one of: default"),
    ({"mode": "default", "options": {}}, RuntimeError, "Either mode or options"),
    ({"options": {"triton.cudagraphs": True}}, RuntimeError,
     r"\['triton.cudagraphs'\] are TorchInductor's"),
    ({"fullgraph": "yes"}, TypeError, "fullgraph must be a bool"),
    ({"dynamic": "x"}, TypeError, "dynamic must be None, False or True"),
])
def test_settings_miniflow_cannot_honour_are_refused(settings, error, match):
    with pytest.raises(error, match=match):
        mf.compile(Counted(), **settings)
    with pytest.raises(error, match=match):       # the decorator form checks at once too
        mf.compile(**settings)


def test_what_is_not_a_model_or_an_argument_is_refused():
    with pytest.raises(TypeError, match="model is not callable"):
        mf.compile(3)
    with pytest.raises(RuntimeError, match="Model can't be None"):
        mf.compile()(None)
    with pytest.raises(TypeError, match="is an nn.Graph"):
        mf.compile(nn.Graph())
    compiled = mf.compile(Counted())
    with pytest.raises(TypeError, match=r"miniflow\.compile\(Counted\): argument 0 holds "
                                        r"something.*tuples, lists and dicts of them; got set"):
        compiled({1.0, 2.0})
    with pytest.raises(TypeError, match=r"argument 'scale' holds.*got object at \['a'\]\[1\]"):
        compiled(_x(), scale={"a": [1.0, object()]})


def test_a_forward_that_needs_a_graph_break_is_refused_naming_it():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            return h if float(h.sum()) > 0 else -h

    with pytest.raises(RuntimeError, match=r"(?s)miniflow\.compile\(Branchy\): the forward "
                                           r"reads the value.*no graph breaks"):
        mf.compile(Branchy())(_x())


def test_a_torch_dtype_argument_is_the_miniflow_dtype_it_names():
    """``compiled(x, torch.bfloat16)`` was refused ("argument 1 is a dtype") though eager
    ``x.to(torch.bfloat16)`` takes it: a torch dtype is a constant naming miniflow's."""
    torch = pytest.importorskip("torch")

    @mf.compile
    def cast(x, dt):
        return x.to(dt)

    x = np.ones(2, np.float32)
    assert cast(x, torch.bfloat16).dtype is mf.bfloat16
    assert cast(x, torch.float64).dtype is mf.float64
    assert cast(x, mf.float16).dtype is mf.float16


def test_tuples_lists_and_dicts_of_tensors_and_constants_are_arguments_as_pytrees():
    """torch.compile takes pytrees (nested tuples, lists and dicts of tensors and Python
    scalars); miniflow refused a list or dict argument. The tensors are inputs, the structure
    and the other leaves part of the signature, nested results come back nested."""
    traces = []

    @mf.compile
    def f(pair, d, *, opts=None):
        traces.append(opts)
        a, b = pair
        y = (a * b + d["w"][0]) * d["scale"]
        return {"y": y, "both": [a + 1, (b,)], "none": None}

    a, b, w = _x(), _x(), _x()
    out = f((a, mf.tensor(b)), {"w": [w], "scale": 2.0})
    np.testing.assert_allclose(out["y"].numpy(), (a * b + w) * 2, rtol=1e-6)
    assert out["none"] is None and type(out["both"][1]) is tuple
    np.testing.assert_array_equal(out["both"][1][0].numpy(), b)
    f((a + 1, b), {"w": [w], "scale": 2.0})                 # new values only: no trace
    assert traces == [None]
    out = f([a, b], {"w": [w], "scale": 3.0}, opts={"k": (1, "s")})   # list, constants
    np.testing.assert_allclose(out["y"].numpy(), (a * b + w) * 3, rtol=1e-6)
    f((a, b), {"scale": 2.0, "w": [w]})                     # another key order: a new structure
    assert traces == [None, {"k": (1, "s")}, None]
    assert f((a, b), {"w": [w], "scale": 2})["y"].dtype is mf.float32   # int 2 is not 2.0
    assert len(traces) == 4


@needs_torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_pytree_arguments_give_torch_compiles_results():
    def f(xs, cfg):
        return [x * cfg["s"] for x in xs], {"sum": xs[0] + xs[1]}

    a, b = _x(), _x()
    want = torch.compile(f)([torch.from_numpy(a), torch.from_numpy(b)], {"s": 1.5})
    got = mf.compile(f)([a, b], {"s": 1.5})
    assert type(got) is tuple and type(got[0]) is list and list(got[1]) == ["sum"]
    for g, w in [(got[0][0], want[0][0]), (got[0][1], want[0][1]),
                 (got[1]["sum"], want[1]["sum"])]:
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)


SCALE = 2.0
LIN = nn.Linear(4, 2)
OFFSET = mf.tensor(np.ones(2, np.float32))
TRACES = []


def _helper(x):
    return x * SCALE


def _reads_globals(x):
    TRACES.append(SCALE)
    return _helper(LIN(x)) + OFFSET


def test_a_re_bound_global_traces_again_as_torch_compiles_guards():
    """A compiled function bound the globals it read at its first call: SCALE = 3.0 or
    LIN = nn.Linear(...) afterwards kept the old ones (torch.compile guards and recompiles).
    Numbers by value, objects by identity, through the helpers it calls, lambdas and closures."""
    global SCALE, LIN
    f = mf.compile(_reads_globals)
    x = _x()
    old = (SCALE, LIN)
    try:
        TRACES.clear()
        lin = LIN
        want = lambda: (x @ LIN.weight.numpy().T + LIN.bias.numpy()) * SCALE + 1  # noqa: E731
        np.testing.assert_allclose(f(x).numpy(), want(), rtol=1e-5, atol=1e-5)
        f(x)
        SCALE = 3.0                                       # read by the helper only
        np.testing.assert_allclose(f(x).numpy(), want(), rtol=1e-5, atol=1e-5)
        LIN = nn.Linear(4, 2)                             # another module
        np.testing.assert_allclose(f(x).numpy(), want(), rtol=1e-5, atol=1e-5)
        SCALE = 3.0
        f(x)
        assert TRACES == [2.0, 3.0, 3.0]
        LIN = lin                                         # the first module again: its graph
        SCALE = 2.0
        f(x)
        assert TRACES == [2.0, 3.0, 3.0]
    finally:
        SCALE, LIN = old

    factor = 2.0
    g = mf.compile(lambda x: x * factor)                  # a closure variable
    np.testing.assert_allclose(g(x).numpy(), 2 * x, rtol=1e-6)
    factor = 5.0
    np.testing.assert_allclose(g(x).numpy(), 5 * x, rtol=1e-6)

    class Scaled(nn.Module):                              # a compiled module's forward
        def forward(self, x):
            return x * factor
    m = mf.compile(Scaled())
    m(x)
    factor = 0.5
    np.testing.assert_allclose(m(x).numpy(), 0.5 * x, rtol=1e-6)


def test_a_global_tensor_is_read_at_every_call_as_torch_compiles_input():
    """An eager tensor a compiled function read from outside was a constant of its graph: a
    write into it afterwards was not seen (torch.compile reads its current value). It is a
    graph variable now, sharing its data; re-binding the name traces again."""
    global OFFSET
    f = mf.compile(_reads_globals)
    x = _x()
    old = OFFSET
    try:
        base = f(x).numpy() - 1
        OFFSET[0] = 5.0                                   # in place
        np.testing.assert_allclose(f(x).numpy(), base + [5.0, 1.0], rtol=1e-5, atol=1e-5)
        OFFSET = mf.tensor(np.full(2, -1.0, np.float32))  # re-bound
        np.testing.assert_allclose(f(x).numpy(), base - 1, rtol=1e-5, atol=1e-5)
    finally:
        OFFSET = old
        OFFSET[0] = 1.0
    if torch is not None:
        t = torch.ones(2)
        tf = torch.compile(lambda x: x + t)
        tf(torch.zeros(2))
        t[0] = 5.0
        assert tf(torch.zeros(2)).tolist() == [5.0, 1.0]   # what miniflow does now


def test_the_recompile_limit_warns_as_torch_compile_naming_the_last_reason():
    step = 0

    def f(x):
        return x + step

    g = mf.compile(f)
    x = _x()
    for step in range(MAX_GRAPHS):
        g(x)
    step = MAX_GRAPHS
    with pytest.warns(RuntimeWarning, match=r"(?s)hit its recompile limit \(8\).*"
                                            r"config\.recompile_limit.*function: 'f' \(.*"
                                            r"test_compile\.py:\d+\).*last reason: 'step' "
                                            r"changed.*least recently used"):
        np.testing.assert_allclose(g(x).numpy(), x + MAX_GRAPHS, rtol=1e-6)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # once
        step = MAX_GRAPHS + 1
        g(x)


def test_a_re_bound_object_is_seen_even_where_python_reuses_the_old_ones_address():
    """Objects are guarded by identity; the graphs hold them, so a new object never takes the
    id of one a kept graph was traced with (CPython reuses a freed object's address)."""
    class Cfg:
        def __init__(self, k):
            self.k = k

    cfg = Cfg(0.0)
    f = mf.compile(lambda x: x * cfg.k)
    x = _x()
    for k in range(5):
        del cfg
        cfg = Cfg(float(k))
        np.testing.assert_allclose(f(x).numpy(), k * x, rtol=1e-6)


SHARED = nn.Linear(4, 4)


class _ReadsAGlobalModule(nn.Module):
    def forward(self, x):
        return SHARED(x)


def test_a_compiled_modules_forward_reads_a_global_modules_parameters_live():
    compiled = mf.compile(_ReadsAGlobalModule())
    x = _x()
    compiled(x)
    SHARED.load_state_dict({"weight": np.eye(4), "bias": np.ones(4)})
    np.testing.assert_allclose(compiled(x).numpy(), x + 1, rtol=1e-6)
