"""Indexing, ``x[key]``: basic indices (ints, slices, ``None``, ``...``) as op ``slice`` and
``reshape``, one integer array, list or int64 Tensor as op ``gather``; ``x.gather(dim, index)``
(and :func:`gather`, ``miniflow.gather``) as op ``dim_gather``, ``x.scatter`` and
``x.scatter_add`` as ops ``dim_scatter_update`` (``_scalar``) and ``dim_scatter_add``,
:func:`take_along_dim` as ``expand`` and ``dim_gather``, ``index_select`` and ``flip`` as op
``gather``. Assignment, ``x[key] = v``: eager
tensors in place, lazy ones as op ``slice_update`` (or ``masked_fill`` for a mask)."""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..dtype import bool_, float32, int64, overflows
from ..ops.indexing import first_bad
from ..runtime.backend import get_backend
from ..trace import current_tracer, is_grad_enabled
from .core import TensorCore, _kept_from_trace
from .create import _is_torch, apply, as_numpy, tensor
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor

__all__ = ["Indexing", "gather", "scatter", "scatter_add", "take_along_dim"]


class Indexing:
    """``__getitem__`` and ``__setitem__`` of :class:`miniflow.tensor.Tensor`."""

    def __setitem__(self, key, value) -> None:
        """``self[key] = value`` as PyTorch's (``THPVariable_setitem``): ``key`` an int, slice
        (step > 0), ``None``, ``...`` or a tuple of them; a bool mask (a bool tensor, ``x < t``,
        or a NumPy bool array) of ``self``'s leading shape; or one integer array, list or
        int64 Tensor (alone or in a tuple, as :meth:`__getitem__` takes it). ``value``: a
        number, a Tensor or a NumPy array, broadcast to what ``self[key]`` selects (leading
        size-1 dimensions dropped) and cast to ``self``'s dtype (a float into an int64 tensor
        truncates, as PyTorch's).

        Eager: the values are written into this tensor's memory in place (a graph that binds it
        as a buffer or parameter reads them at its next call); every index kind above. So is an
        eager tensor inside ``nn.Graph.build`` (a constant: ``m = miniflow.ones(T, T)``) given
        a value that is not lazy; the ops recorded before read its old values.

        Inside ``nn.Graph.build``, into a lazy tensor or of a lazy value (OneFlow's
        ``tensor_setitem``): basic indices record op ``slice_update(self, value)``; a bool mask
        op ``masked_fill`` (a number), or a select of two ``masked_fill`` s (a tensor, its rows
        per masked element taken by op ``gather``); one array index known at trace time, alone
        or with ``:`` and ``...``, the same select. This Python tensor then stands for the
        result, so later uses see the assignment. A graph's tensors are values, not storage: a
        tensor taken from ``self`` before (``y = x[0]``) keeps the old values, where PyTorch's
        view would change too. Gradients: ``self`` gets the output's with the slice zeroed,
        ``value`` the slice's, summed back to its shape.

        Raises:
            RuntimeError: an eager tensor that requires grad (a Parameter) outside ``no_grad``
                (PyTorch's "a leaf Variable that requires grad is being used in an in-place
                operation"); inside ``build``, a parameter or buffer of the graph; a value that
                does not broadcast (PyTorch's "shape mismatch"); a lazy value outside a build.
            IndexError, ValueError: the key as :meth:`__getitem__` refuses it; a mask whose
                shape is not ``self``'s leading shape (PyTorch's message).
            TypeError: a list or another object as the value; inside ``build``, an array index
                with other indices than ``:`` and ``...``, or computed in the graph.
        """
        key = _data_keys(key)
        tr = current_tracer()
        if tr is None and self._value is not None:
            raise RuntimeError(_kept_from_trace(self))
        if tr is not None:
            _check_assignable(tr, self)
        lazy_value = tr is not None and isinstance(value, TensorCore) and value.is_lazy
        if self._value is None and not lazy_value:
            _assign_eager(self, key, value)
            if tr is not None:
                tr.forget(self)
            return
        mask = _bool_mask(key, self.shape)
        out = (_masked_assign(self, mask, value) if mask is not None
               else _slice_assign(self, key, value))
        if out is not None:
            self._data, self._value, self._tracer = None, out._value, out._tracer

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
        key = _data_keys(key)
        if isinstance(key, (np.ndarray, list)) or _is_torch(key):  # x[np.array([1, 0])], x[[1, 0]]
            key = _array_index(key, self.shape)
        if isinstance(key, TensorCore):
            return apply("gather", [self, key], axis=0)
        key = key if isinstance(key, tuple) else (key,)
        arrays = _array_positions(key)
        if len(arrays) == 1:
            return self._take(key, arrays[0])
        index, out_shape = _basic_index(key, self.shape)
        sliced = self
        if any(s != slice(0, n, 1) for s, n in zip(index, self.shape)):
            sliced = apply("slice", [self], start=tuple(s.start for s in index),
                           stop=tuple(s.stop for s in index), step=tuple(s.step for s in index))
        return _reshaped(sliced, out_shape)

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

    def index_select(self, dim: int, index) -> "Tensor":
        """The slices of this tensor along ``dim`` at ``index`` (a 1-D or 0-d int64 tensor, an
        integer array or list), in its order, repeats allowed: ``torch.index_select``. Op
        ``gather`` (OneFlow's, along ``axis``), whose gradient adds the repeats'.

        Raises:
            IndexError: ``dim`` out of range; an index of more than one dimension (PyTorch's
                "Index is supposed to be a vector"); a known index outside ``[0,
                self.shape[dim])`` (PyTorch's "index out of range in self").
            TypeError: an index that is not of integers.
        """
        d = _dim("index_select", dim, max(self.ndim, 1))
        if not isinstance(index, TensorCore):
            arr = as_numpy(index)
            if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
                raise TypeError(f"index_select(): Expected dtype int64 for index, got "
                                f"{arr.dtype}")
            index = tensor(arr.astype(np.int64))
        if index.dtype is not int64:
            raise TypeError(f"index_select(): Expected dtype int64 for index, got "
                            f"{index.dtype.name}")
        if index.ndim > 1:
            raise IndexError("index_select(): Index is supposed to be a vector")
        index = index.reshape(-1) if index.ndim == 0 else index
        size = self.shape[d] if self.ndim else 1
        if index._value is None and index.numel() and not (
                0 <= index.numpy().min() and index.numpy().max() < size):
            raise IndexError("index out of range in self")
        x = self.reshape(1) if self.ndim == 0 else self
        out = apply("gather", [x, index], axis=d)
        return out.reshape(()) if self.ndim == 0 else out

    def flip(self, *dims) -> "Tensor":
        """This tensor with the order of its elements reversed along each of ``dims``
        (``torch.flip``: ``x.flip(0)``, ``x.flip((0, 2))``, ``x.flip([0, 2])``): op ``gather``
        of the reversed positions per dim (a copy, as PyTorch's); its gradient is ``dy``
        flipped back.

        Raises:
            IndexError: a dim out of range. RuntimeError: a dim given twice (PyTorch's
                "dim ... appears multiple times in the list of dims").
        """
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        normal = [_dim("flip", d, max(self.ndim, 1)) for d in dims]
        for d in normal:
            if normal.count(d) > 1:
                raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        out = self
        for d in normal if self.ndim else ():
            out = apply("gather", [out, tensor(np.arange(self.shape[d] - 1, -1, -1))], axis=d)
        return out

    def _take(self, key: tuple, pos: int) -> "Tensor":
        """``self[key]`` where ``key[pos]`` is the tuple's one array, list or int64 Tensor
        index (nanoGPT's ``x[:, [-1], :]``): the basic index with ``:`` there, then op
        ``gather`` along that dimension of the result, which the index's shape replaces in
        place. Ints of the tuple select first, as PyTorch's (``x[0, :, [1, 2]]`` of a
        ``[2, 3, 4]`` tensor is ``[3, 2]``; NumPy's is ``[2, 3]``)."""
        out = self[key[:pos] + (slice(None),) + key[pos + 1:]]
        axis, dim = _array_axes(key, pos, self.ndim)
        index = key[pos]
        if not isinstance(index, TensorCore):
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


def _array_positions(key: tuple) -> list:
    """The positions of the array, list and Tensor entries of a tuple key (a tuple in the tuple
    is a list, as torch's)."""
    return [i for i, k in enumerate(key)
            if isinstance(k, (np.ndarray, list, tuple, TensorCore)) or _is_torch(k)]


def _array_axes(key: tuple, pos: int, ndim: int) -> tuple:
    """``(axis, dim)`` of the array index ``key[pos]`` of a tensor of rank ``ndim``: the axis
    it replaces in the result of the rest of the key (``None`` and ``...`` count, ints do not)
    and the dimension of the tensor it indexes."""
    used = sum(k is not None and k is not Ellipsis for k in key)
    axis = sum(ndim - used if k is Ellipsis else 1 for k in key[:pos]
               if k is None or k is Ellipsis or isinstance(k, slice))
    dim = sum(ndim - used if k is Ellipsis else 1 for k in key[:pos] if k is not None)
    return axis, dim


def _data_keys(key):
    """``key`` (an index, or a tuple of them) with each bool tensor as its NumPy array: a bool
    tensor is data, read now (inside ``build`` too), as a NumPy bool mask."""
    if isinstance(key, tuple):
        return tuple(_data_keys(k) for k in key)
    return key.numpy() if isinstance(key, TensorCore) and key.dtype is bool_ else key


def _array_index(key, shape: tuple, dim: int = 0) -> "Tensor":
    """:func:`_index_array` as the int64 Tensor that ``gather`` takes along its dim 0."""
    return tensor(_index_array(key, shape, dim))


def _index_array(key, shape: tuple, dim: int = 0) -> np.ndarray:
    """A NumPy array, list, torch tensor or eager int64 Tensor index of a tensor of ``shape``
    along its dim 0 as an int64 array in ``[0, n)`` (negative entries count from the end, as in
    torch); ``dim``: the dimension it indexes, for the messages (``x[:, [7]]`` indexes
    dimension 1).

    Raises:
        TypeError: a boolean mask of more than one dimension (a 1-d one, known when the key
            is read, selects its True positions, as ``np.flatnonzero``), or an array that is
            not of integers.
        IndexError: a 0-d tensor (nothing to index), or an index outside ``[-n, n)`` (PyTorch's
            message, naming the index as given, unsigned ones included, and its position).
    """
    try:
        arr = as_numpy(key)
    except ValueError:   # a ragged list
        arr = np.asarray(key, dtype=object)
    if arr.size == 0 and isinstance(key, (list, tuple)):   # x[:, []]: no index, no dtype
        arr = arr.astype(np.int64)
    if arr.dtype == np.bool_ and arr.ndim == 1 and shape:   # known now: its True positions
        if arr.shape[0] != shape[0]:
            raise IndexError(f"The shape of the mask [{arr.shape[0]}] at index {dim} does not "
                             f"match the shape of the indexed tensor dimension {dim} of size "
                             f"{shape[0]}")
        arr = np.flatnonzero(arr)
    if arr.dtype == np.bool_:
        raise TypeError(f"tensor index: a boolean mask of shape {list(arr.shape)} is not "
                        f"supported here (a 1-d mask is, and one of the tensor's leading "
                        f"shape alone in an assignment); select by int64 indices instead: "
                        f"np.nonzero(mask)")
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
    return np.where(arr < 0, arr + shape[0], arr).astype(np.int64)


def _basic_index(key: tuple, shape: tuple) -> tuple:
    """``(slices, out_shape)`` of a basic-indexing key: one normalised ``slice(start, stop,
    step)`` per dimension of ``shape`` and the result's shape (ints removed, None added)."""
    if _array_positions(key):
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


# ------------------------------------------------------------------------------ x[key] = value
def _value_array(value) -> np.ndarray:
    """The host values of an assigned ``value``: a number, a Tensor, a NumPy or torch array.

    Raises:
        TypeError: anything else (a list: PyTorch refuses it too).
        RuntimeError: a lazy tensor outside its build (:meth:`TensorCore.numpy`).
    """
    if isinstance(value, (numbers.Number, np.generic, np.ndarray, TensorCore)) or _is_torch(value):
        return as_numpy(value)
    raise TypeError(f"can't assign a {type(value).__name__} to a Tensor: the value of "
                    f"x[key] = value must be a number, a Tensor or a NumPy array (wrap a list "
                    f"with miniflow.tensor(...))")


def _fitted_shape(shape: tuple, want: tuple) -> tuple:
    """The shape of a value of ``shape`` without the leading size-1 dimensions beyond
    ``want``'s rank, checked to broadcast to ``want`` (what ``self[key]`` selects).

    Raises:
        RuntimeError: it does not broadcast (PyTorch's "shape mismatch").
    """
    fitted = tuple(shape)
    while len(fitted) > len(want) and fitted[0] == 1:
        fitted = fitted[1:]
    try:
        ok = tuple(np.broadcast_shapes(fitted, want)) == tuple(want)
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(shape)} cannot be "
                           f"broadcast to indexing result of shape {list(want)}")
    return fitted


def _bool_mask(key, shape: tuple):
    """The NumPy bool array of a mask key (a bool array, a torch bool tensor, a list of
    bools), else None.

    Raises:
        IndexError: its shape is not ``shape``'s leading one (PyTorch's message).
    """
    if isinstance(key, list) and key and all(isinstance(k, (bool, np.bool_)) for k in key):
        key = np.array(key)
    if not (isinstance(key, np.ndarray) or _is_torch(key)):
        return None
    mask = as_numpy(key)
    if mask.dtype != np.bool_:
        return None
    if mask.ndim > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)} (a mask of "
                         f"shape {list(mask.shape)})")
    for i, (m, n) in enumerate(zip(mask.shape, shape)):
        if m != n:
            raise IndexError(f"The shape of the mask {list(mask.shape)} at index {i} does not "
                             f"match the shape of the indexed tensor {list(shape)} at index {i}")
    return mask


def _eager_target(arr: np.ndarray, key, shape: tuple) -> tuple:
    """``(view, where, want)``: ``self[key] = v`` writes ``view[where]`` (``view`` a NumPy view
    of ``arr``), whose values PyTorch's indexing result of shape ``want`` lists in order."""
    mask = _bool_mask(key, shape)
    if mask is not None:
        return arr, mask, (int(mask.sum()),) + tuple(shape[mask.ndim:])
    if isinstance(key, (np.ndarray, list, TensorCore)) or _is_torch(key):
        key = (key,)
    key = key if isinstance(key, tuple) else (key,)
    arrays = _array_positions(key)
    if len(arrays) != 1:
        slices, want = _basic_index(key, shape)
        return arr, tuple(slices), want
    pos = arrays[0]
    slices, want = _basic_index(key[:pos] + (slice(None),) + key[pos + 1:], shape)
    axis, dim = _array_axes(key, pos, len(shape))
    index = _index_array(key[pos], (shape[dim],), dim)
    return (arr[tuple(slices)], (slice(None),) * dim + (index,),
            want[:axis] + index.shape + want[axis + 1:])


def _assign_eager(t: "Tensor", key, value) -> None:
    """``t[key] = value`` in ``t``'s memory (``Tensor.__setitem__`` outside a build)."""
    if getattr(t, "requires_grad", False) and is_grad_enabled():
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation (x[key] = value into a parameter): assign inside "
                           "`with miniflow.no_grad():`, as in PyTorch")
    backend = get_backend()
    arr = backend.to_numpy(t._data)
    view, where, want = _eager_target(arr, key, t.shape)
    values = _value_array(value)
    _check_number_fits(value, t.dtype)
    fitted = _fitted_shape(values.shape, want)
    with np.errstate(invalid="ignore", over="ignore"):    # PyTorch's casts: inf, truncation
        values = values.astype(t.dtype.np)
    view[where] = np.broadcast_to(values.reshape(fitted), want).reshape(view[where].shape)
    backend.copy_in(t._data, arr)
    written = getattr(t, "written", None)       # a Parameter: its half copies are stale now
    if written is not None:
        written()


def _check_number_fits(value, dtype) -> None:
    """A Python number assigned into an int64 or float32 tensor must fit, as PyTorch's scalar
    conversion checks (a float16 tensor takes inf, as PyTorch's assignment does).

    Raises:
        RuntimeError: NaN, inf or a value beyond int64 into int64; a finite value beyond
            float32's range into float32 (PyTorch's "value cannot be converted to type ...
            without overflow")."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return
    if dtype in (int64, float32) and overflows(float(value), dtype):
        raise RuntimeError(f"x[key] = {value!r}: value cannot be converted to type "
                           f"{dtype.name} without overflow (PyTorch's error)")


def _check_assignable(tr, t: "Tensor") -> None:
    """Refuse ``t[key] = value`` inside a build for a parameter or buffer (a variable, which
    the graph reads from the module's memory and a value cannot change), and for an eager
    tensor made before the build (a global, a module's plain attribute)."""
    name = tr.variable_names.get(id(t))
    if t._value is None and name is None and not hasattr(t, "_requires_grad") and \
            id(t) not in tr.made:
        raise RuntimeError(f"x[key] = value inside nn.Graph.build into an eager tensor "
                           f"{list(t.shape)} made outside it: the write would happen once, "
                           f"while tracing, where PyTorch writes at every call (and a value "
                           f"computed in the graph cannot be stored there); register it as a "
                           f"buffer and return the new values from build, or write it outside "
                           f"the graph, or into a copy made inside, y = x.clone()")
    if t._value is None and (name is not None or hasattr(t, "_requires_grad")):
        what = f"the graph's variable {name!r}" if name is not None else "a parameter"
        raise RuntimeError(f"x[key] = value inside nn.Graph.build into {what}: the graph "
                           f"reads a parameter or buffer from its module's memory, which an "
                           f"assignment there cannot change; assign to a copy, y = x.clone(); "
                           f"y[key] = value, or before the call, eagerly (under "
                           f"miniflow.no_grad() for a parameter)")


def _reshaped(t: "Tensor", shape: tuple) -> "Tensor":
    """``t.reshape(shape)``, or ``t`` itself where it has that shape already (no node)."""
    return t if tuple(t.shape) == tuple(shape) else t.reshape(shape)


def _value_tensor(value, dtype) -> "Tensor":
    """An assigned value as a Tensor of ``dtype`` (lazy, or eager: a constant of the graph)."""
    if isinstance(value, TensorCore):
        return value if value.dtype is dtype else value.to(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        return tensor(_value_array(value).astype(dtype.np))


def _slice_assign(t: "Tensor", key, value):
    """``t[key] = value`` of a basic key in a build: op ``slice_update`` of ``value`` cast,
    broadcast and reshaped to the slice (one array index: :func:`_array_assign`); None for an
    empty slice (nothing to write)."""
    key = key if isinstance(key, tuple) else (key,)
    arrays = _array_positions(key)
    if len(arrays) == 1:
        return _array_assign(t, key, arrays[0], value)
    slices, want = _basic_index(key, t.shape)
    v = _value_tensor(value, t.dtype)
    fitted = _fitted_shape(v.shape, want)
    sliced = tuple(len(range(s.start, s.stop, s.step)) for s in slices)
    if 0 in sliced:
        return None
    v = _reshaped(_reshaped(v, fitted).expand(want), sliced)
    return apply("slice_update", [t, v], start=tuple(s.start for s in slices),
                 stop=tuple(s.stop for s in slices), step=tuple(s.step for s in slices))


def _array_assign(t: "Tensor", key: tuple, pos: int, value):
    """``t[key] = value`` in a build where ``key[pos]``, an index known at trace time, is the
    key's one array and every other entry takes a whole dimension (``x[[0, 2]] = v``,
    ``x[:, idx] = v``): the rows the index names (of repeats the last) taken from ``value`` by op
    ``gather`` and selected (:func:`_selected`); None for an empty index.

    Raises:
        TypeError: another entry that is not ``:`` or ``...``, or an int64 Tensor computed in
            the graph (its values are not known at trace time).
    """
    slices, rest = _basic_index(key[:pos] + (slice(None),) + key[pos + 1:], t.shape)
    index = key[pos]
    if (rest != t.shape or any(s != slice(0, n, 1) for s, n in zip(slices, t.shape))
            or isinstance(index, TensorCore) and index.is_lazy):
        raise TypeError(f"x[key] = value inside nn.Graph.build: an array, list or Tensor index "
                        f"({key!r}) has an op there only alone or with ':' and '...' and known "
                        f"at trace time (x[[0, 2]] = v, x[:, idx] = v); index the rest first, "
                        f"or assign eagerly outside the build")
    _, d = _array_axes(key, pos, t.ndim)
    n = t.shape[d]
    index = _index_array(index, (n,), d)
    v = _value_tensor(value, t.dtype)
    want = t.shape[:d] + index.shape + t.shape[d + 1:]
    fitted = _fitted_shape(v.shape, want)
    if not index.size:
        return None
    mask, rows = np.zeros(n, bool), np.zeros(n, np.int64)
    mask[index.reshape(-1)] = True
    rows[index.reshape(-1)] = np.arange(index.size)      # NumPy's rule: of repeats the last
    source = _reshaped(_reshaped(v, fitted).expand(want),
                       t.shape[:d] + (index.size,) + t.shape[d + 1:])
    return _selected(t, mask.reshape((1,) * d + (n,) + (1,) * (t.ndim - d - 1)),
                     apply("gather", [source, tensor(rows)], axis=d))


def _masked_assign(t: "Tensor", mask: np.ndarray, value):
    """``t[mask] = value`` in a build: ``masked_fill`` of a number; of a tensor value, one value
    for every masked row (its shape broadcasts to ``t.shape[mask.ndim:]``) or a row per masked
    element (``[count, ...]``, taken by op ``gather``), selected (:func:`_selected`); None for
    an empty mask."""
    rest = tuple(t.shape[mask.ndim:])
    count = int(mask.sum())
    column = mask.reshape(mask.shape + (1,) * len(rest))
    if isinstance(value, (numbers.Number, np.generic)):
        return t.masked_fill(column, value) if count else None
    v = _value_tensor(value, t.dtype)
    fitted = _fitted_shape(v.shape, (count,) + rest)
    if not count:
        return None
    if len(fitted) == len(rest) + 1:                   # a row per masked element
        rows = np.maximum(np.cumsum(mask.reshape(-1)) - 1, 0).reshape(mask.shape)
        source = apply("gather", [_reshaped(v, fitted).expand((count,) + rest),
                                  tensor(rows.astype(np.int64))], axis=0)
    else:
        source = _reshaped(v, fitted).expand(t.shape)
    return _selected(t, column, source)


def _selected(t: "Tensor", column: np.ndarray, source: "Tensor") -> "Tensor":
    """``source`` where the bool array ``column`` (broadcast to ``t``) is set, else ``t``:
    ``masked_fill(t, column, -0.0) + masked_fill(source, ~column, -0.0)`` (adding -0.0
    changes no value, NaN, inf and -0.0 included), with both gradients."""
    return t.masked_fill(column, -0.0) + source.masked_fill(~column, -0.0)
