"""``Tensor.scatter`` / ``miniflow.scatter`` (ops ``dim_scatter_update``, and
``dim_scatter_update_scalar`` for a number), ``Tensor.scatter_add`` / ``miniflow.scatter_add`` (op
``dim_scatter_add``), ``miniflow.take_along_dim`` / ``Tensor.take_along_dim`` (``expand`` and
``dim_gather``) and the int64 gathers and scatters, against NumPy (``np.put_along_axis``,
``np.add.at``, ``np.take_along_axis``: these run without torch) and PyTorch's ``torch.scatter``,
``torch.scatter_add``, ``torch.take_along_dim`` where torch is installed: values eager and traced
in an ``nn.Graph``, gradients (the gather/scatter duality: ``src`` gets ``dy`` gathered at index,
``self`` gets ``dy`` with the written places zeroed for ``scatter``, all of it for
``scatter_add``), float32 and under AMP, and PyTorch's errors. The kernels' own tests, finite
differences of every rule included, are the op tables' (``tests/test_registry.py``,
``tests/test_grad.py``, ``tests/cuda``)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import miniflow as mf
from miniflow import nn

R = np.random.default_rng(11)
X = R.standard_normal((4, 5, 3)).astype(np.float32)


def _unique(n, shape, axis):
    """An index of ``shape`` whose values along ``axis`` are distinct, in ``[0, n)``."""
    full = list(shape)
    full[axis] = n
    return np.argsort(R.random(full), axis=axis).take(np.arange(shape[axis]), axis=axis)


CASES = [   # (dim, index) into X: smaller than X off dim, negative dim, empty
    (0, _unique(4, (3, 5, 3), 0)),
    (1, _unique(5, (4, 2, 3), 1)),
    (2, _unique(3, (2, 5, 3), 2)),
    (-1, _unique(3, (4, 5, 1), 2)),
    (1, np.zeros((4, 0, 3), np.int64)),
]
IDS = [f"dim{d}-{'x'.join(map(str, i.shape))}" for d, i in CASES]


def _src(index, bigger=False):
    shape = tuple(n + bigger for n in index.shape)
    return R.standard_normal(shape).astype(np.float32)


def _span(index, dim):
    """The part of X that ``index`` spans: all of ``dim``, index's sizes elsewhere (NumPy's
    along-axis functions take an index of the array's sizes off the axis)."""
    return tuple(slice(None) if k == dim % index.ndim else slice(0, n)
                 for k, n in enumerate(index.shape))


def _scatter_oracle(x, dim, index, src, add):
    """NumPy: ``np.add.at`` for the add; for the write, each element of index in C order (the
    last write wins), which ``np.put_along_axis`` is where index has no repeats."""
    out = np.array(x, np.float64)
    grid = list(np.indices(index.shape, sparse=True))
    grid[dim % x.ndim] = index
    at = tuple(np.broadcast_to(g, index.shape) for g in grid)
    part = np.broadcast_to(src, index.shape) if np.ndim(src) == 0 else \
        np.asarray(src)[tuple(slice(0, n) for n in index.shape)]
    if add:
        np.add.at(out, at, part)
    else:
        for c in np.ndindex(index.shape):
            out[tuple(a[c] for a in at)] = part[c]
    return out


@pytest.mark.parametrize("dim,index", CASES, ids=IDS)
def test_scatter_and_scatter_add_match_numpy_eager(dim, index):
    src = _src(index, bigger=True)      # PyTorch reads the first index.shape elements of src
    x, s = mf.tensor(X), mf.tensor(src)
    put = X.copy()
    np.put_along_axis(put[_span(index, dim)], index, src[tuple(slice(0, n) for n in index.shape)], axis=dim)
    for got in (x.scatter(dim, index, s), mf.scatter(x, dim, mf.tensor(index), s)):
        assert got.shape == X.shape and got.dtype == mf.float32
        np.testing.assert_array_equal(got.numpy(), put)
    np.testing.assert_array_equal(x.scatter(dim, index, value=-3.5).numpy(),
                                  _scatter_oracle(X, dim, index, -3.5, False))
    np.testing.assert_allclose(mf.scatter_add(x, dim, index, s).numpy(),
                               _scatter_oracle(X, dim, index, src, True), rtol=1e-6)


@st.composite
def _problems(draw):
    """A random ``(x, dim, index, src)``: rank 1 to 3, sizes 0 to 4 (index no larger than x off
    dim, any size along it, repeats likely), float32 or int64."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    dim = draw(st.integers(-rank, rank - 1))
    ishape = tuple(draw(st.integers(0, 5)) if k == dim % rank else draw(st.integers(0, n))
                   for k, n in enumerate(shape))
    r = np.random.default_rng(draw(st.integers(0, 2**16)))
    dt = draw(st.sampled_from([np.float32, np.int64]))
    x, src = (r.integers(-9, 9, sh).astype(dt) for sh in (shape, ishape))
    return x, dim, r.integers(0, shape[dim], ishape), src


@settings(max_examples=40, deadline=None)
@given(_problems())
def test_random_gathers_and_scatters_match_numpy(problem):
    """Eager gather, scatter (of src and of a number), scatter_add and take_along_dim on random
    shapes, dims and indices against the NumPy oracles."""
    x, dim, index, src = problem
    t = mf.tensor(x)
    np.testing.assert_array_equal(t.gather(dim, index).numpy(),
                                  np.take_along_axis(x[_span(index, dim)], index, dim))
    np.testing.assert_array_equal(t.scatter(dim, index, mf.tensor(src)).numpy(),
                                  _scatter_oracle(x, dim, index, src, False))
    np.testing.assert_array_equal(t.scatter(dim, index, 5).numpy(),
                                  _scatter_oracle(x, dim, index, 5, False))
    np.testing.assert_array_equal(t.scatter_add(dim, index, mf.tensor(src)).numpy(),
                                  _scatter_oracle(x, dim, index, src, True))
    if all(n in (1, m) for k, (n, m) in enumerate(zip(index.shape, x.shape)) if k != dim % x.ndim):
        np.testing.assert_array_equal(mf.take_along_dim(t, index, dim).numpy(),
                                      np.take_along_axis(x, index, dim))


def test_repeated_indices_write_the_last_and_add_all():
    """PyTorch leaves a repeated place of ``scatter`` undefined; miniflow writes the last element
    in index order. ``scatter_add`` sums them (in float32 for float16, rounded once)."""
    index = np.array([[2, 2, 0, 2], [1, 1, 1, 1]])
    x = np.zeros((2, 3), np.float32)
    src = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    np.testing.assert_array_equal(mf.tensor(x).scatter(1, index, mf.tensor(src)).numpy(),
                                  [[3, 0, 4], [0, 8, 0]])
    np.testing.assert_array_equal(_scatter_oracle(x, 1, index, src, False), [[3, 0, 4], [0, 8, 0]])
    half = mf.tensor(x.astype(np.float16)).scatter_add(
        1, np.zeros((2, 2048), np.int64), mf.tensor(np.full((2, 2048), 1.0, np.float16)))
    np.testing.assert_array_equal(half.numpy()[:, 0], [2048, 2048])   # float16 sums stall at 2048
    np.testing.assert_array_equal(
        mf.tensor(x).scatter_add(1, index, mf.tensor(src)).numpy(), [[3, 0, 7], [0, 26, 0]])


def test_int64_gather_scatter_and_take_along_dim():
    """PyTorch gathers and scatters integers too: int64 tensors keep their dtype, exactly."""
    a = np.arange(-6, 6).reshape(3, 4) * 1_000_000_007
    t = mf.tensor(a)
    index = np.array([[3, 0], [1, 1], [2, 3]])
    got = t.gather(1, index)
    assert got.dtype == mf.int64
    np.testing.assert_array_equal(got.numpy(), np.take_along_axis(a, index, 1))
    rows = np.array([[2, 0, 1, 2]])
    np.testing.assert_array_equal(t.take_along_dim(rows, 0).numpy(),
                                  np.take_along_axis(a, rows, 0))
    src = -np.arange(6).reshape(3, 2) - 7
    np.testing.assert_array_equal(t.scatter(1, index[:, :1], mf.tensor(src[:, :1])).numpy(),
                                  _scatter_oracle(a, 1, index[:, :1], src[:, :1], False))
    np.testing.assert_array_equal(t.scatter_add(1, index, mf.tensor(src)).numpy(),
                                  _scatter_oracle(a, 1, index, src, True).astype(np.int64))
    np.testing.assert_array_equal(t.scatter(0, rows[:, :2], 9.9).numpy()[[2, 0], [0, 1]], [9, 9])


TAKE = [   # (input shape, index, dim): broadcasting off dim both ways, None, negative dim
    ((3, 4), np.array([[0], [3], [1]]), 1),
    ((3, 4), np.array([[0, 2, 1, 0]]), 0),
    ((1, 4), np.array([[0], [2], [1]]), 1),
    ((2, 1, 3), np.array([[[2, 0, 1]] * 5]), -1),
    ((3, 4), np.array([[5, 0], [11, 11]]), None),
]


@pytest.mark.parametrize("shape,index,dim", TAKE, ids=[f"{s}-{d}" for s, _, d in TAKE])
def test_take_along_dim_matches_numpy(shape, index, dim):
    a = R.standard_normal(shape).astype(np.float32)
    want = np.take_along_axis(a.reshape(-1), index.reshape(-1), 0) if dim is None else \
        np.take_along_axis(a, index, dim)     # NumPy broadcasts off dim too
    for got in (mf.take_along_dim(mf.tensor(a), index, dim),
                mf.tensor(a).take_along_dim(mf.tensor(index), dim=dim)):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)


class _Step(nn.Graph):
    """``loss = sum(w * f(x, s))`` for parameters x and s, one SGD step of lr 1 (so a
    parameter's gradient is its change), optionally through a Linear and under AMP."""

    def __init__(self, fn, x, s, amp=False):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x.copy())
        self.m.s = nn.Parameter(s.copy())
        self.fn = fn
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))
        if amp:
            self.config.enable_amp(True)

    def build(self):
        y = self.fn(self.m.x, self.m.s)
        w = mf.tensor(np.arange(1, 1 + y.numel(), dtype=np.float32).reshape(y.shape))
        (y * w).sum().backward()
        return y

    def grads(self, x, s):
        return x - self.m.x.numpy(), s - self.m.s.numpy()


@pytest.mark.parametrize("dim,index", CASES, ids=IDS)
def test_traced_scatter_and_its_gradients_are_the_gather_duality(dim, index):
    """``scatter``: ``dx = w`` zeroed at the written places, ``ds = w`` gathered at index (its
    larger part, beyond index's shape, gets 0); ``scatter_add``: ``dx = w``, ``ds`` the same."""
    src = _src(index, bigger=True)
    part = tuple(slice(0, n) for n in index.shape)
    w = np.arange(1, 1 + X.size, dtype=np.float32).reshape(X.shape)
    ds = np.zeros_like(src)
    ds[part] = np.take_along_axis(w[_span(index, dim)], index, dim)
    for add in (False, True):
        g = _Step(lambda x, s: (x.scatter_add if add else x.scatter)(dim, mf.tensor(index), s),
                  X, src)
        np.testing.assert_allclose(g().numpy(), _scatter_oracle(X, dim, index, src, add),
                                   rtol=1e-6)
        dx = w.copy() if add else _scatter_oracle(w, dim, index, 0.0, False)
        for got, want in zip(g.grads(X, src), (dx, ds)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_take_along_dim_gradient_sums_over_broadcast_and_repeats():
    """The gradient of a broadcast input adds up every row that read it (the expand's sum) and
    every repeated index (the gather's scatter-add)."""
    a = R.standard_normal((1, 4)).astype(np.float32)
    index = np.array([[0, 0], [3, 0], [1, 1]])
    g = _Step(lambda x, s: mf.take_along_dim(x, mf.tensor(index), 1) + s, a,
              np.zeros((3, 2), np.float32))
    np.testing.assert_array_equal(g().numpy(), np.take_along_axis(np.repeat(a, 3, 0), index, 1))
    want = np.zeros(4)
    np.add.at(want, index.reshape(-1), np.arange(1, 7))
    np.testing.assert_allclose(g.grads(a, np.zeros((3, 2), np.float32))[0], [want], atol=1e-5)


class _Head(nn.Graph):
    """A Linear's output written, added and taken along by index with a parameter s, one SGD
    step of ``mean(y * y)``, AMP optional."""

    def __init__(self, model, s, index, amp):
        super().__init__()
        self.model, self.m, self.index = model, nn.Module(), index
        self.m.s = nn.Parameter(s.copy())
        self.add_optimizer(mf.optim.SGD(list(model.parameters()) + [self.m.s], lr=0.5))
        if amp:
            self.config.enable_amp(True)

    def build(self, x):
        index, s = mf.tensor(self.index), self.m.s
        y = self.model(x).scatter(1, index, s).scatter_add(0, index[:2], s[:2])
        loss = (y.take_along_dim(index, 1) ** 2).mean()
        loss.backward()
        return loss


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_scatters_train_after_a_linear_under_amp(amp):
    """Under AMP the dim_scatter ops (in none of OneFlow's lists) run in float32 after the
    float16 matmul; the step stays float32's to float16 rounding."""
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 6)).astype(np.float32)
    s = r.standard_normal((4, 2)).astype(np.float32)
    index = np.array([[0, 2], [1, 3], [4, 0], [3, 2]])
    runs = []
    for flag in (False, amp):
        mf.manual_seed(0)
        g = _Head(nn.Linear(6, 5), s, index, flag)
        runs.append((g(mf.tensor(x)).numpy(), g.model.weight.numpy(), g.m.s.numpy(), g))
    if amp:
        rows = {(r.op, r.dtype, r.color) for r in runs[1][3].amp_report().rows}
        assert {("matmul", "f16", "white"), ("dim_scatter_update", "f32", "unlisted"),
                ("dim_scatter_add", "f32", "unlisted"), ("dim_gather", "f32", "unlisted"),
                ("dim_scatter_update_scalar", "f32", "unlisted")} <= rows
    tol = 3e-3 if amp else 0
    for got, want in zip(runs[1][:3], runs[0][:3]):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert not np.array_equal(runs[0][2], s)    # s was trained


def test_errors_are_pytorchs_and_name_the_function():
    x = mf.tensor(X)
    s = mf.tensor(np.ones((4, 5, 3), np.float32))
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 5"):
        x.scatter(1, np.full((1, 1, 1), 5), s)
    with pytest.raises(IndexError, match="index -1 is out of bounds for dimension 0 with size 4"):
        x.scatter_add(0, np.full((1, 1, 1), -1), s)
    with pytest.raises(IndexError, match=r"dim_scatter_add: index 9 at indices\[0, 0, 1\] is out "
                                         r"of range \[0, 3\) of axis 2"):
        x.scatter_add(2, mf.tensor(np.array([[[0, 9]]])), s)
    with pytest.raises(IndexError, match=r"dim_scatter_update_scalar: index 4"):
        x.scatter(0, mf.tensor(np.array([[[4]]])), 1.0)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.scatter(3, np.zeros((1, 1, 1), np.int64), s)
    with pytest.raises(ValueError, match="dim_scatter_update_scalar: index .* must have the rank of"):
        x.scatter(0, np.zeros((1, 1), np.int64), 1.0)
    with pytest.raises(ValueError, match=r"Expected index \[1, 6, 1\] to be no larger than self "
                                         r"\[4, 5, 3\] apart from dimension 0"):
        x.scatter(0, np.zeros((1, 6, 1), np.int64), s)
    with pytest.raises(ValueError, match=r"no larger size than src \[1, 1, 1\]"):
        x.scatter_add(0, np.zeros((1, 2, 1), np.int64), mf.tensor(np.ones((1, 1, 1), np.float32)))
    with pytest.raises(TypeError, match="Expected dtype int64 for index"):
        x.scatter(0, np.zeros((1, 1, 1)), s)
    with pytest.raises(TypeError, match=r"scatter_add\(\): Expected self.dtype to be equal to "
                                        r"src.dtype \(self is float32, src float16\)"):
        x.scatter_add(0, np.zeros((1, 1, 1), np.int64), s.to(mf.float16))
    with pytest.raises(TypeError, match=r"cast src with .to\(miniflow.int64\)"):
        mf.tensor(np.zeros((4, 5, 3), np.int64)).scatter(0, np.zeros((1, 1, 1), np.int64), s)
    with pytest.raises(TypeError, match=r"scatter_add\(\): argument 'src' must be Tensor, not "
                                        r"float"):
        x.scatter_add(0, np.zeros((1, 1, 1), np.int64), 1.0)
    with pytest.raises(TypeError, match="give src .* or value"):
        x.scatter(0, np.zeros((1, 1, 1), np.int64))
    with pytest.raises(NotImplementedError, match="reduce='add' is not supported"):
        x.scatter(0, np.zeros((1, 1, 1), np.int64), s, reduce="add")
    a = mf.tensor(np.zeros((3, 4), np.float32))
    fn = r"torch\.take_along_dim\(\): "
    with pytest.raises(ValueError, match=fn + "input and indices should have the same number of "
                                              "dimensions, but got 2 dimensions for input, and 1"):
        mf.take_along_dim(a, np.array([0, 1]), 1)
    with pytest.raises(TypeError, match=fn + "Expected dtype int64 for index"):
        mf.take_along_dim(a, mf.tensor(np.zeros((1, 1), np.float32)), 1)
    with pytest.raises(ValueError, match=fn + r"The size of tensor a \(3\) must match the size of "
                                              r"tensor b \(2\) at non-singleton dimension 0"):
        mf.take_along_dim(a, np.zeros((2, 2), np.int64), 1)
    with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 12"):
        mf.take_along_dim(a, np.array([12]))
    with pytest.raises(IndexError, match="index -1 is out of bounds for dimension 1"):
        mf.take_along_dim(a, np.array([[-1]]), 1)


def test_shape_errors_are_raised_at_graph_build():
    """An index the shapes rule out is refused while build traces, before anything runs."""
    with pytest.raises(ValueError, match="dim_scatter_update_scalar: index .* must have the rank"):
        _Step(lambda x, s: x.scatter(1, mf.tensor(np.zeros((2,), np.int64)), 0.5), X, X)()
    with pytest.raises(ValueError, match=r"no larger size than src \[4, 5, 1\]"):
        _Step(lambda x, s: x.scatter(2, mf.tensor(np.zeros((4, 5, 2), np.int64)), s), X,
              X[:, :, :1])()


# --------------------------------------------------------------------------- against PyTorch
@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("dim,index", CASES, ids=IDS)
def test_values_and_gradients_match_torch(torch, dim, index):
    """Eager values of both, and the traced gradients of ``self`` and ``src`` (src of index's
    shape: PyTorch's backward refuses a larger one)."""
    src = _src(index)
    tx, ts, ti = (torch.tensor(X, requires_grad=True), torch.tensor(src, requires_grad=True),
                  torch.tensor(index))
    for add in (False, True):
        want = (torch.scatter_add if add else torch.scatter)(tx, dim, ti, ts)
        got = (mf.scatter_add if add else mf.scatter)(mf.tensor(X), dim, index, mf.tensor(src))
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6)
        w = torch.arange(1, 1 + want.numel(), dtype=torch.float32).reshape(want.shape)
        tx.grad = ts.grad = None
        (want * w).sum().backward()
        g = _Step(lambda x, s: (x.scatter_add if add else x.scatter)(dim, mf.tensor(index), s),
                  X, src)
        g()
        for got, t in zip(g.grads(X, src), (tx, ts)):
            np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-6, atol=1e-6)
    want = torch.tensor(X).scatter(dim, ti, 0.25)
    np.testing.assert_array_equal(mf.tensor(X).scatter(dim, index, 0.25).numpy(), want.numpy())


@pytest.mark.parametrize("shape,index,dim", TAKE, ids=[f"{s}-{d}" for s, _, d in TAKE])
def test_take_along_dim_matches_torch(torch, shape, index, dim):
    a = R.standard_normal(shape).astype(np.float32)
    want = torch.take_along_dim(torch.tensor(a), torch.tensor(index), dim)
    got = mf.take_along_dim(mf.tensor(a), index, dim)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_int64_matches_torch(torch):
    a = np.arange(12).reshape(3, 4)
    index = np.array([[3, 0], [1, 1], [2, 3]])
    ta, ti = torch.tensor(a), torch.tensor(index)
    np.testing.assert_array_equal(mf.tensor(a).gather(1, index).numpy(),
                                  torch.gather(ta, 1, ti).numpy())
    rows = np.array([[2, 0, 1, 2]])
    np.testing.assert_array_equal(mf.tensor(a).scatter(0, rows, 2.7).numpy(),
                                  ta.scatter(0, torch.tensor(rows), 2.7).numpy())
    np.testing.assert_array_equal(mf.tensor(a).scatter_add(1, index, mf.tensor(a[:, :2])).numpy(),
                                  ta.scatter_add(1, ti, ta[:, :2]).numpy())
