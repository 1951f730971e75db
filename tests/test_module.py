"""``nn.Module``'s state dict against PyTorch's ``torch.nn.Module`` (``state_dict`` /
``load_state_dict`` docs): a module or parameter reachable under two names is listed under both
(``parameters()`` yields it once) and a PyTorch checkpoint of such a model loads strictly; a value
of another real dtype is cast as ``Tensor.copy_`` casts it, and only what cannot be cast is
refused (nothing is changed then)."""
from collections import OrderedDict

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _shared(lib):
    """``net.a = net.b = Linear(2, 3)``, ``net.c``: a module holding ``a.weight`` too (a
    Parameter of two modules), ``net.d = Sequential(net.a)``; miniflow's (``lib=nn``) or torch's."""
    net = lib.Module()
    net.a = net.b = lib.Linear(2, 3)
    net.c = lib.Module()
    net.c.w = net.a.weight
    net.d = lib.Sequential(net.a)
    return net


EXPECTED = ["a.weight", "a.bias", "b.weight", "b.bias", "c.w", "d.0.weight", "d.0.bias"]


def test_a_module_under_two_names_is_listed_under_both_and_its_parameters_once():
    net = _shared(nn)
    assert list(net.state_dict()) == EXPECTED
    assert [n for n, _ in net.named_parameters()] == ["a.weight", "a.bias"]
    assert len(list(net.parameters())) == 2
    sd = net.state_dict()
    sd["b.weight"] = sd["b.weight"] + 1  # the names reach one tensor: the model's last wins
    sd["d.0.weight"] = sd["c.w"] = sd["b.weight"]
    net.load_state_dict(sd)
    np.testing.assert_array_equal(net.a.weight.numpy(), sd["b.weight"])
    with pytest.raises(KeyError, match=r"missing keys \['b.weight', 'b.bias'"):
        net.load_state_dict({k: v for k, v in sd.items() if not k.startswith("b.")})


@needs_torch
def test_a_pytorch_checkpoint_of_a_model_with_a_shared_module_loads_strictly():
    ref = _shared(torch.nn)
    assert list(ref.state_dict()) == EXPECTED
    assert len(list(ref.parameters())) == 2
    net = _shared(nn)
    net.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()}, strict=True)
    x = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
    want = ref.d(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(net.d(mf.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-6)


@needs_torch
def test_torch_parameters_that_require_grad_load_as_torchs_load_state_dict():
    """``net.load_state_dict(dict(ref.named_parameters()))`` or ``ref.state_dict(keep_vars=True)``
    (tensors that require grad) raised torch's own "Can't call numpy() on Tensor that requires
    grad"; PyTorch's ``load_state_dict`` copies them under ``no_grad``, and so do we."""
    ref = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    net.load_state_dict(ref.state_dict(keep_vars=True))
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(net.state_dict()[k], v.numpy())
    with torch.no_grad():
        ref[0].weight.add_(1.0)
    assert net.load_state_dict(dict(ref.named_parameters()), strict=False).missing_keys == [
        "1.running_mean", "1.running_var"]
    np.testing.assert_array_equal(net[0].weight.numpy(), ref[0].weight.detach().numpy())


def test_load_state_dict_takes_pytorchs_assign_keyword_at_its_default():
    """``load_state_dict(sd, strict, assign=False)`` (PyTorch >= 2.1's signature; scripts pass
    ``assign=False`` explicitly) raised Python's "unexpected keyword argument 'assign'".
    ``assign=False`` copies as PyTorch's does; ``assign=True`` (the state dict's tensors become
    the parameters) is refused, naming it, and changes nothing."""
    net = nn.Linear(3, 2)
    sd = {k: np.full(v.shape, 0.5, np.float32) for k, v in net.state_dict().items()}
    before = net.state_dict()
    with pytest.raises(ValueError, match=r"assign=True is not supported: miniflow copies the "
                                         r"values into the parameters in place"):
        net.load_state_dict(sd, assign=True)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    assert net.load_state_dict(sd, True, False) == ([], [])
    assert net.load_state_dict(sd, strict=False, assign=False) == ([], [])
    np.testing.assert_array_equal(net.weight.numpy(), sd["weight"])
    if torch is not None:
        ref = torch.nn.Linear(3, 2)
        assert ref.load_state_dict({k: torch.tensor(v) for k, v in sd.items()},
                                   assign=False) == ([], [])


@needs_torch
@pytest.mark.parametrize("src", [np.float64, np.float16, "bfloat16", np.int32, np.bool_],
                         ids=str)
def test_a_value_of_another_real_dtype_is_cast_as_torch_copy_(src):
    """``torch.nn.Module.load_state_dict`` copies with ``Tensor.copy_``, which casts."""
    r = np.random.default_rng(1)
    w = (r.standard_normal((3, 2)) * 4).astype(mf.bfloat16.np if src == "bfloat16" else src)
    lin, ref = nn.Linear(2, 3), torch.nn.Linear(2, 3)
    bias = np.arange(3, dtype=np.float64) / 3
    lin.load_state_dict({"weight": w, "bias": bias})
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w.astype(np.float32) if src == "bfloat16" else w))
        ref.bias.copy_(torch.from_numpy(bias))
    assert lin.weight.dtype is mf.float32
    np.testing.assert_array_equal(lin.weight.numpy(), ref.weight.detach().numpy())
    np.testing.assert_array_equal(lin.bias.numpy(), ref.bias.detach().numpy())


def test_a_float64_value_beyond_float16_loads_as_inf_into_a_float16_tensor():
    m = nn.Module()
    m.w = nn.Parameter(np.zeros(2, np.float16))
    m.load_state_dict({"w": np.array([1e6, 1 / 3])})
    assert m.w.numpy().tolist() == [np.inf, np.float16(1 / 3)]


@pytest.mark.parametrize("key,value,match", [
    ("weight", np.ones((3, 2), np.complex64), r"'weight' has dtype complex64 .*real numbers"),
    ("weight", np.array([["a", "b"]] * 3), r"'weight' has dtype <U1"),
    ("count", np.array(2.5), r"'count' holds 2.5, which the model's int64 cannot hold"),
    ("count", np.array(np.nan), r"'count' holds nan"),
    ("count", np.array(2 ** 64 - 1, np.uint64), r"'count' holds 18446744073709551615"),
])
def test_what_cannot_be_cast_is_refused_and_nothing_changes(key, value, match):
    m = nn.Linear(2, 3)
    m.register_buffer("count", np.array(4, np.int64))
    before = m.state_dict()
    sd = dict(before, bias=before["bias"] + 1, **{key: value})
    with pytest.raises(TypeError, match=match):
        m.load_state_dict(sd)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    m.load_state_dict(dict(before, count=np.array(7.0)))  # a whole float counts
    assert m.count.numpy().dtype == np.int64 and int(m.count.item()) == 7


def test_module_version_counts_every_change_a_compiled_graph_must_follow():
    """``Module.version``: ``traced`` for a replaced or removed parameter, buffer or sub-module
    and a flipped ``requires_grad`` / ``track_running_stats``; ``modes`` for a flipped
    ``training``; a no-op changes neither."""
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    lin, bn = m[0], m[1]

    def bumps(change):
        before = nn.Module.version
        change()
        after = nn.Module.version
        return after.traced - before.traced, after.modes - before.modes

    assert bumps(lambda: setattr(lin, "weight", nn.Parameter(np.zeros((2, 2), np.float32)))) \
        == (1, 0)
    assert bumps(lambda: delattr(lin, "bias")) == (1, 0)
    assert bumps(lambda: setattr(bn, "running_mean", np.ones(2, np.float32))) == (1, 0)
    assert bumps(lambda: setattr(m, "1", nn.Identity())) == (1, 0)
    assert bumps(lambda: lin.weight.requires_grad_(False)) == (1, 0)
    assert bumps(lambda: lin.weight.requires_grad_(False)) == (0, 0)
    assert bumps(lambda: setattr(bn, "track_running_stats", False)) == (1, 0)
    assert bumps(lambda: setattr(bn, "track_running_stats", False)) == (0, 0)
    assert bumps(m.eval) == (0, 3)                    # m, its Linear and the Identity
    assert bumps(m.eval) == (0, 0)
    assert bumps(lambda: setattr(lin, "plain", 3)) == (0, 0)


def test_sequential_takes_an_ordered_dict_and_slices_into_a_sequential():
    """``torch.nn.Sequential``'s documentation: an ``OrderedDict`` of modules names them by its
    keys; ``seq[i:j]`` is a Sequential that keeps the names (PyTorch's
    ``test_nn.py::test_Sequential_getitem``); a name with a dot is refused (``add_module``)."""
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(OrderedDict(fc1=a, act=b, fc2=c))
    assert list(seq.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert seq[0] is a and seq[-1] is c and list(seq) == [a, b, c]
    tail = seq[1:]
    assert isinstance(tail, nn.Sequential) and list(tail) == [b, c]
    assert list(tail.state_dict()) == ["fc2.weight", "fc2.bias"]
    assert list(nn.Sequential(a, b, c)[::2].state_dict()) == ["0.weight", "0.bias", "2.weight",
                                                             "2.bias"]
    with pytest.raises(ValueError, match=r"Sequential: module name 'a\.b' must be non-empty"):
        nn.Sequential(OrderedDict([("a.b", a)]))
    with pytest.raises(TypeError, match="Sequential: module 'x' is int, not a Module"):
        nn.Sequential(OrderedDict(x=1))
    if torch is None:
        pytest.skip("torch is not installed")
    want = torch.nn.Sequential(OrderedDict(fc1=torch.nn.Linear(2, 3), act=torch.nn.ReLU()))
    assert list(want[1:]._modules) == list(seq[1:2]._modules) == ["act"]


@pytest.mark.parametrize("value", [np.ones((3, 4), np.float32), "tensor"])
def test_module_refuses_a_non_parameter_assigned_to_a_parameter_and_keeps_it(value):
    """``torch.nn.Module.__setattr__``: a parameter's name takes an ``nn.Parameter`` or None
    (TypeError "cannot assign ... as parameter 'weight'"); the parameter stays registered."""
    m = nn.Linear(4, 3)
    before = m.weight
    value = mf.tensor(np.ones((3, 4), np.float32)) if isinstance(value, str) else value
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'weight'"):
        m.weight = value
    assert m.weight is before
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    m.weight = nn.Parameter(np.zeros((3, 4), np.float32))   # a Parameter replaces it
    assert np.array_equal(m.state_dict()["weight"], np.zeros((3, 4), np.float32))
    m.bias = None   # None keeps the name registered, as torch does: listed nowhere
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert list(m.state_dict()) == ["weight"]
    m.bias = nn.Parameter(np.ones(3, np.float32))
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    with pytest.raises(TypeError, match="as child module '0'"):
        nn.Sequential(nn.Linear(2, 2)).__setattr__("0", 3)
    if torch is not None:
        ref = torch.nn.Linear(4, 3)
        with pytest.raises(TypeError, match="cannot assign .* as parameter 'weight'"):
            ref.weight = torch.ones(3, 4)


@pytest.mark.parametrize("prefix", ["model", "model."])
def test_module_named_parameters_joins_a_prefix_with_a_dot(prefix):
    """``torch.nn.Module.named_parameters(prefix="model")``: ``model.0.weight`` (it gave
    ``model0.weight``), as miniflow's ``named_modules`` / ``named_buffers`` join it."""
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    names = [n for n, _ in net.named_parameters(prefix=prefix)]
    assert names[:2] == ["model.0.weight", "model.0.bias"]
    assert names == ["model." + n for n, _ in net.named_parameters()]
    assert [n for n, _ in net.named_buffers(prefix=prefix)] == \
        ["model." + n for n, _ in net.named_buffers()]
    if torch is not None:
        ref = torch.nn.Sequential(torch.nn.Linear(2, 3))
        assert [n for n, _ in ref.named_parameters(prefix="model")][:2] == names[:2]


def test_module_load_state_dict_returns_missing_and_unexpected_keys_and_strict_raises_runtime():
    """``torch.nn.Module.load_state_dict`` returns ``_IncompatibleKeys(missing_keys,
    unexpected_keys)`` (it returned None) and, with ``strict=True``, raises RuntimeError; the
    error is a KeyError too, as miniflow raised before."""
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    sd = net.state_dict()
    assert net.load_state_dict(sd) == ([], [])
    del sd["0.bias"], sd["1.num_batches_tracked"]   # the counter is optional, as in torch
    sd["extra"] = np.zeros(1, np.float32)
    missing, unexpected = net.load_state_dict(sd, strict=False)
    assert (missing, unexpected) == (["0.bias"], ["extra"])
    result = net.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["0.bias"] and result.unexpected_keys == ["extra"]
    for error in (RuntimeError, KeyError):
        with pytest.raises(error, match=r"^load_state_dict: missing keys \['0.bias'\], "
                                        r"unexpected keys \['extra'\]$"):
            net.load_state_dict(sd)
    if torch is not None:
        ref = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
        tsd = {k: torch.from_numpy(v) for k, v in sd.items()}
        assert tuple(ref.load_state_dict(tsd, strict=False)) == (missing, unexpected)
        with pytest.raises(RuntimeError):
            ref.load_state_dict(tsd)


def test_a_shape_mismatch_is_a_runtime_error_as_in_pytorch_and_a_value_error():
    """A new user's finding: PyTorch's "size mismatch" is a RuntimeError, with strict=False
    too; miniflow raised a ValueError, which code written for PyTorch does not catch."""
    net = nn.Linear(2, 3)
    for error in (RuntimeError, ValueError):
        for strict in (True, False):
            with pytest.raises(error, match=r"'weight' is f32\[3, 2\] in the model but "
                                            r"float32\[4, 2\] in the state dict"):
                net.load_state_dict({"weight": np.zeros((4, 2), np.float32),
                                     "bias": np.zeros(3, np.float32)}, strict=strict)


# ------------------------------------------------------------------------- ModuleList, ModuleDict
def _stack(lib, widths):
    """A model holding a ModuleList of Linear layers and a ModuleDict of two heads, built with
    ``lib`` (miniflow's nn or torch.nn); :func:`_stack_forward` runs it."""
    model = lib.Module()
    model.layers = lib.ModuleList([lib.Linear(a, b) for a, b in zip(widths, widths[1:])])
    model.heads = lib.ModuleDict({"score": lib.Linear(widths[-1], 1),
                                  "cls": lib.Linear(widths[-1], 3)})
    return model


def _stack_forward(model, x):
    for layer in model.layers:
        x = layer(x).relu()
    return model.heads["score"](x), model.heads["cls"](x)


def test_module_list_and_dict_name_state_dict_keys_as_pytorch_and_trace_in_a_graph():
    """``torch.nn.ModuleList`` / ``ModuleDict`` docs: children named by position and by key
    (``layers.0.weight``, ``heads.cls.bias``); iterating them in ``forward`` traces every
    layer. Oracle: NumPy float64 on the same weights (and PyTorch's keys when installed)."""
    mf.manual_seed(0)
    model = _stack(nn, [4, 5, 6])
    keys = list(model.state_dict())
    assert keys == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                    "heads.score.weight", "heads.score.bias", "heads.cls.weight", "heads.cls.bias"]
    assert len(list(model.parameters())) == 8

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return _stack_forward(self.model, x)

    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    score, cls = (t.numpy() for t in G()(mf.tensor(x)))
    sd = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = x.astype(np.float64)
    for i in range(2):
        h = np.maximum(h @ sd[f"layers.{i}.weight"].T + sd[f"layers.{i}.bias"], 0)
    np.testing.assert_allclose(score, h @ sd["heads.score.weight"].T + sd["heads.score.bias"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cls, h @ sd["heads.cls.weight"].T + sd["heads.cls.bias"],
                               rtol=1e-5, atol=1e-6)
    if torch is not None:
        assert list(_stack(torch.nn, [4, 5, 6]).state_dict()) == keys


def test_module_list_methods_follow_pytorch_and_renumber():
    """PyTorch's ``test_nn.py::test_ModuleList``: indexing (negative too), slices as new lists
    numbered from 0, ``append`` / ``extend`` / ``insert`` / ``pop`` / ``del`` / ``+`` / ``+=``,
    and the names renumbered after a deletion or insertion."""
    a, b, c, d = (nn.Linear(1, 1) for _ in range(4))
    ml = nn.ModuleList([a, b])
    assert ml.append(c) is ml and list(ml) == [a, b, c] and len(ml) == 3
    assert ml[-1] is c and ml[0] is a
    part = ml[1:]
    assert isinstance(part, nn.ModuleList) and list(part) == [b, c]
    assert list(part._modules) == ["0", "1"]
    ml.insert(1, d)
    assert list(ml) == [a, d, b, c] and list(ml._modules) == ["0", "1", "2", "3"]
    ml.insert(-1, nn.Identity())         # list.insert's rule: before the last
    assert isinstance(ml[3], nn.Identity) and ml[4] is c
    del ml[3]
    assert ml.pop(1) is d and list(ml) == [a, b, c]
    assert list(ml.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight",
                                     "2.bias"]
    del ml[:2]
    assert list(ml) == [c] and ml[0] is c
    ml += [a]
    both = ml + nn.ModuleList([b])
    assert list(ml) == [c, a] and list(both) == [c, a, b]
    ml[0] = d
    assert list(ml) == [d, a] and ml.extend(nn.Sequential(b)) is ml and list(ml) == [d, a, b]
    assert list(nn.ModuleList()) == [] and len(nn.ModuleList(iter([a]))) == 1


@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.ModuleList([nn.Linear(1, 1), 3]), TypeError, "ModuleList holds modules: got a int"),
    (lambda: nn.ModuleList([nn.Linear(1, 1)])[1], IndexError,
     "ModuleList index 1 is out of range for 1 modules"),
    (lambda: nn.ModuleList([nn.Linear(1, 1)])["0"], TypeError,
     "ModuleList indices must be integers or slices, got str"),
    (lambda: nn.ModuleList().extend(nn.Linear(1, 1)), TypeError,
     r"ModuleList.extend takes an iterable of modules, got a Linear \(append adds one"),
    (lambda: nn.ModuleDict({"a": "layer"}), TypeError,
     "ModuleDict holds modules: got a str for key 'a'"),
    (lambda: nn.ModuleDict({1: nn.Linear(1, 1)}), TypeError,
     "ModuleDict.add_module: the module name must be a str, got int 1"),
    (lambda: nn.ModuleDict({"a.b": nn.Linear(1, 1)}), KeyError,
     r"the module name must be non-empty and contain no '\.'"),
    (lambda: nn.ModuleDict({"": nn.Linear(1, 1)}), KeyError, "must be non-empty"),
    (lambda: nn.ModuleDict({"keys": nn.Linear(1, 1)}), KeyError,
     "ModuleDict.add_module: attribute 'keys' already exists"),
    (lambda: nn.ModuleDict({"training": nn.Linear(1, 1)}), KeyError,
     "attribute 'training' already exists"),
    (lambda: nn.ModuleDict([("a", nn.Linear(1, 1), 3)]), TypeError,
     r"element 0 has 3 items, expected a \(key, module\) pair"),
    (lambda: nn.ModuleDict(5), TypeError, "ModuleDict.update takes a mapping or an iterable"),
    (lambda: nn.ModuleDict()["missing"], KeyError, "missing"),
    (lambda: nn.ModuleList([nn.ReLU()]).append(None), TypeError,
     "ModuleList holds modules: got a NoneType"),
    (lambda: nn.ModuleList([nn.ReLU()]).__setitem__(slice(0, 1), [nn.ReLU()]), TypeError,
     "ModuleList: a slice cannot be assigned"),
    (lambda: nn.ParameterList([np.zeros(2)])[2], IndexError,
     "ParameterList index 2 is out of range for 1 parameters"),
    (lambda: nn.ParameterList().extend(3), TypeError,
     "ParameterList.extend should be called with an iterable, but got int"),
    (lambda: nn.ParameterList([np.zeros(2)]).__setitem__(slice(0, 1), []), TypeError,
     "ParameterList: a slice cannot be assigned"),
])
def test_containers_refuse_what_pytorch_refuses(make, error, match):
    """PyTorch's ``add_module`` checks (a non-str, empty, dotted or existing-attribute name:
    KeyError / TypeError), modules only, indices in range; miniflow's messages name the fix."""
    with pytest.raises(error, match=match):
        make()


class _SumStep(nn.Graph):
    """One SGD step (lr 0.5) of ``model(x).sum()``."""

    def __init__(self, model):
        super().__init__()
        self.m = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.5))

    def build(self, x):
        loss = self.m(x).sum()
        loss.backward()
        return loss


def test_parameter_list_follows_pytorch_and_trains_in_a_graph():
    """PyTorch's ``test_nn.py::test_ParameterList``: parameters named by position (state-dict
    keys ``ps.0`` ...), an array made a Parameter, indexing, slicing, ``append``, ``extend``,
    ``+=``, assignment; the list's parameters train in a graph (one SGD step, its gradient)."""
    class Affine(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([np.ones((3, 4), np.float32)])
            self.ps.append(nn.Parameter(np.zeros(3, np.float32)))

        def forward(self, x):
            return x @ self.ps[0].T + self.ps[1]

    m = Affine()
    assert list(m.state_dict()) == ["ps.0", "ps.1"] and isinstance(m.ps[0], nn.Parameter)
    assert len(list(m.parameters())) == 2 and list(m.ps[1:]) == [m.ps[1]]
    extra = nn.Parameter(np.ones(2, np.float32))
    m.ps += [extra]
    assert m.ps.extend([]) is m.ps and list(m.ps)[2] is extra and len(m.ps) == 3
    m.ps[2] = np.full(2, 5.0, np.float32)
    np.testing.assert_array_equal(m.state_dict()["ps.2"], [5.0, 5.0])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _SumStep(m)(x)
    np.testing.assert_allclose(m.ps[1].numpy(), [-1.0, -1.0, -1.0])   # d(sum)/d(bias) = 2 rows
    np.testing.assert_allclose(m.ps[0].numpy(), 1.0 - 0.5 * np.tile(x.sum(0), (3, 1)))


def _parameter_dict_keys(lib, param) -> list:
    """The keys of a ``lib.nn.ParameterDict`` (``miniflow`` or ``torch``) after each of its dict
    methods; ``param(v)`` makes a parameter of value ``v``."""
    p = {k: param(i) for i, k in enumerate("abcde")}
    d = lib.nn.ParameterDict({"c": p["c"], "a": p["a"]})        # a plain dict: sorted keys
    seen = [list(d)]
    d.update([("e", p["e"]), ("b", p["b"])])                   # pairs: in their order
    d["a"] = p["d"]                                            # replacing keeps the position
    seen += [list(d), list(reversed(d)), list(d.keys()), len(d), "z" in d, "b" in d]
    seen += [d.get("z", 7), d.get("a") is p["d"], d.setdefault("a") is p["d"]]
    assert d.setdefault("f", p["a"]) is p["a"]
    seen += [list(d), d.pop("e") is p["e"], list(d)]
    key, value = d.popitem()
    seen += [key, value is p["a"], list(d)]
    merged = d | lib.nn.ParameterDict(OrderedDict([("y", p["e"]), ("x", p["a"])]))
    seen += [list(merged), list(d), list(d.copy()), list(d.fromkeys(["u", "v"]))]
    d |= merged
    seen += [list(d), all(v is merged[k] for k, v in d.items())]
    d.clear()
    seen += [list(d), len(d)]
    return seen


def test_parameter_dict_follows_pytorch_and_trains_in_a_graph():
    """``nn.ParameterDict`` against ``torch.nn.ParameterDict``: the same keys after the same dict
    methods (a plain dict's keys sorted, pairs in order, replacement in place, ``|`` ...), the
    same state-dict keys, and its parameters train in a graph as PyTorch's (one SGD step)."""
    torch = pytest.importorskip("torch")
    mine = _parameter_dict_keys(mf, lambda v: nn.Parameter(np.full(2, v, np.float32)))
    theirs = _parameter_dict_keys(torch, lambda v: torch.nn.Parameter(torch.full((2,), float(v))))
    assert mine == theirs

    class Affine(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterDict({"weight": np.ones((3, 4), np.float32),
                                        "bias": np.zeros(3, np.float32)})

        def forward(self, x):
            return x @ self.ps["weight"].T + self.ps["bias"]

    class TorchAffine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterDict({"weight": torch.ones(3, 4),
                                              "bias": torch.zeros(3)})

    m, ref = Affine(), TorchAffine()
    assert isinstance(m.ps["bias"], nn.Parameter) and list(m.ps) == ["bias", "weight"]
    assert list(m.state_dict()) == list(ref.state_dict()) == ["ps.bias", "ps.weight"]

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _SumStep(m)(x)
    (torch.tensor(x) @ ref.ps["weight"].T + ref.ps["bias"]).sum().backward()
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(m.state_dict()[k], v.numpy(), err_msg=k)


@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.ParameterDict({1: np.zeros(2)}), TypeError,
     r"Index given to ParameterDict cannot be used as a key as it is not a string \(type is "
     r"'int'\)"),
    (lambda: nn.ParameterDict({"a.b": np.zeros(2)}), KeyError, "contain no '\\.'"),
    (lambda: nn.ParameterDict({"keys": np.zeros(2)}), KeyError,
     "ParameterDict.register_parameter: attribute 'keys' already exists"),
    (lambda: nn.ParameterDict(5), TypeError,
     "ParametersDict.update should be called with an iterable of key/value pairs, but got int"),
    (lambda: nn.ParameterDict([("a", np.zeros(2), 3)]), ValueError,
     "ParameterDict update sequence element #0 has length 3; 2 is required"),
    (lambda: nn.ParameterDict([5]), TypeError,
     "ParameterDict update sequence element #0 should be Iterable; is int"),
    (lambda: nn.ParameterDict()["missing"], KeyError, "missing"),
    (lambda: nn.ParameterDict().popitem(), KeyError, "ParameterDict is empty"),
    (lambda: nn.ParameterDict()(1), RuntimeError, "ParameterDict should not be called."),
])
def test_parameter_dict_refuses_what_pytorch_refuses(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_parameter_dict_none_and_repr():
    """A None value registers the key with no parameter (PyTorch keeps it as an attribute): in
    the keys, not in ``parameters()`` or the state dict; the repr lists each entry."""
    d = nn.ParameterDict([("w", np.ones((2, 3), np.float32)), ("none", None)])
    assert list(d) == ["w", "none"] and d["none"] is None and len(list(d.parameters())) == 1
    assert list(d.state_dict()) == ["w"]
    assert repr(d) == ("ParameterDict(\n  (w): Parameter containing: [float32 of size 2x3]\n"
                       "  (none): Object of type: NoneType\n)")


def test_module_dict_methods_follow_pytorch():
    """PyTorch's ``test_nn.py::test_ModuleDict``: insertion order, ``update`` from a mapping
    or (key, module) pairs (replacing keeps the position), ``pop``, ``clear``, ``in``."""
    a, b, c = nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 2)
    md = nn.ModuleDict([("a", a), ("b", b)])
    md.update({"c": c, "a": b})
    assert list(md) == ["a", "b", "c"] and md["a"] is b and "c" in md and "z" not in md
    assert list(md.keys()) == ["a", "b", "c"] and list(md.values()) == [b, b, c]
    assert list(md.items())[2] == ("c", c)
    md["d"] = a
    assert md.pop("b") is b and list(md) == ["a", "c", "d"] and len(md) == 3
    del md["a"]
    assert list(md.state_dict()) == ["c.weight", "c.bias", "d.weight", "d.bias"]
    md.update(nn.ModuleDict({"e": nn.Identity(), "version": nn.Linear(1, 1)}))
    assert list(md.state_dict())[-2:] == ["version.weight", "version.bias"]  # PyTorch's too
    md.clear()
    assert len(md) == 0 and list(md.parameters()) == []


def test_appending_to_a_traced_module_list_recompiles_the_graph():
    """A container changed after a graph traced it (``append``) changes what the graph computes
    at its next call, as eager PyTorch would (``Module.compiled_into``)."""
    mf.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(3, 3)])

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.layers = layers

        def build(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    g = G()
    x = np.ones((2, 3), np.float32)
    one = g(mf.tensor(x)).numpy()
    layers.append(nn.Linear(3, 1))
    two = g(mf.tensor(x)).numpy()
    assert g.compile_count == 2 and two.shape == (2, 1)
    w, bias = layers[1].weight.numpy(), layers[1].bias.numpy()
    np.testing.assert_allclose(two, one @ w.T + bias, rtol=1e-6)


def test_state_dict_takes_pytorchs_prefix_destination_and_keep_vars():
    """``state_dict(prefix=, destination=, keep_vars=)`` as PyTorch's (they raised TypeError):
    the names prefixed, the given dict filled, the module's own tensors with keep_vars."""
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    plain = model.state_dict()
    into = {"other": 1}
    got = model.state_dict(destination=into, prefix="backbone.")
    assert got is into and list(got) == ["other"] + [f"backbone.{k}" for k in plain]
    kept = model.state_dict(keep_vars=True)
    assert list(kept) == list(plain) and kept["0.weight"] is model[0].weight
    assert kept["1.running_mean"] is model[1].running_mean
    assert all(np.array_equal(kept[k].numpy(), v) for k, v in plain.items())
    torch = pytest.importorskip("torch")
    t = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert list(t.state_dict(prefix="backbone.")) == list(got)[1:]


def test_embedding_from_pretrained_copies_keeps_the_dtype_and_freezes_as_pytorch():
    """``nn.Embedding.from_pretrained(w, freeze=True)``: a copy of ``w`` (dtype kept), frozen by
    default (a training step leaves it bit-identical), trainable with ``freeze=False``; not 2-D
    is an error naming the method."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    frozen, free = (nn.Embedding.from_pretrained(w), nn.Embedding.from_pretrained(
        mf.tensor(w.astype(np.float64)), freeze=False))
    w[0, 0] = 99.0
    assert repr(frozen) == "Embedding(4, 3)" and frozen.weight.numpy()[0, 0] == 0.0
    assert free.weight.dtype is mf.float64 and free.weight.requires_grad
    assert not frozen.weight.requires_grad
    ids = np.array([1, 3, 3], np.int64)
    np.testing.assert_array_equal(frozen(mf.tensor(ids)).numpy(), np.arange(12).reshape(4, 3)[ids])
    np.testing.assert_array_equal(frozen(input=mf.tensor(ids)).numpy(),   # PyTorch's keyword
                                  np.arange(12).reshape(4, 3)[ids])
    for emb in (frozen, free):
        head = nn.Linear(3, 2, dtype=emb.weight.dtype)
        opt = mf.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.5)

        class Step(nn.Graph):
            def __init__(self):
                super().__init__()
                self.emb, self.head = emb, head
                self.add_optimizer(opt)

            def build(self, ids):
                loss = self.head(self.emb(ids)).sum()
                loss.backward()
                return loss

        before = emb.weight.numpy()
        Step()(ids)
        changed = not np.array_equal(emb.weight.numpy(), before)
        assert changed == emb.weight.requires_grad
    with pytest.raises(ValueError,
                       match=r"Embedding.from_pretrained: embeddings must be 2-D .*\[3\]"):
        nn.Embedding.from_pretrained(np.zeros(3, np.float32))


@needs_torch
def test_embedding_from_pretrained_takes_a_torch_parameter():
    """``nn.Embedding.from_pretrained(torch_model.wte.weight)``, a tensor that requires grad,
    raised torch's own "Can't call numpy() on Tensor that requires grad"; PyTorch's
    from_pretrained takes it (a copy), and so does miniflow now, keeping its dtype."""
    ref = torch.nn.Embedding(4, 3, dtype=torch.float64)
    emb = nn.Embedding.from_pretrained(ref.weight, freeze=False)
    assert emb.weight.dtype is mf.float64 and emb.weight.requires_grad
    np.testing.assert_array_equal(emb.weight.numpy(), ref.weight.detach().numpy())
    want = torch.nn.Embedding.from_pretrained(ref.weight)(torch.tensor([2, 0]))
    np.testing.assert_array_equal(emb(np.array([2, 0])).numpy(), want.numpy())


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_torch_half_tensor_loads_bit_for_bit(dtype):
    """``from_pretrained`` and ``load_state_dict`` of a torch bfloat16 tensor failed inside
    torch's ``.numpy()`` (NumPy has no bfloat16); now its bits are read as miniflow's bfloat16
    (a Parameter too, and a transposed view), and float16 still loads as float16."""
    tdt, mdt = getattr(torch, dtype), getattr(mf, dtype)
    bits = torch.int16
    ref = torch.nn.Linear(3, 5).to(tdt)
    emb = nn.Embedding.from_pretrained(ref.weight)
    assert emb.weight.dtype is mdt
    np.testing.assert_array_equal(emb.weight.numpy().view(np.int16),
                                  ref.weight.detach().view(bits).numpy())
    emb = nn.Embedding.from_pretrained(ref.weight.detach().t())
    np.testing.assert_array_equal(emb.weight.numpy().view(np.int16),
                                  ref.weight.detach().t().view(bits).numpy())
    model = nn.Linear(3, 5, dtype=mdt)
    model.load_state_dict(ref.state_dict())
    for name, value in ref.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name].view(np.int16),
                                      value.view(bits).numpy())
    wide = nn.Linear(3, 5)                  # float32: cast as torch's copy_ casts
    wide.load_state_dict(ref.state_dict())
    np.testing.assert_array_equal(wide.weight.numpy(), ref.weight.detach().float().numpy())


@pytest.mark.parametrize("dtype,big", [(np.uint64, 2**63), (np.uint64, 2**64 - 1),
                                       (np.uint32, 2**32 - 1), (np.uint8, 255)])
def test_an_unsigned_token_id_out_of_range_is_named_as_given(dtype, big):
    """A uint64 id of 2**63 was named -9223372036854775808: the ids were cast to int64 before
    the check. Now an eager lookup names the id as given and where it is; a graph takes int64
    ids only and refuses an unsigned array by its dtype."""
    emb = nn.Embedding(10, 4)
    ids = np.array([[1, 2], [3, big]], dtype)
    with pytest.raises(IndexError, match=rf"embedding: index {big} at input\[1, 1\] is out of "
                                         r"range \[0, 10\) \(num_embeddings=10; 1 of 4 ids"):
        emb(ids)

    class Lookup(nn.Graph):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def build(self, ids):
            return self.emb(ids)

    with pytest.raises(TypeError, match=rf"graph input 0: unsupported dtype .*{ids.dtype}"):
        Lookup()(ids)


def test_embedding_from_pretrained_draws_nothing_from_the_generator():
    """As PyTorch's (its ``_weight``): the modules made after it get the same initial values."""
    mf.manual_seed(3)
    nn.Embedding.from_pretrained(np.ones((4, 3), np.float32))
    after = nn.Linear(3, 2).weight.numpy()
    mf.manual_seed(3)
    np.testing.assert_array_equal(nn.Linear(3, 2).weight.numpy(), after)


def test_a_replaced_child_or_parameter_keeps_its_place_in_the_state_dict():
    """``torch.nn.Module.__setattr__`` assigns into its ordered dicts: replacing a child module
    or a parameter keeps its position, so the state-dict keys keep their order."""
    net = nn.Module()
    net.a, net.b = nn.Linear(1, 2), nn.Linear(2, 1)
    net.a = nn.Linear(1, 2, bias=False)
    net.b.weight = nn.Parameter(np.zeros((1, 2), np.float32))
    assert list(net.state_dict()) == ["a.weight", "b.weight", "b.bias"]
    if torch is not None:
        ref = torch.nn.Module()
        ref.a, ref.b = torch.nn.Linear(1, 2), torch.nn.Linear(2, 1)
        ref.a = torch.nn.Linear(1, 2, bias=False)
        ref.b.weight = torch.nn.Parameter(torch.zeros(1, 2))
        assert list(ref.state_dict()) == list(net.state_dict())


# ------------------------------------------------------------------ the tree API's edges
def _kinds(seq):
    return [(name, type(m).__name__) for name, m in seq.named_children()]


def test_sequential_changes_in_place_as_pytorch():
    """``torch.nn.Sequential``'s ``seq[i] = m`` (under the module's name), ``del seq[i]`` /
    ``pop`` / ``insert`` (renumbering ``0 ..``, dict names included), ``append``, ``extend`` and
    its out-of-range ``IndexError`` (all missing before: ``AttributeError``)."""
    s = nn.Sequential(nn.ReLU(), nn.Tanh())
    s[0] = nn.Tanh()
    del s[0]
    s.append(nn.SiLU()).insert(0, nn.ReLU()).insert(-1, nn.Tanh())
    assert type(s.pop(1)).__name__ == "Tanh"
    assert _kinds(s) == [("0", "ReLU"), ("1", "Tanh"), ("2", "SiLU")]
    s.extend([nn.ReLU()])
    assert _kinds(s) == [("0", "ReLU"), ("1", "Tanh"), ("2", "SiLU"), ("3", "ReLU")]
    del s[1:3]
    assert _kinds(s) == [("0", "ReLU"), ("1", "ReLU")]
    d = nn.Sequential(OrderedDict(a=nn.ReLU(), b=nn.Tanh()))
    d[-1] = nn.SiLU()
    assert _kinds(d) == [("a", "ReLU"), ("b", "SiLU")]
    del d[0]
    assert _kinds(d) == [("0", "SiLU")]
    with pytest.raises(IndexError, match="index 5 is out of range"):
        d[5]
    with pytest.raises(TypeError, match="holds modules"):
        d.append(3)


def test_module_iterators_take_pytorchs_keywords():
    """``named_modules(memo, prefix, remove_duplicate)``, ``named_parameters`` /
    ``named_buffers(prefix, recurse, remove_duplicate)``, ``parameters`` / ``buffers(recurse)``
    and ``get_submodule`` as ``torch.nn.Module``'s (names from PyTorch 2.13 on the same
    model)."""
    lin = nn.Linear(2, 2)
    s = nn.Sequential(lin, lin, nn.BatchNorm1d(2))
    assert [n for n, _ in s.named_modules(remove_duplicate=False)] == ["", "0", "1", "2"]
    assert [n for n, _ in s.named_modules(prefix="p")] == ["p", "p.0", "p.2"]
    assert [n for n, _ in s.named_modules(memo={lin})] == ["", "2"]
    assert [n for n, _ in s.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [n for n, _ in s.named_parameters(remove_duplicate=False)] == [
        "0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    assert [n for n, _ in lin.named_parameters(recurse=False)] == ["weight", "bias"]
    assert list(s.parameters(recurse=False)) == [] and list(s.buffers(recurse=False)) == []
    assert [n for n, _ in s.named_buffers(prefix="q")] == [
        "q.2.running_mean", "q.2.running_var", "q.2.num_batches_tracked"]
    assert s.get_submodule("2") is s[2] and s.get_submodule("") is s
    with pytest.raises(AttributeError, match="Linear has no attribute `x`"):
        s.get_submodule("0.x")


def test_repr_and_register_buffer_follow_pytorch():
    """``torch.nn.Module.__repr__``: an ``extra_repr`` beside children, or of several lines, gets
    lines of its own; ``register_buffer`` over a plain attribute raises PyTorch's KeyError."""
    class Foo(nn.Module):
        def __init__(self, extra):
            super().__init__()
            self.extra = extra
            if extra == "hello=1":
                self.lin = nn.ReLU()

        def extra_repr(self):
            return self.extra

    assert repr(Foo("hello=1")) == "Foo(\n  hello=1\n  (lin): ReLU()\n)"
    assert repr(Foo("a=1\nb=2")) == "Foo(\n  a=1\n  b=2\n)"
    assert repr(Foo("a=1")) == "Foo(a=1)" and repr(Foo("")) == "Foo()"
    assert repr(nn.Sequential(nn.ReLU(), nn.Sequential(nn.Tanh()))) == (
        "Sequential(\n  (0): ReLU()\n  (1): Sequential(\n    (0): Tanh()\n  )\n)")
    m = nn.Module()
    m.foo = 3
    with pytest.raises(KeyError, match="foo.* already exists on Module"):
        m.register_buffer("foo", None)
    assert m.foo == 3


def test_tied_names_load_in_the_models_order_and_the_keys_come_in_torchs_order():
    """Of two names of one tied parameter the later in the model wins, whatever the dict's order
    (PyTorch copies in the model's order: a checkpoint read back with sorted keys, as
    ``safetensors`` returns them, gave the earlier name's value); the missing keys come in the
    model's order, the unexpected in the dict's (they were sorted as strings: '10.bias' before
    '2.bias')."""
    seq = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    seq[1].weight = seq[0].weight
    bias = np.zeros(2, np.float32)
    seq.load_state_dict(OrderedDict([("1.weight", np.ones((2, 2), np.float32)),
                                     ("0.weight", np.full((2, 2), 2.0, np.float32)),
                                     ("0.bias", bias), ("1.bias", bias)]))
    np.testing.assert_array_equal(seq[0].weight.numpy(), np.ones((2, 2)))
    deep = nn.Sequential(*[nn.Linear(2, 2) for _ in range(11)])
    keys = deep.load_state_dict({"z": bias, "a": bias}, strict=False)
    assert keys.missing_keys == [f"{i}.{n}" for i in range(11) for n in ("weight", "bias")]
    assert keys.unexpected_keys == ["z", "a"]


def test_parameter_takes_requires_grad_and_modules_register_parameters_as_torch():
    """``nn.Parameter(data, requires_grad=False)`` and ``Module.register_parameter`` (None
    registers a name with no parameter), with PyTorch's errors."""
    frozen = nn.Parameter(np.ones(3, np.float32), requires_grad=False)
    assert frozen.requires_grad is False and nn.Parameter(np.ones(3)).requires_grad is True
    with pytest.raises(TypeError, match="requires_grad must be True or False"):
        nn.Parameter(np.ones(3), requires_grad=1)
    m = nn.Linear(2, 2)
    m.register_parameter("scale", frozen)
    m.register_parameter("unused", None)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias", "scale"]
    assert list(m.state_dict()) == ["weight", "bias", "scale"] and m.unused is None
    with pytest.raises(TypeError, match="nn.Parameter or None expected"):
        m.register_parameter("w2", np.ones(2))
    for bad in ("", "a.b", "forward"):
        with pytest.raises(KeyError, match="register_parameter"):
            m.register_parameter(bad, nn.Parameter(np.ones(2)))


def test_an_integer_parameter_cannot_require_grad_as_torch():
    """``nn.Parameter(int64 data)`` (or ``nn.ParameterList([..., 3])``) was an int64 parameter
    that requires grad, which PyTorch refuses at once (no gradient exists for it); it is refused
    with PyTorch's message and the ways out, and so is ``requires_grad = True`` on a frozen one."""
    match = "Only Tensors of floating point .* can require gradients.*requires_grad=False"
    for make in (lambda: nn.Parameter(np.array([1, 2])), lambda: nn.ParameterList([3])):
        with pytest.raises(RuntimeError, match=match):
            make()
    frozen = nn.Parameter(np.array([1, 2]), requires_grad=False)
    assert frozen.dtype is mf.int64 and not frozen.requires_grad
    with pytest.raises(RuntimeError, match=match):
        frozen.requires_grad_(True)
    assert not frozen.requires_grad


def test_inserting_into_a_sequential_of_named_children_is_refused_not_renamed():
    """Inserting would renumber the children and so rename their state-dict keys without a word
    (PyTorch's insert raises a KeyError there)."""
    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("out", nn.Linear(2, 2))]))
    with pytest.raises(KeyError, match=r"named \['fc', 'out'\], not numbered"):
        seq.insert(1, nn.ReLU())
    assert list(seq.state_dict()) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    numbered = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).insert(1, nn.ReLU())
    assert list(numbered.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


class _RunningMean(nn.Module):
    """A buffer updated in ``forward`` as PyTorch code writes it (``self.avg = ...``)."""

    def __init__(self, update: bool):
        super().__init__()
        self.register_buffer("avg", mf.tensor(np.zeros(3, np.float32)))
        self.update = update

    def forward(self, x):
        new = self.avg * 0.9 + x.mean(0) * 0.1
        if self.update:
            self.avg = new
        return new


def test_a_buffer_assigned_in_a_traced_forward_is_refused_saying_how_to_update_it():
    """PyTorch runs ``self.avg = self.avg * 0.9 + ...`` in ``forward`` as a buffer update; a
    graph cannot write it, and the error said "register_buffer: 'avg' is a lazy tensor of a
    trace; buffers hold data (create them in __init__)", naming neither the assignment nor a way
    out. It names both now, and the way it names works: the value returned and copied in."""
    x = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match=r"_RunningMean: buffer 'avg' cannot take a value "
                                        r"computed inside nn.Graph.build \(lazy tensor %"):
        EvalGraph(_RunningMean(update=True))(x)
    module = _RunningMean(update=False)
    graph = EvalGraph(module)
    for step in range(1, 3):
        module.load_state_dict({"avg": graph(x)}, strict=False)
        np.testing.assert_allclose(module.avg.numpy(), 1 - 0.9 ** step, rtol=1e-6)
    assert graph.compile_count == 1


@pytest.mark.parametrize("method,says", [
    ("zero_grad", "gradients live in the nn.Graph that trains the module"),
    ("cuda", "there are no devices per module"), ("cpu", "chosen before models are made"),
    ("half", "make the layers with dtype="), ("double", "train in float32 with AMP")])
def test_pytorch_methods_miniflow_has_not_say_why_in_the_attribute_error(method, says):
    """``model.zero_grad()``, ``model.cuda()``, ``model.half()`` (PyTorch habits) were a
    bare "'Sequential' object has no attribute ..."; the AttributeError (hasattr stays False)
    now says why and what to do instead. Other missing names keep Python's message."""
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(AttributeError, match=f"^'Sequential' object has no attribute "
                                             f"'{method}': .*{says}"):
        getattr(model, method)
    assert not hasattr(model, method)
    with pytest.raises(AttributeError) as e:
        model.no_such_thing
    assert str(e.value) == "'Sequential' object has no attribute 'no_such_thing'"


def test_a_training_checkpoint_or_a_prefixed_state_dict_names_the_way_to_load_it():
    """A whole training checkpoint (``miniflow train --checkpoint``'s, nanoGPT's ``ckpt.pt``:
    the model's state dict under ``'model'``) and a state dict whose names all carry one prefix
    (torch.compile's ``_orig_mod.``, DistributedDataParallel's ``module.``), or both, listed
    every key as missing and unexpected; the error says which entry or prefix to load, and
    loads nothing."""
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    sd = net.state_dict()
    before = {k: v.copy() for k, v in sd.items()}
    ckpt = {"config": {"lr": 0.1}, "model": {k: v + 1 for k, v in sd.items()}, "step": 3}
    del ckpt["model"]["1.num_batches_tracked"]      # optional, as in an older checkpoint
    with pytest.raises(RuntimeError, match=r"a training checkpoint.*state dict under 'model': "
                                           r"load_state_dict\(checkpoint\['model'\]\)"):
        net.load_state_dict(ckpt)
    prefixed = {"_orig_mod." + k: v + 1 for k, v in sd.items()}
    with pytest.raises(RuntimeError, match=r"every name starts with '_orig_mod\.'.*"
                                           r"removeprefix\('_orig_mod\.'\)"):
        net.load_state_dict(prefixed)
    compiled = {**ckpt, "model": prefixed}     # nanoGPT's ckpt.pt of a compiled model
    with pytest.raises(RuntimeError, match=r"state dict under 'model', every name there starting "
                                           r"with '_orig_mod\.'.*removeprefix\('_orig_mod\.'\)"
                                           r": v for k, v in checkpoint\['model'\]\.items\(\)"):
        net.load_state_dict(compiled)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    net.load_state_dict(ckpt["model"])
    net.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in prefixed.items()})
    with pytest.raises(RuntimeError, match=r"unexpected keys \['extra'\]$"):
        net.load_state_dict({**sd, "extra": np.zeros(1, np.float32)})


def test_a_state_dict_of_a_sub_module_names_the_sub_module_to_load_it_into():
    """The reverse of a prefixed state dict: the original's state dict loaded into a model
    whose names all carry one prefix (miniflow.compile's, as torch.compile's ``OptimizedModule``,
    holds the original as ``_orig_mod``; a wrapper holding it in a list) listed every key as
    missing and unexpected with no hint; the error names the sub-module to load it into."""
    inner = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    sd = inner.state_dict()
    del sd["1.num_batches_tracked"]           # optional: the hint holds without it too
    outer = nn.Module()
    outer.blocks = nn.ModuleList([inner])
    with pytest.raises(RuntimeError, match=r"every name of the model starts with 'blocks\.0\.' "
                                           r"and the state dict's do not: load it into that "
                                           r"sub-module, model\.get_submodule\('blocks\.0'\)"):
        outer.load_state_dict(sd)
    wrapper = nn.Module()
    wrapper._orig_mod = inner
    with pytest.raises(RuntimeError, match=r"starts with '_orig_mod\.' \(a miniflow\.compile "
                                           r"model.*model\._orig_mod\.load_state_dict\(\.\.\.\)"):
        wrapper.load_state_dict(sd)
    outer.get_submodule("blocks.0").load_state_dict(sd)


def test_apply_visits_children_before_their_parent_as_torch():
    """``Module.apply(fn)`` (nanoGPT's ``self.apply(self._init_weights)``) calls ``fn`` on every
    sub-module, children before their parent, in PyTorch's order; a child held under two names
    of one module once, as ``torch.nn.Module.children()`` yields it once; returns self."""
    def build(lib):
        shared = lib.nn.Linear(2, 2)
        net = lib.nn.Sequential(lib.nn.Linear(2, 3), lib.nn.Sequential(lib.nn.ReLU(), shared))
        net.add_module("again", shared)
        net.add_module("twice", shared)
        return net

    def order(net):
        seen = []
        assert net.apply(lambda m: seen.append(type(m).__name__)) is net
        return seen

    ours = order(build(mf))   # "again" is a direct child once; a second path visits again
    assert ours == ["Linear", "ReLU", "Linear", "Sequential", "Linear", "Sequential"]
    if torch is not None:
        assert ours == order(build(torch))


def test_apply_initialises_weights_as_nanogpt_does():
    """``_init_weights`` through ``apply`` reaches every Linear, inside containers too."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ModuleList([nn.Linear(4, 2)]))

    def init(m):
        if isinstance(m, nn.Linear):
            m.load_state_dict({"weight": np.full(m.weight.shape, 0.5, np.float32)}, strict=False)

    net.apply(init)
    assert all((v == 0.5).all() for k, v in net.state_dict().items() if k.endswith("weight"))


def test_init_fills_parameters_in_place_with_pytorchs_distributions():
    """``nn.init`` (``torch.nn.init``: nanoGPT's ``normal_(module.weight, mean=0.0, std=0.02)``,
    ``zeros_(module.bias)``): each fills the tensor in place and returns it, random fills from
    ``miniflow.manual_seed``'s generator with PyTorch's distributions and bounds."""
    w = nn.Parameter(np.zeros((200, 300), np.float32))
    mf.manual_seed(0)
    assert nn.init.normal_(w, mean=1.0, std=0.02) is w
    first = w.numpy().copy()
    assert first.dtype == np.float32
    assert abs(first.mean() - 1.0) < 1e-3 and abs(first.std() - 0.02) < 1e-3
    mf.manual_seed(0)
    np.testing.assert_array_equal(nn.init.normal_(w, 1.0, 0.02).numpy(), first)
    u = nn.init.uniform_(w, -0.5, 0.25).numpy()
    assert u.min() >= -0.5 and u.max() < 0.25 and abs(u.mean() + 0.125) < 5e-3
    np.testing.assert_array_equal(nn.init.zeros_(w).numpy(), 0)
    np.testing.assert_array_equal(nn.init.ones_(w).numpy(), 1)
    np.testing.assert_array_equal(nn.init.constant_(w, 0.3).numpy(), np.float32(0.3))
    counter = mf.tensor(np.array([5]))
    np.testing.assert_array_equal(nn.init.zeros_(counter).numpy(), [0])   # any dtype


@pytest.mark.parametrize("fn", ["xavier_uniform_", "xavier_normal_"])
@pytest.mark.parametrize("shape", [(64, 48), (32, 16, 3, 3)])
def test_xavier_init_takes_pytorchs_fans_and_gain(fn, shape):
    """Glorot's bound / std from ``[fan_out, fan_in, *kernel]`` and ``gain``, as
    ``torch.nn.init``'s ``_calculate_fan_in_and_fan_out``."""
    fan_in = shape[1] * int(np.prod(shape[2:]))
    fan_out = shape[0] * int(np.prod(shape[2:]))
    std = 2.0 * np.sqrt(2.0 / (fan_in + fan_out))
    values = getattr(nn.init, fn)(nn.Parameter(np.zeros(shape, np.float32)), gain=2.0).numpy()
    assert abs(values.std() / std - 1) < 0.05
    if fn == "xavier_uniform_":
        assert np.abs(values).max() <= std * np.sqrt(3) + 1e-6
    if torch is not None:
        ours = getattr(torch.nn.init, fn)(torch.zeros(shape), gain=2.0)
        assert abs(ours.std().item() / std - 1) < 0.05
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        getattr(nn.init, fn)(nn.Parameter(np.zeros(5, np.float32)))


def test_init_is_seen_by_a_compiled_graph_and_refused_where_it_cannot_write():
    """A fill after a graph's first call is what its next call reads (the parameter's memory,
    as ``load_state_dict``); a lazy tensor inside ``build``, a random fill of int64, a
    ``generator`` and a non-tensor are refused naming the initialiser."""
    lin = nn.Linear(3, 2)
    graph = EvalGraph(lin)
    x = np.ones((1, 3), np.float32)
    graph(x)
    nn.init.ones_(lin.weight)
    nn.init.zeros_(lin.bias)
    np.testing.assert_array_equal(graph(x).numpy(), [[3.0, 3.0]])

    class Fills(nn.Graph):
        def build(self, x):
            return nn.init.zeros_(x)

    with pytest.raises(RuntimeError, match=r"init.zeros_: cannot fill a lazy tensor"):
        Fills()(x)
    with pytest.raises(RuntimeError, match="needs a floating tensor"):
        nn.init.normal_(mf.tensor(np.array([1, 2])))
    with pytest.raises(TypeError, match="manual_seed"):
        nn.init.normal_(lin.weight, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match="expected a miniflow Tensor"):
        nn.init.zeros_(np.zeros(3))


def test_nn_utils_says_gradient_clipping_is_an_optimizer_option():
    """nanoGPT's ``torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)`` was "module
    'miniflow.nn' has no attribute 'utils'"; the error names ``clip_grad_max_norm``, and any
    other missing name stays Python's plain message."""
    with pytest.raises(AttributeError, match=r"'utils': gradient clipping .*clip_grad_max_norm"):
        mf.nn.utils.clip_grad_norm_
    with pytest.raises(AttributeError, match=r"^module 'miniflow.nn' has no attribute 'Nope'$"):
        mf.nn.Nope
    assert not hasattr(mf.nn, "utils")
