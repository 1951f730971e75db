"""PyTorch's shape and movement surface: ``size``, ``numel``, ``view`` / ``reshape``,
``expand``, ``repeat``, ``squeeze`` / ``unsqueeze``, ``flatten`` / ``unflatten``, ``transpose`` /
``permute`` / ``movedim`` / ``T``, ``narrow`` / ``select``, and ``split`` / ``chunk`` /
``unbind``."""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..checks import is_integer, positive_integer
from .create import apply
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


class Shape:
    """The shape and movement methods of :class:`miniflow.tensor.Tensor`."""

    def size(self, dim: int | None = None):
        """The shape (a tuple), or the length of dimension ``dim`` (negative counts from the end;
        ``torch.Tensor.size``).

        Raises:
            IndexError: ``dim`` out of range (PyTorch's message)."""
        if dim is None:
            return self.shape
        return self.shape[_dim("size", dim, self.ndim)]

    def dim(self) -> int:
        """The number of dimensions (``torch.Tensor.dim``)."""
        return self.ndim

    def numel(self) -> int:
        """The number of elements, the product of the shape (1 for a 0-d tensor;
        ``torch.Tensor.numel``): ``sum(p.numel() for p in model.parameters())``."""
        return math.prod(self.shape)

    def nelement(self) -> int:
        """:meth:`numel` (``torch.Tensor.nelement``, its other name)."""
        return self.numel()

    def element_size(self) -> int:
        """The bytes of one element (``torch.Tensor.element_size``): 4 for float32, 2 for float16
        and bfloat16, 8 for float64 and int64, 1 for bool."""
        return np.dtype(self.dtype.np).itemsize

    def view(self, *shape) -> "Tensor":
        """The same elements in ``shape`` (one entry may be -1): op ``reshape`` (miniflow's
        tensors are always contiguous, so every view is valid)."""
        return self.reshape(*shape)

    def view_as(self, other: "Tensor") -> "Tensor":
        """:meth:`view` to ``other``'s shape (``torch.Tensor.view_as``; the MNIST example's
        ``target.view_as(pred)``).

        Raises:
            ValueError: another number of elements (op ``reshape``'s message)."""
        return self.reshape(other.shape)

    def expand(self, *sizes) -> "Tensor":
        """This tensor repeated along its size-1 dims (and new leading dims) to ``sizes``
        (``torch.Tensor.expand``: -1 keeps a dim's size). Op ``expand`` (OneFlow's; a copy, where
        PyTorch makes a view); the gradient sums over the expanded dims.

        Raises:
            ValueError: fewer sizes than dims, -1 or a negative size for a new leading dim, or a
                size other than a non-singleton dim's (PyTorch's messages).
        """
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) \
            else sizes
        target = _expanded("expand", self.shape, sizes)
        return self if target == tuple(self.shape) else apply("expand", [self], expand_shape=target)

    def expand_as(self, other: "Tensor") -> "Tensor":
        """:meth:`expand` to ``other``'s shape (``torch.Tensor.expand_as``)."""
        return self.expand(other.shape)

    def repeat(self, *repeats) -> "Tensor":
        """This tensor tiled ``repeats[i]`` times along dim i (``torch.Tensor.repeat``; extra
        leading repeats add dims): each dim split in (1, n), expanded to (r, n) and merged.

        Raises:
            ValueError: fewer repeats than dims, or a negative one (PyTorch's messages).
        """
        repeats = tuple(repeats[0]) if len(repeats) == 1 and \
            isinstance(repeats[0], (tuple, list)) else repeats
        if len(repeats) < self.ndim:
            raise ValueError(f"repeat: Number of dimensions of repeat dims can not be smaller "
                             f"than number of dimensions of tensor (got {list(repeats)} for "
                             f"shape {list(self.shape)})")
        if any(not isinstance(r, numbers.Integral) or r < 0 for r in repeats):
            raise ValueError(f"repeat: Trying to create tensor with negative dimension: "
                             f"repeats {list(repeats)}")
        shape = (1,) * (len(repeats) - self.ndim) + self.shape
        split = self.reshape(tuple(d for n in shape for d in (1, n)))
        tiled = split.expand(tuple(d for r, n in zip(repeats, shape) for d in (int(r), n)))
        return tiled.reshape(tuple(int(r) * n for r, n in zip(repeats, shape)))

    def contiguous(self) -> "Tensor":
        """This tensor (miniflow's tensors are always contiguous)."""
        return self

    def unsqueeze(self, dim: int) -> "Tensor":
        """A dimension of size 1 inserted at ``dim`` (``-ndim - 1 <= dim <= ndim``; op
        ``reshape``).

        Raises:
            IndexError: ``dim`` out of range (PyTorch's message)."""
        d = _dim("unsqueeze", dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, *dims, dim=None) -> "Tensor":
        """This tensor without its dimensions of size 1: all of them, or those listed that have
        size 1 (``squeeze(1)``, ``squeeze((0, 2))``, ``squeeze([0, 2])``, ``squeeze(0, 2)`` or
        ``dim=``); a listed dimension of another size stays, as in PyTorch's ``torch.squeeze``
        (op ``reshape``).

        Raises:
            IndexError: a dimension out of range. TypeError: a dimension that is not an int, or
            both positional dimensions and ``dim=``. RuntimeError: a dimension listed twice
            (PyTorch's message)."""
        if dims and dim is not None:
            raise TypeError("squeeze: give the dimensions positionally or as dim=, not both")
        if dim is None and len(dims) == 1:
            dim = dims[0]
        elif dims:
            dim = dims
        if dim is None:
            listed = [d for d, n in enumerate(self.shape) if n == 1]
        else:
            listed = [_dim("squeeze", d, self.ndim) for d in (dim if isinstance(dim, (tuple, list))
                                                               else (dim,))]
            if len(set(listed)) != len(listed):
                twice = next(d for d in listed if listed.count(d) > 1)
                raise RuntimeError(f"squeeze: dim {twice} appears multiple times in the list of "
                                   f"dims")
            listed = [d for d in listed if self.ndim and self.shape[d] == 1]
        return self.reshape(tuple(n for d, n in enumerate(self.shape) if d not in listed))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        """Dimensions ``start_dim .. end_dim`` merged into one (op ``flatten``); a 0-d tensor
        becomes 1-D, its dims 0 or -1 (``torch.Tensor.flatten``).

        Raises:
            IndexError: a dim out of range (PyTorch's message)."""
        if self.ndim == 0:
            for d in (start_dim, end_dim):
                _dim("flatten", d, 0)
            return self.reshape(1)
        return apply("flatten", [self], start_dim=start_dim, end_dim=end_dim)

    def reshape(self, *shape):
        """A tensor with the same elements in ``shape`` (one entry may be -1)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return apply("reshape", [self], shape=shape)

    def transpose(self, dim0: int, dim1: int | None = None):
        """This tensor with dims ``dim0`` and ``dim1`` swapped (``torch.Tensor.transpose``;
        negative dims count from the end). Op ``transpose`` with OneFlow's ``perm`` attribute
        (the identity with the two dims exchanged); for any other order use :meth:`permute`.

        Raises:
            TypeError: not two dims, or a dim that is not an int. IndexError: a dim out of range.
        """
        if dim1 is None:
            raise TypeError(f"transpose(dim0, dim1) swaps two dims, as torch.Tensor.transpose; "
                            f"got only {dim0!r}: for an order of all dims use permute(*dims)")
        a, b = (_dim("transpose", d, self.ndim) for d in (dim0, dim1))
        perm = list(range(self.ndim))
        if perm:
            perm[a], perm[b] = perm[b], perm[a]
        return apply("transpose", [self], perm=tuple(perm))

    def permute(self, *dims):
        """This tensor with its dims reordered: dim ``i`` of the result is dim ``dims[i]`` of
        this one (``torch.Tensor.permute``: ``x.permute(2, 0, 1)`` or ``x.permute((2, 0, 1))``;
        negative dims count from the end). Op ``transpose`` with ``perm=dims``.

        Raises:
            TypeError: a dim that is not an int. IndexError: a dim out of range.
            ValueError: not one entry per dim, or a dim repeated.
        """
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        perm = tuple(_dim("permute", d, self.ndim) for d in dims)
        if len(perm) != self.ndim or len(set(perm)) != len(perm):
            raise ValueError(f"permute: dims {tuple(dims)} must name each of the {self.ndim} dims "
                             f"of the tensor of shape {list(self.shape)} once")
        return apply("transpose", [self], perm=perm)

    @property
    def T(self):
        """The tensor with its dims reversed (``torch.Tensor.T``; op ``transpose``)."""
        return self.permute(*reversed(range(self.ndim)))

    def t(self):
        """A 2-D tensor transposed, a 0-d or 1-D one itself (``torch.Tensor.t``: ``x @ w.t()``).

        Raises:
            RuntimeError: more than 2 dims (PyTorch's message)."""
        if self.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                               f"{self.ndim}D (shape {list(self.shape)}): use transpose(-2, -1) "
                               f"or .mT")
        return self.transpose(0, -1) if self.ndim == 2 else self

    @property
    def mT(self):
        """The last two dims swapped (``torch.Tensor.mT``, batches of matrices).

        Raises:
            RuntimeError: fewer than 2 dims (PyTorch's message)."""
        if self.ndim < 2:
            raise RuntimeError(f"tensor.mT is only supported on matrices or batches of "
                               f"matrices. Got {self.ndim}-D tensor.")
        return self.transpose(-2, -1)


    def movedim(self, source, destination) -> "Tensor":
        """This tensor with dims ``source`` moved to the places ``destination`` (two ints, or two
        sequences of ints of one length; negative dims count from the end), the other dims in
        their order in the places left (``torch.Tensor.movedim``; ``moveaxis`` is its other
        name): :meth:`permute`.

        Raises:
            TypeError: an int and a sequence. IndexError: a dim out of range.
            RuntimeError: sequences of different lengths, or a dim repeated in one (PyTorch's
                messages)."""
        one = [isinstance(a, (tuple, list)) for a in (source, destination)]
        if one[0] != one[1]:
            raise TypeError(f"movedim(source, destination) takes two ints or two sequences of "
                            f"ints, got {source!r} and {destination!r}")
        src, dst = ((tuple(a) if many else (a,)) for a, many in zip((source, destination), one))
        if len(src) != len(dst):
            raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} "
                               f"dims) should contain the same number of dims as destination "
                               f"({list(dst)} dims)")
        src, dst = ([_dim("movedim", d, self.ndim) for d in a] for a in (src, dst))
        for name, dims in (("source", src), ("destination", dst)):
            if len(set(dims)) != len(dims):
                raise RuntimeError(f"movedim: repeated dim in `{name}` ({dims})")
        if self.ndim == 0:
            return self
        order = dict(zip(dst, src))
        rest = iter(d for d in range(self.ndim) if d not in src)
        return self.permute(*(order[k] if k in order else next(rest) for k in range(self.ndim)))

    moveaxis = movedim

    def unflatten(self, dim: int, sizes) -> "Tensor":
        """Dim ``dim`` split into dims of ``sizes`` (one of them may be -1, inferred), the others
        as they are (``torch.Tensor.unflatten``; the inverse of :meth:`flatten`): op ``reshape``.

        Raises:
            IndexError: ``dim`` out of range. RuntimeError: ``sizes`` empty, with more than one
                -1, or not multiplying up to the dim's size (PyTorch's message)."""
        d = _dim("unflatten", dim, self.ndim)
        if self.ndim == 0:
            raise IndexError(f"unflatten: Dimension specified as {dim} but tensor has no "
                             f"dimensions")
        sizes = tuple(sizes)
        if not sizes:
            raise RuntimeError("unflatten: sizes must be non-empty")
        if sizes.count(-1) > 1:
            raise RuntimeError(f"unflatten: only one dimension can be inferred, got sizes "
                               f"{list(sizes)}")
        n, known = self.shape[d], math.prod(k for k in sizes if k != -1)
        if (n != known) if -1 not in sizes else (known == 0 or n % known):
            raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to "
                               f"the size of dim {dim} ({n}) in the input tensor")
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        """Elements ``start .. start + length - 1`` of dim ``dim`` (a negative ``start`` counts
        from the end), ``torch.Tensor.narrow``: the slice ``[start:start + length]`` at that dim,
        a copy (miniflow's tensors are always contiguous).

        Raises:
            IndexError: ``dim`` out of range, ``start`` outside ``[-n, n]``. RuntimeError: a 0-d
                tensor, a negative ``length``, ``start + length`` beyond the dim (PyTorch's
                messages). TypeError: ``start`` or ``length`` not an int."""
        if self.ndim == 0:
            raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
        d = _dim("narrow", dim, self.ndim)
        for name, value in (("start", start), ("length", length)):
            if not is_integer(value):
                raise TypeError(f"narrow(): {name} must be an int, got {value!r}")
        n = self.shape[d]
        if not -n <= start <= n:
            raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but "
                             f"got {start})")
        start = start + n if start < 0 else start
        if length < 0:
            raise RuntimeError("narrow(): length must be non-negative.")
        if start + length > n:
            raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size "
                               f"({n}).")
        return self[(slice(None),) * d + (slice(start, start + length),)]

    def select(self, dim: int, index: int) -> "Tensor":
        """The slice at ``index`` of dim ``dim``, that dim removed (``torch.Tensor.select``:
        ``x.select(1, i)`` is ``x[:, i]``; a negative ``index`` counts from the end).

        Raises:
            IndexError: a 0-d tensor, ``dim`` or ``index`` out of range (PyTorch's messages).
            TypeError: ``index`` not an int."""
        if self.ndim == 0:
            raise IndexError("select() cannot be applied to a 0-dim tensor.")
        d = _dim("select", dim, self.ndim)
        if not is_integer(index):
            raise TypeError(f"select(): index must be an int, got {index!r}")
        n = self.shape[d]
        if not -n <= index < n:
            raise IndexError(f"select(): index {index} out of range for tensor of size "
                             f"{list(self.shape)} at dimension {d}")
        return self[(slice(None),) * d + (int(index) % n,)]

    def split(self, split_size, dim: int = 0) -> tuple:
        """Pieces of ``split_size`` along ``dim`` (the last one shorter), or of the given
        ``sections`` sizes (``torch.Tensor.split``); each an op ``slice``.

        Raises:
            ValueError: a ``split_size`` that is not a positive integer; sections that are not
                integers >= 0 (PyTorch: "split_with_sizes expects split_sizes have only
                non-negative entries") or that do not add up to the dimension's size.
            TypeError: neither an integer nor a sequence of them.
            RuntimeError: a 0-d tensor (PyTorch's message)."""
        _at_least_1d("split", self)
        d = _dim("split", dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size, (numbers.Number, np.generic)):
            size = positive_integer("split", "split_size", split_size)
            sizes = [min(size, n - a) for a in range(0, n, size)] or [0]
        else:
            if not isinstance(split_size, (tuple, list, np.ndarray)):
                raise TypeError(f"split: split_size must be an int or a list of "
                                f"ints, got {split_size!r}")
            sizes = list(split_size)
            if not all(is_integer(s) and s >= 0 for s in sizes):
                raise ValueError(f"split: split_sizes must be integers >= 0, got {sizes}")
            sizes = [int(s) for s in sizes]
            if sum(sizes) != n:
                raise ValueError(f"split: split_sizes {sizes} must sum to {n}, the size of "
                                 f"dimension {d} of {list(self.shape)}")
        out, start = [], 0
        for k in sizes:
            index = [slice(None)] * self.ndim
            index[d] = slice(start, start + k)
            out.append(self[tuple(index)])
            start += k
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """At most ``chunks`` pieces along ``dim``, each ``ceil(size / chunks)`` long but the
        last (``torch.Tensor.chunk``: fewer pieces when the size is too small, e.g. 5 in 4
        chunks gives 2, 2, 1; an empty dim gives ``chunks`` empty pieces); :meth:`split` by
        that size.

        Raises:
            ValueError: ``chunks`` not a positive integer (PyTorch's "chunk expects `chunks` to
                be greater than 0"). IndexError: ``dim`` out of range. RuntimeError: a 0-d
                tensor (PyTorch's message)."""
        positive_integer("chunk", "chunks", chunks)
        _at_least_1d("chunk", self)
        n = self.shape[_dim("chunk", dim, self.ndim)]
        if n == 0:                                   # PyTorch: ``chunks`` empty pieces
            return self.split([0] * int(chunks), dim)
        return self.split(-(-n // int(chunks)), dim)

    def unbind(self, dim: int = 0) -> tuple:
        """The slices along ``dim``, that dim removed (``torch.Tensor.unbind``: ``q, k, v =
        qkv.unbind(0)``); each an op ``slice`` and ``reshape``, as ``x[i]``.

        Raises:
            IndexError: ``dim`` out of range (a 0-d tensor has none to unbind)."""
        if self.ndim == 0:
            raise IndexError("unbind: Dimension specified as 0 but tensor has no dimensions")
        d = _dim("unbind", dim, self.ndim)
        return tuple(self[(slice(None),) * d + (i,)] for i in range(self.shape[d]))


def _expanded(fn: str, shape: tuple, sizes: tuple) -> tuple:
    """The target shape of expanding ``shape`` to ``sizes`` (PyTorch's rules: new dims lead, -1
    keeps a dim, only a size-1 dim changes). Raises ValueError as PyTorch."""
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise ValueError(f"{fn}: the number of sizes provided ({len(sizes)}) must be greater or "
                         f"equal to the number of dimensions in the tensor ({len(shape)})")
    target = []
    for i, s in enumerate(sizes):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"{fn}: sizes must be ints, got {s!r} in {list(sizes)}")
        old = shape[i - lead] if i >= lead else None
        if old is None and s < 0:
            raise ValueError(f"{fn}: The expanded size of the tensor ({s}) isn't allowed in a "
                             f"leading, non-existing dimension {i}")
        s = old if s == -1 else int(s)
        if old is not None and old != 1 and s != old:
            raise ValueError(f"{fn}: The expanded size of the tensor ({s}) must match the "
                             f"existing size ({old}) at non-singleton dimension {i}.  Target "
                             f"sizes: {list(sizes)}.  Tensor sizes: {list(shape)}")
        if s < 0:
            raise ValueError(f"{fn}: negative size {s} in {list(sizes)}")
        target.append(s)
    return tuple(target)


def _at_least_1d(fn: str, t: "Tensor") -> None:
    """RuntimeError as PyTorch's for ``fn`` (``split``, ``chunk``) of a 0-d tensor."""
    if t.ndim == 0:
        raise RuntimeError(f"{fn} expects at least a 1-dimensional tensor (got a 0-d "
                           f"{t.dtype.name} tensor)")
