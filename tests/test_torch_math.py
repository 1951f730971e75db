"""PyTorch's commonly used names that were AttributeErrors: ``where`` (``miniflow.where``,
``Tensor.where``), ``amax`` / ``amin``, ``logsumexp``, ``norm``, ``flip``, ``index_select``,
``sort``, ``floor``, ``round``, ``log1p``, ``isnan``, ``new_zeros`` / ``new_ones`` / ``new_full``
/ ``new_tensor``; ``nn.functional``'s ``normalize``, ``one_hot``, ``pad``,
``binary_cross_entropy_with_logits`` (``nn.BCEWithLogitsLoss``) and ``kl_div``
(``nn.KLDivLoss``); ``cumsum``, ``cumprod``, ``prod``, ``nonzero`` / ``argwhere``,
``miniflow.einsum``, ``narrow``, ``select``, ``movedim``, ``unflatten``;
and the hint of the ``AttributeError`` of a name that is not there yet. Values against NumPy
float64 eagerly and inside ``build``, gradients against central differences (both run without
torch) and against torch (skipped without it), PyTorch's errors."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import miniflow as mf
from miniflow import nn
from miniflow.nn import functional as F

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None

R = np.random.default_rng(11)
X = R.standard_normal((3, 4, 5))
X[0, 0, :2] = 2.5               # ties of the maximum: amax shares their gradient
MASK = R.random((4, 5)) < 0.5
Y = R.standard_normal((4, 1))


def _lse(a, axis):
    m = a.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(a - m).sum(axis=axis))


CASES = {   # name: (miniflow function, NumPy float64 oracle); x of shape X's
    "where": (lambda t: mf.where(MASK, t, mf.tensor(Y, dtype=t.dtype)),
              lambda a: np.where(MASK, a, Y)),
    "where_number": (lambda t: t.where(MASK, 0.5) + mf.where(MASK, -1.0, t),
                     lambda a: np.where(MASK, a, 0.5) + np.where(MASK, -1.0, a)),
    "amax": (lambda t: t.amax(-1) + t.amax((0, 2), keepdim=True).sum(),
             lambda a: a.max(-1) + a.max((0, 2), keepdims=True).sum()),
    "amin": (lambda t: t.amin() + t.amin([2, 0]).sum(), lambda a: a.min() + a.min((0, 2)).sum()),
    "logsumexp": (lambda t: t.logsumexp(1) + t.logsumexp((0, 2), keepdim=True).sum(),
                  lambda a: _lse(a, 1) + _lse(a, (0, 2)).sum()),
    "norm": (lambda t: t.norm() + t.norm(1, 2).sum() + t.norm(math.inf, (0, 1)).sum()
             + t.norm(3.0, -1, keepdim=True).sum() + t.norm(-math.inf, 0).sum(),
             lambda a: np.sqrt((a * a).sum()) + abs(a).sum(2).sum() + abs(a).max((0, 1)).sum()
             + ((abs(a) ** 3).sum(-1) ** (1 / 3)).sum() + abs(a).min(0).sum()),
    "normalize": (lambda t: F.normalize(t) + F.normalize(t, p=1.0, dim=-1),
                  lambda a: a / np.sqrt((a * a).sum(1, keepdims=True))
                  + a / abs(a).sum(-1, keepdims=True)),
    "flip": (lambda t: t.flip(0) + t.flip((1, 2)) * 2.0 + t.flip([-1]) * 3.0,
             lambda a: a[::-1] + a[:, ::-1, ::-1] * 2.0 + a[..., ::-1] * 3.0),
    "index_select": (lambda t: t.index_select(1, [3, 0, 3]).sum(2)
                     + t.index_select(-1, mf.tensor(np.array([4, 4, 1]))).sum(2)[:, :3],
                     lambda a: a[:, [3, 0, 3]].sum(2) + a[..., [4, 4, 1]].sum(2)[:, :3]),
    "pad": (lambda t: F.pad(t, (1, 2)) * 2.0 + F.pad(t, (0, 3, -1, 1), value=1.5),
            lambda a: np.pad(a, ((0, 0), (0, 0), (1, 2))) * 2.0
            + np.pad(a[:, 1:], ((0, 0), (0, 1), (0, 3)), constant_values=1.5)),
    "sort": (lambda t: t.sort(1).values + t.sort(dim=-2, descending=True)[0] * 2.0,
             lambda a: np.sort(a, 1) + -np.sort(-a, 1) * 2.0),
    "log1p": (lambda t: (t * t).log1p() + (t.abs() - 0.99).log1p().exp(),
              lambda a: np.log1p(a * a) + np.exp(np.log1p(abs(a) - 0.99))),
    "floor_round": (lambda t: (t * 3.0).floor() + (t * 3.0).round() * 2.0 + t,
                    lambda a: np.floor(a * 3.0) + np.round(a * 3.0) * 2.0 + a),
}
BCE_T = R.random((3, 4, 5))
BCE_W, BCE_PW = R.random((4, 5)), R.random(5) * 3.0
CASES["bce_with_logits"] = (
    lambda t: F.binary_cross_entropy_with_logits(
        t * 8.0, mf.tensor(BCE_T, dtype=t.dtype), mf.tensor(BCE_W, dtype=t.dtype),
        reduction="none", pos_weight=mf.tensor(BCE_PW, dtype=t.dtype)),
    lambda a: BCE_W * ((1 - BCE_T) * 8 * a + (1 + (BCE_PW - 1) * BCE_T)
                       * np.log1p(np.exp(-8 * a))))
EIN, EIN2, EIN3 = R.standard_normal((5, 2)), R.standard_normal((2, 5)), R.standard_normal(3)
CASES["einsum"] = (   # a batch, a contraction, three operands, one operand, implicit output
    lambda t: mf.einsum("bij,bij->ij", t, t) + mf.einsum("ijk", [t]).sum(0)
    + mf.einsum("bij,jk,kl->il", t, *(mf.tensor(e, dtype=t.dtype) for e in (EIN, EIN2)))
    + mf.einsum("bij,b", t, mf.tensor(EIN3, dtype=t.dtype)),
    lambda a: np.einsum("bij,bij->ij", a, a) + a.sum(0)
    + np.einsum("bij,jk,kl->il", a, EIN, EIN2) + np.einsum("bij,b", a, EIN3))
CASES["cumsum"] = (lambda t: t.cumsum(1) + t.cumsum(-1, dtype=t.dtype) * 2.0 + t.cumsum(0),
                   lambda a: np.cumsum(a, 1) + np.cumsum(a, -1) * 2.0 + np.cumsum(a, 0))
CASES["cumprod"] = (lambda t: t.cumprod(1) + t.cumprod(-1, dtype=t.dtype) * 2.0 + t.cumprod(0),
                    lambda a: np.cumprod(a, 1) + np.cumprod(a, -1) * 2.0 + np.cumprod(a, 0))
CASES["prod"] = (lambda t: t.prod(1) + t.prod(-1, keepdim=True).sum(1) + t[0, :2].prod(),
                 lambda a: np.prod(a, 1) + np.prod(a, -1, keepdims=True).sum(1) + a[0, :2].prod())
CASES["narrow_select_movedim_unflatten"] = (   # shape moves: a copy of the elements they name
    lambda t: t.narrow(2, -3, 2) + t.select(2, 1)[..., None] * 2.0
    + t.movedim((0, 2), (2, 0)).narrow(0, 1, 2).movedim(0, -1).moveaxis(1, 0)
    + t.unflatten(1, (2, -1)).sum(1)[:, :, :2].repeat(1, 2, 1),
    lambda a: a[..., -3:-1] + a[..., 1][..., None] * 2.0 + a[..., 1:3]
    + np.tile(a.reshape(3, 2, 2, 5).sum(1)[:, :, :2], (1, 2, 1)))
CASES["einsum_dots_diagonal"] = (   # diagonals, ... broadcast, ... summed, the trace
    lambda t: mf.einsum("bii->bi", t[:, :, :4])
    + mf.einsum("...j,...j->...", t[:, :, :4], t[0, :, 1:]) + mf.einsum("...ij->j", t)[:4]
    + mf.einsum("ii", t[0, :, :4]),
    lambda a: np.einsum("bii->bi", a[:, :, :4])
    + np.einsum("...j,...j->...", a[:, :, :4], a[0, :, 1:]) + a.sum((0, 1))[:4]
    + np.trace(a[0, :, :4]))
KL_T = R.dirichlet(np.ones(5), (3, 4))
KL_T[0, 0, :2] = 0.0            # xlogy: 0 where the target is 0
CASES["kl_div"] = (
    lambda t: F.kl_div(t, KL_T, reduction="none")
    + F.kl_div(t, mf.tensor(KL_T, dtype=t.dtype), reduction="batchmean")
    + F.kl_div(t, np.log(KL_T + 0.1), reduction="sum", log_target=True),
    lambda a: np.where(KL_T > 0, KL_T * np.log(np.where(KL_T > 0, KL_T, 1)), 0) - KL_T * a
    + (np.where(KL_T > 0, KL_T * np.log(np.where(KL_T > 0, KL_T, 1)), 0) - KL_T * a).sum() / 3
    + ((KL_T + 0.1) * (np.log(KL_T + 0.1) - a)).sum())


class _Step(nn.Graph):
    """loss = sum(w * f(x)) for a parameter x, one SGD step of lr 1: x - x' is the gradient."""

    def __init__(self, fn, x):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x.copy())
        self.fn = fn
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self):
        y = self.fn(self.m.x)
        (y * mf.tensor(_weights(y.shape), dtype=y.dtype)).sum().backward()
        return y


def _weights(shape):
    return np.linspace(0.5, 1.5, int(np.prod(shape))).reshape(shape)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_match_numpy_float64_eager_and_in_build(name):
    fn, oracle = CASES[name]
    want = oracle(X)
    eager = fn(mf.tensor(X)).numpy()
    assert eager.shape == np.shape(want) and eager.dtype == np.float64
    np.testing.assert_allclose(eager, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_Step(fn, X)().numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fn(mf.tensor(X.astype(np.float32))).numpy(), want, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("name", sorted(set(CASES) - {"floor_round"}))
def test_gradients_match_central_differences(name):
    """Away from ties and jumps (a fresh draw): ``amax`` and ``sort`` are smooth there."""
    fn = CASES[name][0]
    x = np.random.default_rng(3).standard_normal(X.shape)
    g = _Step(fn, x)
    g()
    got = x - g.m.x.numpy()
    w = _weights(np.shape(fn(mf.tensor(x)).numpy()))
    want = np.zeros_like(x)
    h = 1e-6
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = h
        want[i] = ((fn(mf.tensor(x + d)).numpy() - fn(mf.tensor(x - d)).numpy()) * w).sum() / (2 * h)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


TORCH_CASES = {   # name: (miniflow, torch) functions of a float32 tensor X's shape
    "where": (CASES["where"][0], lambda t: torch.where(torch.tensor(MASK), t,
                                                       torch.tensor(Y, dtype=t.dtype))),
    "amax_ties": (lambda t: t.amax((0, 2)) + t.amin(-1, keepdim=True).sum(),
                  lambda t: t.amax((0, 2)) + t.amin(-1, keepdim=True).sum()),
    "logsumexp": (lambda t: t.logsumexp(-1) + t.logsumexp((0, 1)).sum(),
                  lambda t: t.logsumexp(-1) + t.logsumexp((0, 1)).sum()),
    "norm": (lambda t: t.norm(dim=1) + t.norm(1, (0, 2)).sum() + t.norm(float("inf"), -1).sum(),
             lambda t: t.norm(dim=1) + t.norm(1, (0, 2)).sum() + t.norm(float("inf"), -1).sum()),
    "normalize": (lambda t: F.normalize(t, dim=-1), lambda t: torch.nn.functional.normalize(
        t, dim=-1)),
    "flip_index_select": (lambda t: t.flip(0, 2) + t.index_select(1, [1, 1, 0, 3]).sum(1,
                                                                                      True),
                          lambda t: t.flip((0, 2)) + t.index_select(
                              1, torch.tensor([1, 1, 0, 3])).sum(1, True)),
    "pad": (lambda t: F.pad(t, (2, -1, 1, 0), value=-1.0),
            lambda t: torch.nn.functional.pad(t, (2, -1, 1, 0), value=-1.0)),
    "sort": (lambda t: t.sort(-1, True).values * 2.0 + t.sort(0)[0],
             lambda t: t.sort(-1, True).values * 2.0 + t.sort(0)[0]),
    "floor_round_log1p": (lambda t: (t * 2).floor() + (t * 2).round() + t.abs().log1p(),
                          lambda t: (t * 2).floor() + (t * 2).round() + t.abs().log1p()),
    "kl_div": (lambda t: F.kl_div(t.log_softmax(-1), mf.tensor(KL_T.astype(np.float32)),
                                  reduction="batchmean"),
               lambda t: torch.nn.functional.kl_div(
                   t.log_softmax(-1), torch.tensor(KL_T.astype(np.float32)),
                   reduction="batchmean")),
    "cumsum": (lambda t: t.cumsum(1) * 2.0 + t.cumsum(dim=-1),
               lambda t: t.cumsum(1) * 2.0 + t.cumsum(dim=-1)),
    "cumprod": (lambda t: t.cumprod(1) * 2.0 + t.cumprod(dim=-1),
                lambda t: t.cumprod(1) * 2.0 + t.cumprod(dim=-1)),
    "prod": (lambda t: t.prod(1) * 2.0 + t.prod(dim=-1, keepdim=True).sum(1),
             lambda t: t.prod(1) * 2.0 + t.prod(dim=-1, keepdim=True).sum(1)),
    "narrow_select_movedim_unflatten": (
        CASES["narrow_select_movedim_unflatten"][0],
        lambda t: t.narrow(2, -3, 2) + t.select(2, 1)[..., None] * 2.0
        + t.movedim((0, 2), (2, 0)).narrow(0, 1, 2).movedim(0, -1).moveaxis(1, 0)
        + t.unflatten(1, (2, -1)).sum(1)[:, :, :2].repeat(1, 2, 1)),
    "einsum": (lambda t: mf.einsum("bij,bkj->bik", t, t * 2.0) + mf.einsum("bij->bi", t)[..., None],
               lambda t: torch.einsum("bij,bkj->bik", t, t * 2.0)
               + torch.einsum("bij->bi", t)[..., None]),
    "einsum_dots_diagonal": (CASES["einsum_dots_diagonal"][0],
                             lambda t: torch.einsum("bii->bi", t[:, :, :4])
                             + torch.einsum("...j,...j->...", t[:, :, :4], t[0, :, 1:])
                             + torch.einsum("...ij->j", t)[:4] + torch.einsum("ii", t[0, :, :4])),
    "bce_with_logits": (lambda t: F.binary_cross_entropy_with_logits(
        t, mf.tensor(BCE_T[0, 0].astype(np.float32)).expand(3, 4, 5)),
        lambda t: torch.nn.functional.binary_cross_entropy_with_logits(
            t, torch.tensor(BCE_T[0, 0].astype(np.float32)).expand(3, 4, 5))),
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_values_and_gradients_match_torch(name):
    """float32, ties of the maximum included (amax / amin share the gradient equally, as
    PyTorch's)."""
    if torch is None:
        pytest.skip("torch is not installed")
    fn, tfn = TORCH_CASES[name]
    x = X.astype(np.float32)
    t = torch.tensor(x, requires_grad=True)
    y = tfn(t)
    (y * torch.tensor(_weights(y.shape), dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(fn(mf.tensor(x)).numpy(), y.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    g = _Step(fn, x)
    np.testing.assert_allclose(g().numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x - g.m.x.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_where_takes_a_condition_computed_in_the_graph_and_leaks_no_nan():
    """An int64 condition of the graph (its complement from casts), inf and NaN in the place
    not taken, broadcasting of condition, input and other."""
    a = np.array([[1.0, np.inf, np.nan], [-2.0, 3.0, np.nan]], np.float32)
    b = np.array([10.0, 20.0, 30.0], np.float32)
    c = np.array([[1, 0, 0], [1, 1, 0]])

    class G(nn.Graph):
        def build(self, x, y, cond):
            return mf.where(cond, x, y), x.where(cond, 0.0)

    for got, want in zip(G()(mf.tensor(a), mf.tensor(b), mf.tensor(c)),
                         (np.where(c, a, b), np.where(c, a, 0.0))):
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(mf.where(c[:, :1] == 1, mf.tensor(b), 1.0).numpy(),
                                  np.where(c[:, :1], b, 1.0))
    assert mf.where(c, 1.0, 2.0).dtype == mf.float32
    with pytest.raises(TypeError, match="different dtypes"):
        mf.where(c, mf.tensor(a), mf.tensor(b.astype(np.float64)))
    with pytest.raises(TypeError, match="bool or integer mask"):
        mf.where(np.ones(3), mf.tensor(b), 0.0)
    with pytest.raises(RuntimeError, match=r"\[\[2, 3\], \[2\]\] do not broadcast"):
        mf.where(c, mf.tensor(b[:2]), 0.0)


def test_where_returns_the_element_taken_bit_for_bit():
    """A ``-0.0`` taken from input or other came out ``+0.0`` (the zero added for the place
    not taken); PyTorch returns the element taken bit for bit: here eagerly and in build, in
    float32, float16 and float64, with NaN, inf and -0.0 in the place not taken (the
    gradients: ``CASES["where"]``)."""
    c = np.array([[1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1]], bool)
    a = np.array([[-0.0, 1.0, np.nan, 2.0, -np.inf, -0.0],
                  [np.nan, 0.0, np.inf, -0.0, 4.0, 5.0]])
    b = np.array([[np.nan, -0.0, 3.0, np.inf, 5.0, 0.0],
                  [-0.0, np.nan, -0.0, 1.0, -np.inf, -0.0]])
    want = np.where(c, a, b)

    class G(nn.Graph):
        def build(self, x, y):
            return mf.where(c, x, y), x.where(mf.tensor(c.astype(np.int64)), y)

    for dt in (np.float32, np.float16, np.float64):
        x, y = mf.tensor(a.astype(dt)), mf.tensor(b.astype(dt))
        for got in (mf.where(c, x, y), *G()(x, y)):
            assert got.numpy().tobytes() == want.astype(dt).tobytes(), (dt, got.numpy())
    if torch is not None:
        t = torch.where(torch.tensor(c), torch.tensor(a), torch.tensor(b))
        assert t.numpy().tobytes() == want.tobytes()


def test_amax_amin_logsumexp_of_a_tensor_with_an_empty_kept_dim():
    """``amax(1)`` of a [0, 3] tensor raised "Expected reduction dim [1] to have non-zero size"
    (the reduced size came from the element count), ``amin``'s error named ``amax``; PyTorch's
    results: empty, and ``logsumexp`` over an empty dim is -inf (log of an empty sum)."""
    e = mf.tensor(np.zeros((0, 3), np.float32))
    assert e.amax(1).shape == e.amin(1).shape == e.logsumexp(1).shape == (0,)
    np.testing.assert_array_equal(e.logsumexp(0).numpy(), [-np.inf] * 3)
    with pytest.raises(ValueError, match=r"amin\(\): Expected reduction dim \[0\] to have "
                                         r"non-zero size"):
        e.amin(0)


def test_amax_and_amin_of_a_0d_tensor_take_dims_0_and_minus_1_only():
    """``amax(1)`` / ``amin(-2)`` of a 0-d tensor returned its value; PyTorch's IndexError
    now, eagerly and inside ``build``, as ``sum``'s; dims 0 and -1 (alone, in a tuple, kept)
    still give the value."""
    t = mf.tensor(np.float32(2.5))
    for name in ("amax", "amin"):
        for dim in (0, -1, (0,), [-1], ()):
            got = getattr(t, name)(dim, keepdim=True)
            assert got.shape == () and got.item() == 2.5
        for bad in (1, -2, (0, 1)):
            with pytest.raises(IndexError, match=f"{name}: Dimension out of range"):
                getattr(t, name)(bad)
            with pytest.raises(IndexError, match=f"{name}: Dimension out of range"):
                mf.compile(lambda x: getattr(x, name)(bad))(t)


def test_where_of_a_0d_condition():
    """``miniflow.where(np.array(True), x, 1.0)`` said "got bool np.False_" (the complement of
    a 0-d array is a NumPy scalar); PyTorch takes a 0-d condition."""
    x = mf.tensor(np.array(3.0, np.float32))
    assert mf.where(np.array(True), x, 1.0).item() == 3.0
    assert mf.where(np.array(False), x, 1.0).item() == 1.0


def test_the_2_norm_of_a_zero_row_trains_as_pytorchs():
    """``F.normalize`` of an all-zero row (and ``norm``'s) gave NaN gradients (sqrt's ``inf *
    0``), so one SGD step made the weights NaN; PyTorch's gradient is ``1 / eps`` per element
    through normalize's clamp and 0 through the norm. Here: one step of lr 1 on
    ``sum(normalize(w)) + sum(norm(w, dim=1))`` against the closed form (a row r: ``(1 - r *
    sum(r) / |r|^2) / |r| + r / |r|``)."""
    class Rows(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]], np.float32))

        def forward(self, x):
            return (F.normalize(self.w, dim=1) * x).sum() + self.w.norm(dim=1).sum()

    class Step(nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.add_optimizer(mf.optim.SGD(m.parameters(), lr=1.0))

        def build(self, x):
            loss = self.m(x)
            loss.backward()
            return loss

    model = Rows()
    loss = Step(model)(np.ones((2, 3), np.float32))
    r = np.array([1.0, 2.0, 2.0])
    grad = (1 - r * r.sum() / 9) / 3 + r / 3
    np.testing.assert_allclose(loss.numpy(), 5 / 3 + 3, rtol=1e-6)
    np.testing.assert_array_equal(model.w.numpy()[0], np.float32([-1e12] * 3))   # 1 / eps
    np.testing.assert_allclose(model.w.numpy()[1], r - grad, rtol=1e-6)
    x = mf.tensor(np.array([[0.0, 0.0], [3.0, 4.0], [np.inf, 1.0]], np.float32))
    np.testing.assert_array_equal(x.norm(dim=1).numpy(), [0.0, 5.0, np.inf])


def test_logsumexp_of_infinite_slices_and_norm_errors_as_pytorch():
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0], [1e30, 1e30]], np.float32)
    got = mf.tensor(x).logsumexp(1).numpy()
    np.testing.assert_array_equal(got[:3], [-np.inf, np.inf, np.nan])
    np.testing.assert_allclose(got[3], 1e30, rtol=1e-6)
    with pytest.raises(ValueError, match="p='nuc' is not supported"):
        mf.tensor(x).norm("nuc")
    with pytest.raises(ValueError, match="to have non-zero size"):
        mf.tensor(np.zeros((2, 0))).amax(1)


def test_isnan_floor_and_round_follow_pytorch_at_the_edges():
    v = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.3, -0.0, np.inf, -np.inf, np.nan, 1e9 + 0.5,
                  -3.7], np.float32)
    x = mf.tensor(v)
    np.testing.assert_array_equal(x.isnan(), np.isnan(v))
    assert x.isnan().dtype is mf.bool
    for got, want in ((x.floor(), np.floor(v)), (x.round(), np.round(v)),
                      (x.round(decimals=1), np.round(v * 10) / 10)):
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want))
    if torch is not None:
        t = torch.tensor(v)
        np.testing.assert_array_equal(x.round().numpy(), t.round().numpy())
        np.testing.assert_array_equal(x.round(decimals=-1).numpy(), t.round(decimals=-1).numpy())
        np.testing.assert_array_equal(x.floor().numpy(), t.floor().numpy())


@pytest.mark.parametrize("dtype", [mf.float16, mf.bfloat16])
def test_half_norm_p_and_round_decimals_are_computed_in_float32(dtype):
    """``norm(3)`` and ``round(decimals=...)`` of a half tensor were computed in it:
    ``|x|^3`` of 0.0026 underflowed float16 to a norm of 0, of 50 overflowed it to inf, and
    ``x * 10**4`` of 7.0 overflowed float16 (round gave inf). As PyTorch's, they are computed
    in float32 and rounded once to the tensor's dtype, eagerly and inside ``build``."""
    v = np.array([[0.0026, -1e-3, 0.0], [50.0, -7.0, 2.236]], np.float32)
    half = mf.tensor(v, dtype=dtype)
    exact = half.numpy().astype(np.float64)
    calls = {"norm3": (lambda x: x.norm(3, dim=1),
                       lambda a: (abs(a) ** 3).sum(1) ** (1 / 3)),
             "norm0.5": (lambda x: x.norm(0.5),
                         lambda a: np.sqrt(abs(a)).sum() ** 2),
             "round4": (lambda x: x.round(decimals=4),
                        lambda a: np.round(a * 1e4) / 1e4),
             "round2": (lambda x: x.round(decimals=2), lambda a: np.round(a * 100) / 100)}
    for fn, oracle in calls.values():
        want = oracle(exact).astype(np.float32)
        for got in (fn(half), mf.compile(fn)(half)):
            assert got.dtype is dtype
            np.testing.assert_allclose(got.numpy().astype(np.float64),
                                       want.astype(dtype.np).astype(np.float64), rtol=1e-2)


def test_one_hot_as_pytorch_eager_and_from_an_index_of_the_graph():
    idx = np.array([[0, 3], [2, 1]])
    want = np.eye(4, dtype=np.int64)[idx]
    for got in (F.one_hot(mf.tensor(idx)), F.one_hot(idx), F.one_hot(mf.tensor(idx), 4)):
        assert got.dtype == mf.int64
        np.testing.assert_array_equal(got.numpy(), want)
    assert F.one_hot(mf.tensor(idx), 6).shape == (2, 2, 6)

    class G(nn.Graph):
        def build(self, i):
            return F.one_hot(i, num_classes=4)

    np.testing.assert_array_equal(G()(mf.tensor(idx)).numpy(), want)
    with pytest.raises(RuntimeError, match="only applicable to index tensor"):
        F.one_hot(mf.tensor(idx.astype(np.float32)))
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        F.one_hot(mf.tensor(idx), 3)
    with pytest.raises(RuntimeError, match="Class values must be non-negative"):
        F.one_hot(mf.tensor(-idx))
    if torch is not None:
        np.testing.assert_array_equal(torch.nn.functional.one_hot(torch.tensor(idx)).numpy(),
                                      want)


def test_bce_with_logits_module_reductions_and_errors_match_torch():
    x = (R.standard_normal((4, 5)) * 30).astype(np.float32)   # large logits: stable form
    t = R.random((4, 5)).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        loss = nn.BCEWithLogitsLoss(reduction=reduction, pos_weight=BCE_PW.astype(np.float32))
        got = loss(mf.tensor(x), mf.tensor(t)).numpy()
        per = (1 - t) * x + (1 + (BCE_PW - 1) * t) * (np.logaddexp(0, -x))
        want = per if reduction == "none" else per.sum() if reduction == "sum" else per.mean()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if torch is not None:
            tl = torch.nn.BCEWithLogitsLoss(reduction=reduction,
                                            pos_weight=torch.tensor(BCE_PW, dtype=torch.float32))
            np.testing.assert_allclose(got, tl(torch.tensor(x), torch.tensor(t)).numpy(),
                                       rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"Target size \(\[5\]\) must be the same as input"):
        F.binary_cross_entropy_with_logits(mf.tensor(x), mf.tensor(t[0]))
    with pytest.raises(ValueError, match="reduction"):
        nn.BCEWithLogitsLoss(reduction="batchmean")
    assert nn.KLDivLoss(reduction="batchmean", log_target=True).reduction == "batchmean"
    with pytest.raises(ValueError, match="reduction"):
        F.kl_div(mf.tensor(x), mf.tensor(t), reduction="avg")


def test_pad_index_select_flip_and_sort_errors():
    x = mf.tensor(X)
    with pytest.raises(NotImplementedError, match="mode='reflect' is not supported"):
        F.pad(x, (1, 1), mode="reflect")
    with pytest.raises(ValueError, match="Padding length must be divisible by 2"):
        F.pad(x, (1,))
    with pytest.raises(ValueError, match="Padding length too large"):
        F.pad(x, (1,) * 8)
    with pytest.raises(IndexError, match="index out of range in self"):
        x.index_select(0, [3])
    with pytest.raises(IndexError, match="Index is supposed to be a vector"):
        x.index_select(0, [[0]])
    with pytest.raises(RuntimeError, match="dim 0 appears multiple times"):
        x.flip(0, -3)
    v, i = mf.tensor(np.array([3.0, np.nan, 1.0, 3.0])).sort(descending=True)
    np.testing.assert_array_equal(v.numpy(), [np.nan, 3.0, 3.0, 1.0])
    np.testing.assert_array_equal(i.numpy(), [1, 0, 3, 2])


def test_pad_of_a_value_beyond_the_dtype_is_refused_as_by_pytorch():
    """``F.pad(x_fp16, (1, 1), value=1e9)`` was inf without a word; PyTorch raises "value
    cannot be converted to type at::Half without overflow", eagerly and in build (float16,
    bfloat16 and float32 limits); infinities, NaN and the largest finite value pad. Under AMP
    the traced input is float32 and the pad runs in float32: the value stays."""
    half = mf.tensor(np.zeros(2, np.float16))
    for t, value in ((half, 1e9), (half, -65505.0), (half.to(mf.bfloat16), 1e39),
                     (mf.tensor(np.zeros(2, np.float32)), -1e39)):
        with pytest.raises(RuntimeError, match=rf"pad: value .* cannot be converted to "
                                               rf"{t.dtype.name} without overflow \(its "
                                               r"largest finite value is"):
            F.pad(t, (1, 1), value=value)
    for value in (65504.0, -np.inf, np.nan):
        np.testing.assert_array_equal(F.pad(half, (1, 0), value=value).numpy(), [value, 0, 0])
    bf16 = F.pad(half.to(mf.bfloat16), (1, 0), value=1e9).float().numpy()
    assert bf16[0] == np.float32(np.array(1e9).astype(mf.bfloat16.np))

    class G(nn.Graph):
        def __init__(self, amp):
            super().__init__()
            if amp:
                self.config.enable_amp(True, dtype=mf.float16)

        def build(self, x):
            return F.pad(x, (1, 1), value=1e9)

    with pytest.raises(RuntimeError, match="pad: value 1e.09 cannot be converted to float16"):
        G(False)(half)
    got = G(True)(mf.tensor(np.ones(2, np.float32)))
    np.testing.assert_array_equal(got.numpy(), [1e9, 1.0, 1.0, 1e9])
    if torch is not None:
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.nn.functional.pad(torch.zeros(2, dtype=torch.half), (1, 1), value=1e9)


def test_new_factories_take_the_tensors_dtype():
    x = mf.tensor(X)                     # float64
    assert x.new_zeros(2, 3).dtype == mf.float64 and x.new_zeros((2, 3)).shape == (2, 3)
    np.testing.assert_array_equal(x.new_ones([2]).numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(x.new_full((2,), 7).numpy(), [7.0, 7.0])
    assert x.new_full((1,), 7, dtype=mf.int64).dtype == mf.int64
    got = x.new_tensor([0.1, 0.2])       # no float32 rounding on the way
    assert got.dtype == mf.float64 and got.numpy()[0] == 0.1
    with pytest.raises(ValueError, match="requires_grad"):
        x.new_zeros(2, requires_grad=True)


def test_cumsum_of_int64_and_0d_tensors_and_float16_as_pytorch():
    """An int64 tensor exact in int64, eagerly and inside build (which refused it: op cumsum
    took floating tensors), a 0-d one, float16 summed in float32."""
    i = np.array([[2 ** 62, 1, -3], [5, 2 ** 53 + 1, 7]])

    class G(nn.Graph):
        def build(self, x):
            return x.cumsum(0), x.cumsum(1)

    for got, want in zip((mf.tensor(i).cumsum(0), mf.tensor(i).cumsum(1)) + G()(mf.tensor(i)),
                         (np.cumsum(i, 0), np.cumsum(i, 1)) * 2):
        assert got.dtype == mf.int64
        np.testing.assert_array_equal(got.numpy(), want)
    assert mf.tensor(np.float32(3.0)).cumsum(0).numpy() == np.float32(3.0)
    assert mf.tensor(np.int64(-4)).cumsum(0).numpy() == -4
    h = np.full(3000, 1.0, np.float16)      # float16 steps of 2 from 2048: a float16 sum stops
    np.testing.assert_array_equal(mf.tensor(h).cumsum(0).numpy(),
                                  np.cumsum(h.astype(np.float32)).astype(np.float16))
    if torch is not None:
        np.testing.assert_array_equal(mf.tensor(i).cumsum(0).numpy(),
                                      torch.tensor(i).cumsum(0).numpy())


def test_cumprod_gradient_with_zeros_in_the_row_matches_differences_and_torch():
    """Rows with no zero, one zero (first, inside, last) and two: the gradient of the running
    product is PyTorch's (the sum over i >= k of dy[i] times the product of x[:i+1] but x[k]),
    against central differences in float64 and torch's autograd; values against NumPy."""
    x = np.array([[1.5, -0.5, 2.0, 0.75, 1.25], [0.0, 1.5, -2.0, 0.5, 3.0],
                  [0.5, 2.0, 0.0, 1.5, -1.0], [1.5, -1.0, 0.5, 2.0, 0.0],
                  [2.0, 0.0, 1.5, 0.0, 0.5], [0.0, 0.0, 1.0, 2.0, 3.0]])

    def fn(t):
        return t.cumprod(1) + t.cumprod(0) * 0.5

    g = _Step(fn, x)
    np.testing.assert_allclose(g().numpy(), np.cumprod(x, 1) + np.cumprod(x, 0) * 0.5,
                               rtol=1e-12)
    got = x - g.m.x.numpy()
    w = _weights(x.shape)
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = 1e-6
        want[i] = ((fn(mf.tensor(x + d)).numpy() - fn(mf.tensor(x - d)).numpy()) * w).sum() / 2e-6
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    if torch is not None:
        t = torch.tensor(x, requires_grad=True)
        (fn(t) * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_cumprod_of_int64_0d_and_float16_tensors_as_pytorch():
    """int64 in int64 (wrapping past 2**63 as PyTorch's), eagerly and inside build; a 0-d
    tensor; float16 multiplied in float32 and rounded once per element."""
    i = np.array([[3, -2, 2 ** 31, 2 ** 31 + 1], [0, 5, -1, 7]], np.int64)

    class G(nn.Graph):
        def build(self, x):
            return x.cumprod(1), x.cumprod(0)

    with np.errstate(over="ignore"):
        wants = (np.cumprod(i, 1), np.cumprod(i, 0))
    t = mf.tensor(i)
    for got, want in zip((t.cumprod(1), t.cumprod(0)) + G()(t), wants * 2):
        assert got.dtype == mf.int64
        np.testing.assert_array_equal(got.numpy(), want)
    assert mf.tensor(np.float32(-3.0)).cumprod(0).numpy() == np.float32(-3.0)
    h = np.full(40, 1.25, np.float16)
    np.testing.assert_array_equal(mf.tensor(h).cumprod(0).numpy(),
                                  np.cumprod(h.astype(np.float32)).astype(np.float16))
    if torch is not None:
        np.testing.assert_array_equal(t.cumprod(1).numpy(), torch.tensor(i).cumprod(1).numpy())
    with pytest.raises(IndexError, match="cumprod"):
        t.cumprod(2)


I64 = np.array([[2 ** 62 + 1, -3, 7, 7], [5, -2 ** 62, 0, -2 ** 62]], np.int64)
"""int64 values a float64 path would round (2**62 + 1)."""

INT64_CASES = {   # name: (miniflow function, NumPy oracle of the same dtype)
    "floor": (lambda t: t.floor(), np.floor), "round": (lambda t: t.round(), np.round),
    "log1p": (lambda t: t.log1p(), lambda a: np.log1p(a.astype(np.float32))),
    "amax": (lambda t: t.amax(1), lambda a: a.max(1)),
    "amax_all": (lambda t: t.amax(), lambda a: a.max()),
    "amax_keepdim": (lambda t: t.amax(0, keepdim=True), lambda a: a.max(0, keepdims=True)),
    "amin": (lambda t: t.amin(1), lambda a: a.min(1)),
    "amin_dims": (lambda t: t.amin((1, 0), keepdim=True), lambda a: a.min((0, 1), keepdims=True)),
    "neg": (lambda t: -t, np.negative), "neg_method": (lambda t: t.neg(), np.negative),
}


@pytest.mark.parametrize("name", sorted(INT64_CASES))
def test_int64_floor_round_log1p_amax_amin_neg_as_pytorch_eager_and_in_build(name):
    """They raised for an int64 tensor (ops floor, round, log1p, reduce_max, negative take
    floating tensors); now PyTorch's: floor and round a copy (int64), log1p float32 (type
    promotion), amax and amin the int64 extremes, ``-x`` int64, exact, eagerly and inside
    build."""
    fn, oracle = INT64_CASES[name]

    class G(nn.Graph):
        def build(self, x):
            return fn(x)

    with np.errstate(invalid="ignore"):     # log1p of a negative: NaN
        want = np.asarray(oracle(I64))
    want = want.astype(np.int64) if name in ("floor", "round") else want
    for got in (fn(mf.tensor(I64)), G()(mf.tensor(I64))):
        assert got.dtype.np == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    if torch is not None:                   # the same calls on a torch tensor
        np.testing.assert_array_equal(fn(mf.tensor(I64)).numpy(), fn(torch.tensor(I64)).numpy())


def test_negating_int64_wraps_at_its_minimum_as_pytorch_also_under_amp():
    """``-x`` of an int64 tensor (op ``negative``, which took floating tensors only) is exact
    and wraps as PyTorch's: -(-2**63) is -2**63; under AMP too (the int64 value is no float to
    cast), next to a float computation."""
    ids = np.array([-2 ** 63, 2 ** 63 - 1, 0, -(2 ** 62) - 1], np.int64)
    want = np.array([-2 ** 63, -2 ** 63 + 1, 0, 2 ** 62 + 1], np.int64)

    class Neg(nn.Graph):
        def __init__(self, amp):
            super().__init__()
            self.config.enable_amp(amp)

        def build(self, x, f):
            return -x, x.neg().neg(), (-f).matmul(f)

    f = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal((-mf.tensor(ids)).numpy(), want)
    for amp in (False, True):
        neg, twice, _ = Neg(amp)(mf.tensor(ids), mf.tensor(f))
        assert neg.dtype is twice.dtype is mf.int64
        np.testing.assert_array_equal(neg.numpy(), want)
        np.testing.assert_array_equal(twice.numpy(), ids)
    if torch is not None:
        np.testing.assert_array_equal((-torch.tensor(ids)).numpy(), want)


@pytest.mark.parametrize("fn", ["mean", "var", "std"])
def test_mean_var_std_of_int64_are_pytorchs_runtime_error_eager_and_in_build(fn):
    """``int64_tensor.mean()`` was op scalar_mul's TypeError: it is PyTorch's RuntimeError
    ("could not infer output dtype ... Got: Long"; var and std: "only support floating point"),
    saying to cast with ``.float()`` first, eagerly and inside build."""
    said = ("could not infer output dtype. Input dtype must be either a floating point or "
            "complex dtype" if fn == "mean" else "std and var only support floating point and "
            "complex dtypes")
    match = rf"{fn}\(\): {said}. Got: Long \(cast it first: t.float\(\).{fn}\(\)\)"

    class G(nn.Graph):
        def build(self, x):
            return getattr(x, fn)(0)

    with pytest.raises(RuntimeError, match=match):
        getattr(mf.tensor(I64), fn)()
    with pytest.raises(RuntimeError, match=match):
        G()(mf.tensor(I64))
    np.testing.assert_allclose(getattr(mf.tensor(I64).float(), fn)(0).numpy(),
                               getattr(np, fn)(I64.astype(np.float32), 0, **(
                                   {} if fn == "mean" else {"ddof": 1})), rtol=1e-6)
    if torch is not None:
        with pytest.raises(RuntimeError, match=said):
            getattr(torch.tensor(I64), fn)()


@pytest.mark.parametrize("shape,dim,keepdim", [
    ((3, 4, 5), 1, False), ((3, 4, 5), (0, 2), True), ((3, 4, 5), None, False), ((), None, False),
    ((), -1, True), ((3, 0), 1, False), ((3, 0), 0, True), ((0, 4), (0, 1), False),
    ((6,), -1, True)])
def test_int64_sum_inside_build_is_exact_as_eagerly(shape, dim, keepdim):
    """``ids.sum(dim)`` of an int64 tensor inside ``build`` was a TypeError (op reduce_sum adds
    in floats), eagerly an exact int64 sum: inside ``build`` too now, beyond 2**53 (the values
    here near 2**60), over empty dims (0), 0-d, kept dims, as NumPy's int64 sum."""
    ids = np.random.default_rng(5).integers(-2 ** 60, 2 ** 60, size=shape).astype(np.int64)

    def fn(x):
        return x.sum(dim, keepdim)

    want = np.sum(ids, axis=dim, keepdims=keepdim, dtype=np.int64)
    for got in (fn(mf.tensor(ids)), mf.compile(fn)(mf.tensor(ids)), mf.compile(fn)(ids)):
        assert got.dtype is mf.int64 and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)


def test_sum_takes_pytorchs_dtype():
    """``x.sum(dtype=torch.float64)`` and ``mask.sum(1, dtype=torch.float32)`` were a TypeError
    (unexpected keyword): the tensor is cast to ``dtype`` first, as PyTorch's, eagerly and
    inside ``build``."""
    x = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    mask, ids = x > 0, np.arange(6).reshape(2, 3)
    got = mf.tensor(x).sum(dtype=mf.float64)
    assert got.dtype is mf.float64 and got.item() == x.astype(np.float64).sum()
    counts = mf.tensor(mask).sum(1, dtype=mf.float32)
    assert counts.dtype is mf.float32 and counts.tolist() == mask.sum(1).tolist()
    assert mf.tensor(ids).sum(0, True, dtype=mf.float32).tolist() == [[3.0, 5.0, 7.0]]
    built = mf.compile(lambda t: t.sum(-1, dtype=mf.float64))(x)
    assert built.dtype is mf.float64
    np.testing.assert_allclose(built.numpy(), x.astype(np.float64).sum(-1), rtol=1e-15)


def test_round_decimals_of_int64_is_refused_as_pytorch():
    with pytest.raises(RuntimeError, match=r"round\(\): decimals=1 of a int64 tensor is not "
                                           r"implemented .*\.to\(miniflow.float64\)"):
        mf.tensor(I64).round(decimals=1)


def test_nonzero_and_argwhere_as_pytorch_eagerly_and_refused_in_build():
    """``nonzero`` was an AttributeError with a hint: now PyTorch's (NaN counts, a 0-d tensor
    as ``[1, 0]`` or ``[0, 0]``, ``as_tuple`` one index tensor per dim); inside build refused,
    saying why (a data-dependent shape) and what to use."""
    a = np.array([[0.0, 1.5, 0.0], [np.nan, 0.0, -2.0]])
    for x in (a, a.astype(np.float32), np.array([[0, 3], [-1, 0]]), np.array(5.0),
              np.array(0), np.zeros((2, 0))):
        t = mf.tensor(x)
        for got in (t.nonzero(), t.argwhere()):
            assert got.dtype is mf.int64
            np.testing.assert_array_equal(got.numpy(), np.argwhere(x))
            assert got.shape == np.argwhere(x).shape
        parts = t.nonzero(as_tuple=True)
        assert isinstance(parts, tuple) and all(p.dtype is mf.int64 for p in parts)
        for got, want in zip(parts, np.nonzero(np.atleast_1d(x)), strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
        if torch is not None:
            np.testing.assert_array_equal(t.nonzero().numpy(), torch.tensor(x).nonzero().numpy())
            for got, want in zip(parts, torch.tensor(x).nonzero(as_tuple=True), strict=True):
                np.testing.assert_array_equal(got.numpy(), want.numpy())

    class G(nn.Graph):
        def build(self, x):
            return x.nonzero()

    with pytest.raises(RuntimeError, match="nonzero: its shape depends on the values .OneFlow's "
                                           "argwhere has a dynamic shape.*use masked_fill or "
                                           "miniflow.where instead"):
        G()(mf.tensor(a))


def test_names_not_there_yet_say_what_to_write(monkeypatch):
    from miniflow.tensor import core
    monkeypatch.setitem(core.NOT_THERE, "nothing_yet", "write y instead")
    x = mf.tensor(X)
    with pytest.raises(AttributeError, match=r"'nothing_yet': write y instead"):
        x.nothing_yet
    with pytest.raises(AttributeError, match=r"module 'miniflow' has no attribute "
                                             r"'nothing_yet': write y instead"):
        mf.nothing_yet
    with pytest.raises(AttributeError, match=r"'cumprod': miniflow's tensor math is Tensor "
                                             r"methods; write x.cumprod\(...\)"):
        mf.cumprod
    with pytest.raises(AttributeError, match=r"write x.logsumexp\(...\)"):
        mf.logsumexp
    with pytest.raises(AttributeError, match="^'Tensor' object has no attribute 'nothing'$"):
        x.nothing
    with pytest.raises(AttributeError, match="have no .data"):
        x.data
    with pytest.raises(AttributeError, match="'nothing': docs/differences.md lists"):
        mf.nothing
    with pytest.raises(AttributeError, match="functional' has no attribute 'ctc_loss': docs/"):
        F.ctc_loss
    assert not hasattr(F, "__wrapped__")


def test_einsum_errors_as_pytorch():
    a, b = mf.tensor(X), mf.tensor(X[0])
    with pytest.raises(RuntimeError, match="more operands were provided"):
        mf.einsum("ij->i", b, b)
    with pytest.raises(RuntimeError, match="fewer operands were provided"):
        mf.einsum("ij,jk->ik", b)
    with pytest.raises(RuntimeError, match=r"number of subscripts in the equation \(2\)"):
        mf.einsum("ij->i", a)
    with pytest.raises(RuntimeError, match="subscript j has size 4 for operand 1"):
        mf.einsum("ij,jk->ik", b, b)
    with pytest.raises(RuntimeError, match="output subscript k does not appear"):
        mf.einsum("ij->k", b)
    with pytest.raises(RuntimeError, match="found '.' for operand 0 for which an ellipsis was "
                                           "already found"):
        mf.einsum("......", b)
    with pytest.raises(RuntimeError, match="found '.' for output that is not part of any "
                                           "ellipsis"):
        mf.einsum("ij->i.", b)
    with pytest.raises(RuntimeError, match=r"subscripts in the equation \(3\) is more than the "
                                           r"number of dimensions \(2\) for operand 0"):
        mf.einsum("ij...k", b)
    with pytest.raises(RuntimeError, match="dimension 0 covered by ellipsis in operand 1 has "
                                           "size 3 which does not broadcast with previously "
                                           "seen ellipsis with size 4"):
        mf.einsum("...i,...i->...", b, a[:, 0])
    with pytest.raises(RuntimeError, match="subscript i is repeated for operand 0 but the sizes "
                                           "don't match, 5 != 4"):
        mf.einsum("ii->i", b)


@st.composite
def _einsum_cases(draw):
    """``(equation, arrays)``: one to three operands of letters from ``abcd`` (repeats make
    diagonals) and maybe ``...`` (a right-aligned part of one batch shape, some sizes 1:
    broadcast), the output implicit or explicit (with ``...`` somewhere where an operand has
    one: NumPy, the oracle, refuses to sum it)."""
    r = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    sizes = {c: draw(st.integers(1, 3)) for c in "abcd"}
    batch = draw(st.lists(st.integers(2, 3), max_size=2))
    terms, arrays = [], []
    for _ in range(draw(st.integers(1, 3))):
        letters = draw(st.lists(st.sampled_from("abcd"), max_size=3))
        shape = [sizes[c] for c in letters]
        term = "".join(letters)
        if batch and draw(st.booleans()):
            dots = [n if draw(st.booleans()) else 1 for n in batch[draw(st.integers(0, 2)):]]
            at = draw(st.integers(0, len(letters)))
            term, shape = term[:at] + "..." + term[at:], shape[:at] + dots + shape[at:]
        terms.append(term)
        arrays.append(r.standard_normal(shape))
    equation = ",".join(terms)
    if draw(st.booleans()):
        used = sorted(set(equation) - set(".,"))
        out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        if "..." in equation:
            out.insert(draw(st.integers(0, len(out))), "...")
        equation += "->" + "".join(out)
    return equation, arrays


@settings(max_examples=150, deadline=None)
@given(_einsum_cases())
def test_einsum_matches_numpy_on_random_equations(case):
    """Diagonals (a letter repeated in one operand), ``...`` broadcast and implicit outputs:
    ``miniflow.einsum`` of eager float64 tensors equals ``numpy.einsum``."""
    equation, arrays = case
    want = np.einsum(equation, *arrays)
    got = mf.einsum(equation, *(mf.tensor(a) for a in arrays)).numpy()
    assert got.shape == want.shape, equation
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=equation)


def test_einsum_with_dots_and_diagonals_inside_build_as_numpy():
    """The same equations traced into one graph (ops permute, reshape, gather, sum and
    batch_matmul) give NumPy's values; a summed ``...`` (NumPy refuses it) as PyTorch's."""
    r = np.random.default_rng(5)
    a, b, c = r.standard_normal((2, 3, 3)), r.standard_normal((4, 1, 3)), r.standard_normal(3)
    eqs = (("bii->bi", [a]), ("...ii", [a]), ("i...j,...j->...i", [a, b]), ("...i,i", [b, c]),
           ("ii,bij->bj", [a[0], a]))

    class G(nn.Graph):
        def build(self, *xs):
            outs = [mf.einsum(eq, *xs[k:k + len(ops)]) for k, (eq, ops) in
                    zip(np.cumsum([0] + [len(o) for _, o in eqs]), eqs)]
            return tuple(outs) + (mf.einsum("...ij->j", xs[0]),)

    got = G()(*(x for _, ops in eqs for x in ops))
    for g, (eq, ops) in zip(got, eqs):
        np.testing.assert_allclose(g.numpy(), np.einsum(eq, *ops), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[-1].numpy(), a.sum((0, 1)), rtol=1e-12)


class _Everything(nn.Graph):
    """One SGD step of a loss that uses every name of this file on a Linear's output."""

    def __init__(self, amp: bool):
        super().__init__()
        mf.manual_seed(0)
        self.m = nn.Linear(6, 4)
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=0.1))
        if amp:
            self.config.enable_amp(True, dtype=mf.float16)

    def build(self, x):
        y = self.m(x)
        t = mf.tensor(BCE_T[0, :, :4].astype(np.float32)).repeat(2, 1)
        loss = (F.binary_cross_entropy_with_logits(y, t) + y.logsumexp(1).mean()
                + mf.where(MASK[:, :4].repeat(2, 0), y, 0.0).cumsum(1).mean()
                + F.normalize(y).amax(1).mean() + y.flip(1).index_select(1, [0, 2]).round().sum()
                + F.pad(y, (1, 1)).norm() + mf.einsum("bi,bi->b", y, y).mean()
                + y.sort(1).values[:, 0].mean() + (y.abs().log1p() + y.floor()).mean()
                + F.kl_div(y.log_softmax(1), t / 4.0, reduction="batchmean"))
        loss.backward()
        return loss


def test_every_name_trains_in_one_graph_and_under_amp():
    """float32 and AMP (float16; the unlisted ops stay float32) take the same steps."""
    x = R.standard_normal((8, 6)).astype(np.float32)
    plain, amp = _Everything(False), _Everything(True)
    for _ in range(3):
        a, b = float(plain(x).numpy()), float(amp(x).numpy())
        assert np.isfinite(a) and abs(a - b) < 0.05 * abs(a)


def test_prod_edges_and_shape_moves_errors_are_pytorchs():
    """prod: of nothing 1, a bool tensor's int64, int64 exact (wrapping), 0-d, a float16 slice
    multiplied in float32 and rounded once, dtype= and one int dim only; mean(dtype=) of int64;
    nelement / element_size; narrow / select / movedim / unflatten PyTorch's errors."""
    assert mf.zeros(0, 3).prod(0).numpy().tolist() == [1.0, 1.0, 1.0]
    flags = mf.tensor(np.array([True, True, False]))
    assert flags.prod().dtype is mf.int64 and flags.prod().item() == 0
    big = np.array([[2 ** 31, 2 ** 31 + 1, 3], [5, -7, 11]], np.int64)
    np.testing.assert_array_equal(mf.tensor(big).prod(1).numpy(), np.prod(big, 1))
    assert mf.tensor(2.5).prod(0, keepdim=True).numpy() == 2.5
    h = np.full(40, 1.25, np.float16)     # each float16 product rounded: not the float32 one
    assert mf.tensor(h).prod().item() == np.float16(np.prod(h.astype(np.float32)))
    assert mf.tensor(big).prod(dtype=mf.float64).dtype is mf.float64
    with pytest.raises(TypeError, match="keepdim=True needs a dim"):
        mf.tensor(X).prod(keepdim=True)
    with pytest.raises(TypeError, match="one int"):
        mf.tensor(X).prod((0, 1))
    assert mf.tensor(np.array([1, 2], np.int64)).mean(dtype=mf.float64).item() == 1.5
    t = mf.tensor(X.astype(np.float16))
    assert (t.nelement(), t.element_size(), mf.tensor(big).element_size(),
            flags.element_size()) == (60, 2, 8, 1)
    bad = [(lambda lib, x: x.narrow(0, 5, 1), IndexError, r"start out of range \(expected "
            r"to be in range of \[-3, 3\], but got 5\)"),
           (lambda lib, x: x.narrow(0, 2, 2), RuntimeError, r"start \(2\) \+ length \(2\) "
            r"exceeds dimension size \(3\)"),
           (lambda lib, x: x.narrow(0, 0, -1), RuntimeError, "length must be non-negative"),
           (lambda lib, x: lib.tensor(1.0).narrow(0, 0, 1), RuntimeError, "0-dim"),
           (lambda lib, x: x.select(0, 3), IndexError, r"select\(\): index 3 out of range for "
            r"tensor of size \[3, 4, 5\] at dimension 0"),
           (lambda lib, x: lib.tensor(1.0).select(0, 0), IndexError, "0-dim"),
           (lambda lib, x: x.movedim((0, 0), (1, 2)), RuntimeError, "repeated dim in `source`"),
           (lambda lib, x: x.movedim((0, 1), (1,)), RuntimeError, "same number of dims"),
           (lambda lib, x: x.movedim(0, (1, 2)), TypeError, None),
           (lambda lib, x: x.unflatten(1, (3, 2)), RuntimeError, r"sizes \[3, 2\] don't "
            r"multiply up to the size of dim 1 \(4\)"),
           (lambda lib, x: x.unflatten(1, (-1, -1)), RuntimeError, "only one dimension"),
           (lambda lib, x: x.unflatten(1, ()), RuntimeError, "non-empty"),
           (lambda lib, x: x.prod((0, 1)), TypeError, None)]
    for fn, error, match in bad:
        with pytest.raises(error, match=match):
            fn(mf, t)
        if torch is not None:     # torch raises the same type
            with pytest.raises(error):
                fn(torch, torch.tensor(X))
