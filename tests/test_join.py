"""``miniflow.cat`` and ``miniflow.stack`` (``miniflow.join``): PyTorch's ``torch.cat`` /
``torch.stack`` values, eager and traced in an ``nn.Graph`` with their gradients (one SGD step
of lr 1 on the parts), and PyTorch's errors (its messages where it has one; ``test_torch.py``'s
cat and stack tests). NumPy is the oracle; torch when installed."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

R = np.random.default_rng(4)
A = R.standard_normal((2, 3)).astype(np.float32)
B = R.standard_normal((2, 4)).astype(np.float32)
C = R.standard_normal((2, 3)).astype(np.float32)


class _Join(nn.Graph):
    """``fn(a, b)`` of two parameters, weighted and summed: the SGD step shows the gradients."""

    def __init__(self, fn, a, b):
        super().__init__()
        self.m = nn.Module()
        self.m.a, self.m.b, self.fn = nn.Parameter(a), nn.Parameter(b), fn
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self, w):
        y = self.fn(self.m.a, self.m.b)
        (y * w).sum().backward()
        return y


JOINS = [("cat", -1, A, B, lambda a, b: np.concatenate([a, b], -1)),
         ("cat", 0, A, C, lambda a, b: np.concatenate([a, b], 0)),
         ("stack", 0, A, C, lambda a, b: np.stack([a, b], 0)),
         ("stack", 2, A, C, lambda a, b: np.stack([a, b], 2)),
         ("stack", -2, A, C, lambda a, b: np.stack([a, b], -2))]


@pytest.mark.parametrize("fn,dim,a,b,oracle", JOINS, ids=[f"{j[0]}{j[1]}" for j in JOINS])
def test_cat_and_stack_match_numpy_eagerly_and_traced_with_their_gradients(fn, dim, a, b, oracle):
    want = oracle(a, b)
    join = getattr(mf, fn)
    np.testing.assert_array_equal(join([mf.tensor(a), b], dim=dim).numpy(), want)
    w = np.arange(1, 1 + want.size, dtype=np.float32).reshape(want.shape)
    graph = _Join(lambda x, y: join((x, y), dim), a, b)
    np.testing.assert_array_equal(graph(w).numpy(), want)
    parts = np.split(w, [a.shape[dim]], dim) if fn == "cat" else np.moveaxis(w, dim, 0)
    np.testing.assert_allclose(a - graph.m.a.numpy(), parts[0].reshape(a.shape))
    np.testing.assert_allclose(b - graph.m.b.numpy(), parts[1].reshape(b.shape))
    torch = pytest.importorskip("torch")
    ref = getattr(torch, fn)([torch.tensor(a), torch.tensor(b)], dim)
    np.testing.assert_array_equal(ref.numpy(), want)


BAD = [(lambda: mf.cat(mf.tensor(A)), TypeError, r"cat\(\): expects a tuple or list of tensors"),
       (lambda: mf.stack([]), ValueError, r"stack\(\): expected a non-empty list of Tensors"),
       (lambda: mf.cat([mf.tensor(A), B]), ValueError,
        r"cat: inputs must have the same shape except along axis 0"),
       (lambda: mf.cat([mf.tensor(np.float32(1.0))]), ValueError,
        r"cat\(\): zero-dimensional tensor \(at position 0\) cannot be concatenated"),
       (lambda: mf.stack([mf.tensor(A), B]), ValueError,
        r"stack\(\): expects each tensor to be equal size, but got \[2, 3\] at entry 0 and "
        r"\[2, 4\] at entry 1"),
       (lambda: mf.stack([mf.tensor(A)], 3), IndexError,
        r"stack: Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)"),
       (lambda: mf.cat([mf.tensor(A)], 2), IndexError,     # was cat's ValueError
        r"cat: Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
       (lambda: mf.cat([mf.tensor(A)], 1.0), TypeError, r"cat: dim must be an int, got 1.0"),
       (lambda: mf.cat((mf.tensor(A), mf.tensor(np.array([[1], [2]]))), 1), TypeError,
        r"cat: inputs have different dtypes: .*f32\[2,3\].*i64\[2,1\]"),  # no promotion
       (lambda: mf.cat([mf.tensor(A), mf.tensor(A.astype(np.float64))], 1), TypeError,
        r"cat: inputs have different dtypes")]


@pytest.mark.parametrize("call,error,match", BAD)
def test_bad_joins_are_named_as_pytorch_names_them(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_int64_token_ids_join_as_pytorch_eager_and_in_a_graph():
    """nanoGPT's ``generate``: ``idx = torch.cat((idx, idx_next), dim=1)`` of int64 token ids
    was refused ("int64 tensors cannot be joined"); op ``cat`` joins int64 as floating tensors,
    eagerly and in a graph (an embedding of the joined ids trains as PyTorch's)."""
    idx, nxt = np.array([[3, 1, 4], [1, 5, 9]]), np.array([[2], [6]])
    got = mf.cat((mf.tensor(idx), mf.tensor(nxt)), dim=1)
    assert got.dtype == mf.int64
    np.testing.assert_array_equal(got.numpy(), np.concatenate([idx, nxt], 1))
    np.testing.assert_array_equal(mf.stack([np.array([1, 2]), np.array([3, 4])], 1).numpy(),
                                  [[1, 3], [2, 4]])
    emb = mf.nn.Embedding(10, 2)
    start = emb.weight.numpy().copy()

    class Joined(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.emb = emb
            self.add_optimizer(mf.optim.SGD(emb.parameters(), lr=1.0))

        def build(self, idx, nxt):
            ids = mf.cat([idx, nxt], dim=-1)
            loss = self.emb(ids).sum()
            loss.backward()
            return ids

    np.testing.assert_array_equal(Joined()(idx, nxt).numpy(), np.concatenate([idx, nxt], 1))
    counts = np.bincount(np.concatenate([idx, nxt], 1).ravel(), minlength=10)[:, None]
    np.testing.assert_allclose(start - emb.weight.numpy(), np.broadcast_to(counts, (10, 2)),
                               atol=1e-6)
