"""Indexing, ``x[key]``: basic indices (ints, slices, ``None``, ``...``) as op ``slice`` and
``reshape``, one integer array, list or int64 Tensor as op ``gather``; ``x.gather(dim, index)``
(and :func:`gather`, ``miniflow.gather``) as op ``dim_gather``, ``x.scatter`` and
``x.scatter_add`` as ops ``dim_scatter_update`` (``_scalar``) and ``dim_scatter_add``,
:func:`take_along_dim` as ``expand`` and ``dim_gather``."""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..dtype import int64
from ..ops.indexing import first_bad
from .core import TensorCore
from .create import _is_torch, apply, as_numpy, tensor
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor

__all__ = ["Indexing", "gather", "scatter", "scatter_add", "take_along_dim"]


class Indexing:
    """``__getitem__`` (and the refused ``__setitem__``) of :class:`miniflow.tensor.Tensor`."""

    def __setitem__(self, key, value) -> None:
        """Refused: miniflow has no in-place ops (a graph's tensors are values). Without this
        method, ``x[mask] = v`` with a NumPy mask (nanoGPT's ``generate``:
        ``logits[logits < v[:, [-1]]] = -float('Inf')``) ended in NumPy's "only integer scalar
        arrays can be converted to a scalar index".

        Raises:
            TypeError: always, saying what to write instead (``masked_fill`` for a mask).
        """
        raise TypeError(
            "'Tensor' object does not support item assignment: miniflow has no in-place ops; "
            "make a new tensor instead: x = x.masked_fill(mask, value) for x[mask] = value "
            "(a bool array mask, e.g. x.numpy() < t), or build the values with NumPy and "
            "miniflow.tensor(...) (outside nn.Graph.build)")

    def __getitem__(self, key) -> "Tensor":
        """Basic indexing as PyTorch: ints, slices (step > 0), ``None`` and ``...`` (op
        ``slice``, then ``reshape`` for the dimensions ints remove and ``None`` adds); an int64
        Tensor, a NumPy array or a list of ints selects along dimension 0 (op ``gather``), and
        one of them in a tuple along its dimension (``x[:, [-1], :]``, :meth:`_take`; a tuple
        there is a list, as in PyTorch: ``x[:, (0, 2)]``).

        Raises:
            IndexError: an index out of range or too many indices (PyTorch's messages).
            ValueError: a step <= 0. TypeError: another kind of index (a boolean mask, two
            array indices in a tuple)."""
        if isinstance(key, (np.ndarray, list)) or _is_torch(key):  # x[np.array([1, 0])], x[[1, 0]]
            key = _array_index(key, self.shape)
        if isinstance(key, TensorCore):
            return apply("gather", [self, key], axis=0)
        key = key if isinstance(key, tuple) else (key,)
        arrays = [i for i, k in enumerate(key)   # a tuple in the tuple is a list (torch's)
                  if isinstance(k, (np.ndarray, list, tuple, TensorCore)) or _is_torch(k)]
        if len(arrays) == 1:
            return self._take(key, arrays[0])
        index, out_shape = _basic_index(key, self.shape)
        sliced = self
        if any(s != slice(0, n, 1) for s, n in zip(index, self.shape)):
            sliced = apply("slice", [self], start=tuple(s.start for s in index),
                           stop=tuple(s.stop for s in index), step=tuple(s.step for s in index))
        return sliced if sliced.shape == out_shape else sliced.reshape(out_shape)

    def gather(self, dim: int, index, *, sparse_grad: bool = False) -> "Tensor":
        """The values of ``self`` along ``dim`` at ``index`` (``torch.gather``; op
        ``dim_gather``, its gradient ``dim_scatter_add_like``): for a 3-d tensor,

        ``out[i][j][k] = self[index[i][j][k]][j][k]`` for ``dim`` 0,
        ``out[i][j][k] = self[i][index[i][j][k]][k]`` for ``dim`` 1, and so on.

        ``index`` (an int64 Tensor, or a NumPy array / list / torch tensor of integers) has
        ``self``'s number of dimensions and no size larger than ``self``'s off ``dim``; the
        result has index's shape and ``self``'s dtype (floating point, or int64: no gradient
        then). Repeated indices are fine: the gradient adds up their contributions
        (``logits.gather(1, y.unsqueeze(1))`` picks each row's label; ``x.gather(1,
        x.topk(k)[1])``-style picks too).

        Args:
            dim: the dimension to index along (negative counts from the end).
            index: the indices, each in ``[0, self.shape[dim])`` (negative ones are an error,
                as in PyTorch).
            sparse_grad: PyTorch's switch to a sparse gradient; only False (miniflow has no
                sparse tensors).

        Raises:
            IndexError: ``dim`` out of range; an index array's value outside ``[0,
                self.shape[dim])`` (PyTorch's message), at once; an int64 Tensor's when the op
                runs on the CPU (naming the op ``dim_gather``, the value and its place). On CUDA
                a kernel cannot raise: such an element is NaN (as op ``gather``'s).
            TypeError: an index that is not of integers (an int64 Tensor or integer array).
                ValueError: index of another rank than ``self``, or larger off ``dim``.
                NotImplementedError: ``sparse_grad=True``.
        """
        if sparse_grad is not False:
            raise NotImplementedError("gather(): sparse_grad=True is not supported (miniflow "
                                      "has no sparse tensors); the gradient is dense")
        d = _dim("gather", dim, self.ndim)
        index = _dim_index("gather()", index, self.shape[d] if self.ndim else 1, d)
        return apply("dim_gather", [self, index], dim=d)

    def scatter(self, dim: int, index, src=None, *, value=None, reduce=None) -> "Tensor":
        """A copy of ``self`` with ``src``'s values written along ``dim`` at ``index``
        (``torch.Tensor.scatter``, out of place; op ``dim_scatter_update``, or
        ``dim_scatter_update_scalar`` for a number): for a 3-d tensor,

        ``out[index[i][j][k]][j][k] = src[i][j][k]`` for ``dim`` 0,
        ``out[i][index[i][j][k]][k] = src[i][j][k]`` for ``dim`` 1, and so on,

        for every element of ``index``. ``index`` is as for :meth:`gather` (``self``'s number of
        dimensions, no size larger than ``self``'s off ``dim``); ``src`` a Tensor of ``self``'s
        dtype and no size smaller than index's (its first ``index.shape`` elements are read), or
        a number (``value=``, as PyTorch's keyword) written at every place, converted to
        ``self``'s dtype. When index repeats a place, the last element in index order (C
        order) is written (PyTorch leaves that undefined). Gradients: ``self`` gets ``dy`` with
        the written places zeroed, ``src`` gets ``dy.gather(dim, index)`` (PyTorch's rules);
        none for int64 tensors.

        Raises:
            IndexError: ``dim`` out of range; an index value outside ``[0, self.shape[dim])``
                as for :meth:`gather` (on CUDA such an index writes nothing). TypeError: an
                index that is not of integers, ``src`` neither a Tensor nor a number, of
                another dtype than ``self``. ValueError: index of another rank than ``self`` or
                ``src``, larger than ``self`` off ``dim`` or than ``src``.
                NotImplementedError: ``reduce`` (PyTorch's deprecated form; use
                :meth:`scatter_add` for ``"add"``).
        """
        if reduce is not None:
            raise NotImplementedError(f"scatter(): reduce={reduce!r} is not supported (PyTorch "
                                      f"deprecates it); use scatter_add for 'add'")
        if (src is None) == (value is None):
            raise TypeError("scatter(): give src (a Tensor or a number) or value (a number), "
                            "one of them")
        return _scatter(self, "scatter", dim, index, value if src is None else src, add=False)

    def scatter_add(self, dim: int, index, src) -> "Tensor":
        """A copy of ``self`` with ``src``'s values added along ``dim`` at ``index``
        (``torch.Tensor.scatter_add``, out of place; op ``dim_scatter_add``): for a 3-d tensor,
        ``out[index[i][j][k]][j][k] += src[i][j][k]`` for ``dim`` 0, and so on, for every
        element of ``index``; repeated places add up (in index order, in float32 for the half
        types: deterministic). Shapes as for :meth:`scatter`; ``src`` is a Tensor. Gradients:
        ``self`` gets ``dy``, ``src`` ``dy.gather(dim, index)``; none for int64 tensors.

        Raises:
            as :meth:`scatter` (TypeError also for a number ``src``, as PyTorch's).
        """
        if not isinstance(src, TensorCore):
            raise TypeError(f"scatter_add(): argument 'src' must be Tensor, not "
                            f"{type(src).__name__}")
        return _scatter(self, "scatter_add", dim, index, src, add=True)

    def take_along_dim(self, indices, dim: int | None = None) -> "Tensor":
        """:func:`take_along_dim` of this tensor (``torch.Tensor.take_along_dim``)."""
        return take_along_dim(self, indices, dim)

    def _take(self, key: tuple, pos: int) -> "Tensor":
        """``self[key]`` where ``key[pos]`` is the tuple's one array, list or int64 Tensor
        index (nanoGPT's ``x[:, [-1], :]``): the basic index with ``:`` there, then op
        ``gather`` along that dimension of the result, which the index's shape replaces in
        place. Ints of the tuple select first, as PyTorch's (``x[0, :, [1, 2]]`` of a
        ``[2, 3, 4]`` tensor is ``[3, 2]``; NumPy's is ``[2, 3]``)."""
        out = self[key[:pos] + (slice(None),) + key[pos + 1:]]
        used = sum(k is not None and k is not Ellipsis for k in key)
        axis = sum(self.ndim - used if k is Ellipsis else 1 for k in key[:pos]
                   if k is None or k is Ellipsis or isinstance(k, slice))   # of the result
        index = key[pos]
        if not isinstance(index, TensorCore):
            dim = sum(self.ndim - used if k is Ellipsis else 1 for k in key[:pos]
                      if k is not None)                     # the dimension of self it indexes
            index = _array_index(index, out.shape[axis:], dim)
        return apply("gather", [out, index], axis=axis)


def gather(input, dim: int, index, *, sparse_grad: bool = False) -> "Tensor":
    """``torch.gather(input, dim, index)``: ``input.gather(dim, index)``
    (:meth:`Indexing.gather`, which documents it, its shapes and errors)."""
    return input.gather(dim, index, sparse_grad=sparse_grad)


def scatter(input, dim: int, index, src=None, *, value=None, reduce=None) -> "Tensor":
    """``torch.scatter(input, dim, index, src)``: ``input.scatter(dim, index, src)``
    (:meth:`Indexing.scatter`, which documents it, its shapes and errors)."""
    return input.scatter(dim, index, src, value=value, reduce=reduce)


def scatter_add(input, dim: int, index, src) -> "Tensor":
    """``torch.scatter_add(input, dim, index, src)``: ``input.scatter_add(dim, index, src)``
    (:meth:`Indexing.scatter_add`, which documents it, its shapes and errors)."""
    return input.scatter_add(dim, index, src)


def take_along_dim(input, indices, dim: int | None = None) -> "Tensor":
    """``torch.take_along_dim(input, indices, dim)``: the values of ``input`` at ``indices``
    along ``dim`` (NumPy's ``take_along_axis``), composed of ops ``expand`` and ``dim_gather``.

    With ``dim`` None, ``input`` and ``indices`` are flattened: ``input.reshape(-1)[indices
    .reshape(-1)]``, a 1-d result. Else both have the same number of dimensions and broadcast
    against each other off ``dim`` (each expanded to the broadcast shape, keeping its own size
    along ``dim``), then ``out = input.gather(dim, indices)``: index's size along ``dim``,
    the broadcast shape elsewhere. Gradient as :meth:`Indexing.gather`'s (the expand's sums it
    back to input's shape); int64 inputs work, without one.

    Args:
        input: a Tensor (floating point or int64).
        indices: an int64 Tensor or an integer array / list / torch tensor, each value in ``[0,
            n)``, n the size of ``dim`` (of all of ``input`` for ``dim`` None).
        dim: the dimension to index along, or None.

    Raises:
        IndexError: ``dim`` out of range; an index array's value outside ``[0, n)`` at once
            (PyTorch's message), an int64 Tensor's when the CPU kernel runs (PyTorch, with a
            ``dim``, reads such an index unchecked). TypeError: indices not of integers.
        ValueError: another number of dimensions than input's; sizes that do not broadcast off
            ``dim`` (PyTorch's messages).
    """
    fn = "torch.take_along_dim()"
    if dim is None:
        indices = _dim_index(fn, indices, input.numel(), 0)
        return apply("dim_gather", [input.reshape(-1), indices.reshape(-1)], dim=0)
    d = _dim(fn, dim, input.ndim)
    indices = _dim_index(fn, indices, input.shape[d] if input.ndim else 1, d)
    if indices.ndim != input.ndim:
        raise ValueError(f"{fn}: input and indices should have the same number of dimensions, "
                         f"but got {input.ndim} dimensions for input, and {indices.ndim} "
                         f"dimensions for indices")
    shape = []
    for k, (a, b) in enumerate(zip(input.shape, indices.shape)):
        if a != b and 1 not in (a, b) and k != d:
            raise ValueError(f"{fn}: The size of tensor a ({a}) must match the size of tensor b "
                             f"({b}) at non-singleton dimension {k}")
        shape.append(max(a, b))

    def along(t):
        return t.expand(tuple(t.shape[k] if k == d else n for k, n in enumerate(shape)))
    return apply("dim_gather", [along(input), along(indices)], dim=d)


def _scatter(self, fn: str, dim, index, src, add: bool) -> "Tensor":
    """``self.scatter`` / ``self.scatter_add``: the index checked and made a Tensor, a Tensor
    ``src`` checked against it (PyTorch's rule and message) and sliced to its shape, then op
    ``dim_scatter_add``, ``dim_scatter_update`` or (a number) ``dim_scatter_update_scalar``."""
    d = _dim(fn, dim, self.ndim)
    index = _dim_index(f"{fn}()", index, self.shape[d] if self.ndim else 1, d)
    if isinstance(src, numbers.Real) and not isinstance(src, bool):
        return apply("dim_scatter_update_scalar", [self, index], dim=d, src_scalar=float(src))
    if not isinstance(src, TensorCore):
        raise TypeError(f"{fn}(): src must be a Tensor or a number, got {type(src).__name__}")
    if src.dtype is not self.dtype:
        raise TypeError(f"{fn}(): Expected self.dtype to be equal to src.dtype (self is "
                        f"{self.dtype.name}, src {src.dtype.name}): cast src with "
                        f".to(miniflow.{self.dtype.name})")
    off = [k for k, (i, t) in enumerate(zip(index.shape, self.shape)) if i > t and k != d]
    if index.ndim == self.ndim and (src.ndim != index.ndim or off or any(
            i > n for i, n in zip(index.shape, src.shape))):
        raise ValueError(f"{fn}(): Expected index {list(index.shape)} to be no larger than self "
                         f"{list(self.shape)} apart from dimension {d} and to be no larger size "
                         f"than src {list(src.shape)}")
    if src.shape != index.shape and src.ndim == index.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    return apply("dim_scatter_add" if add else "dim_scatter_update", [self, index, src], dim=d)


def _dim_index(fn: str, key, n: int, dim: int) -> "Tensor":
    """The index of ``fn`` (``gather`` ...) as the int64 Tensor the ``dim_*`` ops take: an
    int64 Tensor as it is, an integer array, list or torch tensor with its values checked to be
    in ``[0, n)`` (PyTorch's message).

    Raises:
        TypeError: not integers. IndexError: a value outside ``[0, n)``.
    """
    if isinstance(key, TensorCore):
        if key.dtype is not int64:
            raise TypeError(f"{fn}: Expected dtype int64 for index, got {key.dtype.name} "
                            f"(convert it with .to(miniflow.int64))")
        return key
    arr = as_numpy(key)
    if arr.size == 0 and isinstance(key, (list, tuple)):   # no index, no dtype
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{fn}: Expected dtype int64 for index, got an array of {arr.dtype}")
    found = first_bad(arr, n)     # before the int64 cast: uint64 may not fit
    if found is not None:
        pos, value, count = found
        raise IndexError(f"{fn}: index {value} is out of bounds for dimension {dim} with "
                         f"size {n} (the index's element {list(pos)}; {count} of {arr.size} "
                         f"out of bounds)")
    return tensor(arr.astype(np.int64))


def _array_index(key, shape: tuple, dim: int = 0) -> "Tensor":
    """A NumPy array or list index of a tensor of ``shape`` as the int64 Tensor that
    ``gather`` takes along its dim 0 (negative entries count from the end, as in torch);
    ``dim``: the dimension it indexes, for the messages (``x[:, [7]]`` indexes dimension 1).

    Raises:
        TypeError: a boolean mask (its result's shape depends on its values, which a traced
            graph cannot have) or an array that is not of integers.
        IndexError: a 0-d tensor (nothing to index), or an index outside ``[-n, n)`` (PyTorch's
            message, naming the index as given, unsigned ones included, and its position).
    """
    try:
        arr = as_numpy(key)
    except ValueError:   # a ragged list
        arr = np.asarray(key, dtype=object)
    if arr.size == 0 and isinstance(key, (list, tuple)):   # x[:, []]: no index, no dtype
        arr = arr.astype(np.int64)
    if arr.dtype == np.bool_:
        raise TypeError(f"tensor index: a boolean mask of shape {list(arr.shape)} is not "
                        f"supported (the result's shape would depend on its values); select "
                        f"the rows by their int64 indices instead: x[np.flatnonzero(mask)]")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tensor index {key!r}: an array or list index must hold integers (got "
                        f"{arr.dtype}); miniflow supports ints, slices, None, ... and one integer "
                        f"array, list or int64 Tensor")
    if not shape:
        raise IndexError("too many indices for tensor of dimension 0")
    found = first_bad(arr, shape[0], -shape[0])   # before the int64 cast: uint64 may not fit
    if found is not None:
        pos, value, count = found
        raise IndexError(f"index {value} is out of bounds for dimension {dim} with size "
                         f"{shape[0]} (the index array's element {list(pos)}; {count} of "
                         f"{arr.size} out of bounds)")
    return tensor(np.where(arr < 0, arr + shape[0], arr).astype(np.int64))


def _basic_index(key: tuple, shape: tuple) -> tuple:
    """``(slices, out_shape)`` of a basic-indexing key: one normalised ``slice(start, stop,
    step)`` per dimension of ``shape`` and the result's shape (ints removed, None added)."""
    if any(isinstance(k, (np.ndarray, list, tuple, TensorCore)) for k in key):
        raise TypeError(f"tensor index {key!r}: one array, list or Tensor index is supported "
                        f"(x[idx], x[:, [0, 3]]), not several in a tuple (advanced indexing over "
                        f"several dimensions): index one dimension at a time")
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    if Ellipsis in key:
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    else:
        key = key + (slice(None),) * (len(shape) - used)
    slices, out_shape, d = [], [], 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        n = shape[d]
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dimension {d} with size {n}")
            k = int(k) % n
            slices.append(slice(k, k + 1, 1))
        elif isinstance(k, slice):
            if k.step is not None and k.step <= 0:
                raise ValueError(f"step must be greater than zero, got {k.step} (dimension {d})")
            a, b, st = k.indices(n)
            b = max(a, b)
            slices.append(slice(a, b, st))
            out_shape.append(len(range(a, b, st)))
        else:
            raise TypeError(f"tensor index {k!r} ({type(k).__name__}): miniflow supports ints, "
                            f"slices, None, ... and one integer array, list or int64 Tensor")
        d += 1
    return slices, tuple(out_shape)
