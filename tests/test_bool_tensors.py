"""Eager bool tensors (``miniflow.bool``, ``torch.bool``): what comparisons give and what PyTorch
code does with them. ``==`` between two tensors was identity (a Python bool), a comparison with a
number a NumPy bool array (no ``.float()``, no ``.type()``), ``miniflow.tensor(bools)`` int64 and
a bool array a TypeError, so the tutorials' accuracy lines failed. NumPy is the oracle, torch
too where it is installed."""
import math

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.dtype import as_dtype

try:
    import torch
except ImportError:         # CI has no torch: NumPy is the oracle there
    torch = None

RNG = np.random.default_rng(7)


def _logits_and_labels(n=50, classes=4):
    """Random logits and labels, about a quarter of the argmaxes right."""
    return (RNG.standard_normal((n, classes)).astype(np.float32),
            RNG.integers(0, classes, n).astype(np.int64))


def test_the_tutorials_accuracy_lines_count_as_numpy_and_torch():
    """The PyTorch beginner tutorial's ``(pred.argmax(1) == y).type(torch.float).sum().item()``,
    ``(logits.argmax(-1) == y).float().mean()`` and the MNIST example's
    ``pred.eq(y.view_as(pred)).sum().item()`` (an int count)."""
    x, y = _logits_and_labels()
    want = int((x.argmax(1) == y).sum())
    pred, labels = mf.tensor(x), mf.tensor(y)
    right = pred.argmax(1) == labels
    assert right.dtype is mf.bool and right.shape == (50,)
    counted = right.type(mf.float32).sum().item()
    assert isinstance(counted, float) and counted == want
    np.testing.assert_allclose((pred.argmax(-1) == labels).float().mean().item(), want / 50)
    p = pred.argmax(dim=1, keepdim=True)
    correct = p.eq(labels.view_as(p)).sum().item()
    assert isinstance(correct, int) and correct == want
    assert right.sum().dtype is mf.int64 and right.long().sum().item() == want
    if torch is not None:
        t = (torch.tensor(x).argmax(1) == torch.tensor(y))
        assert t.type(torch.float).sum().item() == counted
        np.testing.assert_array_equal(right.numpy(), t.numpy())


def test_bool_is_a_dtype_made_as_pytorch_infers_it():
    assert mf.bool is as_dtype(np.bool_) is as_dtype("bool") is as_dtype(np.dtype(bool))
    assert not mf.bool.is_float and repr(mf.bool) == "miniflow.bool" and mf.bool.itemsize == 1
    for t in (mf.tensor([True, False]), mf.from_numpy(np.array([True, False])),
              mf.tensor(np.array([True, False])), mf.full((2,), True),
              mf.zeros(2, dtype=mf.bool), mf.ones(2, dtype=mf.bool), mf.tensor([1, 0]).bool()):
        assert t.dtype is mf.bool and t.shape == (2,)
    assert mf.tensor([True, 2]).dtype is mf.int64 and mf.tensor([True, 0.5]).dtype is mf.float32
    assert mf.zeros(3, dtype=mf.bool).tolist() == [False] * 3
    assert mf.tensor(True).shape == () and mf.tensor(True).item() is True
    assert repr(mf.tensor([True, False])) == "tensor([ True, False], dtype=miniflow.bool)"
    if torch is not None:
        assert as_dtype(torch.bool) is mf.bool
        assert mf.tensor(torch.tensor([True, False])).dtype is mf.bool
        assert mf.tensor([1.0, 2.0]).to(torch.bool).dtype is mf.bool


def test_equality_compares_values_and_tensors_hash_by_identity():
    a, b = mf.tensor([1.0, 2.0, 3.0]), mf.tensor([1.0, 0.0, 3.0])
    np.testing.assert_array_equal((a == b).numpy(), [True, False, True])
    np.testing.assert_array_equal((a != b).numpy(), [False, True, False])
    assert (a == a).all().item() is True
    seen = {a: "a", b: "b"}
    assert seen[b] == "b" and len({a, b, a}) == 2 and a in [a, b]
    assert (a == None) is False and (a != "a") is True       # noqa: E711: objects as PyTorch
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(3\) must match the size of "
                                           r"tensor b \(2\) at non-singleton dimension 0"):
        a == mf.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        bool(a == b)
    with pytest.raises(TypeError, match="other must be a tensor, an array or a number"):
        a.eq("a")


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                                  "logical_or", "logical_xor"])
def test_comparisons_and_logical_functions_match_numpy(name):
    x = RNG.standard_normal((3, 4)).round(0).astype(np.float32)
    y = RNG.standard_normal((1, 4)).round(0).astype(np.float32)
    numpy_name = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                  "gt": "greater", "ge": "greater_equal"}.get(name, name)
    got = getattr(mf.tensor(x), name)(mf.tensor(y))
    assert got.dtype is mf.bool
    np.testing.assert_array_equal(got.numpy(), getattr(np, numpy_name)(x, y))
    if torch is not None:
        want = getattr(torch.tensor(x), name)(torch.tensor(y))
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_logic_operators_any_all_and_not():
    a = mf.tensor([[True, False, True], [False, False, True]])
    b = mf.tensor([True, True, False])
    na, nb = a.numpy(), b.numpy()
    for got, want in ((a & b, na & nb), (a | b, na | nb), (a ^ b, na ^ nb), (~a, ~na),
                      (a.logical_not(), ~na), (a.any(), na.any()), (a.all(1), na.all(1)),
                      (a.any(0, keepdim=True), na.any(0, keepdims=True)),
                      (a.all(dim=(0, 1)), na.all()), (True & b, nb), (b | False, nb)):
        assert got.dtype is mf.bool
        np.testing.assert_array_equal(got.numpy(), want)
    i = mf.tensor([6, 3])
    assert (i & 5).tolist() == [4, 1] and (~i).tolist() == [-7, -4] and (i & b[:2]).dtype \
        is mf.int64
    assert mf.tensor(True).any().shape == () and mf.tensor(False).all(0).item() is False
    with pytest.raises(TypeError, match="bitwise operators take bool and int64 tensors, not "
                                        "float32"):
        mf.tensor([1.0]) & b[:1]
    with pytest.raises(TypeError, match="'~'.*not float32"):
        ~mf.tensor([1.0])
    with pytest.raises(IndexError, match="Dimension out of range"):
        a.any(2)


def test_casts_reads_and_reductions_of_a_bool_tensor():
    m = mf.tensor([True, False, True])
    for cast, dt in ((m.float(), mf.float32), (m.long(), mf.int64), (m.int(), mf.int64),
                     (m.double(), mf.float64), (m.half(), mf.float16), (m.bfloat16(),
                     mf.bfloat16), (m.to(mf.float32), mf.float32), (m.type(mf.float64),
                     mf.float64), (m.to("int64"), mf.int64)):
        assert cast.dtype is dt
        np.testing.assert_array_equal(cast.to(mf.float64).numpy(), [1.0, 0.0, 1.0])
    assert m.to(mf.bool) is m and m.type() == "torch.BoolTensor"
    assert mf.tensor([1.0]).type() == "torch.FloatTensor"
    np.testing.assert_array_equal(mf.tensor([0.0, -2.0, math.nan]).bool().numpy(),
                                  [False, True, True])   # nonzero (NaN too) is True
    assert m.sum().item() == 2 and m.sum().dtype is mf.int64
    m2 = mf.tensor(np.array([[True, True], [False, True]]))
    assert m2.sum(0).tolist() == [1, 2] and m2.sum(1, keepdim=True).tolist() == [[2], [1]]
    assert m[0].item() is True and bool(m[1]) is False and m.tolist() == [True, False, True]
    assert m.numpy().dtype == np.bool_ and np.asarray(m).dtype == np.bool_
    assert int(mf.tensor(True)) == 1 and float(mf.tensor(True)) == 1.0
    with pytest.raises(RuntimeError, match=r"mean\(\): could not infer output dtype. Input "
                                           r"dtype must be either a floating point or complex "
                                           r"dtype. Got: Bool"):
        m.mean()


@pytest.mark.parametrize("op", [lambda m: m.exp(), lambda m: m.view(1, 3) @ m.view(3, 1),
                                lambda m: m + m, lambda m: m.argmax(), lambda m: -m,
                                lambda m: m.softmax(0)])
def test_other_ops_on_a_bool_tensor_say_to_cast_first(op):
    with pytest.raises(TypeError, match=r"cast|bool"):
        op(mf.tensor([True, False, True]))


def test_an_op_refusing_a_bool_tensor_names_it_and_the_cast():
    with pytest.raises(TypeError, match=r"exp: miniflow computes nothing on bool tensors "
                                        r"\(inputs bool\): cast first, with .float\(\)"):
        mf.tensor([True]).exp()
    with pytest.raises(TypeError, match="'\\+': miniflow has no integer arithmetic \\(a bool "
                                        "tensor"):
        mf.tensor([True]) + mf.tensor([True])
    with pytest.raises(TypeError, match="cat: its data is bool and not bool"):
        mf.cat([mf.tensor([True]), mf.tensor([1])])


def test_shape_ops_of_a_bool_tensor_stay_bool_and_eager():
    a = np.array([[True, False, True], [False, False, True]])
    m = mf.tensor(a)
    for got, want in ((m.view(3, 2), a.reshape(3, 2)), (m.reshape(-1), a.reshape(-1)),
                      (m.unsqueeze(0), a[None]), (m[:, None], a[:, None]),
                      (m[None].expand(2, 2, 3), np.broadcast_to(a[None], (2, 2, 3))),
                      (m.transpose(0, 1), a.T), (m.T, a.T), (m.flatten(), a.reshape(-1)),
                      (m[1], a[1]), (m[:, 1:], a[:, 1:]), (m[0, 2], a[0, 2]),
                      (m.permute(1, 0), a.T), (mf.cat([m, m]), np.concatenate([a, a])),
                      (mf.stack([m, m]), np.stack([a, a])), (m[[1, 0]], a[[1, 0]]),
                      (m.clone(), a), (m.detach(), a), (m.contiguous(), a),
                      (m.squeeze(), a), (m[:, [2]], a[:, [2]])):
        assert got.dtype is mf.bool and not got.is_lazy
        np.testing.assert_array_equal(got.numpy(), want)
    m[0, 1] = True
    assert m[0].tolist() == [True, True, True]


def test_a_bool_tensor_is_a_mask_where_a_numpy_bool_array_is():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    t = mf.tensor(x)
    mask = t > 0
    a = x > 0
    np.testing.assert_array_equal(t.masked_fill(mask, -1.0).numpy(), np.where(a, -1.0, x))
    np.testing.assert_array_equal(mf.where(mask, t, 0.0).numpy(), np.where(a, x, 0.0))
    np.testing.assert_array_equal(t.where(~mask, 2.0).numpy(), np.where(~a, x, 2.0))
    np.testing.assert_array_equal(t[mask[:, 0]].numpy(), x[a[:, 0]])
    np.testing.assert_array_equal(t[:, mask[0]].numpy(), x[:, a[0]])
    u = t.clone()
    u[mask] = 5.0
    np.testing.assert_array_equal(u.numpy(), np.where(a, 5.0, x))
    np.testing.assert_array_equal((t * mask).numpy(), x * a)
    np.testing.assert_array_equal((t + mask).numpy(), x + a)
    np.testing.assert_array_equal((mask * 2.0).numpy(), a * 2.0)
    assert (t * mask).dtype is mf.float32 and (t.double() + mask).dtype is mf.float64
    assert (mask / 2).dtype is mf.float32
    if torch is not None:
        tm = torch.tensor(x) > 0
        np.testing.assert_array_equal((t * mask).numpy(), (torch.tensor(x) * tm).numpy())
        assert (torch.tensor(x) * tm).dtype == torch.float32


def test_bool_attention_masks_give_what_numpy_bool_masks_give():
    mf.manual_seed(0)
    att = nn.MultiheadAttention(4, 2, batch_first=True)
    q = mf.randn(2, 3, 4)
    pad = np.array([[False, False, True], [False, True, True]])
    causal = np.triu(np.ones((3, 3), bool), 1)
    for kwargs in ({"key_padding_mask": pad}, {"attn_mask": causal}):
        want = att(q, q, q, **kwargs)[0].numpy()
        got = att(q, q, q, **{k: mf.tensor(v) for k, v in kwargs.items()})[0].numpy()
        np.testing.assert_array_equal(got, want)
    qh = q.view(2, 1, 3, 4)
    sdpa = nn.functional.scaled_dot_product_attention
    np.testing.assert_array_equal(sdpa(qh, qh, qh, attn_mask=~mf.tensor(causal)).numpy(),
                                  sdpa(qh, qh, qh, attn_mask=~causal).numpy())


class _Causal(nn.Module):
    """nanoGPT's mask use: a float buffer compared at trace time, and a bool buffer."""

    def __init__(self, n=4):
        super().__init__()
        self.register_buffer("bias", mf.ones(n, n).tril().view(1, 1, n, n))
        self.register_buffer("above", mf.ones(n, n).tril() == 0)

    def forward(self, x):
        T = x.shape[-1]
        a = x.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        b = x.masked_fill(self.above[:T, :T], float("-inf"))
        c = mf.where(self.above[:T, :T], 0.0, x)
        d = x * (~self.above[:T, :T]).float()
        return a, b, c, d


class _Build(nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def build(self, *xs):
        return self.fn(*xs)


def test_inside_build_a_bool_tensor_is_data_as_a_numpy_mask():
    model = _Causal()
    x = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    lower = np.tril(np.ones((3, 3), bool))
    want = np.where(lower, x, -np.inf)
    got = _Build(model)(x)
    for out in got[:2]:
        np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(got[2].numpy(), np.where(lower, x, 0.0))
    np.testing.assert_array_equal(got[3].numpy(), x * lower)
    for eager, traced in zip(model(mf.tensor(x)), got):
        np.testing.assert_array_equal(eager.numpy(), traced.numpy())
    assert model.above.dtype is mf.bool


def test_inside_build_a_computed_tensor_does_not_become_bool():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(RuntimeError, match="has no value at trace time inside nn.Graph.build: "
                                           "'>' cannot be decided there"):
        _Build(lambda t: t > 0)(x)
    with pytest.raises(TypeError, match=r"cast: lazy tensor %\w+ .* bool tensors are eager in "
                                        r"miniflow and no graph value is bool"):
        _Build(lambda t: t.bool())(x)
    mask = mf.tensor([True, False, True])
    with pytest.raises(TypeError, match="cat: lazy tensor .* bool tensors are eager"):
        _Build(lambda t: mf.cat([t[0], mask]))(x)


def test_a_bool_graph_input_is_refused_as_a_numpy_bool_array_is_saying_int64():
    x = np.array([[True, False, True]])
    for given in (x, mf.tensor(x)):
        with pytest.raises(TypeError, match=r"graph input 0: bool tensors are eager in "
                                            r"miniflow.*mask.long\(\)"):
            _Build(lambda m: m.float())(given)
    np.testing.assert_array_equal(_Build(lambda m: m.float())(x.astype(np.int64)).numpy(),
                                  x.astype(np.float32))
