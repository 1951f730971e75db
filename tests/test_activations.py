"""Every activation of ``miniflow.nn.activations`` (read from its ``__all__``, so a new one is
tested here at once): the functional form, the Module and the op agree, eagerly and inside an
nn.Graph, with the op's NumPy float64 reference, and with PyTorch when it is installed."""
import inspect

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph
from miniflow.nn import activations
from miniflow.ops import get_op

FUNCTIONS = [name for name in activations.__all__ if name.islower()]
X = np.linspace(-6, 6, 45).astype(np.float32).reshape(3, 15)


def _module(name: str):
    """The Module of activation ``name`` (``relu`` -> ``ReLU``, ``leaky_relu`` -> ``LeakyReLU``:
    PyTorch's class drops the underscore)."""
    (cls,) = [getattr(activations, c) for c in activations.__all__
              if not c.islower() and c.lower() == name.replace("_", "")]
    return cls


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functional_module_and_op_agree_eagerly_and_in_a_graph(name):
    fn, module = getattr(nn.functional, name), _module(name)
    assert fn is getattr(activations, name) and getattr(nn, module.__name__) is module
    assert f"op ``{name}``" in fn.__doc__
    eager = fn(mf.tensor(X)).numpy()
    reference = get_op(name).reference([X.astype(np.float64)], {})[0]
    np.testing.assert_allclose(eager, reference, rtol=2e-6, atol=2e-6)

    graph = EvalGraph(module())
    np.testing.assert_array_equal(graph(X).numpy(), eager)
    assert name in graph.ir.count_ops()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_activations_match_pytorch(name):
    torch = pytest.importorskip("torch")
    want = getattr(torch.nn.functional, name)(torch.tensor(X, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(getattr(nn.functional, name)(mf.tensor(X)).numpy(), want,
                               rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("cls,kwargs,name", [("ReLU", {"inplace": True}, "ReLU(inplace=True)"),
                                              ("SiLU", {"inplace": True}, "SiLU(inplace=True)"),
                                              ("GELU", {"approximate": "tanh"},
                                               "GELU(approximate='tanh')"),
                                              ("Softplus", {"beta": 2, "threshold": 5},
                                               "Softplus(beta=2, threshold=5)"),
                                              ("LeakyReLU",
                                               {"negative_slope": 0.2, "inplace": True},
                                               "LeakyReLU(negative_slope=0.2, inplace=True)"),
                                              ("LeakyReLU", {}, "LeakyReLU(negative_slope=0.01)"),
                                              ("ELU", {"alpha": 0.5, "inplace": True},
                                               "ELU(alpha=0.5, inplace=True)"),
                                              ("ELU", {}, "ELU(alpha=1.0)")])
def test_pytorchs_constructor_arguments_are_taken(cls, kwargs, name):
    """``ReLU(inplace=True)`` (torchvision's models), ``SiLU(inplace=True)`` and ``GELU(approximate=
    'tanh')`` (GPT-2's) construct, print as PyTorch's, and compute what PyTorch's do, eagerly and
    in a graph (out of place: the input is left as it was); the tanh GELU against its float64
    formula, and against PyTorch's when installed."""
    module = getattr(nn, cls)(**kwargs)
    assert repr(module) == name
    x = mf.tensor(X)
    got = module(x).numpy()
    np.testing.assert_array_equal(x.numpy(), X)
    t = X.astype(np.float64)
    want = {"ReLU": np.maximum(t, 0), "SiLU": t / (1 + np.exp(-t)),
            "GELU": 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3))),
            "Softplus": np.where(2 * t > 5, t, np.log1p(np.exp(2 * t)) / 2),
            "LeakyReLU": np.where(t > 0, t, kwargs.get("negative_slope", 0.01) * t),
            "ELU": np.where(t > 0, t, kwargs.get("alpha", 1.0) * np.expm1(np.minimum(t, 0)))}
    np.testing.assert_allclose(got, want[cls], rtol=2e-6, atol=2e-6)

    np.testing.assert_allclose(EvalGraph(module)(X).numpy(), got, rtol=1e-6, atol=1e-7)
    try:
        import torch
    except ImportError:
        return
    ref = getattr(torch.nn, cls)(**kwargs)(torch.tensor(t)).numpy()
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("call,error,match", [
    (lambda: nn.ReLU(inplace="yes"), TypeError, "ReLU: inplace must be True or False, got 'yes'"),
    (lambda: nn.functional.silu(mf.tensor(X), inplace=1), TypeError,
     "silu: inplace must be True or False, got 1"),
    (lambda: nn.Softplus(beta="2"), TypeError, "Softplus: beta must be a real number, got '2'"),
    (lambda: nn.functional.softplus(mf.tensor(X), threshold=None), TypeError,
     "softplus: threshold must be a real number, got None"),
    (lambda: nn.GELU(approximate="erf"), ValueError,
     "GELU: approximate must be 'none' or 'tanh' .*got 'erf'"),
    (lambda: nn.functional.gelu(mf.tensor(X), approximate=None), ValueError,
     "gelu: approximate must be 'none' or 'tanh' .*got None"),
    (lambda: nn.LeakyReLU(negative_slope="0.1"), TypeError,
     "LeakyReLU: negative_slope must be a real number, got '0.1'"),
    (lambda: nn.LeakyReLU(inplace=None), TypeError,
     "LeakyReLU: inplace must be True or False, got None"),
    (lambda: nn.functional.leaky_relu(mf.tensor(X), True), TypeError,
     "leaky_relu: negative_slope must be a real number, got True"),
    (lambda: nn.ELU(alpha=None), TypeError, "ELU: alpha must be a real number, got None"),
    (lambda: nn.functional.elu(mf.tensor(X), inplace="no"), TypeError,
     "elu: inplace must be True or False, got 'no'")])
def test_bad_constructor_arguments_are_refused_naming_the_activation(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((5,), 0), ((2, 5), 1), ((2, 3, 4), 0), ((2, 3, 4, 5), 1)])
def test_functional_softmax_without_dim_takes_torchs_implicit_dim_and_warns(name, shape, dim):
    """``torch.nn.functional.softmax(x)`` without ``dim`` warns and picks dim 0 for 1- and 3-d
    inputs, else dim 1 (``_get_softmax_dim``); miniflow normalised over the last dim silently.
    NumPy float64 oracle; torch's when installed."""
    a = np.random.default_rng(0).standard_normal(shape)
    e = np.exp(a - a.max(dim, keepdims=True))
    want = e / e.sum(dim, keepdims=True)
    want = np.log(want) if name == "log_softmax" else want
    with pytest.warns(UserWarning, match=f"Implicit dimension choice for {name}"):
        got = getattr(nn.functional, name)(mf.tensor(a))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    torch = pytest.importorskip("torch")
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        ref = getattr(torch.nn.functional, name)(torch.from_numpy(a))
    np.testing.assert_allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 5.0), (0.5, 1.0), (-1.5, 3.0),
                                            (3.0, 100.0)])
def test_softplus_and_its_derivative_match_pytorch_at_any_beta_and_threshold(beta, threshold):
    """Both branches (``beta * x`` above and below the threshold; at (3, 100) exp(beta * x) would
    overflow float32 were it not evaluated stably), in float32 and float64: ``softplus`` against
    ``torch.nn.functional.softplus`` and ``softplus_derivative`` against PyTorch's autograd
    (``softplus_backward``) of it, in float64. Without PyTorch: the NumPy float64 reference."""
    from miniflow.tensor import apply
    x = np.concatenate([np.linspace(-40, 40, 81), [np.nan, 0.0, -0.0]])
    for dt in (np.float32, np.float64):
        out = nn.functional.softplus(mf.tensor(x.astype(dt)), beta, threshold).numpy()
        grad = apply("softplus_derivative", [mf.tensor(x.astype(dt))], beta=beta,
                     threshold=threshold).numpy()
        want = get_op("softplus").reference([x], {"beta": beta, "threshold": threshold})[0]
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-30)
        try:
            import torch
        except ImportError:
            continue
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        y = torch.nn.functional.softplus(t, beta, threshold)
        y.sum().backward()
        tol = {"rtol": 2e-6, "atol": 1e-30} if dt == np.float32 else {"rtol": 1e-12, "atol": 0}
        np.testing.assert_allclose(out, y.detach().numpy(), **tol)
        np.testing.assert_allclose(grad, t.grad.numpy(), **tol)


EDGES = np.concatenate([np.linspace(-30, 30, 121), [np.nan, 0.0, -0.0, -1e-8, 1e-8, -1e4, 1e4,
                                                    -np.inf, np.inf]])


@pytest.mark.parametrize("name,alpha", [("leaky_relu", 0.01), ("leaky_relu", 0.2),
                                        ("leaky_relu", 0.0), ("leaky_relu", -0.5),
                                        ("leaky_relu", 3.0), ("elu", 1.0), ("elu", 0.5),
                                        ("elu", 0.0), ("elu", -0.5), ("elu", 2.0)])
def test_leaky_relu_and_elu_and_their_derivatives_match_pytorch_at_the_edges(name, alpha):
    """``leaky_relu`` / ``elu`` (ops of the same names, attribute ``alpha``) against
    ``torch.nn.functional.leaky_relu(x, negative_slope)`` / ``elu(x, alpha)``, and their
    ``*_derivative`` ops against PyTorch's autograd, in float32 and float64: NaN propagates, the
    sign of every zero is PyTorch's (-0.0 in, -0.0 out; a slope or alpha of 0 or below), and the
    derivative at 0 is PyTorch's (``alpha``), at NaN too for leaky_relu; elu's derivative at NaN
    is NaN (OneFlow's ``elu_grad``; PyTorch's own differs by tensor size: 1 under 64 elements,
    NaN from its vectorized loop). Without PyTorch: the NumPy float64 reference."""
    from miniflow.tensor import apply
    fn = getattr(nn.functional, name)
    for dt in (np.float32, np.float64):
        x = EDGES.astype(dt)
        out = fn(mf.tensor(x), alpha).numpy()
        grad = apply(f"{name}_derivative", [mf.tensor(x)], alpha=alpha).numpy()
        want = get_op(name).reference([x.astype(np.float64)], {"alpha": alpha})[0]
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-30)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(want))
        try:
            import torch
        except ImportError:
            continue
        t = torch.tensor(x, requires_grad=True)
        y = getattr(torch.nn.functional, name)(t, alpha)
        y.sum().backward()
        ref, ref_grad = y.detach().numpy(), t.grad.numpy()
        if name == "elu":
            assert np.isnan(grad[np.isnan(x)]).all()
            ref_grad = np.where(np.isnan(x), np.nan, ref_grad)
        np.testing.assert_allclose(out, ref, rtol=2e-6 if dt == np.float32 else 1e-12, atol=0)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
        np.testing.assert_allclose(grad, ref_grad, rtol=2e-6 if dt == np.float32 else 1e-12,
                                   atol=0)


@pytest.mark.parametrize("cls", ["Softmax", "LogSoftmax"])
def test_softmax_modules_are_the_functional_forms_with_pytorchs_repr(cls):
    """nn.Softmax(dim) / nn.LogSoftmax(dim) give F.softmax / F.log_softmax along dim (torch's
    values and repr); without dim, the implicit dim and its warning."""
    a = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    fn = getattr(nn.functional, cls.lower().replace("logsoftmax", "log_softmax"))
    module = getattr(nn, cls)(dim=1)
    np.testing.assert_array_equal(module(mf.tensor(a)).numpy(), fn(mf.tensor(a), 1).numpy())
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        implicit = getattr(nn, cls)()(mf.tensor(a))
    np.testing.assert_array_equal(implicit.numpy(), fn(mf.tensor(a), 0).numpy())
    torch = pytest.importorskip("torch")
    ref = getattr(torch.nn, cls)(dim=1)
    assert repr(module) == repr(ref)
    np.testing.assert_allclose(module(mf.tensor(a)).numpy(), ref(torch.tensor(a)).numpy(),
                               rtol=1e-6, atol=1e-6)


def test_functional_forms_take_pytorchs_argument_names_and_order():
    """``F.relu(input=x)`` (PyTorch's keyword) was "unexpected keyword argument 'input'", and
    ``F.softmax(x, 1, 3)`` took PyTorch's ``_stacklevel`` as the dtype: the functional forms
    name their tensor ``input`` and softmax / log_softmax take ``_stacklevel`` before
    ``dtype``, as PyTorch's."""
    F = nn.functional
    x = mf.tensor(np.array([[-1.0, 0.5, 2.0]], np.float32))
    for fn in (F.relu, F.gelu, F.silu, F.tanh, F.sigmoid, F.softplus, F.leaky_relu, F.elu):
        np.testing.assert_array_equal(fn(input=x).numpy(), fn(x).numpy())
    np.testing.assert_array_equal(F.dropout(input=x, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(F.softmax(x, 1, 3).numpy(), F.softmax(x, 1).numpy())
    assert F.log_softmax(x, 1, 3, mf.float64).dtype is mf.float64
    w = mf.tensor(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(F.linear(input=x, weight=w).numpy(), [[1.5, 1.5]])
    assert [p.numpy().tolist() for p in mf.tensor(np.arange(4.0)).split(split_size=3)] == [
        [0.0, 1.0, 2.0], [3.0]]
    torch = pytest.importorskip("torch")
    for name in ("relu", "silu", "leaky_relu", "elu", "dropout", "softmax", "log_softmax"):
        ours = list(inspect.signature(getattr(F, name)).parameters)
        theirs = list(inspect.signature(getattr(torch.nn.functional, name)).parameters)
        assert ours == theirs[:len(ours)], name


@pytest.mark.parametrize("dtype", [mf.bfloat16, mf.float16])
def test_tanh_gelu_of_a_half_tensor_is_rounded_once(dtype):
    """``gelu(x, approximate='tanh')`` of a bfloat16 tensor rounded each of its ops to bfloat16:
    2 values in 5 missed the correctly rounded one, by up to 0.016 (4 bfloat16 ulps of 0.5).
    As PyTorch's, it computes in float32 and rounds once: every value the float64 formula's
    rounded to the dtype (within float32's error of ``1 + tanh`` in the negative tail, where
    the value is below 1e-5), eagerly and inside ``build``."""
    x = mf.tensor(np.random.default_rng(3).standard_normal(500).astype(np.float32) * 3.0,
                  dtype=dtype)
    t = x.numpy().astype(np.float64)
    want = (0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3))))
    want = want.astype(np.float32).astype(dtype.np).astype(np.float64)
    gelu = nn.functional.gelu
    for got in (gelu(x, approximate="tanh"), mf.compile(lambda v: gelu(v, "tanh"))(x)):
        assert got.dtype is dtype
        ulp = np.spacing(np.abs(want).astype(dtype.np)).astype(np.float64)
        assert (np.abs(got.numpy().astype(np.float64) - want) <= ulp + 4e-6).all()
