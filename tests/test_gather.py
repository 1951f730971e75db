"""``Tensor.gather(dim, index)`` and ``miniflow.gather`` (op ``dim_gather``, its gradient
``dim_scatter_add_like``) against PyTorch's ``torch.gather`` (its documentation: ``out[i][j][k] =
input[index[i][j][k]][j][k]`` for dim 0 ...; the index has input's rank and no larger size off
``dim``; PyTorch's errors), eager and traced in an ``nn.Graph`` with gradients: repeated indices
add up, and ``logits.log_softmax(-1).gather(1, y.unsqueeze(1))``, nll's PyTorch spelling, trains
one SGD step as torch's. The kernels' own tests are the op tables' (``tests/test_registry.py``,
``tests/test_grad.py``, ``tests/cuda``)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

torch = pytest.importorskip("torch")

R = np.random.default_rng(5)
X = R.standard_normal((4, 5, 3)).astype(np.float32)

CASES = [   # (dim, index): index smaller than X off dim, repeats, negative dim, empty
    (0, R.integers(0, 4, (6, 5, 3))),
    (1, R.integers(0, 5, (4, 2, 3))),
    (2, R.integers(0, 3, (2, 5, 7))),
    (-1, np.zeros((4, 5, 1), np.int64)),
    (-3, R.integers(0, 4, (1, 1, 1))),
    (1, np.zeros((4, 0, 3), np.int64)),
]
IDS = [f"dim{d}-{'x'.join(map(str, i.shape))}" for d, i in CASES]


@pytest.mark.parametrize("dim,index", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_matches_torch_eager(dim, index, dtype):
    want = torch.gather(torch.tensor(X.astype(dtype)), dim, torch.tensor(index)).numpy()
    x = mf.tensor(X.astype(dtype))
    as_list = [x.gather(dim, index.tolist())] if index.size else []   # [[], []] is 2-d
    for got in (x.gather(dim, mf.tensor(index)), x.gather(dim, index),
                mf.gather(x, dim, torch.tensor(index)), *as_list,
                x.gather(dim, index.astype(np.int32), sparse_grad=False)):
        assert got.shape == want.shape and got.dtype == x.dtype
        np.testing.assert_array_equal(got.numpy(), want)


class _Pick(nn.Graph):
    """loss = sum(w * x.gather(dim, index)) for a parameter x, one SGD step (lr 1)."""

    def __init__(self, x, dim, index):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x.copy())
        self.dim, self.index = dim, index
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self):
        y = self.m.x.gather(self.dim, mf.tensor(self.index))
        w = mf.tensor(np.arange(1, 1 + y.numel(), dtype=np.float32).reshape(y.shape))
        (y * w).sum().backward()
        return y


@pytest.mark.parametrize("dim,index", CASES, ids=IDS)
def test_gather_traced_and_its_gradient_match_torch(dim, index):
    """The gradient adds the weights of every place an element was picked from (repeats)."""
    t = torch.tensor(X, requires_grad=True)
    y = torch.gather(t, dim, torch.tensor(index))
    w = torch.arange(1, 1 + y.numel(), dtype=torch.float32).reshape(y.shape)
    (y * w).sum().backward()
    g = _Pick(X, dim, index)
    np.testing.assert_array_equal(g().numpy(), y.detach().numpy())
    np.testing.assert_allclose(X - g.m.x.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-5)


def test_repeated_indices_add_their_gradients():
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    index = np.array([[2, 2, 2, 0]])
    g = _Pick(x, 1, index)
    np.testing.assert_array_equal(g().numpy(), [[3.0, 3.0, 3.0, 1.0]])
    np.testing.assert_array_equal(x - g.m.x.numpy(), [[4.0, 0.0, 6.0]])   # 1+2+3 at 2, 4 at 0


class _Classify(nn.Graph):
    """PyTorch's nll written with gather, one SGD step."""

    def __init__(self, model, lr):
        super().__init__()
        self.model = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=lr))

    def build(self, x, y):
        logits = self.model(x)
        loss = -logits.log_softmax(-1).gather(1, y.unsqueeze(1)).mean()
        loss.backward()
        return loss


def test_log_softmax_gather_trains_one_sgd_step_as_torch():
    r = np.random.default_rng(7)
    x = r.standard_normal((8, 6)).astype(np.float32)
    y = np.array([0, 3, 3, 1, 4, 4, 4, 2])
    mf.manual_seed(0)
    model = nn.Linear(6, 5)
    w0, b0 = model.weight.numpy().copy(), model.bias.numpy().copy()
    tm = torch.nn.Linear(6, 5)
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(w0))
        tm.bias.copy_(torch.tensor(b0))
    opt = torch.optim.SGD(tm.parameters(), lr=0.5)
    logits = tm(torch.tensor(x))
    want = -logits.log_softmax(-1).gather(1, torch.tensor(y).unsqueeze(1)).mean()
    opt.zero_grad()
    want.backward()
    opt.step()
    loss = _Classify(model, 0.5)(mf.tensor(x), mf.tensor(y))
    np.testing.assert_allclose(loss.numpy(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(model.weight.numpy(), tm.weight.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(model.bias.numpy(), tm.bias.detach().numpy(), atol=1e-6)


def test_gather_errors_are_pytorchs():
    x = mf.tensor(X)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.gather(3, np.zeros((1, 1, 1), np.int64))
    with pytest.raises(IndexError, match="index -1 is out of bounds for dimension 1 with size 5"):
        x.gather(1, np.full((1, 1, 1), -1))
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 5"):
        x.gather(1, np.full((1, 1, 1), 5))
    with pytest.raises(IndexError, match=r"dim_gather: index 9 at indices\[0, 0, 1\] is out of "
                                         r"range \[0, 3\) of axis 2"):
        x.gather(-1, mf.tensor(np.array([[[0, 9]]])))
    with pytest.raises(TypeError, match="Expected dtype int64 for index"):
        x.gather(0, x)
    with pytest.raises(TypeError, match="Expected dtype int64 for index"):
        x.gather(0, np.zeros((1, 1, 1)))
    with pytest.raises(ValueError, match="dim_gather: index .* must have the rank of input"):
        x.gather(0, np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match=r"no size larger than its off dim 0"):
        x.gather(0, np.zeros((1, 6, 1), np.int64))
    with pytest.raises(NotImplementedError, match="sparse_grad"):
        x.gather(0, np.zeros((1, 1, 1), np.int64), sparse_grad=True)


def test_gather_of_a_0d_tensor_is_torchs():
    want = torch.gather(torch.tensor(2.5), 0, torch.tensor(0))
    got = mf.tensor(np.float32(2.5)).gather(-1, np.int64(0))
    assert got.shape == tuple(want.shape) and got.item() == want.item()


class _TopPicks(nn.Graph):
    """Rows of features picked by an index expanded over the columns (PyTorch's
    ``x.gather(1, idx.unsqueeze(-1).expand(-1, -1, C))``), trained one step, AMP optional."""

    def __init__(self, model, amp):
        super().__init__()
        self.model = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.5))
        if amp:
            self.config.enable_amp(True)

    def build(self, x, idx):
        h = self.model(x)                                        # [B, T, C]
        picked = h.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        loss = (picked * picked).mean()
        loss.backward()
        return loss


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_expanded_index_gather_trains_as_torch(amp):
    """An int64 index expanded for a gather works traced; under AMP ``dim_gather`` (in none of
    OneFlow's lists) runs in float32 after the float16 matmul, and the step stays torch's to
    float16 rounding."""
    r = np.random.default_rng(9)
    x = r.standard_normal((2, 5, 4)).astype(np.float32)
    idx = np.array([[4, 0, 4], [1, 1, 2]])
    mf.manual_seed(0)
    model = nn.Linear(4, 3)
    tm = torch.nn.Linear(4, 3)
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(model.weight.numpy()))
        tm.bias.copy_(torch.tensor(model.bias.numpy()))
    h = tm(torch.tensor(x))
    picked = h.gather(1, torch.tensor(idx).unsqueeze(-1).expand(-1, -1, 3))
    want = (picked * picked).mean()
    want.backward()
    with torch.no_grad():
        tm.weight -= 0.5 * tm.weight.grad
    graph = _TopPicks(model, amp)
    loss = graph(mf.tensor(x), mf.tensor(idx))
    if amp:
        rows = {(r.op, r.dtype, r.color) for r in graph.amp_report().rows}
        assert {("matmul", "f16", "white"), ("dim_gather", "f32", "unlisted"),
                ("dim_scatter_add_like", "f32", "unlisted")} <= rows
    tol = 2e-3 if amp else 1e-6
    np.testing.assert_allclose(loss.numpy(), want.item(), rtol=tol)
    np.testing.assert_allclose(model.weight.numpy(), tm.weight.detach().numpy(), atol=tol)
