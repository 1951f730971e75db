"""``miniflow.cat`` and ``miniflow.stack``: tensors joined along a dimension, as PyTorch's
``torch.cat`` and ``torch.stack``, on op ``cat`` (OneFlow's ``concat``, clear under AMP; its
gradient slices ``dy`` back into the parts). ``stack`` is ``cat`` of the tensors each unsqueezed
at ``dim``. Floating or int64 tensors (token ids), of one dtype (no type promotion, as everywhere
in miniflow)."""
from __future__ import annotations

from .tensor import Tensor, apply, tensor
from .tensor.dims import _dim

__all__ = ["cat", "stack"]


def _tensors(fn: str, tensors) -> list:
    """``tensors`` as a list of Tensors (arrays become tensors of the first Tensor's dtype).

    Raises:
        TypeError: not a tuple or list (a single tensor, say).
        ValueError: an empty one.
    """
    if not isinstance(tensors, (tuple, list)):
        raise TypeError(f"{fn}(): expects a tuple or list of tensors, got "
                        f"{type(tensors).__name__} (write {fn}([a, b], dim=...))")
    if not tensors:
        raise ValueError(f"{fn}(): expected a non-empty list of Tensors")
    dt = next((t.dtype for t in tensors if isinstance(t, Tensor)), None)
    parts = [t if isinstance(t, Tensor) else tensor(t, dtype=dt) for t in tensors]
    return parts


def cat(tensors, dim: int = 0) -> Tensor:
    """The tensors joined along ``dim`` (``torch.cat``): every one has the same shape but along
    ``dim`` and the same dtype, floating or int64 (nanoGPT's ``torch.cat((idx, idx_next),
    dim=1)`` of token ids); the result's ``dim`` is the sum of theirs. Op ``cat``.

    Raises:
        TypeError: ``tensors`` not a tuple or list; dtypes that differ (the op's message names
            them); a ``dim`` that is not an int.
        ValueError: no tensor, a 0-d tensor or shapes that differ elsewhere than along
            ``dim`` (naming them).
        IndexError: ``dim`` out of range (PyTorch's message).
    """
    parts = _tensors("cat", tensors)
    for i, t in enumerate(parts):
        if t.ndim == 0:
            raise ValueError(f"cat(): zero-dimensional tensor (at position {i}) cannot be "
                             f"concatenated; use stack(), or reshape it with .reshape(1)")
    return apply("cat", parts, axis=_dim("cat", dim, parts[0].ndim))


def stack(tensors, dim: int = 0) -> Tensor:
    """The tensors, all of one shape, joined along a new dimension ``dim`` (``torch.stack``;
    ``dim`` in ``[-(ndim + 1), ndim]``): ``cat`` of each one unsqueezed at ``dim``.

    Raises:
        TypeError, ValueError: as :func:`cat`; shapes that differ (PyTorch's message).
        IndexError: ``dim`` out of range (PyTorch's message).
    """
    parts = _tensors("stack", tensors)
    for i, t in enumerate(parts[1:], 1):
        if t.shape != parts[0].shape:
            raise ValueError(f"stack(): expects each tensor to be equal size, but got "
                             f"{list(parts[0].shape)} at entry 0 and {list(t.shape)} at entry {i}")
    d = _dim("stack", dim, parts[0].ndim + 1)
    return apply("cat", [t.unsqueeze(d) for t in parts], axis=d)
