"""The ``Tensor`` methods a PyTorch ``forward()`` uses (indexing, ``view``, ``unsqueeze``,
``squeeze``, ``size``, ``dim``, ``int`` / ``tolist`` / format, ``argmax``, ``softmax``,
``masked_fill``, ``flatten``, ``split``, ``chunk``, ``detach``, ``sqrt``, ``abs``, ``pow``, ``var``,
``std``, ``expand``, ``repeat``, ``type_as``, ``float`` / ``half``, ``@`` on batches, ``tril`` /
``triu``), eager and traced in an ``nn.Graph``, against NumPy and PyTorch when installed
(``torch.Tensor``'s
documentation and the indexing rules of ``test/test_indexing.py``: basic indexing only, steps > 0,
PyTorch's error messages)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph
from miniflow.nn import functional as F

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None

R = np.random.default_rng(0)
X = R.standard_normal((4, 5, 6)).astype(np.float32)

KEYS = [np.s_[:, :3], np.s_[1], np.s_[-1, 2:], np.s_[..., 1], np.s_[None, :, 0], np.s_[1:3, ::2, 4],
        np.s_[::3, None, ..., -2:], np.s_[2:2], np.s_[:, 10:], np.s_[..., None]]


class _Index(mf.nn.Graph):
    def __init__(self, key):
        super().__init__()
        self.key = key

    def build(self, x):
        return x[self.key]


@pytest.mark.parametrize("key", KEYS, ids=[str(k) for k in KEYS])
def test_basic_indexing_matches_numpy_eager_and_traced(key):
    want = X[key]
    eager = mf.tensor(X)[key].numpy()
    traced = _Index(key)(mf.tensor(X)).numpy()
    for got in (eager, traced):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_an_int64_tensor_index_gathers_rows():
    idx = np.array([3, 0, 3], np.int64)
    np.testing.assert_array_equal(mf.tensor(X)[mf.tensor(idx)].numpy(), X[idx])


@pytest.mark.parametrize("key", [np.array([1, 0]), np.array([[3, -1], [0, 2]]), [2, -4, 2],
                                 np.array([1, 0], np.int32)], ids=str)
def test_a_numpy_or_list_index_gathers_rows_as_torch_eager_and_traced(key):
    """``torch``'s ``A[np.array([1, 0])]`` / ``A[[1, 0]]`` select along dim 0 (negative entries
    from the end); miniflow raised NumPy's "truth value ... is ambiguous". NumPy oracle."""
    want = X[np.asarray(key)]
    for got in (mf.tensor(X)[key], _Index(key)(mf.tensor(X))):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    if torch is not None:
        np.testing.assert_array_equal(torch.from_numpy(X)[key].numpy(), want)


@pytest.mark.parametrize("key,error,match", [
    ((slice(None), np.ones((5, 6), bool)), TypeError,
     r"a boolean mask of shape \[5, 6\] is not supported here .a 1-d mask is"),
    (np.array([True, False, True]), IndexError, r"The shape of the mask \[3\] at index 0"),
    (np.array([0.0, 1.0]), TypeError, r"must hold integers \(got float64\)"),
    ((np.array([0, 1]), [0]), TypeError, r"one array, list or Tensor index is supported"),
], ids=["bool_2d_in_a_tuple", "bool_wrong_length", "float_array", "two_in_a_tuple"])
def test_an_unsupported_array_index_names_what_is_supported(key, error, match):
    with pytest.raises(error, match=match):
        mf.tensor(X)[key]


@pytest.mark.parametrize("key", [np.array([True, False, True, False]),
                                 [True, False, True, False]], ids=["array", "list"])
def test_a_1d_bool_mask_selects_its_true_rows_as_pytorch(key):
    """``x[mask]`` with a 1-d bool mask known when the key is read (a NumPy array or a list)
    was refused; it selects the True rows as PyTorch's ``x[mask]`` (here rows 0 and 2)."""
    np.testing.assert_array_equal(mf.tensor(X)[key].numpy(), X[[0, 2]])


def test_int64_tensors_clone_index_flip_and_select_exactly_eager_and_in_build():
    """``labels[perm]``, ``ids.clone()``, ``ids.flip(0)`` and ``index_select`` of an int64
    tensor raised (ops identity and gather took floating tensors); they copy exactly beyond
    2**53, eagerly and inside build."""
    big = np.array([[1, 2, 3], [4, 5, 6]], np.int64) * 2 ** 60
    t = mf.tensor(big)
    copy = t.clone()
    copy[0, 0] = 7
    assert copy.dtype is mf.int64 and t.numpy()[0, 0] == big[0, 0]
    np.testing.assert_array_equal(t[[1, 0]].numpy(), big[[1, 0]])
    np.testing.assert_array_equal(t[mf.tensor(np.array([1, 1]))].numpy(), big[[1, 1]])
    np.testing.assert_array_equal(t[:, [-1]].numpy(), big[:, [-1]])
    np.testing.assert_array_equal(t.flip(1).numpy(), big[:, ::-1])
    np.testing.assert_array_equal(t.index_select(1, [2, 0]).numpy(), big[:, [2, 0]])


    class Take(nn.Graph):
        def build(self, x):
            return (x.clone(), x[[1, 0]], x[mf.tensor(np.array([1, 1]))], x[:, [-1]], x.flip(1),
                    x.index_select(1, [2, 0]), x.long().flip(0))

    wants = (big, big[[1, 0]], big[[1, 1]], big[:, [-1]], big[:, ::-1], big[:, [2, 0]], big[::-1])
    for got, want in zip(Take()(t), wants):
        assert got.dtype is mf.int64
        np.testing.assert_array_equal(got.numpy(), want)


def test_an_out_of_range_tensor_index_is_named_eagerly():
    with pytest.raises(IndexError, match=r"gather: index 7 at indices\[1\] is out of range "
                                         r"\[0, 4\) of axis 0"):
        mf.tensor(X)[mf.tensor(np.array([0, 7], np.int64))]


@pytest.mark.parametrize("index", [np.array([0, 2**63], np.uint64),
                                   np.array([0, 2**64 - 1], np.uint64),
                                   np.array([0, 4], np.uint8), [0, -5]],
                         ids=["uint64_2**63", "uint64_max", "uint8", "negative_list"])
def test_an_out_of_range_array_index_is_named_as_given(index):
    """An unsigned index was cast to int64 (2**63 became negative, 2**64 - 1 became -1) and a
    negative one wrapped before the check; the error named the converted value. Now it names
    the index as given (PyTorch's message) and its position."""
    with pytest.raises(IndexError, match=rf"index {np.asarray(index)[1]} is out of bounds for "
                                         r"dimension 0 with size 4 \(the index array's element "
                                         r"\[1\]; 1 of 2 out of bounds\)"):
        mf.tensor(X)[index]


def test_indexing_errors_are_pytorchs():
    t = mf.tensor(X)
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        t[4]
    with pytest.raises(IndexError, match="too many indices for tensor of dimension 3"):
        t[0, 0, 0, 0]
    with pytest.raises(ValueError, match="step must be greater than zero"):
        t[::-1]
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.size(3)


class _Grad(mf.nn.Graph):
    """loss = sum(w * f(x)) for a parameter x: its gradient shows each method's backward."""

    def __init__(self, fn, shape):
        super().__init__()
        self.m = mf.nn.Module()
        self.m.x = mf.nn.Parameter(_first(shape))
        self.fn = fn
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self):
        y = self.fn(self.m.x)
        w = mf.tensor(np.arange(1, 1 + int(np.prod(y.shape)), dtype=np.float32).reshape(y.shape))
        (y * w).sum().backward()
        return y


def _first(shape):
    """The first elements of X in ``shape`` (a copy)."""
    return X.reshape(-1)[:int(np.prod(shape))].reshape(shape).copy()


def _torch_grad(fn, x):
    torch = pytest.importorskip("torch")
    t = torch.tensor(x, requires_grad=True)
    y = fn(t)
    w = torch.arange(1, 1 + y.numel(), dtype=torch.float32).reshape(y.shape)
    (y * w).sum().backward()
    return y.detach().numpy(), t.grad.numpy()


METHODS = {
    "slice": (lambda t: t[:, 1:4:2, -1], (4, 5, 6)),
    "view": (lambda t: t.view(2, 2, 30)[:, 1], (4, 5, 6)),
    "unsqueeze": (lambda t: t.unsqueeze(-1).unsqueeze(0), (3, 4)),
    "squeeze": (lambda t: t.squeeze() * 2.0 + t.squeeze(2).squeeze(-3) * t.squeeze((0, 2)),
                (1, 4, 1, 5)),
    "flatten": (lambda t: t.flatten(1), (4, 5, 6)),
    "softmax": (lambda t: t.softmax(1), (4, 5, 6)),
    "softmax_last": (lambda t: t.softmax(-1), (4, 5)),
    "masked_fill": (lambda t: t.masked_fill(_MASK, -2.5), (4, 5)),
    "split": (lambda t: t.split(2, dim=1)[2] * 3.0, (4, 5)),
    "chunk": (lambda t: t.chunk(3, dim=-1)[1] * 3.0 + t.chunk(3, -1)[2].sum(), (4, 5)),
    "detach": (lambda t: t * t.detach(), (3, 4)),
    "max_dim": (lambda t: t.max(dim=-1)[0] * 2.0, (4, 5)),
    "max_dim_keepdim": (lambda t: t.max(1, keepdim=True).values, (4, 5, 6)),
    "max_all": (lambda t: t.max() * 3.0, (4, 5)),
    "sqrt_rsqrt": (lambda t: (t * t + 0.5).sqrt() + (t * t + 0.25).rsqrt(), (4, 5)),
    "abs": (lambda t: t.abs() + abs(t * 3.0), (4, 5, 6)),
    "pow": (lambda t: t.abs().pow(1.5) + t ** 3 + t.square() + (t * t + 1.0) ** -0.5, (4, 5)),
    "pow_0": (lambda t: t.pow(0) * 2.0 + t ** 0.5, (4, 5)),
    "var": (lambda t: t.var(1) + t.var((0, 2), keepdim=True, correction=0).sum(), (4, 5, 6)),
    "var_unbiased": (lambda t: t.var(-1, False) + t.var(), (4, 5)),
    "std": (lambda t: t.std(0) + t.std(1, keepdim=True, correction=2), (4, 5)),
    "expand": (lambda t: t.unsqueeze(1).expand(-1, 3, -1) * t.expand(2, 4, 5).sum(0).unsqueeze(1),
               (4, 5)),
    "expand_as_type_as": (lambda t: t[:1].expand_as(t) * t.half().type_as(t), (4, 5)),
    "repeat": (lambda t: t.repeat(2, 1, 3) + t[:, :1].repeat((1, 1, 15)), (4, 5)),
    "min": (lambda t: t.min(dim=-1)[0] * 2.0 + t.min(0, keepdim=True).values.sum() + t.min(),
            (4, 5)),
    "clamp": (lambda t: t.clamp(-0.5, 0.8) + t.clamp(min=0.1) * 2.0 + t.clip(max=-0.2), (4, 5)),
    "log_softmax": (lambda t: t.log_softmax(1) + t.log_softmax(-1), (4, 5, 6)),
    "clone": (lambda t: t.clone() * 2.0 + t, (4, 5)),
    "list_in_tuple": (lambda t: t[:, [-1, 0, -1], 1:], (4, 5, 6)),
    "tril_triu": (lambda t: t.tril() + t.tril(-1) * 2.0 + t.triu(2) * 3.0 + t.triu(-2),
                  (4, 5, 6)),
    "tril_triu_wide": (lambda t: t.tril(3) + t.triu(1) * 2.0, (4, 5)),
    "sin_cos": (lambda t: t.sin() * 2.0 + (t * 3.0).cos() + t.sin().cos(), (4, 5, 6)),
}
_MASK = np.tri(4, 5, dtype=bool)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_and_its_gradient_match_pytorch(name):
    fn, shape = METHODS[name]
    torch = pytest.importorskip("torch")
    x = _first(shape)
    tfn = fn if name != "masked_fill" else (lambda t: t.masked_fill(torch.tensor(_MASK), -2.5))
    want_y, want_g = _torch_grad(tfn, x)
    g = _Grad(fn, shape)
    got_y = g().numpy()
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x - g.m.x.numpy(), want_g, rtol=1e-5, atol=1e-5)   # lr 1


def test_max_returns_values_and_indices_as_pytorch():
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 3.0, 3.0, -1.0], [np.nan, 0.0, 7.0, np.nan]], np.float32)
    for dim in (0, 1, -1):
        values, indices = mf.tensor(x).max(dim=dim)
        want = torch.tensor(x).max(dim=dim)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    with pytest.raises(ValueError, match="Expected reduction dim 1 to have non-zero size"):
        mf.tensor(np.zeros((2, 0), np.float32)).max(dim=1)
    with pytest.raises(TypeError, match=r"keepdim=True needs a dim .*shape \[2, 4\]"):
        mf.tensor(x).max(keepdim=True)          # torch: no such overload (a TypeError too)
    with pytest.raises(TypeError):
        torch.tensor(x).max(keepdim=True)


def test_max_and_softmax_along_dim_0_of_a_0d_tensor_as_pytorch():
    """PyTorch takes dim 0 / -1 of a 0-d tensor: ``max`` gives (the element, index 0), 0-d
    whatever ``keepdim``; ``softmax`` 1 (nan for nan and inf), ``log_softmax`` 0: eager, in
    ``nn.functional`` and traced (both failed with an error from an internal op)."""
    from miniflow.nn import functional as F
    values = np.float32([3.0, -2.5, np.nan, np.inf, -np.inf])
    want_soft = np.where(np.isfinite(values), 1.0, np.nan)
    for v, soft in zip(values, want_soft):
        s = mf.tensor(v)
        for dim in (0, -1):
            top = s.max(dim, keepdim=True)
            assert top.values.shape == () and top.indices.shape == ()
            np.testing.assert_array_equal(top.values.numpy(), v)
            assert int(top.indices.numpy()) == 0
            for got in (s.softmax(dim), F.softmax(s, dim)):
                assert got.shape == ()
                np.testing.assert_array_equal(got.numpy(), soft)
            np.testing.assert_array_equal(F.log_softmax(s, dim).numpy(), np.log(soft))

    class Scalar(nn.Graph):
        def build(self, x):
            return x.max(0).values + x.softmax(-1)

    assert Scalar()(mf.tensor(np.float32(2.0))).numpy() == np.float32(3.0)


def test_argmax_and_squeeze_match_pytorch_eager_and_traced():
    """``torch.argmax`` (flattened or along a dim, keepdim, NaN the largest, the first of ties,
    int64) and ``torch.squeeze`` (every size-1 dim, or the listed ones that have size 1), eager
    and inside a graph's build."""
    torch = pytest.importorskip("torch")
    x = np.array([[[1.0, 3.0, 3.0, -1.0]], [[np.nan, 0.0, 7.0, np.nan]]], np.float32)  # [2,1,4]
    cases = [((), {}), ((), {"keepdim": True}), ((0,), {}), ((2,), {"keepdim": True}),
             ((-1,), {})]

    class G(nn.Graph):
        def build(self, t):
            return tuple(t.argmax(*a, **k) for a, k in cases) + (t.squeeze(), t.squeeze((1, 2)))

    traced = [v.numpy() for v in G()(mf.tensor(x))]
    for (args, kw), got in zip(cases, traced):
        want = torch.tensor(x).argmax(*args, **kw).numpy()
        eager = mf.tensor(x).argmax(*args, **kw).numpy()
        for value in (eager, got):
            assert value.dtype == np.int64 and value.shape == want.shape, (args, kw)
            np.testing.assert_array_equal(value, want)
    assert traced[-2].shape == torch.tensor(x).squeeze().shape == (2, 4)
    assert traced[-1].shape == tuple(torch.tensor(x).squeeze((1, 2)).shape) == (2, 4)
    assert mf.tensor(np.float32(2.0)).argmax(0).numpy() == 0
    assert mf.tensor(np.float32(2.0)).squeeze(0).shape == ()
    with pytest.raises(IndexError, match=r"argmax\(\): Expected reduction dim to be specified"):
        mf.tensor(np.zeros((2, 0), np.float32)).argmax()
    assert mf.tensor(x).squeeze([1]).shape == mf.tensor(x).squeeze(1, 2).shape == (2, 4)
    assert mf.tensor(x).squeeze(dim=(0, 1)).shape == (2, 4)
    with pytest.raises(RuntimeError, match="squeeze: dim 1 appears multiple times"):
        mf.tensor(x).squeeze((1, -2))
    with pytest.raises(IndexError, match=r"argmax\(\): Expected reduction dim 0 to have non-zero"):
        mf.tensor(np.zeros((0, 3), np.float32)).argmax(dim=0)
    with pytest.raises(IndexError, match=r"squeeze: Dimension out of range .*\[-3, 2\], but got 3"):
        mf.tensor(x).squeeze(3)
    with pytest.raises(TypeError, match="squeeze: dim must be an int, got 1.0"):
        mf.tensor(x).squeeze(1.0)


def test_size_dim_float_half_and_batched_matmul():
    t = mf.tensor(X)
    assert t.size() == (4, 5, 6) and t.size(-1) == 6 and t.dim() == 3
    assert t.half().dtype is mf.float16 and t.half().float().dtype is mf.float32
    assert t.float() is t
    a = R.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = R.standard_normal((2, 3, 5, 6)).astype(np.float32)
    np.testing.assert_allclose((mf.tensor(a) @ mf.tensor(b)).numpy(), a @ b, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose((mf.tensor(a) @ mf.tensor(b[0, 0])).numpy(), a @ b[0, 0],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="equal batch dimensions"):
        mf.tensor(a) @ mf.tensor(b[0])


def test_to_and_softmax_dtype_take_torch_dtypes_as_pytorch():
    """``t.to(torch.float16)`` (the layers took torch dtypes, ``Tensor.to`` refused them) and
    ``softmax(x, dim, dtype=)``: the input cast first, as ``torch.nn.functional.softmax``."""
    torch = pytest.importorskip("torch")
    h = X.astype(np.float16)
    t = mf.tensor(h)
    assert t.to(torch.float32).dtype is mf.float32 and t.to(torch.bfloat16).dtype is mf.bfloat16
    for got, want in ((F.softmax(t, -1, dtype=torch.float32),
                       torch.nn.functional.softmax(torch.tensor(h), -1, dtype=torch.float32)),
                      (t.softmax(1, dtype=mf.float32), torch.tensor(h).softmax(1, torch.float32)),
                      (F.log_softmax(t, 0, dtype="float64"),
                       torch.nn.functional.log_softmax(torch.tensor(h), 0, dtype=torch.float64))):
        assert got.numpy().dtype == want.numpy().dtype
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="unsupported dtype torch.int32"):
        t.to(torch.int32)


@pytest.mark.parametrize("shape", [(4, 5, 6), (), (0, 3)])
def test_numel_and_numpys_array_protocol(shape):
    """``numel()`` is the product of the shape and ``np.asarray(t)`` / ``np.array(t, dtype)``
    give the tensor's numbers (``torch.Tensor.numel``, ``torch.Tensor.__array__``), not an object
    array of 0-d tensors; inside ``build`` both reading ways refuse the lazy tensor alike."""
    x = R.standard_normal(shape).astype(np.float32)
    t = mf.tensor(x)
    assert t.numel() == x.size
    got = np.asarray(t)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, x)
    assert np.array(t, dtype=np.float64).dtype == np.float64
    torch = pytest.importorskip("torch")
    assert t.numel() == torch.tensor(x).numel()


def test_numpys_array_protocol_refuses_a_lazy_tensor():
    class Read(mf.nn.Graph):
        def build(self, x):
            assert x.numel() == 6
            np.asarray(x)
            return x

    with pytest.raises(RuntimeError, match="cannot read the value of lazy tensor"):
        Read()(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("size,chunks", [(6, 3), (5, 3), (5, 4), (2, 5), (0, 2), (7, 1)])
def test_chunk_gives_pytorchs_pieces(size, chunks):
    """``torch.Tensor.chunk``'s sizes (its doc: "may return fewer than the specified number of
    chunks"), ``q, k, v = x.chunk(3, dim=-1)`` in attention code; missing before (an
    AttributeError)."""
    torch = pytest.importorskip("torch")
    x = R.standard_normal((2, size)).astype(np.float32)
    want = torch.tensor(x).chunk(chunks, dim=-1)
    got = mf.tensor(x).chunk(chunks, dim=-1)
    assert [tuple(p.shape) for p in got] == [tuple(p.shape) for p in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    with pytest.raises(ValueError, match="chunk: chunks must be a positive integer, got 0"):
        mf.tensor(x).chunk(0)


class _Divide(mf.nn.Graph):
    def build(self, x):
        return x / 3.0


def test_division_by_a_number_is_one_ieee_division_as_torch():
    """``x / 3.0`` is op ``scalar_div``: one IEEE division per element, as PyTorch divides (its
    ``div`` with a Python scalar: the scalar in the tensor's compute type, float32 for float32
    and float16). Multiplying by the rounded reciprocal, as miniflow did, is 1 ulp off for about
    a third of the float32 values here; NumPy's float32 division is the oracle, exhaustively
    over float16's finite values for float16 (rounded once from float32)."""
    x = R.uniform(-1e3, 1e3, 100_000).astype(np.float32)
    want = x / np.float32(3.0)
    assert np.mean(x * np.float32(1 / 3) != want) > 0.1        # the old way differs: a real test
    eager = mf.tensor(x) / 3.0
    graph = _Divide()
    traced = graph(mf.tensor(x))
    assert [n.op.name for n in graph.ir.nodes] == ["scalar_div"]
    for got in (eager, traced):
        np.testing.assert_array_equal(got.numpy(), want)
    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16)
    h = np.concatenate([h, -h])
    want16 = (h.astype(np.float32) / np.float32(3.0)).astype(np.float16)
    np.testing.assert_array_equal((mf.tensor(h) / 3.0).numpy(), want16)
    np.testing.assert_array_equal((mf.tensor(x) / 0.1).numpy(), x / np.float32(0.1))
    if torch is not None:
        np.testing.assert_array_equal(eager.numpy(), (torch.from_numpy(x) / 3.0).numpy())
        np.testing.assert_array_equal((mf.tensor(h) / 3.0).numpy(),
                                      (torch.from_numpy(h) / 3.0).numpy())


def test_var_and_std_of_half_tensors_round_once_and_bad_arguments_are_named():
    """A float16 var / std is computed in float32 and rounded once (PyTorch's); both spellings of
    the correction, or no degree of freedom left, are refused naming them."""
    x = (X[0] * 150.0).astype(np.float16)     # squares beyond float16's range (65504)
    want = x.astype(np.float64).var(axis=1, ddof=1)
    np.testing.assert_array_equal(mf.tensor(x).var(1).numpy(), want.astype(np.float16))
    np.testing.assert_array_equal(mf.tensor(x).std(1).numpy(), np.sqrt(want).astype(np.float16))
    t = mf.tensor(X)
    with pytest.raises(TypeError, match=r"var: got both unbiased=True and correction=0"):
        t.var(1, True, correction=0)
    with pytest.raises(ValueError, match=r"std: dims \[1\] of shape \[4, 1, 6\] hold 1 element "
                                         r"per result, and correction=1 leaves 0 degrees"):
        mf.tensor(X[:, :1]).std(1)
    assert mf.tensor(X[:0]).var(1).shape == (0, 6)       # nothing to compute: no error


class _SumStep(nn.Graph):
    """One SGD step of lr 1 on the sum of ``model``'s output: the weights move by minus their
    gradients."""

    def __init__(self, model):
        super().__init__()
        self.m = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=1.0))

    def build(self, x):
        out = self.m(x)
        out.sum().backward()
        return out


class _Std(nn.Module):
    def __init__(self, x):
        super().__init__()
        self.x = nn.Parameter(x)

    def forward(self, w):
        return self.x.std(1) * w + self.x.std(1, correction=0)


def test_std_of_a_constant_slice_has_a_zero_gradient_as_pytorchs():
    """``std`` of a constant row trained to NaN weights (the square root's gradient at 0,
    ``inf * 0``); PyTorch's std backward gives 0 there. The gradient is 0 on the constant row
    and ``(x - mean) / ((n - c) std)`` elsewhere (float64 oracle), the values unchanged."""
    x = np.stack([np.full(4, 0.7), X[0, 0, :4], X[1, 2, :4]])
    w = np.array([1.0, 2.0, -1.0])
    model = _Std(x.copy())
    out = _SumStep(model)(w).numpy()
    np.testing.assert_allclose(out, x.std(1, ddof=1) * w + x.std(1), rtol=1e-14)
    dev = x - x.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.nan_to_num(dev * (w / (3 * x.std(1, ddof=1)) + 1 / (4 * x.std(1)))[:, None])
    np.testing.assert_allclose(x - model.x.numpy(), want, rtol=1e-9, atol=1e-12)
    assert (x - model.x.numpy())[0].tolist() == [0.0] * 4


def test_pow_promotes_an_int64_operand_beside_a_float_as_pytorch():
    """``x ** torch.tensor(2)``, ``ids ** 0.5``, ``2.0 ** ids`` and ``ids ** x`` were a TypeError
    (op broadcast_pow / scalar_pow of an int64 input; ``2.0 ** ids`` made the base an int64
    constant) where ``*`` and ``/`` promote: the int64 operand takes the float one's dtype, or
    float32 beside a Python float, as PyTorch's, eagerly and inside ``build``; int64 ``**`` an
    int is still refused (no integer arithmetic)."""
    x = np.random.default_rng(7).uniform(0.5, 2.0, (3, 4))
    ids = np.arange(4)
    calls = [(lambda t, i: t ** mf.tensor(2), x ** 2), (lambda t, i: t ** i, x ** ids),
             (lambda t, i: i ** 0.5, np.sqrt(ids)), (lambda t, i: 2.0 ** i, 2.0 ** ids),
             (lambda t, i: i ** t, ids ** x), (lambda t, i: i.pow(1.5), ids ** 1.5)]
    for dtype in (mf.float32, mf.float64):
        for fn, want in calls:
            for got in (fn(mf.tensor(x, dtype=dtype), mf.tensor(ids)),
                        mf.compile(fn)(mf.tensor(x, dtype=dtype), ids)):
                assert got.dtype is (dtype if got.shape == x.shape else mf.float32)
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    with pytest.raises(TypeError, match="scalar_pow: input .* must be floating point"):
        mf.tensor(ids) ** 2


class _Powers(nn.Module):
    """``x ** e`` of parameters, a broadcast exponent, and RoPE's ``theta ** (i / d)``."""

    def __init__(self, x, e):
        super().__init__()
        self.x, self.e = nn.Parameter(x), nn.Parameter(e)

    def forward(self, i):
        return self.x ** self.e + self.x.pow(self.e[:1]) * (10000.0 ** i)


def test_tensor_powers_values_and_gradients_are_pytorchs():
    """A tensor exponent (``x ** t``, ``x.pow(t)``) and a number base (``2 ** t``) as torch's,
    eager and trained (one SGD step of lr 1 gives the gradients): 0 ** y and its exponent's
    gradient 0 there, a broadcast exponent's gradient summed."""
    torch = pytest.importorskip("torch")
    x = np.array([[0.5, 2.0, 0.0, 3.0], [1.5, 0.25, 4.0, 0.0]], np.float32)
    e = np.array([[2.0, -0.5, 1.5, 0.5]], np.float32)
    i = np.array([0.0, 0.25, 0.5, 0.75], np.float32)
    tx, te = (torch.tensor(v, requires_grad=True) for v in (x, e))
    want = tx ** te + tx.pow(te[:1]) * (10000.0 ** torch.tensor(i))
    want.sum().backward()
    model = _Powers(x, e)
    np.testing.assert_allclose(model(mf.tensor(i)).numpy(), want.detach().numpy(), rtol=2e-6)

    np.testing.assert_allclose(_SumStep(model)(i).numpy(), want.detach().numpy(), rtol=2e-6)
    finite = np.isfinite(tx.grad.numpy())              # 0 ** -0.5: an infinite gradient
    np.testing.assert_allclose((x - model.x.numpy())[finite], tx.grad.numpy()[finite],
                               rtol=2e-5)
    np.testing.assert_allclose(e - model.e.numpy(), te.grad.numpy(), rtol=2e-5)


EXPAND_ERRORS = [
    (lambda t: t.expand(1, 2), r"expand: the number of sizes provided \(2\) must be greater or "
                               r"equal to the number of dimensions in the tensor \(3\)"),
    (lambda t: t.expand(-1, 4, 5, 6), r"The expanded size of the tensor \(-1\) isn't allowed in "
                                      r"a leading, non-existing dimension 0"),
    (lambda t: t.expand(4, 3, 6), r"The expanded size of the tensor \(3\) must match the "
                                  r"existing size \(5\) at non-singleton dimension 1"),
    (lambda t: t.repeat(2, 2), r"repeat: Number of dimensions of repeat dims can not be smaller "
                               r"than number of dimensions of tensor"),
    (lambda t: t.repeat(1, -1, 1), r"Trying to create tensor with negative dimension")]


@pytest.mark.parametrize("call,match", EXPAND_ERRORS)
def test_expand_and_repeat_errors_are_pytorchs(call, match):
    with pytest.raises(ValueError, match=match):
        call(mf.tensor(X))


def test_expand_is_one_expand_node_without_a_full_size_input():
    """``Tensor.expand`` is OneFlow's ``expand`` op: one node reading x alone (its
    ``broadcast_like`` form also held a constant of the full expanded shape); an expand that
    changes nothing is no node."""
    class Expands(nn.Module):
        def forward(self, x):
            return x[:, :1].expand(3, 4, 2, 6) + x.expand(4, 5, 6)[:, :2]

    graph = EvalGraph(Expands())
    out = graph(X)
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(X[:, :1], (3, 4, 2, 6))
                                  + X[:, :2])
    ops = [n.op.name for n in graph.ir.nodes]
    assert ops.count("expand") == 1 and "constant" not in ops, ops


def test_an_int64_tensor_expands_as_pytorch():
    """``idx.unsqueeze(-1).expand(-1, -1, C)`` (an index made for a gather in PyTorch code):
    ``expand`` takes any dtype, as PyTorch's; eager and in a graph."""
    torch = pytest.importorskip("torch")
    idx = np.array([[2, 0], [1, 1], [3, 2], [0, 3]], np.int64)

    class Shifted(nn.Module):
        def forward(self, x):
            ids = mf.tensor(idx).unsqueeze(-1).expand(-1, -1, 6)
            assert ids.dtype == mf.int64 and ids.shape == (4, 2, 6)
            return x[:, :2] + ids.float()

    ids = torch.tensor(idx).unsqueeze(-1).expand(-1, -1, 6)
    want = (torch.tensor(X)[:, :2] + ids.float()).numpy()
    np.testing.assert_array_equal(Shifted()(mf.tensor(X)).numpy(), want)
    np.testing.assert_array_equal(EvalGraph(Shifted())(X).numpy(), want)


def test_argmax_argmin_and_min_of_int64_are_exact_eager_and_in_build():
    """``torch.tensor([3, 7, 7]).argmax()`` is 1: argmax of an int64 tensor was a TypeError
    (cast to float64 first, which rounds beyond 2**53), and argmin and min would have negated
    it, which wraps at -2**63. Exact against NumPy (the first of ties), flattened, keepdim,
    negative dims, eagerly and inside build; PyTorch's errors for empty ones."""
    big = 2 ** 62
    a = np.array([[3, -2 ** 63, big + 1, big, big + 1], [-5, -5, -7, -big, 2 ** 63 - 1]], np.int64)
    cases = [((), {}), ((), {"keepdim": True}), ((0,), {}), ((1,), {"keepdim": True}),
             ((-1,), {}), ((-2,), {"keepdim": True})]

    def want(fn, dim=None, keepdim=False):
        index = getattr(np, fn)(a if dim is not None else a.reshape(-1), axis=dim or 0)
        if keepdim:
            return np.expand_dims(index, dim) if dim is not None else index.reshape(1, 1)
        return index

    class Arg(nn.Graph):
        def build(self, t):
            return tuple(getattr(t, fn)(*args, **kw) for fn in ("argmax", "argmin")
                         for args, kw in cases) + (*t.min(1), *t.min(-2, keepdim=True), t.min())

    traced = Arg()(mf.tensor(a))
    for i, (fn, (args, kw)) in enumerate((fn, c) for fn in ("argmax", "argmin") for c in cases):
        expected = want(fn, *args, **kw)
        for got in (getattr(mf.tensor(a), fn)(*args, **kw), traced[i]):
            assert got.dtype is mf.int64 and got.shape == expected.shape, (fn, args, kw)
            np.testing.assert_array_equal(got.numpy(), expected)
    assert mf.tensor(np.array([3, 7, 7])).argmax().item() == 1
    eager = (*mf.tensor(a).min(1), *mf.tensor(a).min(-2, keepdim=True), mf.tensor(a).min())
    wants = (a.min(1), a.argmin(1), a.min(0, keepdims=True), a.argmin(0)[None], a.min())
    for got, expected in zip(eager + traced[-5:], wants + wants):
        assert got.dtype is mf.int64
        np.testing.assert_array_equal(got.numpy(), expected)
    assert mf.tensor(np.int64(5)).argmin(0).item() == 0 and mf.tensor(np.int64(5)).min(0)[0] == 5
    with pytest.raises(IndexError, match=r"argmin\(\): Expected reduction dim to be specified"):
        mf.tensor(np.zeros(0, np.int64)).argmin()
    with pytest.raises(IndexError, match=r"argmax\(\): Expected reduction dim 1 to have non-zero"):
        mf.tensor(np.zeros((2, 0), np.int64)).argmax(1)
    with pytest.raises(IndexError, match=r"argmin: Dimension out of range .*\[-2, 1\], but got 2"):
        mf.tensor(a).argmin(2)
    with pytest.raises(TypeError, match=r"min\(\): keepdim=True needs a dim"):
        mf.tensor(a).min(keepdim=True)


def test_argmin_and_clamp_as_pytorch():
    """argmin (the first minimum), clamp with min > max (every element max) and NaN; clamp
    without bounds is refused as PyTorch refuses it, a tensor bound named."""
    torch = pytest.importorskip("torch")
    x = X.copy()
    x[0, 0, :2] = x[0, 0].min() - 1.0           # a tie: the first index
    x[1, 1, 1] = np.nan
    t, ref = mf.tensor(x), torch.tensor(x)
    np.testing.assert_array_equal(t.argmin(2).numpy(), ref.argmin(2).numpy())
    np.testing.assert_array_equal(t.argmin().numpy(), ref.argmin().numpy())
    for lo, hi in ((0.5, -0.5), (-1.0, 1.0), (None, 0.0)):
        np.testing.assert_array_equal(t.clamp(lo, hi).numpy(), ref.clamp(lo, hi).numpy())
    with pytest.raises(ValueError, match="clamp: At least one of 'min' or 'max' must not be "
                                         "None"):
        t.clamp()
    with pytest.raises(TypeError, match="clamp: max must be a number, got Tensor"):
        t.clamp(0.0, t)


class _Clamp(nn.Module):
    def __init__(self, x, lo, hi):
        super().__init__()
        self.x, self.lo, self.hi = nn.Parameter(x), lo, hi

    def forward(self, w):
        return self.x.clamp(self.lo, self.hi) * w


@pytest.mark.parametrize("lo,hi", [(np.nan, None), (None, np.nan), (np.nan, 1.0), (-1.0, np.nan)])
def test_clamp_with_a_nan_bound_is_nan_as_pytorchs(lo, hi):
    """``clamp(min=nan)`` gave inf everywhere (and ``max=nan`` the other bound): a NaN bound
    makes every element NaN, as PyTorch's ``min(max(x, lo), hi)`` with NaN propagating
    (NumPy's minimum / maximum are the oracle), eagerly and inside ``build``, with a zero
    gradient (no element is inside the bounds)."""
    x = X[0].astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = np.minimum(np.maximum(x, -np.inf if lo is None else lo),
                          np.inf if hi is None else hi)
    assert np.isnan(want).all()
    np.testing.assert_array_equal(mf.tensor(x).clamp(lo, hi).numpy(), want)
    model = _Clamp(x.copy(), lo, hi)
    np.testing.assert_array_equal(_SumStep(model)(np.ones_like(x)).numpy(), want)
    np.testing.assert_array_equal(model.x.numpy(), x)


@pytest.mark.parametrize("value", [2.7, -2.7, 3.0, 0.0])
def test_python_number_conversions_of_one_element_as_pytorch(value):
    """``int(t)``, ``f"{loss:.4f}"``, ``t.tolist()`` and ``itos[t]`` (training and sampling loops
    print and index with tensors); before, ``int`` and ``__index__`` were missing (a TypeError)
    and a format spec raised object's TypeError, where PyTorch formats a 0-d tensor's number."""
    torch = pytest.importorskip("torch")
    t, want = mf.tensor(np.float32(value)), torch.tensor(np.float32(value))
    assert int(t) == int(want)
    assert f"{t:.4f}" == f"{want:.4f}" and f"{t}" == f"{want}" and f"{t:>12}" == f"{want:>12}"
    assert t.tolist() == want.tolist() and type(t.tolist()) is type(want.tolist())
    x = R.standard_normal((2, 3)).astype(np.float32)
    assert mf.tensor(x).tolist() == torch.tensor(x).tolist()
    ids = mf.tensor(np.arange(4))
    assert "abcd"[ids[2]] == "c" and list(range(ids[-1])) == [0, 1, 2]
    assert int(mf.tensor([5])) == 5 and [10, 11][mf.tensor([1])] == 11


def test_python_number_conversions_refuse_what_pytorch_refuses():
    with pytest.raises(TypeError, match="only integer tensors of a single element can be "
                                        r"converted to an index \(got float32\[\]\)"):
        [0][mf.tensor(0.0)]
    with pytest.raises(TypeError, match=r"got int64\[2\]"):
        [0][mf.tensor([0, 0])]
    with pytest.raises(ValueError, match="item\\(\\): the tensor has 2 elements"):
        int(mf.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{mf.tensor([1.0, 2.0]):.3f}"
    assert f"{mf.tensor([1.0, 2.0])}" == repr(mf.tensor([1.0, 2.0]))

    seen = {}

    class Read(mf.nn.Graph):
        def build(self, x):
            s = x.sum()
            seen["format"] = f"{s}"
            for read in (int, lambda v: v.tolist(), lambda v: [0][v], lambda v: f"{v:.2f}"):
                with pytest.raises((RuntimeError, TypeError)):
                    read(s)
            return s

    Read()(np.ones(3, np.float32))
    assert seen["format"].startswith("tensor(lazy %")


@pytest.mark.parametrize("sections", [[2, 4], (0, 6), [6], np.array([1, 5])])
def test_split_sections_give_pytorchs_pieces(sections):
    torch = pytest.importorskip("torch")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    want = torch.tensor(x).split([int(s) for s in sections], dim=1)
    got = mf.tensor(x).split(sections, dim=1)
    assert [g.shape for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


@pytest.mark.parametrize("arg,error,match", [
    ([7, -1], ValueError, r"split_sizes must be integers >= 0, got \[7, -1\]"),
    ([2, 2.5, 1.5], ValueError, r"split_sizes must be integers >= 0, got \[2, 2.5, 1.5\]"),
    (2.5, ValueError, "split_size must be a positive integer, got 2.5"),
    (True, ValueError, "split_size must be a positive integer, got True"),
    (0, ValueError, "split_size must be a positive integer, got 0"),
    ("ab", TypeError, "must be an int or a list of ints, got 'ab'"),
])
def test_split_refuses_what_pytorch_refuses(arg, error, match):
    """A negative section summing to the size gave a piece of the whole dimension and an empty
    one (``[7, -1]`` of 6), float sections were truncated (the sum error then named ``[2, 2,
    1]``), ``split(True)`` split by 1 and ``split(2.5)`` said "'float' object is not iterable";
    PyTorch refuses each."""
    x = mf.tensor(np.arange(6, dtype=np.float32))
    with pytest.raises(error, match=match):
        x.split(arg)


def test_a_torch_tensor_keeps_its_floating_dtype_as_torch_tensor_keeps_it():
    """``mf.tensor(t)`` and a graph input ``t`` of a torch tensor: float64 and float16 became
    float32 (the rule for Python floats), a bfloat16 tensor raised torch's "Got unsupported
    ScalarType BFloat16" and one that requires grad torch's "Can't call numpy() on Tensor that
    requires grad"; now the dtype is kept and the values read as ``load_state_dict`` reads
    them (integers: int64, miniflow's one integer dtype; bools: bool)."""
    torch = pytest.importorskip("torch")
    for dt, want in ((torch.float64, mf.float64), (torch.float16, mf.float16),
                     (torch.bfloat16, mf.bfloat16), (torch.int32, mf.int64),
                     (torch.bool, mf.bool)):
        t = torch.tensor([[1.5, 0.0], [2.0, -3.0]]).to(dt)
        got = mf.tensor(t)
        assert got.dtype is want and got.shape == (2, 2)
        np.testing.assert_array_equal(got.to(mf.float64).numpy(), t.double().numpy())
    grad = torch.ones(2, 3, requires_grad=True)
    assert mf.tensor(grad).dtype is mf.float32
    assert mf.tensor(torch.ones(2, dtype=torch.float64), dtype=mf.float32).dtype is mf.float32
    lin = mf.nn.Linear(3, 2)
    out = EvalGraph(lin)(grad)
    np.testing.assert_allclose(out.numpy(), lin(mf.tensor(np.ones((2, 3), np.float32))).numpy())
    with pytest.raises(TypeError, match=r"matmul: inputs have different dtypes: %x \(f64"):
        EvalGraph(lin)(torch.ones(2, 3, dtype=torch.float64))     # as a float64 NumPy array


def test_double_bfloat16_long_and_is_floating_point_as_pytorch():
    """``y.long()``, ``x.double()``, ``x.bfloat16()``, ``x.type_as(y)`` and
    ``x.is_floating_point()`` (missing before, an AttributeError), eager and traced: the
    values of PyTorch's conversions, an eager tensor itself when the dtype is already that
    one."""
    torch = pytest.importorskip("torch")
    x = np.array([-2.7, -0.5, 0.5, 2.7, 3.0e9], np.float32)
    t, want = mf.tensor(x), torch.tensor(x)

    class Convert(mf.nn.Graph):
        def build(self, v):
            return v.long(), v.double(), v.bfloat16()

    for got in (Convert()(t), (t.long(), t.double(), t.bfloat16())):
        for g, w in zip(got, (want.long(), want.double(), want.bfloat16())):
            assert g.dtype is mf.tensor(w).dtype
            np.testing.assert_array_equal(g.to(mf.float64).numpy(), w.double().numpy())
    assert t.float() is t and t.double().double() is not t and t.long().long().dtype is mf.int64
    assert t.is_floating_point() and not mf.tensor([1]).is_floating_point()
    assert t.double().type_as(t).dtype is mf.float32 and t.type_as(t) is t
    assert t.type_as(t.half()).dtype is mf.float16


def test_a_0d_tensor_takes_dim_0_or_minus_1_only_and_does_not_split():
    """``sum(1)`` of a 0-d tensor returned its value (the op drops a 0-d input's axes), and
    ``split`` / ``chunk`` of one said "tuple index out of range"; PyTorch's errors now."""
    torch = pytest.importorskip("torch")
    t, want = mf.tensor(np.float32(2.5)), torch.tensor(2.5)
    for dim in (0, -1, (0,), [-1]):
        assert t.sum(dim).numpy() == want.sum(dim).numpy() and t.sum(dim).shape == ()
        assert t.mean(dim, keepdim=True).shape == tuple(want.mean(dim, keepdim=True).shape)
    for bad in (1, -2, (0, 1)):
        with pytest.raises(IndexError, match="Dimension out of range"):
            t.sum(bad)
        with pytest.raises(IndexError):
            want.sum(bad)
    with pytest.raises(RuntimeError, match="split expects at least a 1-dimensional tensor"):
        t.split(1)
    with pytest.raises(RuntimeError, match="chunk expects at least a 1-dimensional tensor"):
        t.chunk(1)


def test_flatten_of_a_0d_tensor_takes_dims_0_and_minus_1_only():
    """``flatten(1)`` of a 0-d tensor gave ``[1]`` whatever the dims; PyTorch's IndexError now
    (a 0-d tensor takes 0 and -1), eagerly and inside ``build``; the dims it takes still give
    a 1-D tensor of its value."""
    t = mf.tensor(np.float32(2.5))
    for start, end in ((0, -1), (-1, 0), (0, 0)):
        assert t.flatten(start, end).tolist() == [2.5]
    for start, end in ((1, -1), (0, 1), (-2, 0)):
        with pytest.raises(IndexError, match=r"flatten: Dimension out of range .*\[-1, 0\]"):
            t.flatten(start, end)
        with pytest.raises(IndexError, match="flatten: Dimension out of range"):
            mf.compile(lambda x: x.flatten(start, end))(t)


TUPLE_KEYS = [np.s_[:, [-1], :], np.s_[..., [0, 3]], np.s_[0, :, [1, 2]], np.s_[[1, 0], 0],
              np.s_[None, :, [[0, 1], [2, 0]]], np.s_[1:, np.array([4, -5]), ::2],
              np.s_[..., [-1], None], np.s_[:, np.array(2)], np.s_[:, [], :], np.s_[2, [0], 3],
              np.s_[:, (0, 2)], np.s_[..., (-1,)]]   # a tuple in the tuple: a list (torch's)


@pytest.mark.parametrize("key", TUPLE_KEYS, ids=[str(k) for k in TUPLE_KEYS])
def test_one_list_or_array_index_in_a_tuple_as_pytorch_eager_and_traced(key):
    """nanoGPT's ``x[:, [-1], :]`` (the last position, its dimension kept) and the like were a
    TypeError ("an array, list or Tensor index works alone"); now op ``gather`` along that
    dimension, with PyTorch's rule where ints come first (``x[0, :, [1, 2]]`` is ``[5, 2]``
    here, NumPy's ``[2, 5]``)."""
    torch = pytest.importorskip("torch")
    want = torch.from_numpy(X)[key].numpy()
    for got in (mf.tensor(X)[key], _Index(key)(mf.tensor(X))):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_list_index_in_a_tuple_names_the_dimension_it_indexes():
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 1 with size 5"):
        mf.tensor(X)[:, [9]]
    with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 2 with size 6"):
        mf.tensor(X)[..., [6]]


def test_a_torch_tensor_index_reads_as_an_array():
    """Indices made with torch (``x[torch.tensor([2, -1])]``, ``x[:, idx]``) while porting:
    they were refused as "tensor index tensor([2, -1]) (Tensor): miniflow supports ...", a
    message that seemed to name a miniflow Tensor; they read as NumPy arrays now."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(X)
    for key in (torch.tensor([2, -1]), (slice(None), torch.tensor([0, 3])), torch.tensor(1),
                (..., torch.tensor([[5, 0]]))):
        want = t[key].numpy()
        for got in (mf.tensor(X)[key], _Index(key)(mf.tensor(X))):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got.numpy(), want)


def test_method_forms_of_the_operators_t_and_mt_as_pytorch():
    """``a.add(b, alpha=2)``, ``a.sub(b)``, ``a.mul(b)``, ``a.div(b)``, ``a.neg()``,
    ``a.matmul(b)``, ``w.t()`` and ``x.mT`` (older and newer PyTorch code: ``x @ w.t()``) were
    AttributeErrors; eager and traced against torch, and PyTorch's refusals."""
    torch = pytest.importorskip("torch")
    a, b = X[0], X[1] + 1.0                                    # [5, 6]

    def forms(x, y):
        return (x.add(y, alpha=2), x.sub(y, alpha=0.5), x.mul(y), x.div(y), x.neg(),
                x.matmul(y.t()), y.t(), x[0].t(), x.mT, x.add(3.0), x.mul(2))

    class Forms(mf.nn.Graph):
        def build(self, x, y):
            return forms(x, y)

    want = forms(torch.tensor(a), torch.tensor(b))
    for got in (forms(mf.tensor(a), mf.tensor(b)), Forms()(a, b)):
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="t\\(\\) expects a tensor with <= 2 dimensions, but "
                                           "self is 3D"):
        mf.tensor(X).t()
    with pytest.raises(RuntimeError, match="tensor.mT is only supported on matrices"):
        mf.tensor(a[0]).mT
    with pytest.raises(ValueError, match="rounding_mode='floor' is not supported"):
        mf.tensor(a).div(2.0, rounding_mode="floor")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unbind_as_pytorch_eager_and_traced(dim):
    """``q, k, v = qkv.unbind(0)`` (timm's attention) was an AttributeError."""
    torch = pytest.importorskip("torch")
    want = torch.from_numpy(X).unbind(dim)

    class Unbind(mf.nn.Graph):
        def build(self, x):
            return x.unbind(dim)

    for got in (mf.tensor(X).unbind(dim), Unbind()(mf.tensor(X))):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    with pytest.raises(IndexError, match="tensor has no dimensions"):
        mf.tensor(np.float32(1.0)).unbind()


def test_repr_lays_out_rows_as_pytorch_does():
    """A 2-D tensor printed its rows as NumPy's str does, without commas and with the second
    row one column in (``tensor([[1. 2.]\\n [3. 4.]], ...)``); rows are comma-separated and
    aligned under the first, as PyTorch prints them."""
    import miniflow as mf
    t = mf.tensor(np.array([[1.0, 2.0], [3.0, 4.5]], np.float32))
    assert repr(t) == ("tensor([[1. , 2. ],\n"
                       "        [3. , 4.5]], dtype=miniflow.float32)")
    assert repr(mf.tensor(np.array([1, 2]))) == "tensor([1, 2], dtype=miniflow.int64)"


def test_tolist_gives_python_numbers_as_pytorch_does():
    """``loss.tolist()``, ``logits.tolist()`` (PyTorch's) were an AttributeError."""
    import ml_dtypes
    assert mf.tensor(np.array([[1.5, 2.0]], np.float32)).tolist() == [[1.5, 2.0]]
    assert mf.tensor(np.float32(2.5)).tolist() == 2.5
    assert mf.tensor([1, 2]).tolist() == [1, 2]
    (v,) = mf.tensor(np.array([1.5], ml_dtypes.bfloat16)).tolist()
    assert type(v) is float and v == 1.5


@pytest.mark.parametrize("name", ["rsqrt", "clamp", "matmul"])
def test_a_torch_function_miniflow_has_as_a_method_is_named_so(name):
    """``torch.rsqrt(x)`` in LLaMA's RMSNorm, ported as ``miniflow.rsqrt(x)``, was "module
    'miniflow' has no attribute 'rsqrt'"; the AttributeError (``hasattr`` stays False) names
    the Tensor method to call. A name that is no method points to the list of what there is."""
    with pytest.raises(AttributeError, match=rf"no attribute '{name}': .*write x\.{name}\(\.\.\.\) "
                                             rf"for torch\.{name}\(x, \.\.\.\)"):
        getattr(mf, name)
    assert not hasattr(mf, name)
    with pytest.raises(AttributeError, match=r"^module 'miniflow' has no attribute 'nope': "
                                             r"docs/differences.md lists the PyTorch names"):
        mf.nope


class _MinMax(nn.Module):
    """``a.maximum(b) * w + a.min(b)`` of a parameter ``a`` and a broadcast parameter ``b``."""

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = nn.Parameter(a), nn.Parameter(b)

    def forward(self, w):
        return self.a.maximum(self.b) * w + self.a.min(self.b)


def test_maximum_and_minimum_values_and_gradients_are_pytorchs():
    """``torch.maximum`` / ``minimum`` and ``x.max(other)`` / ``x.min(other)``, eager and in a
    trained graph: NaN on either side propagates (and both sides get its gradient), a tie's
    gradient is split in halves, a broadcast side's gradient summed; one SGD step of lr 1 gives
    the gradients, against torch's autograd."""
    torch = pytest.importorskip("torch")
    a = np.array([[1.0, -2.0, 3.0, np.nan], [0.5, 2.0, -1.0, 4.0]], np.float32)
    b = np.array([1.0, 0.0, np.nan, 2.0], np.float32)                  # a tie in column 0
    w = np.array([[2.0, 3.0, 5.0, 7.0], [11.0, 13.0, 17.0, 19.0]], np.float32)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    want = ta.maximum(tb) * torch.tensor(w) + ta.min(tb)
    want.sum().backward()
    model = _MinMax(a, b)
    np.testing.assert_array_equal(model(mf.tensor(w)).numpy(), want.detach().numpy())
    np.testing.assert_array_equal(mf.tensor(a).max(b).numpy(),
                                  torch.tensor(a).maximum(torch.tensor(b)).numpy())

    np.testing.assert_array_equal(_SumStep(model)(w).numpy(), want.detach().numpy())
    for before, after, grad in ((a, model.a, ta.grad), (b, model.b, tb.grad)):
        known = ~np.isnan(before)                   # a NaN weight stays NaN: no gradient seen
        np.testing.assert_array_equal((before - after.numpy())[known], grad.numpy()[known])


def test_a_number_for_maximum_names_clamp():
    with pytest.raises(TypeError, match=r"maximum\(\): argument 'other' must be a Tensor, not "
                                        r"float: for a number write x.clamp\(min=0.5\)"):
        mf.tensor(X).maximum(0.5)
    with pytest.raises(TypeError, match=r"x.clamp\(max=1\)"):
        mf.tensor(X).minimum(1)


def test_maximum_and_minimum_promote_an_int64_tensor_beside_a_float():
    """``x.maximum(ids)`` / ``ids.minimum(x)`` of a float and an int64 tensor were a TypeError
    (op broadcast_maximum of an int64 input) where ``x * ids`` promotes: the int64 operand
    takes the float one's dtype, as PyTorch's, eagerly and inside ``build``; two int64 tensors
    are still refused."""
    x, ids = X[0].astype(np.float32), np.arange(X.shape[-1]) - 2
    calls = [(lambda t, i: t.maximum(i), np.maximum(x, ids)),
             (lambda t, i: i.minimum(t), np.minimum(x, ids)),
             (lambda t, i: t.max(i) + t.min(i), np.maximum(x, ids) + np.minimum(x, ids))]
    for fn, want in calls:
        for got in (fn(mf.tensor(x), mf.tensor(ids)), mf.compile(fn)(x, ids)):
            assert got.dtype is mf.float32
            np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
    with pytest.raises(TypeError, match="broadcast_maximum: input .* must be floating point"):
        mf.tensor(ids).maximum(mf.tensor(ids))


def test_masked_fill_of_a_value_beyond_the_dtype_is_refused_as_by_pytorch():
    """-1e9 into a float16 tensor was -inf without a word; PyTorch raises "value cannot be
    converted to type c10::Half without overflow" (its limit is the largest finite value);
    infinities, in-range values and bfloat16 (float32's range) fill."""
    mask = np.array([True, False])
    half = mf.tensor(np.zeros(2, np.float16))
    for value in (-1e9, 65505.0, 1e39):
        with pytest.raises(RuntimeError, match=r"masked_fill: value .* cannot be converted to "
                                               r"float16 without overflow \(its largest finite "
                                               r"value is 65504;"):
            half.masked_fill(mask, value)
    np.testing.assert_array_equal(half.masked_fill(mask, 65504.0).numpy(), [65504.0, 0.0])
    np.testing.assert_array_equal(half.masked_fill(mask, -np.inf).numpy(), [-np.inf, 0.0])
    bf16 = mf.tensor(np.zeros(2, np.float32)).to(mf.bfloat16).masked_fill(mask, -1e9)
    import ml_dtypes
    assert bf16.float().numpy()[0] == np.float32(ml_dtypes.bfloat16(-1e9))
    with pytest.raises(RuntimeError, match="to float32 without overflow"):
        mf.tensor(np.zeros(2, np.float32)).masked_fill(mask, -1e39)


def test_keepdim_with_an_elementwise_other_is_refused():
    """PyTorch has no ``max(other, keepdim)`` overload; miniflow ignored keepdim there."""
    for fn in ("max", "min"):
        with pytest.raises(TypeError, match=fn + r"\(\): keepdim applies to a reduction over "
                                            r"dim, not to the elementwise"):
            getattr(mf.tensor(X), fn)(mf.tensor(X), keepdim=True)
        np.testing.assert_array_equal(getattr(mf.tensor(X), fn)(X, keepdim=False).numpy(), X)


def test_tril_triu_eager_as_pytorch_and_their_errors():
    """nanoGPT's causal mask ``torch.tril(torch.ones(T, T)).view(1, 1, T, T)`` as a buffer
    compared with 0 in ``masked_fill``; ``tril`` / ``triu`` refuse what PyTorch refuses."""
    mask = mf.ones(4, 4).tril().view(1, 1, 4, 4)
    np.testing.assert_array_equal(mask.numpy()[0, 0], np.tri(4, dtype=np.float32))
    att = mf.tensor(np.zeros((1, 1, 3, 3), np.float32))
    filled = att.masked_fill(mask[:, :, :3, :3] == 0, float("-inf")).numpy()[0, 0]
    np.testing.assert_array_equal(np.isinf(filled), ~np.tri(3, dtype=bool))
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        mf.ones(3).tril()
    with pytest.raises(TypeError, match="argument 'diagonal' must be int, not float"):
        mf.ones(3, 3).triu(1.0)
    if torch is not None:
        x = _first((3, 4))
        for d in (-4, -1, 0, 2, 5):
            np.testing.assert_array_equal(mf.tensor(x).tril(d).numpy(),
                                          torch.tensor(x).tril(d).numpy())
            np.testing.assert_array_equal(mf.tensor(x).triu(d).numpy(),
                                          torch.tensor(x).triu(d).numpy())


# ------------------------------------------------------------------------------ x[key] = v
def _assigned(shape, key, value, dtype=np.float64):
    """NumPy's ``x[key] = value`` of ``_first(shape)``: the oracle of basic keys and masks."""
    want = _first(shape).astype(dtype)
    want[key] = value
    return want


def _distinct(shape):
    """Values none of X has (-1, -2, ...), in ``shape``."""
    return -1.0 - np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("key", KEYS, ids=[str(k) for k in KEYS])
def test_assignment_of_a_basic_key_matches_numpy_eager(key):
    """``x[key] = v`` wrote nothing: every assignment was a TypeError. Eager tensors are written
    in place with NumPy's result for basic keys (PyTorch's: the same rules): a tensor of the
    selection's shape, a number, a NumPy array with a leading size-1 dimension."""
    shape = X[key].shape
    for value in (mf.tensor(_distinct(shape)), -7.5, _distinct((1,) + shape)):
        x = mf.tensor(X)
        before = x._data
        x[key] = value
        assert x._data is before                           # in place: the same memory
        want = _assigned(X.shape, key, np.asarray(value, np.float64).reshape(shape)
                         if not isinstance(value, float) else value)
        np.testing.assert_array_equal(x.numpy(), want.astype(np.float32))


@pytest.mark.parametrize("key", TUPLE_KEYS + [np.array([3, -1]), [0, 0, 2]],
                         ids=[str(k) for k in TUPLE_KEYS] + ["array", "repeats"])
def test_assignment_of_an_array_index_writes_what_the_index_reads(key):
    """One array, list or tuple index (alone or in a tuple, PyTorch's rule where ints come
    first): the values land where ``x[key]`` reads them, in its order (of repeats the last),
    nothing else changes. Oracle: the positions ``x[key]`` reads off a tensor of flat ids."""
    ids = np.arange(X.size, dtype=np.float64).reshape(X.shape)
    picked = mf.tensor(ids)[key].numpy().astype(np.int64)
    value = _distinct(picked.shape)
    want = X.astype(np.float64).reshape(-1)
    want[picked.reshape(-1)] = value.reshape(-1)
    x = mf.tensor(X.astype(np.float64))
    x[key] = value
    np.testing.assert_array_equal(x.numpy(), want.reshape(X.shape))
    if torch is not None and len(set(picked.reshape(-1).tolist())) == picked.size:
        t = torch.from_numpy(X.astype(np.float64))
        t[key] = torch.from_numpy(value.astype(np.float64))
        np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_assignment_of_an_int64_tensor_index_and_a_mask_eager():
    """An int64 Tensor index (negative entries from the end, as PyTorch's), a bool mask of the
    leading dimensions (one value for every element, or a row of values per masked element),
    a list of bools."""
    x = mf.tensor(_first((4, 5)))
    x[mf.tensor(np.array([-1, 1]))] = mf.tensor(_distinct((2, 5)))
    np.testing.assert_array_equal(x.numpy(), _assigned((4, 5), [3, 1], _distinct((2, 5)),
                                                       np.float32))
    mask = np.array([True, False, True, False])
    for value in (2.5, _distinct((5,)), _distinct((2, 5)), _distinct((2, 1))):
        x = mf.tensor(_first((4, 5)))
        x[mask] = value
        np.testing.assert_array_equal(x.numpy(), _assigned((4, 5), mask, value, np.float32))
    x = mf.tensor(_first((4, 5)))
    x[[True, False, False, True]] = 0.0
    np.testing.assert_array_equal(x.numpy(), _assigned((4, 5), [0, 3], 0.0, np.float32))
    elementwise = _first((4, 5)) < 0
    x = mf.tensor(_first((4, 5)))
    x[elementwise] = _distinct((int(elementwise.sum()),))
    np.testing.assert_array_equal(
        x.numpy(), _assigned((4, 5), elementwise, _distinct((int(elementwise.sum()),)),
                             np.float32))


def test_the_pytorch_programs_that_assign_run_as_torch():
    """The transformer tutorial's positional encoding (``pe[:, 0, 0::2] = torch.sin(position *
    div_term)``, at module construction, into a buffer), nanoGPT's ``generate``
    (``logits[logits < v[:, [-1]]] = -float('Inf')``) and its ``estimate_loss``
    (``losses[k] = loss.item()``), against NumPy float64 and torch."""
    d, n = 6, 5
    position = mf.arange(n).unsqueeze(1)
    div_term = (mf.arange(0, d, 2) * (-np.log(10000.0) / d)).exp()
    pe = mf.zeros(n, 1, d)
    pe[:, 0, 0::2] = (position * div_term).sin()
    pe[:, 0, 1::2] = (position * div_term).cos()
    angle = np.arange(n)[:, None] * np.exp(np.arange(0, d, 2) * (-np.log(10000.0) / d))
    want = np.zeros((n, 1, d))
    want[:, 0, 0::2], want[:, 0, 1::2] = np.sin(angle), np.cos(angle)
    np.testing.assert_allclose(pe.numpy(), want, rtol=1e-6, atol=1e-6)
    logits = mf.tensor(_first((2, 6)))
    v, _ = logits.topk(3)
    logits[logits < v[:, [-1]]] = -float("inf")
    kept = _first((2, 6)) >= np.sort(_first((2, 6)), 1)[:, -3:-2]
    np.testing.assert_array_equal(logits.numpy(), np.where(kept, _first((2, 6)), -np.inf))
    losses = mf.zeros(3)
    for k in range(3):
        losses[k] = mf.tensor(np.float32(k + 0.5)).item()
    np.testing.assert_array_equal(losses.numpy(), [0.5, 1.5, 2.5])
    if torch is not None:
        tp = torch.zeros(n, 1, d)
        tpos = torch.arange(n).unsqueeze(1)
        tdiv = torch.exp(torch.arange(0, d, 2) * (-np.log(10000.0) / d))
        tp[:, 0, 0::2] = torch.sin(tpos * tdiv)
        tp[:, 0, 1::2] = torch.cos(tpos * tdiv)
        np.testing.assert_allclose(pe.numpy(), tp.numpy(), rtol=1e-6, atol=1e-6)


def test_assignment_into_an_eager_tensor_made_outside_build_is_refused_there():
    """A new user wrote a graph value into a global eager tensor inside build: the call
    succeeded and the tensor was destroyed (it became the trace's lazy tensor); a constant was
    written once, at trace time, where PyTorch writes at every call. Both are refused, naming
    what to do; a tensor made inside build takes assignments as before."""
    outside = mf.tensor(np.zeros(3, np.float32))

    class Writes(nn.Graph):
        def __init__(self, value):
            super().__init__()
            self.value = value

        def build(self, x):
            outside[0] = x.sum() if self.value is None else self.value
            return x * 1.0

    for value in (None, 5.0):
        with pytest.raises(RuntimeError, match=r"into an eager tensor \[3\] made outside it: the "
                                               r"write would happen once, while tracing"):
            Writes(value)(np.ones(3, np.float32))

    class WritesADetached(nn.Graph):              # shares outside's data: made outside too
        def build(self, x):
            alias = outside.detach()
            alias[0] = 5.0
            return x * 1.0

    with pytest.raises(RuntimeError, match=r"made outside it"):
        WritesADetached()(np.ones(3, np.float32))
    np.testing.assert_array_equal(outside.numpy(), [0.0, 0.0, 0.0])

    class Local(nn.Graph):
        def build(self, x):
            m = mf.ones(3)
            m[0] = x.sum()
            m[1] = 5.0
            return x * m

    np.testing.assert_array_equal(Local()(np.ones(3, np.float32)).numpy(), [3.0, 5.0, 1.0])


def test_a_1d_bool_mask_beside_slices_selects_and_assigns_as_pytorch():
    """``x[:, mask] = v`` and ``x[:, mask]`` with a 1-d NumPy bool mask (known when the key is
    read: its True positions) were refused; they select and write as PyTorch's, eagerly and in
    a graph; a mask of the wrong length is PyTorch's IndexError."""
    m = np.array([True, False, True])
    x = mf.tensor(np.zeros((2, 3), np.float32))
    x[:, m] = 1.0
    np.testing.assert_array_equal(x.numpy(), [[1, 0, 1], [1, 0, 1]])
    y = mf.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(y[:, m].numpy(), [[0, 2], [3, 5]])
    np.testing.assert_array_equal(y[..., m].numpy(), [[0, 2], [3, 5]])

    class Masked(nn.Graph):
        def build(self, x):
            out = x * 1.0
            out[:, m] = 7.0
            return out

    np.testing.assert_array_equal(Masked()(np.zeros((2, 3), np.float32)).numpy(),
                                  [[7, 0, 7], [7, 0, 7]])
    with pytest.raises(IndexError, match=r"The shape of the mask \[2\] at index 1 does not match"):
        y[:, np.array([True, False])]


def test_a_number_that_does_not_fit_the_dtype_is_refused_as_by_pytorch():
    """``y[0] = float('nan')`` into int64 wrote -9223372036854775808 (NumPy's invalid cast) and
    1e39 into float32 inf; PyTorch raises "value cannot be converted to type ... without
    overflow" for both; a float16 tensor takes inf (PyTorch's assignment does), a float into
    int64 truncates."""
    for dt, value in ((np.int64, float("nan")), (np.int64, float("inf")), (np.int64, 2.0 ** 63),
                      (np.float32, 1e39)):
        y = mf.tensor(np.zeros(2, dt))
        with pytest.raises(RuntimeError, match="value cannot be converted to type .* without "
                                               "overflow"):
            y[0] = value
        np.testing.assert_array_equal(y.numpy(), [0, 0])
    half, whole = mf.tensor(np.zeros(2, np.float16)), mf.tensor(np.zeros(2, np.int64))
    half[0], whole[0] = 1e6, 2.7
    assert half.numpy()[0] == np.inf and whole.numpy()[0] == 2


def test_assignment_casts_to_the_tensors_dtype_as_pytorch():
    """A float into an int64 tensor truncates, a float64 array into float32 rounds, an int64
    tensor into float32 converts, a value that overlaps the target is read first."""
    ids = mf.zeros(3, dtype=mf.int64)
    ids[0], ids[1] = 2.7, -2.7
    assert ids.tolist() == [2, -2, 0] and ids.dtype is mf.int64
    x = mf.zeros(3)
    x[:] = np.array([0.1, 1e40, 2.0])
    np.testing.assert_array_equal(x.numpy(), np.array([0.1, np.inf, 2.0], np.float32))
    x[1:] = mf.arange(2)
    np.testing.assert_array_equal(x.numpy(), np.array([0.1, 0.0, 1.0], np.float32))
    y = mf.tensor(np.arange(5.0))
    y[1:] = y[:-1]
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 1.0, 2.0, 3.0])
    if torch is not None:
        t = torch.zeros(3, dtype=torch.int64)
        t[0], t[1] = 2.7, -2.7
        assert t.tolist() == ids.tolist()


def test_a_parameter_is_assigned_only_under_no_grad_and_a_graph_reads_it():
    """PyTorch refuses an in-place write into a leaf that requires grad, outside ``no_grad``;
    under it the values change in the parameter's memory, which a compiled graph reads at its
    next call; a buffer takes an assignment as any eager tensor."""
    mf.manual_seed(0)
    lin = nn.Linear(3, 2)
    graph = EvalGraph(lin)
    x = np.ones((1, 3), np.float32)
    first = graph(x).numpy()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used "
                                           "in an in-place operation"):
        lin.weight[0] = 0.0
    version = lin.weight.version
    with mf.no_grad():
        lin.weight[0] = 0.0
    assert lin.weight.version == version + 1       # its half copies are stale
    np.testing.assert_array_equal(lin.weight.numpy()[0], 0.0)
    got = graph(x).numpy()
    np.testing.assert_array_equal(got[0, 0], lin.bias.numpy()[0])
    assert got[0, 1] == first[0, 1]
    if torch is not None:
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
            torch.nn.Linear(3, 2).weight[0] = 0.0


@pytest.mark.parametrize("key,value,error,match", [
    (np.s_[0], mf.ones(3), RuntimeError,
     r"shape mismatch: value tensor of shape \[3\] cannot be broadcast to indexing result of "
     r"shape \[5\]"),
    (np.s_[:2], np.ones((2, 2, 5)), RuntimeError, r"value tensor of shape \[2, 2, 5\]"),
    (np.s_[0], [1.0] * 5, TypeError, r"can't assign a list to a Tensor.*miniflow.tensor"),
    (np.s_[0], "a", TypeError, r"can't assign a str"),
    (np.s_[::-1], 0.0, ValueError, r"step must be greater than zero"),
    (np.s_[4], 0.0, IndexError, r"index 4 is out of bounds for dimension 0 with size 4"),
    (np.s_[0, 0, 0], 0.0, IndexError, r"too many indices for tensor of dimension 2"),
    (np.array([True, False]), 0.0, IndexError,
     r"The shape of the mask \[2\] at index 0 does not match the shape of the indexed tensor "
     r"\[4, 5\] at index 0"),
    (np.ones((4, 5, 1), bool), 0.0, IndexError, r"too many indices for tensor of dimension 2"),
    ([7], 0.0, IndexError, r"index 7 is out of bounds for dimension 0 with size 4"),
    ((np.s_[:, [9]]), 0.0, IndexError, r"index 9 is out of bounds for dimension 1 with size 5"),
    (np.array([True, False, True, False]), np.ones((3, 5)), RuntimeError,
     r"value tensor of shape \[3, 5\] cannot be broadcast to indexing result of shape "
     r"\[2, 5\]"),
], ids=["shape", "leading_not_1", "list", "str", "negative_step", "index", "too_many", "mask",
        "mask_rank", "list_index", "tuple_index", "mask_value"])
def test_assignment_errors_are_pytorchs(key, value, error, match):
    x = mf.tensor(_first((4, 5)))
    with pytest.raises(error, match=match):
        x[key] = value
    np.testing.assert_array_equal(x.numpy(), _first((4, 5)))     # nothing written
    if torch is not None and error is not TypeError and not isinstance(value, np.ndarray):
        t = torch.from_numpy(_first((4, 5)))
        tkey = torch.from_numpy(key) if isinstance(key, np.ndarray) else key
        tvalue = torch.from_numpy(value.numpy()) if isinstance(value, mf.Tensor) else value
        with pytest.raises((error, RuntimeError)):
            t[tkey] = tvalue


class _Assign(nn.Graph):
    """``y = x * 1; before = y[0]; y[key] = value; return y, before, y * 2`` (the later use)."""

    def __init__(self, key):
        super().__init__()
        self.key = key

    def build(self, x, value):
        y = x * 1.0
        before = y[0]
        y[self.key] = value
        return y, before, y * 2.0


@pytest.mark.parametrize("key", KEYS, ids=[str(k) for k in KEYS])
def test_assignment_of_a_basic_key_in_a_graph_records_slice_update(key):
    """Inside ``build`` ``y[key] = v`` records op ``slice_update`` (OneFlow's) and ``y`` stands
    for its result: a later use sees the assignment, a tensor taken before does not (values,
    not views). The value is broadcast (a leading size-1 dimension dropped) and cast."""
    shape = X[key].shape
    want = _assigned(X.shape, key, _distinct(shape)).astype(np.float32)
    graph = _Assign(key)
    y, before, later = graph(X, mf.tensor(_distinct((1,) + shape).astype(np.float64)))
    np.testing.assert_array_equal(y.numpy(), want)
    np.testing.assert_array_equal(before.numpy(), X[0])
    np.testing.assert_array_equal(later.numpy(), want * 2)
    ops = [n.op.name for n in graph.ir.nodes]
    assert ("slice_update" in ops) == bool(X[key].size)      # an empty slice writes nothing


class _MaskAssign(nn.Graph):
    def __init__(self, mask, number=None):
        super().__init__()
        self.mask, self.number = mask, number

    def build(self, x, value):
        x[self.mask] = value if self.number is None else self.number
        return x


def test_a_mask_in_a_graph_is_masked_fill_of_a_number_or_one_row_of_values():
    """A bool mask (a NumPy array, known at trace time): a number is ``masked_fill``; a tensor
    of one value per element of a masked row (its shape broadcasts to the row's) is selected
    with ``masked_fill`` s, every other element kept bit for bit (NaN, inf, -0.0)."""
    x = _first((4, 5))
    x[1] = [np.nan, np.inf, -0.0, -np.inf, 0.0]
    mask = np.array([False, True, True, False])
    got = _MaskAssign(mask, number=-np.inf)(x, mf.tensor(np.float32(0))).numpy()
    np.testing.assert_array_equal(got, _assigned((4, 5), mask, -np.inf, np.float32))
    keep = np.array([True, False, False, True])
    for value in (_distinct((5,)), _distinct((1, 5)), _distinct((5,))[:1], np.float32(3.0)):
        got = _MaskAssign(keep)(x, mf.tensor(value)).numpy()
        want = x.copy()
        want[keep] = value
        assert got.tobytes() == want.tobytes()
    if torch is not None:
        t = torch.from_numpy(x.copy())
        t[torch.from_numpy(keep)] = torch.from_numpy(_distinct((5,)))
        got = _MaskAssign(keep)(x, mf.tensor(_distinct((5,)))).numpy()
        assert got.tobytes() == t.numpy().tobytes()


ARRAY_KEYS = [[0, 2], np.array([3, -1]), [0, 0, 2], np.s_[:, [1, 3]], np.s_[..., [0]],
              np.s_[:, np.array([[0, 1], [2, 0]])], np.s_[:, :, (5, 0)], np.s_[[], ...]]


@pytest.mark.parametrize("key", ARRAY_KEYS, ids=[str(k) for k in ARRAY_KEYS])
def test_an_array_index_in_a_graph_writes_as_the_eager_assignment(key):
    """One array, list or tuple index known at trace time, alone or with ``:`` and ``...``
    (``x[[0, 2]] = v``, ``x[:, idx] = v``): the rows it names, of repeats the last, taken from
    the value by op ``gather`` and selected; oracle: the eager assignment (itself against the
    positions ``x[key]`` reads and torch)."""
    picked_shape = mf.tensor(X)[key].shape
    for value in (-3.0, _distinct(picked_shape), _distinct(picked_shape[-1:])):
        want = mf.tensor(X)
        want[key] = value
        graph = _Assign(key)
        got, before, _ = graph(X, mf.tensor(np.asarray(value, np.float32)))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(before.numpy(), X[0])


def test_a_mask_in_a_graph_takes_a_row_per_masked_element():
    """``x[mask] = rows`` with a row per masked element (``[count, ...]``, PyTorch's
    ``index_put``): the rows in order, by op ``gather``; against NumPy and the eager form."""
    mask = _first((4, 5)) > 0
    rows = _distinct((int(mask.sum()),))
    got = _MaskAssign(mask)(_first((4, 5)), mf.tensor(rows)).numpy()
    np.testing.assert_array_equal(got, _assigned((4, 5), mask, rows, np.float32))
    rowmask = np.array([True, False, True, True])
    rows = _distinct((3, 5))
    got = _MaskAssign(rowmask)(_first((4, 5)), mf.tensor(rows)).numpy()
    np.testing.assert_array_equal(got, _assigned((4, 5), rowmask, rows, np.float32))


class _Train(nn.Graph):
    """``y = a * 1; y[key] = b; loss = sum(y * w)``, one SGD step (lr 1): the step is the
    gradient. AMP optional."""

    def __init__(self, key, b_shape, w, amp=False):
        super().__init__()
        self.m = nn.Module()
        self.m.a = nn.Parameter(_first(w.shape))
        self.m.b = nn.Parameter(_distinct(b_shape) / 64)
        self.key, self.w = key, w
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))
        if amp:
            self.config.enable_amp(True)

    def build(self):
        y = self.m.a * 1.0
        y[self.key] = self.m.b
        loss = (y * mf.tensor(self.w.astype(np.float32))).sum()
        loss.backward()
        return y, loss


TRAIN_CASES = [(np.s_[:, 1:3], (4, 2, 6)), (np.s_[1, ::2, -1], (3,)),
               (np.s_[..., 2], (1, 5)), (np.s_[None, 2:], (1, 1, 5, 6)),
               (np.array([True, False, True, True]), (5, 1)),
               (np.array([True, False, True, True]), (6,)),
               (np.array([True, False, True, True]), (3, 5, 6)),
               (np.s_[:, [4, 0]], (4, 2, 6)), ([3, 1], (6,)), (np.s_[..., [-1]], (5, 1))]


@pytest.mark.parametrize("key,b_shape", TRAIN_CASES, ids=[str(k) for k, _ in TRAIN_CASES])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_the_gradient_of_an_assignment_in_a_graph(key, b_shape, amp):
    """The assigned tensor gets the output's gradient with the slice zeroed, the value the
    slice's summed back to its shape (a broadcast value sums over what it was broadcast to).
    Oracle: NumPy float64; torch when installed. Under AMP ``slice_update`` is unlisted (as in
    OneFlow) and runs in float32."""
    w = R.standard_normal((4, 5, 6))
    graph = _Train(key, b_shape, w, amp)
    y, loss = graph()
    a, b = _first(w.shape), _distinct(b_shape) / 64
    want_y = a.astype(np.float64)
    sel = want_y[key].shape
    fitted = b.reshape(b.shape[b.ndim - len(sel):]) if b.ndim > len(sel) else b
    want_y[key] = fitted
    grad_a = w.copy()
    grad_a[key] = 0.0
    lead = len(sel) - fitted.ndim        # the value's gradient: w[key] summed to its shape
    grad_b = w[key].sum(axis=tuple(range(lead)))
    grad_b = grad_b.sum(axis=tuple(i for i, n in enumerate(fitted.shape) if n == 1),
                        keepdims=True).reshape(b.shape)
    tol = dict(rtol=2e-3, atol=2e-3) if amp else dict(rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(y.numpy(), want_y, **tol)
    np.testing.assert_allclose(loss.numpy(), (want_y * w).sum(), **tol)
    np.testing.assert_allclose(a - graph.m.a.numpy(), grad_a, **tol)
    np.testing.assert_allclose(b - graph.m.b.numpy(), grad_b, **tol)
    if amp:
        updates = {(r.dtype, r.color) for r in graph.amp_report().rows if r.op == "slice_update"}
        basic = isinstance(key, tuple) and not any(isinstance(k, list) for k in key)
        assert updates == ({("f32", "unlisted")} if basic else set())
    if torch is not None:
        ta = torch.tensor(a, dtype=torch.float64, requires_grad=True)
        tb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
        ty = ta * 1.0
        ty[torch.from_numpy(key) if isinstance(key, np.ndarray) else key] = tb
        (ty * torch.from_numpy(w)).sum().backward()
        np.testing.assert_allclose(a - graph.m.a.numpy(), ta.grad.numpy(), **tol)
        np.testing.assert_allclose(b - graph.m.b.numpy(), tb.grad.numpy(), **tol)


class _Build(nn.Graph):
    """``build`` is ``fn(self, *inputs)``."""

    def __init__(self, fn, model=None):
        super().__init__()
        self.fn, self.model = fn, model

    def build(self, *inputs):
        return self.fn(self, *inputs)


def test_assignment_in_a_graph_into_int64_and_into_a_constant():
    """An int64 tensor takes ``slice_update`` too (token ids); an eager tensor made inside
    ``build`` (a constant of the graph) assigned a computed value stands for the result."""
    def ids(g, t):
        t[:, 0] = 7
        return t

    got = _Build(ids)(np.arange(6).reshape(2, 3)).numpy()
    np.testing.assert_array_equal(got, [[7, 1, 2], [7, 4, 5]])
    assert got.dtype == np.int64

    def into_zeros(g, x):
        z = mf.zeros(3, 4)
        z[1:, ::3] = x.exp()
        return z

    want = np.zeros((3, 4), np.float32)
    want[1:, ::3] = np.exp(_first((2, 2)))
    np.testing.assert_allclose(_Build(into_zeros)(_first((2, 2))).numpy(), want, rtol=1e-6)


def test_an_eager_tensor_in_a_graph_takes_an_eager_value_in_place():
    """A tensor made eagerly inside ``build`` (a constant: ``m = ones(T, T)``) assigned a number
    is written at once, so ``m == 0`` still reads it at trace time (a mask for ``masked_fill``);
    what was recorded before the write, a slice of it too, keeps the old values."""
    def fn(g, x):
        m = mf.ones(4, 4)
        before, rows = x * m, m[:2]
        m[0, 1:] = 0.0
        return x.masked_fill(m == 0, -1.0), x * m, before, x[:2].masked_fill(rows == 0, -1.0)

    x = _first((4, 4))
    masked, times, before, old_mask = _Build(fn)(x)
    want = np.ones((4, 4), np.float32)
    want[0, 1:] = 0.0
    np.testing.assert_array_equal(masked.numpy(), np.where(want == 0, -1.0, x))
    np.testing.assert_array_equal(times.numpy(), x * want)
    np.testing.assert_array_equal(before.numpy(), x)
    np.testing.assert_array_equal(old_mask.numpy(), x[:2])


def _into_weight(g, x):
    g.model.weight[0] = x
    return x


def _into_buffer(g, x):
    g.model.running_mean[0] = x.sum()
    return x


def _array_and_int(g, x):
    x[0, [0, 2]] = 1.0
    return x


def _computed_index(g, x):
    x[x.argmax(1)] = 1.0
    return x


@pytest.mark.parametrize("fn,model,match", [
    (_into_weight, nn.Linear(4, 2),
     r"into the graph's variable 'model.weight': the graph reads a parameter or buffer from "
     r"its module's memory.*y = x.clone\(\); y\[key\] = value"),
    (_into_buffer, nn.BatchNorm1d(4), r"into the graph's variable 'model.running_mean'"),
    (_array_and_int, None, r"an array, list or Tensor index \(\(0, \[0, 2\]\)\) has an op "
                           r"there only alone or with ':' and '...' and known at trace time"),
    (_computed_index, None, r"has an op there only .* known at trace time"),
], ids=["parameter", "buffer", "array_and_int", "computed_index"])
def test_what_a_graph_cannot_assign_is_refused_at_trace_time(fn, model, match):
    with pytest.raises((RuntimeError, TypeError), match=match):
        _Build(fn, model)(_first((4, 4)))


def test_a_lazy_tensor_kept_from_a_build_cannot_be_assigned():
    kept = []

    def keep(g, x):
        kept.append(x * 1.0)
        return x

    _Build(keep)(_first((2, 2)))
    with pytest.raises(RuntimeError, match="was kept from an nn.Graph.build"):
        kept[0][0] = 1.0
    with pytest.raises(RuntimeError, match="was kept from an nn.Graph.build"):
        mf.zeros(2, 2)[:] = kept[0]


def test_eq_and_view_as_count_right_answers_as_the_mnist_example():
    """The PyTorch MNIST example's test loop, ``pred = output.argmax(dim=1, keepdim=True)``,
    ``correct += pred.eq(target.view_as(pred)).sum().item()``: ``eq`` ... (and ``==`` ...)
    compare values into an eager bool tensor; ``view_as`` is ``view`` to the other's shape."""
    x = _first((6, 4))
    target = np.array([0, 1, 2, 3, 0, 1])
    out, tgt = mf.tensor(x), mf.tensor(target)
    pred = out.argmax(dim=1, keepdim=True)
    assert tgt.view_as(pred).shape == (6, 1)
    correct = pred.eq(tgt.view_as(pred)).sum().item()
    assert correct == int((x.argmax(1) == target).sum())
    a, b = mf.tensor(x), mf.tensor(x[::-1].copy())
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        got = getattr(a, name)(b)
        assert got.dtype is mf.bool
        if torch is not None:
            want = getattr(torch.tensor(x), name)(torch.tensor(x[::-1].copy())).numpy()
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(getattr(a, name)(0.1),
                                          getattr(torch.tensor(x), name)(0.1).numpy())
    assert not (a == b).all() and a.eq(a).all() and (a == a).all()
    with pytest.raises(ValueError):
        tgt.view_as(out)


@pytest.mark.parametrize("dim,largest", [(-1, True), (0, True), (1, False), (-1, False)])
def test_topk_as_pytorch_on_eager_tensors(dim, largest):
    """nanoGPT's ``generate``: ``v, _ = torch.topk(logits, min(top_k, logits.size(-1)))`` then
    ``logits < v[:, [-1]]``: values and indices as PyTorch's, sorted, NaN the largest."""
    x = _first((4, 5, 6)).copy()
    x[1, 2, 3] = np.nan      # (no ties: PyTorch does not say how it orders them)
    got = mf.tensor(x).topk(3, dim=dim, largest=largest)
    assert got.indices.dtype == mf.int64 and got.values.shape == got.indices.shape
    if torch is not None:
        want = torch.tensor(x).topk(3, dim=dim, largest=largest)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


@pytest.mark.parametrize("dtype", [mf.bfloat16, mf.float16])
def test_topk_and_sort_of_eager_half_tensors_as_float64(dtype):
    """Eager ``topk`` / ``sort`` of a bfloat16 tensor was a NumPy TypeError ('invert' not
    supported: ml_dtypes' bfloat16 is not of NumPy's float kind, so the reference took it for
    an integer): both half types sort as their float64 values do, NaN the largest."""
    x = np.array([[0.5, -2.0, np.nan, 3.0, -np.inf], [1.0, 0.25, -0.0, 7.0, 2.0]], np.float32)
    t = mf.tensor(x, dtype=dtype)
    exact = x.astype(np.float64)                   # these values are exact in both half types
    order = np.argsort(np.where(np.isnan(exact), -np.inf, -exact), axis=1, kind="stable")
    top = t.topk(3)
    assert top.values.dtype is dtype
    np.testing.assert_array_equal(top.indices.numpy(), order[:, :3])
    ascending = t.sort(1)
    np.testing.assert_array_equal(ascending.values.numpy().astype(np.float64),
                                  np.sort(exact, 1))
    np.testing.assert_array_equal(t.sort(0, descending=True).indices.numpy(),
                                  np.argsort(-np.nan_to_num(exact, nan=np.inf), 0,
                                             kind="stable"))


class _Topk(nn.Module):
    """A weighted sum of ``topk`` values along ``dim`` of a parameter, plus the indices."""

    def __init__(self, x, dim, largest):
        super().__init__()
        self.x, self.dim, self.largest = nn.Parameter(x), dim, largest

    def forward(self, w):
        values, indices = self.x.topk(3, dim=self.dim, largest=self.largest)
        return values * w + indices.float()


@pytest.mark.parametrize("dim,largest", [(-1, True), (0, True), (1, False)])
def test_topk_inside_build_trains_and_equals_eager(dim, largest):
    """``topk`` inside ``build`` (op ``top_k`` and a ``dim_gather`` of the values): values and
    indices equal the eager ones (the NumPy reference), NaN first when largest; one SGD step of
    lr 1 moves the picked elements by their weights (the gradient of a gather: the weight at
    each picked place, 0 elsewhere)."""
    x = _first((4, 5, 6)).copy()
    x[1, 2, 3] = np.nan
    eager = mf.tensor(x).topk(3, dim=dim, largest=largest)
    shape = eager.values.shape
    w = np.arange(1, np.prod(shape) + 1, dtype=np.float32).reshape(shape)
    model = _Topk(x, dim, largest)
    out = _SumStep(model)(w).numpy()
    np.testing.assert_allclose(out, eager.values.numpy() * w + eager.indices.numpy(), rtol=1e-6)
    grad = np.zeros_like(x)
    np.put_along_axis(grad, eager.indices.numpy(), w, axis=dim)
    known = ~np.isnan(x)              # (x - (x - g) rounds: g to float32's epsilon of x)
    np.testing.assert_allclose((x - model.x.numpy())[known], grad[known], rtol=1e-6, atol=1e-6)


def test_topk_and_sort_of_int64_inside_build_equal_eager():
    """``topk`` and ``sort`` of an int64 tensor inside build raised (op top_k took floating
    tensors); they equal the eager results (NumPy), exact beyond 2**53, ties in index order."""
    ids = np.array([[5, -2 ** 62, 2 ** 62 + 1, 2 ** 62, 5], [0, 3, 3, -1, 2]], np.int64)
    calls = (lambda x: x.topk(3), lambda x: x.topk(2, dim=0, largest=False),
             lambda x: x.sort(1, descending=True))
    for fn in calls:
        eager = fn(mf.tensor(ids))
        built = _TopInBuild(lambda x: tuple(fn(x)))(mf.tensor(ids))
        for got, want in zip(built, eager):
            assert got.dtype is mf.int64
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(calls[0](mf.tensor(ids)).values.numpy(),
                                  -np.sort(-ids, axis=1)[:, :3])


def test_sort_of_a_long_int64_row_inside_build_is_exact():
    """A row longer than ``TOP_K_INSERTION_MAX`` is merge-sorted; its values were read into a
    float32 scratch, so int64 values that float32 rounds together (2**62 + j) sorted as ties in
    index order. Inside build they equal NumPy's stable sort, both directions."""
    rng = np.random.default_rng(0)
    ids = (2 ** 62 + rng.permutation(40 * 3)).reshape(3, 40).astype(np.int64)
    for descending in (False, True):
        built = _TopInBuild(lambda x: tuple(x.sort(1, descending=descending)))(mf.tensor(ids))
        order = np.argsort(-ids if descending else ids, axis=1, kind="stable")
        np.testing.assert_array_equal(built[1].numpy(), order)
        np.testing.assert_array_equal(built[0].numpy(), np.take_along_axis(ids, order, 1))


def test_topk_accuracy_in_an_eval_graph_as_the_imagenet_example():
    """PyTorch's ImageNet example's ``accuracy``: ``_, pred = output.topk(maxk, 1, True,
    True); pred.t().eq(target.view(1, -1).expand_as(pred))``; inside an eval graph under AMP the
    top-5 indices equal NumPy's (float32 logits, no ties)."""
    logits = _first((8, 10))
    model = nn.Linear(10, 10)

    class Eval(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = model
            self.config.enable_amp(True)

        def build(self, x):
            return self.m(x).topk(5, 1, True, True).indices

    model.eval()
    got = Eval()(logits).numpy()
    ref = logits @ model.weight.numpy().T.astype(np.float64) + model.bias.numpy()
    want = np.argsort(-ref, axis=1)[:, :5]
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(want, axis=1))


class _TopInBuild(mf.nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def build(self, x):
        return self.fn(x)


def test_topk_and_multinomial_refuse_what_pytorch_refuses():
    x = mf.tensor(_first((2, 5)))
    ties = mf.tensor(np.array([1.0, 2.0, 2.0, 1.0], np.float32))
    assert ties.topk(3).indices.tolist() == [1, 2, 0]      # stable: the lower index first
    assert ties.topk(3, largest=False).indices.tolist() == [0, 3, 1]
    inf_nan = mf.tensor(np.array([np.inf, np.nan, -np.inf], np.float32))  # NaN above inf (torch)
    assert inf_nan.topk(3).indices.tolist() == [1, 0, 2]
    assert inf_nan.topk(3, largest=False).indices.tolist() == [2, 0, 1]
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        x.topk(6)
    with pytest.raises(TypeError, match="argument 'k' must be int"):
        x.topk(2.0)
    with pytest.raises(RuntimeError, match="element < 0"):
        x.multinomial(1)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        mf.zeros(2, 3).multinomial(1)
    with pytest.raises(RuntimeError, match=r"cannot sample n_sample \(4\) > prob_dist"):
        mf.ones(3).multinomial(4)
    with pytest.raises(RuntimeError, match="not enough non-negative category"):
        mf.tensor(np.array([1.0, 0.0, 0.0])).multinomial(2)
    weights = nn.Parameter(np.ones((2, 3), np.float32))     # eager inside build until used
    for fn in (lambda x: x.softmax(-1).multinomial(1), lambda x: weights.multinomial(1) + x):
        with pytest.raises(RuntimeError, match="multinomial: miniflow has no multinomial op, so "
                                               "it takes eager tensors only, outside nn.Graph"):
            _TopInBuild(fn)(_first((2, 5)))


def test_multinomial_draws_pytorchs_distribution_from_miniflows_generator():
    """``torch.multinomial(probs, num_samples=1)`` (nanoGPT's sampling): int64 indices with the
    weights' frequencies (unnormalised weights too), without replacement each category once,
    reproducible after ``miniflow.manual_seed``."""
    w = np.array([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]], np.float32)
    mf.manual_seed(5)
    draws = mf.tensor(w).multinomial(4000, replacement=True)
    assert draws.shape == (2, 4000) and draws.dtype == mf.int64
    for row, probs in zip(draws.numpy(), w / w.sum(1, keepdims=True)):
        np.testing.assert_allclose(np.bincount(row, minlength=3) / 4000, probs, atol=0.03)
    mf.manual_seed(5)
    np.testing.assert_array_equal(mf.tensor(w).multinomial(4000, True).numpy(), draws.numpy())
    once = mf.tensor(np.ones((3, 6), np.float32)).multinomial(6).numpy()
    assert all(sorted(r) == list(range(6)) for r in once)
    assert mf.tensor(np.array([0.0, 1.0])).multinomial(1).numpy().tolist() == [1]


def test_integer_arithmetic_is_refused_saying_int_for_an_index():
    """nanoGPT's ``data[i:i+block_size]`` with ``i`` from ``torch.randint``: ``i + 8`` of an
    int64 tensor said "scalar_add: ... must be floating point; cast it with
    .to(miniflow.float32)", which cannot index. miniflow has no integer arithmetic: the error
    names the operator and ``int(i)``."""
    data = np.arange(100)
    ix = mf.randint(len(data) - 8, (4,))
    with pytest.raises(TypeError, match=r"'\+': miniflow has no integer arithmetic .*int\(i\)"):
        [data[i:i + 8] for i in ix]
    assert [len(data[int(i):int(i) + 8]) for i in ix] == [8] * 4
    with pytest.raises(TypeError, match=r"'\*': miniflow has no integer arithmetic"):
        mf.arange(2) * mf.arange(2)
    with pytest.raises(TypeError, match=r"'-': miniflow has no integer arithmetic"):
        mf.arange(2) - 1


PROMOTIONS = {                                  # PyTorch's type promotion to a floating result
    "int_times_float": lambda lib, i, f: i * 0.5,
    "float_times_int": lambda lib, i, f: 0.5 * i,
    "int_over_int": lambda lib, i, f: i / 2,
    "int_into_int": lambda lib, i, f: 2 / (i + 0.5),
    "int_tensor_times_float_tensor": lambda lib, i, f: i[:, None] * f[None, :],   # RoPE's
    "float_tensor_minus_int_tensor": lambda lib, i, f: f - i,
    "int_over_int_tensor": lambda lib, i, f: i / lib.arange(1, 5),
    "int_plus_half_tensor": lambda lib, i, f: i + f.half(),
    "int_plus_float_list_tensor": lambda lib, i, f: i + lib.tensor([0.25, 0.5, 0.75, 1.0]),
}


@pytest.mark.parametrize("name", sorted(PROMOTIONS))
def test_int64_with_a_floating_operand_promotes_as_pytorch(name):
    """``torch.arange(4) * 0.5``, ``positions[:, None] * inv_freq`` (RoPE) and ``arange(4) / 2``
    are floating in PyTorch (its type promotion); they were miniflow's integer-arithmetic error.
    The result's dtype and values equal torch's, eager and in a graph."""
    torch = pytest.importorskip("torch")
    i, f = np.arange(4), np.array([0.5, 1.5, -2.0, 3.0], np.float32)
    want = PROMOTIONS[name](torch, torch.tensor(i), torch.tensor(f))

    class Promote(nn.Module):
        def forward(self, f):
            return PROMOTIONS[name](mf, mf.tensor(i), f)

    for got in (Promote()(mf.tensor(f)), EvalGraph(Promote())(f)):
        assert got.dtype.name == str(want.dtype).removeprefix("torch."), (got.dtype, want.dtype)
        np.testing.assert_allclose(got.numpy().astype(np.float64),
                                   want.numpy().astype(np.float64), rtol=1e-6)


def test_the_pytorch_tutorials_positional_encoding_with_sin_and_cos():
    """The PyTorch transformer tutorial's ``PositionalEncoding`` (``torch.sin(position *
    div_term)``, ``torch.cos``; ``torch.sin`` was missing), written without its item
    assignment and int64 arithmetic: the same buffer as PyTorch's."""
    import math
    d_model, max_len = 8, 12
    position = mf.arange(max_len).to(mf.float32).unsqueeze(1)
    div_term = (mf.arange(0, d_model, 2).to(mf.float32) * (-math.log(10000.0) / d_model)).exp()
    pe = mf.stack([(position * div_term).sin(), (position * div_term).cos()], dim=-1)
    pe = pe.reshape(max_len, d_model)
    if torch is not None:
        tp = torch.arange(max_len).unsqueeze(1)
        td = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        want = torch.zeros(max_len, d_model)
        want[:, 0::2] = torch.sin(tp * td)
        want[:, 1::2] = torch.cos(tp * td)
        np.testing.assert_allclose(pe.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
