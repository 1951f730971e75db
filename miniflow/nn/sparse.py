"""``nn.Embedding`` and ``nn.functional.embedding`` (PyTorch's ``torch.nn.modules.sparse``: the
arguments, the ``weight`` key, its N(0, 1) initialisation), on OneFlow's ``gather`` op, whose
gradient is the scatter-add ``unsorted_segment_sum_like`` (repeated ids accumulate)."""
from __future__ import annotations

import numpy as np

from ..checks import boolean, positive_integer
from ..dtype import int64
from ..ops.indexing import first_bad
from ..random import generator
from ..tensor import Tensor, apply, as_numpy, tensor
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["Embedding", "embedding", "token_ids"]


def token_ids(fn: str, input, num: int, name: str = "input",
              bound: str = "num_embeddings") -> Tensor:
    """``input`` (an int64 Tensor, or integer array-like: a list, a NumPy array of any integer
    type) as an int64 Tensor; an eager one checked against ``[0, num)`` (an array before its
    cast to int64, so an unsigned id is named as given). ``name`` and ``bound`` name the
    argument and ``num`` in the errors.

    Raises:
        TypeError: not integers (a float array is refused, never truncated). IndexError: an id
            out of range, naming it and where."""
    if not isinstance(input, Tensor):
        arr = np.asarray(input)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{fn}: {name} ids must be integers, got an array of {arr.dtype}")
        _check_ids(fn, arr, num, name, bound)
        return tensor(arr.astype(np.int64))
    if input.dtype is not int64:
        raise TypeError(f"{fn}: {name} ids must be an int64 tensor (token indices), got "
                        f"{input.dtype.name}; convert with .astype(np.int64)")
    if not input.is_lazy:
        _check_ids(fn, input.numpy(), num, name, bound)
    return input


def _check_ids(fn: str, ids: np.ndarray, num: int, name: str, bound: str) -> None:
    """Raises IndexError naming the first id of the integer array ``ids`` outside ``[0, num)``
    (as given, unsigned ones included) and its position (see :func:`token_ids`)."""
    found = first_bad(ids, num)
    if found is not None:
        pos, value, count = found
        raise IndexError(f"{fn}: index {value} at {name}{list(pos)} is out of range [0, {num}) "
                         f"({bound}={num}; {count} of {ids.size} ids out of range)")


def embedding(input, weight: Tensor) -> Tensor:
    """``weight[input]``: rows of ``weight [num_embeddings, embedding_dim]`` for the int64 ids
    ``input [*]``, giving ``[*, embedding_dim]`` (op ``gather`` along axis 0;
    ``torch.nn.functional.embedding``). Inside ``nn.Graph.build`` the ids are checked when the
    graph runs (the error names the first bad id and its position).

    Raises:
        TypeError: non-integer ids. IndexError: an eager id outside ``[0, num_embeddings)``,
            naming the id and its position.
    """
    ids = token_ids("embedding", input, weight.shape[0])
    return apply("gather", [weight, ids], axis=0)


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of ``embedding_dim`` (``torch.nn.Embedding``):
    ``weight`` f32 ``[num_embeddings, embedding_dim]`` initialised N(0, 1) as PyTorch's;
    ``forward(ids [*]) -> [*, embedding_dim]``.

    ``device`` / ``dtype`` (keyword-only here: PyTorch's positional arguments after
    ``embedding_dim``, ``padding_idx`` ..., are not supported): PyTorch's factory keywords
    (``nn.factory.param_dtype``).

    Raises:
        ValueError: a size that is not a positive integer, a device other than the process's.
        TypeError: a dtype that is not a floating dtype of miniflow.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, device=None, dtype=None,
                 _weight: np.ndarray | None = None):
        super().__init__()
        for name, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            positive_integer("Embedding", name, v)
        dt = param_dtype("Embedding", device, dtype)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if _weight is None:
            _weight = generator().standard_normal((num_embeddings, embedding_dim)).astype(dt)
        self.weight = Parameter(_weight)    # PyTorch's _weight: from_pretrained draws nothing

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True) -> "Embedding":
        """An Embedding whose weight is a copy of ``embeddings`` (``[num_embeddings,
        embedding_dim]``, a NumPy array, a Tensor or a torch tensor, a PyTorch model's
        Parameter too, of a floating dtype, which it keeps), frozen
        (``requires_grad=False``: no gradient op, no update) unless ``freeze=False``, as
        ``torch.nn.Embedding.from_pretrained`` (its ``padding_idx``, ``max_norm`` ... are not
        supported); like it, it draws nothing from the generator.

        Raises:
            ValueError: ``embeddings`` is not 2-D (or has a zero size).
            TypeError: its dtype is not a floating dtype of miniflow; ``freeze`` not a bool.
        """
        w = as_numpy(embeddings)
        if w.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D "
                             f"[num_embeddings, embedding_dim], got shape {list(w.shape)}")
        boolean("Embedding.from_pretrained", "freeze", freeze)
        module = cls(w.shape[0], w.shape[1], dtype=w.dtype, _weight=w.copy())
        module.weight.requires_grad_(not freeze)
        return module

    def forward(self, input):
        """The rows of ``weight`` at the int64 indices ``input`` (PyTorch's argument name, so
        ``emb(input=ids)`` works): shape ``input.shape + [embedding_dim]``."""
        return embedding(input, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
