"""Every activation of ``miniflow.nn.activations`` (read from its ``__all__``, so a new one is
tested here at once): the functional form, the Module and the op agree, eagerly and inside an
nn.Graph, with the op's NumPy float64 reference, and with PyTorch when it is installed."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.nn import activations
from miniflow.ops import get_op

FUNCTIONS = [name for name in activations.__all__ if name.islower()]
X = np.linspace(-6, 6, 45).astype(np.float32).reshape(3, 15)


def _module(name: str):
    """The Module of activation ``name`` (``relu`` -> ``ReLU``)."""
    (cls,) = [getattr(activations, c) for c in activations.__all__
              if not c.islower() and c.lower() == name]
    return cls


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functional_module_and_op_agree_eagerly_and_in_a_graph(name):
    fn, module = getattr(nn.functional, name), _module(name)
    assert fn is getattr(activations, name) and getattr(nn, module.__name__) is module
    assert f"op ``{name}``" in fn.__doc__
    eager = fn(mf.tensor(X)).numpy()
    reference = get_op(name).reference([X.astype(np.float64)], {})[0]
    np.testing.assert_allclose(eager, reference, rtol=2e-6, atol=2e-6)

    class Apply(nn.Graph):
        def __init__(self):
            super().__init__()
            self.act = module()

        def build(self, x):
            return self.act(x)

    graph = Apply()
    np.testing.assert_array_equal(graph(X).numpy(), eager)
    assert name in graph.ir.count_ops()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_activations_match_pytorch(name):
    torch = pytest.importorskip("torch")
    want = getattr(torch.nn.functional, name)(torch.tensor(X, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(getattr(nn.functional, name)(mf.tensor(X)).numpy(), want,
                               rtol=2e-6, atol=2e-6)


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
