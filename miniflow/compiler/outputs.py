"""What ``nn.Graph.build`` returns: a Tensor, or tuples (named ones included), lists and dicts of
Tensors nested in any way, as OneFlow's ``nn.Graph`` and ``torch.compile`` take them (PyTorch's
``torch.utils._pytree`` flattens the same containers); None in them is returned as None (nanoGPT's
``return logits, loss`` with ``loss = None`` without targets, as ``torch.compile`` returns it).
:func:`flatten` gives the Tensors in order, the graph's outputs, and the structure;
:func:`rebuild` puts a call's result Tensors back into it, so the call returns what ``build``
returned.
"""
from __future__ import annotations

__all__ = ["flatten", "rebuild"]

_LEAF = None
"""The structure of one Tensor."""

_NONE = ("None",)
"""The structure of a None (no graph output)."""


def flatten(out, is_leaf, what: str = "build must return Tensors, or tuples, lists and "
                                      "dicts of them") -> tuple:
    """``(leaves, structure)`` of ``out``: its leaves (``is_leaf(x)`` true: the Tensors) in order
    (a dict's values in its order) and the structure :func:`rebuild` takes (a None stays None;
    hashable, so that it can be part of a cache key).

    Args:
        what: the message's start for something that is neither a leaf nor a container.

    Raises:
        TypeError: something that is neither a leaf nor a tuple, list or dict, naming it and
            where it is (``build returned ... at ['logits']``).
    """
    leaves: list = []
    return leaves, _flatten(out, is_leaf, leaves, "", what)


def _flatten(out, is_leaf, leaves: list, where: str, what: str):
    if is_leaf(out):
        leaves.append(out)
        return _LEAF
    if out is None:
        return _NONE
    if isinstance(out, dict):
        return (type(out), tuple(out), tuple(_flatten(v, is_leaf, leaves, f"{where}[{k!r}]",
                                                      what) for k, v in out.items()))
    if isinstance(out, (tuple, list)):
        return (type(out), None, tuple(_flatten(v, is_leaf, leaves, f"{where}[{i}]", what)
                                       for i, v in enumerate(out)))
    at = f" at {where}" if where else ""
    raise TypeError(f"{what}; got {type(out).__name__}{at}")


def rebuild(structure, leaves: list):
    """The value of ``structure`` (from :func:`flatten`) with ``leaves`` in the leaves' places,
    in order: tuples, named tuples, lists and dicts of the same types."""
    return _rebuild(structure, iter(leaves))


def _rebuild(structure, leaves):
    if structure is _LEAF:
        return next(leaves)
    if structure is _NONE:
        return None
    kind, keys, children = structure
    values = [_rebuild(c, leaves) for c in children]
    if keys is not None:
        return kind(zip(keys, values))
    if kind is tuple or kind is list:
        return kind(values)
    return kind(*values)                    # a named tuple
